// [gpu] tests of packed variable-length forward batches: every sequence's out and lse against its own
// float64 reference, with mixed lengths (0, 1, odd, one long among short ones), both causal alignments,
// GQA and MQA, several head_dims, seqused_k, and explicit configs of other tile sizes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/device_inputs.hpp"
#include "tuner/choice.hpp"
#include "tuner/space.hpp"

namespace {

using flashgen::DeviceBuffer;

struct VarlenCase {
  std::string name;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  int64_t head_dim = 64;
  int64_t heads_q = 4, heads_kv = 1;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  std::vector<int32_t> q_lens, k_lens;  // per sequence; k_lens are the rows of k and v each sequence owns
  std::vector<int32_t> used_k;          // seqused_k when not empty (each at most its k_lens entry)
  std::vector<std::string> configs;     // explicit configs run through launch_forward, besides the choice
  int64_t page_size = 0;                // > 0: the keys and values read from a paged cache of such pages
  float softcap = 0.f;                  // options.softcap
  int window_left = -1, window_right = -1;  // with mask FLASHGEN_MASK_SLIDING_WINDOW: options' window sides
  bool alibi = false;                       // ALiBi with a slope per sequence and query head (alibi_slopes())
  bool sinks = false;                       // options.sinks: sink_logits(), one per query head
  int chunk = 0;                            // options.attention_chunk (0: none)
  int64_t head_dim_v = 0;                   // > 0: the values' (and the output's) head dim, of their own

  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }

  // Sinks below, about and above the rows' LSE (near 5 over a few hundred keys), head 1 none (-inf).
  std::vector<float> sink_logits() const {
    const float values[] = {4.f, -INFINITY, 1.5f, 7.f};
    std::vector<float> logits;
    for (int64_t h = 0; sinks && h < heads_q; ++h) logits.push_back(values[h % 4] + 0.5f * float(h / 4));
    return logits;
  }

  // ALiBi's slopes, [sequence, heads_q] (options.alibi_batch_stride = heads_q): steep enough to reorder the
  // softmax of unit-variance scores over a few keys, and different per sequence.
  std::vector<float> alibi_slopes() const {
    std::vector<float> slopes;
    for (size_t b = 0; alibi && b < q_lens.size(); ++b)
      for (int64_t h = 0; h < heads_q; ++h) slopes.push_back(0.03f * float(h + 1) + 0.2f * float(b % 3));
    return slopes;
  }
  // The float64 reference's variant of sequence b.
  flashgen::ReferenceVariant variant(int64_t b) const {
    std::vector<float> slopes = alibi_slopes();
    if (alibi) slopes = std::vector<float>(slopes.begin() + b * heads_q, slopes.begin() + (b + 1) * heads_q);
    flashgen::ReferenceVariant variant(softcap, {window_left, window_right, chunk}, std::move(slopes));
    variant.sinks = sink_logits();
    return variant;
  }
};

std::vector<int32_t> offsets(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  return cu;
}

using flashgen::test::random_bits;
using flashgen::test::upload;

// A case's packed inputs on the host and the device, out and lse poisoned (NaN: a row the kernels leave
// unwritten fails the checks), and the forward's arguments over them.
struct PackedBatch {
  std::vector<int32_t> cu_q, cu_k;
  int64_t total_q = 0, total_k = 0;
  std::vector<uint16_t> q, k, v;
  DeviceBuffer dq, dk, dv, dout, dlse, dcu_q, dcu_k, dused, dslopes, dsink_logits;
  flashgen_varlen_forward_args args{};

  PackedBatch(const VarlenCase& c, uint64_t seed)
      : cu_q(offsets(c.q_lens)), cu_k(offsets(c.k_lens)), total_q(cu_q.back()), total_k(cu_k.back()) {
    const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim, d_v = c.value_dim();
    std::mt19937_64 rng(seed + total_q * 31 + total_k);
    q = random_bits(size_t(total_q * hq * d), c.dtype, rng);
    k = random_bits(size_t(total_k * hkv * d), c.dtype, rng);
    v = random_bits(size_t(total_k * hkv * d_v), c.dtype, rng);
    dq = DeviceBuffer(q.size() * 2), dk = DeviceBuffer(k.size() * 2), dv = DeviceBuffer(v.size() * 2);
    dout = DeviceBuffer(size_t(total_q * hq * d_v) * 2), dlse = DeviceBuffer(size_t(hq * total_q) * sizeof(float));
    dq.upload(q), dk.upload(k), dv.upload(v);
    dout.fill_bytes(0xff), dlse.fill_bytes(0xff);
    dcu_q = upload(cu_q), dcu_k = upload(cu_k);
    dused = upload(c.used_k.empty() ? std::vector<int32_t>{0} : c.used_k);
    args.size = sizeof(args);
    args.q = packed(c, dq, total_q, hq, d), args.k = packed(c, dk, total_k, hkv, d);
    args.v = packed(c, dv, total_k, hkv, d_v);
    args.out = packed(c, dout, total_q, hq, d_v);
    args.lse = static_cast<float*>(dlse.data());
    args.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.data());
    args.cu_seqlens_k = static_cast<const int32_t*>(dcu_k.data());
    args.seqused_k = c.used_k.empty() ? nullptr : static_cast<const int32_t*>(dused.data());
    args.batch = static_cast<int64_t>(c.q_lens.size());
    args.max_seqlen_q = *std::max_element(c.q_lens.begin(), c.q_lens.end());
    args.max_seqlen_k = *std::max_element(c.k_lens.begin(), c.k_lens.end());
    args.options.mask = c.mask;
    args.options.softcap = c.softcap;
    args.options.window_left = c.window_left, args.options.window_right = c.window_right;
    args.options.attention_chunk = c.chunk;
    if (c.alibi) {
      dslopes = upload(c.alibi_slopes());
      args.options.alibi_slopes = static_cast<const float*>(dslopes.data());
      args.options.alibi_batch_stride = hq;
    }
    if (c.sinks) {
      dsink_logits = upload(c.sink_logits());
      args.options.sinks = static_cast<const float*>(dsink_logits.data());
    }
  }

  // [1, total, heads, d] over buffer b.
  static flashgen_tensor packed(const VarlenCase& c, const DeviceBuffer& b, int64_t total, int64_t heads, int64_t d) {
    return flashgen_tensor{b.data(), c.dtype, {1, total, heads, d}, {total * heads * d, heads * d, d, 1}};
  }
};

// A packed batch's keys and values moved into a paged cache: each sequence's rows in pages of c.page_size
// rows, the pages of all sequences shuffled among spare ones; every row no sequence owns (the spare pages, a
// last page's rows past its sequence's keys) holds NaN, which must reach no result. args read them through the
// block table (the offsets then only give each sequence's key count).
struct PagedCache {
  DeviceBuffer dk, dv, dtable;

  PagedCache(const VarlenCase& c, PackedBatch& packed) {
    const int64_t page = c.page_size, batch = packed.args.batch;
    const int64_t row = c.heads_kv * c.head_dim, row_v = c.heads_kv * c.value_dim();
    const int64_t max_pages = (*std::max_element(c.k_lens.begin(), c.k_lens.end()) + page - 1) / page + 1;
    const int64_t num_pages = batch * max_pages + 3;
    std::mt19937_64 rng(0x9a6e);
    std::vector<int32_t> order(static_cast<size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    constexpr uint16_t kNaN = 0x7fff;  // in fp16 and bf16 alike
    std::vector<uint16_t> k(size_t(num_pages * page * row), kNaN), v(size_t(num_pages * page * row_v), kNaN);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < c.k_lens[size_t(b)]; ++j) {
        const int64_t at = order[size_t(b * max_pages + j / page)] * page + j % page;
        std::copy_n(packed.k.begin() + (packed.cu_k[size_t(b)] + j) * row, row, k.begin() + at * row);
        std::copy_n(packed.v.begin() + (packed.cu_k[size_t(b)] + j) * row_v, row_v, v.begin() + at * row_v);
      }
    dk = DeviceBuffer(k.size() * 2), dv = DeviceBuffer(v.size() * 2);
    dk.upload(k), dv.upload(v);
    dtable = upload(std::vector<int32_t>(order.begin(), order.begin() + batch * max_pages));
    flashgen_varlen_forward_args& args = packed.args;
    args.k = flashgen_tensor{dk.data(), c.dtype, {num_pages, page, c.heads_kv, c.head_dim}, {page * row, row, c.head_dim, 1}};
    args.v = flashgen_tensor{dv.data(), c.dtype, {num_pages, page, c.heads_kv, c.value_dim()},
                             {page * row_v, row_v, c.value_dim(), 1}};
    args.block_table = static_cast<const int32_t*>(dtable.data());
    args.max_pages = max_pages;
  }
};

// Runs c through the C ABI (config empty) or launch_forward (an explicit config), outputs poisoned first,
// and checks every sequence's rows against its float64 reference.
void run_and_check(const VarlenCase& c, const std::string& config) {
  PackedBatch packed(c, 0x5eed);
  std::optional<PagedCache> paged;
  if (c.page_size > 0) paged.emplace(c, packed);
  const flashgen_varlen_forward_args& args = packed.args;
  const int64_t batch = args.batch, total_q = packed.total_q;
  const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim, d_v = c.value_dim();
  if (config.empty()) {
    REQUIRE(flashgen_attention_varlen_forward(&args, nullptr) == FLASHGEN_SUCCESS);
  } else {
    flashgen::launch_forward(flashgen::make_varlen_forward_call(args), nullptr,
                             flashgen::KernelConfig::from_name(config));
  }
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> out = packed.dout.download_all<uint16_t>();
  const std::vector<float> lse = packed.dlse.download_all<float>();

  const double scale = flashgen::effective_softmax_scale(0.f, d);
  const flashgen::DType dtype = flashgen::from_c(c.dtype);
  const flashgen::DtypeTolerances& tol = flashgen::tolerances(dtype);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = c.q_lens[b], sk = c.used_k.empty() ? c.k_lens[b] : c.used_k[b];
    if (sq == 0) continue;
    INFO(c.name << (config.empty() ? "" : " " + config) << ": sequence " << b << " of " << sq << " queries, " << sk
                << " keys");
    std::vector<double> want_out(size_t(sq * hq * d_v), 0.0), want_lse(size_t(hq * sq), -INFINITY);
    if (sk > 0) {
      const flashgen::AttentionShape shape{1, sq, sk, hq, hkv, d, c.head_dim_v};
      const auto q_view = flashgen::StridedView::contiguous(1, sq, hq, d);
      const auto k_view = flashgen::StridedView::contiguous(1, sk, hkv, d);
      const auto v_view = flashgen::StridedView::contiguous(1, sk, hkv, d_v);
      const flashgen::AttentionResult ref = flashgen::attention_reference_f64(
          shape, flashgen::HostInput::bits16(packed.q.data() + packed.cu_q[b] * hq * d, dtype, q_view),
          flashgen::HostInput::bits16(packed.k.data() + packed.cu_k[b] * hkv * d, dtype, k_view),
          flashgen::HostInput::bits16(packed.v.data() + packed.cu_k[b] * hkv * d_v, dtype, v_view), scale,
          flashgen::from_c(c.mask), c.variant(b));
      want_out = ref.out, want_lse = ref.lse;
    } else if (c.sinks) {  // no key: the softmax is the sink's alone
      for (int64_t h = 0; h < hq; ++h) std::fill_n(want_lse.begin() + h * sq, sq, double(c.sink_logits()[size_t(h)]));
    }
    std::vector<double> got_out(want_out.size()), got_lse(want_lse.size());
    for (size_t i = 0; i < got_out.size(); ++i) {
      got_out[i] = flashgen::dtype_bits_to_float(out[size_t(packed.cu_q[b] * hq * d_v) + i], dtype);
    }
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t r = 0; r < sq; ++r) got_lse[size_t(h * sq + r)] = lse[size_t(h * total_q + packed.cu_q[b] + r)];
    const flashgen::CheckReport out_check = flashgen::check_elements("out", {sq, hq, d_v}, got_out, want_out, tol.out);
    const flashgen::CheckReport lse_check = flashgen::check_elements("lse", {hq, sq}, got_lse, want_lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }
}

// Each case through the C ABI's choice, then through each of its configs the GPU of sm_<arch> runs.
void run_each(const std::vector<VarlenCase>& cases, int arch) {
  for (const VarlenCase& c : cases) {
    run_and_check(c, "");
    for (const std::string& config : c.configs) {
      if (arch == 90 || config.rfind("fwd_sm90", 0) != 0) run_and_check(c, config);
    }
  }
}

}  // namespace

TEST_CASE("packed variable-length batches match each sequence's float64 reference", "[gpu][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const std::vector<VarlenCase> cases = {
      {"fp16 d64 bottom-right GQA 4", FLASHGEN_FLOAT16, 64, 4, 1, FLASHGEN_MASK_CAUSAL,
       // a sequence of one query, an empty one, keys fewer than queries (rows that see no key), no keys at
       // all, and one long sequence among short ones
       {1, 0, 77, 300, 128, 5, 1000}, {1, 3, 77, 513, 64, 0, 1000}, {},
       {"fwd_sm80_fp16_d64_m64_n64_w4_s2_causal_varlen", "fwd_sm80_fp16_d64_m128_n32_w4_s3_causal_varlen",
        "fwd_sm90_fp16_d64_m128_n128_s2_causal_ovl_pp_varlen", "fwd_sm90_fp16_d64_m192_n128_s2_causal_varlen"}},
      {"bf16 d128 top-left", FLASHGEN_BFLOAT16, 128, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT,
       {257, 1, 64, 190}, {300, 40, 64, 129}, {}, {"fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_varlen"}},
      {"fp16 d40 no mask MQA", FLASHGEN_FLOAT16, 40, 6, 1, FLASHGEN_MASK_NONE, {33, 129, 2}, {17, 200, 255}, {}, {}},
      {"bf16 d128 no mask GQA 2 sm90", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_NONE, {300, 1, 64, 129},
       {200, 70, 64, 1000}, {}, {"fwd_sm90_bf16_d128_m128_n128_s2_ovl_pp_varlen", "fwd_sm90_bf16_d128_m64_n128_s2_varlen"}},
      {"fp16 d256 bottom-right GQA 2", FLASHGEN_FLOAT16, 256, 2, 1, FLASHGEN_MASK_CAUSAL, {130, 7, 64}, {130, 70, 1},
       {}, {}},
      {"bf16 d96 bottom-right seqused_k", FLASHGEN_BFLOAT16, 96, 4, 2, FLASHGEN_MASK_CAUSAL, {1, 4, 100, 0},
       {300, 64, 256, 10}, {217, 64, 100, 0}, {}},
      // Prefill against a paged KV cache: pages of 16 and 48 rows, a shuffled block table, seqused_k.
      // The Hopper family copies boxes of gcd(page_size, block_n) rows (16, 48 against 128: 16; 64: 64; 256: 128,
      // and 32 against 160), a sequence's last rows in 16-row boxes and by hand.
      {"bf16 d128 bottom-right GQA 4 paged 16", FLASHGEN_BFLOAT16, 128, 8, 2, FLASHGEN_MASK_CAUSAL,
       {1, 0, 77, 300, 5}, {1, 3, 77, 513, 0}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_causal_varlen_paged",
        "fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_varlen_paged"},
       16},
      {"fp16 d64 top-left paged 48 seqused_k", FLASHGEN_FLOAT16, 64, 4, 4, FLASHGEN_MASK_CAUSAL_TOP_LEFT,
       {64, 3, 200}, {100, 50, 250}, {90, 50, 0}, {"fwd_sm90_fp16_d64_m192_n128_s2_causal_varlen_paged"}, 48},
      {"bf16 d96 bottom-right GQA 2 paged 64", FLASHGEN_BFLOAT16, 96, 4, 2, FLASHGEN_MASK_CAUSAL, {100, 1, 64, 300},
       {64, 129, 1, 700}, {}, {"fwd_sm90_bf16_d96_m128_n128_s2_causal_ovl_pp_varlen_paged"}, 64},
      {"fp16 d128 no mask paged 256 seqused_k", FLASHGEN_FLOAT16, 128, 4, 1, FLASHGEN_MASK_NONE, {300, 7, 129, 1, 64},
       {700, 256, 129, 512, 64}, {613, 200, 129, 512, 64},
       {"fwd_sm90_fp16_d128_m128_n128_s2_ovl_pp_varlen_paged", "fwd_sm90_fp16_d128_m128_n160_s2_ovl_pp_varlen_paged"},
       256},
      // Soft-capped scores (a cap of 1.5 bends most of them), both families, and a paged cache.
      {"bf16 d128 bottom-right GQA 2 softcap 1.5", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL,
       {257, 1, 0, 190}, {300, 40, 7, 129}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_causal_softcap_varlen",
        "fwd_sm90_bf16_d128_m128_n128_s2_causal_softcap_ovl_pp_varlen",
        "fwd_sm90_bf16_d128_m64_n128_s2_causal_softcap_varlen"},
       0, 1.5f},
      {"fp16 d40 no mask MQA softcap 4", FLASHGEN_FLOAT16, 40, 6, 1, FLASHGEN_MASK_NONE, {33, 129, 2}, {17, 200, 255},
       {}, {"fwd_sm80_fp16_d40_m128_n64_w4_s2_softcap_varlen"}, 0, 4.f},
      {"bf16 d64 bottom-right paged 16 softcap 2", FLASHGEN_BFLOAT16, 64, 4, 2, FLASHGEN_MASK_CAUSAL, {1, 77, 300},
       {1, 77, 513}, {}, {}, 16, 2.f},
      // Sliding windows, each sequence's about its own bottom-right diagonal: a causal one over several blocks
      // (rows that see no key where a sequence has fewer keys than queries), one bounded on both sides, paged.
      {"bf16 d128 window (70, 0) GQA 2", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_SLIDING_WINDOW,
       {257, 1, 0, 300}, {300, 40, 7, 129}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_window_varlen", "fwd_sm90_bf16_d128_m128_n128_s2_window_ovl_pp_varlen",
        "fwd_sm90_bf16_d128_m64_n128_s2_window_varlen"},
       0, 0.f, 70, 0},
      {"fp16 d64 window (33, 20) paged 16", FLASHGEN_FLOAT16, 64, 4, 1, FLASHGEN_MASK_SLIDING_WINDOW, {1, 77, 300},
       {1, 200, 513}, {}, {}, 16, 0.f, 33, 20},
      {"bf16 d128 window (70, 0) GQA 2 softcap 2", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_SLIDING_WINDOW,
       {257, 1, 0, 300}, {300, 40, 7, 129}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_window_softcap_varlen",
        "fwd_sm90_bf16_d128_m128_n128_s2_window_softcap_ovl_pp_varlen"},
       0, 2.f, 70, 0},
      // ALiBi with slopes per sequence and head, each sequence's bias about its own diagonal: both families, a
      // soft cap under it, a paged cache.
      {"bf16 d128 bottom-right GQA 2 ALiBi", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL, {257, 1, 0, 190},
       {300, 40, 7, 129}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_causal_alibi_varlen",
        "fwd_sm90_bf16_d128_m128_n128_s2_causal_alibi_ovl_pp_varlen"},
       0, 0.f, -1, -1, true},
      {"fp16 d64 no mask ALiBi softcap 3", FLASHGEN_FLOAT16, 64, 4, 1, FLASHGEN_MASK_NONE, {33, 129, 2},
       {17, 200, 255}, {}, {"fwd_sm80_fp16_d64_m128_n64_w4_s2_softcap_alibi_varlen"}, 0, 3.f, -1, -1, true},
      {"bf16 d64 window (33, 20) paged 16 ALiBi", FLASHGEN_BFLOAT16, 64, 4, 2, FLASHGEN_MASK_SLIDING_WINDOW,
       {1, 77, 300}, {1, 200, 513}, {}, {}, 16, 0.f, 33, 20, true},
      // Sinks, one per query head (rows of no key: lse = the sink), both families, a window and a paged cache.
      {"bf16 d128 bottom-right GQA 2 sinks", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL, {257, 1, 0, 190},
       {300, 40, 7, 129}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_causal_varlen", "fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_varlen"},
       0, 0.f, -1, -1, false, true},
      {"fp16 d64 window (33, 20) paged 16 sinks ALiBi", FLASHGEN_FLOAT16, 64, 4, 1, FLASHGEN_MASK_SLIDING_WINDOW,
       {1, 77, 300}, {1, 200, 513}, {}, {}, 16, 0.f, 33, 20, true, true},
      // Chunks about each sequence's own diagonal: chunked causal on both families, and bidirectional chunks over a
      // paged cache.
      {"bf16 d128 bottom-right chunks of 80, GQA 2", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL,
       {257, 1, 0, 190}, {300, 40, 7, 129}, {},
       {"fwd_sm80_bf16_d128_m64_n64_w4_s2_chunk_varlen", "fwd_sm90_bf16_d128_m128_n128_s2_chunk_ovl_pp_varlen"},
       0, 0.f, -1, -1, false, false, 80},
      {"fp16 d64 no mask chunks of 37 paged 16", FLASHGEN_FLOAT16, 64, 4, 1, FLASHGEN_MASK_NONE, {1, 77, 300},
       {1, 200, 513}, {}, {}, 16, 0.f, -1, -1, false, false, 37},
  };
  run_each(cases, flashgen::device_sm(scope.device()));
}

TEST_CASE("packed batches whose values have a head dim of their own match each sequence's float64 reference",
          "[gpu][varlen][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  auto with_values = [](VarlenCase c, int64_t head_dim_v, int64_t page_size = 0) {
    c.head_dim_v = head_dim_v, c.page_size = page_size;
    return c;
  };
  const std::vector<VarlenCase> cases = {
      // MLA prefill (192, 128): an empty sequence, rows that see no key, one long sequence among short ones.
      with_values({"bf16 d192 v128 bottom-right GQA 2", FLASHGEN_BFLOAT16, 192, 4, 2, FLASHGEN_MASK_CAUSAL,
                   {1, 0, 77, 300, 5}, {1, 3, 77, 513, 0}, {},
                   {"fwd_sm80_bf16_d192_v128_m64_n32_w4_s2_causal_varlen",
                    "fwd_sm80_bf16_d192_v128_m128_n64_w8_s2_causal_varlen",
                    "fwd_sm90_bf16_d192_v128_m128_n112_s2_causal_ovl_pp_varlen"}},
                  128),
      with_values({"fp16 d128 v64 no mask MQA seqused_k", FLASHGEN_FLOAT16, 128, 4, 1, FLASHGEN_MASK_NONE,
                   {33, 129, 2}, {17, 200, 255}, {17, 150, 0}, {}},
                  64),
      // Read through a paged cache of 16- and 64-row pages, the values' pages of their own width.
      with_values({"bf16 d192 v128 bottom-right paged 16", FLASHGEN_BFLOAT16, 192, 4, 2, FLASHGEN_MASK_CAUSAL,
                   {1, 77, 300}, {1, 77, 513}, {},
                   {"fwd_sm80_bf16_d192_v128_m64_n64_w4_s2_causal_varlen_paged",
                    "fwd_sm90_bf16_d192_v128_m128_n112_s2_causal_ovl_pp_varlen_paged",
                    "fwd_sm90_bf16_d192_v128_m128_n128_s2_causal_ovl_pp_varlen_paged"}},
                  128, 16),
      with_values({"fp16 d64 v256 top-left paged 64", FLASHGEN_FLOAT16, 64, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT,
                   {64, 3, 200}, {100, 50, 250}, {}, {"fwd_sm90_fp16_d64_v256_m128_n64_s2_causal_ovl_pp_varlen_paged"}},
                  256, 64),
      // Pages of 48 rows: V's 16-row boxes, and the 16-row group copied by hand past a sequence's last key.
      with_values({"bf16 d128 v64 bottom-right paged 48 seqused_k", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL,
                   {64, 3, 200}, {100, 50, 250}, {90, 50, 0},
                   {"fwd_sm90_bf16_d128_v64_m128_n128_s2_causal_ovl_pp_varlen_paged"}},
                  64, 48),
      // Values of 512 and 320 columns, each 64 rows' two consumers holding half of O's columns (value_split 2):
      // a packed sequence's tail rows written from registers, each consumer its own columns.
      with_values({"bf16 d64 v512 bottom-right GQA 4", FLASHGEN_BFLOAT16, 64, 4, 1, FLASHGEN_MASK_CAUSAL,
                   {1, 0, 77, 300, 5}, {1, 3, 77, 513, 0}, {},
                   {"fwd_sm90_bf16_d64_v512_m64_n64_s2_causal_ovl_pp_vs2_varlen",
                    "fwd_sm90_bf16_d64_v512_m64_n32_s2_causal_ovl_vs2_varlen"}},
                  512),
      with_values({"fp16 d128 v320 top-left paged 64", FLASHGEN_FLOAT16, 128, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT,
                   {64, 3, 200}, {100, 50, 250}, {},
                   {"fwd_sm90_fp16_d128_v320_m64_n48_s2_causal_ovl_pp_vs2_varlen_paged"}},
                  320, 64),
      // Keys and values of 512: the output staged in the Q rows; through a paged cache of 64-row pages.
      with_values({"bf16 d512 bottom-right MQA paged 64", FLASHGEN_BFLOAT16, 512, 4, 1, FLASHGEN_MASK_CAUSAL,
                   {1, 77, 200}, {1, 77, 250}, {},
                   {"fwd_sm90_bf16_d512_m64_n32_s2_causal_ovl_pp_vs2_varlen_paged"}},
                  0, 64),
      with_values({"fp16 d512 no mask", FLASHGEN_FLOAT16, 512, 2, 2, FLASHGEN_MASK_NONE, {1, 0, 77, 130}, {3, 5, 77, 100},
                   {}, {"fwd_sm90_fp16_d512_m64_n32_s2_ovl_pp_vs2_varlen"}},
                  0),
  };
  run_each(cases, flashgen::device_sm(scope.device()));
}

TEST_CASE("a packed batch runs its own kernels, chosen for packed batches", "[gpu][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  DeviceBuffer buffer(size_t(64) * 2 * 64 * 2), offsets(3 * sizeof(int32_t));
  offsets.upload(std::vector<int32_t>{0, 20, 64});
  flashgen_varlen_forward_args args{};
  args.size = sizeof(args);
  args.q = args.k = args.v = args.out =
      flashgen_tensor{buffer.data(), FLASHGEN_FLOAT16, {1, 64, 2, 64}, {64 * 2 * 64, 2 * 64, 64, 1}};
  args.cu_seqlens_q = args.cu_seqlens_k = static_cast<const int32_t*>(offsets.data());
  args.batch = 2, args.max_seqlen_q = 44, args.max_seqlen_k = 44;
  const flashgen::ForwardPlan plan = flashgen::plan_forward(flashgen::make_varlen_forward_call(args), nullptr);
  CHECK(plan.launch.config.varlen);
  // On sm_90 the Hopper family's kernels, one block per tile; elsewhere the sm80 family's.
  const bool sm90 = flashgen::device_sm(scope.device()) == 90;
  CHECK(plan.launch.config.family() == (sm90 ? flashgen::KernelFamily::kSm90 : flashgen::KernelFamily::kSm80));
  if (const flashgen::Sm90Knobs* k = plan.launch.config.sm90()) CHECK_FALSE(k->persistent);
  CHECK(plan.launch.config.name().find("_varlen") != std::string::npos);

  // Over a paged cache (the same buffer as 4 pages of 16 rows), the same family reads the pages.
  DeviceBuffer table(2 * 3 * sizeof(int32_t));
  table.upload(std::vector<int32_t>{3, 1, 0, 2, 1, 0});
  args.k = args.v = flashgen_tensor{buffer.data(), FLASHGEN_FLOAT16, {4, 16, 2, 64}, {16 * 2 * 64, 2 * 64, 64, 1}};
  args.block_table = static_cast<const int32_t*>(table.data());
  args.max_pages = 3;
  const flashgen::ForwardPlan paged = flashgen::plan_forward(flashgen::make_varlen_forward_call(args), nullptr);
  CHECK(paged.launch.config.paged);
  CHECK(paged.launch.config.family() == plan.launch.config.family());
  CHECK(paged.launch.config.name().find("_varlen_paged") != std::string::npos);
}

namespace {

// The varlen forward then backward of c (seqused_k aside), gradients poisoned first; every sequence's dq, dk
// and dv against its float64 gradients. With a config, the backward runs that config (its strategy), twice
// when deterministic: the second run's gradients must be the first's bits. sink_grad_bound > 0: dsinks within that
// fraction of the largest |dsink| (the _dsink modules'), else the dtype's gradient tolerance.
void run_and_check_backward(const VarlenCase& c, bool deterministic,
                            const std::optional<flashgen::BwdConfig>& config = std::nullopt,
                            double sink_grad_bound = 0.0) {
  PackedBatch packed(c, 0xbac0);
  const flashgen_varlen_forward_args& fwd = packed.args;
  const int64_t batch = fwd.batch, total_q = packed.total_q, total_k = packed.total_k;
  const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim;
  std::mt19937_64 rng(0xd0 + total_q);
  const std::vector<uint16_t> dout = random_bits(packed.q.size(), c.dtype, rng);
  DeviceBuffer ddout(dout.size() * 2), dq(packed.q.size() * 2), dk(packed.k.size() * 2), dv(packed.v.size() * 2);
  DeviceBuffer dsinks(size_t(hq) * sizeof(float));
  ddout.upload(dout);
  dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff);  // NaN: what the kernels leave unwritten fails
  dsinks.fill_bytes(0xff);
  REQUIRE(flashgen_attention_varlen_forward(&fwd, nullptr) == FLASHGEN_SUCCESS);

  flashgen_varlen_backward_args bwd{};
  bwd.size = sizeof(bwd);
  bwd.q = fwd.q, bwd.k = fwd.k, bwd.v = fwd.v, bwd.out = fwd.out;
  bwd.dout = PackedBatch::packed(c, ddout, total_q, hq, c.head_dim);
  bwd.dq = PackedBatch::packed(c, dq, total_q, hq, c.head_dim);
  bwd.dk = PackedBatch::packed(c, dk, total_k, hkv, c.head_dim);
  bwd.dv = PackedBatch::packed(c, dv, total_k, hkv, c.head_dim);
  bwd.lse = fwd.lse;
  bwd.cu_seqlens_q = fwd.cu_seqlens_q, bwd.cu_seqlens_k = fwd.cu_seqlens_k;
  bwd.batch = batch, bwd.max_seqlen_q = fwd.max_seqlen_q, bwd.max_seqlen_k = fwd.max_seqlen_k;
  bwd.options = fwd.options;
  bwd.options.deterministic = deterministic ? 1 : 0;
  if (c.sinks) bwd.options.dsinks = static_cast<float*>(dsinks.data());
  // With a config, a poisoned workspace: the kernels must write what they read of it.
  DeviceBuffer workspace;
  if (config) {
    workspace = DeviceBuffer(flashgen::backward_workspace_bytes(flashgen::make_varlen_backward_call(bwd), *config));
    workspace.fill_bytes(0xff);
    flashgen::launch_backward(flashgen::make_varlen_backward_call(bwd), nullptr, *config, workspace.ptr(),
                              workspace.bytes());
  } else {
    REQUIRE(flashgen_attention_varlen_backward(&bwd, nullptr) == FLASHGEN_SUCCESS);
  }
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> got_dq = dq.download_all<uint16_t>(), got_dk = dk.download_all<uint16_t>(),
                              got_dv = dv.download_all<uint16_t>();
  const std::vector<float> got_dsinks = dsinks.download_all<float>();
  if (config && deterministic) {
    dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff), workspace.fill_bytes(0xff);
    dsinks.fill_bytes(0xff);
    flashgen::launch_backward(flashgen::make_varlen_backward_call(bwd), nullptr, *config, workspace.ptr(),
                              workspace.bytes());
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    INFO(config->name() << ": a second run");
    CHECK(dq.download_all<uint16_t>() == got_dq);
    CHECK(dk.download_all<uint16_t>() == got_dk);
    CHECK(dv.download_all<uint16_t>() == got_dv);
    if (c.sinks) CHECK(dsinks.download_all<float>() == got_dsinks);
  }

  const double scale = flashgen::effective_softmax_scale(0.f, d);
  const flashgen::DType dtype = flashgen::from_c(c.dtype);
  auto to_double = [&](const std::vector<uint16_t>& bits, int64_t first, int64_t count) {
    std::vector<double> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      values[size_t(i)] = flashgen::dtype_bits_to_float(bits[size_t(first + i)], dtype);
    }
    return values;
  };
  std::vector<double> want_dsinks(size_t(hq), 0.0);  // summed over the sequences
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = c.q_lens[b], sk = c.k_lens[b];
    INFO(c.name << (deterministic ? " deterministic" : " atomic") << (config ? " " + config->name() : std::string())
                << ": sequence " << b << " of " << sq << " queries, " << sk << " keys");
    flashgen::AttentionGradients want;
    want.dq.assign(size_t(sq * hq * d), 0.0);
    want.dk.assign(size_t(sk * hkv * d), 0.0);
    want.dv.assign(size_t(sk * hkv * d), 0.0);
    if (sq > 0 && sk > 0) {  // otherwise every gradient of the sequence is 0
      const flashgen::AttentionShape shape{1, sq, sk, hq, hkv, d};
      const auto q_view = flashgen::StridedView::contiguous(1, sq, hq, d);
      const auto kv_view = flashgen::StridedView::contiguous(1, sk, hkv, d);
      want = flashgen::attention_backward_reference_f64(
          shape, flashgen::HostInput::bits16(packed.q.data() + packed.cu_q[b] * hq * d, dtype, q_view),
          flashgen::HostInput::bits16(packed.k.data() + packed.cu_k[b] * hkv * d, dtype, kv_view),
          flashgen::HostInput::bits16(packed.v.data() + packed.cu_k[b] * hkv * d, dtype, kv_view),
          flashgen::HostInput::bits16(dout.data() + packed.cu_q[b] * hq * d, dtype, q_view), scale,
          flashgen::from_c(c.mask), c.variant(b));
      for (size_t h = 0; h < want.dsinks.size(); ++h) want_dsinks[h] += want.dsinks[h];
    }
    const struct {
      const char* name;
      std::vector<double> got;
      const std::vector<double>& want;
      std::vector<int64_t> dims;
    } grads[] = {{"dq", to_double(got_dq, packed.cu_q[b] * hq * d, sq * hq * d), want.dq, {sq, hq, d}},
                 {"dk", to_double(got_dk, packed.cu_k[b] * hkv * d, sk * hkv * d), want.dk, {sk, hkv, d}},
                 {"dv", to_double(got_dv, packed.cu_k[b] * hkv * d, sk * hkv * d), want.dv, {sk, hkv, d}}};
    for (const auto& g : grads) {
      const flashgen::CheckReport check = flashgen::check_elements(
          g.name, g.dims, g.got, g.want, flashgen::gradient_tolerance(dtype, flashgen::max_magnitude(g.want)));
      INFO(check.text);
      CHECK(check.ok);
    }
  }
  if (c.sinks) {
    INFO(c.name << (deterministic ? " deterministic" : " atomic") << (config ? " " + config->name() : std::string()));
    const flashgen::Tolerance tolerance =
        sink_grad_bound > 0.0 ? flashgen::Tolerance{sink_grad_bound * flashgen::max_magnitude(want_dsinks), 0.0}
                              : flashgen::gradient_tolerance(dtype, flashgen::max_magnitude(want_dsinks));
    const flashgen::CheckReport check = flashgen::check_elements(
        "dsinks", {hq}, std::vector<double>(got_dsinks.begin(), got_dsinks.end()), want_dsinks, tolerance);
    INFO(check.text);
    CHECK(check.ok);
  }
}

}  // namespace

TEST_CASE("packed variable-length backward matches each sequence's float64 gradients", "[gpu][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const std::vector<VarlenCase> cases = {
      // an empty sequence (its keys get zero dk, dv), keys fewer than queries, none at all, one long sequence
      {"fp16 d64 bottom-right GQA 2", FLASHGEN_FLOAT16, 64, 4, 2, FLASHGEN_MASK_CAUSAL, {1, 0, 77, 130, 5, 400},
       {1, 30, 77, 64, 0, 400}, {}, {}},
      {"bf16 d128 top-left", FLASHGEN_BFLOAT16, 128, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT, {257, 1, 64}, {300, 40, 64},
       {}, {}},
      {"fp16 d40 no mask MQA", FLASHGEN_FLOAT16, 40, 3, 1, FLASHGEN_MASK_NONE, {33, 129}, {17, 200}, {}, {}},
      {"bf16 d128 bottom-right softcap 1.5", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL, {130, 0, 77},
       {200, 9, 77}, {}, {}, 0, 1.5f},
      {"fp16 d64 no mask softcap 3", FLASHGEN_FLOAT16, 64, 2, 1, FLASHGEN_MASK_NONE, {65, 190}, {100, 129}, {}, {},
       0, 3.f},
      {"bf16 d128 window (90, 0)", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_SLIDING_WINDOW, {330, 0, 77, 200},
       {300, 9, 77, 450}, {}, {}, 0, 0.f, 90, 0},
      {"fp16 d64 window (40, 17) softcap 3", FLASHGEN_FLOAT16, 64, 2, 1, FLASHGEN_MASK_SLIDING_WINDOW, {65, 190},
       {100, 129}, {}, {}, 0, 3.f, 40, 17},
      {"bf16 d128 window (90, 0) GQA 2 softcap 2", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_SLIDING_WINDOW,
       {330, 0, 77, 200}, {300, 9, 77, 450}, {}, {}, 0, 2.f, 90, 0},
      {"bf16 d128 bottom-right ALiBi", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_CAUSAL, {130, 0, 77},
       {200, 9, 77}, {}, {}, 0, 0.f, -1, -1, true},
      {"fp16 d64 top-left ALiBi softcap 3", FLASHGEN_FLOAT16, 64, 2, 1, FLASHGEN_MASK_CAUSAL_TOP_LEFT, {65, 190},
       {100, 129}, {}, {}, 0, 3.f, -1, -1, true},
      {"bf16 d128 window (90, 0) sinks", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_SLIDING_WINDOW, {330, 0, 77, 200},
       {300, 9, 77, 450}, {}, {}, 0, 0.f, 90, 0, false, true},
      {"fp16 d64 bottom-right chunks of 50", FLASHGEN_FLOAT16, 64, 2, 1, FLASHGEN_MASK_CAUSAL, {330, 0, 77, 200},
       {300, 9, 77, 450}, {}, {}, 0, 0.f, -1, -1, false, false, 50},
      // Keys of 512 (the sm80 family's column slices; the forward is the Hopper family's)
      {"bf16 d512 bottom-right MQA", FLASHGEN_BFLOAT16, 512, 4, 1, FLASHGEN_MASK_CAUSAL, {1, 0, 77, 130},
       {3, 5, 77, 100}, {}, {}},
  };
  const int arch = flashgen::device_sm(scope.device());
  for (const VarlenCase& c : cases) {
    if (c.head_dim > 256 && arch != 90) continue;
    run_and_check_backward(c, /*deterministic=*/false);
    run_and_check_backward(c, /*deterministic=*/true);
    // And on the sm80 family (the choice is the sm90 one where the GPU has it).
    const bool windowed = c.mask == FLASHGEN_MASK_SLIDING_WINDOW || c.chunk > 0;
    if (c.softcap > 0.f || c.alibi || c.sinks || windowed) {
      const auto dtype = c.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16;
      const auto mask = c.chunk > 0                     ? flashgen::MaskKind::kChunk
                        : windowed                      ? flashgen::MaskKind::kWindow
                        : c.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone
                                                       : flashgen::MaskKind::kCausal;
      for (bool deterministic : {false, true}) {
        run_and_check_backward(c, deterministic,
                               flashgen::heuristic_backward_choice(dtype, static_cast<int>(c.head_dim), mask,
                                                                   deterministic, 80, true, true,
                                                                   {c.softcap > 0.f, c.alibi})
                                   .config);
      }
    }
  }
}

TEST_CASE("the sinks' gradient of a packed batch lies within fp32 rounding of the float64 softmax's",
          "[gpu][varlen][sinks]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  // An empty sequence, one whose rows see no key, GQA 2; both dtypes (test_attention_sinks_gpu.cpp's dense bound).
  constexpr double kSinkGradRelative = 5e-5;
  const VarlenCase cases[] = {
      {"fp16 d64 bottom-right GQA 2 sinks", FLASHGEN_FLOAT16, 64, 4, 2, FLASHGEN_MASK_CAUSAL, {257, 0, 40, 190},
       {300, 7, 0, 190}, {}, {}, 0, 0.f, -1, -1, false, true},
      {"bf16 d128 no mask GQA 2 sinks", FLASHGEN_BFLOAT16, 128, 4, 2, FLASHGEN_MASK_NONE, {130, 0, 77, 64},
       {200, 9, 0, 333}, {}, {}, 0, 0.f, -1, -1, false, true},
  };
  for (const VarlenCase& c : cases) {
    const auto dtype = c.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16;
    const auto mask = c.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone : flashgen::MaskKind::kCausal;
    for (bool deterministic : {false, true}) {
      run_and_check_backward(c, deterministic, std::nullopt, kSinkGradRelative);  // the run-time choice
      for (bool sm80_only : {true, false}) {
        if (!sm80_only && arch != 90) continue;
        flashgen::BwdConfig config = flashgen::heuristic_backward_choice(dtype, static_cast<int>(c.head_dim), mask,
                                                                         deterministic, arch, sm80_only, true)
                                         .config;
        config.sink_grad = true;
        run_and_check_backward(c, deterministic, config, kSinkGradRelative);
      }
    }
  }
}

TEST_CASE("packed variable-length backward, sm90 family: every config of both strategies", "[gpu][varlen][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  FLASHGEN_REQUIRE_SM90(scope);
  // Sequences ending inside a key block and inside a query block, an empty one, one whose keys no query
  // sees (top-left), one longer than a block both ways; GQA.
  const std::vector<VarlenCase> cases = {
      {"fp16 d64 bottom-right GQA 2", FLASHGEN_FLOAT16, 64, 4, 2, FLASHGEN_MASK_CAUSAL, {1, 0, 77, 130, 5, 400},
       {1, 30, 77, 64, 0, 400}, {}, {}},
      {"bf16 d128 top-left", FLASHGEN_BFLOAT16, 128, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT, {257, 1, 64, 3},
       {300, 40, 64, 200}, {}, {}},
      {"fp16 d128 no mask MQA", FLASHGEN_FLOAT16, 128, 3, 1, FLASHGEN_MASK_NONE, {33, 129, 190}, {17, 200, 129},
       {}, {}},
      {"fp16 d192 top-left MQA", FLASHGEN_FLOAT16, 192, 3, 1, FLASHGEN_MASK_CAUSAL_TOP_LEFT, {65, 0, 129},
       {70, 3, 200}, {}, {}},
      {"bf16 d256 bottom-right GQA 2", FLASHGEN_BFLOAT16, 256, 2, 1, FLASHGEN_MASK_CAUSAL, {70, 1, 130}, {90, 5, 64},
       {}, {}},
      // Tiles wider than head_dim (zero-padded columns): 128 columns for 96, 64 for 40.
      {"bf16 d96 bottom-right GQA 2", FLASHGEN_BFLOAT16, 96, 4, 2, FLASHGEN_MASK_CAUSAL, {100, 1, 64}, {130, 0, 70},
       {}, {}},
      {"fp16 d40 no mask MQA", FLASHGEN_FLOAT16, 40, 3, 1, FLASHGEN_MASK_NONE, {33, 129, 2}, {17, 200, 255}, {}, {}},
  };
  int ran = 0;
  for (const VarlenCase& c : cases) {
    for (bool deterministic : {false, true}) {
      // Every packed sm90 config the tuner's space holds for the case.
      const auto dtype = c.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16;
      const auto mask = c.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone : flashgen::MaskKind::kCausal;
      const flashgen::BackwardSpaceReport space = flashgen::packed_space(
          flashgen::backward_space(dtype, static_cast<int>(c.head_dim), mask, deterministic, 90), 90);
      for (const flashgen::BwdConfig& config : space.valid) {
        if (config.family() != flashgen::KernelFamily::kSm90) continue;
        run_and_check_backward(c, deterministic, config);
        ++ran;
      }
    }
  }
  CHECK(ran >= 40);  // d64 and d40: 5 configs, d128 and d96: 2, d192: 3, d256: 2, each with both strategies
}
