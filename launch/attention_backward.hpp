// Launcher stage for the backward pass: checks a call given as tensor views and options into AttnBwdParams, and
// launches the kernels of a config it is given (preprocess, dkdv, then dq or convert, and with the sinks' gradient
// wanted its kernel) on the caller's stream; the config answers whether it can implement the call and its workspace.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <string>

#include "generator/bwd_config.hpp"
#include "launch/attention.hpp"
#include "launch/user_block_classes.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

// A checked backward call: its problem (the dQ strategy from the options), and the kernel parameters bound
// to the caller's tensors.
struct BackwardCall {
  AttentionProblem problem;
  AttnBwdParams params{};  // workspace pointers (dsum, dq_accum) are filled in at launch
  KeptBlockClasses* block_mask = nullptr;  // opts.block_mask (a user mask's classes kept across calls), or null
};

// Validates every argument as make_forward_call does, for the forward's tensors plus dout, lse and
// the three gradients (dq, dout and out shaped like q; dk, dv like k), and throws Error(kInvalidArgument /
// kUnsupported) naming the argument. Touches no GPU.
BackwardCall make_backward_call(const TensorView* q, const TensorView* k, const TensorView* v, const TensorView* out,
                                const TensorView* dout, const float* lse, const TensorView* dq, const TensorView* dk,
                                const TensorView* dv, const CallOptions* opts);

// make_backward_call for a packed variable-length batch (problem/call.hpp's VarlenBackwardArgs): the
// tensors checked as the dense backward checks them, then the packing as make_varlen_forward_call checks it.
BackwardCall make_varlen_backward_call(const VarlenBackwardArgs& args);

// Device workspace a config needs for a call, in bytes: BwdConfig::workspace, with a user mask's block classes
// where the call does not keep them in a block mask. At most 4 · batch · heads_q · rows · (head_dim + 2.2) bytes plus
// alignment and the classes; rows is seqlen_q for the sm80 family and seqlen_q rounded up to 128 for the sm90 one.
size_t backward_workspace_bytes(const BackwardCall& call, const BwdConfig& config);

// A checked, resolved backward launch: relaunched as is by benchmarks, so host-side checks stay out of
// the timed region, and kept by dispatch for the next call of the same problem class (rebind). Valid while
// the call's buffers, the workspace and the preparing context live.
struct PreparedBackward {
  BwdConfig config;
  int arch = 0;
  CUfunction preprocess = nullptr;
  CUfunction dkdv = nullptr;
  CUfunction finish = nullptr;  // dq kernel (the sm80 family's deterministic strategy) or convert kernel
  CUfunction sink_grad = nullptr;  // the sinks' gradient, launched when params.dsinks is set
  CUfunction widen = nullptr;      // an FP8 call's: q, k and v as 16-bit copies in the workspace, first
  unsigned preprocess_grid[3] = {1, 1, 1};
  unsigned dkdv_grid[3] = {1, 1, 1};
  unsigned finish_grid[3] = {1, 1, 1};
  unsigned sink_grad_grid[3] = {1, 1, 1};
  unsigned widen_grid[3] = {1, 1, 1};
  unsigned dkdv_threads = 0;
  unsigned finish_threads = 0;
  unsigned dkdv_smem = 0;
  unsigned finish_smem = 0;
  size_t workspace_bytes = 0;
  AttnBwdParams params{};
  bool uses_tma = false;                 // the sm90 family: its dkdv kernel takes sm90_params
  bool finish_overlaps_dkdv = false;     // dq_adds_counted: the convert kernel may start before dkdv ends
  AttnBwdSm90Params sm90_params{};       // params plus TMA descriptors; base follows params at bind time
  UserBlockLaunch user_blocks;           // a user mask's block classes, in the workspace; empty for other configs
  KeptBlockClasses* block_mask = nullptr;     // the call's: the classes kept there rather than in the workspace
  std::optional<BwdTmaTensors> widened_tma;   // an FP8 call's maps, whose q, k and v bind_workspace re-points

  // Points the launch at call's tensors after checking they are memory of device (the launch
  // context's): call must differ from the prepared one in its data pointers only.
  void rebind(const BackwardCall& call, int device);
  // Points the launch at a workspace of at least workspace_bytes (device memory of the launch context).
  void bind_workspace(CUdeviceptr workspace);
  void operator()(CUstream stream) const;  // the kernels in order, nothing else
};

// Alignment asked of a caller's workspace: what cuMemAlloc and the pool give, which the kernels' vector
// accesses of the fp32 dQ accumulator (placed a multiple of 256 bytes behind the D rows) rely on.
inline constexpr CUdeviceptr kBackwardWorkspaceAlignment = 256;

// A caller's workspace pointer must be kBackwardWorkspaceAlignment aligned: Error naming it otherwise. Needs no GPU.
void check_workspace_alignment(CUdeviceptr workspace);

// Everything a launch does before the kernels run, for a config the caller chose: the checks of
// prepare_forward (pointers, the config's can_implement), the kernels loaded, the grids; the workspace is bound
// separately.
PreparedBackward prepare_backward(const BackwardCall& call, CUstream stream, const BwdConfig& config);

// Launches prepared's kernels on stream. With workspace == 0 the workspace is taken in stream order from
// flashgen's memory pool of the device and given back after the last kernel (StreamAllocation: no
// synchronization, and the pool keeps the memory for the next call); otherwise workspace must be device
// memory of device (the launch's), aligned to kBackwardWorkspaceAlignment, hold workspace_bytes bytes and
// stay untouched until the kernels have run.
void launch_prepared_backward(PreparedBackward& prepared, CUstream stream, int device, CUdeviceptr workspace = 0,
                              size_t workspace_bytes = 0);

// prepare_backward, then launch_prepared_backward.
void launch_backward(const BackwardCall& call, CUstream stream, const BwdConfig& config,
                     CUdeviceptr workspace = 0, size_t workspace_bytes = 0);

}  // namespace flashgen
