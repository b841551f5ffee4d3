// CPU checks of the test-side numerics (the naive same-dtype reference, the tolerance checks, the poison
// and guard helpers): the [gpu] attention tests are only as right as these.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"
#include "support/attention_reference.hpp"

using namespace flashgen;
using namespace flashgen::test;

TEST_CASE("poison is NaN in fp16, bf16 and fp32", "[reference]") {
  CHECK(std::isnan(half_bits_to_float(kPoison16)));
  CHECK(std::isnan(bf16_bits_to_float(kPoison16)));
  uint32_t poison = kPoison32;
  float poison_f = 0.0f;
  std::memcpy(&poison_f, &poison, sizeof(poison_f));
  CHECK(std::isnan(poison_f));
}

TEST_CASE("references read strided inputs and the naive one stays near float64", "[reference]") {
  const AttentionShape shape{2, 9, 13, 4, 2, 24};
  std::vector<double> q_c, k_c, v_c;
  uint32_t state = 12345;
  auto next = [&state]() {  // small deterministic values, rounded to fp16
    state = state * 1664525u + 1013904223u;
    return static_cast<double>(round_to_dtype(static_cast<float>((state >> 8) % 2001) / 500.0f - 2.0f,
                                              DType::kFloat16));
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

  const HostInput q =
      HostInput::float64(q_c.data(), StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim));
  const HostInput k =
      HostInput::float64(k_c.data(), StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim));
  const HostInput v =
      HostInput::float64(v_c.data(), StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim));
  for (flashgen::Mask mask : {flashgen::Mask::kNone, flashgen::Mask::kCausal, flashgen::Mask::kCausalTopLeft}) {
    INFO("mask " << mask_label(mask));
    const AttentionResult contiguous = attention_reference_f64(shape, q, k, v, 0.3, mask);
    const AttentionResult strided =
        attention_reference_f64(shape, HostInput::float64(q_t.data(), qv), HostInput::float64(k_t.data(), kv),
                                HostInput::float64(v_t.data(), vv), 0.3, mask);
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
      const CheckReport lse =
          check_lse(shape, std::vector<float>(naive.lse.begin(), naive.lse.end()), contiguous, dtype);
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
  const flashgen_dtype f16 = FLASHGEN_FLOAT16;
  CHECK(check_lse(shape, {1.5f + 1e-4f, -inf}, ref, f16).ok);
  CHECK_FALSE(check_lse(shape, {1.5f + 2e-3f, -inf}, ref, f16).ok);
  CHECK_FALSE(check_lse(shape, {1.5f, inf}, ref, f16).ok);     // +inf is not -inf
  CHECK_FALSE(check_lse(shape, {1.5f, -1e30f}, ref, f16).ok);  // a finite stand-in for -inf
  CHECK_FALSE(check_lse(shape, {std::nanf(""), -inf}, ref, f16).ok);
  CHECK_FALSE(check_lse(shape, {1.5f}, ref, f16).ok);  // too few values

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
