// The process-wide run-time choice of both passes: tuner/choice.hpp's order over the user's database (opened
// read-only once) and the shipped defaults, memoized per (device, problem key), and tune-on-first-use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "tuner/choice.hpp"
#include "tuner/problem_key.hpp"

namespace flashgen {

// What the process's data sources answer for device (a CUDA device ordinal): the user's database at
// TuningStore::default_path(), opened read-only on first use (a missing file means no tuning data), then
// ShippedDefaults::instance(), else the heuristic's candidates; memoized per (device, problem key), a first-use
// sweep's winner replacing it. Compiles nothing. Thread-safe; microseconds after the first call for a key.
SourcesAnswer<ForwardChoice> choose_forward_config(int device, const ProblemKey& problem, int arch);

// Tune-on-first-use: when on, a forward or backward call whose problem bucket the user's database does
// not hold for this GPU first runs a short sweep (tune_forward_on_first_use, tune_backward_on_first_use)
// and stores the winner there. Off unless FLASHGEN_TUNE=1 is set in the environment or
// set_tune_on_first_use(true) is called.
bool tune_on_first_use();
void set_tune_on_first_use(bool enabled);

// A count that grows whenever a memoized choice may change: a first-use or explicit sweep stored a winner,
// or the tune-on-first-use switch was set. Launches dispatch keeps from before are prepared afresh.
uint64_t choice_generation();

// Candidates a first-use sweep times (capped_candidates: the built-in choice, its neighbours, the rest
// spread evenly).
constexpr int kFirstUseCandidates = 16;

// tune() (tuner/tune.hpp) of a forward problem on device (an ordinal; its context current): sweeps the capped
// space on a stream of its own, stores every row and the winner in the user's database
// (TuningStore::default_path(), opened for writing) and makes the winner the process's memoized choice for
// the problem's key. Blocks until the sweep is done (seconds). When another process has stored the bucket
// since this one read the database, that winner is the choice and nothing is swept.
// Returns nullopt, after a warning on stderr, when the sweep or the store fails: the caller keeps the
// choice it had, and the process does not sweep that bucket again. *failure (when given) then gets the
// cause, this time and at every later call for the bucket. An explicit_request (flashgen_tune_forward)
// sweeps a bucket whose sweep failed before, and a failure throws Error with its cause's status instead.
// A dense problem with a user variant is swept with the variant compiled into its base class's candidates, checked
// against its functions evaluated on the GPU with user_args (the call's own buffers and scalars), and stored under
// the variant's tag.
std::optional<ForwardChoice> tune_forward_on_first_use(const AttentionProblem& problem, int device, int arch,
                                                       std::string* failure = nullptr, bool explicit_request = false,
                                                       const UserVariantArgs* user_args = nullptr);

// The same for the backward: the user's database, then the shipped defaults, then the heuristic's candidates;
// memoized per (device, problem key).
SourcesAnswer<BackwardChoice> choose_backward_config(int device, const ProblemKey& problem, int arch);

// tune_forward_on_first_use for a backward problem (its dQ strategy's candidates; checked in full
// against float64 on a small problem of the same class, then timed at the problem's sizes).
std::optional<BackwardChoice> tune_backward_on_first_use(const AttentionProblem& problem, int device, int arch,
                                                         std::string* failure = nullptr,
                                                         const UserVariantArgs* user_args = nullptr);

// Process-wide KV-cache choice for device (a CUDA device ordinal) of `multiprocessors` SMs, in the forward's
// order of sources (tuner/choice.hpp's choose_decode_config). What the sources hold is memoized per problem
// bucket; the split count is taken at the problem's exact sizes on every call (a cache that grows by a token per
// step is a new problem class at every step, and a lookup in the shipped defaults costs tens of microseconds). No
// tune-on-first-use: KV-cache problems are tuned with `flashgen tune --kv-cache`.
DecodeChoice choose_decode_config(int device, const AttentionProblem& problem, int arch, int multiprocessors);

}  // namespace flashgen
