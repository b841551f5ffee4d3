// Tuning stores in tests: a device, problem keys, configs and candidate results to record, and a small sweep to
// record with them (tests/tuner/test_store*.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tuner/store.hpp"

namespace flashgen::testing {

inline DeviceFingerprint device(const std::string& gpu_name = "NVIDIA H200", int sm = 90) {
  DeviceFingerprint d;
  d.gpu_name = gpu_name;
  d.sm = sm;
  d.sm_count = 132;
  d.driver_version = 13000;
  d.nvrtc_version = "13.0";
  d.generator_version = "1";
  return d;
}

inline ProblemKey problem(int64_t seqlen_q, int64_t seqlen_k, int64_t batch_heads = 64, DType dtype = DType::kFloat16,
                          int gqa_ratio = 1) {
  return forward_problem_key(dtype, 128, MaskKind::kNone, gqa_ratio, seqlen_q, seqlen_k, batch_heads);
}

inline KernelConfig config(int block_m, int block_n, int warps = 4, int stages = 2, DType dtype = DType::kFloat16) {
  KernelConfig c;
  c.dtype = dtype;
  c.head_dim = 128;
  c.block_m = block_m;
  c.block_n = block_n;
  c.sm80()->warps = warps;
  c.stages = stages;
  return c;
}

inline CandidateResult candidate(const KernelConfig& c, double median_ms,
                                 CandidateStatus status = CandidateStatus::kOk) {
  const bool timed = status == CandidateStatus::kOk;
  CandidateResult r;
  r.config = c;
  r.status = status;
  r.median_ms = timed ? median_ms : 0;
  r.spread = timed ? 0.015 : 0;
  r.samples = timed ? 25 : 0;
  r.detail = timed ? "" : "ptxas: too many resources requested";
  return r;
}

// Records a small sweep whose winner is the first (fastest) candidate.
inline void record_sweep(TuningStore& store, const DeviceFingerprint& d, const ProblemKey& p, double best_ms,
                         const KernelConfig& best = config(128, 64)) {
  // The other candidates are of the winner's problem class too (its head dims, mask and cap), as an import requires.
  KernelConfig slower = config(64, 64, 4, 2, best.dtype), failed = config(128, 128, 8, 3, best.dtype);
  for (KernelConfig* c : {&slower, &failed}) {
    c->head_dim = best.head_dim, c->head_dim_v = best.head_dim_v, c->mask = best.mask, c->mods = best.mods;
  }
  std::vector<CandidateResult> results = {candidate(best, best_ms), candidate(slower, best_ms * 1.3),
                                          candidate(failed, 0, CandidateStatus::kCompileError)};
  store.record(d, p, results, best, best_ms);
}

}  // namespace flashgen::testing
