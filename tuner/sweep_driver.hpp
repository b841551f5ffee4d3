// The pass-independent sweep driver: parallel compile, float64 check, serial timing, interleaved re-timing and
// the winner's tie rule (run_sweep), and the helpers every pass's inputs share. Each pass's sweep
// (sweep.cpp: forward and backward, dense and packed; sweep_decode.cpp: KV-cache calls) feeds run_sweep with
// two hooks. Internal to tuner/.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/kernel_registry.hpp"
#include "tuner/sweep.hpp"
#include "tuner/timing.hpp"

namespace flashgen::sweep_driver {

// count random 16-bit values of dtype, normally distributed.
std::vector<uint16_t> random_bits(size_t count, DType dtype, std::mt19937_64& rng);

// Rows checked against the reference: spread over (batch, head, position), always the last row.
std::vector<RowSample> sample_rows(const AttentionShape& p, int count);

// "" when every report is ok, else the texts of those that are not (summary first, then the first mismatches).
std::string failures(const std::vector<const CheckReport*>& reports);

// Input sets for timing: several when one fits in L2, so timed launches do not reuse cached inputs.
int input_sets(CUdevice device, int64_t set_bytes);

// A shrunk check problem of a windowed sweep (small: problem with smaller lengths) with the window and chunk scaled by
// their lengths: a window sized for the sweep's lengths would hide no key of the check's, which would then test
// the window's kernels as if causal. A bounded side stays >= 1 when it was, so the check stays a window.
AttentionProblem with_check_window(AttentionProblem small, const AttentionProblem& problem);

// A sweep's call options for problem (call_options), an ALiBi problem's with its standard slopes (variant_of)
// uploaded into slopes, which the calls read: it must outlive them. A problem with a user variant takes it with the
// call's arguments of it (user_args, which must outlive the calls made with the options).
CallOptions sweep_options(const AttentionProblem& problem, DeviceBuffer& slopes,
                          const UserVariantArgs* user_args = nullptr);

// A dense sweep's candidates with the problem's user variant compiled in (as given without one), and the result's
// rows and winner without it again: a user variant's tuning data holds its base class's configs, keyed by the
// variant's tag (problem_key), and the run-time choice attaches the variant to them.
template <class Config>
std::vector<Config> with_problem_user(std::vector<Config> candidates, const AttentionProblem& problem) {
  for (Config& c : candidates) c.user = problem.user;
  return candidates;
}
void without_user(SweepResult& result);

// Bytes a candidate's kernels spill, compiling them first (through the registry's caches).
template <class Config>
int spilled_bytes_of(const Config& config, int arch) {
  return KernelRegistry::instance().spilled_bytes(config, arch);
}
inline int spilled_bytes_of(const DecodeSplitConfig& tuned, int arch) {
  return KernelRegistry::instance().spilled_bytes(tuned.config, arch);
}

// What a pass gives the driver for one candidate: why its output is wrong ("" when right), and the
// call that runs it once on input set `sample % sets`, prepared ahead so host work stays out of the
// timed region.
template <class Config>
struct PassHooks {
  std::function<std::string(const Config&)> check;
  std::function<std::function<void(int)>(const Config&)> prepare;
};

// Compiles every candidate in parallel, checks and times the compiled ones one by one (crash isolation
// hooks included), re-times the fastest few interleaved and names the winner: the fastest, or among
// those within tie_tolerance of it the first by name, so repeated sweeps agree.
template <class Config>
void run_sweep(const std::vector<Config>& candidates, int arch, CUstream stream, const SweepOptions& options,
               const PassHooks<Config>& hooks, SweepResult& result) {
  // Candidate i's row as it stands after phase, to the progress callback.
  auto report = [&](SweepPhase phase, size_t i) {
    if (!options.progress) return;
    const CandidateResult& c = result.candidates[i];
    options.progress({phase, i, candidates.size(), candidates[i].name(), c.status, c.median_ms, c.detail});
  };
  result.candidates.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) result.candidates[i].config = candidates[i];

  // 1. Compile in parallel on CPU threads; the registry's caches make repeated sweeps cheap.
  std::atomic<size_t> next{0};
  const int threads =
      std::max(1, std::min<int>(static_cast<int>(candidates.size()),
                                options.compile_threads > 0 ? options.compile_threads
                                                            : static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < candidates.size(); i = next++) {
        CandidateResult& c = result.candidates[i];
        if (auto why = candidates[i].invalid_reason(arch)) {
          c.status = CandidateStatus::kSkipped;
          c.detail = *why;
          continue;
        }
        try {
          const int spilled = spilled_bytes_of(candidates[i], arch);
          if (spilled > 0) c.detail = "spills " + std::to_string(spilled) + " bytes";
        } catch (const Error& e) {
          c.status = CandidateStatus::kCompileError;
          c.detail = e.what();
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < candidates.size(); ++i) report(SweepPhase::kCompiled, i);

  // 2. Check every compiled candidate once, then time it.
  Timer timer(stream);
  std::vector<size_t> timed;
  for (size_t i = 0; i < candidates.size(); ++i) {
    CandidateResult& c = result.candidates[i];
    const Config& config = candidates[i];
    const std::string name = config.name();
    if (c.status != CandidateStatus::kOk) continue;
    if (auto crashed = options.known_crashes.find(name); crashed != options.known_crashes.end()) {
      c.status = CandidateStatus::kCrashed;
      c.detail = crashed->second;
      report(SweepPhase::kChecked, i);
      continue;
    }
    if (options.on_launch) options.on_launch(name);
    SweepPhase phase = SweepPhase::kChecked;
    try {
      const std::string wrong = hooks.check(config);
      if (!wrong.empty()) {
        c.status = CandidateStatus::kWrongResult;
        c.detail = wrong;
        report(phase, i);
        if (options.on_launch) options.on_launch("");
        continue;
      }
      report(phase, i);
      phase = SweepPhase::kTimed;
      const std::function<void(int)> launch = hooks.prepare(config);
      const TimingResult t = timer.time(launch, options.timing);
      c.median_ms = t.median_ms;
      c.spread = t.spread();
      c.samples = t.samples;
      timed.push_back(i);
      report(phase, i);
    } catch (const Error& e) {
      c.status = CandidateStatus::kLaunchError;
      c.detail = e.what();
      report(phase, i);
      // A sticky CUDA error (an illegal address, say) leaves the context unusable for every later
      // candidate: end the sweep, with the candidate still journaled for a supervising process.
      if (e.status() == Status::kCuda && driver().cuCtxSynchronize() != CUDA_SUCCESS) throw;
    }
    if (options.on_launch) options.on_launch("");
  }
  FLASHGEN_REQUIRE(!timed.empty(), "no candidate compiled, ran and matched the reference");

  // 3. Re-time the fastest few (and those always re-timed) interleaved, then name the winner.
  std::sort(timed.begin(), timed.end(),
            [&](size_t a, size_t b) { return result.candidates[a].median_ms < result.candidates[b].median_ms; });
  const size_t fastest = std::min<size_t>(timed.size(), size_t(std::max(1, options.retime_top)));
  auto always = [&](size_t i) {
    const std::string name = candidates[i].name();
    return std::find(options.always_retime.begin(), options.always_retime.end(), name) != options.always_retime.end();
  };
  const auto rest = std::stable_partition(timed.begin() + static_cast<std::ptrdiff_t>(fastest), timed.end(), always);
  const size_t top = static_cast<size_t>(rest - timed.begin());
  std::vector<std::function<void(int)>> launches;
  for (size_t j = 0; j < top; ++j) launches.push_back(hooks.prepare(candidates[timed[j]]));
  const std::vector<TimingResult> retimed = timer.time_interleaved(launches, options.retime_rounds);
  double best = INFINITY;
  for (size_t j = 0; j < top; ++j) {
    CandidateResult& c = result.candidates[timed[j]];
    c.median_ms = retimed[j].median_ms;
    c.spread = retimed[j].spread();
    c.samples += retimed[j].samples;
    best = std::min(best, c.median_ms);
    report(SweepPhase::kRetimed, timed[j]);
  }
  const CandidateResult* winner = nullptr;
  int ties = 0;
  for (size_t j = 0; j < top; ++j) {
    const CandidateResult& c = result.candidates[timed[j]];
    if (c.median_ms > best * (1 + options.tie_tolerance)) continue;
    ++ties;
    if (winner == nullptr || config_name(c.config) < config_name(winner->config)) winner = &c;
  }
  result.winner = winner->config;
  result.winner_ms = winner->median_ms;
  result.decision = ties > 1 ? std::to_string(ties) + " candidates within " +
                                   std::to_string(options.tie_tolerance * 100) + "% of the fastest; first by name"
                             : "fastest after interleaved re-timing of the top " + std::to_string(fastest) +
                                   (top > fastest ? " and " + std::to_string(top - fastest) + " always re-timed" : "");
}

// A dense forward sweep's run of config for its check: out and lse poisoned (NaN: an unwritten element fails the
// check), call launched, then both read back, out as its 16-bit values.
struct ForwardOutputs {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};
ForwardOutputs checked_forward_run(const ForwardCall& call, const KernelConfig& config, DeviceBuffer& out,
                                   DeviceBuffer& lse, CUstream stream);

// The prepare hook of the dense forward sweeps: config prepared on each call (a timed set's); the function launches
// call `sample % calls.size()`.
std::function<void(int)> forward_launches(const std::vector<ForwardCall>& calls, const KernelConfig& config,
                                          CUstream stream);

// The prepare hook of the backward sweeps: config's launch on each call (a timed set's), each with a workspace
// of its own allocated now; the function launches call `sample % calls.size()`.
std::function<void(int)> backward_launches(const std::vector<const BackwardCall*>& calls, const BwdConfig& config,
                                           CUstream stream);

// The sweeps of packed variable-length batches (sweep_varlen.cpp), behind sweep_forward and sweep_backward:
// problem.varlen, its sequences' lengths packed_lengths(batch, seqlen, total) of its sizes.
SweepResult sweep_forward_packed(const AttentionProblem& problem, const std::vector<KernelConfig>& candidates,
                                 CUstream stream, const SweepOptions& options);
SweepResult sweep_backward_packed(const AttentionProblem& problem, const std::vector<BwdConfig>& candidates,
                                  CUstream stream, const SweepOptions& options);

// The sweep of the dense FP8 forward (sweep_fp8.cpp), behind sweep_forward: problem.dtype e4m3 or e5m2, every
// candidate writing the same 16-bit output type.
SweepResult sweep_forward_fp8(const AttentionProblem& problem, const std::vector<KernelConfig>& candidates,
                              CUstream stream, const SweepOptions& options);

}  // namespace flashgen::sweep_driver
