// Search space of a kernel family: the product of its tunable knobs, pruned by the shared validity
// function before anything is compiled. Pruned configs are counted by reason and never compiled.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "generator/bwd_config.hpp"
#include "generator/kernel_config.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen {

// Values each forward knob ranges over: the sm80 family's, then the sm90 family's (enumerated on sm_90
// only, where that family runs).
struct ForwardKnobs {
  std::vector<int> block_m{64, 128, 256};
  std::vector<int> block_n{16, 32, 48, 64, 96, 128};
  std::vector<int> warps{2, 4, 8};
  std::vector<int> stages{2, 3, 4};
  std::vector<bool> q_in_regs{false, true};

  std::vector<int> sm90_block_m{64, 128, 192, 256};  // 1 to 4 consumer warpgroups
  std::vector<int> sm90_block_n{64, 80, 96, 112, 128, 144, 160, 176, 192};
  std::vector<int> sm90_stages{2, 3, 4};
  std::vector<bool> sm90_overlap{false, true};
  std::vector<bool> sm90_pingpong{false, true};
  std::vector<bool> sm90_persistent{false, true};
  std::vector<bool> sm90_p_smem{false, true};
  std::vector<int> sm90_cluster{1, 2};  // 2: unmasked problems only
  std::vector<int> sm90_groups{1, 2};   // 2: persistent, at most four consumer warpgroups in all
  std::vector<bool> sm90_tensor_sum{false, true};  // true: fp16 only
  // Values wider than one consumer's registers (above 256) take value_split 2 (the only split of the space, and
  // only there); K or V tiles of over 256 columns leave room for fewer keys, so block_n also ranges over these there.
  std::vector<int> sm90_split_block_n{32, 48};
};

// Values each backward knob ranges over. sm80 family: the dkdv kernel's tiles, warps, stages and
// head_dim slices, and for the deterministic strategy the dq kernel's tiles. sm90 family (on sm_90 only):
// the dkdv kernel's query block, key block (64 per consumer warpgroup) and stages, and the same dq tiles.
struct BackwardKnobs {
  std::vector<int> block_m{16, 32, 64, 128};
  std::vector<int> block_n{32, 64, 128};
  std::vector<int> warps{2, 4, 8};
  std::vector<int> stages{2, 3};
  std::vector<int> d_split{1, 2, 4};
  std::vector<int> dq_block_m{32, 64, 128};
  std::vector<int> dq_block_n{16, 32, 64};
  std::vector<int> dq_warps{2, 4};

  std::vector<int> sm90_block_m{64, 128};
  std::vector<int> sm90_block_n{64, 128};
  std::vector<int> sm90_stages{1, 2, 3};  // 1: head_dim above 128 only (tiles of 192 and 256 columns)
};

// Values each decode (KV-cache) knob ranges over; the split counts come from the problem's sizes
// (decode_split_counts).
struct DecodeKnobs {
  std::vector<int> rows{16, 32, 64};
  std::vector<int> block_n{32, 64, 128};
  std::vector<int> warps{1, 2, 4, 8};
  std::vector<int> stages{2, 3, 4, 6, 8};
};

template <class Config>
struct BasicSpaceReport {
  std::vector<Config> valid;                   // in a fixed, deterministic order
  int total = 0;                               // size of the full product
  int pruned = 0;                              // total - valid.size()
  std::map<std::string, int> pruned_by_reason; // invalid_reason text -> count

  void add(const Config& config, int arch) {   // counts config, valid or pruned on sm_<arch>
    ++total;
    if (auto why = config.invalid_reason(arch)) {
      ++pruned;
      ++pruned_by_reason[*why];
    } else {
      valid.push_back(config);
    }
  }
};
using SpaceReport = BasicSpaceReport<KernelConfig>;
using BackwardSpaceReport = BasicSpaceReport<BwdConfig>;
using DecodeSpaceReport = BasicSpaceReport<DecodeSplitConfig>;

// Every forward config for (dtype, head_dim, mask) over knobs, split into valid-on-sm_<arch> and
// pruned (with reasons): the sm80 family's product, then on sm_90 the sm90 family's. With head_dim_v (> 0, not
// head_dim), the configs whose values have that head dim. Compiles nothing.
SpaceReport forward_space(DType dtype, int head_dim, MaskKind mask, int arch, const ForwardKnobs& knobs = {},
                          int head_dim_v = 0);

// At most max_count candidates of a space for a capped sweep: the built-in choice, then its neighbours
// (valid configs of its family that differ from it in one knob; measured, the best config is usually one or two knob
// steps from it), then configs spread evenly over the rest of the valid list. Deterministic; every
// config is from space.valid except the built-in, which is always first.
std::vector<KernelConfig> capped_candidates(const SpaceReport& space, const KernelConfig& builtin, size_t max_count);

// Every backward config for (dtype, head_dim, mask, dQ strategy) over knobs, as forward_space does (head_dim_v too).
BackwardSpaceReport backward_space(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                   const BackwardKnobs& knobs = {}, int head_dim_v = 0);
std::vector<BwdConfig> capped_candidates(const BackwardSpaceReport& space, const BwdConfig& builtin,
                                         size_t max_count);

// A space's configs as packed-batch (varlen) kernels: each valid one with varlen set and checked again (the
// sm90 forward's packed kernels take one block per tile: no persistence, clusters or groups; the backward's
// are the sm80 family's), the dense space's prunes kept in the counts.
SpaceReport packed_space(const SpaceReport& dense, int arch);
BackwardSpaceReport packed_space(const BackwardSpaceReport& dense, int arch);
// A packed forward space's configs reading keys and values through a block table (paged), checked again: the sm90
// family's paged producer keeps more registers, which leaves the widest tiles' consumers too few.
SpaceReport paged_space(const SpaceReport& packed, int arch);

// Every decode module of a KV-cache problem's class over knobs, each valid one with every split count
// decode_split_counts gives it at the problem's sizes on a GPU of `multiprocessors` SMs (an invalid module is
// counted once). Compiles nothing.
DecodeSpaceReport decode_space(const AttentionProblem& problem, int arch, int multiprocessors,
                               const DecodeKnobs& knobs = {});
// As for the forward: the built-in choice, then the configs one knob away (the split count is a knob), then
// the rest spread evenly.
std::vector<DecodeSplitConfig> capped_candidates(const DecodeSpaceReport& space, const DecodeSplitConfig& builtin,
                                                 size_t max_count);

}  // namespace flashgen
