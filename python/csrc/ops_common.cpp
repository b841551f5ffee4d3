// Helpers the op kernels share: status and argument checks, the copy rule for tensors the kernels cannot read in
// place, flashgen_tensor views, the options of a call, the current stream and torch-allocated workspaces.
#include "ops.hpp"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <utility>

// The shim declares it under USE_CUDA only (a libtorch build flag); every CUDA build of torch exports it.
extern "C" AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);

namespace flashgen::torch_ops {

using torch::headeronly::ScalarType;

namespace {

constexpr LayoutDims kBshd = {0, 1, 2, 3};
constexpr LayoutDims kBhsd = {0, 2, 1, 3};

const char* status_name(int status) {
  switch (status) {
    case FLASHGEN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHGEN_ERROR_UNSUPPORTED: return "unsupported";
    case FLASHGEN_ERROR_NO_DEVICE: return "no device";
    case FLASHGEN_ERROR_COMPILE: return "compile error";
    case FLASHGEN_ERROR_CUDA: return "CUDA error";
    default: return "internal error";
  }
}

bool readable_in_place(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const size_t last = sizes.size() - 1;
  if (strides[last] != 1) return false;
  for (size_t i = 0; i < last; ++i) {
    if (sizes[i] != 1 && strides[i] % 8 != 0) return false;
  }
  return true;
}

bool on_device_of(const Tensor& t, const Tensor& q) {
  return t.is_cuda() && t.get_device_index() == q.get_device_index();
}

}  // namespace

LayoutDims layout_dims(const std::string& layout) {
  STD_TORCH_CHECK(layout == "bshd" || layout == "bhsd",
                  "layout must be 'bshd' ([batch, seqlen, heads, head_dim]) or 'bhsd' ([batch, heads, seqlen, "
                  "head_dim]), got '", layout, "'");
  return layout == "bshd" ? kBshd : kBhsd;
}

void check_status(int status, const char* call) {
  STD_TORCH_CHECK(status == FLASHGEN_SUCCESS, call, ": ", flashgen_last_error(), " [", status_name(status), "]");
}

flashgen_mask mask_code(const std::string& mask) {
  if (mask == "none") return FLASHGEN_MASK_NONE;
  if (mask == "bottom_right") return FLASHGEN_MASK_CAUSAL;
  if (mask == "top_left") return FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  STD_TORCH_CHECK(mask == "window", "mask must be one of 'bottom_right', 'none', 'top_left', 'window', got '", mask,
                  "'");
  return FLASHGEN_MASK_SLIDING_WINDOW;
}

flashgen_dtype dtype_code(const Tensor& t, const char* name) {
  const ScalarType type = t.scalar_type();
  STD_TORCH_CHECK(type == ScalarType::Half || type == ScalarType::BFloat16, name,
                  ": flashgen runs torch.float16 and torch.bfloat16");
  return type == ScalarType::Half ? FLASHGEN_FLOAT16 : FLASHGEN_BFLOAT16;
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t rank, int64_t kv_rank) {
  const std::pair<const char*, const Tensor*> inputs[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : inputs) {
    const int64_t want = t == &q ? rank : kv_rank;
    STD_TORCH_CHECK(t->dim() == want, name, ": expected a ", want, "-d tensor, got ", t->dim(), " dims");
    STD_TORCH_CHECK(on_device_of(*t, q), name, " must be on q's CUDA device");
    STD_TORCH_CHECK(t->scalar_type() == q.scalar_type(), name, ".dtype differs from q.dtype");
    dtype_code(*t, name);
  }
}

Tensor readable(const Tensor& t) {
  if (readable_in_place(t)) return t;
  Tensor copy = empty_like_contiguous(t);
  torch::stable::copy_(copy, t);
  return copy;
}

Tensor empty_like_contiguous(const Tensor& t) { return torch::stable::new_empty(t, t.sizes()); }

BackwardTensors backward_tensors(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse) {
  return {readable(dout),
          readable(q),
          readable(k),
          readable(v),
          readable(out),
          torch::stable::contiguous(lse),
          empty_like_contiguous(q),
          empty_like_contiguous(k),
          empty_like_contiguous(v)};
}

flashgen_tensor view(const Tensor& t, const LayoutDims& dims) {
  flashgen_tensor result{};
  result.data = t.data_ptr();
  result.dtype = dtype_code(t, "tensor");
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (size_t i = 0; i < 4; ++i) {
    result.shape[i] = sizes[dims[i]];
    result.stride[i] = strides[dims[i]];
  }
  return result;
}

flashgen_tensor packed_view(const Tensor& t) {
  flashgen_tensor result{};
  result.data = t.data_ptr();
  result.dtype = dtype_code(t, "tensor");
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  result.shape[0] = 1;
  result.stride[0] = strides[0] * sizes[0];
  for (size_t i = 0; i < 3; ++i) {
    result.shape[i + 1] = sizes[i];
    result.stride[i + 1] = strides[i];
  }
  return result;
}

Extras check_extras(const Tensor& q, int64_t batch, int64_t heads_q, const std::optional<Tensor>& alibi_slopes,
                    const std::optional<Tensor>& sinks) {
  Extras extras;
  if (alibi_slopes.has_value()) {
    const Tensor& slopes = *alibi_slopes;
    const bool shaped = (slopes.dim() == 1 && slopes.size(0) == heads_q) ||
                        (slopes.dim() == 2 && slopes.size(0) == batch && slopes.size(1) == heads_q);
    STD_TORCH_CHECK(slopes.scalar_type() == ScalarType::Float && shaped, "alibi_slopes must be float32 [heads_q] = [",
                    heads_q, "] or [batch, heads_q] = [", batch, ", ", heads_q, "]");
    STD_TORCH_CHECK(on_device_of(slopes, q), "alibi_slopes must be on q's device");
    const bool rows_readable = slopes.stride(-1) == 1 && (slopes.dim() == 1 || slopes.stride(0) >= heads_q);
    extras.alibi_slopes = rows_readable ? slopes : torch::stable::contiguous(slopes);
  }
  if (sinks.has_value()) {
    const Tensor& s = *sinks;
    const ScalarType type = s.scalar_type();
    STD_TORCH_CHECK((type == ScalarType::Float || type == ScalarType::BFloat16 || type == ScalarType::Half) &&
                        s.dim() == 1 && s.size(0) == heads_q,
                    "sinks must be float32 (or bfloat16, float16: converted) [heads_q] = [", heads_q, "]");
    STD_TORCH_CHECK(on_device_of(s, q), "sinks must be on q's device");
    extras.sinks = type == ScalarType::Float && s.is_contiguous()
                       ? s
                       : torch::stable::contiguous(torch::stable::to(s, ScalarType::Float));
  }
  return extras;
}

flashgen_attention_options options(double scale, const std::string& mask, bool deterministic, double softcap,
                                   int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                   const Extras& extras) {
  flashgen_attention_options result{};
  result.size = sizeof(result);
  result.softmax_scale = static_cast<float>(scale);
  result.mask = mask_code(mask);
  result.deterministic = deterministic ? 1 : 0;
  result.softcap = static_cast<float>(softcap);
  result.window_left = static_cast<int32_t>(window_left);
  result.window_right = static_cast<int32_t>(window_right);
  result.attention_chunk = static_cast<int32_t>(attention_chunk);
  if (extras.alibi_slopes.has_value()) {
    result.alibi_slopes = static_cast<const float*>(extras.alibi_slopes->data_ptr());
    result.alibi_batch_stride = extras.alibi_slopes->dim() == 2 ? extras.alibi_slopes->stride(0) : 0;
  }
  if (extras.sinks.has_value()) result.sinks = static_cast<const float*>(extras.sinks->data_ptr());
  return result;
}

Tensor dsinks_for(const Tensor& q, int64_t heads_q, const Extras& extras) {
  return torch::stable::new_empty(q, {extras.sinks.has_value() ? heads_q : 0}, ScalarType::Float);
}

void* current_stream(int32_t device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return stream;
}

Tensor workspace_like(const Tensor& t, size_t bytes) {
  return torch::stable::new_empty(t, {static_cast<int64_t>(bytes)}, ScalarType::Byte);
}

}  // namespace flashgen::torch_ops
