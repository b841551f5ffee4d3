// One tuning sweep of the forward or the backward kernels on the current GPU: compile candidates in
// parallel on CPU threads (through the kernel caches), check each against a float64 reference, time the
// survivors serially, re-time the best few interleaved and name a winner by a fixed rule.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"
#include "tuner/timing.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen {

// What a sweep reports of a candidate as it goes. Compiled: every candidate once compiling ends (status
// kOk, kSkipped or kCompileError); checked: after its reference check (kOk, kWrongResult, kCrashed,
// kLaunchError); timed: after its first timing (kOk with median_ms, or kLaunchError); re-timed: after
// the interleaved re-timing of the fastest few. Called on the thread that runs the sweep, in that order.
enum class SweepPhase { kCompiled, kChecked, kTimed, kRetimed };

struct SweepProgress {
  SweepPhase phase = SweepPhase::kCompiled;
  size_t index = 0;        // the candidate's position in the list, from 0
  size_t count = 0;        // candidates in the list
  std::string config;      // its name
  CandidateStatus status = CandidateStatus::kOk;  // its CandidateResult::status after this phase
  double median_ms = 0;    // timed and re-timed: its median
  std::string detail;      // why it failed, or a note ("spills 8 bytes")
};

// One line of text for an event, e.g. "[3/16] fwd_sm80_fp16_d64_m128_n64_w4_s2: 0.0412 ms" (timed).
std::string progress_line(const SweepProgress& event);

// A sweep's progress callback: a function of the event, or of its line (progress_line) for a plain log.
class SweepProgressCallback {
 public:
  SweepProgressCallback() = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, SweepProgressCallback>>>
  SweepProgressCallback(F f) {  // implicit: options.progress = [](...) { ... };
    if constexpr (std::is_invocable_v<F&, const SweepProgress&>) {
      call_ = std::move(f);
    } else {
      call_ = [f = std::move(f)](const SweepProgress& event) mutable { f(progress_line(event)); };
    }
  }
  explicit operator bool() const { return static_cast<bool>(call_); }
  void operator()(const SweepProgress& event) const { call_(event); }

 private:
  std::function<void(const SweepProgress&)> call_;
};

struct SweepOptions {
  TimingOptions timing;
  int compile_threads = 0;  // 0: one per hardware thread
  int retime_top = 3;       // candidates re-timed interleaved before naming the winner
  // Candidates re-timed with the top few whatever their first timing (say the built-in choice), so what
  // the sweep reports of them rests on the same interleaved timings as the winner's.
  std::vector<std::string> always_retime;
  int retime_rounds = 20;
  double tie_tolerance = 0.01;  // within 1% of the fastest counts as a tie
  int check_rows = 16;          // query rows checked against the float64 reference per candidate
  uint64_t seed = 0;
  SweepProgressCallback progress;  // one event per candidate and phase; may be empty
  // Crash isolation (flashgen tune's worker processes): candidates known to have crashed a process,
  // recorded with status kCrashed and their detail and never launched; and a hook called with a
  // candidate's name right before its first launch and with "" once it is done, so a supervisor can
  // pin a crash on it.
  std::map<std::string, std::string> known_crashes;
  std::function<void(const std::string&)> on_launch;
  // A problem with a user variant: the buffers and scalars its calls pass (a tune on first use passes the call's
  // own, so the sweep's inputs, of the call's sizes, index them as the call does).
  UserVariantArgs user_args;
};

// Compiles user (null: none) into a forward or backward config; a KV-cache config takes none and is left as it is.
void set_user(TunedConfig& config, const std::shared_ptr<const UserVariant>& user);

struct SweepResult {
  ProblemKey problem;
  std::vector<CandidateResult> candidates;  // every candidate, in the order given, with its status
  TunedConfig winner;  // a KernelConfig from sweep_forward, a BwdConfig from sweep_backward, a
                       // DecodeSplitConfig from sweep_decode
  double winner_ms = 0;
  std::string decision;  // how the winner was named (ties included)
};

// Sweeps candidates (all for problem's dtype, head_dim and mask kind) on stream's device, and keys the
// result by problem_key(problem). Throws Error(kInvalidArgument) when no candidate passes; individual
// failures are recorded, not thrown. A packed problem (problem.varlen, its total_q and total_k set) runs
// its varlen candidates on a batch of sequences of packed_lengths(batch, seqlen, total) and checks a few of
// them, each against its own float64 reference.
SweepResult sweep_forward(const AttentionProblem& problem, const std::vector<KernelConfig>& candidates,
                          CUstream stream, const SweepOptions& options);

// The same for backward candidates (all for problem's dtype, head_dim, mask kind and dQ strategy). They
// are checked in full against the float64 reference on a small problem of the same class, then timed at
// the problem's sizes.
SweepResult sweep_backward(const AttentionProblem& problem, const std::vector<BwdConfig>& candidates,
                           CUstream stream, const SweepOptions& options);

// The same for KV-cache candidates (all of the problem's class: dtype, head_dim, mask and cache layout, with
// page_size keys per page when paged). Each is checked against the float64 reference at the problem's sizes on
// at most two sequences (a split count divides each sequence's keys alike), then timed at the problem's sizes
// with every sequence's cache full and nothing appended, its split workspace allocated ahead.
SweepResult sweep_decode(const AttentionProblem& problem, const std::vector<DecodeSplitConfig>& candidates,
                         CUstream stream, const SweepOptions& options);

}  // namespace flashgen
