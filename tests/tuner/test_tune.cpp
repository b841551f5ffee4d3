// Tests for tuner/tune: the store look-up before any sweep, the plan around the one built-in choice, the
// record of a sweep's rows and winner, named candidates, and progress as events or lines. A fake sweep
// (support/fake_sweep.hpp) stands in for the GPU; the built-in choice compiles for sm_80 through the kernel cache (no device).
#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "support/fake_sweep.hpp"
#include "support/temp_dir.hpp"
#include "tuner/choice.hpp"
#include "tuner/shipped.hpp"
#include "tuner/space.hpp"
#include "tuner/store.hpp"
#include "tuner/sweep.hpp"
#include "tuner/tune.hpp"

using flashgen::AttentionProblem;
using flashgen::BwdConfig;
using flashgen::CandidateResult;
using flashgen::DType;
using flashgen::KernelConfig;
using flashgen::MaskKind;
using flashgen::SweepOptions;
using flashgen::SweepResult;
using flashgen::TunedConfig;
using flashgen::TuneOptions;
using flashgen::TuneResult;
using flashgen::testing::FakeSweep;

namespace {

// A small atomic backward problem of a class whose built-in choice the CPU tests already compile for sm_80.
AttentionProblem backward_problem() {
  const flashgen::AttentionShape shape{/*batch=*/2, /*seqlen_q=*/1024, /*seqlen_k=*/1024, /*heads_q=*/8,
                                      /*heads_kv=*/2, /*head_dim=*/64};
  return flashgen::backward_problem(flashgen::DType::kFloat16, shape, flashgen::Mask::kNone, /*deterministic=*/false);
}

BwdConfig builtin_of(const AttentionProblem& p) {
  return flashgen::heuristic_backward_choice(p.dtype, p.head_dim(), MaskKind::kNone, p.deterministic(), 80).config;
}

}  // namespace

TEST_CASE("tune sweeps a bucket the store lacks, records it, then finds it there", "[tuner][tune][nvrtc]") {
  const flashgen::testing::TempDir dir("flashgen-tune-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(80);
  const AttentionProblem problem = backward_problem();
  const BwdConfig builtin = builtin_of(problem);

  FakeSweep sweep;
  TuneOptions options;
  options.max_candidates = 4;
  options.run_sweep = sweep.runner();
  std::vector<flashgen::TunePlan> plans;
  options.on_plan = [&](const flashgen::TunePlan& plan) { plans.push_back(plan); };

  const TuneResult swept = flashgen::tune(problem, store, device, 80, options);
  CHECK_FALSE(swept.from_store());
  REQUIRE(sweep.calls.size() == 1);
  REQUIRE(plans.size() == 1);
  // The capped space, the built-in choice first, and the built-in re-timed with the fastest.
  REQUIRE(sweep.calls[0].size() == 4);
  CHECK(sweep.calls[0][0] == builtin);
  CHECK(plans[0].builtin == builtin);
  CHECK(plans[0].candidates == sweep.calls[0]);
  CHECK(sweep.always_retime == std::vector<std::string>{builtin.name()});
  CHECK(swept.key == flashgen::problem_key(problem));
  CHECK(swept.winner == sweep.calls[0].back());
  CHECK(swept.winner_ms == 0.25);
  // The built-in choice is the incumbent here (no stored or shipped winner): the fastest beats it beyond the noise.
  CHECK(swept.decision == "fastest (fake); 300.0% faster than the incumbent (built-in choice, " + builtin.name() +
                              "), beyond the noise (1.0%)");
  CHECK(swept.incumbent.incumbent == builtin.name());
  CHECK(swept.incumbent.margin == Approx(3.0));
  CHECK(swept.candidates.size() == 4);
  REQUIRE(swept.builtin_row() != nullptr);
  CHECK(swept.builtin_row()->median_ms == 1.0);

  // Stored: the winner and every row.
  const auto stored = store.lookup_exact(device, swept.key);
  REQUIRE(stored.has_value());
  CHECK(stored->config == swept.winner);
  CHECK(store.candidates(device, swept.key).size() == 4);
  const auto decided = store.decision(device, swept.key);
  REQUIRE(decided.has_value());
  CHECK(decided->decision == swept.decision);
  CHECK(decided->incumbent_source == "built-in choice");

  // Again: the store answers, nothing is planned or swept.
  const TuneResult found = flashgen::tune(problem, store, device, 80, options);
  CHECK(found.from_store());
  CHECK(found.winner == swept.winner);
  CHECK(found.winner_ms == 0.25);
  CHECK(found.candidates.empty());
  CHECK(found.builtin_row() == nullptr);
  CHECK(sweep.calls.size() == 1);
  CHECK(plans.size() == 1);

  // Forced, or on another device: swept again.
  options.force = true;
  CHECK_FALSE(flashgen::tune(problem, store, device, 80, options).from_store());
  CHECK(sweep.calls.size() == 2);
  options.force = false;
  CHECK_FALSE(flashgen::tune(problem, store, flashgen::fingerprint_for_arch(90), 80, options).from_store());
  CHECK(sweep.calls.size() == 3);
}

TEST_CASE("a tune whose sweep fails stores nothing", "[tuner][tune][nvrtc]") {
  const flashgen::testing::TempDir dir("flashgen-tune-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(80);
  const AttentionProblem problem = backward_problem();
  TuneOptions options;
  options.max_candidates = 2;
  options.run_sweep = [](const AttentionProblem&, const std::vector<TunedConfig>&, const SweepOptions&) -> SweepResult {
    flashgen::fail(flashgen::Status::kInvalidArgument, "no candidate compiled, ran and matched the reference");
  };
  CHECK_THROWS_WITH(flashgen::tune(problem, store, device, 80, options), Catch::Contains("no candidate compiled"));
  CHECK_FALSE(store.has(device, flashgen::problem_key(problem)));
}

TEST_CASE("named candidates are swept as given, and must be configs of the problem", "[tuner][tune][nvrtc]") {
  const AttentionProblem problem = backward_problem();
  const flashgen::ProblemKey key = flashgen::problem_key(problem);
  const BwdConfig builtin = builtin_of(problem);
  const flashgen::BackwardSpaceReport space =
      flashgen::backward_space(DType::kFloat16, 64, MaskKind::kNone, false, 80);
  std::vector<std::string> names;
  for (const BwdConfig& c : space.valid)
    if (c != builtin && names.size() < 2) names.push_back(c.name());
  REQUIRE(names.size() == 2);

  TuneOptions options;
  options.named = flashgen::configs_of_problem({names[1], names[0]}, key);
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 80, options);
  REQUIRE(plan.candidates.size() == 2);
  CHECK(flashgen::config_name(plan.candidates[0]) == names[1]);
  CHECK(flashgen::config_name(plan.candidates[1]) == names[0]);
  CHECK(plan.builtin == builtin);  // named or not, the plan knows the built-in choice

  const flashgen::testing::TempDir dir("flashgen-tune-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  FakeSweep sweep;
  options.run_sweep = sweep.runner();
  const TuneResult result = flashgen::tune(problem, store, flashgen::fingerprint_for_arch(80), 80, options);
  // Swept as given, with the incumbent (here the built-in choice) added last: a named sweep re-times it too.
  REQUIRE(sweep.calls[0].size() == 3);
  CHECK(flashgen::config_name(sweep.calls[0][0]) == names[1]);
  CHECK(flashgen::config_name(sweep.calls[0][1]) == names[0]);
  CHECK(sweep.calls[0][2] == builtin);
  CHECK(result.builtin_row() != nullptr);
  CHECK(result.winner == builtin);  // the fake's last candidate is its fastest

  using Catch::Contains;
  CHECK_THROWS_WITH(flashgen::configs_of_problem({"fwd_sm80_fp16_d64_m128_n64_w4_s2"}, key),
                    Contains("is a forward config; this problem tunes the backward"));
  BwdConfig deterministic = builtin;
  deterministic.deterministic = true;
  CHECK_THROWS_WITH(flashgen::configs_of_problem({deterministic.name()}, key),
                    Contains("is not a config of the problem bwd|fp16|d64|none"));
  // A config without the problem's score modifiers is not one of its configs either (nor one with them of a
  // plain problem).
  flashgen::ProblemKey biased = key;
  biased.mods.alibi = true;
  CHECK_THROWS_WITH(flashgen::configs_of_problem({builtin.name()}, biased), Contains("is not a config of the problem"));
  BwdConfig with_alibi = builtin;
  with_alibi.mods.alibi = true;
  CHECK(flashgen::configs_of_problem({with_alibi.name()}, biased).size() == 1);
  CHECK_THROWS_WITH(flashgen::configs_of_problem({with_alibi.name()}, key), Contains("is not a config of the problem"));
  CHECK_THROWS_WITH(flashgen::configs_of_problem({"xyz"}, flashgen::problem_key(flashgen::AttentionProblem{})),
                    Contains("config name 'xyz'"));
  CHECK_THROWS_WITH(flashgen::configs_of_problem({builtin.name()},
                                                 flashgen::problem_key(flashgen::AttentionProblem{})),
                    Contains("is a backward config; this problem tunes the forward"));
  // A parsed config of another problem is refused by the plan too.
  options.named = {TunedConfig(deterministic)};
  CHECK_THROWS_AS(flashgen::plan_tune(problem, 80, options), flashgen::Error);
}

TEST_CASE("a plan caps the space around the built-in choice, as a dry run lists it", "[tuner][tune][nvrtc]") {
  const AttentionProblem problem = backward_problem();
  TuneOptions options;
  options.max_candidates = 3;
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 80, options);
  const flashgen::BackwardSpaceReport space =
      flashgen::backward_space(DType::kFloat16, 64, MaskKind::kNone, false, 80);
  const std::vector<BwdConfig> capped = flashgen::capped_candidates(space, builtin_of(problem), 3);
  REQUIRE(plan.candidates.size() == capped.size());
  for (size_t i = 0; i < capped.size(); ++i) CHECK(plan.candidates[i] == capped[i]);
  CHECK(plan.space.total == space.total);
  CHECK(plan.space.pruned == space.pruned);
  CHECK(plan.space.valid == space.valid.size());
  CHECK(plan.space.pruned_by_reason == space.pruned_by_reason);
  CHECK(plan.key == flashgen::problem_key(problem));
}

TEST_CASE("sweep progress reaches a callback as events or as lines", "[tuner][tune]") {
  flashgen::SweepProgress timed;
  timed.phase = flashgen::SweepPhase::kTimed;
  timed.index = 1;
  timed.count = 5;
  timed.config = "fwd_sm80_fp16_d64_m128_n64_w4_s2";
  timed.status = flashgen::CandidateStatus::kOk;
  timed.median_ms = 0.0412;
  CHECK(flashgen::progress_line(timed) == "[2/5] fwd_sm80_fp16_d64_m128_n64_w4_s2: 0.0412 ms");
  flashgen::SweepProgress wrong = timed;
  wrong.phase = flashgen::SweepPhase::kChecked;
  wrong.status = flashgen::CandidateStatus::kWrongResult;
  wrong.detail = "max abs error 0.5 on sampled rows\nsecond line";
  CHECK(flashgen::progress_line(wrong) ==
        "[2/5] fwd_sm80_fp16_d64_m128_n64_w4_s2: wrong_result (max abs error 0.5 on sampled rows)");

  std::vector<flashgen::SweepPhase> phases;
  std::vector<std::string> lines;
  SweepOptions options;
  CHECK_FALSE(options.progress);
  options.progress = [&](const flashgen::SweepProgress& event) { phases.push_back(event.phase); };
  options.progress(timed);
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  options.progress(wrong);
  CHECK(phases == std::vector<flashgen::SweepPhase>{flashgen::SweepPhase::kTimed});
  CHECK(lines == std::vector<std::string>{flashgen::progress_line(wrong)});
}

TEST_CASE("a packed problem plans its varlen kernels around the built-in packed choice", "[tuner][tune][varlen][nvrtc]") {
  AttentionProblem problem = backward_problem();
  problem.varlen = true;
  problem.total_q = problem.total_k = 1500;
  TuneOptions options;
  options.max_candidates = 3;
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 80, options);
  CHECK(plan.key.id().rfind("bwd_varlen|", 0) == 0);
  CHECK(plan.builtin ==
        flashgen::heuristic_backward_choice(DType::kFloat16, 64, MaskKind::kNone, false, 80, false, true).config);
  REQUIRE(plan.candidates.size() == 3);
  for (const TunedConfig& c : plan.candidates) CHECK(std::get<BwdConfig>(c).varlen);

  problem.total_q = 100;  // less than its longest sequence
  CHECK_THROWS_WITH(flashgen::plan_tune(problem, 80, options), Catch::Contains("must hold its longest sequences"));
}

TEST_CASE("a packed forward over pages plans the paged kernels its page size keys", "[tuner][tune][varlen][nvrtc]") {
  AttentionProblem problem = backward_problem();
  problem.pass = flashgen::Pass::kForward;
  problem.shape.head_dim = 128;
  problem.varlen = true;
  problem.total_q = problem.total_k = 1500;
  problem.paged = true;
  problem.page_size = 64;
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 90, TuneOptions{});
  CHECK(plan.key.id().rfind("fwd_varlen_paged64|fp16|d128|none|", 0) == 0);
  const KernelConfig& builtin = std::get<KernelConfig>(plan.builtin);
  CHECK((builtin.varlen && builtin.paged));
  CHECK_FALSE(builtin.invalid_reason(90));
  // The whole packed space read through pages, less the tiles whose consumers the paged producer leaves too few
  // registers (d128 with 192 keys).
  TuneOptions contiguous_options;
  AttentionProblem contiguous = problem;
  contiguous.paged = false, contiguous.page_size = 0;
  const flashgen::TunePlan contiguous_plan = flashgen::plan_tune(contiguous, 90, contiguous_options);
  size_t paged_valid = 0, wide = 0;
  for (const TunedConfig& c : contiguous_plan.candidates) {
    KernelConfig paged = std::get<KernelConfig>(c);
    paged.paged = true;
    if (paged.invalid_reason(90)) {
      wide += paged.block_n == 192;
    } else {
      ++paged_valid;
    }
  }
  CHECK(wide > 0);
  CHECK(plan.candidates.size() == paged_valid);
  for (const TunedConfig& c : plan.candidates) {
    const KernelConfig& config = std::get<KernelConfig>(c);
    INFO(config.name());
    CHECK((config.varlen && config.paged));
    CHECK_FALSE(config.invalid_reason(90));
    CHECK(flashgen::of_problem(c, plan.key));
  }
  // A contiguous packed config is not one of the paged class's.
  CHECK_FALSE(flashgen::of_problem(contiguous_plan.builtin, plan.key));
}

TEST_CASE("a soft-capped problem's plan sweeps soft-capped kernels around its own built-in choice",
          "[tuner][tune][nvrtc]") {
  for (bool backward : {false, true}) {
    AttentionProblem problem = backward_problem();
    if (!backward) problem.pass = flashgen::Pass::kForward;
    problem.softcap = 30.f;
    TuneOptions options;
    options.max_candidates = 4;
    const flashgen::TunePlan plan = flashgen::plan_tune(problem, 90, options);
    CHECK(plan.key.mods.softcap);
    REQUIRE_FALSE(plan.candidates.empty());
    for (const flashgen::TunedConfig& c : plan.candidates) {
      INFO(flashgen::config_name(c));
      CHECK(flashgen::config_name(c).find("_softcap") != std::string::npos);
    }
    CHECK(flashgen::config_name(plan.builtin).find("_softcap") != std::string::npos);
  }
}

TEST_CASE("a window problem is tuned per window bucket, its sweep running the problem's own window",
          "[tuner][tune][nvrtc][window]") {
  const flashgen::testing::TempDir dir("flashgen-tune-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(80);
  AttentionProblem problem = backward_problem();
  problem.pass = flashgen::Pass::kForward;
  problem.set_mask(flashgen::Mask::kSlidingWindow, 255, 0);
  std::vector<std::pair<int, int>> swept_windows;
  TuneOptions options;
  options.max_candidates = 3;
  options.run_sweep = [&](const AttentionProblem& p, const std::vector<TunedConfig>& candidates,
                          const SweepOptions& sweep) {
    swept_windows.emplace_back(p.window_left, p.window_right);
    FakeSweep fake;
    return fake.runner()(p, candidates, sweep);
  };
  const TuneResult swept = flashgen::tune(problem, store, device, 80, options);
  CHECK(swept.key.id() == "fwd|fp16|d64|window|g4|q1024|k1024|bh16|w256c");
  CHECK(swept_windows == std::vector<std::pair<int, int>>{{255, 0}});
  REQUIRE(swept.plan.candidates.size() == 3);
  for (const TunedConfig& c : swept.plan.candidates) {
    INFO(flashgen::config_name(c));
    CHECK(std::get<flashgen::KernelConfig>(c).mask == MaskKind::kWindow);
  }
  CHECK(std::get<flashgen::KernelConfig>(swept.plan.builtin).mask == MaskKind::kWindow);
  // Another window of the same bucket and shape is the stored one; a two-sided one is a bucket of its own.
  problem.set_mask(flashgen::Mask::kSlidingWindow, 200, 0);
  CHECK(flashgen::tune(problem, store, device, 80, options).from_store());
  problem.set_mask(flashgen::Mask::kSlidingWindow, 127, 128);
  const TuneResult two_sided = flashgen::tune(problem, store, device, 80, options);
  CHECK_FALSE(two_sided.from_store());
  CHECK(two_sided.key.id() == "fwd|fp16|d64|window|g4|q1024|k1024|bh16|w256");
  CHECK(swept_windows.back() == std::pair<int, int>{127, 128});
}


namespace {

// A sweep of given times and spreads by config name (every other candidate at 10 ms), the fastest named its winner;
// statuses by name make a candidate fail.
flashgen::SweepRunner timed_sweep(std::map<std::string, std::pair<double, double>> times,
                                  std::map<std::string, flashgen::CandidateStatus> statuses,
                                  std::vector<std::vector<TunedConfig>>& calls, std::vector<std::string>& retimed) {
  return [=, &calls, &retimed](const AttentionProblem& p, const std::vector<TunedConfig>& candidates,
                                 const SweepOptions& options) {
    calls.push_back(candidates);
    retimed = options.always_retime;
    SweepResult result;
    result.problem = flashgen::problem_key(p);
    const CandidateResult* fastest = nullptr;
    for (const TunedConfig& c : candidates) {
      CandidateResult row;
      row.config = c;
      const std::string name = flashgen::config_name(c);
      const auto status = statuses.find(name);
      if (status != statuses.end()) {
        row.status = status->second;
        row.detail = "max abs error 0.5";
      } else {
        const auto time = times.find(name);
        row.median_ms = time != times.end() ? time->second.first : 10.0;
        row.spread = time != times.end() ? time->second.second : 0.01;
        row.samples = 20;
      }
      result.candidates.push_back(row);
    }
    for (const CandidateResult& row : result.candidates)
      if (row.status == flashgen::CandidateStatus::kOk && (fastest == nullptr || row.median_ms < fastest->median_ms))
        fastest = &row;
    result.winner = fastest->config;
    result.winner_ms = fastest->median_ms;
    result.decision = "fastest";
    return result;
  };
}

}  // namespace

TEST_CASE("the fastest replaces the incumbent only when faster beyond the measured noise", "[tuner][tune][nvrtc]") {
  const AttentionProblem problem = backward_problem();
  const BwdConfig builtin = builtin_of(problem);
  TuneOptions options;
  options.max_candidates = 4;
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 80, options);
  const std::string other = flashgen::config_name(plan.candidates.back());
  REQUIRE(other != builtin.name());
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(80);
  std::vector<std::vector<TunedConfig>> calls;
  std::vector<std::string> retimed;

  SECTION("within the noise: the incumbent stays") {
    const flashgen::testing::TempDir dir("flashgen-tune-test");
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    // 2% faster with spreads of 3% and 5%: within their mean spread (4%).
    options.run_sweep = timed_sweep({{builtin.name(), {1.0, 0.03}}, {other, {1.0 / 1.02, 0.05}}}, {}, calls, retimed);
    const TuneResult result = flashgen::tune(problem, store, device, 80, options);
    CHECK(result.winner == builtin);
    CHECK(result.winner_ms == 1.0);
    CHECK(result.incumbent.margin == 0);
    CHECK(result.decision == "kept the incumbent (built-in choice, " + builtin.name() + "): the fastest, " + other +
                                 ", was 2.0% faster, within the noise (4.0%)");
    CHECK(store.lookup_exact(device, result.key)->config == builtin);
    CHECK(store.decision(device, result.key)->decision == result.decision);
    CHECK(retimed == std::vector<std::string>{builtin.name()});
  }
  SECTION("beyond the noise: the fastest replaces it, the margin stored") {
    const flashgen::testing::TempDir dir("flashgen-tune-test");
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    options.run_sweep = timed_sweep({{builtin.name(), {1.0, 0.01}}, {other, {0.8, 0.01}}}, {}, calls, retimed);
    const TuneResult result = flashgen::tune(problem, store, device, 80, options);
    CHECK(flashgen::config_name(result.winner) == other);
    CHECK(result.incumbent.margin == Approx(0.25));
    CHECK(store.decision(device, result.key)->margin == Approx(0.25));
    CHECK_THAT(result.decision, Catch::Contains("25.0% faster than the incumbent (built-in choice"));
  }
  SECTION("an incumbent that fails its check loses to the fastest") {
    const flashgen::testing::TempDir dir("flashgen-tune-test");
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    options.run_sweep = timed_sweep({{other, {0.99, 0.01}}}, {{builtin.name(), flashgen::CandidateStatus::kWrongResult}},
                                    calls, retimed);
    const TuneResult result = flashgen::tune(problem, store, device, 80, options);
    CHECK(flashgen::config_name(result.winner) == other);
    CHECK_THAT(result.decision, Catch::Contains("the incumbent (built-in choice, " + builtin.name() + ") failed"));
  }
}

TEST_CASE("the incumbent is the stored winner on a forced re-tune, else the shipped defaults'", "[tuner][tune][nvrtc]") {
  const AttentionProblem problem = backward_problem();
  const BwdConfig builtin = builtin_of(problem);
  TuneOptions options;
  options.max_candidates = 2;
  const flashgen::TunePlan plan = flashgen::plan_tune(problem, 80, options);
  // A valid config of the problem outside the capped plan.
  const flashgen::BackwardSpaceReport space =
      flashgen::backward_space(DType::kFloat16, 64, MaskKind::kNone, false, 80);
  std::optional<BwdConfig> outside;
  for (const BwdConfig& c : space.valid)
    if (std::none_of(plan.candidates.begin(), plan.candidates.end(), [&](const TunedConfig& t) { return t == c; }))
      outside = c;
  REQUIRE(outside.has_value());
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(80);
  const flashgen::ProblemKey key = flashgen::problem_key(problem);
  std::vector<std::vector<TunedConfig>> calls;
  std::vector<std::string> retimed;
  // The stored or shipped winner is as fast as the plan's fastest within the noise: it stays.
  options.run_sweep = timed_sweep({{outside->name(), {1.0, 0.01}}, {flashgen::config_name(plan.candidates.back()),
                                                                     {0.995, 0.01}}}, {}, calls, retimed);

  SECTION("a forced re-tune: the store's exact bucket") {
    const flashgen::testing::TempDir dir("flashgen-tune-test");
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    CandidateResult row;
    row.config = *outside;
    row.median_ms = 1.0;
    store.record(device, key, {row}, *outside, 1.0);
    options.force = true;
    const TuneResult result = flashgen::tune(problem, store, device, 80, options);
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].size() == plan.candidates.size() + 1);
    CHECK(calls[0].back() == *outside);
    CHECK(retimed == std::vector<std::string>{builtin.name(), outside->name()});
    CHECK(result.incumbent.incumbent_source == "tuning database " + store.path().string());
    CHECK(result.winner == *outside);
  }
  SECTION("a new bucket: the store's nearest bucket of the class") {
    const flashgen::testing::TempDir dir("flashgen-tune-test");
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    AttentionProblem longer = problem;
    longer.shape.seqlen_q = longer.shape.seqlen_k = 8192;
    const flashgen::ProblemKey longer_key = flashgen::problem_key(longer);
    REQUIRE(longer_key.id() != key.id());
    CandidateResult row;
    row.config = *outside;
    row.median_ms = 1.0;
    store.record(device, longer_key, {row}, *outside, 1.0);
    const TuneResult result = flashgen::tune(problem, store, device, 80, options);
    CHECK(calls[0].back() == *outside);
    CHECK(result.incumbent.incumbent_source ==
          "tuning database " + store.path().string() + ", nearest bucket " + longer_key.id());
    CHECK(result.winner == *outside);
  }
  SECTION("the shipped defaults' winner for this GPU") {
    const flashgen::testing::TempDir dir("flashgen-tune-test");
    std::string shipped_text;
    {
      flashgen::TuningStore source(dir.path() / "shipped.sqlite");
      CandidateResult row;
      row.config = *outside;
      row.median_ms = 1.0;
      source.record(device, key, {row}, *outside, 1.0);
      shipped_text = source.export_json().dump();
    }
    const flashgen::ShippedDefaults shipped = flashgen::ShippedDefaults::from_files({{"test.json", shipped_text}});
    options.shipped = &shipped;
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    const TuneResult result = flashgen::tune(problem, store, device, 80, options);
    CHECK(calls[0].back() == *outside);
    CHECK(result.incumbent.incumbent_source == "shipped defaults test.json");
    CHECK(result.winner == *outside);
    CHECK_THAT(result.decision, Catch::StartsWith("kept the incumbent (shipped defaults test.json"));
  }
}
