// The host float64 attention reference: softmax(q kᵀ · scale) v in float64 with flashgen.h's mask, GQA and stride
// semantics, and exact FLOP counts: the ground truth of `flashgen run`, the tuner's sweeps and the tests, which compare
// outputs with it by the rule in check/output_check.hpp. The element types it reads: check/number_formats.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "check/number_formats.hpp"
#include "problem/attention_problem.hpp"

namespace flashgen {

// ---------------------------------------------------------------------------------------------------
// Problems and their masks.

// Element offset of (batch, seq, head, dim) given strides in elements; shape is [b, s, h, d].
struct StridedView {
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};

  int64_t offset(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3];
  }
  int64_t elements() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  // One past the largest offset the view touches (0 for an empty view): the storage it needs.
  int64_t span() const;
  static StridedView contiguous(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim);
};

// The scale the library applies: softmax_scale when > 0, else 1/sqrt(head_dim).
double effective_softmax_scale(float softmax_scale, int64_t head_dim);

// The sides of Mask::kSlidingWindow (flashgen_attention_options' window_left and window_right): the keys
// before and after the bottom-right diagonal a query sees, -1 for no bound. Read under that mask only. And the
// chunk (options.attention_chunk), read under every mask but the top-left causal one: > 0 keeps only the keys j
// of the row's own chunk, floor(j / chunk) == floor((i + seqlen_k - seqlen_q) / chunk); 0 none.
struct ReferenceWindow {
  int64_t left = -1;
  int64_t right = -1;
  int64_t chunk = 0;
};

// A problem's window and chunk as the references take them.
inline ReferenceWindow window_of(const AttentionProblem& problem) {
  return {problem.window_left, problem.window_right, problem.attention_chunk};
}

// What the references apply besides the mask (flashgen_attention_options' variant fields): a soft cap (> 0),
// the window's sides (read under Mask::kSlidingWindow only), ALiBi's slopes, the slope of (batch b,
// query head h) at b * alibi_batch_stride + h (empty: no ALiBi), and the sinks, one logit per query head (empty:
// none). A score s = q·k · scale becomes softcap · tanh(s / softcap) - slope · |i + seqlen_k - seqlen_q - j|
// (about i - j under the top-left causal mask), and head h's sink joins each row's softmax with no value, as
// flashgen.h defines them.
struct ReferenceVariant {
  double softcap = 0.0;
  ReferenceWindow window;
  std::vector<float> alibi_slopes;
  int64_t alibi_batch_stride = 0;
  std::vector<float> sinks;
  // A user variant's functions as the reference applies them (flashgen_variant_desc): user_mask(b, h, i, j) false
  // hides key j from query i on top of the mask; user_score(s, b, h, i, j) maps the scaled score s (after the cap
  // and ALiBi), user_score_grad(modified, b, h, i, j) is its derivative given its value. Empty: none.
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> user_mask;
  std::function<double(double, int64_t, int64_t, int64_t, int64_t)> user_score;
  std::function<double(double, int64_t, int64_t, int64_t, int64_t)> user_score_grad;

  ReferenceVariant(double cap = 0.0, ReferenceWindow sides = {}, std::vector<float> slopes = {},
                   int64_t slopes_batch_stride = 0)
      : softcap(cap), window(sides), alibi_slopes(std::move(slopes)), alibi_batch_stride(slopes_batch_stride) {}
};

// The ALiBi slopes flashgen's own runs of an ALiBi problem use (a sweep, `flashgen run --alibi`): 2^(-8 (h + 1) /
// heads_q) for query head h, one per head (the ALiBi paper's geometric sequence for a power-of-two head count).
std::vector<float> standard_alibi_slopes(int64_t heads_q);

// A problem's variant as flashgen's own runs take it: its cap and window, and with ALiBi the standard slopes.
ReferenceVariant variant_of(const AttentionProblem& problem);

// The keys query i sees, [first, end) with 0 <= first <= end <= seqlen_k: a prefix under the causal masks and
// none, a range about the diagonal j = i + seqlen_k - seqlen_q under the window mask, either cut to the
// diagonal's chunk with one (flashgen.h's definitions).
struct KeyRange {
  int64_t first = 0;
  int64_t end = 0;
  int64_t count() const { return end - first; }
};
KeyRange visible_keys(Mask mask, int64_t i, int64_t seqlen_q, int64_t seqlen_k, ReferenceWindow window = {});

// Whether key j is visible to query i.
inline bool key_visible(Mask mask, int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k,
                        ReferenceWindow window = {}) {
  const KeyRange keys = visible_keys(mask, i, seqlen_q, seqlen_k, window);
  return j >= keys.first && j < keys.end;
}

// How many keys query i sees, in [0, seqlen_k].
inline int64_t visible_key_count(Mask mask, int64_t i, int64_t seqlen_q, int64_t seqlen_k,
                                 ReferenceWindow window = {}) {
  return visible_keys(mask, i, seqlen_q, seqlen_k, window).count();
}

// Visible (query, key) pairs of one head, counted exactly.
int64_t visible_pairs(Mask mask, int64_t seqlen_q, int64_t seqlen_k, ReferenceWindow window = {});

// FLOPs of one forward pass: 2 * head_dim for QKᵀ and 2 * the values' head dim for PV per visible pair of every
// (batch, query head), the count FlashAttention's benchmarks report (softmax not counted).
double forward_flops(const AttentionShape& shape, Mask mask, ReferenceWindow window = {});

// ---------------------------------------------------------------------------------------------------
// References.

// An input tensor for the references, read through view (shape [b, s, h, d]): float64 values (holding
// values rounded to the kernel's dtype, for a like-for-like check), the raw bits of a 16-bit tensor as
// the GPU holds it, or the codes of an FP8 tensor with its one descale (each code stands for its value times it).
struct HostInput {
  enum class Element { kFloat64, kFloat16, kBFloat16, kFloat8E4M3, kFloat8E5M2 };

  const void* data = nullptr;
  Element element = Element::kFloat64;
  StridedView view;
  double descale = 1.0;  // FP8 codes only: the factor their values are read with

  static HostInput float64(const double* values, const StridedView& view) {
    return HostInput{values, Element::kFloat64, view};
  }
  static HostInput bits16(const uint16_t* bits, DType dtype, const StridedView& view) {
    return HostInput{bits, dtype == DType::kBFloat16 ? Element::kBFloat16 : Element::kFloat16, view};
  }
  // fp8 is DType::kFloat8E4M3 or kFloat8E5M2; descale as an FP8 forward's per-tensor q_descale (strides {0, 0}).
  static HostInput fp8_codes(const uint8_t* codes, DType fp8, const StridedView& view, double descale);
  // Element (b, s, h, d); 16-bit values convert exactly, FP8 codes to their value times descale (exact in double
  // for an fp32 descale: 4 significant bits times 24).
  double at(int64_t b, int64_t s, int64_t h, int64_t d) const;
  // The view.shape[3] (head_dim) elements of row (b, s, h): a pointer into data when they are float64 at
  // unit stride, else converted into scratch (head_dim doubles) and scratch returned.
  const double* row(int64_t b, int64_t s, int64_t h, double* scratch) const;
};

// Throws Error(kInvalidArgument) unless heads_q is a positive multiple of heads_kv and each view's shape is
// the problem's ([b, sq, hq, d] for q, [b, sk, hkv, d] for k, [b, sk, hkv, d_v] for v, whose head dim d_v > 0 is its
// own: the values', hence the output's and dO's, when they differ from the keys', as in MLA). Every reference checks
// this first.
void require_reference_inputs(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                              const HostInput& v);

struct AttentionResult {
  std::vector<double> out;  // [batch, seqlen_q, heads_q, d_v] contiguous
  std::vector<double> lse;  // [batch, heads_q, seqlen_q] contiguous, natural log; -inf for a fully masked row
};

// softmax(q kᵀ · scale, masked) v in float64. Query head h reads key/value head shape.kv_head(h). A fully
// masked row gives out 0 and lse -inf, as flashgen.h specifies. variant: a soft cap, a window's sides and ALiBi
// slopes (ReferenceVariant).
AttentionResult attention_reference_f64(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                        const HostInput& v, double scale, Mask mask,
                                        const ReferenceVariant& variant = {});

struct ReferenceRow {
  std::vector<double> out;  // (d_v)
  double lse = 0;           // natural log; -inf for a fully masked row
};

// One query row of attention_reference_f64, bit for bit: for checking samples of problems too large to
// compute whole. Rows are independent, so callers may compute several on different threads.
ReferenceRow attention_reference_row(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                     const HostInput& v, double scale, Mask mask, int64_t batch,
                                     int64_t head, int64_t row, const ReferenceVariant& variant = {});

// A query row of a problem: what the sampled checks of large problems compute and compare.
struct RowSample {
  int64_t batch = 0;
  int64_t head = 0;  // query head
  int64_t row = 0;   // query position
};

// attention_reference_row of each sample, computed on up to `threads` threads (the rows are independent).
std::vector<ReferenceRow> attention_reference_rows(const AttentionShape& shape, const HostInput& q,
                                                   const HostInput& k, const HostInput& v, double scale,
                                                   Mask mask, const std::vector<RowSample>& rows,
                                                   int threads, const ReferenceVariant& variant = {});

// One query row of an FP8 forward as FlashAttention-3's rule judges it (check/output_check.hpp's check_fp8_rows), over
// the dequantized inputs (HostInput::fp8_codes, or float64 values of codes times descales): the exact row
// (attention_reference_row's, bit for bit), the same row with P rounded as the kernels round it before P·V
// (round_p_to_e4m3 of each p against the row's max; the sum of the unrounded p divides it), and the largest sum of
// |q_x k_x| over the row's visible keys times scale, which bounds what the FP8 tensor cores' accumulation of a score
// may lose.
struct Fp8ReferenceRow {
  ReferenceRow exact;
  std::vector<double> out_p_rounded;  // (d_v); 0 for a row that sees no key, as exact.out
  double qk_magnitude = 0;            // 0 for a row that sees no key
};
Fp8ReferenceRow attention_reference_row_fp8(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                            const HostInput& v, double scale, Mask mask, int64_t batch, int64_t head,
                                            int64_t row, const ReferenceVariant& variant = {});

// attention_reference_row_fp8 of each sample, on up to `threads` threads.
std::vector<Fp8ReferenceRow> attention_reference_rows_fp8(const AttentionShape& shape, const HostInput& q,
                                                          const HostInput& k, const HostInput& v, double scale,
                                                          Mask mask, const std::vector<RowSample>& rows, int threads,
                                                          const ReferenceVariant& variant = {});

// ---------------------------------------------------------------------------------------------------
// Backward.

struct AttentionGradients {
  std::vector<double> dq;      // [batch, seqlen_q, heads_q, head_dim] contiguous
  std::vector<double> dk;      // [batch, seqlen_k, heads_kv, head_dim] contiguous
  std::vector<double> dv;      // [batch, seqlen_k, heads_kv, d_v] contiguous
  std::vector<double> dsinks;  // [heads_q] with sinks, else empty
};

// Exact float64 gradients of attention_reference_f64's out for the upstream gradient dout ([b, sq, hq, d_v]):
// P = softmax(scale · q kᵀ, masked), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = scale · dS K,
// dK = scale · dSᵀ Q, with dK and dV summed over the query heads sharing a key/value head. Fully masked
// rows contribute nothing. With a soft cap the scores are capped as in the forward and dS is multiplied by the
// cap's derivative, 1 − tanh²(s / softcap); ALiBi's bias, constant in s, leaves dS as it is. A sink joins P
// (P_sink = e^(sink − LSE)) with no value, and its gradient is −Σ P_sink · rowsum(dO ∘ O) over the head's rows.
// variant as in the forward.
AttentionGradients attention_backward_reference_f64(const AttentionShape& shape, const HostInput& q,
                                                    const HostInput& k, const HostInput& v, const HostInput& dout,
                                                    double scale, Mask mask,
                                                    const ReferenceVariant& variant = {});

// FLOPs of one backward pass: 2.5x the forward's (five products of the forward's size, QKᵀ recomputed),
// the count FlashAttention's benchmarks report.
double backward_flops(const AttentionShape& shape, Mask mask, ReferenceWindow window = {});

}  // namespace flashgen
