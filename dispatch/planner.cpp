// The planner's steps (planner.hpp), each a function that runs once per plan and appends its reason; plan_call runs
// them top to bottom.
#include "dispatch/planner.hpp"

#include <utility>

#include "flashgen/error.hpp"
#include "tuner/decode_choice.hpp"

namespace flashgen {

namespace {

bool tuned(ChoiceSource source) {
  return source == ChoiceSource::kTuningDatabase || source == ChoiceSource::kTunedOnFirstUse;
}

// Step 1. The data sources' stored winner for the call's key, else the built-in choice: the heuristic's first
// candidate spilling at most what the rule allows. A call with a user variant takes the variant's own tuning data
// (its key carries the variant's tag), else its base class's choice, which is not the variant's own bucket (so
// tune-on-first-use still tunes the variant).
template <class Choice>
Plan<Choice> stored_or_builtin(const AttentionProblem& problem, const PlanSources<Choice>& sources) {
  ProblemKey key = problem_key(problem);
  SourcesAnswer<Choice> answer = sources.choose(key);
  const bool variant_timed = !key.user_tag.empty() && answer.stored && tuned(answer.stored->source);
  if (key.user_tag.empty() || variant_timed) {
    Plan<Choice> plan{resolve(answer, sources.spilled_bytes, sources.arch)};
    plan.variant_timed = variant_timed;
    return plan;
  }
  key.user_tag.clear();  // resolved once, for the base class: the variant's own answer holds no tuned winner
  Plan<Choice> plan{resolve(sources.choose(key), sources.spilled_bytes, sources.arch)};
  Choice& choice = plan.choice;
  choice.exact_bucket = false;
  if (choice.source == ChoiceSource::kTunedOnFirstUse) choice.source = ChoiceSource::kTuningDatabase;
  choice.reason = "its base class's choice: " + choice.reason;
  return plan;
}

// Step 2. Where tune-on-first-use is on and neither the user's database holds the problem's own bucket (a
// neighbour's winner is only a stand-in) nor this process has tuned it, the sweep's winner replaces the choice, or
// the choice is kept with the failure's cause in its reason. A packed or KV-cache call with a user variant keeps its
// base class's choice: their sweeps do not take one.
template <class Choice>
void first_use_tune(const AttentionProblem& problem, const PlanSources<Choice>& sources, Plan<Choice>& plan) {
  if (!sources.tune || (problem.user != nullptr && user_key_tag(problem).empty())) return;
  if (sources.tuning_deferred) {
    plan.final = false;
    return;
  }
  const Choice& choice = plan.choice;
  if (choice.source == ChoiceSource::kTunedOnFirstUse ||
      (choice.source == ChoiceSource::kTuningDatabase && choice.exact_bucket)) {
    return;
  }
  std::string failure;
  if (std::optional<Choice> swept = sources.tune(&failure)) {
    plan.choice = std::move(*swept);
    plan.variant_timed = plan.variant_timed || problem.user != nullptr;
  } else {
    plan.choice.reason += "; tuning on first use failed: " + failure;
  }
}

// Step 2b. An FP8 forward's output type is the call's: its tiles are timed and stored for both (only the epilogue's
// conversion differs).
void output_type(const AttentionProblem& problem, ForwardChoice& choice) {
  if (problem.out_dtype && is_fp8(choice.config.dtype)) choice.config.out_dtype = problem.out_dtype;
}
void output_type(const AttentionProblem&, BackwardChoice&) {}

// Step 3. A packed forward over a paged cache reads keys and values through the block table: a paged config as it
// is, a contiguous one made paged where it can be (tuner/choice.hpp's read_through_pages).
template <class Call, class Choice>
void paged(const Call& call, const PlanSources<Choice>& sources, Choice& choice) {
  if (call.problem.paged && sources.read_through_pages) choice = sources.read_through_pages(std::move(choice));
}

// Step 4. A user variant's functions join the chosen tiles: as they are where they were timed with them, else the
// chosen tiles or, where those spill with the functions, the next of the base class's list that does not.
template <class Choice>
void with_user_variant(const AttentionProblem& problem, const PlanSources<Choice>& sources, bool variant_timed,
                       Choice& choice) {
  if (!problem.user) return;
  if (variant_timed) return compile_in_variant(choice, problem.user);
  const auto alternates = with_variant_candidates(choice, problem.user, sources.arch);
  keep_spill_free(choice, alternates, sources.spilled_bytes);
}

// The kTileCount fallback: the same tiles, one block each instead of a persistent walk (groups walk a persistent
// list too). Only the sm90 family has persistent kernels; the backward has none.
void without_persistence(KernelConfig& config) {
  Sm90Knobs* k = config.sm90();
  if (k == nullptr) {
    fail(Status::kInternal, "config " + config.name() + " reported too many tiles for a persistent walk");
  }
  k->persistent = false;
  k->groups = 1;
}

void without_persistence(BwdConfig& config) {
  fail(Status::kInternal, "backward config " + config.name() + " reported too many tiles for a persistent walk");
}

// Step 5. Until the chosen family can implement the call, the fallback for what it lacks. Where TMA cannot describe
// a tensor, the sm80 family's built-in choice (its first candidate that does not spill), fitted to the call as steps
// 3 and 4 fitted the choice: it uses no TMA and is never persistent, so each fallback removes its shortfall for good.
template <class Call, class Choice>
void fallbacks(const Call& call, const PlanSources<Choice>& sources, bool variant_timed, Choice& choice) {
  for (int step = 0; step < 3; ++step) {
    const Implementability answer = sources.can_implement(choice.config);
    switch (answer.shortfall) {
      case Shortfall::kNone:
      case Shortfall::kProblem:
      case Shortfall::kArch:
      case Shortfall::kGridLimit:
        return;  // none left, or none a fallback removes: the launcher reports it
      case Shortfall::kTmaLayout: {
        const auto candidates = sources.sm80_candidates();
        if (candidates.empty()) {  // the Hopper family's problems only (values of 512 columns)
          fail(Status::kUnsupported, "TMA cannot describe " + answer.reason + ", which " + choice.config.name() +
                                         " needs, and no sm80-family kernel takes the problem");
        }
        Choice fallback = builtin_choice(candidates, sources.spilled_bytes, sources.arch);
        paged(call, sources, fallback);
        with_user_variant(call.problem, sources, variant_timed, fallback);
        choice.reason += "; TMA cannot describe " + answer.reason + ", so the sm80 family's " + fallback.reason;
        choice.config = std::move(fallback.config);
        choice.source = fallback.source;
        break;
      }
      case Shortfall::kTileCount:
        without_persistence(choice.config);
        choice.reason += "; not persistent: too many tiles";
        break;
    }
  }
  fail(Status::kInternal, "no fallback lets a kernel family implement the problem with " + choice.config.name());
}

template <class Call, class Choice>
Plan<Choice> plan_pass(const Call& call, const PlanSources<Choice>& sources) {
  Plan<Choice> plan = stored_or_builtin(call.problem, sources);
  first_use_tune(call.problem, sources, plan);
  output_type(call.problem, plan.choice);
  paged(call, sources, plan.choice);
  with_user_variant(call.problem, sources, plan.variant_timed, plan.choice);
  fallbacks(call, sources, plan.variant_timed, plan.choice);
  return plan;
}

// KV-cache step 3: the call's requested split count, else the chosen one, each at most the key blocks its rows
// visit, so the reason names the count that runs.
DecodeChoice split_count(const KvCacheCall& call, DecodeChoice choice) {
  if (call.num_splits > 0) return with_requested_splits(std::move(choice), call.problem, call.num_splits);
  return with_visited_splits(std::move(choice), call.problem);
}

}  // namespace

Plan<ForwardChoice> plan_call(const ForwardCall& call, const PlanSources<ForwardChoice>& sources) {
  return plan_pass(call, sources);
}

// Backward step 6. A call that wants its sinks' gradient sums it over the chosen tiles' scores (never tuned over: the
// tiles are the class's without it), or, where those spill with it, over the next of the class's tiles that does not.
Plan<BackwardChoice> plan_call(const BackwardCall& call, const PlanSources<BackwardChoice>& sources) {
  Plan<BackwardChoice> plan = plan_pass(call, sources);
  if (call.problem.sink_grad) {
    const std::vector<BwdConfig> alternates = with_sink_grad_candidates(plan.choice, sources.arch);
    keep_spill_free(plan.choice, alternates, sources.spilled_bytes);
  }
  return plan;
}

DecodeChoice plan_call(const KvCacheCall& call, const std::function<DecodeChoice()>& choose) {
  DecodeChoice choice = choose();
  if (call.problem.user) compile_in_variant(choice, call.problem.user);  // the base class's choice, as it is
  return split_count(call, std::move(choice));
}

}  // namespace flashgen
