// Launcher stage for the backward pass: checks a problem given as flashgen_tensor views, fills
// AttnBwdParams, picks a config and launches its kernels (preprocess, dkdv, then dq or convert) on the
// caller's stream.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "dispatch/select.hpp"
#include "flashgen/flashgen.h"
#include "generator/bwd_config.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

struct BackwardProblem {
  AttnBwdParams params{};  // workspace pointers (dsum, dq_accum) are filled in at launch
  DType dtype = DType::kFloat16;
  int head_dim = 0;
  MaskKind mask = MaskKind::kNone;
  flashgen_mask abi_mask = FLASHGEN_MASK_NONE;  // the caller's, alignment included (for tuning sweeps)
  bool deterministic = false;
};

// Validates every argument as make_forward_problem does, for the forward's tensors plus dout, lse and
// the three gradients (dq, dout and out shaped like q; dk, dv like k), and throws Error(kInvalidArgument /
// kUnsupported) naming the argument. Touches no GPU.
BackwardProblem make_backward_problem(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                                      const flashgen_tensor* out, const flashgen_tensor* dout, const float* lse,
                                      const flashgen_tensor* dq, const flashgen_tensor* dk, const flashgen_tensor* dv,
                                      const flashgen_attention_options* opts);

// Device workspace a config needs for a problem, in bytes: D = rowsum(dO ∘ O) in fp32 for every
// (batch, head, query), the LSE in base 2 likewise for the sm90 family, plus the fp32 dQ accumulator
// (batch · heads_q · rows · head_dim floats) for the atomic strategy. rows is seqlen_q for the sm80
// family and seqlen_q rounded up to 128 for the sm90 one: at most 4 · batch · heads_q · rows ·
// (head_dim + 2) bytes plus alignment.
size_t backward_workspace_bytes(const BackwardProblem& problem, const BwdConfig& config);

struct BackwardLaunch {
  BwdConfig config;
  int arch = 0;
  std::string reason;
  ChoiceSource source = ChoiceSource::kHeuristic;
};

// The built-in choice for a problem on sm_<arch> (the first spill-free heuristic config; the sm80
// family's where TMA cannot describe the tensors), without tuning data. Memoized. The launch itself
// (prepare_backward, launch_backward with no config) also consults the tuning data first.
BwdConfig choose_backward_config(const BackwardProblem& problem, int arch, std::string* reason = nullptr);

// A checked, resolved backward launch: relaunched as is by benchmarks, so host-side checks stay out of
// the timed region. Valid while the problem's buffers, the workspace and the preparing context live.
struct PreparedBackward {
  BackwardLaunch launch;
  CUfunction preprocess = nullptr;
  CUfunction dkdv = nullptr;
  CUfunction finish = nullptr;  // dq kernel (deterministic) or convert kernel (atomic)
  unsigned preprocess_grid[3] = {1, 1, 1};
  unsigned dkdv_grid[3] = {1, 1, 1};
  unsigned finish_grid[3] = {1, 1, 1};
  unsigned dkdv_threads = 0;
  unsigned finish_threads = 0;
  unsigned dkdv_smem = 0;
  unsigned finish_smem = 0;
  size_t workspace_bytes = 0;
  AttnBwdParams params{};
  bool uses_tma = false;                 // the sm90 family: its dkdv kernel takes sm90_params
  AttnBwdSm90Params sm90_params{};       // params plus TMA descriptors; base follows params at bind time

  // Points the launch at a workspace of at least workspace_bytes (device memory of the launch context).
  void bind_workspace(CUdeviceptr workspace);
  void operator()(CUstream stream) const;  // the kernels in order, nothing else
};

// Alignment asked of a caller's workspace: what cuMemAlloc and the pool give, which the kernels' vector
// accesses of the fp32 dQ accumulator (placed a multiple of 256 bytes behind the D rows) rely on.
inline constexpr CUdeviceptr kBackwardWorkspaceAlignment = 256;

// Everything launch_backward does before the launches; the workspace is bound separately.
PreparedBackward prepare_backward(const BackwardProblem& problem, CUstream stream, const BwdConfig* config = nullptr);

// Launches config (or the built-in choice when null) on stream. With workspace == 0 the workspace is
// taken from the device's current stream-ordered memory pool on stream and given back on it after the last
// kernel (cuMemAllocAsync / cuMemFreeAsync: no synchronization; the pool's release threshold decides
// whether it keeps the memory for the next call); otherwise workspace must be device memory of the launch's device, kBackwardWorkspaceAlignment
// aligned, hold workspace_bytes bytes and stay untouched until the kernels have run.
BackwardLaunch launch_backward(const BackwardProblem& problem, CUstream stream, const BwdConfig* config = nullptr,
                               CUdeviceptr workspace = 0, size_t workspace_bytes = 0);

}  // namespace flashgen
