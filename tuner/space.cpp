// Forward search space: the product of ForwardKnobs for one (dtype, head_dim, mask), split by
// KernelConfig::invalid_reason (fwd_traits.cuh) into configs worth compiling and counted prunes.
#include "space.hpp"

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
              for (bool persistent : knobs.sm90_persistent) {
                h.block_m = block_m;
                h.block_n = block_n;
                h.stages = stages;
                h.overlap = overlap;
                h.pingpong = pingpong;
                h.persistent = persistent;
                report.add(h, arch);
              }
  }
  return report;
}

void SpaceReport::add(const KernelConfig& config, int arch) {
  ++total;
  if (auto why = config.invalid_reason(arch)) {
    ++pruned;
    ++pruned_by_reason[*why];
  } else {
    valid.push_back(config);
  }
}

namespace {

// Knobs in which a and b differ; configs of different families are never neighbours.
int knob_differences(const KernelConfig& a, const KernelConfig& b) {
  if (a.family != b.family) return 100;
  const int shared = (a.block_m != b.block_m) + (a.block_n != b.block_n) + (a.stages != b.stages);
  if (a.family == KernelFamily::kSm90) {
    return shared + (a.overlap != b.overlap) + (a.pingpong != b.pingpong) + (a.persistent != b.persistent);
  }
  return shared + (a.warps != b.warps) + (a.q_in_regs != b.q_in_regs);
}

}  // namespace

std::vector<KernelConfig> capped_candidates(const SpaceReport& space, const KernelConfig& builtin, size_t max_count) {
  std::vector<KernelConfig> picked;
  if (max_count == 0) return picked;
  picked.push_back(builtin);
  auto taken = [&](const KernelConfig& c) { return std::find(picked.begin(), picked.end(), c) != picked.end(); };
  for (const KernelConfig& c : space.valid) {
    if (picked.size() >= max_count) return picked;
    if (knob_differences(c, builtin) == 1 && !taken(c)) picked.push_back(c);
  }
  std::vector<KernelConfig> rest;
  for (const KernelConfig& c : space.valid)
    if (!taken(c)) rest.push_back(c);
  const size_t room = max_count - picked.size();
  const size_t count = std::min(room, rest.size());
  for (size_t j = 0; j < count; ++j) picked.push_back(rest[count >= rest.size() ? j : j * rest.size() / count]);
  return picked;
}

}  // namespace flashgen
