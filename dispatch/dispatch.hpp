// Dispatch: from a checked problem to a launch, for both passes and KV-cache calls. The planner (planner.hpp) refines
// the process-wide choice (select.hpp: the user's database, the shipped defaults, the built-in heuristic) in one
// order: tune-on-first-use (unless the stream captures a graph), a paged cache, a user variant, then while the
// chosen config's kernel family cannot implement the problem (the config's can_implement) the fallback for what it
// lacks. Then the launcher launches that config. The C ABI, explain and the CLI call this layer; launchers never
// choose.
//
// A warm call is cheap: the prepared launch of a problem class (the same sizes, strides, dtype, mask and
// options, in the same context) is kept, and the next call of the class only checks its pointers, points
// the launch at its tensors and launches. A new tuning result or a change of the tune-on-first-use switch
// makes kept launches be prepared afresh.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/attention_kvcache.hpp"
#include "tuner/choice.hpp"
#include "tuner/decode_choice.hpp"

namespace flashgen {

// What a forward call runs and why.
struct ForwardLaunch {
  KernelConfig config;
  int arch = 0;
  std::string reason;  // where the config came from and each fallback taken, e.g. "built-in heuristic ..."
  ChoiceSource source = ChoiceSource::kHeuristic;
};

// What attention_forward would launch for call on stream (its context, else the current one, else the
// primary context of the device holding q), after every fallback, and its prepared launch: compiles or
// loads the kernel like a first call (and may sweep when tune-on-first-use is on), launches nothing.
struct ForwardPlan {
  ForwardLaunch launch;
  PreparedForward prepared;
};
ForwardPlan plan_forward(const ForwardCall& call, CUstream stream);

// plan_forward, then the launch; a warm call re-uses the prepared launch of its problem class.
ForwardLaunch attention_forward(const ForwardCall& call, CUstream stream);

// The launch of a config the caller asked for instead of the choice: no fallback; an Error says why the
// config cannot run the problem (launch/attention.hpp's prepare_forward). Reports source kRequested.
ForwardLaunch attention_forward(const ForwardCall& call, CUstream stream, const KernelConfig& requested);

// make_forward_call + attention_forward: the entry point behind flashgen_attention_forward.
ForwardLaunch attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                float* lse, const CallOptions& opts, CUstream stream);

// make_varlen_forward_call + attention_forward: the entry point behind flashgen_attention_varlen_forward.
ForwardLaunch attention_forward(const VarlenForwardArgs& args, CUstream stream);

// What a backward call runs and why, with the workspace it needs.
struct BackwardLaunch {
  BwdConfig config;
  int arch = 0;
  std::string reason;
  ChoiceSource source = ChoiceSource::kHeuristic;
  size_t workspace_bytes = 0;  // backward_workspace_bytes(problem, config)
};

// As plan_forward, for the backward pass.
struct BackwardPlan {
  BackwardLaunch launch;
  PreparedBackward prepared;
};
BackwardPlan plan_backward(const BackwardCall& call, CUstream stream);

// plan_backward, then the kernels, with the caller's workspace (launch_prepared_backward's rules) or, with
// workspace == 0, one from flashgen's memory pool (runtime/stream_memory.hpp).
BackwardLaunch attention_backward(const BackwardCall& call, CUstream stream, CUdeviceptr workspace = 0,
                                  size_t workspace_bytes = 0);

// make_varlen_backward_call + attention_backward (a workspace from flashgen's pool): the entry point behind
// flashgen_attention_varlen_backward.
BackwardLaunch attention_backward(const VarlenBackwardArgs& args, CUstream stream);

// make_backward_call + attention_backward: the entry point behind flashgen_attention_backward and
// flashgen_attention_backward_with_workspace.
BackwardLaunch attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                  const TensorView& dout, const float* lse, const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv, const CallOptions& opts, CUstream stream,
                                  CUdeviceptr workspace = 0, size_t workspace_bytes = 0);

// What a KV-cache call runs and why: its config, key ranges per sequence and workspace.
struct KvCacheLaunch {
  DecodeConfig config;
  int splits = 1;
  int arch = 0;
  std::string reason;
  ChoiceSource source = ChoiceSource::kHeuristic;
  size_t workspace_bytes = 0;
};

// The choice for a KV-cache call on stream's device (select.hpp's choose_decode_config: the user's database, the
// shipped defaults, the built-in heuristic; a split count the call asks for replaces the chosen one) and its
// prepared launch; launches nothing.
struct KvCachePlan {
  KvCacheLaunch launch;
  PreparedKvCache prepared;
};
KvCachePlan plan_kvcache(const KvCacheCall& call, CUstream stream);

// make_kvcache_call + plan_kvcache + the launch (the caller's workspace, or one from flashgen's pool): the
// entry point behind flashgen_attention_kvcache. A warm call re-uses the prepared launch of its problem class.
KvCacheLaunch attention_kvcache(const KvCacheArgs& args, CUstream stream);

// The workspace attention_kvcache needs for args (its kept launch's, planned now when there is none): the entry
// point behind flashgen_attention_kvcache_workspace_size.
size_t kvcache_workspace_size(const KvCacheArgs& args, CUstream stream);

}  // namespace flashgen
