// flashgen::varlen_attention_forward and flashgen::varlen_attention_backward: packed batches of sequences of
// different lengths (and prefill against a paged KV cache, forward only).
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
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Int && t.dim() == rank && t.is_cuda() &&
                      t.get_device_index() == q.get_device_index(),
                  name, ": expected a ", rank, "-d torch.int32 tensor on q's device");
  return torch::stable::contiguous(t);
}

const int32_t* int32_data(const Tensor& t) { return static_cast<const int32_t*>(t.data_ptr()); }

constexpr LayoutDims kBshd = {0, 1, 2, 3};

}  // namespace

std::tuple<Tensor, Tensor> varlen_attention_forward(
    Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, std::optional<Tensor> seqused_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, std::string mask, bool /*deterministic*/,
    std::optional<Tensor> block_table, double softcap, int64_t window_left, int64_t window_right,
    std::optional<Tensor> alibi_slopes, std::optional<Tensor> sinks, int64_t attention_chunk) {
  const bool paged = block_table.has_value();
  check_qkv(q, k, v, 3, paged ? 4 : 3);
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
  Tensor out = empty_like_contiguous(q);
  Tensor lse = torch::stable::new_empty(q, {heads_q, total_q}, ScalarType::Float);
  const Extras extras = check_extras(q, batch, heads_q, alibi_slopes, sinks);

  flashgen_varlen_forward_args args{};
  args.size = sizeof(args);
  args.q = packed_view(q);
  args.out = packed_view(out);
  // Paged caches [num_pages, page_size, heads_kv, head_dim] are read as they are.
  args.k = paged ? view(k, kBshd) : packed_view(k);
  args.v = paged ? view(v, kBshd) : packed_view(v);
  args.lse = static_cast<float*>(lse.data_ptr());
  args.cu_seqlens_q = int32_data(cu_seqlens_q);
  args.cu_seqlens_k = int32_data(cu_seqlens_k);
  args.seqused_k = used.has_value() ? int32_data(*used) : nullptr;
  args.batch = batch;
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  args.options = options(scale, mask, false, softcap, window_left, window_right, attention_chunk, extras);
  if (table.has_value()) {
    args.block_table = int32_data(*table);
    args.max_pages = table->size(1);
  }
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

  flashgen_varlen_backward_args args{};
  args.size = sizeof(args);
  args.q = packed_view(t.q);
  args.k = packed_view(t.k);
  args.v = packed_view(t.v);
  args.out = packed_view(t.out);
  args.dout = packed_view(t.dout);
  args.dq = packed_view(t.dq);
  args.dk = packed_view(t.dk);
  args.dv = packed_view(t.dv);
  args.lse = static_cast<const float*>(t.lse.data_ptr());
  args.cu_seqlens_q = int32_data(cu_seqlens_q);
  args.cu_seqlens_k = int32_data(cu_seqlens_k);
  args.batch = batch;
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  args.options = options(scale, mask, deterministic, softcap, window_left, window_right, attention_chunk, extras);
  if (extras.sinks.has_value()) args.options.dsinks = static_cast<float*>(dsinks.data_ptr());
  // The workspace comes from flashgen's own pool (this C call takes none from the caller), a graph's own while
  // one is captured.
  check_status(flashgen_attention_varlen_backward(&args, current_stream(device)),
               "flashgen_attention_varlen_backward");
  return {t.dq, t.dk, t.dv, dsinks};
}

}  // namespace flashgen::torch_ops
