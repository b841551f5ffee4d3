// The data sources' answers (tuner/choice.hpp) resolved as dispatch's planner resolves them, with the kernel
// registry's spill reports: its first step, and its paged step for a packed forward over pages.
#pragma once

#include "tuner/choice.hpp"

namespace flashgen::testing {

inline ForwardChoice resolved(const SourcesAnswer<ForwardChoice>& answer, int arch) {
  return resolve(answer, compiled_spills(arch), arch);
}

inline BackwardChoice resolved(const SourcesAnswer<BackwardChoice>& answer, int arch) {
  return resolve(answer, compiled_backward_spills(arch), arch);
}

inline ForwardChoice resolved_paged(const SourcesAnswer<ForwardChoice>& answer, int arch) {
  return read_through_pages(resolved(answer, arch), arch, compiled_spills(arch));
}

}  // namespace flashgen::testing
