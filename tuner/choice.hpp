// The run-time choice of a config from explicit data sources, in one order for both passes: the user's
// tuning database (exact size bucket, then the nearest bucket of the same device and problem class), the
// shipped defaults, then the built-in heuristic's ranked candidates, which a caller resolves against what ptxas
// reports (builtin_choice). A choice never fails for lack of tuning data. dispatch/ memoizes the sources' answers
// per process and plans a call's config from them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"
#include "tuner/problem_key.hpp"

namespace flashgen {

class ShippedDefaults;
class TuningStore;

// Where a run-time choice came from.
enum class ChoiceSource { kTuningDatabase, kTunedOnFirstUse, kShippedDefaults, kHeuristic, kRequested };

// "tuning database", "tuned on first use", "shipped defaults", "heuristic", "requested" (as explain reports).
const char* choice_source_name(ChoiceSource source);

struct ForwardChoice {
  KernelConfig config;
  std::string reason;  // where the config came from and why, e.g. "built-in heuristic (no tuning data)"
  ChoiceSource source = ChoiceSource::kHeuristic;
  bool exact_bucket = false;  // kTuningDatabase: the user's database holds the problem's own bucket (not a neighbour)
};

struct BackwardChoice {
  BwdConfig config;
  std::string reason;
  ChoiceSource source = ChoiceSource::kHeuristic;
  bool exact_bucket = false;  // as ForwardChoice's
};

// A KV-cache call's choice: its decode module and the key ranges per sequence at the call's sizes.
struct DecodeChoice {
  DecodeConfig config;
  int splits = 1;
  std::string reason;
  ChoiceSource source = ChoiceSource::kHeuristic;
  bool exact_bucket = false;  // as ForwardChoice's
};

// The local-memory bytes (spill stores + loads) a config may spill and still be chosen where the rule allows it:
// on Hopper, spills this small cost less than the next tile of the list (bench/notes_variants.md, "Soft cap" and
// "Tuning user variants").
constexpr int kCheapSpillBytes = 64;

// The bytes the built-in choice of a pass on sm_<arch> lets its config spill: kCheapSpillBytes for the backward on
// sm_90 (the Hopper family's tiles come first there), none otherwise.
constexpr int builtin_spill_allowance(Pass pass, int arch) {
  return pass == Pass::kBackward && arch == 90 ? kCheapSpillBytes : 0;
}

// The bytes a config's kernels spill (spill stores + loads, as ptxas reports them) on the arch it is asked for.
template <class Config>
using SpilledBytes = std::function<int(const Config&)>;

// The kernel registry's spill report on sm_<arch>: compiles the config through its caches.
SpilledBytes<KernelConfig> compiled_spills(int arch);
SpilledBytes<BwdConfig> compiled_backward_spills(int arch);

// The heuristic's ranked candidates for a problem class on sm_<arch>, best first (tuner/heuristic.hpp's lists).
// With sm80_only, only the sm80 family is considered (dispatch's fallback when TMA cannot describe a problem); with
// varlen, the configs are the packed-batch kernels; with score modifiers, their kernels with those compiled in; with
// head_dim_v, those whose values have that head dim. Compiles nothing.
std::vector<KernelConfig> heuristic_candidates(DType dtype, int head_dim, MaskKind mask, int arch,
                                               bool sm80_only = false, bool varlen = false, ScoreMods mods = {},
                                               int head_dim_v = 0);
std::vector<BwdConfig> heuristic_backward_candidates(DType dtype, int head_dim, MaskKind mask, bool deterministic,
                                                     int arch, bool sm80_only = false, bool varlen = false,
                                                     ScoreMods mods = {}, int head_dim_v = 0);

// The built-in choice among ranked candidates for sm_<arch>: the first spilling at most builtin_spill_allowance by
// spilled, the reason ("built-in heuristic ...") naming what was passed over; the first when all spill more.
ForwardChoice builtin_choice(const std::vector<KernelConfig>& ranked, const SpilledBytes<KernelConfig>& spilled,
                             int arch);
BackwardChoice builtin_choice(const std::vector<BwdConfig>& ranked, const SpilledBytes<BwdConfig>& spilled, int arch);

// builtin_choice of heuristic_candidates with the kernel registry's spill reports (compiling the candidates it
// checks): the tuner's built-in choice, which its sweeps time as the incumbent.
ForwardChoice heuristic_choice(DType dtype, int head_dim, MaskKind mask, int arch, bool sm80_only = false,
                               bool varlen = false, ScoreMods mods = {}, int head_dim_v = 0);

// The same for the backward (its kernels' spills: dkdv, and dq when deterministic).
BackwardChoice heuristic_backward_choice(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                         bool sm80_only = false, bool varlen = false, ScoreMods mods = {},
                                         int head_dim_v = 0);

// What the data sources answer for a problem key, compiling nothing: a stored winner, whole, or the heuristic's
// ranked candidates, which resolve() turns into the built-in choice by their spills (dispatch's planner does).
template <class Choice>
struct SourcesAnswer {
  using Config = decltype(Choice::config);
  std::optional<Choice> stored;
  std::vector<Config> ranked;  // without a stored winner: the heuristic's, best first
  std::string lead;            // the reason before the built-in choice's (a paged class borrowing its contiguous one's)
  std::string passed_over;     // what the sources held but could not use, after it
};

// The answer's choice on sm_<arch>: the stored winner, else builtin_choice of the ranked candidates by spilled.
ForwardChoice resolve(const SourcesAnswer<ForwardChoice>& answer, const SpilledBytes<KernelConfig>& spilled, int arch);
BackwardChoice resolve(const SourcesAnswer<BackwardChoice>& answer, const SpilledBytes<BwdConfig>& spilled, int arch);

// choice's config with user's functions compiled in as it is, the reason saying so.
template <class Choice>
void compile_in_variant(Choice& choice, const std::shared_ptr<const UserVariant>& user) {
  choice.config.user = user;
  choice.reason += "; with the user variant " + user->tag + " compiled in";
}

// A user variant compiled into the choice for its base class (the built-in mask and modifiers under it), and the
// configs it may take instead, best first: the rest of the heuristic's list for the base class on sm_<arch> in the
// chosen config's family, with the variant and the config's modifiers and layout. A user mask takes no cluster: the
// sm90 family's clusters share each key block between two tiles, which the mask may hide from one of them. Compiles
// nothing.
std::vector<KernelConfig> with_variant_candidates(ForwardChoice& choice, const std::shared_ptr<const UserVariant>& user,
                                                  int arch);
std::vector<BwdConfig> with_variant_candidates(BackwardChoice& choice, const std::shared_ptr<const UserVariant>& user,
                                               int arch);

// The sinks' gradient summed in the chosen config's kernels (BwdConfig::sink_grad), and the configs it may take
// instead where those spill with it, best first: the rest of the heuristic's list for the class on sm_<arch> in the
// chosen config's family, with the config's modifiers, layout and variant. Compiles nothing.
std::vector<BwdConfig> with_sink_grad_candidates(BackwardChoice& choice, int arch);

// Keeps choice's config where it spills at most kCheapSpillBytes by spilled (a small spill costs less than a smaller
// tile, as measured), else takes the first of alternates that does, the reason naming what spilled; when none does,
// the chosen config.
void keep_spill_free(ForwardChoice& choice, const std::vector<KernelConfig>& alternates,
                     const SpilledBytes<KernelConfig>& spilled);
void keep_spill_free(BackwardChoice& choice, const std::vector<BwdConfig>& alternates,
                     const SpilledBytes<BwdConfig>& spilled);

// with_variant_candidates, then keep_spill_free with the kernel registry's spill reports on sm_<arch>: the choice the
// tuner plans a user variant's sweep around.
void attach_user_variant(ForwardChoice& choice, const std::shared_ptr<const UserVariant>& user, int arch);
void attach_user_variant(BackwardChoice& choice, const std::shared_ptr<const UserVariant>& user, int arch);

// A packed forward's choice reading keys and values through a block table: its config with paged set, where that
// is valid on sm_<arch> and spills no more than the built-in choice allows; otherwise (the sm90 family's widest
// tiles, whose consumers the paged producer leaves too few registers) the built-in Hopper tile that is valid paged,
// else the sm80 family's (not for FP8), by spilled, keeping the output type; none throws Error(kUnsupported). A
// paged config is kept as it is; a dense one throws Error(kInvalidArgument).
ForwardChoice read_through_pages(ForwardChoice choice, int arch, const SpilledBytes<KernelConfig>& spilled);

// What the data sources (either may be null) answer: user_db exact bucket, user_db nearest bucket, the shipped
// defaults (exact, then nearest bucket, for a GPU of the same kind), else the heuristic's candidates. A stored
// config that cannot run on sm_<arch> is passed over, and the reason says so. A paged packed forward's class (its
// page size) without data of its own takes its contiguous class's answer, which the caller reads through the pages.
// Not memoized: dispatch/select.hpp's process-wide form is.
SourcesAnswer<ForwardChoice> choose_forward_config(const DeviceFingerprint& device, const ProblemKey& problem,
                                                   int arch, const TuningStore* user_db,
                                                   const ShippedDefaults* shipped = nullptr);

// The backward's answer from explicit data sources, in choose_forward_config's order. problem is a
// backward key (backward_problem_key: family "bwd" or "bwd_det").
SourcesAnswer<BackwardChoice> choose_backward_config(const DeviceFingerprint& device, const ProblemKey& problem,
                                                     int arch, const TuningStore* user_db,
                                                     const ShippedDefaults* shipped = nullptr);

// The KV-cache choice for problem (problem.kv_cache) on a GPU of `multiprocessors` SMs, in choose_forward_config's
// order. A stored winner's split count serves the problem's own bucket (the user's database or the shipped
// defaults); a winner of a neighbouring bucket lends its module, with the split count heuristic_decode_splits
// takes for that module at the problem's sizes (a count timed at other sizes fills the GPU differently).
// Without data, heuristic_decode_choice.
DecodeChoice choose_decode_config(const DeviceFingerprint& device, const AttentionProblem& problem, int arch,
                                  int multiprocessors, const TuningStore* user_db,
                                  const ShippedDefaults* shipped = nullptr);

// choose_decode_config in its two halves, for a caller that memoizes the first per problem bucket: what the data
// sources hold for the problem's bucket (the costly half: database and shipped lookups; the same for every
// problem of the bucket), then the choice at the problem's exact sizes (cheap: a neighbouring bucket's or the
// heuristic's split count depends on them).
struct DecodeStoredAnswer {
  std::optional<DecodeChoice> stored;  // with the bucket's split count when same_bucket
  bool same_bucket = false;
  std::string passed_over;             // what the sources held but could not be used, for the reason
};
DecodeStoredAnswer decode_stored_answer(const DeviceFingerprint& device, const AttentionProblem& problem, int arch,
                                        const TuningStore* user_db, const ShippedDefaults* shipped = nullptr);
DecodeChoice complete_decode_choice(const DecodeStoredAnswer& answer, const AttentionProblem& problem, int arch,
                                    int multiprocessors);

}  // namespace flashgen
