// CPU checks of the test support itself (16-bit conversions, the float64 and naive references, the
// tolerance checks): the [gpu] attention tests are only as right as these.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "support/attention_reference.hpp"

using namespace flashgen::test;

namespace {

// |a - b| <= 1e-12 * max(1, |b|) (Catch's Approx lives in different namespaces in v2 and v3).
bool near(double a, double b) { return std::fabs(a - b) <= 1e-12 * std::max(1.0, std::fabs(b)); }

float float_of_bits(uint32_t bits) {
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// A problem with hand-picked values for q, k, v given as contiguous [b, s, h, d] arrays.
struct SmallProblem {
  AttentionShape shape;
  std::vector<double> q, k, v;
  HostInput in(const std::vector<double>& data, int64_t seqlen, int64_t heads) const {
    return HostInput{data.data(), StridedView::contiguous(shape.batch, seqlen, heads, shape.head_dim)};
  }
  AttentionResult run(double scale, flashgen_mask mask) const {
    return attention_reference_f64(shape, in(q, shape.seqlen_q, shape.heads_q), in(k, shape.seqlen_k, shape.heads_kv),
                                   in(v, shape.seqlen_k, shape.heads_kv), scale, mask);
  }
};

}  // namespace

TEST_CASE("fp16 conversion rounds to nearest even and keeps specials", "[reference]") {
  CHECK(float_to_half_bits(1.0f) == 0x3C00);
  CHECK(float_to_half_bits(-2.0f) == 0xC000);
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  CHECK(float_to_half_bits(65504.0f) == 0x7BFF);
  CHECK(float_to_half_bits(65519.0f) == 0x7BFF);
  CHECK(float_to_half_bits(65520.0f) == 0x7C00);  // the tie rounds to even: inf
  CHECK(float_to_half_bits(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);      // smallest subnormal
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);      // tie to even: 0
  CHECK(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002);      // tie to even: 2
  CHECK(float_to_half_bits(std::ldexp(1.0f, -14)) == 0x0400);      // smallest normal
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);        // tie to even: down
  CHECK(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3C02);        // tie to even: up
  const uint16_t nan = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7C00) == 0x7C00);
  CHECK((nan & 0x03FF) != 0);
  CHECK(std::isnan(half_bits_to_float(kPoison16)));
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x7BFF) == 65504.0f);
  CHECK(std::isinf(half_bits_to_float(0xFC00)));
  // Every 16-bit pattern that is not NaN survives a round trip through float.
  int bad = 0;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = half_bits_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(value) && float_to_half_bits(value) != bits) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps specials", "[reference]") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(float_to_bf16_bits(float_of_bits(0x3F808000u)) == 0x3F80);  // tie to even: down
  CHECK(float_to_bf16_bits(float_of_bits(0x3F818000u)) == 0x3F82);  // tie to even: up
  CHECK(float_to_bf16_bits(float_of_bits(0x3F808001u)) == 0x3F81);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to inf
  CHECK(float_to_bf16_bits(float_of_bits(0x00000001u)) == 0x0000);        // tiny subnormal
  const uint16_t nan = float_to_bf16_bits(float_of_bits(0x7F800001u));  // NaN with only low payload bits
  CHECK((nan & 0x7F80) == 0x7F80);
  CHECK((nan & 0x007F) != 0);
  CHECK(std::isnan(bf16_bits_to_float(kPoison16)));
  CHECK(round_to_dtype(3.14159f, FLASHGEN_BFLOAT16) == 3.140625f);
  CHECK(round_to_dtype(3.14159f, FLASHGEN_FLOAT16) == 3.140625f);
  uint32_t poison = kPoison32;
  float poison_f = 0.0f;
  std::memcpy(&poison_f, &poison, sizeof(poison_f));
  CHECK(std::isnan(poison_f));
}

TEST_CASE("float64 reference matches a hand-computed softmax", "[reference]") {
  SmallProblem p;
  p.shape = AttentionShape{1, 1, 2, 1, 1, 1};
  p.q = {1.0};
  p.k = {0.0, 1.0};
  p.v = {1.0, 3.0};
  const AttentionResult r = p.run(1.0, FLASHGEN_MASK_NONE);
  const double e = std::exp(1.0);
  CHECK(near(r.out[0], (1.0 + 3.0 * e) / (1.0 + e)));
  CHECK(near(r.lse[0], std::log(1.0 + e)));

  // A scale of 2 doubles the logits.
  const AttentionResult scaled = p.run(2.0, FLASHGEN_MASK_NONE);
  const double e2 = std::exp(2.0);
  CHECK(near(scaled.out[0], (1.0 + 3.0 * e2) / (1.0 + e2)));
  CHECK(effective_softmax_scale(0.0f, 64) == 0.125);
  CHECK(effective_softmax_scale(-1.0f, 16) == 0.25);
  CHECK(effective_softmax_scale(0.5f, 64) == 0.5);
}

TEST_CASE("float64 reference aligns causal masks bottom-right and top-left", "[reference]") {
  // seqlen_q = 3, seqlen_k = 2, head_dim 1, q = 0 so every visible key weighs the same: the output is the
  // mean of the visible values and the lse is log(visible count).
  SmallProblem p;
  p.shape = AttentionShape{1, 3, 2, 1, 1, 1};
  p.q = {0.0, 0.0, 0.0};
  p.k = {0.5, -0.5};
  p.v = {2.0, 4.0};
  const double inf = std::numeric_limits<double>::infinity();

  const AttentionResult br = p.run(1.0, FLASHGEN_MASK_CAUSAL);  // row i sees j <= i - 1
  CHECK(br.out[0] == 0.0);
  CHECK(br.lse[0] == -inf);
  CHECK(br.out[1] == 2.0);
  CHECK(br.lse[1] == 0.0);
  CHECK(near(br.out[2], 3.0));
  CHECK(near(br.lse[2], std::log(2.0)));

  const AttentionResult tl = p.run(1.0, FLASHGEN_MASK_CAUSAL_TOP_LEFT);  // row i sees j <= i
  CHECK(tl.out[0] == 2.0);
  CHECK(near(tl.out[1], 3.0));
  CHECK(near(tl.out[2], 3.0));

  const AttentionResult none = p.run(1.0, FLASHGEN_MASK_NONE);
  for (int i = 0; i < 3; ++i) CHECK(near(none.out[i], 3.0));

  // seqlen_q < seqlen_k: bottom-right lets row 0 see seqlen_k - seqlen_q + 1 keys.
  CHECK(key_visible(FLASHGEN_MASK_CAUSAL, 0, 5, 2, 7));
  CHECK_FALSE(key_visible(FLASHGEN_MASK_CAUSAL, 0, 6, 2, 7));
  CHECK_FALSE(key_visible(FLASHGEN_MASK_CAUSAL_TOP_LEFT, 0, 1, 2, 7));
  CHECK(key_visible(FLASHGEN_MASK_NONE, 0, 6, 2, 7));
}

TEST_CASE("float64 reference maps query heads to their key/value group", "[reference]") {
  // heads_q = 4, heads_kv = 2: query heads 0, 1 read kv head 0 and heads 2, 3 read kv head 1.
  SmallProblem p;
  p.shape = AttentionShape{1, 1, 1, 4, 2, 1};
  p.q = {1.0, 1.0, 1.0, 1.0};
  p.k = {0.0, 0.0};
  p.v = {10.0, 20.0};
  const AttentionResult r = p.run(1.0, FLASHGEN_MASK_NONE);
  CHECK(r.out == std::vector<double>{10.0, 10.0, 20.0, 20.0});
}

TEST_CASE("references read strided inputs and the naive one stays near float64", "[reference]") {
  const AttentionShape shape{2, 9, 13, 4, 2, 24};
  std::vector<double> q_c, k_c, v_c;
  uint32_t state = 12345;
  auto next = [&state]() {  // small deterministic values, rounded to fp16
    state = state * 1664525u + 1013904223u;
    return static_cast<double>(round_to_dtype(static_cast<float>((state >> 8) % 2001) / 500.0f - 2.0f,
                                              FLASHGEN_FLOAT16));
  };
  for (int64_t i = 0; i < shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim; ++i) q_c.push_back(next());
  for (int64_t i = 0; i < shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim; ++i) k_c.push_back(next());
  for (int64_t i = 0; i < shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim; ++i) v_c.push_back(next());

  // The same values in [b, h, s, d] memory.
  auto to_bhsd = [&shape](const std::vector<double>& contiguous, int64_t seqlen, int64_t heads, StridedView* view) {
    *view = StridedView::contiguous(shape.batch, seqlen, heads, shape.head_dim);
    view->stride[2] = seqlen * shape.head_dim;
    view->stride[1] = shape.head_dim;
    view->stride[0] = heads * seqlen * shape.head_dim;
    const StridedView src = StridedView::contiguous(shape.batch, seqlen, heads, shape.head_dim);
    std::vector<double> out(static_cast<size_t>(view->span()));
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t s = 0; s < seqlen; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < shape.head_dim; ++d) out[view->offset(b, s, h, d)] = contiguous[src.offset(b, s, h, d)];
    return out;
  };
  StridedView qv, kv, vv;
  const std::vector<double> q_t = to_bhsd(q_c, shape.seqlen_q, shape.heads_q, &qv);
  const std::vector<double> k_t = to_bhsd(k_c, shape.seqlen_k, shape.heads_kv, &kv);
  const std::vector<double> v_t = to_bhsd(v_c, shape.seqlen_k, shape.heads_kv, &vv);

  const HostInput q{q_c.data(), StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim)};
  const HostInput k{k_c.data(), StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim)};
  const HostInput v{v_c.data(), StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim)};
  for (flashgen_mask mask : {FLASHGEN_MASK_NONE, FLASHGEN_MASK_CAUSAL, FLASHGEN_MASK_CAUSAL_TOP_LEFT}) {
    INFO("mask " << mask_label(mask));
    const AttentionResult contiguous = attention_reference_f64(shape, q, k, v, 0.3, mask);
    const AttentionResult strided =
        attention_reference_f64(shape, HostInput{q_t.data(), qv}, HostInput{k_t.data(), kv}, HostInput{v_t.data(), vv},
                                0.3, mask);
    CHECK(contiguous.out == strided.out);
    CHECK(contiguous.lse == strided.lse);

    for (flashgen_dtype dtype : {FLASHGEN_FLOAT16, FLASHGEN_BFLOAT16}) {
      INFO("dtype " << dtype_label(dtype));
      const AttentionResult naive = attention_reference_naive(shape, q, k, v, 0.3, mask, dtype);
      // The naive path is the float64 result up to a few roundings in the dtype.
      const CheckReport self = check_output(shape, naive.out, contiguous, naive, dtype);
      INFO(self.text);
      CHECK(self.ok);
      CHECK(self.max_error < (dtype == FLASHGEN_FLOAT16 ? 1e-2 : 5e-2));
      const CheckReport lse = check_lse(shape, std::vector<float>(naive.lse.begin(), naive.lse.end()), contiguous);
      INFO(lse.text);
      CHECK(lse.ok);
    }
  }
}

TEST_CASE("checks flag NaN, errors beyond the bound and writes outside the views", "[reference]") {
  const AttentionShape shape{1, 2, 1, 1, 1, 2};
  AttentionResult ref;
  ref.out = {0.5, -0.25, 1.0, 2.0};
  ref.lse = {1.5, -std::numeric_limits<double>::infinity()};
  AttentionResult naive = ref;
  naive.out[1] = -0.25 + 0.01;  // the error budget: 2 * 0.01 + 1e-3

  std::vector<double> got = ref.out;
  got[2] = 1.0 + 0.02;  // inside the bound
  CHECK(check_output(shape, got, ref, naive, FLASHGEN_FLOAT16).ok);
  got[2] = 1.0 + 0.022;  // outside
  CheckReport report = check_output(shape, got, ref, naive, FLASHGEN_FLOAT16);
  CHECK_FALSE(report.ok);
  CHECK(report.mismatches == 1);
  CHECK(report.text.find("out[0, 1, 0, 0]") != std::string::npos);
  got[2] = std::numeric_limits<double>::quiet_NaN();
  report = check_output(shape, got, ref, naive, FLASHGEN_FLOAT16);
  CHECK_FALSE(report.ok);
  CHECK(report.not_written == 1);

  const float inf = std::numeric_limits<float>::infinity();
  CHECK(check_lse(shape, {1.5f + 1e-4f, -inf}, ref).ok);
  CHECK_FALSE(check_lse(shape, {1.5f + 2e-3f, -inf}, ref).ok);
  CHECK_FALSE(check_lse(shape, {1.5f, inf}, ref).ok);         // +inf is not -inf
  CHECK_FALSE(check_lse(shape, {1.5f, -1e30f}, ref).ok);      // a finite stand-in for -inf
  CHECK_FALSE(check_lse(shape, {std::nanf(""), -inf}, ref).ok);

  // A [1, 2, 1, 2] view with row stride 3 inside 8 elements: offsets 2, 5, 6, 7 are outside.
  StridedView view = StridedView::contiguous(1, 2, 1, 2);
  view.stride[1] = 3;
  std::vector<uint16_t> storage(8, kPoison16);
  storage[0] = storage[1] = storage[3] = storage[4] = 0x3C00;
  std::string text;
  CHECK(count_touched_outside(storage, {view}, kPoison16, &text) == 0);
  storage[5] = 0;
  CHECK(count_touched_outside(storage, {view}, kPoison16, &text) == 1);
  CHECK(text.find(" 5 ") != std::string::npos);
  const std::vector<double> gathered = gather_output(storage, view, FLASHGEN_FLOAT16);
  CHECK(gathered == std::vector<double>{1.0, 1.0, 1.0, 1.0});
}
