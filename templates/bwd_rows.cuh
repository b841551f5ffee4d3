// The backward's row kernels, shared by both families (bwd_sm80.cuh, bwd_sm90.cuh): the preprocess
// (D = rowsum(dO ∘ O), zeroing the fp32 dQ accumulator) and the conversion of that accumulator to dQ.
// Generic over a config type with kElem, kHeadDim, kAtomicDq and kPadRows: the workspace holds
// round_up(seqlen_q, kPadRows) rows per (batch, head); rows past seqlen_q get D = 0, LSE2 = +inf (so P
// is 0 there) and a zero dQ accumulator, which lets the Hopper family read and add whole query blocks.
#pragma once

#include "attn_params.cuh"
#include "bwd_traits.cuh"
#include "sequence.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"

namespace flashgen {
namespace bwd {

// The forward's natural-log LSE in the base-2 units of P = exp2(s * scale_log2 - lse2). A row that saw
// no key has LSE -inf; +inf makes its P 0 instead of inf.
__device__ __forceinline__ float lse_to_log2(float lse) {
  return lse == neg_inf() ? pos_inf() : lse * 1.4426950408889634f;
}

// Rows per (batch, head) of the workspace arrays.
template <class Cfg>
__device__ __forceinline__ int padded_rows(const AttnBwdParams& p) {
  return (p.seqlen_q + Cfg::kPadRows - 1) / Cfg::kPadRows * Cfg::kPadRows;
}

}  // namespace bwd

// D = rowsum(dO ∘ O) for every (batch, head, query) row of the padded workspace, one warp per row;
// zeroes the row of the fp32 dQ accumulator when the atomic strategy will add into it, and writes the
// LSE in base 2 when the config's dkdv kernel reads it from the workspace (p.lse_log2 set).
template <class Cfg>
struct BwdPreprocess {
  using u16 = sm80::u16;
  using u32 = sm80::u32;
  static constexpr int kThreads = kBwdRowKernelThreads;
  static constexpr int kRowsPerBlock = kThreads / 32;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row, at most 32
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;

  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {  // a packed sequence's rows: the workspace has no padding rows (kPadRows 1)
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z, kHeadDim);
      if (static_cast<int>(blockIdx.x * kRowsPerBlock) >= p.seqlen_q) return;
      run_rows(p);
    } else {
      run_rows(params);
    }
  }

  static __device__ void run_rows(const AttnBwdParams& p) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + warp;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int rows = kVarlen ? p.seqlen_q : bwd::padded_rows<Cfg>(p);
    if (row >= rows) return;
    const long long head_row0 = row_base<kVarlen>(p, batch, head, rows);  // the head's first row
    const long long flat_row = head_row0 + row;
    const bool valid = row < p.seqlen_q;

    float sum = 0.f;
    if (valid && lane < kChunks) {
      const u16* o = static_cast<const u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                     row * p.o_row_stride + lane * 8;
      const u16* d = static_cast<const u16*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride +
                     row * p.do_row_stride + lane * 8;
      const uint4 ov = *reinterpret_cast<const uint4*>(o);
      const uint4 dv = *reinterpret_cast<const uint4*>(d);
      const u32 ow[4] = {ov.x, ov.y, ov.z, ov.w};
      const u32 dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float o_lo, o_hi, d_lo, d_hi;
        sm80::unpack2<Cfg::kElem>(ow[i], o_lo, o_hi);
        sm80::unpack2<Cfg::kElem>(dw[i], d_lo, d_hi);
        sum += o_lo * d_lo + o_hi * d_hi;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      p.dsum[flat_row] = sum;
      if (p.lse_log2 != nullptr) {
        p.lse_log2[flat_row] = valid ? bwd::lse_to_log2(p.lse[row_base<kVarlen>(p, batch, head, p.seqlen_q) + row])
                                     : pos_inf();
      }
    }

    if constexpr (Cfg::kAtomicDq) {
      float4 zero;
      zero.x = zero.y = zero.z = zero.w = 0.f;
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + flat_row * kHeadDim);
      for (int i = lane; i < kHeadDim / 4; i += 32) acc[i] = zero;
    }
  }
};

// dQ = scale * accumulator, rounded to the 16-bit type: one thread per 8 elements.
template <class Cfg>
struct BwdConvertDq {
  using u16 = sm80::u16;
  using u32 = sm80::u32;
  static constexpr int kThreads = kBwdRowKernelThreads;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;

  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z, kHeadDim);
      run_rows(p);
    } else {
      run_rows(params);
    }
  }

  static __device__ void run_rows(const AttnBwdParams& p) {
    const int i = blockIdx.x * kThreads + threadIdx.x;
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const long long flat_row = row_base<kVarlen>(p, batch, head, bwd::padded_rows<Cfg>(p)) + row;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + flat_row * kHeadDim + chunk * 8);
    const float4 a = src[0];
    const float4 b = src[1];
    const float s = p.scale;
    uint4 out;
    out.x = sm80::pack2<Cfg::kElem>(a.x * s, a.y * s);
    out.y = sm80::pack2<Cfg::kElem>(a.z * s, a.w * s);
    out.z = sm80::pack2<Cfg::kElem>(b.x * s, b.y * s);
    out.w = sm80::pack2<Cfg::kElem>(b.z * s, b.w * s);
    u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
              row * p.dq_row_stride + chunk * 8;
    *reinterpret_cast<uint4*>(dq) = out;
  }
};

}  // namespace flashgen
