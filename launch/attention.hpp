// Launcher stage for the forward pass: checks a problem given as flashgen_tensor views, fills
// AttnFwdParams, asks the tuner for a config, computes the grid and launches on the caller's stream.
#pragma once

#include <cuda.h>

#include <string>

#include "dispatch/select.hpp"
#include "flashgen/flashgen.h"
#include "generator/kernel_config.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

// A flashgen_tensor over a contiguous [batch, seqlen, heads, head_dim] buffer (BSHD).
inline flashgen_tensor bshd_tensor(void* data, flashgen_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                   int64_t head_dim) {
  flashgen_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.shape[0] = batch, t.shape[1] = seqlen, t.shape[2] = heads, t.shape[3] = head_dim;
  t.stride[0] = seqlen * heads * head_dim, t.stride[1] = heads * head_dim, t.stride[2] = head_dim, t.stride[3] = 1;
  return t;
}

// Everything the launcher derived from the arguments, before anything runs.
struct ForwardProblem {
  AttnFwdParams params{};
  DType dtype = DType::kFloat16;
  int head_dim = 0;
  MaskKind mask = MaskKind::kNone;              // the kernel family's mask kind
  flashgen_mask abi_mask = FLASHGEN_MASK_NONE;  // the caller's, alignment included (for tuning sweeps)
};

// Validates every argument (null pointers, shapes, dtypes, head_dim, heads_q % heads_kv, alignment of
// pointers and strides) and throws Error(kInvalidArgument / kUnsupported) naming the argument.
// Touches no GPU.
ForwardProblem make_forward_problem(const flashgen_tensor* q, const flashgen_tensor* k,
                                    const flashgen_tensor* v, const flashgen_tensor* out, float* lse,
                                    const flashgen_attention_options* opts);

// What ran and why.
struct ForwardLaunch {
  KernelConfig config;
  int arch = 0;
  std::string reason;  // where the config came from and why (e.g. "built-in heuristic ...")
  ChoiceSource source = ChoiceSource::kHeuristic;
};

// Launches config (or the tuner's choice when config is null) for the problem on stream.
ForwardLaunch launch_forward(const ForwardProblem& problem, CUstream stream,
                             const KernelConfig* config = nullptr);

// A checked, resolved launch of one config for one problem: relaunched as is by the tuner's timing
// loops, so host-side checks stay out of the timed region. Valid while the problem's buffers and the
// context that prepared it live.
struct PreparedForward {
  ForwardLaunch launch;
  CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  unsigned smem_bytes = 0;
  AttnFwdParams params{};
  bool uses_tma = false;           // the sm90 family: the kernel takes sm90_params (params plus TMA maps)
  AttnFwdSm90Params sm90_params{};
  bool uses_tile_counter = false;  // a persistent causal sm90 kernel claims its tiles through a counter

  // cuLaunchKernel; with uses_tile_counter, with the stream's tile counter (tile_counters.hpp) or, where
  // it has none, one taken from the stream's pool, zeroed before and given back after the launch.
  void operator()(CUstream stream) const;
};

// Everything launch_forward does before cuLaunchKernel. Needs the stream's (or current) context.
PreparedForward prepare_forward(const ForwardProblem& problem, CUstream stream,
                                const KernelConfig* config = nullptr);

// make_forward_problem + launch_forward: the C++ entry point behind flashgen_attention_forward.
ForwardLaunch attention_forward(const flashgen_tensor& q, const flashgen_tensor& k, const flashgen_tensor& v,
                                const flashgen_tensor& out, float* lse,
                                const flashgen_attention_options& opts, CUstream stream);

}  // namespace flashgen
