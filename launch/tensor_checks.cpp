// Argument checks shared by the forward and backward launchers.
#include "launch/tensor_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <tuple>
#include <utility>

#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {

namespace {

const char* kDimNames[4] = {"batch", "seqlen", "heads", "head_dim"};

}  // namespace

std::string dim(const char* tensor, int i) {
  return std::string(tensor) + ".shape[" + std::to_string(i) + "] (" + kDimNames[i] + ")";
}

// Presence, dtype and shape ranges of one tensor argument.
void check_tensor(const TensorView* t, const char* name, bool fp8_taken) {
  FLASHGEN_REQUIRE(t != nullptr, std::string(name) + ": null pointer");
  FLASHGEN_REQUIRE(t->data != nullptr, std::string(name) + ".data: null pointer");
  const int dtype = static_cast<int>(t->dtype);  // any value a caller gave (DType is int-sized)
  const bool fp8 = t->dtype == DType::kFloat8E4M3 || t->dtype == DType::kFloat8E5M2;
  FLASHGEN_REQUIRE(t->dtype == DType::kFloat16 || t->dtype == DType::kBFloat16 || fp8,
                   std::string(name) + ".dtype: unknown value " + std::to_string(dtype));
  if (fp8 && !fp8_taken) {
    fail(Status::kUnsupported, std::string(name) + ".dtype is " + dtype_name(t->dtype) +
                                   ": FP8 is taken by q, k and v (flashgen_attention_forward, "
                                   "flashgen_attention_varlen_forward, flashgen_attention_backward) and a KV cache's "
                                   "k_cache and v_cache (flashgen_attention_kvcache), not here");
  }
  for (int i = 0; i < 4; ++i) {
    FLASHGEN_REQUIRE(t->shape[i] >= 1 && t->shape[i] <= kMaxExtent,
                     dim(name, i) + " must be in [1, 2^30], got " + std::to_string(t->shape[i]));
  }
}

// Memory layout the kernels can read with 16-byte copies: unit head_dim stride, aligned rows.
void check_layout(const TensorView* t, const char* name) {
  const int64_t chunk = 16 / elem_bytes(t->dtype);  // elements of 16 bytes
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(t->data) % 16 == 0,
                   std::string(name) + ".data: pointer must be 16-byte aligned");
  FLASHGEN_REQUIRE(t->stride[3] == 1, std::string(name) + ".stride[3] must be 1 (head_dim contiguous), got " +
                                          std::to_string(t->stride[3]));
  for (int i = 0; i < 3; ++i) {
    // A dimension of size 1 is never stepped over, so its stride does not matter.
    if (t->shape[i] == 1) continue;
    FLASHGEN_REQUIRE(t->stride[i] >= 0 && t->stride[i] % chunk == 0,
                     std::string(name) + ".stride[" + std::to_string(i) + "] must be a non-negative multiple of " +
                         std::to_string(chunk) + " elements (16 bytes), got " + std::to_string(t->stride[i]));
  }
  // The farthest element's offset must be addressable (and the sizes derived from it free of overflow).
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) {
    int64_t step = 0;
    const bool overflow = __builtin_mul_overflow(t->stride[i], t->shape[i] - 1, &step) ||
                          __builtin_add_overflow(last, step, &last);
    FLASHGEN_REQUIRE(!overflow && last < (int64_t{1} << 60),
                     std::string(name) + ": its strides reach past 2^60 elements from its data pointer");
  }
}

// The output is written by many blocks at once: no two of its elements may share memory. Taken by
// increasing stride, each dimension must step past everything the smaller ones span.
void check_output_strides(const TensorView* out, const char* name) {
  for (int i = 0; i < 3; ++i) {
    FLASHGEN_REQUIRE(out->shape[i] == 1 || out->stride[i] != 0,
                     std::string(name) + ".stride[" + std::to_string(i) + "] is 0 for a dimension of size " +
                         std::to_string(out->shape[i]) + ": output rows would overwrite each other");
  }
  int order[4] = {0, 1, 2, 3};
  std::sort(std::begin(order), std::end(order), [&](int a, int b) { return out->stride[a] < out->stride[b]; });
  int64_t span = 1;  // elements covered by the dimensions taken so far
  for (int i : order) {
    if (out->shape[i] == 1) continue;
    FLASHGEN_REQUIRE(out->stride[i] >= span, std::string(name) + ".stride[" + std::to_string(i) + "] = " +
                                                 std::to_string(out->stride[i]) + " is less than the " +
                                                 std::to_string(span) +
                                                 " elements the smaller strides span: output elements would overlap");
    span = out->stride[i] * (out->shape[i] - 1) + span;
  }
}

// Device memory of the context's device, or an error naming the argument.
void check_device_pointer(const void* ptr, const char* name, int device) {
  const PointerInfo info = pointer_info(ptr);
  FLASHGEN_REQUIRE(info.device_accessible,
                   std::string(name) + ": not device memory (a host or unregistered pointer)");
  FLASHGEN_REQUIRE(info.device == device, std::string(name) + ": memory of device " + std::to_string(info.device) +
                                              ", but the launch runs on device " + std::to_string(device) +
                                              " (the stream's or the current context's)");
}

void require_same_dim(const TensorView* a, const char* a_name, const TensorView* b, const char* b_name,
                      int i) {
  FLASHGEN_REQUIRE(a->shape[i] == b->shape[i], dim(a_name, i) + " is " + std::to_string(a->shape[i]) + " but " +
                                                   dim(b_name, i) + " is " + std::to_string(b->shape[i]));
}

void check_fp8_scales(const float* scale, const int64_t (&stride)[2], const char* name, bool fp8,
                      const char* given_for) {
  if (scale == nullptr) return;
  FLASHGEN_REQUIRE(fp8, std::string(name) + ": given for " + given_for + "; pass NULL");
  FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(scale) % alignof(float) == 0,
                   std::string(name) + ": pointer must be 4-byte aligned");
  for (int i = 0; i < 2; ++i) {
    FLASHGEN_REQUIRE(stride[i] >= 0 && stride[i] <= (int64_t{1} << 40),
                     std::string(name) + "_stride[" + std::to_string(i) + "] must be in [0, 2^40], got " +
                         std::to_string(stride[i]));
  }
}

void check_fp8_descales(const CallOptions& opts, bool fp8, const char* given_for) {
  for (const auto& [d, stride, name] : {std::tuple{opts.q_descale, &opts.q_descale_stride, "opts.q_descale"},
                                        std::tuple{opts.k_descale, &opts.k_descale_stride, "opts.k_descale"},
                                        std::tuple{opts.v_descale, &opts.v_descale_stride, "opts.v_descale"}}) {
    check_fp8_scales(d, *stride, name, fp8, given_for);
  }
}

void bind_fp8_descales(const CallOptions& opts, AttnFwdParams& p) {
  p.q_descale = opts.q_descale, p.k_descale = opts.k_descale, p.v_descale = opts.v_descale;
  for (int i = 0; i < 2; ++i) {
    p.q_descale_strides[i] = opts.q_descale_stride[i];
    p.k_descale_strides[i] = opts.k_descale_stride[i];
    p.v_descale_strides[i] = opts.v_descale_stride[i];
  }
}

void check_fp8_descale_pointers(const AttnFwdParams& p, int device) {
  for (const auto& [d, name] : {std::pair{p.q_descale, "opts.q_descale"}, std::pair{p.k_descale, "opts.k_descale"},
                                std::pair{p.v_descale, "opts.v_descale"}}) {
    if (d != nullptr) check_device_pointer(d, name, device);
  }
}

void require_same_dtype(const TensorView* t, const char* name, const TensorView* q) {
  FLASHGEN_REQUIRE(t->dtype == q->dtype, std::string(name) + ".dtype is " + dtype_name(t->dtype) + " but q.dtype is " +
                                             dtype_name(q->dtype));
}

void check_packing(const TensorView& q, const TensorView& k, const Packing& packing) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}}) {
    FLASHGEN_REQUIRE(t->shape[0] == 1, std::string(name) + ".shape[0] is " + std::to_string(t->shape[0]) +
                                           ": a packed batch is one entry [1, total, heads, head_dim]");
  }
  const struct {
    const int32_t* pointer;
    const char* name;
    bool optional;
  } offsets[] = {{packing.cu_seqlens_q, "cu_seqlens_q", false},
                 {packing.cu_seqlens_k, "cu_seqlens_k", false},
                 {packing.seqused_k, "seqused_k", true}};
  for (const auto& [pointer, name, optional] : offsets) {
    FLASHGEN_REQUIRE(pointer != nullptr || optional, std::string(name) + ": null pointer");
    FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(pointer) % alignof(int32_t) == 0,
                     std::string(name) + ": pointer must be 4-byte aligned");
  }
  const int64_t total_q = q.shape[1], total_k = k.shape[1];
  FLASHGEN_REQUIRE(packing.batch >= 1 && packing.batch <= 65535,
                   "batch must be in [1, 65535] (sequences; grid limit), got " + std::to_string(packing.batch));
  FLASHGEN_REQUIRE(packing.max_seqlen_q >= 1 && packing.max_seqlen_q <= total_q,
                   "max_seqlen_q must be in [1, total_q = " + std::to_string(total_q) + "], got " +
                       std::to_string(packing.max_seqlen_q));
  FLASHGEN_REQUIRE(packing.max_seqlen_k >= 1 && packing.max_seqlen_k <= total_k,
                   "max_seqlen_k must be in [1, total_k = " + std::to_string(total_k) + "], got " +
                       std::to_string(packing.max_seqlen_k));
}

AttentionShape shape_of(const TensorView* q, const TensorView* k, const TensorView* v) {
  const int64_t head_dim_v = v->shape[3] != q->shape[3] ? v->shape[3] : 0;
  return AttentionShape{q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2], q->shape[3], head_dim_v};
}


void check_head_dim_and_groups(const TensorView* q, const TensorView* k, int max_head_dim) {
  const int64_t head_dim = q->shape[3];
  if (head_dim % 8 != 0 || head_dim > max_head_dim) {
    fail(Status::kUnsupported, dim("q", 3) + " = " + std::to_string(head_dim) +
                                   " is unsupported: head_dim must be a multiple of 8 up to " +
                                   std::to_string(max_head_dim));
  }
  FLASHGEN_REQUIRE(q->shape[2] % k->shape[2] == 0,
                   dim("q", 2) + " = " + std::to_string(q->shape[2]) + " must be a multiple of " + dim("k", 2) +
                       " = " + std::to_string(k->shape[2]));
}

void check_value_dim(const TensorView* v, const char* v_name, const TensorView* out, const char* out_name,
                     const TensorView* q, bool own_dim_taken) {
  const int64_t dim_v = v->shape[3];
  if (dim_v != q->shape[3]) {
    FLASHGEN_REQUIRE(own_dim_taken, dim(v_name, 3) + " is " + std::to_string(dim_v) + " but " + dim("q", 3) + " is " +
                                        std::to_string(q->shape[3]) +
                                        ": this call takes values of the queries' head dim (the forward and the "
                                        "backward take one of their own)");
    if (dim_v % 8 != 0 || dim_v > 512) {
      fail(Status::kUnsupported, dim(v_name, 3) + " = " + std::to_string(dim_v) +
                                     " is unsupported: a values' head dim of its own must be a multiple of 8 up to 512");
    }
  }
  FLASHGEN_REQUIRE(out->shape[3] == dim_v, dim(out_name, 3) + " is " + std::to_string(out->shape[3]) + " but " +
                                               dim(v_name, 3) + " is " + std::to_string(dim_v) +
                                               ": the output has the values' head dim");
}

void set_user_variant(AttentionProblem& problem, const CallOptions& opts) {
  if (opts.variant == nullptr) return;
  problem.user = opts.variant;
  const UserVariant& user = *problem.user;
  FLASHGEN_REQUIRE(!user.modifies_scores() || (opts.softcap == 0.f && opts.alibi_slopes == nullptr),
                   "opts.variant " + user.tag + " modifies scores (score_mod or score_bias), which takes the place of "
                   "opts.softcap and opts.alibi_slopes: write the cap or the bias into it");
  FLASHGEN_REQUIRE(!problem.backward() || user.has_gradient(),
                   "opts.variant " + user.tag + " has a score_mod but no score_grad: its backward needs the derivative");
  FLASHGEN_REQUIRE(user.buffers.empty() || opts.variant_buffers != nullptr,
                   "opts.variant_buffers is NULL but the variant declares " + std::to_string(user.buffers.size()) +
                       " buffer(s)");
  for (size_t i = 0; i < user.buffers.size(); ++i) {
    FLASHGEN_REQUIRE(opts.variant_buffers[i] != nullptr, "opts.variant_buffers[" + std::to_string(i) + "] (" +
                                                             user.buffers[i].name + ") is NULL");
  }
  FLASHGEN_REQUIRE(user.scalars.empty() || opts.variant_scalars != nullptr,
                   "opts.variant_scalars is NULL but the variant declares " + std::to_string(user.scalars.size()) +
                       " scalar(s)");
}

KeptBlockClasses* user_block_mask(const CallOptions& opts, const AttentionProblem& problem) {
  if (opts.block_mask == nullptr) return nullptr;
  FLASHGEN_REQUIRE(problem.user && problem.user->masks(),
                   "opts.block_mask: given without a variant that has a mask_mod (there are no block classes to keep)");
  FLASHGEN_REQUIRE(!problem.kv_cache,
                   "opts.block_mask: KV-cache calls keep no block classes (decoding reads every key block once)");
  FLASHGEN_REQUIRE(!problem.paged,
                   "opts.block_mask: a packed call over a paged cache has no block classes (its kernels walk every "
                   "key block of the base mask)");
  return opts.block_mask;
}

void check_options(const CallOptions* opts, int64_t heads_q) {
  const Mask mask = opts->mask;  // any value a caller gave (Mask is int-sized)
  FLASHGEN_REQUIRE(mask == Mask::kNone || mask == Mask::kCausal || mask == Mask::kCausalTopLeft ||
                       mask == Mask::kSlidingWindow,
                   "opts.mask: unknown value " + std::to_string(static_cast<int>(mask)));
  if (mask == Mask::kSlidingWindow) {
    for (const auto& [side, name] : {std::pair{opts->window_left, "opts.window_left"},
                                     std::pair{opts->window_right, "opts.window_right"}}) {
      FLASHGEN_REQUIRE(side >= -1, std::string(name) + " must be >= 0, or -1 for no bound on that side, got " +
                                       std::to_string(side));
    }
  }
  FLASHGEN_REQUIRE(opts->attention_chunk >= 0,
                   "opts.attention_chunk must be >= 0 (0: none), got " + std::to_string(opts->attention_chunk));
  FLASHGEN_REQUIRE(opts->attention_chunk == 0 || mask != Mask::kCausalTopLeft,
                   "opts.attention_chunk: chunks lie about the bottom-right diagonal; not with "
                   "FLASHGEN_MASK_CAUSAL_TOP_LEFT (use FLASHGEN_MASK_CAUSAL)");
  // The kernels scale by softmax_scale * log2(e): that product must be finite too.
  FLASHGEN_REQUIRE(std::isfinite(opts->softmax_scale) && std::isfinite(opts->softmax_scale * 1.4426950408889634f),
                   "opts.softmax_scale must be finite and below 2.3e38, got " + std::to_string(opts->softmax_scale));
  // The kernels multiply by scale / softcap and by softcap / scale: both must be finite and nonzero; the forward's
  // softmax scale of capped scores is softcap * log2(e), which must be finite too.
  const float cap = opts->softcap;
  FLASHGEN_REQUIRE(cap == 0.f || (std::isfinite(cap * 1.4426950408889634f) && cap > 0.f),
                   "opts.softcap must be 0 (none) or a positive finite cap below 2.3e38, got " + std::to_string(cap));
  if (cap > 0.f) {
    const double ratio = double(cap) / (opts->softmax_scale > 0 ? double(opts->softmax_scale) : 1.0 / 16);
    FLASHGEN_REQUIRE(ratio > 1e-30 && ratio < 1e30 && cap > 1e-30f,
                     "opts.softcap = " + std::to_string(cap) + " is too small or too far from the softmax scale (it "
                     "must exceed 1e-30, and their ratio lie within 1e-30 and 1e30)");
  }
  if (opts->alibi_slopes != nullptr) {
    FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(opts->alibi_slopes) % alignof(float) == 0,
                     "opts.alibi_slopes: pointer must be 4-byte aligned (an fp32 array)");
    FLASHGEN_REQUIRE(opts->alibi_batch_stride == 0 ||
                         (opts->alibi_batch_stride >= heads_q && opts->alibi_batch_stride <= (int64_t{1} << 40)),
                     "opts.alibi_batch_stride must be 0 (one slope per query head for every sequence) or at least "
                     "heads_q = " + std::to_string(heads_q) + ", got " + std::to_string(opts->alibi_batch_stride));
    // The kernels take the bias in q·k units, dividing by the scale.
    FLASHGEN_REQUIRE(opts->softmax_scale <= 0 || opts->softmax_scale >= 1e-30f,
                     "opts.softmax_scale = " + std::to_string(opts->softmax_scale) +
                         " is too small for ALiBi (at least 1e-30)");
  }
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{opts->sinks, "opts.sinks"},
                                      std::pair<const void*, const char*>{opts->dsinks, "opts.dsinks"}}) {
    FLASHGEN_REQUIRE(reinterpret_cast<std::uintptr_t>(pointer) % alignof(float) == 0,
                     std::string(name) + ": pointer must be 4-byte aligned (an fp32 array)");
  }
}

void set_window_sides(VariantArgs& v, const AttentionProblem& problem, int64_t left_bound, int64_t right_bound) {
  v.window_left = v.window_right = v.attention_chunk = 0;
  if (!problem.windowed()) return;
  auto side = [](int given, int64_t bound) {
    return static_cast<int>(given < 0 || given > bound ? std::min<int64_t>(bound, INT32_MAX) : given);
  };
  v.window_left = side(problem.window_left, left_bound);
  v.window_right = side(problem.window_right, right_bound);
  // A chunk of at least left_bound keys holds every key from position 0: its bound keeps chunk ends in range.
  if (problem.attention_chunk > 0) v.attention_chunk = side(problem.attention_chunk, std::max<int64_t>(left_bound, 1));
}

VariantArgs variant_args(const AttentionProblem& problem, const CallOptions& opts, int seqlen_q,
                         int seqlen_k) {
  VariantArgs v{};
  v.causal_offset = causal_offset(problem, seqlen_q, seqlen_k);
  v.scale = softmax_scale(opts, problem.head_dim());
  v.scale_log2 = static_cast<float>(v.scale * 1.4426950408889634);
  const float cap = opts.softcap;
  v.softcap_in = cap > 0.f ? v.scale / cap : 0.f;
  v.softcap_out = cap > 0.f ? cap / v.scale : 0.f;
  v.softcap_grad = cap > 0.f ? static_cast<float>(1.0 / (double(cap) * 1.4426950408889634)) : 0.f;
  set_window_sides(v, problem, seqlen_k, seqlen_q);
  v.alibi_slopes = opts.alibi_slopes;
  v.alibi_batch_stride = opts.alibi_slopes != nullptr ? opts.alibi_batch_stride : 0;
  v.inv_scale = 1.f / v.scale;
  v.sinks = opts.sinks;
  if (problem.user) {
    for (size_t i = 0; i < problem.user->buffers.size(); ++i) v.user_buffers[i] = opts.variant_buffers[i];
    for (size_t i = 0; i < problem.user->scalars.size(); ++i) {
      std::memcpy(&v.user_scalars[i], static_cast<const char*>(opts.variant_scalars) + 4 * i, 4);
    }
  }
  return v;
}

float softmax_scale(const CallOptions& opts, int64_t head_dim) {
  return opts.softmax_scale > 0 ? opts.softmax_scale : static_cast<float>(1.0 / std::sqrt(double(head_dim)));
}

int causal_offset(const AttentionProblem& problem, int seqlen_q, int seqlen_k) {
  return aligned_bottom_right(problem) ? seqlen_k - seqlen_q : 0;
}

int launch_arch(CUdevice device) {
  const int arch = device_traits(device).sm;
  if (arch < 80) {
    fail(Status::kUnsupported,
         "flashgen needs a GPU of compute capability 8.0 or newer; this one is sm_" + std::to_string(arch));
  }
  return arch;
}

}  // namespace flashgen
