// Launcher stage for attention against a KV cache (decoding; templates/decode_sm80.cuh): checks a
// KvCacheArgs call into AttnDecodeParams, and launches a config and split count it is given
// (dispatch/ chooses them) on the caller's stream: the append kernel when there are new tokens, the
// attention, and the combine kernel when the keys are split into more than one range.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "generator/decode_config.hpp"
#include "problem/attention_problem.hpp"
#include "problem/call.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

// A checked KV-cache call: its problem (kv_cache, paged; shape.seqlen_k is the cache's capacity), the kernel
// parameters bound to the caller's tensors, and what the caller asked of the split and the workspace.
struct KvCacheCall {
  AttentionProblem problem;
  AttnDecodeParams params{};
  int num_splits = 0;  // 0: dispatch chooses
  CUdeviceptr workspace = 0;
  size_t workspace_bytes = 0;
};

// Validates every argument (sizes, dtypes, layouts, the cache's and block table's shapes, the new tokens, the
// split count and workspace) and throws Error(kInvalidArgument / kUnsupported) naming the argument. Touches
// no GPU.
KvCacheCall make_kvcache_call(const KvCacheArgs& args);

// Key ranges a call with this config and a requested count uses: 1 to max_decode_splits (the key blocks its
// rows can visit: the capacity's, or a window's).
int clamp_splits(const KvCacheCall& call, const DecodeConfig& config, int splits);

// Device workspace of a call with config split into `splits` key ranges (DecodeConfig::workspace; 0 for one range).
size_t kvcache_workspace_bytes(const KvCacheCall& call, const DecodeConfig& config, int splits);

// A checked, resolved launch of one config and split count for one call.
struct PreparedKvCache {
  DecodeConfig config;
  int arch = 0;
  int splits = 1;
  CUfunction append = nullptr;   // null when nothing is appended
  CUfunction attend = nullptr;
  CUfunction combine = nullptr;  // null with one range
  unsigned append_grid[2] = {1, 1};
  unsigned attend_grid[3] = {1, 1, 1};
  unsigned combine_grid = 1;
  unsigned attend_threads = 0;
  unsigned attend_smem_bytes = 0;
  AttnDecodeParams params{};
  size_t workspace_bytes = 0;

  // Points the launch at call's tensors after checking they are memory of device (the launch context's): call
  // must differ from the prepared one in its data pointers only.
  void rebind(const KvCacheCall& call, int device);

  // Queues the kernels on stream with workspace (at least workspace_bytes; unused with one range).
  void operator()(CUstream stream, CUdeviceptr workspace) const;
};

// Checks that the pointers are memory of the launch's device and that config can implement the call there
// (DecodeConfig::can_implement), then loads the kernels and computes the grids. Needs the stream's (or current)
// context.
PreparedKvCache prepare_kvcache(const KvCacheCall& call, CUstream stream, const DecodeConfig& config, int splits);

// The prepared kernels with the call's workspace, or one from flashgen's memory pool when the call gave none.
void launch_prepared_kvcache(const PreparedKvCache& prepared, const KvCacheCall& call, CUstream stream, int device);

}  // namespace flashgen
