// A call's arguments as the layers below api/ take them: the options of every attention call, and the arguments
// of packed and KV-cache calls. api/ translates flashgen.h's structs into these field for field (their sizes checked
// there); launch/ checks the values, naming the C ABI's fields ("opts.window_left"), and dispatch/, the tuner and
// the CLI build them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "problem/attention_problem.hpp"
#include "problem/tensor_view.hpp"
#include "problem/user_variant.hpp"

namespace flashgen {

// A user mask's block classes kept across calls (launch/user_block_classes.hpp; the C ABI's flashgen_block_mask
// holds one): opaque here, where a call only carries it.
struct KeptBlockClasses;

// The options of every attention call (flashgen_attention_options' fields).
struct CallOptions {
  float softmax_scale = 0.f;   // <= 0: 1/sqrt(head_dim)
  Mask mask = Mask::kNone;     // the caller's value as given: launch/ refuses one outside the enumerators
  bool deterministic = false;  // backward: dQ by a kernel of its own, bitwise repeatable
  float softcap = 0.f;         // > 0: each score s becomes softcap · tanh(s / softcap); 0: none
  int32_t window_left = -1;    // Mask::kSlidingWindow's keys before and after the diagonal; -1: unbounded
  int32_t window_right = -1;
  const float* alibi_slopes = nullptr;  // device fp32 [heads_q] or [batch, heads_q], or null: no ALiBi
  int64_t alibi_batch_stride = 0;       // elements between sequences' slopes; 0: one array for every sequence
  const float* sinks = nullptr;         // device fp32 [heads_q]: a logit per head in each row's softmax, or null
  float* dsinks = nullptr;              // backward with sinks: device fp32 [heads_q] for their gradient, or null
  int32_t attention_chunk = 0;          // > 0: a query sees only keys of its own chunk of that many positions
  std::shared_ptr<const UserVariant> variant;    // null: none
  const void* const* variant_buffers = nullptr;  // host array of the variant's buffers' device pointers
  const void* variant_scalars = nullptr;         // host array of its scalars' 4-byte values
  KeptBlockClasses* block_mask = nullptr;        // where a user mask's classes are kept across calls, or null
  // An FP8 forward's descales (q, k and v e4m3 or e5m2): fp32 device arrays read at (batch entry, kv head) with
  // these strides in elements ({0, 0}: one value), each tensor standing for its values times its descale; null: 1.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_stride[2] = {0, 0};
  int64_t k_descale_stride[2] = {0, 0};
  int64_t v_descale_stride[2] = {0, 0};
};

// The options a call of problem passes: its mask and window, soft cap and (backward) dQ strategy, with
// softmax_scale (<= 0: 1/sqrt(head_dim)); no slopes, sinks or variant (those come with device buffers).
CallOptions call_options(const AttentionProblem& problem, float softmax_scale = 0.f);

// A packed forward call (flashgen_varlen_forward_args): q and out [1, total_q, heads_q, head_dim], k and v
// [1, total_k, heads_kv, head_dim], or with a block table [num_pages, page_size, heads_kv, head_dim].
struct VarlenForwardArgs {
  TensorView q, k, v, out;
  float* lse = nullptr;                   // fp32 [heads_q, total_q], or null
  const int32_t* cu_seqlens_q = nullptr;  // device [batch + 1]: sequence b's queries are rows [cu[b], cu[b + 1])
  const int32_t* cu_seqlens_k = nullptr;  // device [batch + 1]: its keys likewise
  const int32_t* seqused_k = nullptr;     // device [batch]: the keys sequence b uses, or null
  int64_t batch = 0;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
  CallOptions options;
  const int32_t* block_table = nullptr;   // device [batch, max_pages], or null: k and v packed
  int64_t max_pages = 0;
};

// A packed backward call (flashgen_varlen_backward_args): the forward's tensors, lse and offsets, dout, and the
// gradients (dq like q, dk and dv like k).
struct VarlenBackwardArgs {
  TensorView q, k, v, out, dout, dq, dk, dv;
  const float* lse = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t batch = 0;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
  CallOptions options;
};

// New queries against a KV cache (flashgen_kvcache_args): contiguous, or paged through a block table.
struct KvCacheArgs {
  TensorView q;        // [batch, seqlen_q, heads_q, head_dim]
  TensorView k_cache;  // [batch, capacity, heads_kv, head_dim], or paged [num_pages, page_size, heads_kv, head_dim]
  TensorView v_cache;
  TensorView k_new;    // [batch, seqlen_new, heads_kv, head_dim] appended before attending, or data null: none
  TensorView v_new;
  TensorView out;
  float* lse = nullptr;                    // fp32 [batch, heads_q, seqlen_q], or null
  const int32_t* cache_seqlens = nullptr;  // device [batch]: keys in each cache before the new ones, or null: full
  const int32_t* block_table = nullptr;    // device [batch, max_pages], or null: contiguous
  int64_t max_pages = 0;
  int64_t num_splits = 0;                  // key ranges per sequence; 0: chosen
  void* workspace = nullptr;               // the ranges' partial results, or null: from flashgen's pool
  size_t workspace_bytes = 0;
  CallOptions options;
  // An FP8 cache's scales: device fp32, sequence b's kv head h's at b * stride[0] + h * stride[1]; null: 1.
  const float* k_scale = nullptr;
  int64_t k_scale_stride[2] = {0, 0};
  const float* v_scale = nullptr;
  int64_t v_scale_stride[2] = {0, 0};
};

}  // namespace flashgen
