// The online softmax of the forward families (fwd_sm80.cuh, fwd_sm90_consumer.cuh) in base 2 with lazy
// rescaling, and the infinities every family masks with. The functions work on one 16-row tile of scores
// in the accumulator layout that mma.sync m16n8 and wgmma share: groups of 4 floats per 8 keys, [0], [1]
// row g and [2], [3] row g + 8 (g = lane / 4, "h" 0 and 1 below), keys 2t and 2t + 1 (t = lane % 4); a
// quad of lanes holds a row's 8 keys of each group. A kernel calls them in the order its pipeline needs.
//
// Lazy rescaling: the running max m (log2 units, softmax scale folded in) moves only when a row's block
// max exceeds it by more than kRescaleSlack, so P = exp2(s * scale_log2 - m) stays below 2^kRescaleSlack
// (exactly representable range in fp16/bf16, harmless in fp32 sums) and O is rescaled only in the rare
// blocks where some row of the warp needs it. The result is the same function: the final normalisation
// and the LSE use the same m.
// Scalars come by const reference: inlined, each function then compiles to the PTX of the code it
// replaced in the kernels, operand for operand (a by-value float swaps the operands of some multiplies
// and compares; scripts/compare_kernels.py shows it).
#pragma once

#include "sm80_primitives.cuh"

namespace flashgen {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000u); }

namespace softmax {

// Largest log2 growth of the row max absorbed without rescaling O: P stays below 2^8. (The FP8 forward takes none:
// it rounds P to e4m3, and keeps each row's largest P exact, fwd_sm90_layout.cuh's kPBias.)
constexpr int kRescaleSlack = 8;

// This block's max of row h over the first kWidth groups of acc, across the quad, in log2 units.
template <int kWidth, int kGroups>
__device__ __forceinline__ float block_max(const float (&acc)[kGroups][4], int h, const float& scale_log2) {
  float mx = neg_inf();
#pragma unroll
  for (int i = 0; i < kWidth; ++i) mx = fmaxf(mx, fmaxf(acc[i][2 * h], acc[i][2 * h + 1]));
  return sm80::quad_max(mx) * scale_log2;  // -inf stays -inf: scale_log2 > 0
}

// Whether a row's running max moves for a block whose max is block_max, by more than kSlack.
template <int kSlack = kRescaleSlack>
__device__ __forceinline__ bool max_moves(const float& block_max, const float& row_max) {
  return block_max > row_max + static_cast<float>(kSlack);
}

// Moves row_max to block_max when moves; returns the factor the row's O and sum are scaled by (1 when
// the max stays). exp2(-inf - finite) = 0: a row's first visible block drops the (empty) history.
__device__ __forceinline__ float move_max(const bool& moves, const float& block_max, float& row_max) {
  const float correction = moves ? sm80::exp2_approx(row_max - block_max) : 1.f;
  row_max = moves ? block_max : row_max;
  return correction;
}

// P = exp2(s * scale_log2 - m) in place over row h's first kWidth groups; returns this thread's sum of
// them when kSum (0 otherwise).
template <int kWidth, bool kSum, int kGroups>
__device__ __forceinline__ float exponentiate(float (&acc)[kGroups][4], int h, const float& row_max,
                                             const float& scale_log2) {
  // A row that has seen no key keeps m = -inf; subtract 0 then so exp2(-inf) gives 0, not NaN.
  const float m = row_max == neg_inf() ? 0.f : row_max;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kWidth; ++i)
#pragma unroll
    for (int e = 2 * h; e < 2 * h + 2; ++e) {
      acc[i][e] = sm80::exp2_approx(acc[i][e] * scale_log2 - m);
      if constexpr (kSum) sum += acc[i][e];
    }
  return sum;
}

// Scales row h of an accumulator tile (O, or the rows' sums) by factor.
template <int kGroups>
__device__ __forceinline__ void scale_row(float (&acc)[kGroups][4], int h, float factor) {
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    acc[i][2 * h] *= factor;
    acc[i][2 * h + 1] *= factor;
  }
}

// Scales rows g and g + 8 of an accumulator tile by factor[0] and factor[1].
template <int kGroups>
__device__ __forceinline__ void scale_rows(float (&acc)[kGroups][4], const float (&factor)[2]) {
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    acc[i][0] *= factor[0], acc[i][1] *= factor[0];
    acc[i][2] *= factor[1], acc[i][3] *= factor[1];
  }
}

// The end of a row: 1 / sum, or 0 for a fully masked row (sum 0), whose output is 0.
__device__ __forceinline__ float inverse_sum(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }

// An attention sink (gpt-oss): a logit that joins a row's softmax denominator with no value. sink is in the
// row's units (log2, scale folded in: the scaled sink times log2(e)). Moves the row's frame to hold it: row_max
// becomes max(row_max, sink), sum is rescaled and gains the sink's share; returns the factor the row's
// unnormalised O takes with that rescaling (0 for a row that saw no key: its softmax is the sink's alone, O 0
// and the LSE the sink). A sink of -inf changes nothing; a NaN one gives NaN.
__device__ __forceinline__ float add_sink(const float& sink, float& row_max, float& sum) {
  if (sink == neg_inf()) return 1.f;
  const float m = fmaxf(row_max, sink);
  const float correction = sm80::exp2_approx(row_max - m);  // row_max -inf: 0
  sum = sum * correction + sm80::exp2_approx(sink - m);
  row_max = m;
  return correction;
}

// The factor a row's unnormalised O is scaled by at its end: 1 / sum, after the query head's sink when sinks
// (fp32 logits per query head, attn_params.cuh) is not null, which leaves row_max and sum as the LSE takes them.
__device__ __forceinline__ float row_end_factor(const float* sinks, int head, float& row_max, float& sum) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float correction = sinks != nullptr ? add_sink(sinks[head] * kLog2e, row_max, sum) : 1.f;
  return correction * inverse_sum(sum);
}

// A part's weight where a row's parts (its softmax over some of the keys: a warp's, a key range's) merge at max m,
// the parts' maxima in log2 units: 0 for a part that saw no key (max -inf), else exp2 of its distance from m.
__device__ __forceinline__ float part_weight(float part_max, float m) {
  return part_max == neg_inf() ? 0.f : sm80::exp2_approx(part_max - m);
}

// The same for parts that carry a natural-log LSE.
__device__ __forceinline__ float lse_part_weight(float part_lse, float m) {
  return part_lse == neg_inf() ? 0.f : __expf(part_lse - m);
}

// A natural-log LSE with a sink (in the same units) joined: log(exp(lse) + exp(sink)); a NaN sink gives NaN.
__device__ __forceinline__ float lse_with_sink(float lse, float sink) {
  const float high = lse > sink ? lse : sink, low = lse > sink ? sink : lse;
  return high + log1pf(__expf(low - high));
}

// The row's log-sum-exp in natural log from its max (log2 units) and sum; -inf for a fully masked row.
__device__ __forceinline__ float lse(float row_max, float sum) {
  constexpr float kLn2 = 0.6931471805599453f;
  return sum > 0.f ? (row_max + sm80::log2_approx(sum)) * kLn2 : neg_inf();
}

}  // namespace softmax
}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own: one block of two rows.
__global__ void flashgen_softmax_check(const float* s, float* out) {
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = s[threadIdx.x * 16 + i * 4 + e];
  float row_max = flashgen::neg_inf();
  const float block_max = flashgen::softmax::block_max<4>(acc, 0, 1.f);
  const float correction =
      flashgen::softmax::move_max(flashgen::softmax::max_moves(block_max, row_max), block_max, row_max);
  const float sum = flashgen::softmax::exponentiate<4, true>(acc, 0, row_max, 1.f) * correction;
  flashgen::softmax::scale_row(acc, 0, flashgen::softmax::inverse_sum(sum));
  out[threadIdx.x] = acc[0][0] + flashgen::softmax::lse(row_max, sum);
}
#endif
