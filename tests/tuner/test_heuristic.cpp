// Built-in configs: valid for every supported problem, and every default candidate compiles with NVRTC
// for sm_80 and sm_90a without spills.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <unistd.h>

#include "catch.hpp"
#include "generator.hpp"
#include "heuristic.hpp"
#include "kernel_registry.hpp"
#include "nvrtc_compiler.hpp"

using flashgen::DType;
using flashgen::MaskKind;

TEST_CASE("heuristic config is valid for every head_dim, dtype, mask and arch", "[tuner][heuristic]") {
  for (int arch : {80, 86, 89, 90})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
        for (int d = 8; d <= 256; d += 8) {
          const auto c = flashgen::heuristic_forward_config(dtype, d, mask, arch);
          INFO("sm_" << arch << " " << c.name());
          CHECK(c.head_dim == d);
          CHECK(c.dtype == dtype);
          CHECK(c.mask == mask);
          CHECK_FALSE(c.invalid_reason(arch).has_value());
        }
}

TEST_CASE("every default candidate compiles for sm_80 and sm_90a with zero spills", "[tuner][heuristic][nvrtc]") {
  auto& registry = flashgen::KernelRegistry::instance();
  for (int arch : {80, 90}) {
    const auto candidates = flashgen::default_forward_candidates(arch);
    CHECK(candidates.size() >= 24);
    for (const auto& c : candidates) {
      INFO("sm_" << arch << " " << c.name());
      const auto compiled = registry.compiled(c, arch);
      CHECK(compiled->cubin.size() > 0);
      CHECK(compiled->usage.registers > 0);
      CHECK(compiled->usage.registers <= 255);
      CHECK(compiled->usage.spill_store_bytes == 0);
      CHECK(compiled->usage.spill_load_bytes == 0);
      CHECK(compiled->usage.stack_bytes == 0);
    }
  }
}

TEST_CASE("emitted source compiles unchanged with nvcc for sm_90a", "[generator][emit]") {
  flashgen::KernelConfig c;
  c.dtype = DType::kBFloat16;
  c.mask = MaskKind::kCausal;
  const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  const std::string cu = dir + "/flashgen_emit_test_" + std::to_string(::getpid()) + ".cu";
  std::ofstream(cu) << flashgen::generate(c).self_contained();
  const std::string command = std::string(FLASHGEN_NVCC_PATH) +
                              " -gencode=arch=compute_90a,code=sm_90a -c " + cu + " -o " + cu + ".o 2>&1";
  const int status = std::system(command.c_str());
  CHECK(status == 0);
  std::remove(cu.c_str());
  std::remove((cu + ".o").c_str());
}
