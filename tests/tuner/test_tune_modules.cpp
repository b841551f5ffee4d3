// Tests for tuner/tune_modules: the modules a tune compiles for its plan, which `flashgen compile --spec` compiles
// ahead (a KV-cache module once whatever its split counts, what the arch cannot run left out, a backward's forward).
#include <string>
#include <variant>
#include <vector>

#include "catch.hpp"
#include "support/temp_dir.hpp"
#include "tuner/choice.hpp"
#include "tuner/shipped.hpp"
#include "tuner/store.hpp"
#include "tuner/tune_modules.hpp"

using flashgen::AttentionProblem;
using flashgen::KernelModule;

namespace {

std::vector<std::string> names_of(const std::vector<KernelModule>& modules) {
  std::vector<std::string> names;
  for (const KernelModule& m : modules) names.push_back(std::visit([](const auto& c) { return c.name(); }, m));
  return names;
}

const flashgen::AttentionShape kShape{/*batch=*/2, /*seqlen_q=*/1024, /*seqlen_k=*/1024, /*heads_q=*/8,
                                      /*heads_kv=*/2, /*head_dim=*/64};

}  // namespace

TEST_CASE("tune_modules: one module per KV-cache config whatever its split counts", "[tuner]") {
  AttentionProblem problem = flashgen::forward_problem(flashgen::DType::kBFloat16, kShape, flashgen::Mask::kNone);
  problem.kv_cache = true;
  flashgen::TunePlan plan;
  for (const char* name : {"dec_sm80_bf16_d64_r16_n64_w4_s6_split1", "dec_sm80_bf16_d64_r16_n64_w4_s6_split8",
                           "dec_sm80_bf16_d64_r16_n64_w1_s6_split1"})
    plan.candidates.emplace_back(flashgen::DecodeSplitConfig::from_name(name));
  CHECK(names_of(flashgen::tune_modules(problem, plan, 90)) ==
        std::vector<std::string>{"dec_sm80_bf16_d64_r16_n64_w4_s6", "dec_sm80_bf16_d64_r16_n64_w1_s6"});
}

TEST_CASE("tune_modules: a candidate the arch cannot run is left out, as the sweep skips it", "[tuner]") {
  const AttentionProblem problem = flashgen::forward_problem(flashgen::DType::kFloat16, kShape, flashgen::Mask::kNone);
  flashgen::TunePlan plan;
  plan.candidates = {flashgen::KernelConfig::from_name("fwd_sm90_fp16_d64_m128_n64_s3_ovl_pst_tsum"),
                     flashgen::KernelConfig::from_name("fwd_sm80_fp16_d64_m128_n64_w4_s2")};
  CHECK(names_of(flashgen::tune_modules(problem, plan, 80)) ==
        std::vector<std::string>{"fwd_sm80_fp16_d64_m128_n64_w4_s2"});
  CHECK(flashgen::tune_modules(problem, plan, 90).size() == 2);
}

TEST_CASE("tune_modules: a backward's modules end with the forward its sweep runs first", "[tuner][nvrtc]") {
  const AttentionProblem problem =
      flashgen::backward_problem(flashgen::DType::kFloat16, kShape, flashgen::Mask::kNone, /*deterministic=*/false);
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 80, [] {
    flashgen::TuneOptions options;
    options.max_candidates = 2;
    return options;
  }());
  const std::vector<KernelModule> modules = flashgen::tune_modules(problem, plan, 80);
  REQUIRE(modules.size() == 3);
  CHECK(std::get<flashgen::BwdConfig>(modules[0]) == plan.builtin);
  const flashgen::KernelConfig forward =
      flashgen::heuristic_choice(problem.dtype, 64, flashgen::MaskKind::kNone, 80).config;
  CHECK(std::get<flashgen::KernelConfig>(modules[2]) == forward);
  CHECK(flashgen::backward_sweep_forward(problem, 80) == forward);
}

TEST_CASE("shipped_incumbent_modules: the shipped winners of the class on the arch that the plan lacks", "[tuner]") {
  const AttentionProblem problem = flashgen::forward_problem(flashgen::DType::kFloat16, kShape, flashgen::Mask::kNone);
  const flashgen::ProblemKey key = flashgen::problem_key(problem);
  flashgen::TunePlan plan;
  plan.key = key;
  plan.builtin = flashgen::KernelConfig::from_name("fwd_sm80_fp16_d64_m128_n64_w4_s2");
  plan.candidates = {plan.builtin};
  // Shipped winners: one the plan lacks on an sm_90 GPU (another bucket of the class), one the plan has, one on an
  // sm_80 GPU, one of another class.
  const std::string outside = "fwd_sm80_fp16_d64_m64_n64_w4_s2";
  AttentionProblem longer = problem;
  longer.shape.seqlen_q = longer.shape.seqlen_k = 8192;
  AttentionProblem causal = flashgen::forward_problem(flashgen::DType::kFloat16, kShape, flashgen::Mask::kCausal);
  const flashgen::testing::TempDir dir("flashgen-tune-modules");
  std::string text;
  {
    flashgen::TuningStore store(dir.path() / "shipped.sqlite");
    auto record = [&](const flashgen::DeviceFingerprint& device, const AttentionProblem& p, const std::string& name) {
      flashgen::CandidateResult row;
      row.config = flashgen::KernelConfig::from_name(name);
      row.median_ms = 1.0;
      store.record(device, flashgen::problem_key(p), {row}, row.config, 1.0);
    };
    record(flashgen::fingerprint_for_arch(90), longer, outside);
    record(flashgen::fingerprint_for_arch(90), problem, "fwd_sm80_fp16_d64_m128_n64_w4_s2");
    record(flashgen::fingerprint_for_arch(80), problem, "fwd_sm80_fp16_d64_m64_n32_w4_s2");
    record(flashgen::fingerprint_for_arch(90), causal, "fwd_sm80_fp16_d64_m64_n32_w4_s2_causal");
    text = store.export_json().dump();
  }
  const flashgen::ShippedDefaults shipped = flashgen::ShippedDefaults::from_files({{"test.json", text}});
  CHECK(names_of(flashgen::shipped_incumbent_modules(problem, plan, 90, shipped)) ==
        std::vector<std::string>{outside});
  CHECK(names_of(flashgen::shipped_incumbent_modules(problem, plan, 80, shipped)) ==
        std::vector<std::string>{"fwd_sm80_fp16_d64_m64_n32_w4_s2"});
}
