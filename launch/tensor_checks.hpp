// Argument checks shared by the launchers: presence, dtype, shape ranges and memory layout of tensor views, the
// options, and where device pointers live. Every failure throws Error(kInvalidArgument / kUnsupported) naming the
// argument as the C ABI names it ("q.stride[3]", "opts.softcap").
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "flashgen/error.hpp"
#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"
#include "generator/kernel_module.hpp"
#include "problem/attention_problem.hpp"
#include "problem/call.hpp"
#include "problem/tensor_view.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

// Largest extent of any dimension: keeps every index sum inside the kernels' 32-bit arithmetic.
constexpr int64_t kMaxExtent = int64_t(1) << 30;

// "q.shape[3] (head_dim)"
std::string dim(const char* tensor, int i);

// Presence, dtype and shape ranges of one tensor argument.
// fp8_taken: the argument may hold FP8 (a KV cache's); elsewhere FP8 is refused (kUnsupported) naming it.
void check_tensor(const TensorView* t, const char* name, bool fp8_taken = false);

// Memory layout the kernels can read with 16-byte copies: unit head_dim stride, aligned rows.
void check_layout(const TensorView* t, const char* name);

// An output is written by many blocks at once: no two of its rows may share memory.
void check_output_strides(const TensorView* out, const char* name);

// Device memory of the context's device, or an error naming the argument.
void check_device_pointer(const void* ptr, const char* name, int device);

// A user variant's buffers in v, each on device (null entries: none declared).
inline void check_user_buffers(const VariantArgs& v, int device) {
  for (int i = 0; i < kMaxUserBuffers && v.user_buffers[i] != nullptr; ++i) {
    check_device_pointer(v.user_buffers[i], ("opts.variant_buffers[" + std::to_string(i) + "]").c_str(), device);
  }
}

void require_same_dim(const TensorView* a, const char* a_name, const TensorView* b, const char* b_name,
                      int i);

// FP8 scales (a KV cache's k_scale and v_scale, the forward's descales): null, or taken only where the tensors are FP8
// (else refused as given_for what, e.g. "a 16-bit cache (scales are an FP8 cache's)"), 4-byte aligned, strides in
// [0, 2^40]. The values live on the device: not read here.
void check_fp8_scales(const float* scale, const int64_t (&stride)[2], const char* name, bool fp8,
                      const char* given_for);

// An FP8 call's q_descale, k_descale and v_descale of opts, each checked by check_fp8_scales (refused as given for
// given_for where the call is 16-bit); bound into p (pointers and strides); checked as memory of device.
void check_fp8_descales(const CallOptions& opts, bool fp8, const char* given_for);
void bind_fp8_descales(const CallOptions& opts, AttnFwdParams& p);
void check_fp8_descale_pointers(const AttnFwdParams& p, int device);

// t's dtype that of q: an error naming both otherwise.
void require_same_dtype(const TensorView* t, const char* name, const TensorView* q);

// The packing of a variable-length batch (VarlenForwardArgs, VarlenBackwardArgs): device offsets of its sequences'
// rows, and the sizes the host is told.
struct Packing {
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_k;  // may be null
  int64_t batch;
  int64_t max_seqlen_q;
  int64_t max_seqlen_k;
};

// What the host can see of a packing over checked tensors q and k: one batch entry each, offsets given and
// 4-byte aligned, batch in [1, 65535], the longest lengths in [1, total]. Error(kInvalidArgument) naming the
// argument otherwise.
void check_packing(const TensorView& q, const TensorView& k, const Packing& packing);

// A window problem's sides in v, given the bounds that reach past every key of every row on each side: an
// unbounded side becomes its bound, and so does any larger side, which is clamped to it. The kernels add a
// side to a row's diagonal, so the bounds are the least that reach (no sum passes seqlen_q + seqlen_k plus a
// block). The chunk (0: none) is bounded by left_bound: one such chunk already holds every key. All three 0 for
// the other masks, whose kernels never read them.
void set_window_sides(VariantArgs& v, const AttentionProblem& problem, int64_t left_bound, int64_t right_bound);

// Whether a problem's diagonal is aligned bottom-right (every mask but Mask::kCausalTopLeft): the
// causal mask's, a window's and ALiBi's distances lie about it.
inline bool aligned_bottom_right(const AttentionProblem& problem) {
  return problem.mask != Mask::kCausalTopLeft;
}

// A checked packing into a call's problem (varlen, its totals, batch and longest lengths) and params (the
// offsets, totals, sizes, the causal alignment the kernels apply per sequence, and the window's sides for the
// longest lengths). The caller zeroes the tensors' batch strides: every sequence lives in batch entry 0.
template <class Params>
void bind_packing(const Packing& packing, const TensorView& q, const TensorView& k,
                  AttentionProblem& problem, Params& p) {
  problem.varlen = true;
  problem.total_q = q.shape[1], problem.total_k = k.shape[1];
  problem.shape.batch = packing.batch;
  problem.shape.seqlen_q = packing.max_seqlen_q, problem.shape.seqlen_k = packing.max_seqlen_k;
  p.batch = static_cast<int>(packing.batch);
  p.seqlen_q = static_cast<int>(packing.max_seqlen_q), p.seqlen_k = static_cast<int>(packing.max_seqlen_k);
  p.cu_seqlens_q = packing.cu_seqlens_q, p.cu_seqlens_k = packing.cu_seqlens_k, p.seqused_k = packing.seqused_k;
  p.total_q = static_cast<int>(q.shape[1]), p.total_k = static_cast<int>(k.shape[1]);
  p.variant.causal_offset = 0;  // each sequence's own, set in the kernels
  p.causal_bottom_right = aligned_bottom_right(problem) ? 1 : 0;
  set_window_sides(p.variant, problem, p.seqlen_k, p.seqlen_q);  // as variant_args bounds them
}

// The sizes of checked tensors q [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv, head_dim] and
// v [batch, seqlen_k, heads_kv, head_dim_v]: head_dim_v 0 where v's head dim is q's.
AttentionShape shape_of(const TensorView* q, const TensorView* k, const TensorView* v);

// q's head_dim a multiple of 8 up to max_head_dim (kUnsupported otherwise), and q's heads a multiple of k's.
void check_head_dim_and_groups(const TensorView* q, const TensorView* k, int max_head_dim);

// v's head dim, which out's must equal: q's, or where own_dim_taken (the forward's and the backward's calls, dense
// and packed) one of its own, a multiple of 8 up to 512; kUnsupported for a dim no kernel family takes, kInvalidArgument where the call takes
// none (saying which calls do).
void check_value_dim(const TensorView* v, const char* v_name, const TensorView* out, const char* out_name,
                     const TensorView* q, bool own_dim_taken);

// opts.mask one of Mask's values, opts.softmax_scale finite, opts.softcap none or a usable cap, under
// the window mask each of opts.window_left and opts.window_right >= -1, ALiBi slopes (when given) 4-byte
// aligned with a batch stride of 0 or at least heads_q, and the sinks and their gradient 4-byte aligned.
void check_options(const CallOptions* opts, int64_t heads_q);

// A user variant of opts into problem.user (none without one), checked: each declared buffer non-null and the scalars
// given; refuses a score function beside a soft cap or ALiBi (it takes their place), and in a backward call one
// without the derivative it needs.
void set_user_variant(AttentionProblem& problem, const CallOptions& opts);

// A call's variant arguments (attn_params.cuh's VariantArgs) from opts and its problem, problem.user already set:
// the causal offset of seqlen_q queries over seqlen_k keys, the softmax scale, the soft cap's factors (0 without a
// cap), ALiBi's slopes (null without them), the sinks, each declared user buffer and scalar's 32 bits, and a window's
// sides bounded by (seqlen_k, seqlen_q) (set_window_sides). A row's diagonal is row + seqlen_k - seqlen_q, in
// [seqlen_k - seqlen_q, seqlen_k) (of its own sequence in a packed batch): seqlen_k keys before it reach key 0 from
// every row, and seqlen_q keys after it the last key. A KV-cache call gives its capacity as seqlen_k.
VariantArgs variant_args(const AttentionProblem& problem, const CallOptions& opts, int seqlen_q,
                         int seqlen_k);

// opts.block_mask, where a call can keep its classes there: with a variant that has a mask_mod, not over a KV cache
// (dense or paged: decoding keeps no classes). Error naming it otherwise.
KeptBlockClasses* user_block_mask(const CallOptions& opts, const AttentionProblem& problem);

// The scale the kernels apply: opts.softmax_scale when > 0, else 1/sqrt(head_dim).
float softmax_scale(const CallOptions& opts, int64_t head_dim);

// A dense problem's diagonal: key j is visible to query i iff j <= i + causal_offset under a causal mask
// (flashgen.h's alignments), and a window and ALiBi's distances lie about j = i + causal_offset: seqlen_k -
// seqlen_q aligned bottom-right, else 0.
int causal_offset(const AttentionProblem& problem, int seqlen_q, int seqlen_k);

// The sm number of the launch's device; kUnsupported below sm_80.
int launch_arch(CUdevice device);

// A config the caller asked for, without a call's tensors: it must match the problem and be able to run on sm_<arch>
// (generator/kernel_module.hpp's problem_fit, the first of its can_implement's checks).
template <class Config>
void check_requested_config(const Config& config, const AttentionProblem& problem, int arch) {
  if (const Implementability fit = problem_fit(config, problem, arch); !fit) fail_unimplementable(config.name(), fit);
}

}  // namespace flashgen
