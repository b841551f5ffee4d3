// [gpu] A small forward sweep: every candidate is checked and timed, a winner is named, stored in a
// TuningStore and found again.
#include <string>

#include "catch.hpp"
#include "cuda_driver.hpp"
#include "gpu.hpp"
#include "heuristic.hpp"
#include "select.hpp"
#include "store.hpp"
#include "support/temp_dir.hpp"
#include "sweep.hpp"

TEST_CASE("a small forward sweep names, stores and finds a winner", "[gpu][tuner][sweep]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());

  flashgen::ForwardSweepProblem problem;
  problem.head_dim = 64;
  problem.mask = FLASHGEN_MASK_CAUSAL;
  problem.batch = 2;
  problem.heads_q = 8;
  problem.heads_kv = 2;
  problem.seqlen_q = 777;
  problem.seqlen_k = 1024;

  std::vector<flashgen::KernelConfig> candidates;
  for (auto [m, n, w, s] : {std::array{128, 64, 4, 3}, {128, 32, 4, 2}, {64, 64, 4, 2}, {128, 64, 8, 2}}) {
    flashgen::KernelConfig c;
    c.head_dim = 64;
    c.mask = flashgen::MaskKind::kCausal;
    c.block_m = m, c.block_n = n, c.warps = w, c.stages = s;
    candidates.push_back(c);
  }
  flashgen::SweepOptions options;
  options.timing.min_samples = 5;
  options.timing.max_samples = 20;
  options.retime_rounds = 5;
  std::vector<std::string> lines;
  options.progress = [&](const std::string& line) { lines.push_back(line); };

  const flashgen::SweepResult result = flashgen::sweep_forward(problem, candidates, nullptr, options);
  REQUIRE(result.candidates.size() == candidates.size());
  bool winner_listed = false;
  for (const auto& c : result.candidates) {
    INFO(flashgen::config_name(c.config) << ": " << c.status << " " << c.detail);
    CHECK(c.status == "ok");
    CHECK(c.median_ms > 0);
    CHECK(c.samples >= 5);
    winner_listed |= c.config == result.winner;
  }
  CHECK(winner_listed);
  CHECK(result.winner_ms > 0);
  CHECK_FALSE(result.decision.empty());
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
  const flashgen::ForwardChoice choice = flashgen::choose_forward_config(device, result.problem, arch, &store);
  CHECK(choice.config == result.winner);
  CHECK(choice.reason.find("exact bucket") != std::string::npos);
}
