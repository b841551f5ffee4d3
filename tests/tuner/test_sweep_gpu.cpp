// [gpu] Small forward, backward and KV-cache sweeps: every candidate is checked and timed, a winner is named,
// stored in a TuningStore and found again.
#include <string>

#include "catch.hpp"
#include "dispatch/select.hpp"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/resolved_choice.hpp"
#include "support/temp_dir.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/space.hpp"
#include "tuner/store.hpp"
#include "tuner/sweep.hpp"

TEST_CASE("a small forward sweep names, stores and finds a winner", "[gpu][tuner][sweep]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());

  const flashgen::AttentionShape shape{/*batch=*/2, /*seqlen_q=*/777, /*seqlen_k=*/1024, /*heads_q=*/8, /*heads_kv=*/2,
                                      /*head_dim=*/64};
  const flashgen::AttentionProblem problem =
      flashgen::forward_problem(flashgen::DType::kFloat16, shape, flashgen::Mask::kCausal);

  std::vector<flashgen::KernelConfig> candidates;
  for (auto [m, n, w, s] : {std::array{128, 64, 4, 3}, {128, 32, 4, 2}, {64, 64, 4, 2}, {128, 64, 8, 2}}) {
    flashgen::KernelConfig c;
    c.head_dim = 64;
    c.mask = flashgen::MaskKind::kCausal;
    c.block_m = m, c.block_n = n, c.sm80()->warps = w, c.stages = s;
    candidates.push_back(c);
  }
  flashgen::SweepOptions options;
  options.timing.min_samples = 5;
  options.timing.max_samples = 20;
  options.retime_rounds = 5;
  options.retime_top = 1;
  options.always_retime = {candidates[2].name()};  // re-timed with the fastest whatever its first timing
  std::vector<std::string> lines;
  options.progress = [&](const std::string& line) { lines.push_back(line); };

  const flashgen::SweepResult result = flashgen::sweep_forward(problem, candidates, nullptr, options);
  REQUIRE(result.candidates.size() == candidates.size());
  bool winner_listed = false;
  for (const auto& c : result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
    CHECK(c.median_ms > 0);
    CHECK(c.samples >= 5);
    winner_listed |= c.config == result.winner;
  }
  CHECK(winner_listed);
  CHECK(result.winner_ms > 0);
  INFO("decision: " << result.decision);
  // Two re-timed: the fastest and candidates[2], unless that was the fastest (or they tie).
  CHECK((result.decision.find("top 1 and 1 always re-timed") != std::string::npos ||
         result.decision.find("2 candidates within") != std::string::npos ||
         (result.winner == flashgen::TunedConfig(candidates[2]) && result.decision.find("top 1") != std::string::npos)));
  CHECK(lines.size() >= candidates.size());
  CHECK(result.problem.id() == "fwd|fp16|d64|causal|g4|q1024|k1024|bh16");

  flashgen::testing::TempDir dir("flashgen-sweep-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::current_device_fingerprint(scope.device());
  store.record(device, result.problem, result.candidates, result.winner, result.winner_ms);
  const auto found = store.lookup_exact(device, result.problem);
  REQUIRE(found.has_value());
  CHECK(found->config == result.winner);
  CHECK(store.candidates(device, result.problem).size() == candidates.size());

  // The run-time choice takes the stored winner for this problem and its bucket neighbours.
  const flashgen::ForwardChoice choice =
      flashgen::testing::resolved(flashgen::choose_forward_config(device, result.problem, arch, &store), arch);
  CHECK(choice.config == result.winner);
  CHECK(choice.reason.find("exact bucket") != std::string::npos);
}

TEST_CASE("a small backward sweep names, stores and finds a winner, and the backward choice takes it",
          "[gpu][tuner][sweep][backward]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());

  const flashgen::AttentionShape shape{/*batch=*/2, /*seqlen_q=*/777, /*seqlen_k=*/1024, /*heads_q=*/8, /*heads_kv=*/2,
                                      /*head_dim=*/64};
  const flashgen::AttentionProblem problem =
      flashgen::backward_problem(flashgen::DType::kFloat16, shape, flashgen::Mask::kCausal, false);
  const flashgen::BackwardSpaceReport space =
      flashgen::backward_space(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kCausal, false, arch);
  const flashgen::BwdConfig builtin =
      flashgen::heuristic_backward_choice(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kCausal, false, arch).config;
  const std::vector<flashgen::BwdConfig> candidates = flashgen::capped_candidates(space, builtin, 4);
  REQUIRE(candidates.size() == 4);

  flashgen::SweepOptions options;
  options.timing.min_samples = 5;
  options.timing.max_samples = 20;
  options.retime_rounds = 5;
  const flashgen::SweepResult result = flashgen::sweep_backward(problem, candidates, nullptr, options);
  REQUIRE(result.candidates.size() == candidates.size());
  for (const auto& c : result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
    CHECK(c.median_ms > 0);
  }
  REQUIRE(std::holds_alternative<flashgen::BwdConfig>(result.winner));
  CHECK(result.problem.id() == "bwd|fp16|d64|causal|g4|q1024|k1024|bh16");

  flashgen::testing::TempDir dir("flashgen-sweep-backward-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::current_device_fingerprint(scope.device());
  store.record(device, result.problem, result.candidates, result.winner, result.winner_ms);
  const flashgen::BackwardChoice choice =
      flashgen::testing::resolved(flashgen::choose_backward_config(device, result.problem, arch, &store), arch);
  CHECK(choice.config == result.winner);
  CHECK(choice.source == flashgen::ChoiceSource::kTuningDatabase);

  // A broken candidate (a deterministic config in an atomic sweep) is refused before anything runs.
  flashgen::BwdConfig wrong = builtin;
  wrong.deterministic = true;
  CHECK_THROWS_AS(flashgen::sweep_backward(problem, {wrong}, nullptr, options), flashgen::Error);
}

TEST_CASE("a small KV-cache sweep checks every split count, and the decode choice takes its winner",
          "[gpu][tuner][sweep][decode]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const int sms = flashgen::device_traits(scope.device()).multiprocessors;

  // Two new tokens of three sequences against paged caches of 1000 keys (pages of 16, the last one part
  // full), GQA 4, causal: the float64 check runs two of the sequences.
  const flashgen::AttentionShape shape{/*batch=*/3, /*seqlen_q=*/2, /*seqlen_k=*/1000, /*heads_q=*/8, /*heads_kv=*/2,
                                      /*head_dim=*/64};
  flashgen::AttentionProblem problem =
      flashgen::forward_problem(flashgen::DType::kBFloat16, shape, flashgen::Mask::kCausal);
  problem.kv_cache = problem.paged = true;
  problem.page_size = 16;
  const flashgen::DecodeChoice builtin = flashgen::heuristic_decode_choice(problem, arch, sms);
  std::vector<flashgen::DecodeSplitConfig> candidates;
  for (int splits : {1, 3, 16}) candidates.push_back({builtin.config, splits});
  flashgen::DecodeConfig wide = builtin.config;
  wide.block_n = 128;
  candidates.push_back({wide, 5});

  flashgen::SweepOptions options;
  options.timing.min_samples = 5;
  options.timing.max_samples = 20;
  options.retime_rounds = 5;
  const flashgen::SweepResult result = flashgen::sweep_decode(problem, candidates, nullptr, options);
  REQUIRE(result.candidates.size() == candidates.size());
  for (const auto& c : result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
    CHECK(c.median_ms > 0);
  }
  REQUIRE(std::holds_alternative<flashgen::DecodeSplitConfig>(result.winner));
  CHECK(result.problem.id() == "dec_paged|bf16|d64|causal|g4|q2|k1024|bh32");

  flashgen::testing::TempDir dir("flashgen-sweep-decode-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::current_device_fingerprint(scope.device());
  store.record(device, result.problem, result.candidates, result.winner, result.winner_ms);
  const flashgen::DecodeChoice choice = flashgen::choose_decode_config(device, problem, arch, sms, &store);
  const auto& winner = std::get<flashgen::DecodeSplitConfig>(result.winner);
  CHECK(choice.config == winner.config);
  CHECK(choice.splits == winner.splits);
  CHECK(choice.source == flashgen::ChoiceSource::kTuningDatabase);

  // A contiguous-cache candidate in a paged sweep is refused before anything runs.
  flashgen::DecodeSplitConfig contiguous = candidates[0];
  contiguous.config.paged = false;
  CHECK_THROWS_AS(flashgen::sweep_decode(problem, {contiguous}, nullptr, options), flashgen::Error);
}

TEST_CASE("a KV-cache sweep of a window problem checks its candidates against the window's reference",
          "[gpu][tuner][sweep][decode][window]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const int sms = flashgen::device_traits(scope.device()).multiprocessors;
  // Two new tokens of two sequences against contiguous caches of 1000 keys, each row seeing the 100 keys before
  // its diagonal and up to 10 after: a reference of the whole cache would fail every candidate.
  const flashgen::AttentionShape shape{/*batch=*/2, /*seqlen_q=*/2, /*seqlen_k=*/1000, /*heads_q=*/8, /*heads_kv=*/2,
                                      /*head_dim=*/64};
  flashgen::AttentionProblem problem =
      flashgen::forward_problem(flashgen::DType::kBFloat16, shape, flashgen::Mask::kSlidingWindow, 100, 10);
  problem.kv_cache = true;
  const flashgen::DecodeConfig builtin = flashgen::heuristic_decode_choice(problem, arch, sms).config;
  flashgen::SweepOptions options;
  options.timing.min_samples = 5;
  options.timing.max_samples = 20;
  options.retime_rounds = 5;
  const flashgen::SweepResult result = flashgen::sweep_decode(problem, {{builtin, 1}, {builtin, 3}}, nullptr, options);
  for (const auto& c : result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
  }
  CHECK(result.problem.id() == "dec|bf16|d64|window|g4|q2|k1024|bh16|w128");
}

TEST_CASE("small packed-batch sweeps check sequences of every length and name a varlen winner",
          "[gpu][tuner][sweep][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  // Nine sequences of at most 600 queries and keys, 2,000 tokens in all (some of them empty), GQA 2, causal.
  const flashgen::AttentionShape shape{/*batch=*/9, /*seqlen_q=*/600, /*seqlen_k=*/600, /*heads_q=*/4, /*heads_kv=*/2,
                                      /*head_dim=*/64};
  flashgen::AttentionProblem forward =
      flashgen::forward_problem(flashgen::DType::kFloat16, shape, flashgen::Mask::kCausal);
  forward.varlen = true;
  forward.total_q = forward.total_k = 2000;
  flashgen::SweepOptions options;
  options.timing.min_samples = 5;
  options.timing.max_samples = 20;
  options.retime_rounds = 5;

  const flashgen::SpaceReport space = flashgen::packed_space(
      flashgen::forward_space(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kCausal, arch), arch);
  const flashgen::KernelConfig builtin =
      flashgen::heuristic_choice(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kCausal, arch, false, true).config;
  const std::vector<flashgen::KernelConfig> candidates = flashgen::capped_candidates(space, builtin, 3);
  const flashgen::SweepResult result = flashgen::sweep_forward(forward, candidates, nullptr, options);
  for (const auto& c : result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
  }
  CHECK(std::get<flashgen::KernelConfig>(result.winner).varlen);
  CHECK(result.problem.id() == "fwd_varlen|fp16|d64|causal|g2|q1024|k1024|bh64");
  // A dense config is refused before anything runs.
  CHECK_THROWS_AS(flashgen::sweep_forward(forward, {flashgen::heuristic_choice(flashgen::DType::kFloat16, 64,
                                                                                 flashgen::MaskKind::kCausal, arch)
                                                        .config},
                                          nullptr, options),
                  flashgen::Error);

  // Over a paged cache: the paged kernels, checked on pages whose rows no sequence owns hold NaN.
  flashgen::AttentionProblem paged = forward;
  paged.paged = true;
  paged.page_size = 48;
  flashgen::KernelConfig paged_builtin = builtin;
  paged_builtin.paged = true;
  const flashgen::SweepResult paged_result = flashgen::sweep_forward(
      paged, flashgen::capped_candidates(flashgen::paged_space(space, arch), paged_builtin, 3), nullptr, options);
  for (const auto& c : paged_result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
  }
  CHECK(std::get<flashgen::KernelConfig>(paged_result.winner).paged);
  CHECK(paged_result.problem.id() == "fwd_varlen_paged48|fp16|d64|causal|g2|q1024|k1024|bh64");
  // A contiguous packed config is refused before anything runs.
  CHECK_THROWS_AS(flashgen::sweep_forward(paged, {builtin}, nullptr, options), flashgen::Error);

  flashgen::AttentionProblem backward = forward;
  backward.pass = flashgen::Pass::kBackward;
  backward.dq = flashgen::DqStrategy::kDeterministic;
  const flashgen::BackwardSpaceReport bwd_space = flashgen::packed_space(
      flashgen::backward_space(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kCausal, true, arch), arch);
  const flashgen::BwdConfig bwd_builtin =
      flashgen::heuristic_backward_choice(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kCausal, true, arch, false,
                                          true)
          .config;
  const flashgen::SweepResult bwd = flashgen::sweep_backward(
      backward, flashgen::capped_candidates(bwd_space, bwd_builtin, 3), nullptr, options);
  for (const auto& c : bwd.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << flashgen::candidate_status_name(c.status) << " " << c.detail);
    CHECK(c.status == flashgen::CandidateStatus::kOk);
  }
  CHECK(bwd.problem.id() == "bwd_det_varlen|fp16|d64|causal|g2|q1024|k1024|bh64");
}
