// A user variant's functions as the float64 references ask them (check/reference.hpp's ReferenceVariant hooks),
// answered by the functions themselves: compiled with NVRTC (generator's generate_user_table) and evaluated on the
// GPU at every point a reference asks, so a sweep checks a user variant's candidates as it checks the built-in ones.
#pragma once

#include <cuda.h>

#include <functional>

#include "check/reference.hpp"
#include "problem/user_variant.hpp"

namespace flashgen {

// Runs reference twice on the problem of `shape`: first with hooks that record the points (batch, head, query,
// key) it asks and the score it asks each at, then, after the variant's functions were evaluated at those points
// on the GPU (stream's context, with the call's args), with hooks that answer from them. reference must ask each
// point's score alike in both runs (the references do: a score depends on its point alone), from one thread (the
// hooks record without a lock: a sweep's references run on one). base carries the rest
// of the variant (cap, window, slopes, sinks); its user hooks are replaced. Throws what NVRTC or the driver throws.
void with_user_functions(const UserVariant& user, const UserVariantArgs& args, const AttentionShape& shape,
                         ReferenceVariant base, CUstream stream,
                         const std::function<void(const ReferenceVariant&)>& reference);

}  // namespace flashgen
