// Run-time config choice for the forward pass. Order: the user's tuning database (exact size bucket,
// then the nearest bucket of the same device and problem class), then the built-in heuristic's
// preference list checked against what ptxas reports. A call never fails for lack of tuning data, and
// every answer is memoized per process.
#pragma once

#include <string>

#include "bwd_config.hpp"
#include "kernel_config.hpp"
#include "problem_key.hpp"

namespace flashgen {

class ShippedDefaults;
class TuningStore;

struct ForwardChoice {
  KernelConfig config;
  std::string reason;  // where the config came from, e.g. "built-in heuristic (no tuning data)"
};

// The first heuristic config whose compiled kernel does not spill (compiling through the kernel
// registry's caches); the first one when all of them spill, saying so in the reason. Memoized.
ForwardChoice heuristic_choice(DType dtype, int head_dim, MaskKind mask, int arch);

// The choice from explicit data sources (either may be null): user_db exact bucket, user_db nearest
// bucket, the shipped defaults (exact, then nearest bucket, for a GPU of the same kind), then
// heuristic_choice. A stored config that cannot run on sm_<arch> is passed over, and the reason says so.
// Not memoized: the process-wide form below is.
ForwardChoice choose_forward_config(const DeviceFingerprint& device, const ProblemKey& problem, int arch,
                                    const TuningStore* user_db, const ShippedDefaults* shipped = nullptr);

// Process-wide choice for device (a CUDA device ordinal): the user's database at
// TuningStore::default_path(), opened read-only on first use (a missing file means no tuning data), then
// ShippedDefaults::instance(), memoized per (device, problem key). Thread-safe; microseconds after the first call for a key.
ForwardChoice choose_forward_config(int device, const ProblemKey& problem, int arch);

struct BackwardChoice {
  BwdConfig config;
  std::string reason;
};

// The first built-in backward config for the problem class whose kernels (dkdv, and dq when
// deterministic) compile without spills; the first one when all spill, saying so. Memoized.
BackwardChoice heuristic_backward_choice(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch);

}  // namespace flashgen
