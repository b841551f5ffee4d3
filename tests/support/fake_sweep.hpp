// A tuning sweep that runs nothing, for tests of tune() without a GPU: every candidate passes, the later in
// the list the faster (candidate i takes 1 / (i + 1) ms), so the last one wins. It keeps what each call was given.
#pragma once

#include <string>
#include <vector>

#include "tuner/sweep.hpp"
#include "tuner/tune.hpp"

namespace flashgen::testing {

struct FakeSweep {
  std::vector<std::vector<TunedConfig>> calls;
  std::vector<std::string> always_retime;

  SweepRunner runner() {
    return [this](const AttentionProblem& problem, const std::vector<TunedConfig>& candidates,
                  const SweepOptions& options) {
      calls.push_back(candidates);
      always_retime = options.always_retime;
      SweepResult result;
      result.problem = problem_key(problem);
      for (size_t i = 0; i < candidates.size(); ++i) {
        CandidateResult row;
        row.config = candidates[i];
        row.median_ms = 1.0 / static_cast<double>(i + 1);
        row.samples = 10;
        result.candidates.push_back(row);
      }
      result.winner = candidates.back();
      result.winner_ms = result.candidates.back().median_ms;
      result.decision = "fastest (fake)";
      return result;
    };
  }
};

}  // namespace flashgen::testing
