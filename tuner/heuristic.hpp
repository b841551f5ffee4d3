// Built-in config choice for the forward pass: valid for every problem, used when no tuning data
// exists, and the default candidate list that the main job and tests compile.
#pragma once

#include <string>
#include <vector>

#include "generator/bwd_config.hpp"
#include "generator/kernel_config.hpp"

namespace flashgen {

// Configs for (dtype, head_dim, mask) on sm_<arch> without tuning data, best first; every one is valid
// for arch (invalid_reason is empty) and the list is never empty for a supported head_dim. On sm_90 the
// sm90 family comes first where it applies, then the sm80 family (for problems TMA cannot describe). With
// varlen, the packed-batch kernels: one block per tile (no persistence, clusters or groups). With head_dim_v
// (> 0, not head_dim), the configs whose values have that head dim: the families that take one.
std::vector<KernelConfig> heuristic_forward_configs(DType dtype, int head_dim, MaskKind mask, int arch,
                                                    bool varlen = false, int head_dim_v = 0);

// The first of heuristic_forward_configs: what the runtime runs unless ptxas reports that it spills
// (see select.hpp).
KernelConfig heuristic_forward_config(DType dtype, int head_dim, MaskKind mask, int arch);

// Default candidates for an arch: the heuristic choices (the first of each kernel family) for head_dim
// 32..256 (the standard ones), both dtypes, both masks, plus the tile variants a tuner would try first.
// Every one is valid for arch.
std::vector<KernelConfig> default_forward_candidates(int arch);

// Backward configs for (dtype, head_dim, mask, strategy) on sm_<arch> without tuning data, best first;
// every one is valid for arch and the list is never empty for a supported head_dim. The run-time choice
// (heuristic_backward_choice in select.hpp) takes the first that compiles without spills. head_dim_v: the values'
// head dim where it differs (0: head_dim); the tiles are chosen by the wider of the two.
std::vector<BwdConfig> heuristic_backward_configs(DType dtype, int head_dim, MaskKind mask, bool deterministic,
                                                  int arch, int head_dim_v = 0);
BwdConfig heuristic_backward_config(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                    int head_dim_v = 0);

}  // namespace flashgen
