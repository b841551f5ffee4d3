// Launcher stage for the forward pass: checks a call given as tensor views and options into AttnFwdParams, and
// launches a config it is given (dispatch/ chooses which; the config answers whether it can implement the call) on
// the caller's stream.
#pragma once

#include <cuda.h>

#include <string>

#include "generator/kernel_config.hpp"
#include "launch/user_block_classes.hpp"
#include "problem/attention_problem.hpp"
#include "problem/call.hpp"
#include "problem/tensor_view.hpp"
#include "runtime/cuda_driver.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

// A checked forward call: its problem, and the kernel parameters bound to the caller's tensors.
struct ForwardCall {
  AttentionProblem problem;
  AttnFwdParams params{};
  KeptBlockClasses* block_mask = nullptr;  // opts.block_mask (a user mask's classes kept across calls), or null
};

// Validates every argument (null pointers, shapes, dtypes, head_dim, heads_q % heads_kv, alignment of
// pointers and strides) and throws Error(kInvalidArgument / kUnsupported) naming the argument.
// Touches no GPU.
ForwardCall make_forward_call(const TensorView* q, const TensorView* k, const TensorView* v, const TensorView* out,
                              float* lse, const CallOptions* opts);

// make_forward_call for a packed variable-length batch (problem/call.hpp's VarlenForwardArgs): the
// tensors checked as the dense call checks them, then what the host can see of the packing (one batch
// entry, offsets given and aligned, the sequence count and longest lengths in range), each error naming
// the argument. The call's problem is varlen: shape.batch sequences of at most max_seqlen_q and max_seqlen_k.
ForwardCall make_varlen_forward_call(const VarlenForwardArgs& args);

// A checked, resolved launch of one config for one call: relaunched as is by the tuner's timing
// loops, so host-side checks stay out of the timed region, and kept by dispatch for the next call of the
// same problem class, pointed at the new call's tensors by rebind. Valid while the call's buffers and
// the context that prepared it live.
struct PreparedForward {
  KernelConfig config;
  int arch = 0;
  CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  unsigned smem_bytes = 0;
  AttnFwdParams params{};
  bool uses_tma = false;           // the sm90 family: the kernel takes sm90_params (params plus TMA maps)
  AttnFwdSm90Params sm90_params{};
  bool uses_tile_counter = false;  // a persistent causal or windowed sm90 kernel claims its tiles through a counter
  // A user mask's block classes (templates/user_blocks.cuh), computed before each launch into stream-ordered memory;
  // empty for other configs.
  UserBlockLaunch user_blocks;
  KeptBlockClasses* block_mask = nullptr;  // the call's: where the classes are kept, or null (per call)
  // An FP8 config's Vᵀ kernel (templates/fwd_sm90_values.cuh), run first into stream-ordered memory of the launch's,
  // and Vᵀ as v_map describes it (its data set per launch); null for 16-bit configs.
  CUfunction values_t = nullptr;
  TmaTensor values_t_tensor;
  int values_t_rows = 0;

  // Points the launch at call's tensors after checking they are memory of device (the launch
  // context's): call must differ from the prepared one in its data pointers only.
  void rebind(const ForwardCall& call, int device);

  // cuLaunchKernel; with uses_tile_counter, with the stream's tile counter (tile_counters.hpp) or, where
  // it has none, one taken from flashgen's pool (StreamAllocation), zeroed before and given back after
  // the launch. An FP8 config's Vᵀ takes memory from that pool likewise.
  void operator()(CUstream stream) const;

 private:
  // The user mask's classes (where the config has them), then the attention kernel, on plain and sm90.
  void launch_with(CUstream stream, const AttnFwdParams& plain, const AttnFwdSm90Params& tma) const;
  // The attention kernel itself, on plain (or sm90, its TMA form), with its tile counter.
  void launch_attention(CUstream stream, const AttnFwdParams& plain, const AttnFwdSm90Params& sm90) const;
};

// Everything a launch does before cuLaunchKernel, for a config the caller chose: checks that the pointers
// are memory of the launch's device and that the config can implement the call there (KernelConfig::can_implement;
// Error naming why otherwise), then loads the kernel and computes the grid. Needs the stream's (or current) context.
PreparedForward prepare_forward(const ForwardCall& call, CUstream stream, const KernelConfig& config);

// prepare_forward, then the launch.
void launch_forward(const ForwardCall& call, CUstream stream, const KernelConfig& config);

}  // namespace flashgen
