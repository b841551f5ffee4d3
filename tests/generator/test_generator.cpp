// Generator output: golden files for the generated source, deterministic output, self-contained emit.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"

namespace {

std::string golden_path(const std::string& name) {
  return std::string(FLASHGEN_SOURCE_DIR) + "/tests/generator/golden/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Compares with the golden file; FLASHGEN_UPDATE_GOLDEN=1 rewrites it instead.
void check_golden(const std::string& name, const std::string& actual) {
  const std::string path = golden_path(name);
  if (const char* update = std::getenv("FLASHGEN_UPDATE_GOLDEN"); update != nullptr && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << actual;
  }
  INFO("golden file " << path << " (set FLASHGEN_UPDATE_GOLDEN=1 to regenerate after an intended change)");
  CHECK(read_file(path) == actual);
}

}  // namespace

TEST_CASE("generated sources match the golden files", "[generator]") {
  flashgen::KernelConfig c;
  c.dtype = flashgen::DType::kBFloat16;
  c.mask = flashgen::MaskKind::kCausal;
  const auto source = flashgen::generate(c);
  CHECK(source.kernel_name == c.name());
  REQUIRE(!source.headers.empty());
  CHECK(source.headers.front().name == "generated_config.cuh");
  check_golden(c.name() + ".cu", source.translation_unit);
  check_golden(c.name() + "_config.cuh", source.headers.front().contents);

  flashgen::KernelConfig d64;
  d64.head_dim = 64;
  d64.sm80()->q_in_regs = true;
  const auto source64 = flashgen::generate(d64);
  check_golden(d64.name() + "_config.cuh", source64.headers.front().contents);

  flashgen::KernelConfig hopper;  // the sm90 family: its own template, parameters and knobs
  hopper.block_n = 128;
  hopper.stages = 2;
  hopper.knobs.emplace<flashgen::Sm90Knobs>().overlap = true;
  const auto source90 = flashgen::generate(hopper);
  CHECK(source90.kernel_name == "fwd_sm90_fp16_d128_m128_n128_s2_ovl");
  check_golden(hopper.name() + ".cu", source90.translation_unit);
  check_golden(hopper.name() + "_config.cuh", source90.headers.front().contents);

  // A cluster of two is compiled into the kernel: a plain launch then forms the clusters.
  flashgen::KernelConfig clustered = hopper;
  clustered.sm90()->cluster = 2;
  clustered.sm90()->p_smem = true;
  const auto source_c2 = flashgen::generate(clustered);
  CHECK(source_c2.kernel_name == "fwd_sm90_fp16_d128_m128_n128_s2_ovl_psm_c2");
  check_golden(clustered.name() + ".cu", source_c2.translation_unit);
  CHECK(source90.translation_unit.find("__cluster_dims__") == std::string::npos);
}

TEST_CASE("a generated unit carries only the templates it includes", "[generator]") {
  auto names = [](const flashgen::GeneratedSource& source) {
    std::vector<std::string> out;
    for (const auto& h : source.headers) out.push_back(h.name);
    return out;
  };
  flashgen::KernelConfig sm80;
  flashgen::KernelConfig sm90 = sm80;
  sm90.knobs = flashgen::Sm90Knobs{};
  sm90.block_n = 128;
  const std::vector<std::string> sm80_headers = names(flashgen::generate(sm80));
  const std::vector<std::string> sm90_headers = names(flashgen::generate(sm90));
  auto has = [](const std::vector<std::string>& list, const char* name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  CHECK(has(sm80_headers, "fwd_sm80.cuh"));
  CHECK(has(sm80_headers, "sm80_primitives.cuh"));
  CHECK_FALSE(has(sm80_headers, "fwd_sm90.cuh"));
  CHECK_FALSE(has(sm80_headers, "sm90_wgmma.cuh"));
  CHECK_FALSE(has(sm80_headers, "bwd_sm80.cuh"));
  CHECK(has(sm90_headers, "fwd_sm90.cuh"));
  CHECK(has(sm90_headers, "sm90_wgmma.cuh"));
  CHECK(has(sm90_headers, "sm90_primitives.cuh"));
  CHECK(has(sm90_headers, "sm80_primitives.cuh"));  // its softmax helpers
  CHECK_FALSE(has(sm90_headers, "fwd_sm80.cuh"));
  // The Hopper forward's parts, and the device code every family shares.
  for (const char* part : {"fwd_sm90_layout.cuh", "fwd_sm90_scheduler.cuh", "fwd_sm90_producer.cuh",
                           "fwd_sm90_consumer.cuh", "fwd_sm90_epilogue.cuh"}) {
    INFO(part);
    CHECK(has(sm90_headers, part));
    CHECK_FALSE(has(sm80_headers, part));
  }
  for (const char* shared : {"variant.cuh", "block_range.cuh", "softmax.cuh"}) {
    INFO(shared);
    CHECK(has(sm80_headers, shared));
    CHECK(has(sm90_headers, shared));
  }
}

TEST_CASE("the config header names the variant policy of the mask", "[generator]") {
  auto config_header = [](const flashgen::GeneratedSource& source) { return source.headers.front().contents; };
  for (flashgen::KernelFamily family : {flashgen::KernelFamily::kSm80, flashgen::KernelFamily::kSm90}) {
    flashgen::KernelConfig c;
    if (family == flashgen::KernelFamily::kSm90) c.knobs = flashgen::Sm90Knobs{};
    c.block_n = family == flashgen::KernelFamily::kSm90 ? 128 : 32;
    c.stages = 2;
    INFO(c.name());
    CHECK(config_header(flashgen::generate(c)).find("  using Variant = flashgen::NoMask;\n") != std::string::npos);
    c.mask = flashgen::MaskKind::kCausal;
    CHECK(config_header(flashgen::generate(c)).find("  using Variant = flashgen::CausalMask;\n") != std::string::npos);
  }
  flashgen::BwdConfig b;
  b.mask = flashgen::MaskKind::kCausal;
  CHECK(config_header(flashgen::generate(b)).find("  using Variant = flashgen::CausalMask;\n") != std::string::npos);
  CHECK(config_header(flashgen::generate(b)).find("#include \"variant.cuh\"\n") != std::string::npos);
}

TEST_CASE("generation is deterministic and embeds the templates", "[generator]") {
  flashgen::KernelConfig c;
  const auto a = flashgen::generate(c);
  const auto b = flashgen::generate(c);
  CHECK(a.translation_unit == b.translation_unit);
  REQUIRE(a.headers.size() == b.headers.size());
  for (size_t i = 0; i < a.headers.size(); ++i) CHECK(a.headers[i].contents == b.headers[i].contents);

  bool has_template = false;
  for (const auto& h : a.headers) has_template |= h.name == "fwd_sm80.cuh" && h.contents == read_file(std::string(FLASHGEN_SOURCE_DIR) + "/templates/fwd_sm80.cuh");
  CHECK(has_template);
}

TEST_CASE("self-contained source inlines every project include once", "[generator]") {
  const auto source = flashgen::generate(flashgen::KernelConfig{});
  const std::string text = source.self_contained();
  CHECK(text.find("#include \"") == std::string::npos);
  CHECK(text.find("#pragma once") == std::string::npos);
  for (const char* name : {"fwd_traits.cuh", "attn_params.cuh", "sm80_primitives.cuh", "fwd_sm80.cuh"}) {
    const std::string marker = std::string("// ---- begin ") + name + " ----";
    const size_t first = text.find(marker);
    INFO(name);
    REQUIRE(first != std::string::npos);
    CHECK(text.find(marker, first + 1) == std::string::npos);
  }
  CHECK(text.find("fwd_sm80_fp16_d128_m128_n32_w4_s3(const __grid_constant__") != std::string::npos);
}

TEST_CASE("invalid configs are not generated", "[generator]") {
  flashgen::KernelConfig c;
  c.head_dim = 260;
  CHECK_THROWS_AS(flashgen::generate(c), flashgen::Error);
}
