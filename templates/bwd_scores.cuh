// The backward's scoring step, one score at a time, as every backward family takes it (bwd_sm80.cuh's dkdv and dq
// kernels, bwd_sm90.cuh's consumers), in either accumulator layout: a score's value x in log2 units (the variant's
// score of q·k times scale_log2), which scores a partial block hides (S: the variant's row_keys per query row; Sᵀ:
// key_queries below per key row), its probability P = exp2(x - lse2) (0 where hidden), and dS = P ∘ (dP - D)
// through the variant's gradient, so that dS is with respect to q·k.
#pragma once

#include "sm80_primitives.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {
namespace bwd {

// x: the variant's score of q·k at `at`, in log2 units (scale_log2: p.variant.scale_log2, read by the caller).
template <class Variant, class Params>
__device__ __forceinline__ float scaled_score(const Params& p, const ScoreAt& at, float qk, float scale_log2) {
  return Variant::score(p, at, qk) * scale_log2;
}

// The same, reading p.variant.scale_log2 after the variant's score.
template <class Variant, class Params>
__device__ __forceinline__ float scaled_score(const Params& p, const ScoreAt& at, float qk) {
  return Variant::score(p, at, qk) * p.variant.scale_log2;
}

// The queries a partial block of Sᵀ (a key per row) hides from key, in the form tested once per score: query
// query_base + o is hidden iff .hidden(o); every query where the key lies past seqlen_k.
template <class Variant, class Params>
__device__ __forceinline__ auto key_queries(const Params& p, int batch, int head, int key, int query_base) {
  auto queries = Variant::key_queries(p, batch, head, key, query_base);
  if (key >= p.seqlen_k) queries.hide_every_query();
  return queries;
}

// P = exp2(x - lse2): 0 for a hidden score (x = -inf) and for a query row past seqlen_q (lse2 = +inf).
__device__ __forceinline__ float probability(float x, float lse2) { return sm80::exp2_approx(x - lse2); }

// P_sink = exp2(sink · log2 e - lse2): the sink's share of a query row's softmax, whose gradient is
// -P_sink · Σ_j P_ij dP_ij (0 for a row past seqlen_q, lse2 = +inf).
__device__ __forceinline__ float sink_probability(float sink_log2, float lse2) {
  return sm80::exp2_approx(sink_log2 - lse2);
}

// dS at `at` with respect to q·k: the variant's gradient at x of P ∘ (dP - D).
template <class Variant, class Params>
__device__ __forceinline__ float score_gradient(const Params& p, const ScoreAt& at, float x, float pr, float dp,
                                                float dsum) {
  return Variant::score_grad(p, at, x, pr * (dp - dsum));
}

}  // namespace bwd
}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own: one score of a causal tile, its P and dS.
struct FlashgenBwdScoresCheckParams {
  int seqlen_q, seqlen_k;
  struct {
    int causal_offset;
    float scale_log2;
  } variant;  // what the causal mask and the score read of VariantArgs
};
__global__ void flashgen_bwd_scores_check(const FlashgenBwdScoresCheckParams p, const float* in, float* out) {
  using Variant = flashgen::CausalMask;
  const flashgen::ScoreAt at{0, 0, static_cast<int>(threadIdx.x), static_cast<int>(threadIdx.y)};
  const float x = flashgen::bwd::scaled_score<Variant>(p, at, in[threadIdx.x]);
  const float s = flashgen::bwd::key_queries<Variant>(p, 0, 0, at.k, 0).hidden(at.q) ? flashgen::neg_inf() : x;
  const float pr = flashgen::bwd::probability(s, in[threadIdx.y]);
  out[threadIdx.x] = flashgen::bwd::score_gradient<Variant>(p, at, x, pr, in[threadIdx.x + 1], in[threadIdx.y + 1]);
}
#endif
