// flashgen_attention_options for C ABI tests: this library's size, a mask and the backward's dQ strategy, every
// other option off.
#pragma once

#include "flashgen/flashgen.h"

namespace flashgen::test {

inline flashgen_attention_options mask_options(flashgen_mask mask, bool deterministic = false) {
  flashgen_attention_options options{};
  options.mask = mask;
  options.deterministic = deterministic ? 1 : 0;
  return options;
}

}  // namespace flashgen::test
