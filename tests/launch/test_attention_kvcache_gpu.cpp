// [gpu] tests of attention against a KV cache (decoding): every sequence's out and lse against its own
// float64 reference over its cache rows plus the appended tokens, contiguous and paged caches (several page
// sizes, a shuffled block table), 1-4 new tokens with and without append, GQA/MQA, causal alignments, head
// dims 64, 96, 128, 256 and 40, every split count the chooser may pick, a spread of tiles, warps and stages
// besides the built-in module, batch invariance at a fixed split, and sliding windows about each sequence's
// last key over caches shorter and much longer than the window, and a user's tree mask with a bias.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "launch/attention_kvcache.hpp"
#include "tuner/decode_choice.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/device_inputs.hpp"

namespace {

using flashgen::DeviceBuffer;

struct KvCase {
  std::string name;
  flashgen_dtype dtype = FLASHGEN_BFLOAT16;
  int64_t head_dim = 128;
  int64_t heads_q = 8, heads_kv = 2;
  flashgen_mask mask = FLASHGEN_MASK_CAUSAL;
  int64_t seqlen_q = 1;
  std::vector<int32_t> cache_lens;  // per sequence, before the new tokens
  int64_t capacity = 0;             // keys a sequence's cache holds
  int64_t page_size = 0;            // 0: a contiguous cache
  int64_t seqlen_new = 0;           // appended tokens (0: none)
  std::vector<int> splits = {0, 1, 3};
  int window_left = -1, window_right = -1;  // read under FLASHGEN_MASK_SLIDING_WINDOW only
  std::vector<float> sinks = {};            // options.sinks, one per query head; empty: none
  int chunk = 0;                            // options.attention_chunk (0: none)
  float softcap = 0.f;                      // options.softcap
  bool alibi = false;                       // ALiBi, slopes per sequence and query head (alibi_slopes())
  // A user variant (options.variant) with its scalars; its buffers are the sequences' cache lengths (KvBatch's
  // dlens) and then variant_floats on the device. user_reference(variant, b) sets the reference's functions for
  // sequence b.
  const flashgen_variant* variant = nullptr;
  std::vector<float> variant_floats = {};
  std::vector<uint32_t> variant_scalars = {};
  std::function<void(flashgen::ReferenceVariant&, int64_t)> user_reference = {};

  // [batch, heads_q] slopes: the standard ones, steeper for each later sequence.
  std::vector<float> alibi_slopes() const {
    std::vector<float> slopes;
    const std::vector<float> standard = flashgen::standard_alibi_slopes(heads_q);
    for (size_t b = 0; alibi && b < cache_lens.size(); ++b)
      for (float slope : standard) slopes.push_back(slope * (1.f + 0.5f * float(b)));
    return slopes;
  }
};

using flashgen::test::random_bits;

flashgen_tensor bshd(const DeviceBuffer& b, flashgen_dtype dtype, int64_t n0, int64_t n1, int64_t h, int64_t d) {
  return flashgen_tensor{b.data(), dtype, {n0, n1, h, d}, {n1 * h * d, h * d, d, 1}};
}

// A case's inputs: each sequence's logical cache rows (capacity of them) on the host, laid out on the device
// contiguously or in shuffled pages (with spare pages no sequence owns), the new tokens, and out and lse
// poisoned with NaN.
struct KvBatch {
  int64_t batch, pages_per_seq = 0, num_pages = 0;
  std::vector<uint16_t> q, k_logical, v_logical, k_new, v_new;  // k_logical: [batch, capacity, heads_kv, d]
  std::vector<int32_t> table;
  DeviceBuffer dq, dk, dv, dkn, dvn, dout, dlse, dlens, dtable, dsinks, dslopes, dfloats;
  const void* variant_buffers[2] = {};
  flashgen_kvcache_args args{};

  KvBatch(const KvCase& c, uint64_t seed) : batch(static_cast<int64_t>(c.cache_lens.size())) {
    const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim, row = hkv * d;
    std::mt19937_64 rng(seed);
    q = random_bits(size_t(batch * c.seqlen_q * hq * d), c.dtype, rng);
    k_logical = random_bits(size_t(batch * c.capacity * row), c.dtype, rng);
    v_logical = random_bits(size_t(batch * c.capacity * row), c.dtype, rng);
    k_new = random_bits(size_t(batch * std::max<int64_t>(c.seqlen_new, 1) * row), c.dtype, rng);
    v_new = random_bits(k_new.size(), c.dtype, rng);
    std::vector<uint16_t> k_phys = k_logical, v_phys = v_logical;
    if (c.page_size > 0) {
      pages_per_seq = c.capacity / c.page_size;
      num_pages = batch * pages_per_seq + 3;
      std::vector<int32_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      table.assign(order.begin(), order.begin() + batch * pages_per_seq);
      k_phys = random_bits(size_t(num_pages * c.page_size * row), c.dtype, rng);  // spare pages hold noise
      v_phys = random_bits(k_phys.size(), c.dtype, rng);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t j = 0; j < c.capacity; ++j) {
          const int64_t page = table[size_t(b * pages_per_seq + j / c.page_size)];
          const size_t src = size_t((b * c.capacity + j) * row), dst = size_t((page * c.page_size + j % c.page_size) * row);
          std::copy_n(k_logical.begin() + src, row, k_phys.begin() + dst);
          std::copy_n(v_logical.begin() + src, row, v_phys.begin() + dst);
        }
    }
    using flashgen::test::upload;
    dq = upload(q), dk = upload(k_phys), dv = upload(v_phys), dkn = upload(k_new), dvn = upload(v_new);
    dlens = upload(c.cache_lens);
    dtable = upload(table.empty() ? std::vector<int32_t>{0} : table);
    dout = DeviceBuffer(q.size() * 2), dlse = DeviceBuffer(size_t(batch * hq * c.seqlen_q) * sizeof(float));

    args.size = sizeof(args);
    args.q = bshd(dq, c.dtype, batch, c.seqlen_q, hq, d);
    args.out = bshd(dout, c.dtype, batch, c.seqlen_q, hq, d);
    if (c.page_size > 0) {
      args.k_cache = bshd(dk, c.dtype, num_pages, c.page_size, hkv, d);
      args.v_cache = bshd(dv, c.dtype, num_pages, c.page_size, hkv, d);
      args.block_table = static_cast<const int32_t*>(dtable.data());
      args.max_pages = pages_per_seq;
    } else {
      args.k_cache = bshd(dk, c.dtype, batch, c.capacity, hkv, d);
      args.v_cache = bshd(dv, c.dtype, batch, c.capacity, hkv, d);
    }
    if (c.seqlen_new > 0) {
      args.k_new = bshd(dkn, c.dtype, batch, c.seqlen_new, hkv, d);
      args.v_new = bshd(dvn, c.dtype, batch, c.seqlen_new, hkv, d);
    }
    args.lse = static_cast<float*>(dlse.data());
    args.cache_seqlens = static_cast<const int32_t*>(dlens.data());
    args.options.mask = c.mask;
    args.options.window_left = c.window_left, args.options.window_right = c.window_right;
    args.options.attention_chunk = c.chunk;
    args.options.softcap = c.softcap;
    if (c.alibi) {
      dslopes = upload(c.alibi_slopes());
      args.options.alibi_slopes = static_cast<const float*>(dslopes.data());
      args.options.alibi_batch_stride = c.heads_q;
    }
    if (!c.sinks.empty()) {
      dsinks = upload(c.sinks);
      args.options.sinks = static_cast<const float*>(dsinks.data());
    }
    if (c.variant != nullptr) {
      dfloats = upload(c.variant_floats.empty() ? std::vector<float>{0.f} : c.variant_floats);
      variant_buffers[0] = dlens.data(), variant_buffers[1] = dfloats.data();
      args.options.variant = c.variant;
      args.options.variant_buffers = variant_buffers;
      args.options.variant_scalars = c.variant_scalars.data();
    }
  }

  void poison() {
    dout.fill_bytes(0xff);
    dlse.fill_bytes(0xff);
  }

  // Sequence b's keys (or values) as the call sees them: its cache rows, then its new tokens.
  std::vector<uint16_t> keys(const KvCase& c, int64_t b, bool values) const {
    const int64_t row = c.heads_kv * c.head_dim, len = c.cache_lens[size_t(b)];
    const std::vector<uint16_t>& cache = values ? v_logical : k_logical;
    const std::vector<uint16_t>& fresh = values ? v_new : k_new;
    std::vector<uint16_t> out(cache.begin() + b * c.capacity * row, cache.begin() + (b * c.capacity + len) * row);
    out.insert(out.end(), fresh.begin() + b * c.seqlen_new * row, fresh.begin() + (b + 1) * c.seqlen_new * row);
    return out;
  }
};

// Every sequence's out and lse, as the last call wrote them, against its float64 reference.
void check_outputs(const KvCase& c, const KvBatch& kv, const std::string& label) {
  const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim, sq = c.seqlen_q;
  const std::vector<uint16_t> out = kv.dout.download_all<uint16_t>();
  const std::vector<float> lse = kv.dlse.download_all<float>();
  const double scale = flashgen::effective_softmax_scale(0.f, d);
  const flashgen::DType dtype = flashgen::from_c(c.dtype);
  const flashgen::DtypeTolerances& tol = flashgen::tolerances(dtype);
  for (int64_t b = 0; b < kv.batch; ++b) {
    const int64_t sk = c.cache_lens[size_t(b)] + c.seqlen_new;
    INFO(c.name << " " << label << ": sequence " << b << " of " << sk << " keys");
    std::vector<double> want_out(size_t(sq * hq * d), 0.0), want_lse(size_t(hq * sq), -INFINITY);
    if (sk == 0 && !c.sinks.empty()) {  // no key: the softmax is the sink's alone
      for (int64_t h = 0; h < hq; ++h) std::fill_n(want_lse.begin() + h * sq, sq, double(c.sinks[size_t(h)]));
    }
    if (sk > 0) {
      const std::vector<uint16_t> k = kv.keys(c, b, false), v = kv.keys(c, b, true);
      const flashgen::AttentionShape shape{1, sq, sk, hq, hkv, d};
      const auto q_view = flashgen::StridedView::contiguous(1, sq, hq, d);
      const auto kv_view = flashgen::StridedView::contiguous(1, sk, hkv, d);
      std::vector<float> slopes = c.alibi_slopes();  // this sequence's row
      if (c.alibi) slopes = std::vector<float>(slopes.begin() + b * hq, slopes.begin() + (b + 1) * hq);
      flashgen::ReferenceVariant variant(c.softcap, flashgen::ReferenceWindow{c.window_left, c.window_right, c.chunk},
                                         std::move(slopes));
      variant.sinks = c.sinks;
      if (c.user_reference) c.user_reference(variant, b);
      const flashgen::AttentionResult ref = flashgen::attention_reference_f64(
          shape, flashgen::HostInput::bits16(kv.q.data() + b * sq * hq * d, dtype, q_view),
          flashgen::HostInput::bits16(k.data(), dtype, kv_view), flashgen::HostInput::bits16(v.data(), dtype, kv_view),
          scale, flashgen::from_c(c.mask), variant);
      want_out = ref.out, want_lse = ref.lse;
    }
    std::vector<double> got_out(want_out.size()), got_lse(want_lse.size());
    for (size_t i = 0; i < got_out.size(); ++i) {
      got_out[i] = flashgen::dtype_bits_to_float(out[size_t(b * sq * hq * d) + i], dtype);
    }
    for (size_t i = 0; i < got_lse.size(); ++i) got_lse[i] = lse[size_t(b * hq * sq) + i];
    const flashgen::CheckReport out_check = flashgen::check_elements("out", {sq, hq, d}, got_out, want_out, tol.out);
    const flashgen::CheckReport lse_check = flashgen::check_elements("lse", {hq, sq}, got_lse, want_lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }
}

// The appended rows of every sequence's cache hold its new tokens, and no other row changed.
void check_cache(const KvCase& c, const KvBatch& kv) {
  const int64_t row = c.heads_kv * c.head_dim;
  for (bool values : {false, true}) {
    const std::vector<uint16_t> phys = (values ? kv.dv : kv.dk).download_all<uint16_t>();
    for (int64_t b = 0; b < kv.batch; ++b) {
      const std::vector<uint16_t> want = kv.keys(c, b, values);
      const std::vector<uint16_t>& logical = values ? kv.v_logical : kv.k_logical;
      for (int64_t j = 0; j < c.capacity; ++j) {
        int64_t at = b * c.capacity + j;
        if (c.page_size > 0) {
          at = int64_t(kv.table[size_t(b * kv.pages_per_seq + j / c.page_size)]) * c.page_size + j % c.page_size;
        }
        const bool appended = j >= c.cache_lens[size_t(b)] && j < c.cache_lens[size_t(b)] + c.seqlen_new;
        const uint16_t* expect = appended ? want.data() + j * row : logical.data() + (b * c.capacity + j) * row;
        INFO(c.name << ": " << (values ? "v" : "k") << "_cache row " << j << " of sequence " << b);
        REQUIRE(std::equal(expect, expect + row, phys.begin() + at * row));
      }
    }
  }
}

// Contiguous and paged caches (page sizes 16, 48, 256), 1-4 new tokens with and without append, GQA/MQA/MHA,
// both causal alignments and no mask, head dims 40, 64, 96, 128 and 256.
std::vector<KvCase> kv_cases() {
  return {
      {"bf16 d128 GQA 4 contiguous, one token", FLASHGEN_BFLOAT16, 128, 8, 2, FLASHGEN_MASK_CAUSAL, 1,
       {0, 1, 77, 1000, 513}, 1024, 0, 0, {0, 1, 2, 3, 7, 16}},
      {"fp16 d64 MQA paged 16, append 3", FLASHGEN_FLOAT16, 64, 8, 1, FLASHGEN_MASK_CAUSAL, 3, {5, 0, 300, 61}, 320, 16,
       3, {0, 1, 4}},
      {"bf16 d128 GQA 8 paged 256, append 1", FLASHGEN_BFLOAT16, 128, 32, 4, FLASHGEN_MASK_CAUSAL, 1,
       {700, 1, 255, 0}, 768, 256, 1, {0, 1, 5}},
      {"bf16 d96 MHA paged 48, 4 tokens append 4 top-left", FLASHGEN_BFLOAT16, 96, 2, 2,
       FLASHGEN_MASK_CAUSAL_TOP_LEFT, 4, {100, 3, 40}, 144, 48, 4, {0, 2}},
      {"fp16 d256 GQA 2 contiguous, 2 tokens no mask", FLASHGEN_FLOAT16, 256, 4, 2, FLASHGEN_MASK_NONE, 2,
       {129, 2, 64}, 200, 0, 0, {0, 1, 3}},
      {"bf16 d40 GQA 3 contiguous append 2", FLASHGEN_BFLOAT16, 40, 6, 2, FLASHGEN_MASK_CAUSAL, 2, {31, 0, 90}, 96,
       0, 2, {0, 1, 2}},
      // More key ranges than a warp has lanes (the combine kernel takes them 32 at a time), some of them empty.
      {"bf16 d64 GQA 4 paged 16, 33 and 48 ranges", FLASHGEN_BFLOAT16, 64, 8, 2, FLASHGEN_MASK_CAUSAL, 1,
       {3000, 0, 1500, 3071}, 3072, 16, 0, {33, 48}},
  };
}

// Sliding windows about each sequence's last key: caches shorter than the window and much longer (5, 300 and
// 2000 keys), causal-shaped and two-sided, a window that leaves the first new rows of a short cache no key, GQA 4,
// contiguous and paged (16) caches, 1 and 4 new tokens, once appended.
std::vector<KvCase> window_cases() {
  KvCase causal{"bf16 d128 GQA 4 contiguous, one token, window (256, 0)", FLASHGEN_BFLOAT16, 128, 8, 2,
                FLASHGEN_MASK_SLIDING_WINDOW, 1, {5, 300, 2000}, 2048, 0, 0, {0, 1, 4}};
  causal.window_left = 256, causal.window_right = 0;
  KvCase two_sided{"fp16 d64 GQA 4 paged 16, 4 tokens append 4, window (100, 20)", FLASHGEN_FLOAT16, 64, 8, 2,
                   FLASHGEN_MASK_SLIDING_WINDOW, 4, {5, 300, 2000}, 2016, 16, 4, {0, 1, 4}};
  two_sided.window_left = 100, two_sided.window_right = 20;
  // 2 keys for 4 new rows: rows 0 and 1 sit before the first key, and a window (1, 0) shows them none.
  KvCase empty_rows{"bf16 d128 GQA 4 contiguous, 4 tokens, window (1, 0)", FLASHGEN_BFLOAT16, 128, 8, 2,
                    FLASHGEN_MASK_SLIDING_WINDOW, 4, {2, 0, 700}, 704, 0, 0, {0, 3}};
  empty_rows.window_left = 1, empty_rows.window_right = 0;
  return {causal, two_sided, empty_rows};
}

// Each case's every split count: out and lse against each sequence's float64 reference, and the appended rows.
void check_cases(const std::vector<KvCase>& cases, uint64_t seed) {
  for (const KvCase& c : cases) {
    KvBatch kv(c, seed + c.head_dim);
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

TEST_CASE("KV-cache attention matches each sequence's float64 reference", "[gpu][kvcache]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  check_cases(kv_cases(), 0xdec0de);
}

TEST_CASE("KV-cache attention with sinks matches each sequence's float64 reference, at every split count",
          "[gpu][kvcache][sinks]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  // Sinks below, about and above the rows' LSE (near 7 over a thousand keys), a head without one (-inf): the
  // decode kernel adds them with one range, the combine kernel with several; an empty cache (lse = the sink) and,
  // under a window, rows of no key.
  const float none = -INFINITY;
  KvCase decode = kv_cases().front();
  decode.name += ", sinks";
  decode.sinks = {7.f, none, 2.f, 10.f, 6.f, 7.5f, 4.f, 8.f};
  KvCase windowed = window_cases().back();
  windowed.name += ", sinks";
  windowed.sinks = {3.f, 1.f, none, 6.f, 2.5f, 0.f, 4.f, 5.f};
  check_cases({decode, windowed}, 0x51d);
}

// Speculative decoding's tree of draft tokens as a user's mask: 4 new tokens (appended to the cache) where token 2
// follows token 0 on another branch than token 1, so it does not see token 1; its bitmask a scalar, each sequence's
// cache length a buffer (the new tokens' first position). A per-head bias scaled by a key's position as a score_bias
// (GQA packs several query heads in one tile: each row's own head).
TEST_CASE("KV-cache attention with a user's tree mask and bias matches each sequence's float64 reference",
          "[gpu][kvcache][user_variant]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const flashgen_variant_arg buffers[] = {{"lens", FLASHGEN_ARG_INT32}, {"bias", FLASHGEN_ARG_FLOAT32}};
  const flashgen_variant_arg scalars[] = {{"tree", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "const int draft = kv_idx - lens[batch];  // which new token the key is, if any\n"
                  "return draft < 0 || (draft < 4 && ((tree >> (4 * q_idx + draft)) & 1));";
  desc.score_bias = "return bias[head] * float(kv_idx % 5);";
  desc.buffers = buffers, desc.num_buffers = 2;
  desc.scalars = scalars, desc.num_scalars = 1;
  flashgen_variant* variant = nullptr;
  REQUIRE(flashgen_variant_create(&desc, &variant) == FLASHGEN_SUCCESS);
  // Row q's bits over the 4 drafts: 0 sees 0; 1 sees 0, 1; 2 sees 0, 2; 3 sees 0, 1, 3.
  const uint32_t tree = 0x1u | (0x3u << 4) | (0x5u << 8) | (0xbu << 12);
  auto with_tree = [&](KvCase c) {
    c.name += ", a user's tree mask and bias";
    c.variant = variant;
    c.variant_floats = {0.3f, -0.2f, 0.1f, 0.5f, -0.4f, 0.25f, 0.f, 0.15f};
    c.variant_scalars = {tree};
    const std::vector<int32_t> lens = c.cache_lens;
    const std::vector<float> bias = c.variant_floats;
    c.user_reference = [lens, bias, tree](flashgen::ReferenceVariant& v, int64_t b) {
      const int64_t first = lens[size_t(b)];
      v.user_mask = [first, tree](int64_t, int64_t, int64_t i, int64_t j) {
        return j < first || ((tree >> (4 * i + (j - first))) & 1u) != 0;
      };
      v.user_score = [bias](double s, int64_t, int64_t h, int64_t, int64_t j) {
        return s + double(bias[size_t(h)]) * double(j % 5);
      };
    };
    return c;
  };
  KvCase contiguous{"bf16 d128 GQA 4 contiguous, 4 tokens append 4", FLASHGEN_BFLOAT16, 128, 8, 2,
                    FLASHGEN_MASK_CAUSAL, 4, {0, 37, 700}, 768, 0, 4, {0, 1, 3}};
  KvCase paged{"fp16 d64 GQA 4 paged 16, 4 tokens append 4", FLASHGEN_FLOAT16, 64, 8, 2, FLASHGEN_MASK_CAUSAL, 4,
               {300, 5, 0}, 320, 16, 4, {0, 1, 4}};
  check_cases({with_tree(contiguous), with_tree(paged)}, 0x7ee);
  flashgen_variant_destroy(variant);
}

TEST_CASE("KV-cache attention with a soft cap and ALiBi matches each sequence's float64 reference",
          "[gpu][kvcache][softcap][alibi]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  // Gemma 2's decode (a soft cap under the causal mask, a window on top), BLOOM's (ALiBi per sequence about each
  // sequence's last key), both with the cap under the bias; every split count the tuner may pick, paged and not.
  KvCase capped{"bf16 d128 GQA 4 contiguous, one token, softcap 5", FLASHGEN_BFLOAT16, 128, 8, 2,
                FLASHGEN_MASK_CAUSAL, 1, {0, 1, 77, 1000, 513}, 1024, 0, 0, {0, 1, 3, 7}};
  capped.softcap = 5.f;
  KvCase windowed{"fp16 d64 GQA 4 paged 16, 4 tokens append 4, window (100, 0), softcap 2", FLASHGEN_FLOAT16, 64, 8,
                  2, FLASHGEN_MASK_SLIDING_WINDOW, 4, {5, 300, 2000}, 2016, 16, 4, {0, 1, 4}};
  windowed.window_left = 100, windowed.window_right = 0, windowed.softcap = 2.f;
  KvCase biased{"bf16 d128 MQA paged 64, 2 tokens append 2, ALiBi", FLASHGEN_BFLOAT16, 128, 8, 1, FLASHGEN_MASK_CAUSAL,
                2, {62, 0, 700}, 768, 64, 2, {0, 1, 5}};
  biased.alibi = true;
  KvCase both{"fp16 d96 MHA contiguous, 3 tokens, no mask, ALiBi and softcap 3", FLASHGEN_FLOAT16, 96, 4, 4,
              FLASHGEN_MASK_NONE, 3, {129, 2, 64}, 200, 0, 0, {0, 1, 3}};
  both.alibi = true, both.softcap = 3.f;
  check_cases({capped, windowed, biased, both}, 0x5ca1);
}

TEST_CASE("chunked KV-cache attention matches each sequence's float64 reference, at every split count",
          "[gpu][kvcache][chunk]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  // Llama 4's chunked causal decode: the new rows see the keys of their own chunk only. Caches ending just inside
  // a chunk, across one (4 new rows: the first in one chunk, the last in the next) and empty.
  KvCase decode{"bf16 d128 GQA 4 contiguous, one token, chunks of 512", FLASHGEN_BFLOAT16, 128, 8, 2,
                FLASHGEN_MASK_CAUSAL, 1, {5, 512, 1500, 0}, 2048, 0, 0, {0, 1, 4}};
  decode.chunk = 512;
  KvCase across{"fp16 d64 GQA 4 paged 16, 4 tokens append 4, chunks of 100", FLASHGEN_FLOAT16, 64, 8, 2,
                FLASHGEN_MASK_CAUSAL, 4, {98, 300, 2000}, 2016, 16, 4, {0, 1, 3}};
  across.chunk = 100;
  check_cases({decode, across}, 0xc4a);
}

TEST_CASE("KV-cache attention within a sliding window matches each sequence's float64 reference",
          "[gpu][kvcache][window]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  check_cases(window_cases(), 0x3d0e);

  // A window of 257 keys touches at most 5 blocks of the built-in module's 64: a request for 64 ranges is
  // capped there, in the workspace the library asks for and in the call that uses it.
  const KvCase c = window_cases().front();
  KvBatch kv(c, 0x3d0f);
  kv.args.num_splits = 64;
  const flashgen::KvCacheCall call = flashgen::make_kvcache_call(kv.args);
  const flashgen::DecodeConfig builtin = flashgen::heuristic_decode_choice(call.problem, 80, 132).config;
  REQUIRE(builtin.block_n == 64);
  size_t bytes = 0;
  REQUIRE(flashgen_attention_kvcache_workspace_size(&kv.args, nullptr, &bytes) == FLASHGEN_SUCCESS);
  CHECK(bytes == flashgen::kvcache_workspace_bytes(call, builtin, 5));
  DeviceBuffer workspace(bytes);
  kv.args.workspace = workspace.data();
  kv.args.workspace_bytes = bytes;
  kv.poison();
  REQUIRE(flashgen_attention_kvcache(&kv.args, nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  check_outputs(c, kv, "64 ranges asked for, 5 used");
}

TEST_CASE("KV-cache attention on a spread of modules besides the built-in one", "[gpu][kvcache]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  using flashgen::DecodeConfig;
  for (const KvCase& c : kv_cases()) {
    KvBatch kv(c, 0xfa3117 + c.head_dim);
    const flashgen::KvCacheCall call = flashgen::make_kvcache_call(kv.args);
    // The tuner may pick any module of its space: wider, narrower and deeper tiles than the built-in's, with
    // one to eight warps splitting them.
    const DecodeConfig builtin = flashgen::heuristic_decode_choice(call.problem, arch, 132).config;
    for (auto [block_n, warps, stages] : {std::tuple{128, 8, 3}, std::tuple{32, 2, 2}, std::tuple{16, 1, 8}}) {
      DecodeConfig config = builtin;
      config.block_n = block_n, config.warps = warps, config.stages = stages;
      if (const auto why = config.invalid_reason(arch)) {
        // Only the widest tiles at the largest head_dim outgrow shared memory.
        INFO(config.name() << ": " << *why);
        CHECK((c.head_dim == 256 && block_n == 128));
        continue;
      }
      for (int splits : {1, 3}) {
        kv.poison();
        INFO(c.name << ", " << config.name() << ", " << splits << " ranges");
        const flashgen::PreparedKvCache prepared = flashgen::prepare_kvcache(call, nullptr, config, splits);
        flashgen::launch_prepared_kvcache(prepared, call, nullptr, static_cast<int>(scope.device()));
        FLASHGEN_CU_CHECK(cuCtxSynchronize());
        check_outputs(c, kv, config.name() + " x" + std::to_string(splits));
      }
    }
  }
}

TEST_CASE("KV-cache attention: a request's output is bitwise the same alone and in a batch at fixed splits",
          "[gpu][kvcache]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  KvCase c{"bf16 d128 GQA 4 paged 64", FLASHGEN_BFLOAT16, 128, 8, 2, FLASHGEN_MASK_CAUSAL, 1, {900, 17, 400, 1023},
           1024, 64, 0, {}};
  KvBatch kv(c, 0x1a7e);
  for (int splits : {1, 4}) {
    kv.args.num_splits = splits;
    kv.poison();
    REQUIRE(flashgen_attention_kvcache(&kv.args, nullptr) == FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    const std::vector<uint16_t> batched = kv.dout.download_all<uint16_t>();
    // The same first request alone: batch 1 over the same pages.
    flashgen_kvcache_args alone = kv.args;
    alone.q.shape[0] = alone.out.shape[0] = 1;
    kv.poison();
    REQUIRE(flashgen_attention_kvcache(&alone, nullptr) == FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    const std::vector<uint16_t> single = kv.dout.download_all<uint16_t>();
    const size_t row = size_t(c.heads_q * c.head_dim);
    INFO("num_splits " << splits);
    CHECK(std::equal(single.begin(), single.begin() + row, batched.begin()));
  }
}

TEST_CASE("KV-cache attention uses the caller's workspace and reports what it needs", "[gpu][kvcache]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  KvCase c{"fp16 d64 contiguous", FLASHGEN_FLOAT16, 64, 4, 4, FLASHGEN_MASK_CAUSAL, 1, {500, 20}, 512, 0, 0, {}};
  KvBatch kv(c, 0x3a3a);
  kv.args.num_splits = 5;
  size_t bytes = 0;
  REQUIRE(flashgen_attention_kvcache_workspace_size(&kv.args, nullptr, &bytes) == FLASHGEN_SUCCESS);
  CHECK(bytes >= size_t(5 * 2 * 4 * 1 * (64 + 1) * 4));
  DeviceBuffer workspace(bytes);
  kv.args.workspace = workspace.data();
  kv.args.workspace_bytes = bytes - 1;
  CHECK(flashgen_attention_kvcache(&kv.args, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(flashgen_last_error()).find("workspace") != std::string::npos);
  kv.args.workspace_bytes = bytes;
  kv.poison();
  REQUIRE(flashgen_attention_kvcache(&kv.args, nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  check_outputs(c, kv, "caller's workspace");

  // Another call of the same problem class on other tensors: the kept launch, pointed at them.
  KvBatch other(c, 0x4b4b);
  other.args.num_splits = 5;
  other.args.workspace = workspace.data();
  other.args.workspace_bytes = bytes;
  other.poison();
  REQUIRE(flashgen_attention_kvcache(&other.args, nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  check_outputs(c, other, "a warm call on other tensors");
}
