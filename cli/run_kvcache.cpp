// `flashgen run --kv-cache`: decoding against a contiguous or paged KV cache, checked and timed.
#include <algorithm>
#include <optional>

#include "cli/common.hpp"
#include "cli/run_support.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "launch/attention.hpp"
#include "launch/attention_kvcache.hpp"
#include "launch/tensor_checks.hpp"
#include "tuner/decode_choice.hpp"

namespace flashgen::cli {

namespace {

// A --kv-cache run's cache: pages of page_size keys per sequence (ceil(seqlen_k / page_size) of them) in a
// shuffled order, or 0 for a contiguous cache.
int64_t pages_per_sequence(const RunOptions& o) {
  const int64_t page_size = o.problem.page_size;
  return o.problem.paged ? (o.problem.shape.seqlen_k + page_size - 1) / page_size : 0;
}

// The KvCacheArgs of a --kv-cache run: q and out, the caches (paged through table, else contiguous), every
// sequence's cache holding lens[b] = seqlen_k keys.
KvCacheArgs kvcache_args(const RunOptions& o, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                         const TensorView& out, float* lse, const int32_t* lens, const int32_t* table) {
  KvCacheArgs args;
  args.q = q, args.k_cache = k_cache, args.v_cache = v_cache, args.out = out;
  args.lse = lse;
  args.cache_seqlens = lens;
  args.block_table = o.problem.paged ? table : nullptr;
  args.max_pages = pages_per_sequence(o);
  args.num_splits = o.splits;
  args.options = call_options(o.problem, o.scale);
  args.options.alibi_slopes = placeholder_alibi_slopes(o.problem);  // the run's own are uploaded before it launches
  return args;
}

// The shape of a --kv-cache run's k_cache or v_cache: [batch * pages, page_size, ...] paged, else [batch, seqlen_k, ...].
TensorView cache_tensor(const RunOptions& o, void* data) {
  const AttentionShape& s = o.problem.shape;
  const int64_t pages = pages_per_sequence(o);
  const DType dtype = o.problem.kv_dtype();
  return o.problem.paged ? bshd_view(data, dtype, s.batch * pages, o.problem.page_size, s.heads_kv, s.head_dim)
                         : bshd_view(data, dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
}

// --head-dim-v with --kv-cache: a latent cache (MLA's), whose values are the keys' first head_dim_v columns.
bool latent_cache(const RunOptions& o) { return o.problem.shape.value_dim() != o.problem.shape.head_dim; }

// A latent cache's v_cache: a view of k_cache's first head_dim_v columns (same data and strides), as MLA reads it.
TensorView latent_values_view(const RunOptions& o, const TensorView& k_cache) {
  TensorView values = k_cache;
  values.shape[3] = o.problem.shape.value_dim();
  return values;
}

// The values a latent cache's keys hold, as the float64 reference reads them: [batch, seqlen_k, heads_kv,
// head_dim_v], each row the first head_dim_v columns of k's.
HostTensor latent_values(const HostTensor& k, int64_t head_dim_v) {
  const int64_t batch = k.view.shape[0], seqlen = k.view.shape[1], heads = k.view.shape[2], d = k.view.shape[3];
  HostTensor v = make_host_tensor(k.dtype, batch, seqlen, heads, head_dim_v, false);
  for (int64_t r = 0; r < batch * seqlen * heads; ++r) {
    std::copy_n(k.bits.begin() + r * d, head_dim_v, v.bits.begin() + r * head_dim_v);
  }
  return v;
}

// An FP8 cache's scale for keys and values alike (one per tensor): codes of values about 64 wide stand for values
// about 1, a power of two so the reference's values are the codes' exactly scaled.
constexpr float kFp8RunScale = 1.f / 64.f;

// A --cache-dtype run's cache rows: t's values divided by kFp8RunScale and rounded to the FP8 type (the codes the
// device holds), and each code's value times kFp8RunScale (what the reference reads).
struct Fp8Rows {
  std::vector<uint8_t> codes;
  std::vector<double> values;
};

Fp8Rows fp8_rows(const HostTensor& t, DType fp8) {
  Fp8Rows rows;
  for (uint16_t bits : t.bits) {
    rows.codes.push_back(float_to_fp8_bits(dtype_bits_to_float(bits, t.dtype) / kFp8RunScale, fp8));
    rows.values.push_back(fp8_bits_to_double(rows.codes.back(), fp8) * double(kFp8RunScale));
  }
  return rows;
}

}  // namespace

// `run --kv-cache`: random q and caches (k and v as the reference sees them, scattered into shuffled pages
// when paged), one checked call, then timing. With --head-dim-v the cache is latent: k alone is stored, v_cache is
// a view of its first head_dim_v columns, and the reference reads those columns as the values.
RunReport run_kvcache(const RunOptions& o, const ScopedContext& context, RunReport report) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  const bool latent = latent_cache(o);
  HostTensor q = make_host_tensor(p.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim, false);
  HostTensor k = make_host_tensor(p.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, false);
  HostTensor out = make_host_tensor(p.dtype, s.batch, s.seqlen_q, s.heads_q, s.value_dim(), false);
  std::vector<float> lse(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q));
  std::mt19937 rng(o.seed);
  fill_normal(q, rng);
  fill_normal(k, rng);
  HostTensor v;
  if (latent) {
    v = latent_values(k, s.value_dim());
  } else {
    v = make_host_tensor(p.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, false);
    fill_normal(v, rng);
  }

  // The caches as the kernels read them: sequence b's key j in row j % page_size of page table[b][j / page_size].
  // Every page is full, so no row holds the fill.
  const int64_t pages = pages_per_sequence(o), row = s.heads_kv * s.head_dim;
  const std::vector<int32_t> table = shuffled_pages(std::max<int64_t>(1, s.batch * pages), rng());
  std::vector<int64_t> starts(static_cast<size_t>(s.batch)), keys(starts.size(), s.seqlen_k);
  for (int64_t b = 0; b < s.batch; ++b) starts[size_t(b)] = b * s.seqlen_k;
  const std::vector<uint16_t> k_cache = p.paged ? into_pages(k.bits, row, starts, keys, table, pages, p.page_size, uint16_t{0})
                                                : k.bits;
  std::vector<uint16_t> v_cache;  // a latent cache has none of its own
  if (!latent) v_cache = p.paged ? into_pages(v.bits, row, starts, keys, table, pages, p.page_size, uint16_t{0}) : v.bits;
  // An FP8 cache (--cache-dtype) holds codes of k and v scaled, and the reference reads the codes' values.
  Fp8Rows k_fp8, v_fp8;
  if (p.cache_dtype) {
    k_fp8 = fp8_rows(k, *p.cache_dtype), v_fp8 = fp8_rows(v, *p.cache_dtype);
    for (Fp8Rows* rows : {&k_fp8, &v_fp8}) {
      if (p.paged) rows->codes = into_pages(rows->codes, row, starts, keys, table, pages, p.page_size, uint8_t{0});
    }
  }
  const size_t cache_bytes = p.cache_dtype ? k_fp8.codes.size() : k_cache.size() * 2;

  DeviceBuffer q_dev(q.bytes()), out_dev(out.bytes()), lse_dev(lse.size() * sizeof(float));
  DeviceBuffer k_dev(cache_bytes), table_dev(table.size() * 4);
  DeviceBuffer v_dev = latent ? DeviceBuffer() : DeviceBuffer(cache_bytes);
  DeviceBuffer lens_dev(static_cast<size_t>(s.batch) * 4), scale_dev(sizeof(float));
  q_dev.upload(q.bits), table_dev.upload(table);
  if (p.cache_dtype) {
    k_dev.upload(k_fp8.codes), v_dev.upload(v_fp8.codes);
    scale_dev.upload(std::vector<float>{kFp8RunScale});
  } else {
    k_dev.upload(k_cache);
    if (!latent) v_dev.upload(v_cache);
  }
  lens_dev.upload(std::vector<int32_t>(static_cast<size_t>(s.batch), static_cast<int32_t>(s.seqlen_k)));
  out_dev.fill_bytes(0xFF);
  lse_dev.fill_bytes(0xFF);
  const TensorView k_view = cache_tensor(o, k_dev.data());
  const TensorView v_view = latent ? latent_values_view(o, k_view) : cache_tensor(o, v_dev.data());
  KvCacheArgs args =
      kvcache_args(o, tensor_view(q, q_dev), k_view, v_view, tensor_view(out, out_dev),
                   static_cast<float*>(lse_dev.data()), static_cast<const int32_t*>(lens_dev.data()),
                   static_cast<const int32_t*>(table_dev.data()));
  if (p.cache_dtype) args.k_scale = args.v_scale = static_cast<const float*>(scale_dev.data());
  DeviceBuffer sinks_dev, slopes_dev;
  args.options.sinks = upload_sinks(o, sinks_dev);
  args.options.alibi_slopes = upload_alibi_slopes(p, slopes_dev);
  const KvCacheCall call = make_kvcache_call(args);

  Stream stream;
  std::optional<PreparedKvCache> requested;
  if (o.config_name) {
    const DecodeConfig config = DecodeConfig::from_name(*o.config_name);
    const int splits = o.splits > 0 ? o.splits
                                    : heuristic_decode_splits(p, config, report.device_sm,
                                                              device_traits(context.device()).multiprocessors);
    requested = prepare_kvcache(call, stream.get(), config, splits);
    report.config_name = config.name() + ", " + std::to_string(requested->splits) + " key ranges";
    report.reason = "requested with --config";
    report.arch = requested->arch;
  }
  const int device = static_cast<int>(context.device());
  auto launch = [&] {
    if (requested) {
      launch_prepared_kvcache(*requested, call, stream.get(), device);
      return KvCacheLaunch{};
    }
    return attention_kvcache(args, stream.get());
  };
  const Clock::time_point first = Clock::now();
  const KvCacheLaunch chosen = launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream.get()));
  report.first_launch_ms = ms_since(first);
  if (!requested) {
    report.config_name = chosen.config.name() + ", " + std::to_string(chosen.splits) + " key ranges";
    report.reason = chosen.reason;
    report.arch = chosen.arch;
  }
  report.scale = call.params.variant.scale;
  out_dev.download(out.bits.data(), out.bytes());
  lse_dev.download(lse.data(), lse_dev.bytes());
  const StridedView cache_view = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  const HostInput k_in = p.cache_dtype ? HostInput::float64(k_fp8.values.data(), cache_view) : k.input();
  const HostInput v_in = p.cache_dtype ? HostInput::float64(v_fp8.values.data(), cache_view) : v.input();
  report.check = check_sampled_rows(s, q.input(), k_in, v_in, out.input(), lse.data(), p.dtype,
                                    sample_rows(s.batch, s.heads_q, s.seqlen_q, o.check_rows),
                                    report.scale, p.mask, run_variant(o));
  report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
  report.flops = forward_flops(s, p.mask, window_of(p));
  // A latent cache is read once: its values are columns of the keys.
  report.kv_bytes = (latent ? 1.0 : 2.0) * s.batch * s.seqlen_k * s.heads_kv * s.head_dim * elem_bytes(p.kv_dtype());
  return report;
}

void check_kvcache_problem(const RunOptions& o) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  auto address = [](int n) { return reinterpret_cast<void*>(uintptr_t{1} << (20 + n)); };
  const DType dtype = p.dtype;
  const TensorView q = bshd_view(address(0), dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const TensorView out = bshd_view(address(3), dtype, s.batch, s.seqlen_q, s.heads_q, s.value_dim());
  const TensorView k_cache = cache_tensor(o, address(1));
  const TensorView v_cache = latent_cache(o) ? latent_values_view(o, k_cache) : cache_tensor(o, address(2));
  const KvCacheArgs args = kvcache_args(o, q, k_cache, v_cache, out, nullptr, static_cast<const int32_t*>(address(4)),
                                        static_cast<const int32_t*>(address(5)));
  const KvCacheCall call = make_kvcache_call(args);
  if (o.config_name) {
    const DecodeConfig config = DecodeConfig::from_name(*o.config_name);
    check_requested_config(config, call.problem, 90);
    FLASHGEN_REQUIRE(config.paged == call.problem.paged,
                     "config " + config.name() + (config.paged ? " reads a paged cache: pass --page-size"
                                                               : " reads a contiguous cache: drop --page-size"));
  }
}

}  // namespace flashgen::cli
