// FP8 (e4m3fn, e5m2) values to and from the 16-bit types the tensor cores take: an FP8 KV cache is widened pair by
// pair in registers as its fragments are read (exactly: every FP8 value is a 16-bit one), and new tokens are rounded
// into it with their scale.
#pragma once

#include "fwd_traits.cuh"
#include "sm80_primitives.cuh"

namespace flashgen {
namespace fp8 {

using u32 = sm80::u32;

// The integer type one element of t is stored as.
template <ElemType t, bool = is_fp8(t)>
struct Storage {
  using type = unsigned short;
};
template <ElemType t>
struct Storage<t, true> {
  using type = unsigned char;
};

constexpr int exponent_bits(ElemType t) {
  return t == ElemType::kFloat8E4M3 ? 4 : t == ElemType::kBFloat16 ? 8 : 5;  // fp16 and e5m2: 5
}
constexpr int exponent_bias(ElemType t) { return (1 << (exponent_bits(t) - 1)) - 1; }

// 2^(bias(elem) - bias(cache)): what a cache of FP8 values widened by Widen below is multiplied by to read as its
// values; 1 for a 16-bit cache.
constexpr float restore_factor(ElemType cache, ElemType elem) {
  float factor = 1.f;
  if (is_fp8(cache)) {
    for (int i = 0; i < exponent_bias(elem) - exponent_bias(cache); ++i) factor *= 2.f;
  }
  return factor;
}

// Pairs of FP8 values of type kCache as pairs of kElem values. The sign stays at bit 15 and the exponent and mantissa
// move down to the 16-bit type's places: each value is read exactly, scaled by 2^-kRebias (subnormals included: the
// 16-bit type's own subnormals where the scaled value is one). The caller multiplies by 2^kRebias in fp32, where it
// applies the cache's scales, so the widening is three integer operations a pair. An e4m3 NaN (no 16-bit twin of its
// pattern), and an e5m2 infinity or NaN widened to bf16, read as finite values; a cache holds none.
template <ElemType kCache, ElemType kElem>
struct Widen {
  static_assert(is_fp8(kCache) && !is_fp8(kElem), "widens FP8 pairs to 16-bit pairs");
  static constexpr int kShift = exponent_bits(kElem) - exponent_bits(kCache);
  static constexpr u32 kBody = (0x7F00u >> kShift) * 0x10001u;  // exponent and mantissa bits of both halves
  static constexpr int kRebias = exponent_bias(kElem) - exponent_bias(kCache);

  // Bytes 1 and 3 of x (kHigh) or 0 and 2 as a kElem pair scaled by 2^-kRebias, byte 0 or 1 in the low half.
  template <bool kHigh>
  static __device__ __forceinline__ u32 pair(u32 x) {
    const u32 u = kHigh ? x : x << 8;  // the pair's bytes in the high byte of each half
    return (u & 0x80008000u) | ((u >> kShift) & kBody);
  }
};

// (lo, hi) rounded to two kCache values, nearest even, saturating at the type's largest finite value (±448 for e4m3,
// ±57344 for e5m2): lo in the low byte. sm_89 and newer.
template <ElemType kCache>
__device__ __forceinline__ unsigned short narrow2(float lo, float hi) {
  static_assert(kCache == ElemType::kFloat8E4M3 || kCache == ElemType::kFloat8E5M2, "rounds to an FP8 pair");
  unsigned short r;
  if constexpr (kCache == ElemType::kFloat8E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// The tile products of sm80_attend.cuh over an FP8 K or V tile in shared memory (rows of kRowBytes bytes), each
// fragment widened to kElem as it is read. ldmatrix reads the 8-bit rows as 16-bit pairs, so the fragments hold other
// columns than a 16-bit tile's would, and the products are arranged around that:
//  - QKᵀ: lane (g, t) reads key g's bytes 4t .. 4t + 3 of a 16-column k-step: bytes 0 and 2 (columns 4t and 4t + 2)
//    as the mma's k indices 2t and 2t + 1, bytes 1 and 3 as 2t + 8 and 2t + 9. So the k-step's k indices 0-7 are its
//    even columns and 8-15 its odd ones; Q's columns are stored in that order (permute_k_step), so each product
//    pairs the same columns.
//  - PV (ldmatrix .trans): lane (g, t) reads keys 2t and 2t + 1 at columns 2g and 2g + 1; the even columns make one
//    8-column mma tile and the odd ones the next, so O's tile 2c holds columns 16c' + 4t and + 2 of its 16-column
//    group c' and tile 2c + 1 the odd ones (store_o_group gives them back in order).

// Q's 16 columns of one k-step (two 16-byte halves of 16-bit columns) in the order the FP8 K fragments read them: the
// even columns, then the odd ones.
__device__ __forceinline__ void permute_k_step(uint4& lo, uint4& hi) {
  const u32 w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  u32 even[4], odd[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    asm("prmt.b32 %0, %1, %2, 0x5410;\n" : "=r"(even[i]) : "r"(w[2 * i]), "r"(w[2 * i + 1]));
    asm("prmt.b32 %0, %1, %2, 0x7632;\n" : "=r"(odd[i]) : "r"(w[2 * i]), "r"(w[2 * i + 1]));
  }
  lo = make_uint4(even[0], even[1], even[2], even[3]);
  hi = make_uint4(odd[0], odd[1], odd[2], odd[3]);
}

// acc_s = Q Kᵀ · 2^-kRebias for one warp's keys: load_a(mt, kk, a) gives Q's A fragment of tile mt and k-step kk
// (columns permuted); k_lane is this lane's ldmatrix row address: key (lane & 7) + 8 * ((lane >> 3) & 1) of the warp's, byte
// 16 * (lane >> 4).
template <ElemType kElem, ElemType kCache, int kKSteps, int kRowBytes, int kMTiles, int kNTiles, class LoadA>
__device__ __forceinline__ void qk_product(float (&acc_s)[kMTiles][kNTiles][4], LoadA&& load_a, u32 k_tile,
                                           u32 k_lane) {
  static_assert(kKSteps % 2 == 0, "k-steps are read in pairs");
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
  // Q's fragments are read per k-step inside the key loop: a decode warp's keys are one pair of 8-key tiles, and
  // holding two k-steps of Q beside O's registers spills at head_dim 256.
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk += 2) {
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      u32 r[4];  // keys 0-7 and 8-15 of the pair at k-step kk, then at kk + 1: 4 FP8 values each
      sm80::ldmatrix_x4(r, k_tile + k_lane + np * 16 * kRowBytes + kk * 16);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        u32 a[kMTiles][4];  // Q's A fragments of k-step kk + s
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) load_a(mt, kk + s, a[mt]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const u32 b0 = Widen<kCache, kElem>::template pair<false>(r[2 * s + h]);
          const u32 b1 = Widen<kCache, kElem>::template pair<true>(r[2 * s + h]);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) sm80::mma_16816<kElem>(acc_s[mt][2 * np + h], a[mt], b0, b1);
        }
      }
    }
  }
}

// acc_o += P V · 2^-kRebias for one warp's keys, O's columns in the order above; v_lane as k_lane.
template <ElemType kElem, ElemType kCache, int kRowBytes, int kMTiles, int kPSteps, int kDTiles>
__device__ __forceinline__ void pv_product(float (&acc_o)[kMTiles][kDTiles][4], const u32 (&p_frag)[kMTiles][kPSteps][4],
                                           u32 v_tile, u32 v_lane) {
  static_assert(kDTiles % 4 == 0, "columns are read 32 at a time");
#pragma unroll
  for (int j = 0; j < kPSteps; ++j)
#pragma unroll
    for (int cp = 0; cp < kDTiles / 4; ++cp) {
      u32 r[4];  // keys 0-7 and 8-15 of step j at columns 32cp .. +15, then at 32cp + 16 .. +31
      sm80::ldmatrix_x4_trans(r, v_tile + v_lane + j * 16 * kRowBytes + cp * 32);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        using W = Widen<kCache, kElem>;
        const u32 even0 = W::template pair<false>(r[2 * h]), even1 = W::template pair<false>(r[2 * h + 1]);
        const u32 odd0 = W::template pair<true>(r[2 * h]), odd1 = W::template pair<true>(r[2 * h + 1]);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          sm80::mma_16816<kElem>(acc_o[mt][4 * cp + 2 * h], p_frag[mt][j], even0, even1);
          sm80::mma_16816<kElem>(acc_o[mt][4 * cp + 2 * h + 1], p_frag[mt][j], odd0, odd1);
        }
      }
    }
}

// Row g + 8 * half of O's 16-column group c (tiles 2c and 2c + 1 of one m-tile, from pv_product) as this lane's four
// consecutive columns 16c + 4t .. + 3.
__device__ __forceinline__ float4 o_group_columns(const float (&even)[4], const float (&odd)[4], int half) {
  return make_float4(even[2 * half], odd[2 * half], even[2 * half + 1], odd[2 * half + 1]);
}

// An FP8 tensor's descale for batch entry b and kv head h (strides 0 share one); 1 where the call gives none.
__device__ __forceinline__ float descale(const float* d, const long long (&strides)[2], int batch, int kv_head) {
  return d == nullptr ? 1.f : d[batch * strides[0] + kv_head * strides[1]];
}

// The FP8 forward's P V (fwd_sm90.cuh) on 8-bit wgmma. Its A fragment gives lane (g, t) of a warp's 16 rows the k
// indices 4t .. 4t + 3 and 16 + 4t .. + 3 of a 32-key step, where S's accumulators give it keys 8i + 2t and + 1 of
// each 8-key group i. pack_p_steps puts the lane's own keys in its own fragment, no byte moving between lanes, so
// k index k of a step holds key pv_key(k) of it, and Vᵀ stores its keys in that order (fwd_sm90_values.cuh).
__host__ __device__ constexpr int pv_key(int k) { return k / 16 * 16 + k % 16 / 4 * 2 + k % 2 + k % 4 / 2 * 8; }

// Four P values rounded to e4m3 (nearest even, P <= 2^8 never saturates), a in the low byte.
__device__ __forceinline__ u32 narrow4(float a, float b, float c, float d) {
  return static_cast<u32>(narrow2<ElemType::kFloat8E4M3>(a, b)) |
         (static_cast<u32>(narrow2<ElemType::kFloat8E4M3>(c, d)) << 16);
}

// The first kSteps 32-key steps of a warpgroup's P (S's accumulator layout, fp32) as e4m3 A fragments.
template <int kSteps, int kSteps16, int kGroups>
__device__ __forceinline__ void pack_p_steps(u32 (&frag)[kSteps16][4], const float (&acc)[kGroups][4]) {
  static_assert(kSteps <= kSteps16 && 4 * kSteps <= kGroups, "steps of four 8-key groups");
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h: keys 0-15 of the step (registers 0, 1) or 16-31 (2, 3)
      const float(&lo)[4] = acc[4 * j + 2 * h];
      const float(&hi)[4] = acc[4 * j + 2 * h + 1];
      frag[j][2 * h] = narrow4(lo[0], lo[1], hi[0], hi[1]);      // row g
      frag[j][2 * h + 1] = narrow4(lo[2], lo[3], hi[2], hi[3]);  // row g + 8
    }
}

}  // namespace fp8
}  // namespace flashgen
