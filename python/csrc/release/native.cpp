// The dense and packed ops' CUDA kernels over ATen tensors: the op library's kernels (ops_dense.cpp, ops_varlen.cpp)
// call for call, with ATen's allocations in place of the stable ABI's boxed ones.
#include "native.hpp"

#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <vector>

// torch's CUDA build exports it (the stable ABI's shim); declared here to need no CUDA headers.
extern "C" int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);

// The profiler's event of the op a call stands for, as the dispatcher would have recorded it.
#define FLASHGEN_RECORD_OP(name) RECORD_FUNCTION(name, std::vector<c10::IValue>())

namespace flashgen::torch_ops::native {

namespace {

// The fp32 extras, converted where the kernels cannot read them as given, held until the call is queued.
struct Extras {
  OptionalTensor alibi_slopes, sinks;
};

Extras extras(const Tensor& q, int64_t batch, int64_t heads_q, const OptionalTensor& alibi_slopes,
              const OptionalTensor& sinks) {
  const ExtrasAsGiven given = extras_as_given(q, batch, heads_q, alibi_slopes, sinks);
  Extras result{alibi_slopes, sinks};
  if (!given.slopes_readable) result.alibi_slopes = alibi_slopes->contiguous();
  if (!given.sinks_readable) result.sinks = sinks->to(at::kFloat).contiguous();
  return result;
}

Tensor empty_like_contiguous(const Tensor& t) { return at::empty(t.sizes(), t.options()); }

// The forward's output: q's shape, its last dim (head_dim in either layout) v's.
Tensor empty_output(const Tensor& q, const Tensor& v) {
  std::vector<int64_t> sizes(q.sizes().begin(), q.sizes().end());
  sizes.back() = v.size(v.dim() - 1);
  return at::empty(sizes, q.options());
}

Tensor int32_array(const Tensor& t, const Tensor& q, int64_t rank, const char* name) {
  check_int32_array(t, q, rank, name);
  return t.contiguous();
}

}  // namespace

bool reaches_cuda_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet tensor_keys) {
  const auto local = c10::impl::tls_local_dispatch_key_set();
  c10::DispatchKeySet keys = (tensor_keys | local.included_) - local.excluded_;
  // Keys whose fallback passes an op without its own kernel there through to the next key (BackendSelect and
  // ADInplaceOrView are in every thread's included set).
  for (const c10::DispatchKey key : {c10::DispatchKey::BackendSelect, c10::DispatchKey::ADInplaceOrView}) {
    if (!op.hasKernelForDispatchKey(key)) keys = keys.remove(key);
  }
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::AutocastCUDA)) keys = keys - c10::autocast_dispatch_keyset;
  return keys.highestPriorityTypeId() == c10::DispatchKey::CUDA;
}

void* current_stream(c10::DeviceIndex device) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == 0, "no current CUDA stream on device ",
                  static_cast<int>(device));
  return stream;
}

std::tuple<Tensor, Tensor> attention_forward(const Tensor& query, const Tensor& key, const Tensor& value, double scale,
                                             std::string_view mask, std::string_view layout, double softcap,
                                             int64_t window_left, int64_t window_right,
                                             const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
                                             int64_t attention_chunk) {
  FLASHGEN_RECORD_OP("flashgen::attention_forward");
  check_qkv(query, key, value, 4, 4);
  const LayoutDims dims = layout_dims(layout);
  // The library takes the CUDA context from the stream, on the legacy default stream from the current device.
  c10::DeviceGuard on_device(query.device());
  const Tensor q = readable(query), k = readable(key), v = readable(value);
  const int64_t batch = q.size(dims[0]), seqlen_q = q.size(dims[1]), heads_q = q.size(dims[2]);
  const Extras e = extras(q, batch, heads_q, alibi_slopes, sinks);
  Tensor out = empty_output(q, v);
  Tensor lse = at::empty({batch, heads_q, seqlen_q}, q.options().dtype(at::kFloat));
  const flashgen_tensor views[] = {view(q, dims), view(k, dims), view(v, dims), view(out, dims)};
  const flashgen_attention_options opts =
      options(scale, mask, false, softcap, window_left, window_right, attention_chunk, e.alibi_slopes, e.sinks);
  check_status(flashgen_attention_forward(&views[0], &views[1], &views[2], &views[3], lse.data_ptr<float>(), &opts,
                                          current_stream(q.get_device())),
               "flashgen_attention_forward");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& output,
    const Tensor& logsumexp, double scale, std::string_view mask, std::string_view layout, bool deterministic,
    double softcap, int64_t window_left, int64_t window_right, const OptionalTensor& alibi_slopes,
    const OptionalTensor& sinks, int64_t attention_chunk) {
  FLASHGEN_RECORD_OP("flashgen::attention_backward");
  check_qkv(query, key, value, 4, 4);
  const LayoutDims dims = layout_dims(layout);
  c10::DeviceGuard on_device(query.device());
  const int64_t batch = query.size(dims[0]), seqlen_q = query.size(dims[1]), heads_q = query.size(dims[2]);
  STD_TORCH_CHECK(logsumexp.scalar_type() == at::kFloat && logsumexp.dim() == 3 && logsumexp.size(0) == batch &&
                      logsumexp.size(1) == heads_q && logsumexp.size(2) == seqlen_q,
                  "lse: expected float32 [", batch, ", ", heads_q, ", ", seqlen_q, "] as the forward returned it");
  const Tensor dout = readable(grad_out), q = readable(query), k = readable(key), v = readable(value);
  const Tensor out = readable(output), lse = logsumexp.contiguous();
  const Tensor dq = empty_like_contiguous(q), dk = empty_like_contiguous(k), dv = empty_like_contiguous(v);
  const Extras e = extras(q, batch, heads_q, alibi_slopes, sinks);
  Tensor dsinks;
  flashgen_attention_options opts =
      options(scale, mask, deterministic, softcap, window_left, window_right, attention_chunk, e.alibi_slopes,
              e.sinks);
  if (e.sinks.has_value()) {
    dsinks = at::empty({heads_q}, q.options().dtype(at::kFloat));
    opts.dsinks = dsinks.data_ptr<float>();
  }
  // In the C ABI's order: q, k, v, out, dout, then dq, dk, dv.
  const flashgen_tensor views[] = {view(q, dims),    view(k, dims),  view(v, dims),  view(out, dims),
                                   view(dout, dims), view(dq, dims), view(dk, dims), view(dv, dims)};
  const float* lse_data = lse.data_ptr<float>();
  void* stream = current_stream(q.get_device());
  size_t workspace_bytes = 0;
  check_status(flashgen_attention_backward_workspace_size(&views[0], &views[1], &views[2], &views[3], &views[4],
                                                          lse_data, &views[5], &views[6], &views[7], &opts, stream,
                                                          &workspace_bytes),
               "flashgen_attention_backward_workspace_size");
  // The caching allocator hands out 512-byte aligned blocks; the library asks for 256.
  const Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, q.options().dtype(at::kByte));
  check_status(flashgen_attention_backward_with_workspace(&views[0], &views[1], &views[2], &views[3], &views[4],
                                                          lse_data, &views[5], &views[6], &views[7], &opts,
                                                          workspace.data_ptr(), workspace_bytes, stream),
               "flashgen_attention_backward_with_workspace");
  return {dq, dk, dv, dsinks};
}

std::tuple<Tensor, Tensor> varlen_attention_forward(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& cu_seqlens_q,
    const Tensor& cu_seqlens_k, const OptionalTensor& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double scale, std::string_view mask, const OptionalTensor& block_table, double softcap, int64_t window_left,
    int64_t window_right, const OptionalTensor& alibi_slopes, const OptionalTensor& sinks, int64_t attention_chunk) {
  FLASHGEN_RECORD_OP("flashgen::varlen_attention_forward");
  const bool paged = block_table.has_value();
  check_qkv(query, key, value, 3, paged ? 4 : 3);
  c10::DeviceGuard on_device(query.device());
  const Tensor q = readable(query), k = readable(key), v = readable(value);
  // Held until the call is queued, with every converted copy below.
  const Tensor offsets_q = int32_array(cu_seqlens_q, q, 1, "cu_seqlens_q");
  const Tensor offsets_k = int32_array(cu_seqlens_k, q, 1, "cu_seqlens_k");
  const Tensor used = seqused_k.has_value() ? int32_array(*seqused_k, q, 1, "seqused_k") : Tensor();
  const Tensor table = paged ? int32_array(*block_table, q, 2, "block_table") : Tensor();
  const int64_t total_q = q.size(0), heads_q = q.size(1), batch = offsets_q.size(0) - 1;
  Tensor out = empty_output(q, v);
  Tensor lse = at::empty({heads_q, total_q}, q.options().dtype(at::kFloat));
  const Extras e = extras(q, batch, heads_q, alibi_slopes, sinks);

  flashgen_varlen_forward_args args =
      varlen_forward_args(q, k, v, out, offsets_q, offsets_k, used.defined() ? &used : nullptr,
                          paged ? &table : nullptr, max_seqlen_q, max_seqlen_k);
  args.lse = lse.data_ptr<float>();
  args.options =
      options(scale, mask, false, softcap, window_left, window_right, attention_chunk, e.alibi_slopes, e.sinks);
  check_status(flashgen_attention_varlen_forward(&args, current_stream(q.get_device())),
               "flashgen_attention_varlen_forward");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> varlen_attention_backward(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& output,
    const Tensor& logsumexp, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double scale, std::string_view mask, bool deterministic, double softcap,
    int64_t window_left, int64_t window_right, const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
    int64_t attention_chunk) {
  FLASHGEN_RECORD_OP("flashgen::varlen_attention_backward");
  check_qkv(query, key, value, 3, 3);
  c10::DeviceGuard on_device(query.device());
  const Tensor dout = readable(grad_out), q = readable(query), k = readable(key), v = readable(value);
  const Tensor out = readable(output), lse = logsumexp.contiguous();
  const Tensor dq = empty_like_contiguous(q), dk = empty_like_contiguous(k), dv = empty_like_contiguous(v);
  const Tensor offsets_q = int32_array(cu_seqlens_q, q, 1, "cu_seqlens_q");
  const Tensor offsets_k = int32_array(cu_seqlens_k, q, 1, "cu_seqlens_k");
  const int64_t heads_q = q.size(1), batch = offsets_q.size(0) - 1;
  const Extras e = extras(q, batch, heads_q, alibi_slopes, sinks);
  Tensor dsinks;

  flashgen_varlen_backward_args args = varlen_backward_args(dout, q, k, v, out, dq, dk, dv, offsets_q, offsets_k,
                                                            max_seqlen_q, max_seqlen_k);
  args.lse = lse.data_ptr<float>();
  args.options = options(scale, mask, deterministic, softcap, window_left, window_right, attention_chunk,
                         e.alibi_slopes, e.sinks);
  if (e.sinks.has_value()) {
    dsinks = at::empty({heads_q}, q.options().dtype(at::kFloat));
    args.options.dsinks = dsinks.data_ptr<float>();
  }
  // The workspace comes from flashgen's own pool (this C call takes none from the caller), a graph's own while
  // one is captured.
  check_status(flashgen_attention_varlen_backward(&args, current_stream(q.get_device())),
               "flashgen_attention_varlen_backward");
  return {dq, dk, dv, dsinks};
}

}  // namespace flashgen::torch_ops::native
