// flashgen::varlen_attention_forward and flashgen::varlen_attention_backward: packed batches of sequences of
// different lengths (and prefill against a paged KV cache, forward only); the forward also over FP8 q, k and v.
#include "ops.hpp"

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

namespace flashgen::torch_ops {

using torch::headeronly::ScalarType;

namespace {

// An int32 tensor of `rank` dims on q's device, contiguous (the library reads it as a plain array).
Tensor int32_array(const Tensor& t, const Tensor& q, int64_t rank, const char* name) {
  check_int32_array(t, q, rank, name);
  return torch::stable::contiguous(t);
}

}  // namespace

std::tuple<Tensor, Tensor> varlen_attention_forward(
    Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, std::optional<Tensor> seqused_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, std::string mask, bool /*deterministic*/,
    std::optional<Tensor> block_table, double softcap, int64_t window_left, int64_t window_right,
    std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks, int64_t attention_chunk,
    std::optional<Tensor> q_descale, std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
    std::string out_dtype) {
  const bool paged = block_table.has_value();
  // FP8 q, k and v (one format) take descales per (sequence, kv head) and give out of out_dtype, as the dense forward.
  check_qkv(q, k, v, 3, paged ? 4 : 3, /*fp8_kv=*/false, /*fp8_qkv=*/true);
  const bool fp8 = is_fp8(q);
  const ScalarType out_type = output_dtype(q, out_dtype);
  const int32_t device = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  q = readable(q);
  k = readable(k);
  v = readable(v);
  // Held until the call is queued, with every converted copy below.
  cu_seqlens_q = int32_array(cu_seqlens_q, q, 1, "cu_seqlens_q");
  cu_seqlens_k = int32_array(cu_seqlens_k, q, 1, "cu_seqlens_k");
  std::optional<Tensor> used = seqused_k.has_value()
                                   ? std::optional<Tensor>(int32_array(*seqused_k, q, 1, "seqused_k"))
                                   : std::nullopt;
  std::optional<Tensor> table =
      paged ? std::optional<Tensor>(int32_array(*block_table, q, 2, "block_table")) : std::nullopt;
  const int64_t total_q = q.size(0), heads_q = q.size(1), batch = cu_seqlens_q.size(0) - 1;
  const int64_t heads_kv = k.size(paged ? 2 : 1);
  const Descale descales[3] = {descale(q_descale, q, batch, heads_kv, "q_descale"),
                               descale(k_descale, q, batch, heads_kv, "k_descale"),
                               descale(v_descale, q, batch, heads_kv, "v_descale")};
  Tensor out = empty_output(q, v, fp8 ? std::optional<ScalarType>(out_type) : std::nullopt);
  Tensor lse = torch::stable::new_empty(q, {heads_q, total_q}, ScalarType::Float);
  const Extras extras = check_extras(q, batch, heads_q, alibi_slopes, sinks);

  flashgen_varlen_forward_args args =
      varlen_forward_args(q, k, v, out, cu_seqlens_q, cu_seqlens_k, used.has_value() ? &*used : nullptr,
                          table.has_value() ? &*table : nullptr, max_seqlen_q, max_seqlen_k);
  args.lse = static_cast<float*>(lse.data_ptr());
  args.options = options(scale, mask, false, softcap, window_left, window_right, attention_chunk, extras);
  set_descales(args.options, descales);
  check_status(flashgen_attention_varlen_forward(&args, current_stream(device)), "flashgen_attention_varlen_forward");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> varlen_attention_backward(
    Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, std::string mask, bool deterministic, double softcap,
    int64_t window_left, int64_t window_right, std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks,
    int64_t attention_chunk) {
  check_qkv(q, k, v, 3, 3);
  const int32_t device = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const BackwardTensors t = backward_tensors(dout, q, k, v, out, lse);
  cu_seqlens_q = int32_array(cu_seqlens_q, q, 1, "cu_seqlens_q");
  cu_seqlens_k = int32_array(cu_seqlens_k, q, 1, "cu_seqlens_k");
  const int64_t heads_q = t.q.size(1), batch = cu_seqlens_q.size(0) - 1;
  const Extras extras = check_extras(t.q, batch, heads_q, alibi_slopes, sinks);
  Tensor dsinks = dsinks_for(t.q, heads_q, extras);

  flashgen_varlen_backward_args args = varlen_backward_args(t.dout, t.q, t.k, t.v, t.out, t.dq, t.dk, t.dv,
                                                            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  args.lse = static_cast<const float*>(t.lse.data_ptr());
  args.options = options(scale, mask, deterministic, softcap, window_left, window_right, attention_chunk, extras);
  if (extras.sinks.has_value()) args.options.dsinks = static_cast<float*>(dsinks.data_ptr());
  // The workspace comes from flashgen's own pool (this C call takes none from the caller), a graph's own while
  // one is captured.
  check_status(flashgen_attention_varlen_backward(&args, current_stream(device)),
               "flashgen_attention_varlen_backward");
  return {t.dq, t.dk, t.dv, dsinks};
}

}  // namespace flashgen::torch_ops
