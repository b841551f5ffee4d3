// Run-time config choice: for every head_dim, dtype and mask, the chosen forward kernel compiles for
// sm_80 and sm_90a without spills (the heuristic's first choice is passed over when ptxas says it spills).
#include "catch.hpp"
#include "heuristic.hpp"
#include "kernel_registry.hpp"
#include "select.hpp"

using flashgen::DType;
using flashgen::MaskKind;

TEST_CASE("the chosen forward config never spills, for every head_dim", "[tuner][select][nvrtc]") {
  auto& registry = flashgen::KernelRegistry::instance();
  for (int arch : {80, 90})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
        for (int d = 8; d <= 256; d += 8) {
          const flashgen::ForwardChoice choice = flashgen::choose_forward_config(dtype, d, mask, arch);
          INFO("sm_" << arch << " " << choice.config.name() << ": " << choice.reason);
          CHECK(choice.config.head_dim == d);
          CHECK(choice.config.dtype == dtype);
          CHECK(choice.config.mask == mask);
          CHECK_FALSE(choice.config.invalid_reason(arch).has_value());
          const auto usage = registry.compiled(choice.config, arch)->usage;
          CHECK(usage.spill_store_bytes + usage.spill_load_bytes == 0);
          CHECK(choice.reason.rfind("built-in heuristic", 0) == 0);
          // Memoized: the same answer again.
          CHECK(flashgen::choose_forward_config(dtype, d, mask, arch).config == choice.config);
        }
}
