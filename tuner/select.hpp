// Run-time config choice for the forward pass: the heuristic's preference list, checked against what
// ptxas reports, memoized per (dtype, head_dim, mask, arch). The tuner's database (issue 4) will sit
// in front of it.
#pragma once

#include <string>

#include "kernel_config.hpp"

namespace flashgen {

struct ForwardChoice {
  KernelConfig config;
  std::string reason;  // where the config came from, e.g. "built-in heuristic (no tuning data)"
};

// The first heuristic config whose compiled kernel does not spill (compiling through the kernel
// registry's caches); the first one when all of them spill, saying so in the reason. Thread-safe;
// after the first call for a key it costs one map lookup.
ForwardChoice choose_forward_config(DType dtype, int head_dim, MaskKind mask, int arch);

}  // namespace flashgen
