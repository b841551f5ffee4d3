// Test side of backward numerics: the "naive same-dtype" backward that sets the gradients' error budget,
// and the gradient check. The float64 reference and the tolerance rule are the library's (check/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "support/attention_reference.hpp"

namespace flashgen::test {

// What a straightforward 16-bit backward computes: S and the softmax in float32, O rounded to dtype and
// D = rowsum(dO ∘ O) in float32, P and dS rounded to dtype as the operands of the gradient products, the
// products accumulated in float32, each gradient rounded to dtype at the end.
AttentionGradients attention_backward_naive(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                            const HostInput& v, const HostInput& dout, double scale,
                                            Mask mask, flashgen_dtype dtype);

// got: contiguous over dims ([b, s, h, d]) like ref64; check_within_budget with gradient_budget_floor of
// max|ref64| as floor.
CheckReport check_gradient(const char* name, const std::vector<int64_t>& dims, const std::vector<double>& got,
                           const std::vector<double>& ref64, const std::vector<double>& naive, flashgen_dtype dtype);

}  // namespace flashgen::test
