// Built-in configs: valid for every supported problem, and every default candidate compiles with NVRTC
// for sm_80 and sm_90a without spills.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "dispatch/select.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/sass.hpp"
#include "support/parallel.hpp"
#include "support/temp_dir.hpp"
#include "tuner/heuristic.hpp"

using flashgen::DType;
using flashgen::MaskKind;

namespace {

using flashgen::testing::TempDir;

// The sm90 family's default candidates at whole tile widths (a padded head_dim such as 96 runs the code of
// its tiles' width), then their p_smem and cluster variants where valid.
std::vector<flashgen::KernelConfig> sm90_candidates_and_variants() {
  std::vector<flashgen::KernelConfig> configs;
  for (const auto& c : flashgen::default_forward_candidates(90)) {
    if (c.family() != flashgen::KernelFamily::kSm90 || c.head_dim % 64 != 0) continue;
    configs.push_back(c);
    for (auto [p_smem, cluster] : {std::pair{true, 1}, std::pair{false, 2}, std::pair{true, 2}}) {
      flashgen::KernelConfig variant = c;
      variant.sm90()->p_smem = p_smem;
      variant.sm90()->cluster = cluster;
      if (!variant.invalid_reason(90)) configs.push_back(variant);
    }
  }
  return configs;
}

// A bf16 problem class whose sm_90 run-time choice a test compiles.
struct ChoiceCase {
  int head_dim;
  MaskKind mask;
  bool backward;
};

// A run-time choice as the spill checks look at it: the config's name and family, why it was chosen, its
// compiled module and its main kernel's resource usage (the dkdv kernel of a backward module).
struct CompiledChoice {
  std::string name, reason;
  flashgen::KernelFamily family = flashgen::KernelFamily::kSm80;
  std::shared_ptr<const flashgen::CompiledKernel> compiled;
  flashgen::ResourceUsage usage;
};

// The sm_90 run-time choices of cases (with score modifiers mods), one each: compiled first on every core (the
// choice compiles its heuristic configs through the kernel registry's caches), then read back one by one, so that
// a failure is the test's and not a worker thread's.
std::vector<CompiledChoice> compiled_choices(const std::vector<ChoiceCase>& cases, flashgen::ScoreMods mods) {
  auto choose = [&](const ChoiceCase& k, CompiledChoice* into) {
    flashgen::KernelRegistry& registry = flashgen::KernelRegistry::instance();
    if (k.backward) {
      const auto choice =
          flashgen::heuristic_backward_choice(DType::kBFloat16, k.head_dim, k.mask, false, 90, false, false, mods);
      if (into == nullptr) return;
      into->name = choice.config.name(), into->reason = choice.reason, into->family = choice.config.family();
      into->compiled = registry.compiled(choice.config, 90);
      into->usage = into->compiled->usage_of(choice.config.symbol(flashgen::BwdKernel::kDkdv));
    } else {
      const auto choice = flashgen::heuristic_choice(DType::kBFloat16, k.head_dim, k.mask, 90, false, false, mods);
      if (into == nullptr) return;
      into->name = choice.config.name(), into->reason = choice.reason, into->family = choice.config.family();
      into->compiled = registry.compiled(choice.config, 90);
      into->usage = into->compiled->usage;
    }
  };
  flashgen::testing::parallel_for(cases.size(), [&](size_t i) { choose(cases[i], nullptr); });
  std::vector<CompiledChoice> choices(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) choose(cases[i], &choices[i]);
  return choices;
}

}  // namespace

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

TEST_CASE("values of a head dim of their own take the tiles of the wider dim", "[tuner][heuristic]") {
  for (int arch : {80, 86, 90})
    for (auto [d, dv] : {std::pair{192, 128}, std::pair{128, 64}, std::pair{64, 256}, std::pair{64, 40}}) {
      const auto configs = flashgen::heuristic_forward_configs(DType::kBFloat16, d, MaskKind::kCausal, arch, false, dv);
      REQUIRE_FALSE(configs.empty());
      // On sm_90 the Hopper family first, as for equal dims.
      CHECK((configs.front().family() == flashgen::KernelFamily::kSm90) == (arch == 90));
      for (const auto& c : configs) {
        INFO("sm_" << arch << " " << c.name());
        CHECK(c.head_dim == d);
        CHECK(c.value_dim() == dv);
        CHECK_FALSE(c.invalid_reason(arch).has_value());
      }
    }
  // The queries' own head dim as the values' is no dim of their own: the plain configs, by their plain names.
  CHECK(flashgen::heuristic_forward_config(DType::kFloat16, 128, MaskKind::kNone, 90).name() ==
        flashgen::heuristic_forward_configs(DType::kFloat16, 128, MaskKind::kNone, 90, false, 128).front().name());
  // Values of up to 512 columns (FA3's 64 / 512): on sm_90 two consumers for each 64 rows split O's columns; the
  // sm80 family's warps cannot hold 512 columns of fp32 output.
  for (int dv : {320, 512}) {
    const auto wide = flashgen::heuristic_forward_configs(DType::kBFloat16, 64, MaskKind::kCausal, 90, false, dv);
    REQUIRE_FALSE(wide.empty());
    for (const auto& c : wide) {
      INFO(c.name());
      CHECK(c.value_dim() == dv);
      if (c.sm90() == nullptr) continue;  // the sm80 family's tiles after the Hopper family's, where warps hold them
      CHECK(c.sm90()->value_split == 2);
      CHECK(c.block_m == 64);
    }
    CHECK(wide.front().name() == "fwd_sm90_bf16_d64_v" + std::to_string(dv) + "_m64_n64_s2_causal_ovl_pp_pst_vs2");
  }
  CHECK(flashgen::heuristic_forward_configs(DType::kBFloat16, 128, MaskKind::kNone, 90, false, 512).front().block_n ==
        48);
  // Keys of 512 (Gemma 4's global layers, DeepSeek-V4): 32 keys a stage; narrower values without the split.
  CHECK(flashgen::heuristic_forward_configs(DType::kBFloat16, 512, MaskKind::kCausal, 90).front().name() ==
        "fwd_sm90_bf16_d512_m64_n32_s2_causal_ovl_pp_pst_vs2");
  CHECK(flashgen::heuristic_forward_configs(DType::kBFloat16, 512, MaskKind::kNone, 90, false, 128).front().name() ==
        "fwd_sm90_bf16_d512_v128_m64_n64_s2_ovl_pst");
  CHECK_THROWS_WITH(flashgen::heuristic_forward_configs(DType::kBFloat16, 512, MaskKind::kNone, 80),
                    Catch::Contains("no forward config for head_dim 512 on sm_80"));
  // Every pair of dims the forward takes has a Hopper config, dense and packed.
  int pairs = 0;
  for (int d = 8; d <= 512; d += 8)
    for (int dv = 8; dv <= 512; dv += 8)
      for (bool varlen : {false, true}) {
        INFO("head_dim " << d << " head_dim_v " << dv << (varlen ? " varlen" : ""));
        const auto configs =
            flashgen::heuristic_forward_configs(DType::kBFloat16, d, MaskKind::kCausal, 90, varlen, dv);
        REQUIRE_FALSE(configs.empty());
        CHECK(configs.front().family() == flashgen::KernelFamily::kSm90);
        ++pairs;
      }
  CHECK(pairs == 64 * 64 * 2);
  CHECK_THROWS_WITH(flashgen::heuristic_forward_configs(DType::kBFloat16, 64, MaskKind::kNone, 80, false, 512),
                    Catch::Contains("no forward config for head_dim 64 with values of head dim 512 on sm_80"));
}

TEST_CASE("values of a head dim of their own: the run-time choices compile without spills",
          "[tuner][heuristic][nvrtc][value_dim]") {
  struct Case {
    int head_dim, head_dim_v;
    MaskKind mask;
  };
  const std::vector<Case> cases = {{192, 128, MaskKind::kCausal}, {128, 64, MaskKind::kNone}, {64, 256, MaskKind::kCausal},
                                   {64, 512, MaskKind::kCausal}, {256, 512, MaskKind::kNone},
                                   {512, 512, MaskKind::kCausal}, {512, 128, MaskKind::kNone}};
  std::vector<flashgen::ForwardChoice> choices(cases.size());
  flashgen::testing::parallel_for(cases.size(), [&](size_t i) {
    const Case& k = cases[i];
    choices[i] = flashgen::heuristic_choice(DType::kBFloat16, k.head_dim, k.mask, 90, false, false, {}, k.head_dim_v);
  });
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto compiled = flashgen::KernelRegistry::instance().compiled(choices[i].config, 90);
    INFO(choices[i].config.name() << ": " << choices[i].reason << "\n" << compiled->log);
    CHECK(choices[i].config.value_dim() == cases[i].head_dim_v);
    CHECK(compiled->usage.spill_store_bytes == 0);
    CHECK(compiled->usage.spill_load_bytes == 0);
    CHECK(compiled->ptxas_notes().empty());
  }
}

TEST_CASE("every default candidate compiles for sm_80 and sm_90a with zero spills", "[tuner][heuristic][nvrtc]") {
  // An empty cache of its own, so every candidate really goes through NVRTC and ptxas.
  const TempDir cache_dir{"flashgen-heuristic-test"};
  flashgen::KernelRegistry registry(cache_dir.path());
  int sm90_candidates = 0;
  for (int arch : {80, 90}) {
    const auto candidates = flashgen::default_forward_candidates(arch);
    CHECK(candidates.size() >= 24);
    for (const auto& c : candidates) {
      INFO("sm_" << arch << " " << c.name());
      const auto compiled = registry.compiled(c, arch);
      CHECK_FALSE(compiled->from_cache);
      CHECK(compiled->cubin.size() > 0);
      CHECK(compiled->usage.registers > 0);
      CHECK(compiled->usage.registers <= 255);
      CHECK(compiled->usage.spill_store_bytes == 0);
      CHECK(compiled->usage.spill_load_bytes == 0);
      CHECK(compiled->usage.stack_bytes == 0);
      if (c.family() == flashgen::KernelFamily::kSm90) {
        ++sm90_candidates;
        // ptxas warns when it serializes wgmma (accumulators touched while in flight) or ignores
        // setmaxnreg; either would leave the kernel on a slower path than the one it was written for.
        INFO(compiled->log);
        CHECK(compiled->ptxas_notes().empty());
      }
    }
  }
  // On sm_90a the sm90 family is the first choice for every head_dim (32, 64, 96, 128, 192, 256 here), both
  // dtypes and masks.
  CHECK(sm90_candidates == 24);
}

TEST_CASE("the sm90 family's P-in-shared-memory and cluster variants compile with zero spills",
          "[tuner][heuristic][nvrtc]") {
  // The tuner's p_smem and cluster knobs on every fp16 default sm90 candidate (dtype changes no code
  // path): each valid variant compiles for sm_90a without spills or ptxas warnings.
  const TempDir cache_dir{"flashgen-heuristic-variants-test"};
  flashgen::KernelRegistry registry(cache_dir.path());
  int variants = 0;
  for (const auto& variant : sm90_candidates_and_variants()) {
    const flashgen::Sm90Knobs& k = *variant.sm90();
    if ((!k.p_smem && k.cluster == 1) || variant.dtype != flashgen::DType::kFloat16) continue;
    ++variants;
    INFO(variant.name());
    const auto compiled = registry.compiled(variant, 90);
    INFO(compiled->log);
    CHECK(compiled->cubin.size() > 0);
    CHECK(compiled->usage.spill_store_bytes == 0);
    CHECK(compiled->usage.spill_load_bytes == 0);
    CHECK(compiled->usage.stack_bytes == 0);
    CHECK(compiled->ptxas_notes().empty());
  }
  // P in shared memory fits beside the tiles of the d128 and d256 candidates (under both masks: 4; d64's
  // four consumers lack the registers, d192 the shared memory); clusters take the 4 unmasked candidates,
  // 2 of them with P in shared memory: 10.
  CHECK(variants == 10);
}

TEST_CASE("backward heuristic is valid for every head_dim, dtype, mask, strategy and arch", "[tuner][heuristic][backward]") {
  for (int arch : {80, 86, 89, 90})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
        for (bool deterministic : {false, true})
          for (int d = 8; d <= 512; d += 8) {
            // 99 KB of shared memory: above 368 columns K and V of 32 keys, two stages of 16 query rows and the dS
            // tiles exceed it (above 384 without the dS tiles, deterministic).
            if (d > (deterministic ? 384 : 368) && (arch == 86 || arch == 89)) {
              CHECK_THROWS_WITH(flashgen::heuristic_backward_config(dtype, d, mask, deterministic, arch),
                                Catch::Contains("no backward config for head_dim " + std::to_string(d)) &&
                                    Catch::Contains("shared memory"));
              continue;
            }
            const auto c = flashgen::heuristic_backward_config(dtype, d, mask, deterministic, arch);
            INFO("sm_" << arch << " " << c.name());
            CHECK(c.head_dim == d);
            CHECK(c.deterministic == deterministic);
            CHECK_FALSE(c.invalid_reason(arch).has_value());
          }
}

TEST_CASE("the run-time backward choice compiles for sm_80 and sm_90a with zero spills",
          "[tuner][heuristic][nvrtc][backward]") {
  // ptxas's allocation near 255 registers varies with head_dim and arch, so the run-time choice takes the
  // first preference that compiles without spills (heuristic_backward_choice). Its answers for the
  // standard head_dims, both dtypes, masks and strategies, on both archs, must be spill-free. Compiled
  // through the process-wide registry and its disk cache ($FLASHGEN_CACHE_DIR), every preference on
  // every core first, so the sanitizer run reuses the Release run's cubins.
  flashgen::KernelRegistry& registry = flashgen::KernelRegistry::instance();
  struct Class {
    DType dtype;
    int head_dim;
    MaskKind mask;
    bool deterministic;
    int arch;
  };
  std::vector<Class> classes;
  std::vector<std::pair<flashgen::BwdConfig, int>> preferences;
  for (int arch : {80, 90})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
        for (bool deterministic : {false, true})
          for (int d : {32, 64, 96, 128, 192, 256, 320, 512}) {
            if (d > 256 && dtype != DType::kBFloat16) continue;  // the same code in both dtypes
            classes.push_back({dtype, d, mask, deterministic, arch});
            for (const auto& c : flashgen::heuristic_backward_configs(dtype, d, mask, deterministic, arch))
              preferences.emplace_back(c, arch);
          }
  flashgen::testing::parallel_for(preferences.size(), [&](size_t i) {
    registry.compiled(preferences[i].first, preferences[i].second);
  });

  for (const Class& k : classes) {
    const flashgen::BackwardChoice choice =
        flashgen::heuristic_backward_choice(k.dtype, k.head_dim, k.mask, k.deterministic, k.arch);
    const flashgen::BwdConfig& c = choice.config;
    INFO("sm_" << k.arch << " " << c.name() << ": " << choice.reason);
    CHECK(c.head_dim == k.head_dim);
    CHECK(c.deterministic == k.deterministic);
    CHECK(choice.reason.find("every candidate spills") == std::string::npos);
    const auto compiled = registry.compiled(c, k.arch);
    for (flashgen::BwdKernel kernel : {flashgen::BwdKernel::kPreprocess, flashgen::BwdKernel::kDkdv,
                                       c.has_dq_kernel() ? flashgen::BwdKernel::kDq : flashgen::BwdKernel::kConvert}) {
      const flashgen::ResourceUsage usage = compiled->usage_of(c.symbol(kernel));
      INFO(c.symbol(kernel));
      CHECK(usage.registers > 0);
      CHECK(usage.spill_store_bytes == 0);
      CHECK(usage.spill_load_bytes == 0);
      CHECK(usage.stack_bytes == 0);
    }
    // The Hopper family is the choice on sm_90 where it applies, and compiles without serialized wgmma.
    const bool sm90_applies = k.arch == 90 && k.head_dim <= 256;  // tiles of whole 64-column chunks up to 256
    CHECK((c.family() == flashgen::KernelFamily::kSm90) == sm90_applies);
    if (c.family() == flashgen::KernelFamily::kSm90) {
      INFO(compiled->log);
      CHECK(compiled->ptxas_notes().empty());
    }
  }
}

TEST_CASE("the SASS of every default sm90 candidate and its variants runs on HGMMA without local memory",
          "[tuner][heuristic][nvrtc][sass]") {
  // Needs cuobjdump (no GPU): where the toolkit lacks it, the case skips.
  if (flashgen::find_cuobjdump().empty()) {
    WARN("skipped: no cuobjdump in $CUDA_HOME/bin, /usr/local/cuda/bin or $PATH");
    return;
  }
  const TempDir dir{"flashgen-sass-test"};
  flashgen::KernelRegistry registry(dir.path());
  const auto configs = sm90_candidates_and_variants();
  CHECK(configs.size() == 16 + 10 * 2);  // both dtypes of the default candidates and variants counted above
  for (const auto& c : configs) {
    INFO(c.name());
    const std::string sass = flashgen::disassemble_cubin(registry.compiled(c, 90)->cubin);
    CHECK(flashgen::sass_opcode_count(sass, "HGMMA") >= 2 * c.head_dim / 16);  // the k-steps of S = Q Kᵀ and P V
    CHECK(flashgen::sass_opcode_count(sass, "HMMA") == 0);  // no mma.sync left in the wgmma family
    CHECK(flashgen::sass_opcode_count(sass, "LDL") == 0);   // no local memory
    CHECK(flashgen::sass_opcode_count(sass, "STL") == 0);
  }
}

TEST_CASE("soft-capped run-time choices compile without spills or serialized wgmma", "[tuner][heuristic][nvrtc]") {
  // The cap adds a tanh per score (and its derivative in the backward) to kernels near the register limit.
  std::vector<ChoiceCase> cases;
  for (int d : {64, 128, 256})
    for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
      for (bool backward : {false, true}) cases.push_back({d, mask, backward});
  const std::vector<CompiledChoice> choices = compiled_choices(cases, {/*softcap=*/true, /*alibi=*/false});
  for (size_t i = 0; i < cases.size(); ++i) {
    const ChoiceCase& k = cases[i];
    const CompiledChoice& c = choices[i];
    INFO(c.name << ": " << c.reason << "\n" << c.compiled->log);
    // The Hopper family everywhere. Its d64 backward tiles (128 queries per step) sit at the register bound, where
    // the cap's work may make the first spill a few bytes (16 under the causal mask since the soft cap's v8), which
    // cost less than any spill-free tile (bench/notes_variants.md: the sm80 family's ran 1.43-1.53x longer), so the
    // heuristic keeps it and says so.
    CHECK(c.family == flashgen::KernelFamily::kSm90);
    CHECK(c.name.find("_softcap") != std::string::npos);
    const int spilled = c.usage.spill_store_bytes + c.usage.spill_load_bytes;
    if (k.backward && k.head_dim == 64) {
      CHECK(spilled <= 64);
      CHECK((spilled == 0 || c.reason.find("bytes, within the 64") != std::string::npos));
    } else {
      CHECK(spilled == 0);
    }
    CHECK(c.compiled->ptxas_notes().empty());
  }
}

TEST_CASE("a window problem's built-in configs are the causal mask's tiles, with the window's kernels",
          "[tuner][heuristic][window]") {
  // Both hide keys from tiles of unequal length: the same family preferences (sm90 d64 groups or wide packed
  // tiles, persistent blocks claiming their tiles, no clusters) and the same fallbacks.
  for (int arch : {80, 90})
    for (bool varlen : {false, true})
      for (int d : {32, 64, 96, 128, 192, 256}) {
        const auto window = flashgen::heuristic_forward_configs(DType::kBFloat16, d, MaskKind::kWindow, arch, varlen);
        const auto causal = flashgen::heuristic_forward_configs(DType::kBFloat16, d, MaskKind::kCausal, arch, varlen);
        REQUIRE(window.size() == causal.size());
        for (size_t i = 0; i < window.size(); ++i) {
          INFO("sm_" << arch << " " << window[i].name());
          CHECK(window[i].mask == MaskKind::kWindow);
          CHECK_FALSE(window[i].invalid_reason(arch));
          flashgen::KernelConfig as_causal = window[i];
          as_causal.mask = MaskKind::kCausal;
          CHECK(as_causal == causal[i]);
        }
        for (bool deterministic : {false, true}) {
          const auto bwd_window = flashgen::heuristic_backward_configs(DType::kBFloat16, d, MaskKind::kWindow,
                                                                       deterministic, arch);
          const auto bwd_causal = flashgen::heuristic_backward_configs(DType::kBFloat16, d, MaskKind::kCausal,
                                                                       deterministic, arch);
          REQUIRE(bwd_window.size() == bwd_causal.size());
          for (size_t i = 0; i < bwd_window.size(); ++i) {
            INFO("sm_" << arch << " " << bwd_window[i].name());
            CHECK(bwd_window[i].mask == MaskKind::kWindow);
            flashgen::BwdConfig as_causal = bwd_window[i];
            as_causal.mask = MaskKind::kCausal;
            CHECK(as_causal.name() == bwd_causal[i].name());
          }
        }
      }
  // On sm_90 the d64 forward takes the causal mask's two groups, not the unmasked problem's 256-row tile.
  CHECK(flashgen::heuristic_forward_config(DType::kBFloat16, 64, MaskKind::kWindow, 90).name() ==
        "fwd_sm90_bf16_d64_m128_n64_s3_window_ovl_pst_g2");
}

TEST_CASE("the window's run-time choices compile without spills", "[tuner][heuristic][nvrtc][window]") {
  // The window's first key per row and its masked blocks at both ends add to kernels near the register limit.
  std::vector<ChoiceCase> cases;
  for (int d : {64, 128})
    for (bool backward : {false, true}) cases.push_back({d, MaskKind::kWindow, backward});
  const std::vector<CompiledChoice> choices = compiled_choices(cases, {});
  for (const CompiledChoice& c : choices) {
    INFO(c.name << ": " << c.reason << "\n" << c.compiled->log);
    CHECK(c.name.find("_window") != std::string::npos);
    CHECK(c.family == flashgen::KernelFamily::kSm90);  // the Hopper family, as for the causal mask
    CHECK(c.usage.spill_store_bytes == 0);
    CHECK(c.usage.spill_load_bytes == 0);
  }
}

TEST_CASE("ALiBi run-time choices compile on the Hopper family without spills or serialized wgmma",
          "[tuner][heuristic][nvrtc][alibi]") {
  // The bias adds a slope load per row and a few integer and float ops per score; the backward's gradient is
  // the mask's (no score rebuilt), so the Hopper tiles keep their registers. With a soft cap under the bias the
  // d64 backward is the soft cap's case (above).
  std::vector<ChoiceCase> cases;
  for (int d : {64, 128, 256})
    for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal, MaskKind::kWindow})
      for (bool backward : {false, true}) cases.push_back({d, mask, backward});
  const std::vector<CompiledChoice> choices = compiled_choices(cases, {/*softcap=*/false, /*alibi=*/true});
  for (const CompiledChoice& c : choices) {
    INFO(c.name << ": " << c.reason << "\n" << c.compiled->log);
    CHECK(c.family == flashgen::KernelFamily::kSm90);
    CHECK(c.name.find("_alibi") != std::string::npos);
    CHECK(c.usage.spill_store_bytes == 0);
    CHECK(c.usage.spill_load_bytes == 0);
    CHECK(c.compiled->ptxas_notes().empty());
  }
}
