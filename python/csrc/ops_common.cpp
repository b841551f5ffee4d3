// Helpers the op kernels share over stable-ABI tensors: copies of tensors the kernels cannot read in place, the
// extras converted, the options of a call, the current stream and torch-allocated workspaces (the checks and views
// themselves are op_arguments.hpp's).
#include "ops.hpp"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <utility>
#include <vector>

// The shim declares it under USE_CUDA only (a libtorch build flag); every CUDA build of torch exports it.
extern "C" AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);

namespace flashgen::torch_ops {

using torch::headeronly::ScalarType;

Tensor readable(const Tensor& t) {
  if (readable_in_place(t)) return t;
  Tensor copy = empty_like_contiguous(t);
  torch::stable::copy_(copy, t);
  return copy;
}

Tensor empty_like_contiguous(const Tensor& t) { return torch::stable::new_empty(t, t.sizes()); }

Tensor empty_output(const Tensor& q, const Tensor& v, std::optional<ScalarType> dtype) {
  const int64_t last = q.dim() - 1;
  if (!dtype.has_value() && q.size(last) == v.size(v.dim() - 1)) return empty_like_contiguous(q);
  std::vector<int64_t> sizes(q.sizes().begin(), q.sizes().end());
  sizes.back() = v.size(v.dim() - 1);
  return torch::stable::new_empty(q, sizes, dtype);
}

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

Extras check_extras(const Tensor& q, int64_t batch, int64_t heads_q, const std::optional<Tensor>& alibi_slopes,
                    const std::optional<Tensor>& sinks) {
  const ExtrasAsGiven given = extras_as_given(q, batch, heads_q, alibi_slopes, sinks);
  Extras extras{alibi_slopes, sinks};
  if (!given.slopes_readable) extras.alibi_slopes = torch::stable::contiguous(*alibi_slopes);
  if (!given.sinks_readable) {
    extras.sinks = torch::stable::contiguous(torch::stable::to(*sinks, ScalarType::Float));
  }
  return extras;
}

flashgen_attention_options options(double scale, const std::string& mask, bool deterministic, double softcap,
                                   int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                   const Extras& extras) {
  return flashgen::torch_ops::options(scale, mask, deterministic, softcap, window_left, window_right,
                                      attention_chunk, extras.alibi_slopes, extras.sinks);
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
