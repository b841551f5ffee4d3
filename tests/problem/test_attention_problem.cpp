// Tests for problem/attention_problem: the problem type's constructors, its kernel mask kind, dQ strategy
// and group arithmetic.
#include "catch.hpp"
#include "problem/attention_problem.hpp"

using flashgen::AttentionProblem;
using flashgen::AttentionShape;
using flashgen::DType;

TEST_CASE("forward and backward problems carry their pass, mask and dQ strategy", "[problem]") {
  const AttentionShape shape{/*batch=*/2, /*seqlen_q=*/100, /*seqlen_k=*/300, /*heads_q=*/12, /*heads_kv=*/4,
                             /*head_dim=*/80};
  const AttentionProblem forward = flashgen::forward_problem(DType::kBFloat16, shape, FLASHGEN_MASK_CAUSAL_TOP_LEFT);
  CHECK(forward.pass == flashgen::Pass::kForward);
  CHECK_FALSE(forward.backward());
  CHECK(forward.dtype == DType::kBFloat16);
  CHECK(forward.head_dim() == 80);
  CHECK(forward.mask == FLASHGEN_MASK_CAUSAL_TOP_LEFT);
  // Both causal alignments run the causal kernels; the alignment stays in the problem.
  CHECK(forward.mask_kind() == flashgen::MaskKind::kCausal);
  CHECK(flashgen::forward_problem(DType::kFloat16, shape, FLASHGEN_MASK_NONE).mask_kind() == flashgen::MaskKind::kNone);

  // A forward problem has no dQ strategy, whatever the field holds.
  AttentionProblem odd = forward;
  odd.dq = flashgen::DqStrategy::kDeterministic;
  CHECK_FALSE(odd.deterministic());

  const AttentionProblem det = flashgen::backward_problem(DType::kFloat16, shape, FLASHGEN_MASK_CAUSAL, true);
  CHECK(det.backward());
  CHECK(det.deterministic());
  CHECK(det.dq == flashgen::DqStrategy::kDeterministic);
  CHECK_FALSE(flashgen::backward_problem(DType::kFloat16, shape, FLASHGEN_MASK_CAUSAL, false).deterministic());
}

TEST_CASE("a shape's query heads map onto their key/value heads in groups", "[problem]") {
  const AttentionShape gqa{1, 1, 1, /*heads_q=*/12, /*heads_kv=*/4, 64};
  CHECK(gqa.group_size() == 3);
  CHECK(gqa.kv_head(0) == 0);
  CHECK(gqa.kv_head(2) == 0);
  CHECK(gqa.kv_head(3) == 1);
  CHECK(gqa.kv_head(11) == 3);
  const AttentionShape mha{2, 5, 7, 3, 3, 64};
  CHECK(mha.group_size() == 1);
  CHECK(mha.kv_head(2) == 2);
  CHECK(mha.reference_cost() == 2.0 * 3 * 5 * 7 * 64);
  CHECK(flashgen::dtype_name(DType::kFloat16) == std::string("fp16"));
  CHECK(flashgen::dtype_name(DType::kBFloat16) == std::string("bf16"));
}
