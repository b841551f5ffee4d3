// [gpu] tests of decoding against an FP8 KV cache (e4m3 and e5m2): every sequence's out and lse against its float64
// reference over the dequantized cache (each code times its scale) and the appended tokens as the cache holds them
// (rounded to FP8 after division by their scale); contiguous and paged caches, per-tensor, per-kv-head and
// per-(sequence, kv head) scales and none, codes up to ±448, GQA/MQA, both causal alignments, a window with a soft
// cap and sinks, head dims 64, 128 and 256, every split count given; the appended rows read back bit for bit.
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
using flashgen::DType;

enum class Scales { kNone, kTensor, kHead, kSequenceHead };

struct Fp8Case {
  std::string name;
  flashgen_dtype dtype = FLASHGEN_BFLOAT16;       // q's, the new tokens' and out's
  flashgen_dtype cache = FLASHGEN_FLOAT8_E4M3;    // the cache's
  int64_t head_dim = 128, heads_q = 8, heads_kv = 2;
  flashgen_mask mask = FLASHGEN_MASK_CAUSAL;
  int64_t seqlen_q = 1;
  std::vector<int32_t> cache_lens;
  int64_t capacity = 0, page_size = 0, seqlen_new = 0;
  std::vector<int> splits = {0, 1, 3};
  Scales scales = Scales::kHead;
  float scale_factor = 1.f;  // every scale times this: large ones (past 256) meet the widening's 2^120 in fp32
  float code_width = 150.f;  // the codes' spread: about 150 reaches ±448; about 0.01 keeps them subnormal
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  std::vector<float> sinks = {};
};

flashgen_tensor bshd(const DeviceBuffer& b, flashgen_dtype dtype, int64_t n0, int64_t n1, int64_t h, int64_t d) {
  return flashgen_tensor{b.data(), dtype, {n0, n1, h, d}, {n1 * h * d, h * d, d, 1}};
}

struct Fp8Batch {
  const Fp8Case& c;
  int64_t batch, row, pages_per_seq = 0;
  DType q_type, cache_type;
  std::vector<uint16_t> q, k_new, v_new;
  std::vector<uint8_t> k_logical, v_logical;  // [batch, capacity, heads_kv, d] codes
  std::vector<float> k_scales, v_scales;      // [batch, heads_kv]: each (sequence, kv head)'s
  std::vector<int32_t> table;
  DeviceBuffer dq, dk, dv, dkn, dvn, dout, dlse, dlens, dtable, dks, dvs, dsinks;
  flashgen_kvcache_args args{};

  Fp8Batch(const Fp8Case& fp8_case, uint64_t seed)
      : c(fp8_case), batch(int64_t(c.cache_lens.size())), row(c.heads_kv * c.head_dim),
        q_type(flashgen::from_c(c.dtype)), cache_type(flashgen::from_c(c.cache)) {
    std::mt19937_64 rng(seed);
    using flashgen::test::random_bits;
    q = random_bits(size_t(batch * c.seqlen_q * c.heads_q * c.head_dim), c.dtype, rng);
    k_new = random_bits(size_t(batch * std::max<int64_t>(c.seqlen_new, 1) * row), c.dtype, rng);
    v_new = random_bits(k_new.size(), c.dtype, rng);
    // Codes of values about 150 wide: the largest saturate at ±448 in e4m3.
    std::normal_distribution<float> normal(0.f, c.code_width);
    auto codes = [&](size_t n) {
      std::vector<uint8_t> out(n);
      for (uint8_t& b : out) b = flashgen::float_to_fp8_bits(normal(rng), cache_type);
      return out;
    };
    k_logical = codes(size_t(batch * c.capacity * row));
    v_logical = codes(k_logical.size());
    // Scales that bring the keys and values to about 1, different for every (sequence, kv head).
    for (int64_t i = 0; i < batch * c.heads_kv; ++i) {
      const int64_t at = c.scales == Scales::kTensor ? 0 : c.scales == Scales::kHead ? i % c.heads_kv : i;
      k_scales.push_back(c.scales == Scales::kNone ? 1.f : 0.006f * (1.f + 0.125f * float(at)) * c.scale_factor);
      v_scales.push_back(c.scales == Scales::kNone ? 1.f : 0.008f / (1.f + 0.25f * float(at)) * c.scale_factor);
    }
    std::vector<uint8_t> k_phys = k_logical, v_phys = v_logical;
    int64_t num_pages = 0;
    if (c.page_size > 0) {
      pages_per_seq = c.capacity / c.page_size;
      num_pages = batch * pages_per_seq + 3;
      std::vector<int32_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      table.assign(order.begin(), order.begin() + batch * pages_per_seq);
      k_phys = codes(size_t(num_pages * c.page_size * row));  // spare pages hold noise
      v_phys = codes(k_phys.size());
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t j = 0; j < c.capacity; ++j) {
          const size_t src = size_t((b * c.capacity + j) * row), dst = size_t(physical_row(b, j) * row);
          std::copy_n(k_logical.begin() + src, row, k_phys.begin() + dst);
          std::copy_n(v_logical.begin() + src, row, v_phys.begin() + dst);
        }
    }
    using flashgen::test::upload;
    dq = upload(q), dk = upload(k_phys), dv = upload(v_phys), dkn = upload(k_new), dvn = upload(v_new);
    dlens = upload(c.cache_lens);
    dtable = upload(table.empty() ? std::vector<int32_t>{0} : table);
    dks = upload(k_scales), dvs = upload(v_scales);
    dout = DeviceBuffer(q.size() * 2), dlse = DeviceBuffer(size_t(batch * c.heads_q * c.seqlen_q) * sizeof(float));

    args.size = sizeof(args);
    args.q = bshd(dq, c.dtype, batch, c.seqlen_q, c.heads_q, c.head_dim);
    args.out = bshd(dout, c.dtype, batch, c.seqlen_q, c.heads_q, c.head_dim);
    const int64_t n0 = c.page_size > 0 ? num_pages : batch, n1 = c.page_size > 0 ? c.page_size : c.capacity;
    args.k_cache = bshd(dk, c.cache, n0, n1, c.heads_kv, c.head_dim);
    args.v_cache = bshd(dv, c.cache, n0, n1, c.heads_kv, c.head_dim);
    if (c.page_size > 0) {
      args.block_table = static_cast<const int32_t*>(dtable.data());
      args.max_pages = pages_per_seq;
    }
    if (c.seqlen_new > 0) {
      args.k_new = bshd(dkn, c.dtype, batch, c.seqlen_new, c.heads_kv, c.head_dim);
      args.v_new = bshd(dvn, c.dtype, batch, c.seqlen_new, c.heads_kv, c.head_dim);
    }
    args.lse = static_cast<float*>(dlse.data());
    args.cache_seqlens = static_cast<const int32_t*>(dlens.data());
    args.options.mask = c.mask;
    args.options.window_left = c.window_left, args.options.window_right = c.window_right;
    args.options.softcap = c.softcap;
    if (!c.sinks.empty()) {
      dsinks = upload(c.sinks);
      args.options.sinks = static_cast<const float*>(dsinks.data());
    }
    if (c.scales != Scales::kNone) {
      args.k_scale = static_cast<const float*>(dks.data());
      args.v_scale = static_cast<const float*>(dvs.data());
      // The device arrays hold every (sequence, head); strides 0 read the shared entries.
      const int64_t batch_stride = c.scales == Scales::kSequenceHead ? c.heads_kv : 0;
      const int64_t head_stride = c.scales == Scales::kTensor ? 0 : 1;
      args.k_scale_stride[0] = args.v_scale_stride[0] = batch_stride;
      args.k_scale_stride[1] = args.v_scale_stride[1] = head_stride;
    }
  }

  int64_t physical_row(int64_t b, int64_t j) const {
    if (c.page_size == 0) return b * c.capacity + j;
    return int64_t(table[size_t(b * pages_per_seq + j / c.page_size)]) * c.page_size + j % c.page_size;
  }

  // Sequence b's cache codes as the call leaves them: its rows, then its new tokens rounded with their scales.
  std::vector<uint8_t> codes(int64_t b, bool values) const {
    const int64_t len = c.cache_lens[size_t(b)];
    const std::vector<uint8_t>& cache = values ? v_logical : k_logical;
    const std::vector<uint16_t>& fresh = values ? v_new : k_new;
    const std::vector<float>& scales = values ? v_scales : k_scales;
    std::vector<uint8_t> out(cache.begin() + b * c.capacity * row, cache.begin() + (b * c.capacity + len) * row);
    for (int64_t i = 0; i < c.seqlen_new * row; ++i) {
      const float x = flashgen::dtype_bits_to_float(fresh[size_t(b * c.seqlen_new * row + i)], q_type);
      out.push_back(flashgen::float_to_fp8_bits(x / scales[size_t(b * c.heads_kv + i % row / c.head_dim)],
                                                cache_type));
    }
    return out;
  }

  // Those codes times their scales: the keys (or values) the attention stands for.
  std::vector<double> dequantized(int64_t b, bool values) const {
    const std::vector<uint8_t> bits = codes(b, values);
    const std::vector<float>& scales = values ? v_scales : k_scales;
    std::vector<double> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      out[i] = flashgen::fp8_bits_to_double(bits[i], cache_type) *
               double(scales[size_t(b * c.heads_kv) + i % size_t(row) / size_t(c.head_dim)]);
    }
    return out;
  }
};

void check_outputs(const Fp8Batch& kv, const std::string& label) {
  const Fp8Case& c = kv.c;
  const int64_t hq = c.heads_q, d = c.head_dim, sq = c.seqlen_q;
  const std::vector<uint16_t> out = kv.dout.download_all<uint16_t>();
  const std::vector<float> lse = kv.dlse.download_all<float>();
  const flashgen::DtypeTolerances& tol = flashgen::tolerances(kv.q_type);
  for (int64_t b = 0; b < kv.batch; ++b) {
    const int64_t sk = c.cache_lens[size_t(b)] + c.seqlen_new;
    INFO(c.name << " " << label << ": sequence " << b << " of " << sk << " keys");
    const std::vector<double> k = kv.dequantized(b, false), v = kv.dequantized(b, true);
    const flashgen::AttentionShape shape{1, sq, std::max<int64_t>(sk, 1), hq, c.heads_kv, d};
    std::vector<double> want_out(size_t(sq * hq * d), 0.0), want_lse(size_t(hq * sq), -INFINITY);
    if (sk > 0) {
      flashgen::ReferenceVariant variant(c.softcap, flashgen::ReferenceWindow{c.window_left, c.window_right, 0});
      variant.sinks = c.sinks;
      const flashgen::AttentionResult ref = flashgen::attention_reference_f64(
          shape,
          flashgen::HostInput::bits16(kv.q.data() + b * sq * hq * d, kv.q_type,
                                      flashgen::StridedView::contiguous(1, sq, hq, d)),
          flashgen::HostInput::float64(k.data(), flashgen::StridedView::contiguous(1, sk, c.heads_kv, d)),
          flashgen::HostInput::float64(v.data(), flashgen::StridedView::contiguous(1, sk, c.heads_kv, d)),
          flashgen::effective_softmax_scale(0.f, d), flashgen::from_c(c.mask), variant);
      want_out = ref.out, want_lse = ref.lse;
    } else if (!c.sinks.empty()) {
      for (int64_t h = 0; h < hq; ++h) std::fill_n(want_lse.begin() + h * sq, sq, double(c.sinks[size_t(h)]));
    }
    std::vector<double> got_out(want_out.size()), got_lse(want_lse.size());
    for (size_t i = 0; i < got_out.size(); ++i) {
      got_out[i] = flashgen::dtype_bits_to_float(out[size_t(b * sq * hq * d) + i], kv.q_type);
    }
    for (size_t i = 0; i < got_lse.size(); ++i) got_lse[i] = lse[size_t(b * hq * sq) + i];
    const flashgen::CheckReport out_check = flashgen::check_elements("out", {sq, hq, d}, got_out, want_out, tol.out);
    const flashgen::CheckReport lse_check = flashgen::check_elements("lse", {hq, sq}, got_lse, want_lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }
}

// The appended rows hold the new tokens' codes bit for bit, and every other row of the cache is as it was.
void check_cache(const Fp8Batch& kv) {
  const Fp8Case& c = kv.c;
  for (bool values : {false, true}) {
    const std::vector<uint8_t> phys = (values ? kv.dv : kv.dk).download_all<uint8_t>();
    for (int64_t b = 0; b < kv.batch; ++b) {
      const std::vector<uint8_t> want = kv.codes(b, values);
      const std::vector<uint8_t>& logical = values ? kv.v_logical : kv.k_logical;
      for (int64_t j = 0; j < c.capacity; ++j) {
        const bool appended = j >= c.cache_lens[size_t(b)] && j < c.cache_lens[size_t(b)] + c.seqlen_new;
        const uint8_t* expect = appended ? want.data() + j * kv.row : logical.data() + (b * c.capacity + j) * kv.row;
        INFO(c.name << ": " << (values ? "v" : "k") << "_cache row " << j << " of sequence " << b);
        REQUIRE(std::equal(expect, expect + kv.row, phys.begin() + kv.physical_row(b, j) * kv.row));
      }
    }
  }
}

std::vector<Fp8Case> fp8_cases() {
  Fp8Case windowed{"fp16 e4m3 d128 GQA 4 paged 16, 2 tokens append 2, window (100, 0), soft cap 20, sinks",
                   FLASHGEN_FLOAT16, FLASHGEN_FLOAT8_E4M3, 128, 8, 2, FLASHGEN_MASK_SLIDING_WINDOW, 2,
                   {5, 300, 0, 2000}, 2048, 16, 2, {0, 1, 4}, Scales::kSequenceHead};
  windowed.window_left = 100, windowed.window_right = 0, windowed.softcap = 20.f;
  windowed.sinks = {3.f, 1.f, -INFINITY, 6.f, 2.5f, 0.f, 4.f, 5.f};
  // Codes of e4m3's subnormal range (about 0.01) with scales of about 1000: for bf16 queries the widened values are
  // bf16 subnormals, the products below fp32's normal range, and the scales past what 2^120 can be multiplied by.
  Fp8Case large{"bf16 e4m3 d64 GQA 2 contiguous, append 1, subnormal codes, scales of about 1000",
                FLASHGEN_BFLOAT16, FLASHGEN_FLOAT8_E4M3, 64, 4, 2, FLASHGEN_MASK_CAUSAL, 1, {40, 0}, 64, 0, 1, {0, 2},
                Scales::kHead};
  large.scale_factor = 1.6e5f, large.code_width = 0.01f;
  return {
      {"bf16 e4m3 d128 GQA 4 contiguous, one token, per-head scales", FLASHGEN_BFLOAT16, FLASHGEN_FLOAT8_E4M3, 128, 8,
       2, FLASHGEN_MASK_CAUSAL, 1, {0, 1, 77, 1000, 513}, 1024, 0, 0, {0, 1, 2, 7, 16}, Scales::kHead},
      // The first case's shapes and strides over e5m2: a call of the same layout runs kernels of its own cache type.
      {"bf16 e5m2 d128 GQA 4 contiguous, one token, per-head scales", FLASHGEN_BFLOAT16, FLASHGEN_FLOAT8_E5M2, 128,
       8, 2, FLASHGEN_MASK_CAUSAL, 1, {0, 1, 77, 1000, 513}, 1024, 0, 0, {0, 3}, Scales::kHead},
      {"fp16 e5m2 d64 MQA paged 16, append 3, one scale", FLASHGEN_FLOAT16, FLASHGEN_FLOAT8_E5M2, 64, 8, 1,
       FLASHGEN_MASK_CAUSAL, 3, {5, 0, 300, 61}, 320, 16, 3, {0, 1, 4}, Scales::kTensor},
      {"bf16 e4m3 d256 MHA paged 48, 4 tokens append 4 top-left, per-sequence scales", FLASHGEN_BFLOAT16,
       FLASHGEN_FLOAT8_E4M3, 256, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 4, {100, 3, 40}, 144, 48, 4, {0, 2},
       Scales::kSequenceHead},
      {"bf16 e5m2 d128 GQA 8 paged 256, append 1, no scales", FLASHGEN_BFLOAT16, FLASHGEN_FLOAT8_E5M2, 128, 32, 4,
       FLASHGEN_MASK_CAUSAL, 1, {700, 1, 255, 0}, 768, 256, 1, {0, 1, 5}, Scales::kNone},
      {"fp16 e4m3 d64 GQA 2 contiguous, 2 tokens no mask", FLASHGEN_FLOAT16, FLASHGEN_FLOAT8_E4M3, 64, 4, 2,
       FLASHGEN_MASK_NONE, 2, {129, 2, 64}, 208, 0, 0, {0, 1, 3}, Scales::kHead},
      windowed,
      large,
  };
}

}  // namespace

TEST_CASE("KV-cache attention over an FP8 cache matches each sequence's float64 reference", "[gpu][kvcache][fp8]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  if (flashgen::device_sm(scope.device()) < 89) FLASHGEN_SKIP_TEST("an FP8 cache needs sm_89 or newer");
  for (const Fp8Case& c : fp8_cases()) {
    Fp8Batch kv(c, 0xf8ca5e + uint64_t(c.head_dim));
    for (int splits : c.splits) {
      kv.dout.fill_bytes(0xff);
      kv.dlse.fill_bytes(0xff);
      kv.args.num_splits = splits;
      INFO(c.name << ", num_splits " << splits);
      REQUIRE(flashgen_attention_kvcache(&kv.args, nullptr) == FLASHGEN_SUCCESS);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      check_outputs(kv, "num_splits " + std::to_string(splits));
    }
    if (c.seqlen_new > 0) check_cache(kv);
  }
}
