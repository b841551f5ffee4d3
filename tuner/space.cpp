// Forward search space: the product of ForwardKnobs for one (dtype, head_dim, mask), split by
// KernelConfig::invalid_reason (fwd_traits.cuh) into configs worth compiling and counted prunes.
#include "space.hpp"

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
            ++report.total;
            if (auto why = c.invalid_reason(arch)) {
              ++report.pruned;
              ++report.pruned_by_reason[*why];
            } else {
              report.valid.push_back(c);
            }
          }
  return report;
}

}  // namespace flashgen
