// Search spaces: the product of ForwardKnobs for one (dtype, head_dim, mask), or of BackwardKnobs for one
// (dtype, head_dim, mask, dQ strategy), split by the config's invalid_reason (the traits in
// templates/) into configs worth compiling and counted prunes.
#include "tuner/space.hpp"

#include <algorithm>

#include "tuner/decode_choice.hpp"

namespace flashgen {

SpaceReport forward_space(DType dtype, int head_dim, MaskKind mask, int arch, const ForwardKnobs& knobs,
                          int head_dim_v) {
  SpaceReport report;
  KernelConfig c;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.head_dim_v = head_dim_v != head_dim ? head_dim_v : 0;
  c.mask = mask;
  // FP8 tiles are timed writing bf16 and serve fp16 alike (the planner gives a call's config its output type).
  if (is_fp8(dtype)) c.out_dtype = DType::kBFloat16;
  // Each family's own product, in a fixed nesting (block_m outermost, its last knob innermost) so the
  // valid list, and every sweep that walks it, comes out in the same order on every run.
  for (int block_m : knobs.block_m)
    for (int block_n : knobs.block_n)
      for (int warps : knobs.warps)
        for (int stages : knobs.stages)
          for (bool q_in_regs : knobs.q_in_regs) {
            c.block_m = block_m;
            c.block_n = block_n;
            c.stages = stages;
            c.knobs = Sm80Knobs{warps, q_in_regs};
            report.add(c, arch);
          }
  if (arch == 90) {
    Sm90Knobs sm90;
    sm90.value_split = sm90_tile_dim(c.value_dim()) > 256 ? 2 : 1;
    std::vector<int> block_ns = knobs.sm90_block_n;
    if (sm90_tile_dim(std::max(head_dim, c.value_dim())) > 256) {
      block_ns.insert(block_ns.begin(), knobs.sm90_split_block_n.begin(), knobs.sm90_split_block_n.end());
    }
    for (int block_m : knobs.sm90_block_m)
      for (int block_n : block_ns)
        for (int stages : knobs.sm90_stages)
          for (bool overlap : knobs.sm90_overlap)
            for (bool pingpong : knobs.sm90_pingpong)
              for (bool persistent : knobs.sm90_persistent)
                for (bool p_smem : knobs.sm90_p_smem)
                  for (int cluster : knobs.sm90_cluster)
                    for (int groups : knobs.sm90_groups)
                      for (bool tensor_sum : knobs.sm90_tensor_sum) {
                        c.block_m = block_m;
                        c.block_n = block_n;
                        c.stages = stages;
                        sm90.overlap = overlap;
                        sm90.pingpong = pingpong;
                        sm90.persistent = persistent;
                        sm90.p_smem = p_smem;
                        sm90.cluster = cluster;
                        sm90.groups = groups;
                        sm90.tensor_sum = tensor_sum;
                        c.knobs = sm90;
                        report.add(c, arch);
                      }
  }
  return report;
}

namespace {

// Knobs in which a and b differ; configs of different families are never neighbours.
int knob_differences(const KernelConfig& a, const KernelConfig& b) {
  if (a.family() != b.family()) return 100;
  const int shared = (a.block_m != b.block_m) + (a.block_n != b.block_n) + (a.stages != b.stages);
  if (const Sm90Knobs* x = a.sm90()) {
    const Sm90Knobs& y = *b.sm90();
    return shared + (x->overlap != y.overlap) + (x->pingpong != y.pingpong) + (x->persistent != y.persistent) +
           (x->p_smem != y.p_smem) + (x->cluster != y.cluster) + (x->groups != y.groups) +
           (x->tensor_sum != y.tensor_sum) + (x->value_split != y.value_split);
  }
  const Sm80Knobs& x = *a.sm80();
  const Sm80Knobs& y = *b.sm80();
  return shared + (x.warps != y.warps) + (x.q_in_regs != y.q_in_regs);
}

// Knobs in which two backward configs differ; configs of different families are never neighbours.
int knob_differences(const BwdConfig& a, const BwdConfig& b) {
  if (a.family() != b.family()) return 100;
  int d = (a.block_m != b.block_m) + (a.block_n != b.block_n) + (a.stages != b.stages);
  if (const BwdSm80Knobs* x = a.sm80()) d += (x->warps != b.sm80()->warps) + (x->d_split != b.sm80()->d_split);
  if (a.has_dq_kernel()) {
    d += (a.dq_block_m != b.dq_block_m) + (a.dq_block_n != b.dq_block_n) + (a.dq_warps != b.dq_warps) +
         (a.dq_stages != b.dq_stages);
  }
  return d;
}

// Knobs in which two decode choices differ (the module's and the split count).
int knob_differences(const DecodeSplitConfig& a, const DecodeSplitConfig& b) {
  const DecodeConfig &x = a.config, &y = b.config;
  return (x.rows != y.rows) + (x.block_n != y.block_n) + (x.warps != y.warps) + (x.stages != y.stages) +
         (a.splits != b.splits);
}

// The built-in choice, then its one-knob neighbours, then configs spread evenly over the rest.
template <class Config>
std::vector<Config> capped(const BasicSpaceReport<Config>& space, const Config& builtin, size_t max_count) {
  std::vector<Config> picked;
  if (max_count == 0) return picked;
  picked.push_back(builtin);
  auto taken = [&](const Config& c) { return std::find(picked.begin(), picked.end(), c) != picked.end(); };
  for (const Config& c : space.valid) {
    if (picked.size() >= max_count) return picked;
    if (knob_differences(c, builtin) == 1 && !taken(c)) picked.push_back(c);
  }
  std::vector<Config> rest;
  for (const Config& c : space.valid)
    if (!taken(c)) rest.push_back(c);
  const size_t room = max_count - picked.size();
  const size_t count = std::min(room, rest.size());
  for (size_t j = 0; j < count; ++j) picked.push_back(rest[count >= rest.size() ? j : j * rest.size() / count]);
  return picked;
}

}  // namespace

std::vector<KernelConfig> capped_candidates(const SpaceReport& space, const KernelConfig& builtin, size_t max_count) {
  return capped(space, builtin, max_count);
}

std::vector<BwdConfig> capped_candidates(const BackwardSpaceReport& space, const BwdConfig& builtin,
                                         size_t max_count) {
  return capped(space, builtin, max_count);
}

namespace {

// A space's valid configs changed by change and checked again, the space's prunes kept in the counts.
template <class Config, class Change>
BasicSpaceReport<Config> changed(const BasicSpaceReport<Config>& space, int arch, Change change) {
  BasicSpaceReport<Config> report;
  report.total = space.total - static_cast<int>(space.valid.size());
  report.pruned = space.pruned;
  report.pruned_by_reason = space.pruned_by_reason;
  for (Config c : space.valid) {
    change(c);
    report.add(c, arch);
  }
  return report;
}

template <class Config>
BasicSpaceReport<Config> packed(const BasicSpaceReport<Config>& dense, int arch) {
  return changed(dense, arch, [](Config& c) { c.varlen = true; });
}

}  // namespace

SpaceReport packed_space(const SpaceReport& dense, int arch) { return packed(dense, arch); }

BackwardSpaceReport packed_space(const BackwardSpaceReport& dense, int arch) { return packed(dense, arch); }

SpaceReport paged_space(const SpaceReport& packed, int arch) {
  return changed(packed, arch, [](KernelConfig& c) { c.paged = true; });
}

std::vector<DecodeSplitConfig> capped_candidates(const DecodeSpaceReport& space, const DecodeSplitConfig& builtin,
                                                 size_t max_count) {
  return capped(space, builtin, max_count);
}

DecodeSpaceReport decode_space(const AttentionProblem& problem, int arch, int multiprocessors,
                               const DecodeKnobs& knobs) {
  DecodeSpaceReport report;
  // A module with each of its split counts (one entry, refused, where it cannot run on sm_<arch>).
  auto add_with_splits = [&](DecodeSplitConfig c) {
    if (c.config.invalid_reason(arch)) {
      c.splits = 1;
      report.add(c, arch);
      return;
    }
    for (int splits : decode_split_counts(problem, c.config, arch, multiprocessors)) {
      c.splits = splits;
      report.add(c, arch);
    }
  };
  DecodeSplitConfig c;
  const bool latent = problem.value_dim() != problem.head_dim();  // the latent kernel: its stages alone
  if (latent) c.config = latent_decode_config(problem.dtype, problem.head_dim(), problem.value_dim());
  c.config.dtype = problem.dtype;
  c.config.head_dim = problem.head_dim();
  c.config.mask = problem.mask_kind();
  c.config.mods = problem.score_mods();
  c.config.paged = problem.paged;
  c.config.cache_dtype = problem.cache_dtype;
  if (latent) {
    for (int stages : knobs.stages) {
      c.config.stages = stages;
      add_with_splits(c);
    }
    return report;
  }
  for (int rows : knobs.rows)
    for (int block_n : knobs.block_n)
      for (int warps : knobs.warps)
        for (int stages : knobs.stages) {
          c.config.rows = rows, c.config.block_n = block_n, c.config.warps = warps, c.config.stages = stages;
          add_with_splits(c);
        }
  return report;
}

BackwardSpaceReport backward_space(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                   const BackwardKnobs& knobs, int head_dim_v) {
  BackwardSpaceReport report;
  BwdConfig c;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.head_dim_v = head_dim_v != head_dim ? head_dim_v : 0;
  c.mask = mask;
  c.deterministic = deterministic;
  // The sm80 family's deterministic strategy: its dq tiles multiply each dkdv config; the atomic strategy
  // and the sm90 family have no dq kernel.
  struct DqTile {
    int block_m, block_n, warps;
  };
  std::vector<DqTile> dq_tiles{{c.dq_block_m, c.dq_block_n, c.dq_warps}};
  if (deterministic) {
    dq_tiles.clear();
    for (int m : knobs.dq_block_m)
      for (int n : knobs.dq_block_n)
        for (int w : knobs.dq_warps) dq_tiles.push_back({m, n, w});
  }
  auto add_with_dq = [&](BwdConfig config) {
    if (!config.has_dq_kernel()) {
      report.add(config, arch);
      return;
    }
    for (const DqTile& t : dq_tiles) {
      config.dq_block_m = t.block_m, config.dq_block_n = t.block_n, config.dq_warps = t.warps;
      report.add(config, arch);
    }
  };
  // Each family's own product in a fixed nesting, as in forward_space, so every sweep walks the list in
  // the same order.
  for (int block_m : knobs.block_m)
    for (int block_n : knobs.block_n)
      for (int warps : knobs.warps)
        for (int stages : knobs.stages)
          for (int d_split : knobs.d_split) {
            c.block_m = block_m, c.block_n = block_n, c.stages = stages;
            c.knobs = BwdSm80Knobs{warps, d_split};
            add_with_dq(c);
          }
  if (arch == 90) {
    c.knobs = BwdSm90Knobs{};  // the family has no knobs of its own
    for (int block_m : knobs.sm90_block_m)
      for (int block_n : knobs.sm90_block_n)
        for (int stages : knobs.sm90_stages) {
          c.block_m = block_m, c.block_n = block_n, c.stages = stages;
          add_with_dq(c);
        }
  }
  return report;
}

}  // namespace flashgen
