// Names and constructors of the one problem type.
#include "problem/attention_problem.hpp"

namespace flashgen {

const char* dtype_name(DType dtype) { return dtype == DType::kBFloat16 ? "bf16" : "fp16"; }

AttentionProblem forward_problem(DType dtype, const AttentionShape& shape, flashgen_mask mask) {
  AttentionProblem problem;
  problem.dtype = dtype;
  problem.shape = shape;
  problem.mask = mask;
  return problem;
}

AttentionProblem backward_problem(DType dtype, const AttentionShape& shape, flashgen_mask mask, bool deterministic) {
  AttentionProblem problem = forward_problem(dtype, shape, mask);
  problem.pass = Pass::kBackward;
  problem.dq = deterministic ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
  return problem;
}

}  // namespace flashgen
