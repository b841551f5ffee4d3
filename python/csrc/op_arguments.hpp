// What both torch libraries make of an op's arguments, for either tensor type: torch::stable::Tensor in the op
// library (libflashgen_torch.so), at::Tensor in the release library's native calls. The checks and their messages,
// the rule for tensors the kernels read in place, flashgen_tensor views and a call's options are written once here;
// each library allocates and converts with its own API.
#pragma once

#include "flashgen/flashgen.h"

#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace flashgen::torch_ops {

// Position of [batch, seqlen, heads, head_dim] in a tensor of each layout ("bshd", or SDPA's "bhsd").
using LayoutDims = std::array<int64_t, 4>;
inline constexpr LayoutDims kBshd = {0, 1, 2, 3};
inline constexpr LayoutDims kBhsd = {0, 2, 1, 3};

inline LayoutDims layout_dims(std::string_view layout) {
  STD_TORCH_CHECK(layout == "bshd" || layout == "bhsd",
                  "layout must be 'bshd' ([batch, seqlen, heads, head_dim]) or 'bhsd' ([batch, heads, seqlen, "
                  "head_dim]), got '", layout, "'");
  return layout == "bshd" ? kBshd : kBhsd;
}

inline flashgen_mask mask_code(std::string_view mask) {
  if (mask == "none") return FLASHGEN_MASK_NONE;
  if (mask == "bottom_right") return FLASHGEN_MASK_CAUSAL;
  if (mask == "top_left") return FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  STD_TORCH_CHECK(mask == "window", "mask must be one of 'bottom_right', 'none', 'top_left', 'window', got '", mask,
                  "'");
  return FLASHGEN_MASK_SLIDING_WINDOW;
}

inline const char* status_name(int status) {
  switch (status) {
    case FLASHGEN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHGEN_ERROR_UNSUPPORTED: return "unsupported";
    case FLASHGEN_ERROR_NO_DEVICE: return "no device";
    case FLASHGEN_ERROR_COMPILE: return "compile error";
    case FLASHGEN_ERROR_CUDA: return "CUDA error";
    default: return "internal error";
  }
}

// Raises (RuntimeError in Python) with the library's message when a call failed, worded as flashgen._lib.check
// words it: "call: message [status name]", so that flashgen.torch can raise FlashgenArgumentError for the statuses
// of bad arguments.
inline void check_status(int status, const char* call) {
  STD_TORCH_CHECK(status == FLASHGEN_SUCCESS, call, ": ", flashgen_last_error(), " [", status_name(status), "]");
}

// fp8_taken: t may also be FP8 (a KV cache's k_cache or v_cache, the forward's q, k or v; the library checks
// what else such a call takes).
template <typename Tensor>
flashgen_dtype dtype_code(const Tensor& t, const char* name, bool fp8_taken = false) {
  const auto type = t.scalar_type();
  if (fp8_taken && type == c10::ScalarType::Float8_e4m3fn) return FLASHGEN_FLOAT8_E4M3;
  if (fp8_taken && type == c10::ScalarType::Float8_e5m2) return FLASHGEN_FLOAT8_E5M2;
  STD_TORCH_CHECK(type == c10::ScalarType::Half || type == c10::ScalarType::BFloat16, name,
                  ": flashgen runs torch.float16 and torch.bfloat16",
                  fp8_taken ? " (here also torch.float8_e4m3fn and torch.float8_e5m2)" : "");
  return type == c10::ScalarType::Half ? FLASHGEN_FLOAT16 : FLASHGEN_BFLOAT16;
}

template <typename Tensor>
bool is_fp8(const Tensor& t) {
  const auto type = t.scalar_type();
  return type == c10::ScalarType::Float8_e4m3fn || type == c10::ScalarType::Float8_e5m2;
}

template <typename Tensor>
bool on_device_of(const Tensor& t, const Tensor& q) {
  return t.is_cuda() && t.get_device() == q.get_device();
}

// q, k and v: `rank` dims (k and v `kv_rank`), float16 or bfloat16, one dtype, on one CUDA device; with fp8_kv (a KV
// cache's k_cache and v_cache) k and v may be FP8 instead (the library checks that both are of one format); with
// fp8_qkv (the forward, dense or packed) q, k and v may all be FP8, of q's format.
template <typename Tensor>
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t rank, int64_t kv_rank, bool fp8_kv = false,
               bool fp8_qkv = false) {
  const std::pair<const char*, const Tensor*> inputs[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : inputs) {
    const int64_t want = t == &q ? rank : kv_rank;
    const bool fp8_cache = fp8_kv && t != &q;
    STD_TORCH_CHECK(t->dim() == want, name, ": expected a ", want, "-d tensor, got ", t->dim(), " dims");
    STD_TORCH_CHECK(on_device_of(*t, q), name, " must be on q's CUDA device");
    STD_TORCH_CHECK(t->scalar_type() == q.scalar_type() || (fp8_cache && is_fp8(*t)), name,
                    ".dtype differs from q.dtype",
                    fp8_qkv && (is_fp8(q) || is_fp8(*t)) ? " (FP8 q, k and v share one format)" : "");
    dtype_code(*t, name, fp8_cache || fp8_qkv);
  }
}

// The kernels read t in place when it is 16-byte aligned, head_dim unit-stride and its other strides multiples of 16
// bytes (8 elements of 16 bits, 16 FP8 ones; dims of size 1 excepted).
template <typename Tensor>
bool readable_in_place(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  const int64_t last = t.dim() - 1;
  if (t.stride(last) != 1) return false;
  const int64_t step = is_fp8(t) ? 16 : 8;
  for (int64_t i = 0; i < last; ++i) {
    if (t.size(i) != 1 && t.stride(i) % step != 0) return false;
  }
  return true;
}

// flashgen_tensor over t, read as [batch, seqlen, heads, head_dim] through its own strides (fp8_taken: a KV cache's,
// which may be FP8).
template <typename Tensor>
flashgen_tensor view(const Tensor& t, const LayoutDims& dims, bool fp8_taken = false) {
  flashgen_tensor result{};
  result.data = t.data_ptr();
  result.dtype = dtype_code(t, "tensor", fp8_taken);
  for (size_t i = 0; i < 4; ++i) {
    result.shape[i] = t.size(dims[i]);
    result.stride[i] = t.stride(dims[i]);
  }
  return result;
}

// flashgen_tensor over a packed [total, heads, head_dim] tensor, as the one batch entry [1, total, heads, head_dim]
// (fp8_taken: the FP8 forward's q, k or v).
template <typename Tensor>
flashgen_tensor packed_view(const Tensor& t, bool fp8_taken = false) {
  flashgen_tensor result{};
  result.data = t.data_ptr();
  result.dtype = dtype_code(t, "tensor", fp8_taken);
  result.shape[0] = 1;
  result.stride[0] = t.stride(0) * t.size(0);
  for (int64_t i = 0; i < 3; ++i) {
    result.shape[i + 1] = t.size(i);
    result.stride[i + 1] = t.stride(i);
  }
  return result;
}

// An int32 index array (offsets, lengths, a block table): `rank` dims on q's device.
template <typename Tensor>
void check_int32_array(const Tensor& t, const Tensor& q, int64_t rank, const char* name) {
  STD_TORCH_CHECK(t.scalar_type() == c10::ScalarType::Int && t.dim() == rank && on_device_of(t, q), name,
                  ": expected a ", rank, "-d torch.int32 tensor on q's device");
}

template <typename Tensor>
const int32_t* int32_data(const Tensor& t) {
  return static_cast<const int32_t*>(t.data_ptr());
}

// The packed forward's arguments but lse and options, over readable tensors: q and out [total_q, heads_q,
// head_dim], k and v packed alike or, with block_table (int32 [batch, max_pages]), paged caches [num_pages,
// page_size, heads_kv, head_dim] read as they are; the offsets and seqused_k (or null) contiguous int32.
template <typename Tensor>
flashgen_varlen_forward_args varlen_forward_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                 const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                                 const Tensor* seqused_k, const Tensor* block_table,
                                                 int64_t max_seqlen_q, int64_t max_seqlen_k) {
  flashgen_varlen_forward_args args{};
  args.size = sizeof(args);
  args.q = packed_view(q, true);  // FP8 q, k and v too (the library checks they share one format)
  args.out = packed_view(out);
  args.k = block_table != nullptr ? view(k, kBshd, true) : packed_view(k, true);
  args.v = block_table != nullptr ? view(v, kBshd, true) : packed_view(v, true);
  args.cu_seqlens_q = int32_data(cu_seqlens_q);
  args.cu_seqlens_k = int32_data(cu_seqlens_k);
  args.seqused_k = seqused_k != nullptr ? int32_data(*seqused_k) : nullptr;
  args.batch = cu_seqlens_q.size(0) - 1;
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  if (block_table != nullptr) {
    args.block_table = int32_data(*block_table);
    args.max_pages = block_table->size(1);
  }
  return args;
}

// The packed backward's arguments but lse and options, over readable packed tensors and contiguous int32 offsets.
template <typename Tensor>
flashgen_varlen_backward_args varlen_backward_args(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                   const Tensor& v, const Tensor& out, const Tensor& dq,
                                                   const Tensor& dk, const Tensor& dv, const Tensor& cu_seqlens_q,
                                                   const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                   int64_t max_seqlen_k) {
  flashgen_varlen_backward_args args{};
  args.size = sizeof(args);
  args.q = packed_view(q);
  args.k = packed_view(k);
  args.v = packed_view(v);
  args.out = packed_view(out);
  args.dout = packed_view(dout);
  args.dq = packed_view(dq);
  args.dk = packed_view(dk);
  args.dv = packed_view(dv);
  args.cu_seqlens_q = int32_data(cu_seqlens_q);
  args.cu_seqlens_k = int32_data(cu_seqlens_k);
  args.batch = cu_seqlens_q.size(0) - 1;
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  return args;
}

// The fp32 extras of a call (ALiBi slopes, sinks) checked, and whether the kernels read each as it is: slopes whose
// rows are contiguous, sinks float32 and contiguous (the others are converted by the caller's library).
struct ExtrasAsGiven {
  bool slopes_readable = true, sinks_readable = true;
};

template <typename Tensor>
ExtrasAsGiven extras_as_given(const Tensor& q, int64_t batch, int64_t heads_q,
                              const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& sinks) {
  ExtrasAsGiven result;
  if (alibi_slopes.has_value()) {
    const Tensor& slopes = *alibi_slopes;
    const bool shaped = (slopes.dim() == 1 && slopes.size(0) == heads_q) ||
                        (slopes.dim() == 2 && slopes.size(0) == batch && slopes.size(1) == heads_q);
    STD_TORCH_CHECK(slopes.scalar_type() == c10::ScalarType::Float && shaped,
                    "alibi_slopes must be float32 [heads_q] = [", heads_q, "] or [batch, heads_q] = [", batch, ", ",
                    heads_q, "]");
    STD_TORCH_CHECK(on_device_of(slopes, q), "alibi_slopes must be on q's device");
    result.slopes_readable = slopes.stride(-1) == 1 && (slopes.dim() == 1 || slopes.stride(0) >= heads_q);
  }
  if (sinks.has_value()) {
    const Tensor& s = *sinks;
    const auto type = s.scalar_type();
    STD_TORCH_CHECK((type == c10::ScalarType::Float || type == c10::ScalarType::BFloat16 ||
                     type == c10::ScalarType::Half) &&
                        s.dim() == 1 && s.size(0) == heads_q,
                    "sinks must be float32 (or bfloat16, float16: converted) [heads_q] = [", heads_q, "]");
    STD_TORCH_CHECK(on_device_of(s, q), "sinks must be on q's device");
    result.sinks_readable = type == c10::ScalarType::Float && s.is_contiguous();
  }
  return result;
}

// The dtype a forward's out_dtype names: "bfloat16", "float16", or "" for none.
inline std::optional<c10::ScalarType> named_out_dtype(std::string_view out_dtype) {
  if (out_dtype.empty()) return std::nullopt;
  STD_TORCH_CHECK(out_dtype == "bfloat16" || out_dtype == "float16",
                  "out_dtype must be 'bfloat16' or 'float16' (or '' for the default), got '", out_dtype, "'");
  return out_dtype == "bfloat16" ? c10::ScalarType::BFloat16 : c10::ScalarType::Half;
}

// A forward's output dtype: out_dtype's for FP8 q, k and v, bfloat16 or float16 (none: bfloat16, as
// FlashAttention-3 gives); 16-bit q, k and v give out of their own dtype, which out_dtype may only repeat.
template <typename Tensor>
c10::ScalarType output_dtype(const Tensor& q, std::string_view out_dtype) {
  const bool fp8 = is_fp8(q);
  const std::optional<c10::ScalarType> named = named_out_dtype(out_dtype);
  if (!named.has_value()) return fp8 ? c10::ScalarType::BFloat16 : q.scalar_type();
  STD_TORCH_CHECK(fp8 || *named == q.scalar_type(),
                  "out_dtype: 16-bit q, k and v give out in their own dtype; out_dtype is an FP8 forward's");
  return *named;
}

// An FP8 forward's descale (q_descale, k_descale or v_descale, FlashAttention-3's) as the options take it: the pointer
// and the (batch entry, kv head) strides, 0 over a dimension it broadcasts; null for none.
struct Descale {
  const float* data = nullptr;
  int64_t stride[2] = {0, 0};
};

// d: float32 on q's device, of shape [batch, heads_kv] or one that broadcasts to it (dims aligned from the right, each
// 1 or the target's: a scalar expanded with zero strides, as vLLM passes one; [heads_kv]), read through its strides.
// Refused for 16-bit q, k and v.
template <typename Tensor>
Descale descale(const std::optional<Tensor>& d, const Tensor& q, int64_t batch, int64_t heads_kv, const char* name) {
  Descale result;
  if (!d.has_value()) return result;
  STD_TORCH_CHECK(is_fp8(q), name, ": given for 16-bit q, k and v; descales are an FP8 forward's "
                  "(torch.float8_e4m3fn, torch.float8_e5m2)");
  const int64_t target[2] = {batch, heads_kv};
  bool shaped = d->dim() <= 2;
  for (int64_t j = 0; shaped && j < 2; ++j) {
    const int64_t i = d->dim() - 2 + j;  // d's dim over target dim j, or none
    if (i < 0) continue;
    shaped = d->size(i) == 1 || d->size(i) == target[j];
    result.stride[j] = d->size(i) == 1 ? 0 : d->stride(i);
  }
  STD_TORCH_CHECK(d->scalar_type() == c10::ScalarType::Float && shaped, name,
                  " must be float32 of shape [batch, heads_kv] = [", batch, ", ", heads_kv,
                  "] or one that broadcasts to it (FlashAttention-3's; a scalar tensor expanded to it, say)");
  STD_TORCH_CHECK(on_device_of(*d, q), name, " must be on q's device");
  result.data = static_cast<const float*>(d->data_ptr());
  return result;
}

// A call's options; the extras are the (readable) slopes and sinks or null, dsinks is the caller's to set.
template <typename Tensor>
flashgen_attention_options options(double scale, std::string_view mask, bool deterministic, double softcap,
                                   int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                   const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& sinks) {
  flashgen_attention_options result{};
  result.size = sizeof(result);
  result.softmax_scale = static_cast<float>(scale);
  result.mask = mask_code(mask);
  result.deterministic = deterministic ? 1 : 0;
  result.softcap = static_cast<float>(softcap);
  result.window_left = static_cast<int32_t>(window_left);
  result.window_right = static_cast<int32_t>(window_right);
  result.attention_chunk = static_cast<int32_t>(attention_chunk);
  if (alibi_slopes.has_value()) {
    result.alibi_slopes = static_cast<const float*>(alibi_slopes->data_ptr());
    result.alibi_batch_stride = alibi_slopes->dim() == 2 ? alibi_slopes->stride(0) : 0;
  }
  if (sinks.has_value()) result.sinks = static_cast<const float*>(sinks->data_ptr());
  return result;
}

// The FP8 forward's descales into a call's options, in the order q, k, v.
inline void set_descales(flashgen_attention_options& opts, const Descale (&descales)[3]) {
  opts.q_descale = descales[0].data;
  opts.k_descale = descales[1].data;
  opts.v_descale = descales[2].data;
  for (int i = 0; i < 2; ++i) {
    opts.q_descale_stride[i] = descales[0].stride[i];
    opts.k_descale_stride[i] = descales[1].stride[i];
    opts.v_descale_stride[i] = descales[2].stride[i];
  }
}

}  // namespace flashgen::torch_ops
