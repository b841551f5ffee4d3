// flashgen::attention_kvcache: new queries against a KV cache, contiguous or paged, 16-bit or FP8 with its scales, or
// a latent one (MLA's: v_cache a view of k_cache's first columns); the new tokens' keys and values, when given, are
// written into the caches in place first (a latent cache's as k alone).
#include "ops.hpp"

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

namespace flashgen::torch_ops {

using torch::headeronly::ScalarType;

namespace {

std::optional<Tensor> int32_array(const std::optional<Tensor>& t, const Tensor& q, int64_t rank, const char* name) {
  if (!t.has_value()) return std::nullopt;
  STD_TORCH_CHECK(t->scalar_type() == ScalarType::Int && t->dim() == rank && t->is_cuda() &&
                      t->get_device_index() == q.get_device_index() && t->size(0) == q.size(0),
                  name, ": expected a ", rank, "-d torch.int32 tensor on q's device with q.shape[0] rows");
  return torch::stable::contiguous(*t);
}

// An FP8 cache's scales (k_scale of k_cache, v_scale of v_cache) as flashgen_kvcache_args takes them: the pointer and
// the (sequence, kv head) strides, 0 over a dimension the scale shares; null for none.
struct CacheScale {
  const float* data = nullptr;
  int64_t stride[2] = {0, 0};
};

CacheScale cache_scale(const std::optional<Tensor>& scale, const Tensor& cache, const Tensor& q, const char* name) {
  CacheScale result;
  if (!scale.has_value()) return result;
  const Tensor& s = *scale;
  STD_TORCH_CHECK(is_fp8(cache), name, ": given for a 16-bit cache; scales are an FP8 cache's (torch.float8_e4m3fn, "
                  "torch.float8_e5m2)");
  const int64_t batch = q.size(0), heads_kv = cache.size(2);
  const bool shaped = s.dim() == 0 || (s.dim() == 1 && (s.size(0) == 1 || s.size(0) == heads_kv)) ||
                      (s.dim() == 2 && s.size(0) == batch && s.size(1) == heads_kv);
  STD_TORCH_CHECK(s.scalar_type() == ScalarType::Float && shaped, name,
                  " must be float32 of shape () or [1] (per tensor), [heads_kv] = [", heads_kv,
                  "] (per kv head) or [batch, heads_kv] = [", batch, ", ", heads_kv, "] (per sequence and kv head)");
  STD_TORCH_CHECK(on_device_of(s, q), name, " must be on q's device");
  result.data = static_cast<const float*>(s.data_ptr());
  if (s.dim() == 2) {
    for (int64_t i = 0; i < 2; ++i) result.stride[i] = s.size(i) == 1 ? 0 : s.stride(i);
  } else if (s.dim() == 1 && s.size(0) > 1) {
    result.stride[1] = s.stride(0);
  }
  return result;
}

}  // namespace

std::tuple<Tensor, Tensor> attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k,
                                             std::optional<Tensor> v, std::optional<Tensor> cache_seqlens,
                                             std::optional<Tensor> block_table, double scale, std::string mask,
                                             int64_t num_splits, int64_t window_left, int64_t window_right,
                                             std::optional<Tensor> sinks, int64_t attention_chunk, double softcap,
                                             std::optional<Tensor> alibi_slopes, std::optional<Tensor> k_scale,
                                             std::optional<Tensor> v_scale) {
  // The caches are written in place: they are read as they are, never copied (the library checks their strides).
  // They are q's dtype or FP8 (the library checks that both share the format and what an FP8 cache takes).
  check_qkv(q, k_cache, v_cache, 4, 4, /*fp8_kv=*/true);
  // A latent cache's values are narrower than its keys (the library checks that v_cache is a view of k_cache).
  const bool latent = v_cache.size(3) != k_cache.size(3);
  if (latent) {
    STD_TORCH_CHECK(!v.has_value(), "v: a latent cache's new values are k's first ", v_cache.size(3),
                    " columns (v_cache is a view of k_cache's); pass k alone");
  } else {
    STD_TORCH_CHECK(k.has_value() == v.has_value(), "k and v: give both (the new tokens to append) or neither");
  }
  const int32_t device = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  q = readable(q);
  if (k.has_value()) {
    check_qkv(q, *k, v.has_value() ? *v : *k, 4, 4);
    k = readable(*k);
    if (v.has_value()) v = readable(*v);
  }
  const std::optional<Tensor> seqlens = int32_array(cache_seqlens, q, 1, "cache_seqlens");
  const std::optional<Tensor> table = int32_array(block_table, q, 2, "block_table");
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads_q = q.size(2);
  const Extras extras = check_extras(q, batch, heads_q, alibi_slopes, sinks);
  const CacheScale keys_scale = cache_scale(k_scale, k_cache, q, "k_scale");
  const CacheScale values_scale = cache_scale(v_scale, v_cache, q, "v_scale");
  Tensor out = empty_output(q, v_cache);
  Tensor lse = torch::stable::new_empty(q, {batch, heads_q, seqlen_q}, ScalarType::Float);

  flashgen_kvcache_args args{};
  args.size = sizeof(args);
  args.q = view(q, kBshd);
  args.k_cache = view(k_cache, kBshd, /*fp8_taken=*/true);
  args.v_cache = view(v_cache, kBshd, /*fp8_taken=*/true);
  if (k.has_value()) args.k_new = view(*k, kBshd);
  if (v.has_value()) args.v_new = view(*v, kBshd);
  args.out = view(out, kBshd);
  args.lse = static_cast<float*>(lse.data_ptr());
  args.cache_seqlens = seqlens.has_value() ? static_cast<const int32_t*>(seqlens->data_ptr()) : nullptr;
  if (table.has_value()) {
    args.block_table = static_cast<const int32_t*>(table->data_ptr());
    args.max_pages = table->size(1);
  }
  args.num_splits = num_splits;
  args.options = options(scale, mask, false, softcap, window_left, window_right, attention_chunk, extras);
  args.k_scale = keys_scale.data;
  args.v_scale = values_scale.data;
  for (int i = 0; i < 2; ++i) {
    args.k_scale_stride[i] = keys_scale.stride[i];
    args.v_scale_stride[i] = values_scale.stride[i];
  }
  void* stream = current_stream(device);
  size_t workspace_bytes = 0;
  check_status(flashgen_attention_kvcache_workspace_size(&args, stream, &workspace_bytes),
               "flashgen_attention_kvcache_workspace_size");
  // The split workspace from torch's allocator: captured with the call into a CUDA graph's pool.
  std::optional<Tensor> workspace;
  if (workspace_bytes > 0) {
    workspace = workspace_like(q, workspace_bytes);
    args.workspace = workspace->data_ptr();
    args.workspace_bytes = workspace_bytes;
  }
  check_status(flashgen_attention_kvcache(&args, stream), "flashgen_attention_kvcache");
  return {out, lse};
}

}  // namespace flashgen::torch_ops
