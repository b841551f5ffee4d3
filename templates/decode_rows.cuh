// The decode family's row kernels and its cache addressing (decode_sm80.cuh's attention kernel and the latent one of
// decode_sm90.cuh share them): where a sequence's key lives in a contiguous or paged cache, DecodeAppend writing the
// new tokens into it, DecodeCombine merging a row's key ranges.
#pragma once

#include "attn_params.cuh"
#include "decode_traits.cuh"
#include "fp8.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"

namespace flashgen {

// Keys in sequence batch's cache before the new tokens: cache_seqlens[batch] clamped so that the new tokens
// still fit (garbage lengths give wrong rows, never an access outside the cache).
__device__ __forceinline__ int decode_cache_len(const AttnDecodeParams& p, int batch) {
  const int room = p.capacity - p.seqlen_new;
  if (p.cache_seqlens == nullptr) return room;
  return min(max(p.cache_seqlens[batch], 0), room);
}

// An FP8 cache's scale for (batch, kv head): scales[batch * batch_stride + head * head_stride], 1 without scales.
__device__ __forceinline__ float cache_scale(const float* scales, long long batch_stride, long long head_stride,
                                             int batch, int head) {
  return scales != nullptr ? scales[batch * batch_stride + head * head_stride] : 1.f;
}

// Where key `key` of a sequence lives: batch entry (contiguous) or page (paged, index clamped into the cache),
// and the row in it.
struct CacheRow {
  long long page;
  int row;
};

template <bool kPaged>
__device__ __forceinline__ CacheRow cache_row(const AttnDecodeParams& p, const int* pages, int batch, int key) {
  if constexpr (kPaged) {
    const int page = min(max(pages[key / p.page_size], 0), p.num_pages - 1);
    return {page, key % p.page_size};
  } else {
    return {batch, key};
  }
}

// Merges the ranges' parts of every output row (one warp per row): weights exp(lse_s - lse) over the ranges
// that saw a key, lse including the head's sink when the call has sinks; a row no range saw a key of gets 0
// and lse -inf (the sink, with one). The ranges are taken 32 at a time, lane s holding range s0 + s's LSE and
// weight, and every range's part of the row is loaded before any is added (kUnroll loads in flight), so a row
// costs a few memory round trips rather than one per range and pass.
template <class Cfg>
struct DecodeCombine {
  using u16 = sm80::u16;
  static constexpr int kHeadDim = ConfigHeadDimV<Cfg>::value;  // the output rows' head dim: the values'
  static constexpr ElemType kElem = Cfg::kElem;
  static constexpr int kPasses = (kHeadDim + 127) / 128;  // 4 columns per lane and pass
  static constexpr int kUnroll = 8;

  static __device__ float warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
  }
  static __device__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
  }

  static __device__ void run(const AttnDecodeParams& p) {
    const int lane = threadIdx.x % 32;
    sm80::wait_for_primary();  // the attention kernel's parts are written
    const long long rows = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q;
    const long long row = static_cast<long long>(blockIdx.x) * (kDecodeRowKernelThreads / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    const int tok = static_cast<int>(row % p.seqlen_q);
    const int hq = static_cast<int>(row / p.seqlen_q % p.heads_q);
    const float sink = p.variant.sinks != nullptr ? p.variant.sinks[hq] : neg_inf();  // loaded beside the ranges' LSE
    const float* lse_part = p.lse_partial + row;  // range s at s * rows
    auto lse_of = [&](int s) { return s < p.splits ? lse_part[s * rows] : neg_inf(); };

    // The ranges' LSE, first 32 kept in lane order (the common case reads them once).
    const float lse_first = lse_of(lane);
    float m = lse_first;
    for (int s = 32 + lane; s < p.splits; s += 32) m = fmaxf(m, lse_of(s));
    m = warp_max(m);
    float sum = softmax::lse_part_weight(lse_first, m);
    for (int s = 32 + lane; s < p.splits; s += 32) sum += softmax::lse_part_weight(lse_of(s), m);
    sum = warp_sum(sum);
    float lse = sum > 0.f ? m + __logf(sum) : neg_inf();

    if (sink != neg_inf()) lse = softmax::lse_with_sink(lse, sink);

    // O = sum over ranges of w_s * O_s, in range order. A range that saw no key (lse -inf) has weight 0 and a part
    // that is not a number: it is selected away, not multiplied.
    float4 acc[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    const float* o_part = p.o_partial + row * kHeadDim + lane * 4;  // range s at s * rows * kHeadDim
    for (int s0 = 0; s0 < p.splits; s0 += 32) {
      const float lse_s = s0 == 0 ? lse_first : lse_of(s0 + lane);
      const float weight = softmax::lse_part_weight(lse_s, lse);
      const int n = min(32, p.splits - s0);
      for (int j0 = 0; j0 < n; j0 += kUnroll) {
        float4 part[kUnroll][kPasses];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int i = 0; i < kPasses; ++i) {
            if (j0 + u < n && lane * 4 + 128 * i < kHeadDim) {
              part[u][i] = *reinterpret_cast<const float4*>(o_part + (s0 + j0 + u) * rows * kHeadDim + 128 * i);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float w = __shfl_sync(0xffffffffu, weight, (j0 + u) % 32);
          if (j0 + u < n && w != 0.f) {
#pragma unroll
            for (int i = 0; i < kPasses; ++i) {
              if (lane * 4 + 128 * i < kHeadDim) {
                acc[i].x += w * part[u][i].x, acc[i].y += w * part[u][i].y;
                acc[i].z += w * part[u][i].z, acc[i].w += w * part[u][i].w;
              }
            }
          }
        }
      }
    }
    const int batch = static_cast<int>(row / (static_cast<long long>(p.seqlen_q) * p.heads_q));
    u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + tok * p.o_row_stride + hq * p.o_head_stride;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int c = lane * 4 + 128 * i;
      if (c < kHeadDim) {
        *reinterpret_cast<uint2*>(o + c) =
            make_uint2(sm80::pack2<kElem>(acc[i].x, acc[i].y), sm80::pack2<kElem>(acc[i].z, acc[i].w));
      }
    }
    if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
  }
};

// Appends the new tokens' keys and values at rows [cache_len, cache_len + seqlen_new) of their sequences'
// caches, one 16-byte chunk of the new tokens per thread (rounded to 8 bytes for an FP8 cache: each value divided by
// its scale); a latent cache (values of a head dim of their own: the keys' first columns) takes the keys alone.
// blockIdx: (chunk block, sequence).
template <class Cfg>
struct DecodeAppend {
  using u16 = sm80::u16;
  static constexpr int kChunks = Cfg::kHeadDim / 8;
  static constexpr ElemType kCacheElem = ConfigCacheElem<Cfg>::value;
  static constexpr bool kFp8 = is_fp8(kCacheElem);
  using CacheT = typename fp8::Storage<kCacheElem>::type;

  // The 8 new values at src, as the cache stores them, to dst.
  static __device__ void store(CacheT* dst, const u16* src, const float* scales, long long batch_stride,
                               long long head_stride, int batch, int head) {
    const uint4 x = *reinterpret_cast<const uint4*>(src);
    if constexpr (kFp8) {
      const float scale = cache_scale(scales, batch_stride, head_stride, batch, head);
      const unsigned words[4] = {x.x, x.y, x.z, x.w};
      unsigned short pairs[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float lo, hi;
        sm80::unpack2<Cfg::kElem>(words[i], lo, hi);
        pairs[i] = fp8::narrow2<kCacheElem>(__fdiv_rn(lo, scale), __fdiv_rn(hi, scale));
      }
      *reinterpret_cast<uint2*>(dst) = make_uint2(pairs[0] | (unsigned(pairs[1]) << 16),
                                                  pairs[2] | (unsigned(pairs[3]) << 16));
    } else {
      *reinterpret_cast<uint4*>(dst) = x;
    }
  }

  static __device__ void run(const AttnDecodeParams& p) {
    const int batch = blockIdx.y;
    const int items = p.seqlen_new * p.heads_kv * kChunks;
    const int i = blockIdx.x * kDecodeRowKernelThreads + threadIdx.x;
    if (i >= items) return;
    const int chunk = i % kChunks;
    const int head = i / kChunks % p.heads_kv;
    const int token = i / (kChunks * p.heads_kv);
    const int* pages = Cfg::kPaged ? p.block_table + batch * p.block_table_stride : nullptr;
    const CacheRow at = cache_row<Cfg::kPaged>(p, pages, batch, decode_cache_len(p, batch) + token);
    const u16* k_src = static_cast<const u16*>(p.k_new) + batch * p.kn_batch_stride + token * p.kn_row_stride +
                       head * p.kn_head_stride + chunk * 8;
    CacheT* k_dst = static_cast<CacheT*>(const_cast<void*>(p.k_cache)) + at.page * p.k_batch_stride +
                    at.row * p.k_row_stride + head * p.k_head_stride + chunk * 8;
    store(k_dst, k_src, p.k_scale, p.k_scale_batch_stride, p.k_scale_head_stride, batch, head);
    if constexpr (ConfigHeadDimV<Cfg>::value == Cfg::kHeadDim) {
      const u16* v_src = static_cast<const u16*>(p.v_new) + batch * p.vn_batch_stride + token * p.vn_row_stride +
                         head * p.vn_head_stride + chunk * 8;
      CacheT* v_dst = static_cast<CacheT*>(const_cast<void*>(p.v_cache)) + at.page * p.v_batch_stride +
                      at.row * p.v_row_stride + head * p.v_head_stride + chunk * 8;
      store(v_dst, v_src, p.v_scale, p.v_scale_batch_stride, p.v_scale_head_stride, batch, head);
    }
  }
};

}  // namespace flashgen
