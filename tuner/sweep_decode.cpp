// The KV-cache sweep: decode modules and split counts checked against float64 on two sequences, timed on
// full caches (contiguous or paged) over the whole batch.
#include <algorithm>
#include <memory>
#include <numeric>

#include "launch/attention.hpp"
#include "launch/attention_kvcache.hpp"
#include "runtime/device_buffer.hpp"
#include "tuner/sweep_driver.hpp"

namespace flashgen {

using namespace sweep_driver;

namespace {

// One KV-cache problem's device tensors (q, out, lse and contiguous or paged caches, every sequence's cache full)
// and its checked call. An FP8 cache holds codes of values about 150 wide (the largest e4m3 ones saturate), read
// with no scale; k_codes and v_codes keep them on the host and k_values and v_values their values for the reference.
// A latent cache (values of a head dim of their own) stores the keys alone: v_cache is a view of their first
// head_dim_v columns, and v on the host holds those columns for the reference. fill_from: null to fill q and the
// caches with random values kept on the host (the float64 check's set), else a set whose values are repeated over
// this one's sequences (timed sets: random data, without generating gigabytes on the host).
struct DecodeSet {
  AttentionShape shape;
  int page_size = 0;                 // 0: contiguous
  int64_t pages = 0;                 // pages per sequence
  std::vector<uint16_t> q, k, v;     // host bits of a random set, k and v as [batch, seqlen_k, heads_kv, dim]
  std::vector<uint8_t> k_codes, v_codes;  // an FP8 cache's codes, likewise
  std::vector<double> k_values, v_values;  // and their values
  std::vector<int32_t> table;        // paged: key j of sequence b in page table[b * pages + j / page_size]
  DeviceBuffer dq, dk, dv, dout, dlse, dlens, dtable, slopes;  // slopes: ALiBi's standard ones, with ALiBi
  KvCacheCall call;

  DecodeSet(const AttentionProblem& problem, int64_t batch, std::mt19937_64& rng, const DecodeSet* fill_from)
      : shape(problem.shape), page_size(problem.paged ? problem.page_size : 0) {
    shape.batch = batch;
    const AttentionShape& s = shape;
    const DType dtype = problem.dtype, cache_dtype = problem.kv_dtype();
    const size_t cache_bytes = size_t(elem_bytes(cache_dtype));
    const bool latent = s.value_dim() != s.head_dim;
    const int64_t row = s.heads_kv * s.head_dim, q_elems = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    const int64_t out_elems = s.batch * s.seqlen_q * s.heads_q * s.value_dim();
    pages = page_size > 0 ? (s.seqlen_k + page_size - 1) / page_size : 0;
    const int64_t cache_rows = page_size > 0 ? s.batch * pages * page_size : s.batch * s.seqlen_k;
    table = std::vector<int32_t>(static_cast<size_t>(std::max<int64_t>(1, s.batch * pages)));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    dq = DeviceBuffer(size_t(q_elems) * 2);
    dk = DeviceBuffer(size_t(cache_rows * row) * cache_bytes);
    if (!latent) dv = DeviceBuffer(size_t(cache_rows * row) * cache_bytes);
    if (fill_from == nullptr && problem.cache_dtype) {
      q = random_bits(size_t(q_elems), dtype, rng);
      dq.upload(q);
      std::normal_distribution<float> normal(0.f, 150.f);
      for (auto* codes : {&k_codes, &v_codes}) {
        codes->resize(size_t(s.batch * s.seqlen_k * row));
        for (uint8_t& c : *codes) c = float_to_fp8_bits(normal(rng), cache_dtype);
      }
      for (const auto& [codes, values] : {std::pair{&k_codes, &k_values}, std::pair{&v_codes, &v_values}}) {
        for (uint8_t c : *codes) values->push_back(fp8_bits_to_double(c, cache_dtype));
      }
      std::vector<uint8_t> k_cache(size_t(cache_rows * row)), v_cache(k_cache.size());
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          std::copy_n(k_codes.begin() + (b * s.seqlen_k + j) * row, row, k_cache.begin() + cache_row_of(b, j) * row);
          std::copy_n(v_codes.begin() + (b * s.seqlen_k + j) * row, row, v_cache.begin() + cache_row_of(b, j) * row);
        }
      dk.upload(k_cache);
      dv.upload(v_cache);
    } else if (fill_from == nullptr) {
      q = random_bits(size_t(q_elems), dtype, rng);
      k = random_bits(size_t(s.batch * s.seqlen_k * row), dtype, rng);
      if (latent) {
        for (int64_t r = 0; r < s.batch * s.seqlen_k * s.heads_kv; ++r) {
          v.insert(v.end(), k.begin() + r * s.head_dim, k.begin() + r * s.head_dim + s.value_dim());
        }
      } else {
        v = random_bits(k.size(), dtype, rng);
      }
      dq.upload(q);
      std::vector<uint16_t> k_cache(size_t(cache_rows * row)), v_cache(latent ? 0 : k_cache.size());
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          std::copy_n(k.begin() + (b * s.seqlen_k + j) * row, row, k_cache.begin() + cache_row_of(b, j) * row);
          if (!latent) {
            std::copy_n(v.begin() + (b * s.seqlen_k + j) * row, row, v_cache.begin() + cache_row_of(b, j) * row);
          }
        }
      dk.upload(k_cache);
      if (!latent) dv.upload(v_cache);
    } else {
      // Sequence b's keys are fill_from's sequence b % its batch, copied on the device one (page of) rows at a time.
      const DecodeSet& from = *fill_from;
      const int64_t run = page_size > 0 ? page_size : s.seqlen_k;
      for (int64_t b = 0; b < s.batch; ++b) {
        const int64_t source = b % from.shape.batch;
        for (int64_t j = 0; j < s.seqlen_k; j += run) {
          const size_t bytes = size_t(std::min(run, s.seqlen_k - j) * row) * cache_bytes;
          const size_t to = size_t(cache_row_of(b, j) * row) * cache_bytes;
          const size_t at = size_t(from.cache_row_of(source, j) * row) * cache_bytes;
          dk.copy_from(from.dk, bytes, to, at);
          if (!latent) dv.copy_from(from.dv, bytes, to, at);
        }
      }
      const size_t q_bytes = size_t(q_elems) * 2;
      for (size_t at = 0; at < q_bytes; at += from.dq.bytes()) {
        dq.copy_from(from.dq, std::min(from.dq.bytes(), q_bytes - at), at);
      }
    }
    dout = DeviceBuffer(size_t(out_elems) * 2);
    dlse = DeviceBuffer(sizeof(float) * size_t(s.batch * s.heads_q * s.seqlen_q));
    dlens = DeviceBuffer(size_t(s.batch) * 4);
    dlens.upload(std::vector<int32_t>(size_t(s.batch), static_cast<int32_t>(s.seqlen_k)));
    dtable = DeviceBuffer(table.size() * 4);
    dtable.upload(table);

    KvCacheArgs args;
    args.q = bshd_view(dq.data(), dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    args.out = bshd_view(dout.data(), dtype, s.batch, s.seqlen_q, s.heads_q, s.value_dim());
    const int64_t cache_batch = page_size > 0 ? s.batch * pages : s.batch;
    const int64_t cache_len = page_size > 0 ? page_size : s.seqlen_k;
    args.k_cache = bshd_view(dk.data(), cache_dtype, cache_batch, cache_len, s.heads_kv, s.head_dim);
    args.v_cache = args.k_cache;
    if (latent) {
      args.v_cache.shape[3] = s.value_dim();
    } else {
      args.v_cache.data = dv.data();
    }
    args.lse = static_cast<float*>(dlse.data());
    args.cache_seqlens = static_cast<const int32_t*>(dlens.data());
    args.block_table = page_size > 0 ? static_cast<const int32_t*>(dtable.data()) : nullptr;
    args.max_pages = pages;
    args.options = sweep_options(problem, slopes);
    call = make_kvcache_call(args);
  }

  // The cache row holding sequence b's key j.
  int64_t cache_row_of(int64_t b, int64_t j) const {
    return page_size > 0 ? table[size_t(b * pages + j / page_size)] * int64_t(page_size) + j % page_size
                         : b * shape.seqlen_k + j;
  }
};

}  // namespace

SweepResult sweep_decode(const AttentionProblem& problem, const std::vector<DecodeSplitConfig>& candidates,
                         CUstream stream, const SweepOptions& options) {
  FLASHGEN_REQUIRE(problem.kv_cache, "sweep_decode: the problem is not a KV-cache one");
  FLASHGEN_REQUIRE(!problem.paged || (problem.page_size > 0 && problem.page_size % 16 == 0),
                   "sweep_decode: a paged problem needs a page_size that is a multiple of 16, got " +
                       std::to_string(problem.page_size));
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  const DType dtype = problem.dtype;

  SweepResult result;
  result.problem = problem_key(problem);
  for (const DecodeSplitConfig& c : candidates) {
    FLASHGEN_REQUIRE(of_problem(c, result.problem), "candidate " + c.name() + " does not match the sweep's problem");
  }

  // The float64 check runs the problem's sizes on at most two sequences (a split count means the same per
  // sequence); the timed sets repeat its values over the whole batch. Every cache is full, so the reference's
  // bottom-right diagonal (seqlen_k - seqlen_q), which a causal mask and a window lie about, is the kernels'.
  std::mt19937_64 rng(options.seed);
  DecodeSet check(problem, std::min<int64_t>(problem.shape.batch, 2), rng, nullptr);
  const AttentionShape& cs = check.shape;
  const StridedView q_view = StridedView::contiguous(cs.batch, cs.seqlen_q, cs.heads_q, cs.head_dim);
  const StridedView kv_view = StridedView::contiguous(cs.batch, cs.seqlen_k, cs.heads_kv, cs.head_dim);
  const StridedView v_view = StridedView::contiguous(cs.batch, cs.seqlen_k, cs.heads_kv, cs.value_dim());
  const StridedView out_view = StridedView::contiguous(cs.batch, cs.seqlen_q, cs.heads_q, cs.value_dim());
  const std::vector<RowSample> rows = sample_rows(cs, options.check_rows);
  const bool fp8 = problem.cache_dtype.has_value();
  const std::vector<ReferenceRow> reference = attention_reference_rows(
      cs, HostInput::bits16(check.q.data(), dtype, q_view),
      fp8 ? HostInput::float64(check.k_values.data(), kv_view) : HostInput::bits16(check.k.data(), dtype, kv_view),
      fp8 ? HostInput::float64(check.v_values.data(), v_view) : HostInput::bits16(check.v.data(), dtype, v_view),
      check.call.params.variant.scale, problem.mask, rows, /*threads=*/1, variant_of(problem));
  const AttentionShape& shape = problem.shape;
  const int64_t kv_bytes = (shape.value_dim() != shape.head_dim ? 1 : 2) * shape.batch * shape.seqlen_k *
                           shape.heads_kv * shape.head_dim * elem_bytes(problem.kv_dtype());  // a latent cache once
  const int sets = input_sets(scope.device(), kv_bytes);
  std::vector<std::unique_ptr<DecodeSet>> timed_sets;
  for (int i = 0; i < sets; ++i) timed_sets.push_back(std::make_unique<DecodeSet>(problem, shape.batch, rng, &check));

  // A launch of config on set with a workspace of its own.
  struct Prepared {
    PreparedKvCache launch;
    DeviceBuffer workspace;
    void operator()(CUstream on) const { launch(on, workspace.ptr()); }
  };
  auto prepare = [&](const DecodeSplitConfig& c, const DecodeSet& set) {
    Prepared p{prepare_kvcache(set.call, stream, c.config, c.splits), DeviceBuffer()};
    p.workspace = DeviceBuffer(std::max<size_t>(p.launch.workspace_bytes, 1));
    return p;
  };

  PassHooks<DecodeSplitConfig> hooks;
  hooks.check = [&](const DecodeSplitConfig& c) -> std::string {
    check.dout.fill_bytes(0xff, stream);  // NaN: an unwritten element fails the check
    check.dlse.fill_bytes(0xff, stream);
    const Prepared launch = prepare(c, check);  // its workspace lives until the kernels are done
    launch(stream);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    std::vector<uint16_t> out(check.dout.bytes() / 2);
    std::vector<float> lse(check.dlse.bytes() / sizeof(float));
    check.dout.download(out.data(), check.dout.bytes());
    check.dlse.download(lse.data(), check.dlse.bytes());
    const RowsCheck checked =
        check_rows(cs, rows, reference, HostInput::bits16(out.data(), dtype, out_view), lse.data(), dtype);
    return failures({&checked.out, &checked.lse});
  };
  hooks.prepare = [&](const DecodeSplitConfig& c) -> std::function<void(int)> {
    auto prepared = std::make_shared<std::vector<Prepared>>();
    for (const auto& set : timed_sets) prepared->push_back(prepare(c, *set));
    return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()](stream); };
  };
  run_sweep(candidates, arch, stream, options, hooks, result);
  return result;
}

}  // namespace flashgen
