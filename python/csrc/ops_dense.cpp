// flashgen::attention_forward and flashgen::attention_backward: dense batches in either layout; the forward also over
// FP8 q, k and v with their descales.
#include "ops.hpp"

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

namespace flashgen::torch_ops {

using torch::headeronly::ScalarType;

std::tuple<Tensor, Tensor> attention_forward(Tensor q, Tensor k, Tensor v, double scale, std::string mask,
                                             std::string layout, bool /*deterministic: the backward's*/,
                                             double softcap, int64_t window_left, int64_t window_right,
                                             std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks,
                                             int64_t attention_chunk, std::optional<Tensor> q_descale,
                                             std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
                                             std::string out_dtype) {
  // FP8 q, k and v (one format) take descales and give out of out_dtype (the library checks what else they take).
  check_qkv(q, k, v, 4, 4, /*fp8_kv=*/false, /*fp8_qkv=*/true);
  const LayoutDims dims = layout_dims(layout);
  const bool fp8 = is_fp8(q);
  const ScalarType out_type = output_dtype(q, out_dtype);
  const int32_t device = q.get_device_index();
  // The library takes the CUDA context from the stream, on the legacy default stream from the current device.
  torch::stable::accelerator::DeviceGuard guard(device);
  q = readable(q);
  k = readable(k);
  v = readable(v);
  const int64_t batch = q.size(dims[0]), seqlen_q = q.size(dims[1]), heads_q = q.size(dims[2]);
  const int64_t heads_kv = k.size(dims[2]);
  const Extras extras = check_extras(q, batch, heads_q, alibi_slopes, sinks);
  // The caller's descales, read in place through their strides.
  const Descale descales[3] = {descale(q_descale, q, batch, heads_kv, "q_descale"),
                               descale(k_descale, q, batch, heads_kv, "k_descale"),
                               descale(v_descale, q, batch, heads_kv, "v_descale")};
  Tensor out = empty_output(q, v, fp8 ? std::optional<ScalarType>(out_type) : std::nullopt);
  Tensor lse = torch::stable::new_empty(q, {batch, heads_q, seqlen_q}, ScalarType::Float);
  const flashgen_tensor views[] = {view(q, dims, fp8), view(k, dims, fp8), view(v, dims, fp8), view(out, dims)};
  flashgen_attention_options opts =
      options(scale, mask, false, softcap, window_left, window_right, attention_chunk, extras);
  set_descales(opts, descales);
  check_status(flashgen_attention_forward(&views[0], &views[1], &views[2], &views[3],
                                          static_cast<float*>(lse.data_ptr()), &opts, current_stream(device)),
               "flashgen_attention_forward");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward(
    Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, double scale, std::string mask,
    std::string layout, bool deterministic, double softcap, int64_t window_left, int64_t window_right,
    std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks, int64_t attention_chunk) {
  check_qkv(q, k, v, 4, 4);
  const LayoutDims dims = layout_dims(layout);
  const int32_t device = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const int64_t batch = q.size(dims[0]), seqlen_q = q.size(dims[1]), heads_q = q.size(dims[2]);
  STD_TORCH_CHECK(lse.scalar_type() == ScalarType::Float && lse.dim() == 3 && lse.size(0) == batch &&
                      lse.size(1) == heads_q && lse.size(2) == seqlen_q,
                  "lse: expected float32 [", batch, ", ", heads_q, ", ", seqlen_q, "] as the forward returned it");
  const BackwardTensors t = backward_tensors(dout, q, k, v, out, lse);
  const Extras extras = check_extras(t.q, batch, heads_q, alibi_slopes, sinks);
  Tensor dsinks = dsinks_for(t.q, heads_q, extras);
  flashgen_attention_options opts =
      options(scale, mask, deterministic, softcap, window_left, window_right, attention_chunk, extras);
  if (extras.sinks.has_value()) opts.dsinks = static_cast<float*>(dsinks.data_ptr());
  // In the C ABI's order: q, k, v, out, dout, then dq, dk, dv.
  const flashgen_tensor views[] = {view(t.q, dims),    view(t.k, dims),  view(t.v, dims),  view(t.out, dims),
                                   view(t.dout, dims), view(t.dq, dims), view(t.dk, dims), view(t.dv, dims)};
  const float* lse_data = static_cast<const float*>(t.lse.data_ptr());
  void* stream = current_stream(device);
  size_t workspace_bytes = 0;
  check_status(flashgen_attention_backward_workspace_size(&views[0], &views[1], &views[2], &views[3], &views[4],
                                                          lse_data, &views[5], &views[6], &views[7], &opts, stream,
                                                          &workspace_bytes),
               "flashgen_attention_backward_workspace_size");
  // The caching allocator hands out 512-byte aligned blocks; the library asks for 256.
  Tensor workspace = workspace_like(t.q, workspace_bytes);
  check_status(flashgen_attention_backward_with_workspace(&views[0], &views[1], &views[2], &views[3], &views[4],
                                                          lse_data, &views[5], &views[6], &views[7], &opts,
                                                          workspace.data_ptr(), workspace_bytes, stream),
               "flashgen_attention_backward_with_workspace");
  return {t.dq, t.dk, t.dv, dsinks};
}

}  // namespace flashgen::torch_ops
