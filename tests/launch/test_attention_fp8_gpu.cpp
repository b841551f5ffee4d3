// [gpu] tests of the FP8 forward (e4m3 and e5m2 q, k and v on sm_90): out and lse of every row against float64
// attention over the dequantized inputs (each code times its descale), judged by FlashAttention-3's rule
// (check/output_check.hpp's check_fp8_rows over attention_reference_rows_fp8, as `flashgen run --dtype e4m3` judges
// its sampled rows): the output's largest error is at most twice that of a float64 computation which also rounds P to
// e4m3 (as P · 2^8 against the row's max, as the kernels round it), plus two ulp of the output type; the LSE within 1e-3 plus
// what the FP8 tensor cores' accumulation of S may lose. Per-(batch, kv head), per-tensor and no descales, codes up to ±448, GQA and MHA,
// no mask, both causal alignments (rows that see no key), a window with a soft cap and sinks, head dims 64, 128 and
// 256, bf16 and fp16 outputs, sequence lengths off the tiles; packed batches (descales per sequence, sequences
// starting off the 32-key steps, an empty one), also over shuffled paged caches, through the C ABI's choice and
// named configs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "generator/kernel_config.hpp"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/device_inputs.hpp"

namespace {

using flashgen::DeviceBuffer;
using flashgen::DType;

enum class Descales { kNone, kTensor, kBatchHead };

struct Fp8ForwardCase {
  std::string name;
  flashgen_dtype dtype = FLASHGEN_FLOAT8_E4M3;  // q's, k's and v's
  flashgen_dtype out = FLASHGEN_BFLOAT16;
  int64_t batch = 2, seqlen_q = 300, seqlen_k = 300, heads_q = 4, heads_kv = 2, head_dim = 128;
  flashgen_mask mask = FLASHGEN_MASK_CAUSAL;
  Descales descales = Descales::kBatchHead;
  float code_width = 150.f;  // the codes' spread: about 150 reaches ±448 in e4m3
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  std::vector<float> sinks = {};
};

// The codes of an FP8 tensor [b, s, h, d], its descales per (batch entry, kv head), and the values they stand for.
struct Fp8Tensor {
  std::vector<uint8_t> codes;
  std::vector<float> descale;  // [batch, heads_kv]
  std::vector<double> values;  // [b, s, h, d]: each code's value times its descale
  flashgen::StridedView view;

  flashgen::HostInput input() const { return flashgen::HostInput::float64(values.data(), view); }
};

// Random codes of a tensor [entries, rows, heads, head_dim] (a packed one: one entry of every sequence's rows), a
// descale per (sequence or batch entry, kv head) that brings them to about 1, and their values; sequence_of(b, s) is
// the descales' entry of row s of entry b. tensor (0, 1, 2 for q, k, v) sets its descales apart.
template <class SequenceOf>
Fp8Tensor random_fp8_tensor(const Fp8ForwardCase& c, DType type, std::mt19937_64& rng, int64_t entries, int64_t rows,
                            int64_t heads, int tensor, SequenceOf sequence_of) {
  std::normal_distribution<float> normal(0.f, c.code_width);
  const int64_t heads_per_descale = heads == c.heads_q ? c.heads_q / c.heads_kv : 1;
  Fp8Tensor t;
  t.view = flashgen::StridedView::contiguous(entries, rows, heads, c.head_dim);
  t.codes.resize(size_t(t.view.elements()));
  for (uint8_t& b : t.codes) b = flashgen::float_to_fp8_bits(normal(rng), type);
  for (int64_t i = 0; i < c.batch * c.heads_kv; ++i) {
    const int64_t at = c.descales == Descales::kTensor ? 0 : i;
    t.descale.push_back(c.descales == Descales::kNone ? 1.f
                                                      : 1.2f / c.code_width * (1.f + 0.125f * float(at + tensor)));
  }
  for (int64_t b = 0; b < entries; ++b)
    for (int64_t s = 0; s < rows; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const uint8_t code = t.codes[size_t(t.view.offset(b, s, h, d))];
          const float descale = t.descale[size_t(sequence_of(b, s) * c.heads_kv + h / heads_per_descale)];
          t.values.push_back(flashgen::fp8_bits_to_double(code, type) * double(descale));
        }
  return t;
}

// The options of a case: its mask, window, soft cap and sinks, and the descales of q, k and v (read per batch entry
// or sequence and kv head, or strides 0 for one) from the device copies.
flashgen_attention_options fp8_options(const Fp8ForwardCase& c, const DeviceBuffer& sinks, const DeviceBuffer& qd,
                                       const DeviceBuffer& kd, const DeviceBuffer& vd) {
  flashgen_attention_options opts = FLASHGEN_ATTENTION_OPTIONS_INIT;
  opts.mask = c.mask;
  opts.window_left = c.window_left, opts.window_right = c.window_right;
  opts.softcap = c.softcap;
  if (!c.sinks.empty()) opts.sinks = static_cast<const float*>(sinks.data());
  if (c.descales != Descales::kNone) {
    opts.q_descale = static_cast<const float*>(qd.data());
    opts.k_descale = static_cast<const float*>(kd.data());
    opts.v_descale = static_cast<const float*>(vd.data());
    // The arrays hold every (batch entry, kv head); strides 0 read the first for all.
    const int64_t batch_stride = c.descales == Descales::kBatchHead ? c.heads_kv : 0;
    const int64_t head_stride = c.descales == Descales::kBatchHead ? 1 : 0;
    for (int64_t* s : {opts.q_descale_stride, opts.k_descale_stride, opts.v_descale_stride}) {
      s[0] = batch_stride, s[1] = head_stride;
    }
  }
  return opts;
}

struct Fp8Forward {
  const Fp8ForwardCase& c;
  DType type, out_type;
  Fp8Tensor q, k, v;
  DeviceBuffer dq, dk, dv, dout, dlse, dqd, dkd, dvd, dsinks;
  flashgen_tensor tq{}, tk{}, tv{}, tout{};
  flashgen_attention_options opts = FLASHGEN_ATTENTION_OPTIONS_INIT;

  Fp8Forward(const Fp8ForwardCase& fp8_case, uint64_t seed)
      : c(fp8_case), type(flashgen::from_c(c.dtype)), out_type(flashgen::from_c(c.out)) {
    std::mt19937_64 rng(seed);
    auto make = [&](int64_t seqlen, int64_t heads, int tensor) {
      return random_fp8_tensor(c, type, rng, c.batch, seqlen, heads, tensor, [](int64_t b, int64_t) { return b; });
    };
    q = make(c.seqlen_q, c.heads_q, 0), k = make(c.seqlen_k, c.heads_kv, 1), v = make(c.seqlen_k, c.heads_kv, 2);
    using flashgen::test::upload;
    dq = upload(q.codes), dk = upload(k.codes), dv = upload(v.codes);
    dqd = upload(q.descale), dkd = upload(k.descale), dvd = upload(v.descale);
    if (!c.sinks.empty()) dsinks = upload(c.sinks);
    dout = DeviceBuffer(size_t(c.batch * c.seqlen_q * c.heads_q * c.head_dim) * 2);
    dlse = DeviceBuffer(size_t(c.batch * c.heads_q * c.seqlen_q) * sizeof(float));
    auto view = [&](const DeviceBuffer& b, flashgen_dtype t, int64_t s, int64_t h) {
      return flashgen_tensor{b.data(), t, {c.batch, s, h, c.head_dim}, {s * h * c.head_dim, h * c.head_dim, c.head_dim, 1}};
    };
    tq = view(dq, c.dtype, c.seqlen_q, c.heads_q), tk = view(dk, c.dtype, c.seqlen_k, c.heads_kv);
    tv = view(dv, c.dtype, c.seqlen_k, c.heads_kv), tout = view(dout, c.out, c.seqlen_q, c.heads_q);
    opts = fp8_options(c, dsinks, dqd, dkd, dvd);
  }
};

// Every row of the kernel's out and lse against float64 by FlashAttention-3's rule.
void check_forward(const Fp8Forward& f) {
  const Fp8ForwardCase& c = f.c;
  const flashgen::AttentionShape shape{c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim};
  const std::vector<uint16_t> out = f.dout.download_all<uint16_t>();
  const std::vector<float> lse = f.dlse.download_all<float>();
  std::vector<flashgen::RowSample> rows;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) rows.push_back({b, h, i});
  flashgen::ReferenceVariant variant(c.softcap, {c.window_left, c.window_right, 0});
  variant.sinks = c.sinks;
  const std::vector<flashgen::Fp8ReferenceRow> reference = flashgen::attention_reference_rows_fp8(
      shape, f.q.input(), f.k.input(), f.v.input(), flashgen::effective_softmax_scale(0.f, c.head_dim),
      flashgen::from_c(c.mask), rows, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), variant);
  const flashgen::HostInput out_in = flashgen::HostInput::bits16(
      out.data(), f.out_type, flashgen::StridedView::contiguous(c.batch, c.seqlen_q, c.heads_q, c.head_dim));
  const flashgen::Fp8RowsCheck check = flashgen::check_fp8_rows(shape, rows, reference, out_in, lse.data(), f.out_type);
  INFO(c.name << ": largest error " << check.rows.out.max_error << ", a float64 P rounded to e4m3's "
              << check.p_rounded_error << ", bound " << check.bound_out << " at |out| " << check.largest);
  INFO(check.rows.out.text << "\n" << check.rows.lse.text);
  CHECK(check.rows.out.ok);
  CHECK(check.rows.lse.ok);
}

std::vector<Fp8ForwardCase> fp8_forward_cases() {
  Fp8ForwardCase windowed{"e4m3 d128 GQA 2 window (70, 9), soft cap 15, sinks, bf16 out"};
  windowed.mask = FLASHGEN_MASK_SLIDING_WINDOW, windowed.window_left = 70, windowed.window_right = 9;
  windowed.softcap = 15.f, windowed.sinks = {2.f, -INFINITY, 0.5f, 4.f};
  Fp8ForwardCase plain{"e4m3 d64 MHA no mask, no descales, fp16 out", FLASHGEN_FLOAT8_E4M3, FLASHGEN_FLOAT16,
                       1, 129, 500, 3, 3, 64, FLASHGEN_MASK_NONE, Descales::kNone};
  plain.code_width = 1.f;
  return {
      {"e4m3 d128 GQA 2 causal, per-(batch, kv head) descales, codes to ±448, bf16 out"},
      {"e5m2 d128 GQA 2 causal, one descale, fp16 out", FLASHGEN_FLOAT8_E5M2, FLASHGEN_FLOAT16, 2, 300, 300, 4, 2,
       128, FLASHGEN_MASK_CAUSAL, Descales::kTensor},
      plain,
      {"e4m3 d256 MQA bottom-right causal, 300 queries over 100 keys (rows that see none)", FLASHGEN_FLOAT8_E4M3,
       FLASHGEN_BFLOAT16, 1, 300, 100, 4, 1, 256, FLASHGEN_MASK_CAUSAL, Descales::kBatchHead},
      {"e5m2 d256 MHA top-left causal, bf16 out", FLASHGEN_FLOAT8_E5M2, FLASHGEN_BFLOAT16, 1, 200, 333, 2, 2, 256,
       FLASHGEN_MASK_CAUSAL_TOP_LEFT, Descales::kBatchHead},
      windowed,
  };
}

// A packed batch of the case's heads, head dim, mask and descales (its batch: the sequences, seqlen_q and seqlen_k their
// longest), sequence b of lengths_q[b] queries and lengths_k[b] keys; configs: names to run besides the C ABI's choice.
struct Fp8PackedCase {
  Fp8ForwardCase c;
  std::vector<int64_t> lengths_q, lengths_k;
  std::vector<std::string> configs = {};
  int64_t page_size = 0;  // > 0: keys and values in a paged cache of such pages, in a shuffled order
};

struct Fp8Packed {
  const Fp8PackedCase& packed;
  const Fp8ForwardCase& c;
  DType type, out_type;
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  Fp8Tensor q, k, v;
  DeviceBuffer dq, dk, dv, dout, dlse, dqd, dkd, dvd, dsinks, dcu_q, dcu_k, dtable;
  flashgen_varlen_forward_args args{};

  Fp8Packed(const Fp8PackedCase& packed_case, uint64_t seed)
      : packed(packed_case), c(packed.c), type(flashgen::from_c(c.dtype)), out_type(flashgen::from_c(c.out)) {
    for (size_t b = 0; b < packed.lengths_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + int32_t(packed.lengths_q[b]));
      cu_k.push_back(cu_k.back() + int32_t(packed.lengths_k[b]));
    }
    std::mt19937_64 rng(seed);
    auto make = [&](const std::vector<int32_t>& cu, int64_t heads, int tensor) {
      auto sequence_of = [&cu](int64_t, int64_t row) {
        return int64_t(std::upper_bound(cu.begin(), cu.end(), int32_t(row)) - cu.begin()) - 1;
      };
      return random_fp8_tensor(c, type, rng, 1, cu.back(), heads, tensor, sequence_of);
    };
    q = make(cu_q, c.heads_q, 0), k = make(cu_k, c.heads_kv, 1), v = make(cu_k, c.heads_kv, 2);
    using flashgen::test::upload;
    dq = upload(q.codes), dk = upload(k.codes), dv = upload(v.codes);
    dqd = upload(q.descale), dkd = upload(k.descale), dvd = upload(v.descale);
    dcu_q = upload(cu_q), dcu_k = upload(cu_k);
    if (!c.sinks.empty()) dsinks = upload(c.sinks);
    dout = DeviceBuffer(size_t(cu_q.back() * c.heads_q * c.head_dim) * 2);
    dlse = DeviceBuffer(size_t(c.heads_q * cu_q.back()) * sizeof(float));
    auto view = [&](const DeviceBuffer& b, flashgen_dtype t, int64_t rows, int64_t h) {
      return flashgen_tensor{b.data(), t, {1, rows, h, c.head_dim}, {rows * h * c.head_dim, h * c.head_dim, c.head_dim, 1}};
    };
    args.size = sizeof(args);
    args.q = view(dq, c.dtype, cu_q.back(), c.heads_q), args.out = view(dout, c.out, cu_q.back(), c.heads_q);
    args.k = view(dk, c.dtype, cu_k.back(), c.heads_kv), args.v = view(dv, c.dtype, cu_k.back(), c.heads_kv);
    args.lse = static_cast<float*>(dlse.data());
    args.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.data());
    args.cu_seqlens_k = static_cast<const int32_t*>(dcu_k.data());
    args.batch = c.batch, args.max_seqlen_q = c.seqlen_q, args.max_seqlen_k = c.seqlen_k;
    args.options = fp8_options(c, dsinks, dqd, dkd, dvd);
    if (packed.page_size > 0) use_pages(rng);
  }

  // The keys and values moved into a paged cache: each sequence's rows in pages of a shuffled block table, the
  // other rows of every page random codes (which no sequence may read).
  void use_pages(std::mt19937_64& rng) {
    const int64_t page = packed.page_size, max_pages = (c.seqlen_k + page - 1) / page;
    const int64_t pages = c.batch * max_pages + 3, row = c.heads_kv * c.head_dim;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    table.resize(size_t(c.batch * max_pages));
    std::normal_distribution<float> normal(0.f, c.code_width);
    auto paged = [&](const Fp8Tensor& t) {
      std::vector<uint8_t> cache(size_t(pages * page * row));
      for (uint8_t& b : cache) b = flashgen::float_to_fp8_bits(normal(rng), type);
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t j = 0; j < cu_k[b + 1] - cu_k[b]; ++j) {
          const int64_t at = (table[size_t(b * max_pages + j / page)] * page + j % page) * row;
          std::copy_n(t.codes.begin() + (cu_k[b] + j) * row, row, cache.begin() + at);
        }
      return flashgen::test::upload(cache);
    };
    dk = paged(k), dv = paged(v), dtable = flashgen::test::upload(table);
    const flashgen_tensor cache{nullptr, c.dtype, {pages, page, c.heads_kv, c.head_dim}, {page * row, row, c.head_dim, 1}};
    args.k = cache, args.v = cache;
    args.k.data = dk.data(), args.v.data = dv.data();
    args.block_table = static_cast<const int32_t*>(dtable.data());
    args.max_pages = max_pages;
  }
};

// Each sequence's rows of out and lse against float64 over its own dequantized rows by FlashAttention-3's rule.
void check_packed(const Fp8Packed& f, const std::string& config) {
  const Fp8ForwardCase& c = f.c;
  const std::vector<uint16_t> out = f.dout.download_all<uint16_t>();
  const std::vector<float> lse = f.dlse.download_all<float>();  // [heads_q, total_q]
  const int64_t total_q = f.cu_q.back();
  for (size_t b = 0; b + 1 < f.cu_q.size(); ++b) {
    const int64_t rows_q = f.cu_q[b + 1] - f.cu_q[b], rows_k = f.cu_k[b + 1] - f.cu_k[b];
    if (rows_q == 0) continue;
    const flashgen::AttentionShape shape{1, rows_q, rows_k, c.heads_q, c.heads_kv, c.head_dim};
    // The sequence's rows of a packed tensor [1, total, heads, head_dim] as a batch of one.
    auto rows_of = [&](const Fp8Tensor& t, int64_t first, int64_t rows, int64_t heads) {
      flashgen::StridedView view = flashgen::StridedView::contiguous(1, rows, heads, c.head_dim);
      return flashgen::HostInput::float64(t.values.data() + first * heads * c.head_dim, view);
    };
    std::vector<flashgen::RowSample> rows;
    std::vector<float> sequence_lse;
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < rows_q; ++i) {
        rows.push_back({0, h, i});
        sequence_lse.push_back(lse[size_t(h * total_q + f.cu_q[b] + i)]);
      }
    flashgen::ReferenceVariant variant(c.softcap, {c.window_left, c.window_right, 0});
    variant.sinks = c.sinks;
    const std::vector<flashgen::Fp8ReferenceRow> reference = flashgen::attention_reference_rows_fp8(
        shape, rows_of(f.q, f.cu_q[b], rows_q, c.heads_q), rows_of(f.k, f.cu_k[b], rows_k, c.heads_kv),
        rows_of(f.v, f.cu_k[b], rows_k, c.heads_kv), flashgen::effective_softmax_scale(0.f, c.head_dim),
        flashgen::from_c(c.mask), rows, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), variant);
    const flashgen::HostInput out_in =
        flashgen::HostInput::bits16(out.data() + f.cu_q[b] * c.heads_q * c.head_dim, f.out_type,
                                    flashgen::StridedView::contiguous(1, rows_q, c.heads_q, c.head_dim));
    const flashgen::Fp8RowsCheck check =
        flashgen::check_fp8_rows(shape, rows, reference, out_in, sequence_lse.data(), f.out_type);
    INFO(c.name << " (" << config << "), sequence " << b << " of " << rows_q << " queries and " << rows_k
                << " keys: largest error " << check.rows.out.max_error << ", a float64 P rounded to e4m3's "
                << check.p_rounded_error << ", bound " << check.bound_out);
    INFO(check.rows.out.text << "\n" << check.rows.lse.text);
    CHECK(check.rows.out.ok);
    CHECK(check.rows.lse.ok);
  }
}

std::vector<Fp8PackedCase> fp8_packed_cases() {
  // Five sequences: keys past queries (bottom-right), an empty one, one of a single query and key, and every
  // sequence's keys but the first starting off a 32-key step.
  Fp8PackedCase causal{{"packed e4m3 d128 GQA 2 causal, per-(sequence, kv head) descales, bf16 out", FLASHGEN_FLOAT8_E4M3,
                        FLASHGEN_BFLOAT16, 5, 300, 300, 4, 2, 128, FLASHGEN_MASK_CAUSAL},
                       {300, 0, 1, 129, 77},
                       {300, 5, 1, 129, 200},
                       {"fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_varlen",
                        "fwd_sm90_e4m3_d128_m128_n128_s3_obf16_causal_varlen"}};
  Fp8PackedCase plain{{"packed e5m2 d64 MHA no mask, one descale, fp16 out", FLASHGEN_FLOAT8_E5M2, FLASHGEN_FLOAT16, 3,
                       200, 500, 3, 3, 64, FLASHGEN_MASK_NONE, Descales::kTensor},
                      {17, 200, 64},
                      {500, 33, 130},
                      {"fwd_sm90_e5m2_d64_m192_n128_s2_ofp16_ovl_varlen", "fwd_sm90_e5m2_d64_m128_n128_s2_ofp16_ovl_pp_varlen"}};
  Fp8PackedCase windowed{{"packed e4m3 d128 GQA 2 window (70, 9), soft cap 15, sinks", FLASHGEN_FLOAT8_E4M3,
                          FLASHGEN_BFLOAT16, 2, 250, 250, 4, 2, 128, FLASHGEN_MASK_SLIDING_WINDOW},
                         {90, 250},
                         {90, 250}};
  windowed.c.window_left = 70, windowed.c.window_right = 9, windowed.c.softcap = 15.f;
  windowed.c.sinks = {2.f, -INFINITY, 0.5f, 4.f};
  Fp8PackedCase top_left{{"packed e4m3 d256 MQA top-left causal, queries past the keys", FLASHGEN_FLOAT8_E4M3,
                          FLASHGEN_BFLOAT16, 2, 300, 100, 4, 1, 256, FLASHGEN_MASK_CAUSAL_TOP_LEFT},
                         {40, 300},
                         {100, 60}};
  // Pages of 48 and 16 keys, shuffled: boxes of 16 rows, a sequence's keys ending inside a page and inside a box.
  Fp8PackedCase paged_causal = causal;
  paged_causal.c.name = "paged (48-key pages) e4m3 d128 GQA 2 causal, per-(sequence, kv head) descales";
  paged_causal.page_size = 48;
  paged_causal.configs = {"fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_varlen_paged"};
  Fp8PackedCase paged_plain = plain;
  paged_plain.c.name = "paged (16-key pages) e5m2 d64 MHA no mask, one descale, fp16 out";
  paged_plain.page_size = 16;
  paged_plain.configs = {"fwd_sm90_e5m2_d64_m192_n128_s2_ofp16_ovl_varlen_paged"};
  // Keys of two 128-column chunks from pages of 64 (each chunk's columns its own).
  Fp8PackedCase paged_wide = top_left;
  paged_wide.c.name = "paged (64-key pages) e4m3 d256 MQA top-left causal, queries past the keys";
  paged_wide.page_size = 64;
  return {causal, plain, windowed, top_left, paged_causal, paged_plain, paged_wide};
}

}  // namespace

TEST_CASE("The FP8 forward matches float64 attention over its dequantized inputs by FlashAttention-3's rule",
          "[gpu][fp8][fp8_forward]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  if (flashgen::device_sm(scope.device()) != 90) FLASHGEN_SKIP_TEST("the FP8 forward runs on sm_90");
  for (const Fp8ForwardCase& c : fp8_forward_cases()) {
    Fp8Forward f(c, 0xf8f0 + uint64_t(c.head_dim));
    f.dout.fill_bytes(0xff);
    f.dlse.fill_bytes(0xff);
    INFO(c.name);
    REQUIRE(flashgen_attention_forward(&f.tq, &f.tk, &f.tv, &f.tout, static_cast<float*>(f.dlse.data()), &f.opts,
                                       nullptr) == FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    check_forward(f);
  }
}

TEST_CASE("The FP8 forward of packed batches matches each sequence's float64 attention by FlashAttention-3's rule",
          "[gpu][fp8][fp8_forward][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  if (flashgen::device_sm(scope.device()) != 90) FLASHGEN_SKIP_TEST("the FP8 forward runs on sm_90");
  for (const Fp8PackedCase& c : fp8_packed_cases()) {
    Fp8Packed f(c, 0xf8f1 + uint64_t(c.c.head_dim));
    for (const std::string& config : [&] {
           std::vector<std::string> all = {"the C ABI's choice"};
           all.insert(all.end(), c.configs.begin(), c.configs.end());
           return all;
         }()) {
      f.dout.fill_bytes(0xff);
      f.dlse.fill_bytes(0xff);
      INFO(c.c.name << " (" << config << ")");
      if (config == "the C ABI's choice") {
        const int status = flashgen_attention_varlen_forward(&f.args, nullptr);
        INFO(flashgen_last_error());
        REQUIRE(status == FLASHGEN_SUCCESS);
      } else {
        flashgen::launch_forward(flashgen::make_varlen_forward_call(f.args), nullptr,
                                 flashgen::KernelConfig::from_name(config));
      }
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      check_packed(f, config);
    }
  }
}
