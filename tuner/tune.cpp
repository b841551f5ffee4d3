// The tuning orchestrator: store look-up, the candidate plan around the one built-in choice, the sweep of
// either pass and the record of its rows and winner.
#include "tuner/tune.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"
#include "tuner/choice.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/space.hpp"

namespace flashgen {

namespace {

template <class Config>
SpaceCounts counts_of(const BasicSpaceReport<Config>& space) {
  return {space.total, space.pruned, space.pruned_by_reason, space.valid.size()};
}

// The candidates of a problem with score modifiers: the space's tiles with them compiled in.
template <class Config>
void with_score_mods(BasicSpaceReport<Config>& space, const ScoreMods& mods) {
  for (Config& c : space.valid) c.mods = mods;
}

// A user mask's candidates: the sm90 family's clusters share each key block between two tiles, which the mask may
// hide from one of them (attach_user_variant takes none either).
void without_clusters(SpaceReport& space) {
  space.valid.erase(std::remove_if(space.valid.begin(), space.valid.end(),
                                   [](const KernelConfig& c) { return c.sm90() != nullptr && c.sm90()->cluster != 1; }),
                    space.valid.end());
}

// The built-in choice of a problem with a user variant: what the run-time choice runs without tuning data
// (attach_user_variant: other tiles where the chosen ones spill with the functions), held without the variant as
// the variant's tuning data holds it.
template <class Choice>
Choice& as_user_choice(Choice& choice, const AttentionProblem& problem, int arch) {
  if (!problem.user) return choice;
  attach_user_variant(choice, problem.user, arch);
  choice.config.user = nullptr;
  return choice;
}

// A candidate's name as its sweep runs it: with the problem's user variant compiled in (with_problem_user).
std::string swept_name(TunedConfig config, const AttentionProblem& problem) {
  if (!user_key_tag(problem).empty()) set_user(config, problem.user);
  return config_name(config);
}

// The candidates of a pass: the named configs, else the space capped around the built-in choice.
template <class Config>
std::vector<TunedConfig> pass_candidates(const BasicSpaceReport<Config>& space, const Config& builtin,
                                         const TuneOptions& options) {
  if (!options.named.empty()) return options.named;
  std::vector<TunedConfig> candidates;
  for (const Config& c : capped_candidates(space, builtin, options.max_candidates)) candidates.emplace_back(c);
  return candidates;
}

template <class Config>
std::vector<Config> configs_as(const std::vector<TunedConfig>& configs) {
  std::vector<Config> typed;
  for (const TunedConfig& c : configs) typed.push_back(std::get<Config>(c));
  return typed;
}

// The real sweep of problem's pass on a non-blocking stream of the current context, made for it so the
// timings wait on no other work.
SweepResult sweep_on_own_stream(const AttentionProblem& problem, const std::vector<TunedConfig>& candidates,
                                const SweepOptions& options) {
  struct OwnStream {
    CUstream stream = nullptr;
    OwnStream() { FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)); }
    ~OwnStream() { driver().cuStreamDestroy(stream); }
  } own;
  if (problem.kv_cache) return sweep_decode(problem, configs_as<DecodeSplitConfig>(candidates), own.stream, options);
  if (problem.backward()) return sweep_backward(problem, configs_as<BwdConfig>(candidates), own.stream, options);
  return sweep_forward(problem, configs_as<KernelConfig>(candidates), own.stream, options);
}

// The choice a sweep's winner would replace: what the run-time choice runs for the problem on this device without
// the sweep's row. The store's exact bucket (a forced re-tune) or nearest one, else the shipped defaults' (exact or
// nearest bucket), else the built-in choice; a stored config that cannot serve the problem on sm_<arch> is passed over, as the
// run-time choice passes it over.
struct Incumbent {
  TunedConfig config;
  std::string source;
};

Incumbent incumbent_of(const TuningStore& store, const DeviceFingerprint& device, int arch, const TunePlan& plan,
                       const TuneOptions& options) {
  auto usable = [&](const std::optional<StoredChoice>& stored) {
    return stored && stored->config.index() == plan.builtin.index() && of_problem(stored->config, plan.key) &&
           !invalid_reason(stored->config, arch);
  };
  try {
    if (const std::optional<StoredChoice> exact = store.lookup_exact(device, plan.key); usable(exact))
      return {exact->config, "tuning database " + store.path().string()};
    if (const std::optional<StoredChoice> nearest = store.lookup_nearest(device, plan.key); usable(nearest))
      return {nearest->config, "tuning database " + store.path().string() + ", nearest bucket " +
                                   nearest->problem.id()};
  } catch (const std::exception&) {  // a row this flashgen cannot read back: passed over, as the run-time choice does
  }
  const ShippedDefaults& shipped = options.shipped != nullptr ? *options.shipped : ShippedDefaults::instance();
  if (const std::optional<StoredChoice> stored = shipped.lookup(device, plan.key); usable(stored))
    return {stored->config, stored->source};
  return {plan.builtin, "built-in choice"};
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", fraction * 100);
  return text;
}

}  // namespace

void keep_or_replace(SweepResult& swept, const std::string& incumbent_name, double tie_tolerance,
                     WinnerDecision& decision) {
  const std::string fastest_name = config_name(swept.winner);
  const CandidateResult* incumbent = nullptr;
  const CandidateResult* fastest = nullptr;
  for (const CandidateResult& c : swept.candidates) {
    const std::string name = config_name(c.config);
    if (name == incumbent_name) incumbent = &c;
    if (name == fastest_name) fastest = &c;
  }
  const std::string named = "the incumbent (" + decision.incumbent_source + ", " + incumbent_name + ")";
  decision.margin = 0;
  if (incumbent == nullptr || incumbent->status != CandidateStatus::kOk || !(incumbent->median_ms > 0)) {
    std::string why = "was not timed";
    if (incumbent == nullptr) {
      why = "was not swept";
    } else if (incumbent->status != CandidateStatus::kOk) {
      why = std::string("failed: ") + candidate_status_name(incumbent->status);
      if (!incumbent->detail.empty()) why += " (" + incumbent->detail + ")";
    }
    decision.decision = swept.decision + "; " + named + " " + why;
  } else if (fastest == incumbent || fastest == nullptr) {
    decision.decision = swept.decision + "; " + named + " is the fastest";
  } else {
    const double gain = incumbent->median_ms / fastest->median_ms - 1;
    const double noise = std::max(tie_tolerance, (incumbent->spread + fastest->spread) / 2);
    decision.margin = gain;
    if (gain > noise) {
      decision.decision = swept.decision + "; " + percent(gain) + " faster than " + named + ", beyond the noise (" +
                          percent(noise) + ")";
    } else {
      decision.decision = "kept " + named + ": the fastest, " + fastest_name + ", was " +
                          percent(gain) + " faster, within the noise (" + percent(noise) + ")";
      decision.margin = 0;
      swept.winner = incumbent->config;
      swept.winner_ms = incumbent->median_ms;
    }
  }
  swept.decision = decision.decision;
}

std::vector<TunedConfig> configs_of_problem(const std::vector<std::string>& names, const ProblemKey& key) {
  // The pass a name's prefix says, "" for no known prefix (the problem's parser then says what is wrong).
  const auto pass_of = [](const std::string& name) -> std::string {
    if (name.rfind("fwd_", 0) == 0) return "forward";
    if (name.rfind("bwd_", 0) == 0) return "backward";
    if (name.rfind("dec_", 0) == 0) return "KV-cache";
    return "";
  };
  const std::string pass = key.kv_cache ? "KV-cache" : key.pass == Pass::kBackward ? "backward" : "forward";
  std::vector<TunedConfig> configs;
  for (const std::string& name : names) {
    const std::string named = pass_of(name);
    if (!named.empty() && named != pass) {
      fail(Status::kInvalidArgument, name + " is a " + named + " config; this problem tunes the " + pass + " kernels");
    }
    const TunedConfig config = key.kv_cache                  ? TunedConfig(DecodeSplitConfig::from_name(name))
                               : key.pass == Pass::kBackward ? TunedConfig(BwdConfig::from_name(name))
                                                             : TunedConfig(KernelConfig::from_name(name));
    if (!of_problem(config, key)) fail(Status::kInvalidArgument, name + " is not a config of the problem " + key.id());
    configs.push_back(config);
  }
  return configs;
}

const CandidateResult* TuneResult::builtin_row() const {
  if (from_store()) return nullptr;
  const std::string builtin = config_name(plan.builtin);
  for (const CandidateResult& c : candidates)
    if (config_name(c.config) == builtin) return &c;
  return nullptr;
}

TunePlan plan_tune(const AttentionProblem& problem, int arch, const TuneOptions& options) {
  // FP8 q, k and v: the dense forward only, as the kernels take them, and its sweep makes no user variant's inputs.
  if (is_fp8(problem.dtype) && (problem.backward() || problem.varlen || problem.kv_cache || problem.user)) {
    fail(Status::kUnsupported, std::string("tuning ") + dtype_name(problem.dtype) + " q, k and v: the dense " +
                                   "forward only (no backward, packed batch, KV cache or user variant)");
  }
  TunePlan plan;
  plan.key = problem_key(problem);
  const ProblemKey& key = plan.key;
  FLASHGEN_REQUIRE(!problem.varlen || (problem.total_q >= problem.shape.seqlen_q && problem.total_k >= problem.shape.seqlen_k),
                   "a packed problem's total_q and total_k must hold its longest sequences (seqlen_q, seqlen_k)");
  for (const TunedConfig& c : options.named) {
    FLASHGEN_REQUIRE(of_problem(c, key), config_name(c) + " is not a config of the problem " + key.id());
  }
  if (problem.kv_cache) {
    plan.multiprocessors = options.multiprocessors > 0 ? options.multiprocessors : [] {
      const ScopedContext scope;
      return device_traits(scope.device()).multiprocessors;
    }();
    const DecodeChoice choice = heuristic_decode_choice(problem, arch, plan.multiprocessors);
    const DecodeSplitConfig builtin{choice.config, choice.splits};
    const DecodeSpaceReport space = decode_space(problem, arch, plan.multiprocessors);
    plan.builtin = builtin;
    plan.space = counts_of(space);
    plan.candidates = pass_candidates(space, builtin, options);
  } else if (problem.backward()) {
    BackwardSpaceReport space =
        backward_space(key.dtype, key.head_dim, key.mask, problem.deterministic(), arch, {}, key.head_dim_v);
    if (key.varlen) space = packed_space(space, arch);
    with_score_mods(space, key.mods);
    BackwardChoice choice = heuristic_backward_choice(key.dtype, key.head_dim, key.mask, problem.deterministic(),
                                                      arch, false, key.varlen, key.mods, key.head_dim_v);
    const BwdConfig builtin = as_user_choice(choice, problem, arch).config;
    plan.builtin = builtin;
    plan.space = counts_of(space);
    plan.candidates = pass_candidates(space, builtin, options);
  } else {
    SpaceReport space = forward_space(key.dtype, key.head_dim, key.mask, arch, {}, key.head_dim_v);
    if (key.varlen) space = packed_space(space, arch);
    if (key.paged) space = paged_space(space, arch);
    with_score_mods(space, key.mods);
    if (problem.user && problem.user->masks()) without_clusters(space);
    ForwardChoice choice =
        heuristic_choice(key.dtype, key.head_dim, key.mask, arch, false, key.varlen, key.mods, key.head_dim_v);
    if (key.paged) choice = read_through_pages(std::move(choice), arch, compiled_spills(arch));
    const KernelConfig builtin = as_user_choice(choice, problem, arch).config;
    plan.builtin = builtin;
    plan.space = counts_of(space);
    plan.candidates = pass_candidates(space, builtin, options);
  }
  return plan;
}

TuneResult tune(const AttentionProblem& problem, TuningStore& store, const DeviceFingerprint& device, int arch,
                const TuneOptions& options) {
  TuneResult result;
  result.key = problem_key(problem);
  if (!options.force) {
    if (std::optional<StoredChoice> stored = store.lookup_exact(device, result.key)) {
      result.winner = stored->config;
      result.winner_ms = stored->median_ms;
      result.decision = "stored winner";
      result.stored = std::move(stored);
      return result;
    }
  }
  result.plan = plan_tune(problem, arch, options);
  // The incumbent is swept with the candidates (added when the plan lacks it) and re-timed with the fastest.
  const Incumbent incumbent = incumbent_of(store, device, arch, result.plan, options);
  const std::string incumbent_name = config_name(incumbent.config);
  if (std::none_of(result.plan.candidates.begin(), result.plan.candidates.end(),
                   [&](const TunedConfig& c) { return config_name(c) == incumbent_name; }))
    result.plan.candidates.push_back(incumbent.config);
  if (options.on_plan) options.on_plan(result.plan);
  SweepOptions sweep = options.sweep;
  sweep.always_retime.push_back(swept_name(result.plan.builtin, problem));
  if (swept_name(incumbent.config, problem) != sweep.always_retime.back())
    sweep.always_retime.push_back(swept_name(incumbent.config, problem));
  SweepResult swept = options.run_sweep ? options.run_sweep(problem, result.plan.candidates, sweep)
                                        : sweep_on_own_stream(problem, result.plan.candidates, sweep);
  result.incumbent.incumbent = incumbent_name;
  result.incumbent.incumbent_source = incumbent.source;
  keep_or_replace(swept, incumbent_name, sweep.tie_tolerance, result.incumbent);
  store.record(device, result.key, swept.candidates, swept.winner, swept.winner_ms, result.incumbent);
  result.candidates = std::move(swept.candidates);
  result.winner = std::move(swept.winner);
  result.winner_ms = swept.winner_ms;
  result.decision = std::move(swept.decision);
  return result;
}

}  // namespace flashgen
