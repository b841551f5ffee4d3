// Tests for DecodeConfig: canonical names and their inverse, JSON round-trip, the shared validity rules, and
// the generated module (config header and its three kernels' entry points); the heuristic choice of config
// and split count.
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/decode_config.hpp"
#include "generator/generator.hpp"
#include "runtime/kernel_registry.hpp"
#include "tuner/decode_choice.hpp"

using flashgen::DecodeConfig;
using flashgen::DecodeKernel;

TEST_CASE("decode config names are canonical and parse back", "[generator][decode]") {
  DecodeConfig c;
  c.dtype = flashgen::DType::kBFloat16;
  c.mask = flashgen::MaskKind::kCausal;
  c.paged = true;
  CHECK(c.name() == "dec_sm80_bf16_d128_r16_n64_w4_s4_causal_paged");
  CHECK(DecodeConfig::from_name(c.name()) == c);
  CHECK(c.symbol(DecodeKernel::kCombine) == c.name() + "_combine");
  CHECK(DecodeConfig::from_name("dec_sm80_fp16_d64_r32_n128_w4_s3").rows == 32);
  CHECK_THROWS_WITH(DecodeConfig::from_name("dec_sm80_fp16_d64_r32_n128_w4_s3_paged_paged"),
                    Catch::Matchers::Contains("unknown suffix 'paged'"));
  CHECK_THROWS_WITH(DecodeConfig::from_name("dec_sm80_fp16_d064_r32_n128_w4_s3"),
                    Catch::Matchers::Contains("not canonical"));
  CHECK_THROWS_WITH(DecodeConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2"), Catch::Matchers::Contains("expected dec_sm80"));

  nlohmann::json j = c;
  CHECK(j.get<DecodeConfig>() == c);
  j["stages"] = "four";
  CHECK_THROWS_WITH(j.get<DecodeConfig>(), Catch::Matchers::Contains("'stages' must be an integer"));
  CHECK_THROWS_WITH(nlohmann::json({{"stage", 2}}).get<DecodeConfig>(), Catch::Matchers::Contains("unknown field \"stage\""));
}

TEST_CASE("decode configs are validated by the rules the kernels assert", "[generator][decode]") {
  DecodeConfig c;
  CHECK_FALSE(c.invalid_reason(90));
  CHECK(c.invalid_reason(75));
  c.rows = 48;
  CHECK(c.invalid_reason(90).value().find("rows must be 16, 32 or 64") != std::string::npos);
  c.rows = 64;  // (64 rows x 128 columns) of fp32 output do not fit a thread's registers
  CHECK(c.invalid_reason(90).value().find("registers") != std::string::npos);
  c.rows = 16, c.block_n = 48;
  CHECK(c.invalid_reason(90).value().find("multiple of 16 * warps") != std::string::npos);
  c.block_n = 64, c.stages = 8, c.head_dim = 256;  // 8 x 67.6 KB of K and V tiles
  CHECK(c.invalid_reason(90).value().find("shared memory") != std::string::npos);
  c.head_dim = 100;
  CHECK_THROWS_WITH(flashgen::generate(c), Catch::Matchers::Contains("head_dim must be a multiple of 8"));
}

TEST_CASE("the decode family takes no sliding window", "[generator][decode]") {
  DecodeConfig c;
  c.mask = flashgen::MaskKind::kWindow;
  CHECK(c.name() == "dec_sm80_fp16_d128_r16_n64_w4_s4_window");
  CHECK(DecodeConfig::from_name(c.name()) == c);
  CHECK(c.invalid_reason(90).value_or("") == "the decode kernels take no sliding window yet");
  CHECK(nlohmann::json({{"mask", "window"}}).get<DecodeConfig>().invalid_reason(90).has_value());
}

TEST_CASE("a decode module instantiates its three kernels over the template", "[generator][decode]") {
  DecodeConfig c;
  c.paged = true;
  const flashgen::GeneratedSource source = flashgen::generate(c);
  CHECK(source.kernel_name == c.name());
  for (DecodeKernel kernel : {DecodeKernel::kAppend, DecodeKernel::kAttend, DecodeKernel::kCombine}) {
    CHECK(source.translation_unit.find(c.symbol(kernel) + "(") != std::string::npos);
  }
  CHECK(source.headers.front().contents.find("static constexpr bool kPaged = true;") != std::string::npos);
  bool has_template = false;
  for (const auto& header : source.headers) has_template |= header.name == "decode_sm80.cuh";
  CHECK(has_template);
}

TEST_CASE("the decode heuristic packs a kv head's rows and splits short batches across the SMs", "[tuner][decode]") {
  flashgen::AttentionProblem problem;
  problem.kv_cache = true;
  problem.dtype = flashgen::DType::kBFloat16;
  problem.mask = FLASHGEN_MASK_CAUSAL;
  problem.shape = {1, 1, 32768, 32, 8, 128};
  flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  CHECK(choice.config.rows == 16);
  CHECK_FALSE(choice.config.invalid_reason(90));
  // 8 kv heads alone fill few of 132 SMs: enough ranges for most of a wave.
  CHECK(choice.splits * 8 >= 100);
  CHECK(choice.splits <= 128);
  problem.shape = {64, 1, 32768, 32, 8, 128};  // 512 blocks already fill the GPU
  CHECK(flashgen::heuristic_decode_choice(problem, 90, 132).splits == 1);
  problem.shape = {1, 4, 512, 32, 4, 128};  // 8 heads x 4 tokens: 32 rows
  choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  CHECK(choice.config.rows == 32);
  CHECK(choice.splits <= 8);  // 512 keys hold 8 tiles of 64
}

TEST_CASE("the decode heuristic's configs compile without spills", "[tuner][decode][nvrtc]") {
  auto& registry = flashgen::KernelRegistry::instance();
  flashgen::AttentionProblem problem;
  problem.kv_cache = true;
  problem.dtype = flashgen::DType::kBFloat16;
  problem.mask = FLASHGEN_MASK_CAUSAL;
  for (int arch : {80, 90})
    for (int d : {64, 128, 256})
      for (bool paged : {false, true}) {
        problem.paged = paged;
        problem.shape = {4, 1, 8192, 32, 8, d};
        const flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, arch, 132);
        INFO("sm_" << arch << " " << choice.config.name());
        REQUIRE_FALSE(choice.config.invalid_reason(arch).has_value());
        const auto kernel = registry.compiled(choice.config, arch);
        const auto usage = kernel->usage_of(choice.config.symbol(DecodeKernel::kAttend));
        CHECK(usage.spill_store_bytes + usage.spill_load_bytes == 0);
      }
}
