// Search spaces: the product of ForwardKnobs for one (dtype, head_dim, mask), or of BackwardKnobs for one
// (dtype, head_dim, mask, dQ strategy), split by the config's invalid_reason (the traits in
// templates/) into configs worth compiling and counted prunes.
#include "tuner/space.hpp"

#include <algorithm>

namespace flashgen {

SpaceReport forward_space(DType dtype, int head_dim, MaskKind mask, int arch, const ForwardKnobs& knobs) {
  SpaceReport report;
  KernelConfig c;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.mask = mask;
  // Fixed nesting (block_m outermost, q_in_regs innermost) so the valid list, and every sweep that walks
  // it, comes out in the same order on every run.
  for (int block_m : knobs.block_m)
    for (int block_n : knobs.block_n)
      for (int warps : knobs.warps)
        for (int stages : knobs.stages)
          for (bool q_in_regs : knobs.q_in_regs) {
            c.block_m = block_m;
            c.block_n = block_n;
            c.warps = warps;
            c.stages = stages;
            c.q_in_regs = q_in_regs;
            report.add(c, arch);
          }
  if (arch == 90) {
    KernelConfig h = c;
    h.family = KernelFamily::kSm90;
    h.warps = KernelConfig{}.warps;
    h.q_in_regs = false;
    for (int block_m : knobs.sm90_block_m)
      for (int block_n : knobs.sm90_block_n)
        for (int stages : knobs.sm90_stages)
          for (bool overlap : knobs.sm90_overlap)
            for (bool pingpong : knobs.sm90_pingpong)
              for (bool persistent : knobs.sm90_persistent)
                for (bool p_smem : knobs.sm90_p_smem)
                  for (int cluster : knobs.sm90_cluster)
                    for (int groups : knobs.sm90_groups)
                      for (bool tensor_sum : knobs.sm90_tensor_sum) {
                        h.block_m = block_m;
                        h.block_n = block_n;
                        h.stages = stages;
                        h.overlap = overlap;
                        h.pingpong = pingpong;
                        h.persistent = persistent;
                        h.p_smem = p_smem;
                        h.cluster = cluster;
                        h.groups = groups;
                        h.tensor_sum = tensor_sum;
                        report.add(h, arch);
                      }
  }
  return report;
}

namespace {

// Knobs in which a and b differ; configs of different families are never neighbours.
int knob_differences(const KernelConfig& a, const KernelConfig& b) {
  if (a.family != b.family) return 100;
  const int shared = (a.block_m != b.block_m) + (a.block_n != b.block_n) + (a.stages != b.stages);
  if (a.family == KernelFamily::kSm90) {
    return shared + (a.overlap != b.overlap) + (a.pingpong != b.pingpong) + (a.persistent != b.persistent) +
           (a.p_smem != b.p_smem) + (a.cluster != b.cluster) + (a.groups != b.groups) +
           (a.tensor_sum != b.tensor_sum);
  }
  return shared + (a.warps != b.warps) + (a.q_in_regs != b.q_in_regs);
}

// Knobs in which two backward configs differ; configs of different families are never neighbours.
int knob_differences(const BwdConfig& a, const BwdConfig& b) {
  if (a.family != b.family) return 100;
  int d = (a.block_m != b.block_m) + (a.block_n != b.block_n) + (a.stages != b.stages);
  if (a.family == KernelFamily::kSm80) d += (a.warps != b.warps) + (a.d_split != b.d_split);
  if (a.deterministic) {
    d += (a.dq_block_m != b.dq_block_m) + (a.dq_block_n != b.dq_block_n) + (a.dq_warps != b.dq_warps) +
         (a.dq_stages != b.dq_stages);
  }
  return d;
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

BackwardSpaceReport backward_space(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                   const BackwardKnobs& knobs) {
  BackwardSpaceReport report;
  BwdConfig c;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.mask = mask;
  c.deterministic = deterministic;
  // The deterministic strategy's dq tiles multiply each dkdv config; the atomic one has none.
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
    for (const DqTile& t : dq_tiles) {
      config.dq_block_m = t.block_m, config.dq_block_n = t.block_n, config.dq_warps = t.warps;
      report.add(config, arch);
    }
  };
  // Fixed nesting, as in forward_space, so every sweep walks the list in the same order.
  for (int block_m : knobs.block_m)
    for (int block_n : knobs.block_n)
      for (int warps : knobs.warps)
        for (int stages : knobs.stages)
          for (int d_split : knobs.d_split) {
            c.block_m = block_m, c.block_n = block_n, c.warps = warps, c.stages = stages, c.d_split = d_split;
            add_with_dq(c);
          }
  if (arch == 90) {
    BwdConfig h = c;
    h.family = KernelFamily::kSm90;
    h.warps = BwdConfig{}.warps;
    h.d_split = 1;
    for (int block_m : knobs.sm90_block_m)
      for (int block_n : knobs.sm90_block_n)
        for (int stages : knobs.sm90_stages) {
          h.block_m = block_m, h.block_n = block_n, h.stages = stages;
          add_with_dq(h);
        }
  }
  return report;
}

}  // namespace flashgen
