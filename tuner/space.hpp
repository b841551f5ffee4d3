// Search space of a kernel family: the product of its tunable knobs, pruned by the shared validity
// function before anything is compiled. Pruned configs are counted by reason and never compiled.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kernel_config.hpp"

namespace flashgen {

// Values each forward knob ranges over: the sm80 family's, then the sm90 family's (enumerated on sm_90
// only, where that family runs).
struct ForwardKnobs {
  std::vector<int> block_m{64, 128, 256};
  std::vector<int> block_n{16, 32, 48, 64, 96, 128};
  std::vector<int> warps{2, 4, 8};
  std::vector<int> stages{2, 3, 4};
  std::vector<bool> q_in_regs{false, true};

  std::vector<int> sm90_block_m{64, 128, 192};  // 1, 2 or 3 consumer warpgroups
  std::vector<int> sm90_block_n{64, 80, 96, 112, 128, 144, 160, 176, 192};
  std::vector<int> sm90_stages{2, 3, 4};
  std::vector<bool> sm90_overlap{false, true};
  std::vector<bool> sm90_pingpong{false, true};
  std::vector<bool> sm90_persistent{false, true};
};

struct SpaceReport {
  std::vector<KernelConfig> valid;             // in a fixed, deterministic order
  int total = 0;                               // size of the full product
  int pruned = 0;                              // total - valid.size()
  std::map<std::string, int> pruned_by_reason; // invalid_reason text -> count

  void add(const KernelConfig& config, int arch);  // counts config, valid or pruned on sm_<arch>
};

// Every forward config for (dtype, head_dim, mask) over knobs, split into valid-on-sm_<arch> and
// pruned (with reasons): the sm80 family's product, then on sm_90 the sm90 family's. Compiles nothing.
SpaceReport forward_space(DType dtype, int head_dim, MaskKind mask, int arch, const ForwardKnobs& knobs = {});

// At most max_count candidates of a space for a capped sweep: the built-in choice, then its neighbours
// (valid configs of its family that differ from it in one knob; measured, the best config is usually one or two knob
// steps from it), then configs spread evenly over the rest of the valid list. Deterministic; every
// config is from space.valid except the built-in, which is always first.
std::vector<KernelConfig> capped_candidates(const SpaceReport& space, const KernelConfig& builtin, size_t max_count);

}  // namespace flashgen
