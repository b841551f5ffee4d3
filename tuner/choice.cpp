// The run-time choice from explicit data sources: the user's tuning database (exact bucket, then the
// nearest), the shipped defaults, then the built-in heuristic's candidates, resolved by ptxas's spill report.
#include "tuner/choice.hpp"

#include <algorithm>

#include "flashgen/error.hpp"
#include "runtime/kernel_registry.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/shipped.hpp"
#include "tuner/store.hpp"

namespace flashgen {

namespace {

// Drops every config not of the sm80 family (for problems the Hopper families cannot describe).
template <class Config>
void keep_sm80_family(std::vector<Config>& configs) {
  configs.erase(std::remove_if(configs.begin(), configs.end(),
                               [](const Config& c) { return c.family() != KernelFamily::kSm80; }),
                configs.end());
}

// The first of ranked whose kernels spill at most cheap_bytes by spilled, with the reason "built-in heuristic ..."
// naming what was passed over and what it spills; the first config when all of them spill more.
template <class Choice, class Config>
Choice first_spilling_at_most(const std::vector<Config>& ranked, const SpilledBytes<Config>& spilled,
                              int cheap_bytes) {
  FLASHGEN_REQUIRE(!ranked.empty(), "the built-in choice: no candidates");
  Choice choice{ranked.front(), "built-in heuristic (no tuning data)"};
  std::string spilling;
  bool clean = false;
  for (const Config& config : ranked) {
    const int bytes = spilled(config);
    if (bytes <= cheap_bytes) {
      choice.config = config;
      clean = true;
      if (bytes > 0) {
        choice.reason += "; " + config.name() + " spills " + std::to_string(bytes) + " bytes, within the " +
                         std::to_string(cheap_bytes) + " that cost less than another tile";
      }
      break;
    }
    spilling += (spilling.empty() ? "" : ", ") + config.name() + " spills " + std::to_string(bytes) + " bytes";
  }
  if (!spilling.empty()) {
    choice.reason += clean ? "; passed over " + spilling
                           : "; every candidate spills (" + spilling + "), using the first";
  }
  return choice;
}

}  // namespace

const char* choice_source_name(ChoiceSource source) {
  switch (source) {
    case ChoiceSource::kTuningDatabase: return "tuning database";
    case ChoiceSource::kTunedOnFirstUse: return "tuned on first use";
    case ChoiceSource::kShippedDefaults: return "shipped defaults";
    case ChoiceSource::kHeuristic: return "heuristic";
    case ChoiceSource::kRequested: return "requested";
  }
  return "heuristic";
}

std::vector<KernelConfig> heuristic_candidates(DType dtype, int head_dim, MaskKind mask, int arch, bool sm80_only,
                                               bool varlen, ScoreMods mods, int head_dim_v) {
  std::vector<KernelConfig> configs = heuristic_forward_configs(dtype, head_dim, mask, arch, varlen, head_dim_v);
  if (sm80_only) keep_sm80_family(configs);
  for (KernelConfig& c : configs) c.mods = mods;
  return configs;
}

std::vector<BwdConfig> heuristic_backward_candidates(DType dtype, int head_dim, MaskKind mask, bool deterministic,
                                                     int arch, bool sm80_only, bool varlen, ScoreMods mods,
                                                     int head_dim_v) {
  std::vector<BwdConfig> configs = heuristic_backward_configs(dtype, head_dim, mask, deterministic, arch, head_dim_v);
  if (sm80_only) keep_sm80_family(configs);
  for (BwdConfig& c : configs) c.varlen = varlen, c.mods = mods;
  return configs;
}

ForwardChoice builtin_choice(const std::vector<KernelConfig>& ranked, const SpilledBytes<KernelConfig>& spilled,
                             int arch) {
  return first_spilling_at_most<ForwardChoice>(ranked, spilled, builtin_spill_allowance(Pass::kForward, arch));
}

BackwardChoice builtin_choice(const std::vector<BwdConfig>& ranked, const SpilledBytes<BwdConfig>& spilled, int arch) {
  // On sm_90 the Hopper family's tiles come first, and a few bytes of spill there (a soft cap's derivative at 64
  // columns) cost less than the sm80 family's tiles after them.
  return first_spilling_at_most<BackwardChoice>(ranked, spilled, builtin_spill_allowance(Pass::kBackward, arch));
}

ForwardChoice heuristic_choice(DType dtype, int head_dim, MaskKind mask, int arch, bool sm80_only, bool varlen,
                               ScoreMods mods, int head_dim_v) {
  return builtin_choice(heuristic_candidates(dtype, head_dim, mask, arch, sm80_only, varlen, mods, head_dim_v),
                        compiled_spills(arch), arch);
}

BackwardChoice heuristic_backward_choice(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                         bool sm80_only, bool varlen, ScoreMods mods, int head_dim_v) {
  return builtin_choice(
      heuristic_backward_candidates(dtype, head_dim, mask, deterministic, arch, sm80_only, varlen, mods, head_dim_v),
      compiled_backward_spills(arch), arch);
}

namespace {

template <class Choice, class Config>
Choice resolved(const SourcesAnswer<Choice>& answer, const SpilledBytes<Config>& spilled, int arch) {
  if (answer.stored) return *answer.stored;
  Choice choice = builtin_choice(answer.ranked, spilled, arch);
  choice.reason = answer.lead + choice.reason + answer.passed_over;
  return choice;
}

}  // namespace

ForwardChoice resolve(const SourcesAnswer<ForwardChoice>& answer, const SpilledBytes<KernelConfig>& spilled,
                      int arch) {
  return resolved(answer, spilled, arch);
}

BackwardChoice resolve(const SourcesAnswer<BackwardChoice>& answer, const SpilledBytes<BwdConfig>& spilled,
                       int arch) {
  return resolved(answer, spilled, arch);
}

SpilledBytes<KernelConfig> compiled_spills(int arch) {
  return [arch](const KernelConfig& config) { return KernelRegistry::instance().spilled_bytes(config, arch); };
}

SpilledBytes<BwdConfig> compiled_backward_spills(int arch) {
  return [arch](const BwdConfig& config) { return KernelRegistry::instance().spilled_bytes(config, arch); };
}

namespace {

// user compiled into choice's config, and `list` (the base class's heuristic configs, already carrying the config's
// modifiers and layout) with it, less the configs of other families and the chosen one.
template <class Choice, class Config>
std::vector<Config> variant_alternates(Choice& choice, const std::shared_ptr<const UserVariant>& user,
                                       std::vector<Config> list) {
  compile_in_variant(choice, user);
  std::vector<Config> alternates;
  for (Config& c : list) {
    c.user = user;
    if (c.family() == choice.config.family() && c != choice.config) alternates.push_back(std::move(c));
  }
  return alternates;
}

template <class Choice, class Config>
void keep_first_spill_free(Choice& choice, const std::vector<Config>& alternates, const SpilledBytes<Config>& spilled) {
  const int chosen = spilled(choice.config);
  if (chosen <= kCheapSpillBytes) return;
  std::string passed_over = choice.config.name() + " spills " + std::to_string(chosen) + " bytes";
  for (const Config& c : alternates) {
    const int bytes = spilled(c);
    if (bytes <= kCheapSpillBytes) {
      choice.config = c;
      choice.reason += "; with it " + passed_over + ", so the heuristic's " + choice.config.name();
      return;
    }
    passed_over += ", " + c.name() + " " + std::to_string(bytes);
  }
  choice.reason += "; with it every heuristic config spills (" + passed_over + "), using the chosen one";
}

}  // namespace

std::vector<KernelConfig> with_variant_candidates(ForwardChoice& choice, const std::shared_ptr<const UserVariant>& user,
                                                  int arch) {
  KernelConfig& chosen = choice.config;
  Sm90Knobs* k = chosen.sm90();
  if (k != nullptr && k->cluster != 1 && user->masks()) {
    k->cluster = 1;
    choice.reason += "; no cluster: a user mask hides keys";
  }
  std::vector<KernelConfig> list =
      heuristic_forward_configs(chosen.dtype, chosen.head_dim, chosen.mask, arch, chosen.varlen, chosen.head_dim_v);
  for (KernelConfig& c : list) {
    c.paged = chosen.paged;
    c.mods = chosen.mods;
    if (Sm90Knobs* knobs = c.sm90(); knobs != nullptr && user->masks()) knobs->cluster = 1;
  }
  return variant_alternates(choice, user, std::move(list));
}

namespace {

// The rest of the heuristic's backward list for chosen's class on sm_<arch> in chosen's family, best first, each with
// what chosen compiles in beside its tiles: its layout, score modifiers, user variant and the sinks' gradient.
std::vector<BwdConfig> class_alternates(const BwdConfig& chosen, int arch) {
  std::vector<BwdConfig> alternates;
  for (BwdConfig& c :
       heuristic_backward_configs(chosen.dtype, chosen.head_dim, chosen.mask, chosen.deterministic, arch,
                                  chosen.head_dim_v)) {
    c.varlen = chosen.varlen, c.mods = chosen.mods, c.user = chosen.user, c.sink_grad = chosen.sink_grad;
    if (c.family() == chosen.family() && c != chosen) alternates.push_back(std::move(c));
  }
  return alternates;
}

}  // namespace

std::vector<BwdConfig> with_variant_candidates(BackwardChoice& choice, const std::shared_ptr<const UserVariant>& user,
                                               int arch) {
  compile_in_variant(choice, user);
  return class_alternates(choice.config, arch);
}

std::vector<BwdConfig> with_sink_grad_candidates(BackwardChoice& choice, int arch) {
  choice.config.sink_grad = true;
  choice.reason += "; the sinks' gradient summed over its scores";
  return class_alternates(choice.config, arch);
}

void keep_spill_free(ForwardChoice& choice, const std::vector<KernelConfig>& alternates,
                     const SpilledBytes<KernelConfig>& spilled) {
  keep_first_spill_free(choice, alternates, spilled);
}

void keep_spill_free(BackwardChoice& choice, const std::vector<BwdConfig>& alternates,
                     const SpilledBytes<BwdConfig>& spilled) {
  keep_first_spill_free(choice, alternates, spilled);
}

void attach_user_variant(ForwardChoice& choice, const std::shared_ptr<const UserVariant>& user, int arch) {
  const std::vector<KernelConfig> alternates = with_variant_candidates(choice, user, arch);
  keep_spill_free(choice, alternates, compiled_spills(arch));
}

void attach_user_variant(BackwardChoice& choice, const std::shared_ptr<const UserVariant>& user, int arch) {
  const std::vector<BwdConfig> alternates = with_variant_candidates(choice, user, arch);
  keep_spill_free(choice, alternates, compiled_backward_spills(arch));
}

namespace {

// A stored winner the run-time choice may use, and why.
template <class Config>
struct StoredUse {
  Config config;
  std::string reason;
  ChoiceSource source;
  bool exact_bucket = false;  // the user's database holds this very bucket
  bool same_bucket = false;   // the winner was timed in the problem's own bucket (the user's or the shipped data)
};

// The user's database (exact bucket, then nearest), then the shipped defaults, for a config of type
// Config that can run on sm_<arch> and matches the problem class; passed_over collects what was not used.
template <class Config>
std::optional<StoredUse<Config>> stored_choice(const DeviceFingerprint& device, const ProblemKey& problem, int arch,
                                               const TuningStore* user_db, const ShippedDefaults* shipped,
                                               std::string& passed_over) {
  auto usable = [&](const std::optional<StoredChoice>& stored) -> const Config* {
    if (!stored) return nullptr;
    const Config* c = std::get_if<Config>(&stored->config);
    std::optional<std::string> why;
    if (c == nullptr || !same_pass(*c, problem)) {
      why = "a config of another pass or dQ strategy";
    } else {
      why = c->invalid_reason(arch);
      if (!why && !of_problem(stored->config, problem)) why = "does not match the problem";
    }
    if (why) passed_over += "; stored " + config_name(stored->config) + " passed over: " + *why;
    return why ? nullptr : c;
  };
  // A row the database cannot turn back into a problem or config (written by another tool, or edited)
  // is passed over like an unusable one: the call still gets the shipped defaults or the heuristic.
  if (user_db != nullptr) {
    try {
      const std::optional<StoredChoice> exact = user_db->lookup_exact(device, problem);
      if (const Config* c = usable(exact)) {
        return StoredUse<Config>{*c, "tuning database " + user_db->path().string() + ", exact bucket " + problem.id(),
                                 ChoiceSource::kTuningDatabase, true, true};
      }
      const std::optional<StoredChoice> nearest = user_db->lookup_nearest(device, problem);
      if (const Config* c = usable(nearest)) {
        return StoredUse<Config>{*c,
                                 "tuning database " + user_db->path().string() + ", nearest bucket " +
                                     nearest->problem.id() + " for " + problem.id(),
                                 ChoiceSource::kTuningDatabase};
      }
    } catch (const std::exception& e) {  // Error, or the JSON library's on a config it cannot read
      passed_over += "; tuning database " + user_db->path().string() + " passed over: " + e.what();
    }
  }
  if (shipped != nullptr) {
    bool exact = false;
    const std::optional<StoredChoice> stored = shipped->lookup(device, problem, &exact);
    if (const Config* c = usable(stored)) {
      return StoredUse<Config>{*c,
                               stored->source + (exact ? ", exact bucket " + problem.id()
                                                       : ", nearest bucket " + stored->problem.id() + " for " +
                                                             problem.id()),
                               ChoiceSource::kShippedDefaults, false, exact};
    }
  }
  return std::nullopt;
}

}  // namespace

ForwardChoice read_through_pages(ForwardChoice choice, int arch, const SpilledBytes<KernelConfig>& spilled) {
  KernelConfig& chosen = choice.config;
  FLASHGEN_REQUIRE(chosen.varlen, "read_through_pages: " + chosen.name() + " is not a packed-batch (varlen) config");
  if (chosen.paged) return choice;
  chosen.paged = true;
  // A paged producer keeps more registers, so a tile valid and spill-free over a packed batch may be neither here.
  std::optional<std::string> why = chosen.invalid_reason(arch);
  if (!why) {
    if (const int bytes = spilled(chosen); bytes > builtin_spill_allowance(Pass::kForward, arch)) {
      why = chosen.name() + " spills " + std::to_string(bytes) + " bytes";
    }
  }
  if (why) {
    // The heuristic's packed candidates that stay valid read through pages, with the call's output type.
    auto paged_candidates = [&](bool sm80_only) {
      std::vector<KernelConfig> ranked;
      for (KernelConfig c : heuristic_candidates(chosen.dtype, chosen.head_dim, chosen.mask, arch, sm80_only,
                                                 /*varlen=*/true, chosen.mods, chosen.head_dim_v)) {
        c.paged = true, c.out_dtype = chosen.out_dtype;
        if (!c.invalid_reason(arch)) ranked.push_back(std::move(c));
      }
      return ranked;
    };
    std::vector<KernelConfig> ranked = paged_candidates(/*sm80_only=*/false);
    if (ranked.empty() && !is_fp8(chosen.dtype)) ranked = paged_candidates(/*sm80_only=*/true);
    if (ranked.empty()) {
      fail(Status::kUnsupported, "no kernel reads this problem through a block table: " + chosen.name() +
                                     " is invalid (" + *why + "), and so is every other tile");
    }
    ForwardChoice builtin = builtin_choice(ranked, spilled, arch);
    choice.reason += "; paged, " + *why + ", so " + builtin.reason;
    choice.config = std::move(builtin.config);
    choice.source = builtin.source;
  }
  choice.reason += "; keys and values read through the block table (paged)";
  return choice;
}

namespace {

// The sources' answer for problem: its stored winner, else the heuristic's candidates for its class.
template <class Choice>
SourcesAnswer<Choice> sources_answer(const DeviceFingerprint& device, const ProblemKey& problem, int arch,
                                     const TuningStore* user_db, const ShippedDefaults* shipped,
                                     std::vector<decltype(Choice::config)> (*candidates)(const ProblemKey&, int)) {
  using Config = decltype(Choice::config);
  SourcesAnswer<Choice> answer;
  if (auto stored = stored_choice<Config>(device, problem, arch, user_db, shipped, answer.passed_over)) {
    answer.stored = Choice{stored->config, stored->reason, stored->source, stored->exact_bucket};
    answer.passed_over.clear();
    return answer;
  }
  answer.ranked = candidates(problem, arch);
  return answer;
}

std::vector<KernelConfig> forward_candidates(const ProblemKey& problem, int arch) {
  return heuristic_candidates(problem.dtype, problem.head_dim, problem.mask, arch, false, problem.varlen,
                              problem.mods, problem.head_dim_v);
}

std::vector<BwdConfig> backward_candidates(const ProblemKey& problem, int arch) {
  return heuristic_backward_candidates(problem.dtype, problem.head_dim, problem.mask,
                                       problem.dq == DqStrategy::kDeterministic, arch, false, problem.varlen,
                                       problem.mods, problem.head_dim_v);
}

}  // namespace

SourcesAnswer<ForwardChoice> choose_forward_config(const DeviceFingerprint& device, const ProblemKey& problem,
                                                   int arch, const TuningStore* user_db,
                                                   const ShippedDefaults* shipped) {
  SourcesAnswer<ForwardChoice> answer =
      sources_answer<ForwardChoice>(device, problem, arch, user_db, shipped, forward_candidates);
  if (answer.stored || problem.page_size == 0) return answer;
  ProblemKey contiguous = problem;
  contiguous.paged = false, contiguous.page_size = 0;
  const std::string lead = "no data for " + problem.class_id() + answer.passed_over + ", so its contiguous class's ";
  answer = choose_forward_config(device, contiguous, arch, user_db, shipped);
  if (answer.stored) {
    answer.stored->exact_bucket = false;  // not the paged class's own data: tune-on-first-use still tunes it
    answer.stored->reason = lead + answer.stored->reason;
  } else {
    answer.lead = lead + answer.lead;
  }
  return answer;
}

SourcesAnswer<BackwardChoice> choose_backward_config(const DeviceFingerprint& device, const ProblemKey& problem,
                                                     int arch, const TuningStore* user_db,
                                                     const ShippedDefaults* shipped) {
  return sources_answer<BackwardChoice>(device, problem, arch, user_db, shipped, backward_candidates);
}

DecodeStoredAnswer decode_stored_answer(const DeviceFingerprint& device, const AttentionProblem& problem, int arch,
                                        const TuningStore* user_db, const ShippedDefaults* shipped) {
  FLASHGEN_REQUIRE(problem.kv_cache, "choose_decode_config: the problem is not a KV-cache one");
  const ProblemKey key = problem_key(problem);
  DecodeStoredAnswer answer;
  if (auto stored = stored_choice<DecodeSplitConfig>(device, key, arch, user_db, shipped, answer.passed_over)) {
    answer.stored = DecodeChoice{stored->config.config, stored->config.splits, stored->reason, stored->source,
                                 stored->exact_bucket};
    answer.same_bucket = stored->same_bucket;
  }
  return answer;
}

DecodeChoice complete_decode_choice(const DecodeStoredAnswer& answer, const AttentionProblem& problem, int arch,
                                    int multiprocessors) {
  if (answer.stored) {
    DecodeChoice choice = *answer.stored;
    if (!answer.same_bucket) {
      choice.splits = heuristic_decode_splits(problem, choice.config, arch, multiprocessors);
      choice.reason += "; " + std::to_string(choice.splits) + " key range" + (choice.splits == 1 ? "" : "s") +
                       " per sequence for " + std::to_string(multiprocessors) + " SMs at the problem's sizes";
    }
    return choice;
  }
  DecodeChoice choice = heuristic_decode_choice(problem, arch, multiprocessors);
  choice.reason += answer.passed_over;
  return choice;
}

DecodeChoice choose_decode_config(const DeviceFingerprint& device, const AttentionProblem& problem, int arch,
                                  int multiprocessors, const TuningStore* user_db, const ShippedDefaults* shipped) {
  return complete_decode_choice(decode_stored_answer(device, problem, arch, user_db, shipped), problem, arch,
                                multiprocessors);
}

}  // namespace flashgen
