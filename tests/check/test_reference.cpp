// CPU checks of the library's float64 reference (check/reference.hpp): 16-bit conversions, mask and
// GQA semantics, FLOP counts, and row, whole-problem and 16-bit inputs agreeing. `flashgen run` and the
// [gpu] attention tests are only as right as these.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"

using namespace flashgen;

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
    return HostInput::float64(data.data(), StridedView::contiguous(shape.batch, seqlen, heads, shape.head_dim));
  }
  AttentionResult run(double scale, flashgen::Mask mask, ReferenceWindow window = {}) const {
    return attention_reference_f64(shape, in(q, shape.seqlen_q, shape.heads_q), in(k, shape.seqlen_k, shape.heads_kv),
                                   in(v, shape.seqlen_k, shape.heads_kv), scale, mask, {0.0, window});
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
  CHECK(round_to_dtype(3.14159f, DType::kBFloat16) == 3.140625f);
  CHECK(round_to_dtype(3.14159f, DType::kFloat16) == 3.140625f);
}

TEST_CASE("float64 reference matches a hand-computed softmax", "[reference]") {
  SmallProblem p;
  p.shape = AttentionShape{1, 1, 2, 1, 1, 1};
  p.q = {1.0};
  p.k = {0.0, 1.0};
  p.v = {1.0, 3.0};
  const AttentionResult r = p.run(1.0, flashgen::Mask::kNone);
  const double e = std::exp(1.0);
  CHECK(near(r.out[0], (1.0 + 3.0 * e) / (1.0 + e)));
  CHECK(near(r.lse[0], std::log(1.0 + e)));

  // A scale of 2 doubles the logits.
  const AttentionResult scaled = p.run(2.0, flashgen::Mask::kNone);
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

  const AttentionResult br = p.run(1.0, flashgen::Mask::kCausal);  // row i sees j <= i - 1
  CHECK(br.out[0] == 0.0);
  CHECK(br.lse[0] == -inf);
  CHECK(br.out[1] == 2.0);
  CHECK(br.lse[1] == 0.0);
  CHECK(near(br.out[2], 3.0));
  CHECK(near(br.lse[2], std::log(2.0)));

  const AttentionResult tl = p.run(1.0, flashgen::Mask::kCausalTopLeft);  // row i sees j <= i
  CHECK(tl.out[0] == 2.0);
  CHECK(near(tl.out[1], 3.0));
  CHECK(near(tl.out[2], 3.0));

  const AttentionResult none = p.run(1.0, flashgen::Mask::kNone);
  for (int i = 0; i < 3; ++i) CHECK(near(none.out[i], 3.0));

  // seqlen_q < seqlen_k: bottom-right lets row 0 see seqlen_k - seqlen_q + 1 keys.
  CHECK(key_visible(flashgen::Mask::kCausal, 0, 5, 2, 7));
  CHECK_FALSE(key_visible(flashgen::Mask::kCausal, 0, 6, 2, 7));
  CHECK_FALSE(key_visible(flashgen::Mask::kCausalTopLeft, 0, 1, 2, 7));
  CHECK(key_visible(flashgen::Mask::kNone, 0, 6, 2, 7));
}

TEST_CASE("float64 reference applies a sliding window about the bottom-right diagonal", "[reference][window]") {
  // Scores q·k = 0, 1, 2 for keys 0, 1, 2 of every row; the window (1, 0) shows row i keys i - 1 and i.
  SmallProblem p;
  p.shape = AttentionShape{1, 3, 3, 1, 1, 1};
  p.q = {1.0, 1.0, 1.0};
  p.k = {0.0, 1.0, 2.0};
  p.v = {10.0, 20.0, 30.0};
  const double e = std::exp(1.0);
  const AttentionResult banded = p.run(1.0, flashgen::Mask::kSlidingWindow, {1, 0});
  CHECK(near(banded.out[0], 10.0));
  CHECK(near(banded.lse[0], 0.0));
  CHECK(near(banded.out[1], (10.0 + 20.0 * e) / (1.0 + e)));
  CHECK(near(banded.lse[1], std::log(1.0 + e)));
  CHECK(near(banded.out[2], (20.0 + 30.0 * e) / (1.0 + e)));
  CHECK(near(banded.lse[2], 1.0 + std::log(1.0 + e)));
  // The window (0, 1): row i sees keys i and i + 1.
  const AttentionResult ahead = p.run(1.0, flashgen::Mask::kSlidingWindow, {0, 1});
  CHECK(near(ahead.out[0], (10.0 + 20.0 * e) / (1.0 + e)));
  CHECK(near(ahead.out[2], 30.0));
  // Unbounded sides: (-1, -1) is no mask, (-1, 0) the bottom-right causal one; the window is unread under the
  // other masks.
  CHECK(p.run(1.0, flashgen::Mask::kSlidingWindow, {-1, -1}).out == p.run(1.0, flashgen::Mask::kNone).out);
  CHECK(p.run(1.0, flashgen::Mask::kSlidingWindow, {-1, 0}).out == p.run(1.0, flashgen::Mask::kCausal).out);
  CHECK(p.run(1.0, flashgen::Mask::kCausal, {0, 0}).out == p.run(1.0, flashgen::Mask::kCausal).out);

  // seqlen_q > seqlen_k: the diagonal is j = i - 1, so under the window (0, 0) row 0 sees no key (0 and -inf).
  p.shape = AttentionShape{1, 3, 2, 1, 1, 1};
  p.k = {0.0, 1.0};
  p.v = {10.0, 20.0};
  const AttentionResult diagonal = p.run(1.0, flashgen::Mask::kSlidingWindow, {0, 0});
  CHECK(diagonal.out == std::vector<double>{0.0, 10.0, 20.0});
  CHECK(diagonal.lse[0] == -std::numeric_limits<double>::infinity());
  CHECK(near(diagonal.lse[2], 1.0));
  // The row reference agrees with the whole one.
  const ReferenceRow row =
      attention_reference_row(p.shape, p.in(p.q, 3, 1), p.in(p.k, 2, 1), p.in(p.v, 2, 1), 1.0,
                              flashgen::Mask::kSlidingWindow, 0, 0, 2, {0.0, {0, 0}});
  CHECK(row.out == std::vector<double>{20.0});
}

TEST_CASE("float64 reference maps query heads to their key/value group", "[reference]") {
  // heads_q = 4, heads_kv = 2: query heads 0, 1 read kv head 0 and heads 2, 3 read kv head 1.
  SmallProblem p;
  p.shape = AttentionShape{1, 1, 1, 4, 2, 1};
  p.q = {1.0, 1.0, 1.0, 1.0};
  p.k = {0.0, 0.0};
  p.v = {10.0, 20.0};
  const AttentionResult r = p.run(1.0, flashgen::Mask::kNone);
  CHECK(r.out == std::vector<double>{10.0, 10.0, 20.0, 20.0});
}


TEST_CASE("visible pairs and FLOPs are counted exactly", "[reference]") {
  // The prefix count agrees with the per-pair rule of flashgen.h on every (i, j) of a few shapes.
  for (flashgen::Mask mask : {flashgen::Mask::kNone, flashgen::Mask::kCausal, flashgen::Mask::kCausalTopLeft}) {
    for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 2}, {2, 7}, {9, 9}}) {
      int64_t pairs = 0;
      for (int64_t i = 0; i < seqlen_q; ++i) {
        int64_t row = 0;
        for (int64_t j = 0; j < seqlen_k; ++j) row += key_visible(mask, i, j, seqlen_q, seqlen_k);
        CHECK(visible_key_count(mask, i, seqlen_q, seqlen_k) == row);
        pairs += row;
      }
      CHECK(visible_pairs(mask, seqlen_q, seqlen_k) == pairs);
    }
  }
  CHECK(visible_pairs(flashgen::Mask::kNone, 3, 2) == 6);
  CHECK(visible_pairs(flashgen::Mask::kCausal, 3, 2) == 0 + 1 + 2);           // bottom-right: row 0 sees nothing
  CHECK(visible_pairs(flashgen::Mask::kCausalTopLeft, 3, 2) == 1 + 2 + 2);  // top-left
  CHECK(visible_pairs(flashgen::Mask::kCausal, 2, 7) == 6 + 7);
  CHECK(visible_pairs(flashgen::Mask::kCausal, 4096, 4096) == 4096 * 4097 / 2);

  const AttentionShape shape{2, 3, 2, 4, 2, 64};
  CHECK(forward_flops(shape, flashgen::Mask::kNone) == 4.0 * 2 * 4 * 64 * 6);
  CHECK(forward_flops(shape, flashgen::Mask::kCausal) == 4.0 * 2 * 4 * 64 * 3);
}

TEST_CASE("a window's visible keys are a range about the diagonal, counted exactly", "[reference][window]") {
  const ReferenceWindow windows[] = {{-1, -1}, {-1, 0}, {0, 0}, {1, 0}, {3, 2}, {0, -1}, {100, 100}, {2, 5}};
  for (const ReferenceWindow& w : windows) {
    for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 2}, {2, 7}, {9, 9}}) {
      INFO("window (" << w.left << ", " << w.right << "), " << seqlen_q << " x " << seqlen_k);
      int64_t pairs = 0;
      for (int64_t i = 0; i < seqlen_q; ++i) {
        int64_t row = 0;
        const int64_t diagonal = i + seqlen_k - seqlen_q;
        for (int64_t j = 0; j < seqlen_k; ++j) {
          // flashgen.h's definition, pair by pair.
          const bool visible = (w.left < 0 || j >= diagonal - w.left) && (w.right < 0 || j <= diagonal + w.right);
          CHECK(key_visible(flashgen::Mask::kSlidingWindow, i, j, seqlen_q, seqlen_k, w) == visible);
          row += visible;
        }
        CHECK(visible_key_count(flashgen::Mask::kSlidingWindow, i, seqlen_q, seqlen_k, w) == row);
        pairs += row;
      }
      CHECK(visible_pairs(flashgen::Mask::kSlidingWindow, seqlen_q, seqlen_k, w) == pairs);
    }
  }
  // Row i of 4096 sees min(i, 127) + 1 keys under the causal window (127, 0).
  CHECK(visible_pairs(flashgen::Mask::kSlidingWindow, 4096, 4096, {127, 0}) == 128 * 129 / 2 + (4096 - 128) * 128);
  CHECK(forward_flops(AttentionShape{1, 3, 3, 2, 2, 8}, flashgen::Mask::kSlidingWindow, {1, 0}) == 4.0 * 2 * 8 * 5);
  CHECK(backward_flops(AttentionShape{1, 3, 3, 2, 2, 8}, flashgen::Mask::kSlidingWindow, {1, 0}) ==
        2.5 * 4 * 2 * 8 * 5);
}

TEST_CASE("a chunk keeps the keys of the diagonal's chunk under no mask, the causal mask and a window",
          "[reference][chunk]") {
  // Floor division by the chunk, negative diagonals included (sq > sk: those rows see nothing).
  auto chunk_of = [](int64_t x, int64_t c) { return (x >= 0 ? x : x - c + 1) / c; };
  for (const flashgen::Mask mask : {flashgen::Mask::kNone, flashgen::Mask::kCausal, flashgen::Mask::kSlidingWindow}) {
    for (const int64_t chunk : {1, 3, 4, 64}) {
      for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int64_t, int64_t>>{{9, 9}, {12, 5}, {3, 10}}) {
        const ReferenceWindow w{mask == flashgen::Mask::kSlidingWindow ? 2 : -1,
                                mask == flashgen::Mask::kSlidingWindow ? 1 : -1, chunk};
        INFO("mask " << static_cast<int>(mask) << ", chunk " << chunk << ", " << seqlen_q << " x " << seqlen_k);
        int64_t pairs = 0;
        for (int64_t i = 0; i < seqlen_q; ++i) {
          const int64_t diagonal = i + seqlen_k - seqlen_q;
          for (int64_t j = 0; j < seqlen_k; ++j) {
            const bool masked = mask == flashgen::Mask::kCausal               ? j > diagonal
                                : mask == flashgen::Mask::kSlidingWindow ? j < diagonal - 2 || j > diagonal + 1
                                                                       : false;
            const bool visible = !masked && chunk_of(j, chunk) == chunk_of(diagonal, chunk);
            CHECK(key_visible(mask, i, j, seqlen_q, seqlen_k, w) == visible);
            pairs += visible;
          }
        }
        CHECK(visible_pairs(mask, seqlen_q, seqlen_k, w) == pairs);
      }
    }
  }
  // Chunked causal over 4096 keys in chunks of 1024: each chunk a causal triangle.
  CHECK(visible_pairs(flashgen::Mask::kCausal, 4096, 4096, {-1, -1, 1024}) == 4 * (1024 * 1025 / 2));
  // The top-left causal mask takes no chunk.
  CHECK(visible_pairs(flashgen::Mask::kCausalTopLeft, 9, 9, {-1, -1, 2}) == 45);
}

TEST_CASE("row reference and 16-bit inputs agree with the float64 reference bit for bit", "[reference]") {
  // seqlen_q > seqlen_k so bottom-right causal leaves fully masked rows; GQA with two query heads a group.
  const AttentionShape shape{2, 11, 6, 4, 2, 24};
  uint32_t state = 2024;
  auto next = [&state]() {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>((state >> 8) % 4001) / 1000.0f - 2.0f;
  };
  // Each tensor as raw 16-bit bits in [b, h, s, d] memory and as contiguous [b, s, h, d] doubles.
  struct Tensor {
    StridedView bhsd;
    std::vector<uint16_t> bits;
    std::vector<double> values;
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    auto make = [&](int64_t seqlen, int64_t heads) {
      Tensor t;
      t.bhsd = StridedView::contiguous(shape.batch, seqlen, heads, shape.head_dim);
      t.bhsd.stride[0] = heads * seqlen * shape.head_dim;
      t.bhsd.stride[1] = shape.head_dim;
      t.bhsd.stride[2] = seqlen * shape.head_dim;
      t.bits.resize(static_cast<size_t>(t.bhsd.span()));
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t s = 0; s < seqlen; ++s)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < shape.head_dim; ++d) {
              const uint16_t bits = float_to_dtype_bits(next(), dtype);
              t.bits[static_cast<size_t>(t.bhsd.offset(b, s, h, d))] = bits;
              t.values.push_back(dtype_bits_to_float(bits, dtype));
            }
      return t;
    };
    const Tensor q = make(shape.seqlen_q, shape.heads_q);
    const Tensor k = make(shape.seqlen_k, shape.heads_kv);
    const Tensor v = make(shape.seqlen_k, shape.heads_kv);
    auto as_f64 = [&](const Tensor& t) {
      return HostInput::float64(t.values.data(),
                                StridedView::contiguous(shape.batch, t.bhsd.shape[1], t.bhsd.shape[2], shape.head_dim));
    };
    auto as_bits = [&](const Tensor& t) { return HostInput::bits16(t.bits.data(), dtype, t.bhsd); };
    CHECK(as_bits(k).at(1, 5, 1, 23) == as_f64(k).at(1, 5, 1, 23));

    for (flashgen::Mask mask : {flashgen::Mask::kNone, flashgen::Mask::kCausal, flashgen::Mask::kCausalTopLeft}) {
      const AttentionResult whole = attention_reference_f64(shape, as_f64(q), as_f64(k), as_f64(v), 0.2, mask);
      const AttentionResult from_bits = attention_reference_f64(shape, as_bits(q), as_bits(k), as_bits(v), 0.2, mask);
      CHECK(from_bits.out == whole.out);
      CHECK(from_bits.lse == whole.lse);
      std::vector<RowSample> samples;
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < shape.heads_q; ++h)
          for (int64_t i = 0; i < shape.seqlen_q; ++i) samples.push_back({b, h, i});
      // The same rows computed on three threads.
      const std::vector<ReferenceRow> threaded =
          attention_reference_rows(shape, as_bits(q), as_bits(k), as_bits(v), 0.2, mask, samples, 3);
      REQUIRE(threaded.size() == samples.size());
      int mismatched_rows = 0;
      for (size_t n = 0; n < samples.size(); ++n) {
        const auto [b, h, i] = samples[n];
        const ReferenceRow row = attention_reference_row(shape, as_bits(q), as_bits(k), as_bits(v), 0.2, mask, b, h, i);
        const double* want = whole.out.data() + ((b * shape.seqlen_q + i) * shape.heads_q + h) * shape.head_dim;
        const bool same = std::equal(row.out.begin(), row.out.end(), want) &&
                          row.lse == whole.lse[static_cast<size_t>((b * shape.heads_q + h) * shape.seqlen_q + i)];
        mismatched_rows += !same || threaded[n].out != row.out || threaded[n].lse != row.lse;
      }
      CHECK(mismatched_rows == 0);
    }
  }
  const std::vector<double> zeros(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim));
  const HostInput q_in = HostInput::float64(zeros.data(), StridedView::contiguous(2, 11, 4, 24));
  const HostInput kv_in = HostInput::float64(zeros.data(), StridedView::contiguous(2, 6, 2, 24));
  const ReferenceRow masked = attention_reference_row(shape, q_in, kv_in, kv_in, 1.0, flashgen::Mask::kCausal, 0, 0, 0);
  CHECK(masked.lse == -std::numeric_limits<double>::infinity());
  CHECK(masked.out == std::vector<double>(24, 0.0));
  CHECK_THROWS(attention_reference_row(shape, q_in, kv_in, kv_in, 1.0, flashgen::Mask::kNone, 0, 4, 0));
  CHECK_THROWS(attention_reference_rows(shape, q_in, kv_in, kv_in, 1.0, flashgen::Mask::kNone, {{0, 4, 0}}, 2));
  CHECK_THROWS(attention_reference_f64(shape, kv_in, kv_in, kv_in, 1.0, flashgen::Mask::kNone));
}

TEST_CASE("FP8 codes round to nearest even, saturate, and read back exactly", "[reference][fp8]") {
  CHECK(float_to_fp8_bits(1.0f, DType::kFloat8E4M3) == 0x38);
  CHECK(float_to_fp8_bits(-448.0f, DType::kFloat8E4M3) == 0xFE);
  CHECK(float_to_fp8_bits(1000.0f, DType::kFloat8E4M3) == 0x7E);             // saturates at 448
  CHECK(float_to_fp8_bits(1.0625f, DType::kFloat8E4M3) == 0x38);             // the tie 1 + 2^-4 rounds to even: 1
  CHECK(float_to_fp8_bits(1.1875f, DType::kFloat8E4M3) == 0x3A);             // the tie 1.125 + 2^-4: 1.25
  CHECK(float_to_fp8_bits(std::ldexp(1.0f, -9), DType::kFloat8E4M3) == 0x01);  // smallest subnormal
  CHECK(float_to_fp8_bits(std::ldexp(1.0f, -10), DType::kFloat8E4M3) == 0x00);  // its half: a tie to 0
  CHECK(float_to_fp8_bits(std::nanf(""), DType::kFloat8E4M3) == 0x7F);
  CHECK(float_to_fp8_bits(1.0f, DType::kFloat8E5M2) == 0x3C);
  CHECK(float_to_fp8_bits(1e6f, DType::kFloat8E5M2) == 0x7B);  // saturates at 57344
  // Every finite code is its own value's code.
  for (DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    int mismatches = 0;
    for (int code = 0; code < 256; ++code) {
      const double value = fp8_bits_to_double(static_cast<uint8_t>(code), fp8);
      if (!std::isfinite(value)) continue;
      mismatches += float_to_fp8_bits(static_cast<float>(value), fp8) != code;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("round_p_to_e4m3 rounds P · 2^8 to e4m3, the finest the FP8 forward's kernels hand P to P·V", "[reference][fp8]") {
  CHECK(round_p_to_e4m3(1.0) == 1.0);  // the row's max: 256, exact
  CHECK(round_p_to_e4m3(0.0) == 0.0);
  CHECK(round_p_to_e4m3(0.3) == 80.0 / 256);  // 76.8 in [64, 128), steps of 8
  CHECK(round_p_to_e4m3(std::ldexp(1.0, -17)) == std::ldexp(1.0, -17));  // 2^-9, e4m3's smallest subnormal
  CHECK(round_p_to_e4m3(std::ldexp(1.0, -18)) == 0.0);                  // half of it: a tie to 0
  CHECK(round_p_to_e4m3(std::ldexp(1.0, -18) * 1.01) == std::ldexp(1.0, -17));
  // The relative error of a normal e4m3 value is at most 2^-4.
  for (double p = 1.0 / 64; p <= 1.0; p *= 1.0137) {
    CHECK(std::fabs(round_p_to_e4m3(p) - p) <= std::ldexp(p, -4));
  }
}

TEST_CASE("FP8 references read codes times their descale; with P exact they are the float64 rows bit for bit",
          "[reference][fp8]") {
  // GQA with two query heads a group, seqlen_q > seqlen_k so bottom-right causal leaves rows that see no key.
  const AttentionShape shape{2, 9, 7, 4, 2, 32};
  uint32_t state = 88;
  auto next_code = [&state](DType fp8) {
    state = state * 1664525u + 1013904223u;
    const float value = static_cast<float>(static_cast<int>((state >> 8) % 601) - 300);  // about e4m3's range
    return float_to_fp8_bits(value, fp8);
  };
  for (DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    // Codes in [b, h, s, d] memory (bhsd), and the values they stand for as contiguous [b, s, h, d] doubles.
    struct Tensor {
      StridedView bhsd;
      std::vector<uint8_t> codes;
      std::vector<double> values;
      double descale = 0;
    };
    auto make = [&](int64_t seqlen, int64_t heads, double descale) {
      Tensor t;
      t.descale = descale;
      t.bhsd = StridedView::contiguous(shape.batch, seqlen, heads, shape.head_dim);
      t.bhsd.stride[0] = heads * seqlen * shape.head_dim;
      t.bhsd.stride[1] = shape.head_dim;
      t.bhsd.stride[2] = seqlen * shape.head_dim;
      t.codes.resize(static_cast<size_t>(t.bhsd.span()));
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t s = 0; s < seqlen; ++s)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < shape.head_dim; ++d) {
              const uint8_t code = next_code(fp8);
              t.codes[static_cast<size_t>(t.bhsd.offset(b, s, h, d))] = code;
              t.values.push_back(fp8_bits_to_double(code, fp8) * descale);
            }
      return t;
    };
    // fp32 descales, as a call's: 4 significant bits times 24 are exact in double.
    const Tensor q = make(shape.seqlen_q, shape.heads_q, static_cast<float>(1.2 / 150));
    const Tensor k = make(shape.seqlen_k, shape.heads_kv, static_cast<float>(1.35 / 150));
    const Tensor v = make(shape.seqlen_k, shape.heads_kv, static_cast<float>(1.5 / 150));
    auto as_codes = [&](const Tensor& t) { return HostInput::fp8_codes(t.codes.data(), fp8, t.bhsd, t.descale); };
    auto as_f64 = [&](const Tensor& t) {
      return HostInput::float64(t.values.data(),
                                StridedView::contiguous(shape.batch, t.bhsd.shape[1], t.bhsd.shape[2], shape.head_dim));
    };
    CHECK(as_codes(k).at(1, 5, 1, 23) == as_f64(k).at(1, 5, 1, 23));
    const uint8_t code = k.codes[size_t(k.bhsd.offset(1, 5, 1, 23))];
    CHECK(as_codes(k).at(1, 5, 1, 23) == fp8_bits_to_double(code, fp8) * k.descale);

    ReferenceVariant window_cap_sinks(20.0, {3, 1, 0});
    window_cap_sinks.sinks = {1.f, -std::numeric_limits<float>::infinity(), 0.f, 3.f};
    const struct {
      flashgen::Mask mask;
      ReferenceVariant variant;
    } cases[] = {{flashgen::Mask::kNone, {}},
                 {flashgen::Mask::kCausal, {}},
                 {flashgen::Mask::kCausalTopLeft, {}},
                 {flashgen::Mask::kSlidingWindow, window_cap_sinks}};
    for (const auto& [mask, variant] : cases) {
      std::vector<RowSample> samples;
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < shape.heads_q; ++h)
          for (int64_t i = 0; i < shape.seqlen_q; ++i) samples.push_back({b, h, i});
      const double scale = 1.0 / std::sqrt(32.0);
      const std::vector<Fp8ReferenceRow> threaded =
          attention_reference_rows_fp8(shape, as_codes(q), as_codes(k), as_codes(v), scale, mask, samples, 3, variant);
      REQUIRE(threaded.size() == samples.size());
      int mismatched = 0, rounded_apart = 0, outside_bound = 0, magnitude_wrong = 0;
      for (size_t n = 0; n < samples.size(); ++n) {
        const auto [b, h, i] = samples[n];
        const ReferenceRow want =
            attention_reference_row(shape, as_f64(q), as_f64(k), as_f64(v), scale, mask, b, h, i, variant);
        const Fp8ReferenceRow row =
            attention_reference_row_fp8(shape, as_codes(q), as_codes(k), as_codes(v), scale, mask, b, h, i, variant);
        mismatched += row.exact.out != want.out || row.exact.lse != want.lse || threaded[n].exact.out != want.out ||
                      threaded[n].out_p_rounded != row.out_p_rounded || threaded[n].qk_magnitude != row.qk_magnitude;
        // P rounded to e4m3 moves each p by at most 2^-4 of it, or 2^-18 below e4m3's normal range, and the row's
        // sum (at least the max's 1) divides the change: |out_p - out| <= (2^-4 + keys 2^-18) max |v|.
        const KeyRange keys = visible_keys(mask, i, shape.seqlen_q, shape.seqlen_k, variant.window);
        double max_v = 0, magnitude = 0;
        for (int64_t j = keys.first; j < keys.end; ++j) {
          double size = 0;
          for (int64_t x = 0; x < shape.head_dim; ++x) {
            max_v = std::max(max_v, std::fabs(as_f64(v).at(b, j, h / 2, x)));
            size += std::fabs(as_f64(q).at(b, i, h, x) * as_f64(k).at(b, j, h / 2, x));
          }
          magnitude = std::max(magnitude, size * scale);
        }
        const double bound = (std::ldexp(1.0, -4) + double(keys.count()) * std::ldexp(1.0, -18)) * max_v;
        for (size_t x = 0; x < row.out_p_rounded.size(); ++x) {
          const double apart = std::fabs(row.out_p_rounded[x] - row.exact.out[x]);
          rounded_apart += apart > 0;
          outside_bound += apart > bound;
        }
        magnitude_wrong += std::fabs(row.qk_magnitude - magnitude) > 1e-12 * magnitude;
        if (keys.count() == 0) {  // a row that sees no key: out 0 both ways, no magnitude
          CHECK(row.out_p_rounded == std::vector<double>(32, 0.0));
          CHECK(row.qk_magnitude == 0.0);
        }
      }
      CHECK(mismatched == 0);
      CHECK(outside_bound == 0);
      CHECK(magnitude_wrong == 0);
      CHECK(rounded_apart > 0);  // the rounding is there
    }
  }
  CHECK_THROWS(HostInput::fp8_codes(nullptr, DType::kFloat16, StridedView::contiguous(1, 1, 1, 16), 1.0));
}
