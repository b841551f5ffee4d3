// [gpu] tests of attention against a latent KV cache (MLA decoding): keys of head_dim columns whose first
// head_dim_v columns are the values, v_cache a view of k_cache. Every sequence's out and lse against a float64
// attention over its expanded latent (keys the whole rows, values their first columns), contiguous and paged
// caches (shuffled pages of 64 and 48 rows, spare pages of noise), 1-4 new tokens, appended through k_new alone,
// causal both alignments and no mask, 16-128 query heads over one or two kv heads, several split counts, an
// empty cache, and batch invariance at a fixed split count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/device_inputs.hpp"

namespace {

using flashgen::DeviceBuffer;

struct LatentCase {
  std::string name;
  flashgen_dtype dtype = FLASHGEN_BFLOAT16;
  int64_t head_dim = 576, head_dim_v = 512;
  int64_t heads_q = 128, heads_kv = 1;
  flashgen_mask mask = FLASHGEN_MASK_CAUSAL;
  int64_t seqlen_q = 1;
  std::vector<int32_t> cache_lens;  // per sequence, before the new tokens
  int64_t capacity = 0;             // keys a sequence's cache holds
  int64_t page_size = 0;            // 0: a contiguous cache
  int64_t seqlen_new = 0;           // appended tokens (0: none)
  std::vector<int> splits = {0, 1, 3};
};

flashgen_tensor bshd(const DeviceBuffer& b, flashgen_dtype dtype, int64_t n0, int64_t n1, int64_t h, int64_t d) {
  return flashgen_tensor{b.data(), dtype, {n0, n1, h, d}, {n1 * h * d, h * d, d, 1}};
}

// A case's inputs: each sequence's logical latent rows on the host, on the device contiguous or in shuffled pages,
// the new tokens' rows, out and lse poisoned with NaN.
struct LatentBatch {
  int64_t batch, pages_per_seq = 0, num_pages = 0;
  std::vector<uint16_t> q, latent, fresh;  // latent: [batch, capacity, heads_kv, head_dim]
  std::vector<int32_t> table;
  DeviceBuffer dq, dcache, dnew, dout, dlse, dlens, dtable;
  flashgen_kvcache_args args{};

  LatentBatch(const LatentCase& c, uint64_t seed) : batch(static_cast<int64_t>(c.cache_lens.size())) {
    const int64_t row = c.heads_kv * c.head_dim;
    std::mt19937_64 rng(seed);
    using flashgen::test::random_bits;
    q = random_bits(size_t(batch * c.seqlen_q * c.heads_q * c.head_dim), c.dtype, rng);
    latent = random_bits(size_t(batch * c.capacity * row), c.dtype, rng);
    fresh = random_bits(size_t(batch * std::max<int64_t>(c.seqlen_new, 1) * row), c.dtype, rng);
    std::vector<uint16_t> phys = latent;
    if (c.page_size > 0) {
      pages_per_seq = c.capacity / c.page_size;
      num_pages = batch * pages_per_seq + 3;
      std::vector<int32_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      table.assign(order.begin(), order.begin() + batch * pages_per_seq);
      phys = random_bits(size_t(num_pages * c.page_size * row), c.dtype, rng);  // spare pages hold noise
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t j = 0; j < c.capacity; ++j) {
          const int64_t page = table[size_t(b * pages_per_seq + j / c.page_size)];
          std::copy_n(latent.begin() + (b * c.capacity + j) * row, row,
                      phys.begin() + (page * c.page_size + j % c.page_size) * row);
        }
    }
    using flashgen::test::upload;
    dq = upload(q), dcache = upload(phys), dnew = upload(fresh), dlens = upload(c.cache_lens);
    dtable = upload(table.empty() ? std::vector<int32_t>{0} : table);
    dout = DeviceBuffer(size_t(batch * c.seqlen_q * c.heads_q * c.head_dim_v) * 2);
    dlse = DeviceBuffer(size_t(batch * c.heads_q * c.seqlen_q) * sizeof(float));

    args.size = sizeof(args);
    args.q = bshd(dq, c.dtype, batch, c.seqlen_q, c.heads_q, c.head_dim);
    args.out = bshd(dout, c.dtype, batch, c.seqlen_q, c.heads_q, c.head_dim_v);
    const int64_t n0 = c.page_size > 0 ? num_pages : batch, n1 = c.page_size > 0 ? c.page_size : c.capacity;
    args.k_cache = bshd(dcache, c.dtype, n0, n1, c.heads_kv, c.head_dim);
    args.v_cache = args.k_cache;  // the latent's first head_dim_v columns: a view, no copy
    args.v_cache.shape[3] = c.head_dim_v;
    if (c.page_size > 0) {
      args.block_table = static_cast<const int32_t*>(dtable.data());
      args.max_pages = pages_per_seq;
    }
    if (c.seqlen_new > 0) args.k_new = bshd(dnew, c.dtype, batch, c.seqlen_new, c.heads_kv, c.head_dim);
    args.lse = static_cast<float*>(dlse.data());
    args.cache_seqlens = static_cast<const int32_t*>(dlens.data());
    args.options.mask = c.mask;
  }

  void poison() {
    dout.fill_bytes(0xff);
    dlse.fill_bytes(0xff);
  }

  // Sequence b's latent rows as the call sees them: its cache rows, then its new tokens.
  std::vector<uint16_t> rows(const LatentCase& c, int64_t b) const {
    const int64_t row = c.heads_kv * c.head_dim, len = c.cache_lens[size_t(b)];
    std::vector<uint16_t> out(latent.begin() + b * c.capacity * row, latent.begin() + (b * c.capacity + len) * row);
    out.insert(out.end(), fresh.begin() + b * c.seqlen_new * row, fresh.begin() + (b + 1) * c.seqlen_new * row);
    return out;
  }
};

// Every sequence's out and lse, as the last call wrote them, against attention over its expanded latent.
void check_outputs(const LatentCase& c, const LatentBatch& kv, const std::string& label) {
  const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim, dv = c.head_dim_v, sq = c.seqlen_q;
  const std::vector<uint16_t> out = kv.dout.download_all<uint16_t>();
  const std::vector<float> lse = kv.dlse.download_all<float>();
  const flashgen::DType dtype = flashgen::from_c(c.dtype);
  const flashgen::DtypeTolerances& tol = flashgen::tolerances(dtype);
  for (int64_t b = 0; b < kv.batch; ++b) {
    const int64_t sk = c.cache_lens[size_t(b)] + c.seqlen_new;
    INFO(c.name << " " << label << ": sequence " << b << " of " << sk << " keys");
    std::vector<double> want_out(size_t(sq * hq * dv), 0.0), want_lse(size_t(hq * sq), -INFINITY);
    if (sk > 0) {
      const std::vector<uint16_t> k = kv.rows(c, b);
      std::vector<uint16_t> v;  // the expanded values: each row's first dv columns
      for (int64_t j = 0; j < sk * hkv; ++j) v.insert(v.end(), k.begin() + j * d, k.begin() + j * d + dv);
      flashgen::AttentionShape shape{1, sq, sk, hq, hkv, d};
      shape.head_dim_v = dv;
      const flashgen::AttentionResult ref = flashgen::attention_reference_f64(
          shape,
          flashgen::HostInput::bits16(kv.q.data() + b * sq * hq * d, dtype,
                                      flashgen::StridedView::contiguous(1, sq, hq, d)),
          flashgen::HostInput::bits16(k.data(), dtype, flashgen::StridedView::contiguous(1, sk, hkv, d)),
          flashgen::HostInput::bits16(v.data(), dtype, flashgen::StridedView::contiguous(1, sk, hkv, dv)),
          flashgen::effective_softmax_scale(0.f, d), flashgen::from_c(c.mask), flashgen::ReferenceVariant{});
      want_out = ref.out, want_lse = ref.lse;
    }
    std::vector<double> got_out(want_out.size()), got_lse(want_lse.size());
    for (size_t i = 0; i < got_out.size(); ++i) {
      got_out[i] = flashgen::dtype_bits_to_float(out[size_t(b * sq * hq * dv) + i], dtype);
    }
    for (size_t i = 0; i < got_lse.size(); ++i) got_lse[i] = lse[size_t(b * hq * sq) + i];
    const flashgen::CheckReport out_check = flashgen::check_elements("out", {sq, hq, dv}, got_out, want_out, tol.out);
    const flashgen::CheckReport lse_check = flashgen::check_elements("lse", {hq, sq}, got_lse, want_lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }
}

// The appended rows of every sequence's cache hold its new tokens' latent rows, and no other row changed.
void check_cache(const LatentCase& c, const LatentBatch& kv) {
  const int64_t row = c.heads_kv * c.head_dim;
  const std::vector<uint16_t> phys = kv.dcache.download_all<uint16_t>();
  for (int64_t b = 0; b < kv.batch; ++b) {
    const std::vector<uint16_t> want = kv.rows(c, b);
    for (int64_t j = 0; j < c.capacity; ++j) {
      int64_t at = b * c.capacity + j;
      if (c.page_size > 0) {
        at = int64_t(kv.table[size_t(b * kv.pages_per_seq + j / c.page_size)]) * c.page_size + j % c.page_size;
      }
      const bool appended = j >= c.cache_lens[size_t(b)] && j < c.cache_lens[size_t(b)] + c.seqlen_new;
      const uint16_t* expect = appended ? want.data() + j * row : kv.latent.data() + (b * c.capacity + j) * row;
      INFO(c.name << ": cache row " << j << " of sequence " << b);
      REQUIRE(std::equal(expect, expect + row, phys.begin() + at * row));
    }
  }
}

void check_cases(const std::vector<LatentCase>& cases, uint64_t seed) {
  for (const LatentCase& c : cases) {
    LatentBatch kv(c, seed + uint64_t(c.head_dim));
    for (int splits : c.splits) {
      kv.poison();
      kv.args.num_splits = splits;
      INFO(c.name << ", num_splits " << splits);
      REQUIRE(flashgen_attention_kvcache(&kv.args, nullptr) == FLASHGEN_SUCCESS);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      check_outputs(c, kv, "num_splits " + std::to_string(splits));
    }
    if (c.seqlen_new > 0) check_cache(c, kv);
  }
}

}  // namespace

TEST_CASE("Latent KV-cache attention (MLA decoding) matches float64 attention over the expanded latent",
          "[gpu][kvcache][latent]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  FLASHGEN_REQUIRE_SM90(scope);
  const std::vector<LatentCase> cases = {
      // DeepSeek's decode: 576/512, 128 heads, one token, pages of 64, an empty cache among long ones.
      {"bf16 576/512, 128 heads, paged 64", FLASHGEN_BFLOAT16, 576, 512, 128, 1, FLASHGEN_MASK_CAUSAL, 1,
       {1000, 0, 4095, 77}, 4096, 64, 0, {0, 1, 5, 33}},
      // Speculative decoding: 2 new tokens appended (k_new alone), 16 heads, contiguous, bottom-right causal.
      {"bf16 576/512, 16 heads, 2 tokens appended, contiguous", FLASHGEN_BFLOAT16, 576, 512, 16, 1,
       FLASHGEN_MASK_CAUSAL, 2, {300, 1, 129}, 512, 0, 2, {0, 1, 3}},
      // 128 heads x 4 tokens: four row blocks; pages of 48 (tiles span pages), top-left causal.
      {"bf16 576/512, 128 heads, 4 tokens, paged 48, top-left", FLASHGEN_BFLOAT16, 576, 512, 128, 1,
       FLASHGEN_MASK_CAUSAL_TOP_LEFT, 4, {200, 95}, 288, 48, 4, {0, 2}},
      // A small latent (keys 192, values 128), fp16, two kv heads, no mask, pages of 16.
      {"fp16 192/128, GQA 16 over 2 kv heads, 3 tokens, paged 16, no mask", FLASHGEN_FLOAT16, 192, 128, 32, 2,
       FLASHGEN_MASK_NONE, 3, {33, 500, 0}, 512, 16, 0, {0, 1, 4}},
      // Values of 256 beside keys of 320.
      {"bf16 320/256, 64 heads, contiguous", FLASHGEN_BFLOAT16, 320, 256, 64, 1, FLASHGEN_MASK_CAUSAL, 1,
       {2000, 63, 64}, 2048, 0, 0, {0, 1, 7}},
  };
  check_cases(cases, 0x1a7e);
}

// A sequence's rows do not depend on the batch around it at a fixed split count: the same sequence alone and
// beside others gives the same bits.
TEST_CASE("Latent KV-cache attention is batch invariant at a fixed split count", "[gpu][kvcache][latent]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  FLASHGEN_REQUIRE_SM90(scope);
  LatentCase pair{"bf16 576/512, 32 heads, paged 64", FLASHGEN_BFLOAT16, 576, 512, 32, 1, FLASHGEN_MASK_CAUSAL, 1,
                  {1500, 700}, 2048, 64, 0, {4}};
  LatentBatch both(pair, 7);
  both.args.num_splits = 4;
  both.poison();
  REQUIRE(flashgen_attention_kvcache(&both.args, nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> together = both.dout.download_all<uint16_t>();
  // The first sequence alone, through the same pages: a batch of one over the same block table row.
  LatentBatch alone(pair, 7);
  alone.args.q.shape[0] = 1, alone.args.out.shape[0] = 1;
  alone.poison();
  alone.args.num_splits = 4;
  REQUIRE(flashgen_attention_kvcache(&alone.args, nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> single = alone.dout.download_all<uint16_t>();
  const size_t per_sequence = size_t(pair.heads_q * pair.head_dim_v);
  CHECK(std::equal(single.begin(), single.begin() + per_sequence, together.begin()));
  check_outputs(pair, both, "num_splits 4");
}
