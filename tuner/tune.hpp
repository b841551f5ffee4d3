// The one tuning orchestrator: look a problem's bucket up in the store, else sweep the capped search space
// around the built-in choice, store every row and the winner. `flashgen tune`, flashgen_tune_forward and
// tune-on-first-use (dispatch/select.cpp) all call tune(); a dry run lists plan_tune()'s candidates.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tuner/problem_key.hpp"
#include "tuner/shipped.hpp"
#include "tuner/store.hpp"
#include "tuner/sweep.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen {

// Configs given by name for a problem of key's class: each parsed and checked against the key's pass,
// dtype, head_dim and mask. Throws Error(kInvalidArgument) naming the config and what is wrong with it.
std::vector<TunedConfig> configs_of_problem(const std::vector<std::string>& names, const ProblemKey& key);

// How the search space of a plan was pruned (BasicSpaceReport's counts, for either pass).
struct SpaceCounts {
  int total = 0;
  int pruned = 0;
  std::map<std::string, int> pruned_by_reason;
  size_t valid = 0;
};

// What a sweep of the problem would time on sm_<arch>.
struct TunePlan {
  ProblemKey key;
  TunedConfig builtin;                  // heuristic_choice / heuristic_backward_choice / heuristic_decode_choice
  SpaceCounts space;                    // the pass's whole space on sm_<arch>
  int multiprocessors = 0;              // KV-cache problems: the SMs the split counts are planned for
  std::vector<TunedConfig> candidates;  // the named configs, else capped_candidates (the built-in first)
};

// Runs one sweep of candidates (all of problem's pass) and returns its result. tune's default sweeps on the
// current context's device with sweep_forward, sweep_backward or sweep_decode, on a stream of its own; tests
// pass a fake.
using SweepRunner =
    std::function<SweepResult(const AttentionProblem&, const std::vector<TunedConfig>&, const SweepOptions&)>;

struct TuneOptions {
  bool force = false;  // sweep even when the store holds the problem's exact bucket for the device
  // The most candidates a sweep of the space times (capped_candidates: the built-in choice, its one-knob
  // neighbours, then others spread evenly).
  size_t max_candidates = std::numeric_limits<size_t>::max();
  std::vector<TunedConfig> named;  // swept instead of the space when not empty (configs_of_problem)
  // KV-cache problems: the SMs their split counts are planned for; 0 for the current context's device.
  int multiprocessors = 0;
  // Timing, re-timing, crash isolation and the per-candidate progress callback. tune adds the built-in
  // choice and the incumbent to always_retime, so their times rest on the same interleaved timings as the
  // winner's.
  SweepOptions sweep;
  std::function<void(const TunePlan&)> on_plan;  // called with the plan once it is made, before the sweep
  SweepRunner run_sweep;                         // empty: the real sweep of the pass
  // Where the incumbent may come from besides the store and the built-in choice; null: the embedded shipped
  // defaults (ShippedDefaults::instance()).
  const ShippedDefaults* shipped = nullptr;
};

struct TuneResult {
  ProblemKey key;
  // Set when the store already held the exact bucket (and options.force was not): its winner, and nothing
  // was swept or stored. Otherwise what follows comes from the sweep, now stored.
  std::optional<StoredChoice> stored;
  TunePlan plan;
  std::vector<CandidateResult> candidates;  // every candidate's row, in plan order
  TunedConfig winner;
  double winner_ms = 0;
  std::string decision;  // how the winner was named ("stored winner" when it came from the store)
  // The choice the sweep's winner would replace (what the run-time choice ran before it: the store's exact
  // bucket on a forced re-tune or its nearest one, the shipped defaults, else the built-in choice), swept and
  // re-timed with the fastest; the winner replaces it only when faster beyond the measured noise. Stored with
  // the winner.
  WinnerDecision incumbent;

  bool from_store() const { return stored.has_value(); }
  // The built-in choice's row, or null when it was not among the candidates (or nothing was swept).
  const CandidateResult* builtin_row() const;
};

// The candidate list a tune of problem would sweep on sm_<arch> (compiles the built-in choices through the
// kernel registry's caches to see which spill; needs no GPU, except for a KV-cache problem with
// options.multiprocessors 0). Uses options.max_candidates, options.named and options.multiprocessors.
TunePlan plan_tune(const AttentionProblem& problem, int arch, const TuneOptions& options);

// Looks problem's exact bucket up in store for device unless options.force; otherwise plans on sm_<arch>,
// sweeps the candidates and the incumbent, keeps the incumbent unless the fastest beats it beyond the noise
// (keep_or_replace), and records every row, the winner and the decision in store. Throws what the sweep or the
// store throws (Error(kInvalidArgument) when no candidate passes), storing nothing then.
TuneResult tune(const AttentionProblem& problem, TuningStore& store, const DeviceFingerprint& device, int arch,
                const TuneOptions& options);

// The never-regress rule on a finished sweep: the fastest row (swept.winner) replaces the incumbent's row only
// when incumbent_ms / winner_ms - 1 exceeds the noise, the larger of tie_tolerance and the two rows' mean spread;
// otherwise the incumbent stays the winner. An incumbent that failed or was not timed loses to the fastest.
// Updates swept's winner and decision and fills decision's text and margin (incumbent and its source are the
// caller's).
void keep_or_replace(SweepResult& swept, const std::string& incumbent_name, double tie_tolerance,
                     WinnerDecision& decision);

}  // namespace flashgen
