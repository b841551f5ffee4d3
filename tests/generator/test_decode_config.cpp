// Tests for DecodeConfig: canonical names and their inverse, JSON round-trip, the shared validity rules, and
// the generated module (config header and its three kernels' entry points); the heuristic choice of config
// and split count.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/decode_config.hpp"
#include "generator/generator.hpp"
#include "runtime/kernel_registry.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/space.hpp"

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

TEST_CASE("a window decode module is named, read back and generated as the causal one is",
          "[generator][decode][window]") {
  DecodeConfig c;
  c.dtype = flashgen::DType::kBFloat16;
  c.mask = flashgen::MaskKind::kWindow;
  c.paged = true;
  CHECK(c.name() == "dec_sm80_bf16_d128_r16_n64_w4_s4_window_paged");
  CHECK(DecodeConfig::from_name(c.name()) == c);
  CHECK_THROWS_WITH(DecodeConfig::from_name("dec_sm80_bf16_d128_r16_n64_w4_s4_causal_window"),
                    Catch::Matchers::Contains("unknown suffix 'window'"));
  CHECK_THROWS_WITH(DecodeConfig::from_name("dec_sm80_bf16_d128_r16_n64_w4_s4_paged_window"),
                    Catch::Matchers::Contains("not canonical"));
  CHECK_FALSE(c.invalid_reason(80).has_value());
  const nlohmann::json j = c;
  CHECK(j.at("mask") == "window");
  CHECK(j.get<DecodeConfig>() == c);
  const std::string header = flashgen::generate(c).headers.front().contents;
  CHECK(header.find("using Variant = flashgen::SlidingWindow;") != std::string::npos);
  CHECK(header.find("kMask = flashgen::MaskKind::kWindow;") != std::string::npos);
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
  problem.mask = flashgen::Mask::kCausal;
  problem.shape = {1, 1, 32768, 32, 8, 128};
  flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  CHECK(choice.config.rows == 16);
  CHECK_FALSE(choice.config.invalid_reason(90));
  // 8 kv heads alone fill few of 132 SMs: enough ranges for most of a wave. Of those that fit one wave (at most 16),
  // the fewest that give the fewest of the 512 key blocks to the longest range: 16 ranges of 32 (15 would leave
  // ranges of 35).
  CHECK(choice.splits == 16);
  // 4 kv heads: 32 ranges of 16 blocks each (33 give no range fewer).
  problem.shape = {1, 1, 32768, 32, 4, 128};
  CHECK(flashgen::heuristic_decode_choice(problem, 90, 132).splits == 32);
  // The tuner measures the counts that fill each of 1-4 waves and the most that stay within them: 16 and 17 here.
  problem.shape = {1, 1, 32768, 32, 8, 128};
  const std::vector<int> counts = flashgen::decode_split_counts(problem, choice.config, 90, 132);
  CHECK(std::count(counts.begin(), counts.end(), 16) == 1);
  CHECK(std::count(counts.begin(), counts.end(), 17) == 1);
  CHECK(std::is_sorted(counts.begin(), counts.end()));
  problem.shape = {64, 1, 32768, 32, 8, 128};  // 512 blocks already fill the GPU
  CHECK(flashgen::heuristic_decode_choice(problem, 90, 132).splits == 1);
  problem.shape = {1, 4, 512, 32, 4, 128};  // 8 heads x 4 tokens: 32 rows
  choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  CHECK(choice.config.rows == 32);
  CHECK(choice.splits <= 8);  // 512 keys hold 8 tiles of 64
}

namespace {

// One new token of 8 kv heads against caches of 32k keys, a 256-key window: 8 blocks leave most of 132 SMs idle.
flashgen::AttentionProblem window_decode_problem() {
  flashgen::AttentionProblem problem =
      flashgen::forward_problem(flashgen::DType::kBFloat16, {1, 1, 32768, 32, 8, 128}, flashgen::Mask::kSlidingWindow,
                                256, 0);
  problem.kv_cache = true;
  return problem;
}

}  // namespace

TEST_CASE("a window's split count reasons about the key blocks it visits, not the capacity",
          "[tuner][decode][window]") {
  flashgen::AttentionProblem problem = window_decode_problem();
  const flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  REQUIRE(choice.config.block_n == 64);
  CHECK(choice.config.mask == flashgen::MaskKind::kWindow);
  // 256 + 1 keys end at the sequence's last: at most 5 blocks of 64 (4 when they happen to align), not 512.
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 5);
  CHECK(choice.splits == 5);  // each visited block a range of its own: 8 x 5 blocks still fill few SMs
  const std::vector<int> counts = flashgen::decode_split_counts(problem, choice.config, 90, 132);
  CHECK(counts.back() == 5);
  // The causal problem of the same sizes splits its 512 blocks much more finely.
  flashgen::AttentionProblem causal = problem;
  causal.set_mask(flashgen::Mask::kCausal);
  CHECK(flashgen::heuristic_decode_choice(causal, 90, 132).splits * 8 >= 100);
  // gpt-oss's 128-key window at head_dim 64 (batch 8, GQA 64/8, pages of 16): its 3 blocks fit the module's
  // pipeline, so one range, though 64 blocks leave half the SMs idle (more ranges would only add partials and a
  // merge); a 1024-key window's 17 blocks are more than its stages hold, and split.
  flashgen::AttentionProblem oss = flashgen::forward_problem(
      flashgen::DType::kBFloat16, {8, 1, 32768, 64, 8, 64}, flashgen::Mask::kSlidingWindow, 127, 0);
  oss.kv_cache = true;
  oss.paged = true;
  const flashgen::DecodeChoice oss_choice = flashgen::heuristic_decode_choice(oss, 90, 132);
  REQUIRE(flashgen::max_decode_blocks(oss, oss_choice.config) == 3);
  REQUIRE(oss_choice.config.stages >= 3);
  CHECK(oss_choice.splits == 1);
  oss.set_mask(flashgen::Mask::kSlidingWindow, 1023, 0);
  const flashgen::DecodeChoice wide = flashgen::heuristic_decode_choice(oss, 90, 132);
  REQUIRE(flashgen::max_decode_blocks(oss, wide.config) > wide.config.stages);
  CHECK(wide.splits > 1);
  // New tokens widen the window's reach (4 rows: 256 + 4 keys), the right side does not (no key lies past the
  // last new token's diagonal), and a window longer than the cache is the capacity's.
  problem.shape.seqlen_q = 4;
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 6);
  problem.set_mask(flashgen::Mask::kSlidingWindow, 256, 1000);
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 6);
  problem.set_mask(flashgen::Mask::kSlidingWindow, 0, 0);
  problem.shape.seqlen_q = 1;
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 1);
  problem.set_mask(flashgen::Mask::kSlidingWindow, 1 << 20, 0);
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 128);  // kMaxDecodeSplits of the capacity's 512
  problem.shape.seqlen_k = 300;
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 5);
  // Unbounded on the left: every key of the cache may be visited.
  problem.set_mask(flashgen::Mask::kSlidingWindow, -1, 8);
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 5);
  problem.shape.seqlen_k = 32768;
  CHECK(flashgen::max_decode_splits(problem, choice.config) == 128);
}

TEST_CASE("a requested split count past the visited key blocks runs capped and the reason says so",
          "[tuner][decode][window]") {
  // A 256-key window over a 32k cache visits at most 5 key blocks of 64.
  const flashgen::AttentionProblem problem = window_decode_problem();
  const flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  REQUIRE(flashgen::max_decode_splits(problem, choice.config) == 5);
  const flashgen::DecodeChoice capped = flashgen::with_requested_splits(choice, problem, 16);
  CHECK(capped.splits == 5);
  CHECK(capped.reason == choice.reason + "; 16 key ranges as requested, run as 5 key ranges (the key blocks a "
                                         "sequence's rows visit)");
  CHECK(capped.config.name() == choice.config.name());
  const flashgen::DecodeChoice one = flashgen::with_requested_splits(choice, problem, 1);
  CHECK(one.splits == 1);
  CHECK(one.reason == choice.reason + "; 1 key range as requested");
  CHECK(flashgen::with_requested_splits(choice, problem, 5).reason == choice.reason + "; 5 key ranges as requested");
}

TEST_CASE("the decode heuristic's configs compile without spills", "[tuner][decode][nvrtc]") {
  auto& registry = flashgen::KernelRegistry::instance();
  flashgen::AttentionProblem problem;
  problem.kv_cache = true;
  problem.dtype = flashgen::DType::kBFloat16;
  problem.mask = flashgen::Mask::kCausal;
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

TEST_CASE("the window's decode modules compile without spills", "[tuner][decode][nvrtc][window]") {
  // The window's first key per row and its masked blocks at both ends of a range add to the causal kernel.
  auto& registry = flashgen::KernelRegistry::instance();
  flashgen::AttentionProblem problem = flashgen::forward_problem(
      flashgen::DType::kBFloat16, {4, 1, 8192, 32, 8, 128}, flashgen::Mask::kSlidingWindow, 1024, 0);
  problem.kv_cache = true;
  for (auto [d, paged] : {std::pair{64, false}, std::pair{128, false}, std::pair{256, false}, std::pair{128, true}}) {
    problem.shape.head_dim = d;
    problem.paged = paged;
    const flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, 90, 132);
    INFO(choice.config.name());
    REQUIRE(choice.config.mask == flashgen::MaskKind::kWindow);
    const auto kernel = registry.compiled(choice.config, 90);
    const auto usage = kernel->usage_of(choice.config.symbol(DecodeKernel::kAttend));
    CHECK(usage.spill_store_bytes + usage.spill_load_bytes == 0);
  }
}

TEST_CASE("a latent decode config is named, read back, validated and generated over the Hopper template",
          "[generator][decode][latent]") {
  DecodeConfig c = flashgen::latent_decode_config(flashgen::DType::kBFloat16, 576, 512);
  c.mask = flashgen::MaskKind::kCausal;
  c.paged = true;
  CHECK(c.name() == "dec_sm90_bf16_d576_v512_s2_causal_paged");
  CHECK(DecodeConfig::from_name(c.name()) == c);
  CHECK(c.value_dim() == 512);
  CHECK(c.threads(DecodeKernel::kAttend) == 384);
  CHECK(c.smem_bytes(DecodeKernel::kAttend) <= 232448);
  nlohmann::json j = c;
  CHECK(j["family"] == "dec_sm90");
  CHECK(j.get<DecodeConfig>() == c);
  CHECK_THROWS_WITH(nlohmann::json({{"family", "dec_sm90"}, {"rows", 64}}).get<DecodeConfig>(),
                    Catch::Matchers::Contains("unknown field \"rows\" for family dec_sm90"));
  CHECK_THROWS_WITH(DecodeConfig::from_name("dec_sm90_bf16_d576_v0512_s2"), Catch::Matchers::Contains("not canonical"));

  CHECK_FALSE(c.invalid_reason(90));
  CHECK(c.invalid_reason(80).value().find("needs sm_90") != std::string::npos);
  CHECK(c.invalid_reason(100).value().find("needs sm_90") != std::string::npos);
  c.stages = 3;  // Q and three 72 KB tiles
  CHECK(c.invalid_reason(90).value().find("shared memory") != std::string::npos);
  DecodeConfig narrow = flashgen::latent_decode_config(flashgen::DType::kBFloat16, 512, 512);
  CHECK(std::string(narrow.traits_error()).find("exceed head_dim_v by 64") != std::string::npos);
  for (int dim_v : {192, 0, -128}) {
    narrow.head_dim_v = dim_v;
    CHECK(std::string(narrow.traits_error()).find("multiple of 128") != std::string::npos);
  }
  CHECK(std::string(flashgen::latent_decode_config(flashgen::DType::kBFloat16, 128, 64).traits_error())
            .find("[192, 576]") != std::string::npos);
  CHECK_THROWS_WITH(flashgen::generate(narrow), Catch::Matchers::Contains("invalid decode config"));

  const flashgen::GeneratedSource source = flashgen::generate(flashgen::latent_decode_config(
      flashgen::DType::kFloat16, 192, 128));
  CHECK(source.translation_unit.find("#include \"decode_sm90.cuh\"") != std::string::npos);
  CHECK(source.translation_unit.find("flashgen::DecodeSm90<flashgen_generated::DecodeConfig>::run") !=
        std::string::npos);
  REQUIRE_FALSE(source.headers.empty());
  CHECK(source.headers.front().contents.find("kHeadDimV = 128") != std::string::npos);
}

TEST_CASE("a latent cache's problem takes the latent kernel, two stages at 576 and its split count",
          "[tuner][decode][latent]") {
  flashgen::AttentionProblem problem;
  problem.kv_cache = true;
  problem.paged = true;
  problem.dtype = flashgen::DType::kBFloat16;
  problem.mask = flashgen::Mask::kCausal;
  problem.shape = {4, 1, 8192, 128, 1, 576};
  problem.shape.head_dim_v = 512;
  const flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  CHECK(choice.config.name() == "dec_sm90_bf16_d576_v512_s2_causal_paged");
  // 4 sequences x 2 row blocks of 64 heads: 8 blocks for 132 SMs, split into ranges of the 128 key blocks.
  CHECK(choice.splits > 1);
  problem.shape.head_dim = 192, problem.shape.head_dim_v = 128;
  CHECK(flashgen::heuristic_decode_choice(problem, 90, 132).config.stages == 4);
}

TEST_CASE("the latent decode kernel compiles without spills or serialized wgmma", "[tuner][decode][nvrtc][latent]") {
  auto& registry = flashgen::KernelRegistry::instance();
  for (auto [d, dv] : {std::pair{576, 512}, std::pair{192, 128}}) {
    DecodeConfig c = flashgen::latent_decode_config(flashgen::DType::kBFloat16, d, dv);
    c.paged = true;
    c.mask = flashgen::MaskKind::kCausal;
    INFO(c.name());
    const auto kernel = registry.compiled(c, 90);
    const auto usage = kernel->usage_of(c.symbol(DecodeKernel::kAttend));
    CHECK(usage.spill_store_bytes + usage.spill_load_bytes == 0);
    CHECK(kernel->ptxas_notes().empty());
  }
}

TEST_CASE("a latent cache's tuning space holds the latent kernel's stages and split counts",
          "[tuner][decode][latent]") {
  flashgen::AttentionProblem problem;
  problem.kv_cache = true;
  problem.paged = true;
  problem.page_size = 64;
  problem.dtype = flashgen::DType::kBFloat16;
  problem.mask = flashgen::Mask::kCausal;
  problem.shape = {16, 1, 4096, 128, 1, 576};
  problem.shape.head_dim_v = 512;
  const flashgen::DecodeSpaceReport space = flashgen::decode_space(problem, 90, 132);
  REQUIRE_FALSE(space.valid.empty());
  for (const flashgen::DecodeSplitConfig& c : space.valid) {
    CHECK(c.config.latent);
    CHECK(c.config.stages == 2);  // three 72 KB tiles beside Q do not fit
  }
  CHECK(space.valid.size() == flashgen::decode_split_counts(problem, space.valid.front().config, 90, 132).size());
  CHECK(flashgen::decode_space(problem, 80, 132).valid.empty());  // the latent kernel needs sm_90
}
