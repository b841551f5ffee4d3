// The host float64 attention reference declared in reference.hpp: mask and FLOP counting, the float64 forward (whole, one query row, or sampled rows on several threads; an FP8 forward's rows with
// P rounded too) and backward.
#include "check/reference.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "flashgen/error.hpp"

namespace flashgen {
namespace {

// Buffers of one row's computation, kept across the rows of a problem.
struct RowScratch {
  std::vector<double> q_row;   // (head_dim), when converted
  std::vector<double> kv_row;  // (the larger head dim): the key or value row in use, when converted
  std::vector<double> scores;  // (seqlen_k)
  std::vector<double> acc;     // (value_dim)
  std::vector<double> acc_p_rounded;  // (value_dim): an FP8 row's P·V with P rounded

  RowScratch(const AttentionShape& shape, int64_t value_dim)
      : q_row(static_cast<size_t>(shape.head_dim)),
        kv_row(static_cast<size_t>(std::max(shape.head_dim, value_dim))),
        scores(static_cast<size_t>(shape.seqlen_k)),
        acc(static_cast<size_t>(value_dim)),
        acc_p_rounded(static_cast<size_t>(value_dim)) {}
};

// What an FP8 row computes besides the exact one (Fp8ReferenceRow): out with P rounded (v's head dim of values, 0
// as the caller set them for a row that sees no key) and the largest scaled sum of |q_x k_x|.
struct Fp8RowParts {
  double* out_p_rounded = nullptr;
  double* qk_magnitude = nullptr;
};

// A score s = q·k · scale as the softmax takes it: capped to softcap · tanh(s / softcap) when softcap > 0.
double capped_score(double s, double softcap) { return softcap > 0 ? softcap * std::tanh(s / softcap) : s; }

// Throws Error(kInvalidArgument) unless ALiBi's slopes, when given, hold one per (batch, query head), and the
// sinks, when given, one per query head.
void require_reference_variant(const AttentionShape& shape, const ReferenceVariant& variant) {
  FLASHGEN_REQUIRE(variant.sinks.empty() || static_cast<int64_t>(variant.sinks.size()) == shape.heads_q,
                   "reference: sinks must hold one logit per query head (" + std::to_string(shape.heads_q) +
                       "), got " + std::to_string(variant.sinks.size()));
  if (variant.alibi_slopes.empty()) return;
  const int64_t needed = (shape.batch - 1) * variant.alibi_batch_stride + shape.heads_q;
  FLASHGEN_REQUIRE(variant.alibi_batch_stride >= 0 && static_cast<int64_t>(variant.alibi_slopes.size()) >= needed,
                   "reference: ALiBi slopes must hold one per batch entry and query head (" + std::to_string(needed) +
                       "), got " + std::to_string(variant.alibi_slopes.size()));
}

// Throws Error(kInvalidArgument) unless the row is one of the problem's.
void require_row(const AttentionShape& shape, const RowSample& r) {
  FLASHGEN_REQUIRE(r.batch >= 0 && r.batch < shape.batch && r.head >= 0 && r.head < shape.heads_q && r.row >= 0 &&
                       r.row < shape.seqlen_q,
                   "reference: (batch, head, row) outside the problem");
}

// ALiBi's bias of (query i, key j) in (batch b, query head h): 0 without slopes.
double alibi_bias(const ReferenceVariant& variant, Mask mask, const AttentionShape& shape, int64_t b,
                  int64_t h, int64_t i, int64_t j) {
  if (variant.alibi_slopes.empty()) return 0.0;
  const int64_t diagonal = mask == Mask::kCausalTopLeft ? i : i + shape.seqlen_k - shape.seqlen_q;
  const double slope = variant.alibi_slopes.at(static_cast<size_t>(b * variant.alibi_batch_stride + h));
  return -slope * static_cast<double>(std::llabs(diagonal - j));
}

// Head h's sink logit, -inf without sinks (a sink of -inf is none).
double sink_of(const ReferenceVariant& variant, int64_t h) {
  return variant.sinks.empty() ? -std::numeric_limits<double>::infinity()
                               : static_cast<double>(variant.sinks.at(static_cast<size_t>(h)));
}

// Query row i of (batch b, head h) in float64 into out_row (v's head dim of values) and *lse. A fully masked row
// leaves out_row as the caller set it (0), and *lse too (-inf) unless the head has a sink (lse = the sink). With fp8,
// also its parts (the exact row's arithmetic is the same with or without them).
void reference_row_f64(const AttentionShape& shape, const HostInput& q, const HostInput& k, const HostInput& v,
                       double scale, Mask mask, const ReferenceVariant& variant, int64_t b, int64_t h,
                       int64_t i, RowScratch& scratch, double* out_row, double* lse,
                       const Fp8RowParts* fp8 = nullptr) {
  const int64_t d_count = shape.head_dim;
  const int64_t dv_count = v.view.shape[3];
  const int64_t hk = shape.kv_head(h);
  const KeyRange keys = visible_keys(mask, i, shape.seqlen_q, shape.seqlen_k, variant.window);
  const double sink = sink_of(variant, h);
  if (keys.count() == 0) {
    if (sink > -std::numeric_limits<double>::infinity()) *lse = sink;
    return;
  }
  const double* q_row = q.row(b, i, h, scratch.q_row.data());
  double* scores = scratch.scores.data();
  double* acc = scratch.acc.data();

  double row_max = -std::numeric_limits<double>::infinity();
  for (int64_t j = keys.first; j < keys.end; ++j) {
    if (variant.user_mask && !variant.user_mask(b, h, i, j)) {
      scores[j] = -std::numeric_limits<double>::infinity();
      continue;
    }
    const double* k_row = k.row(b, j, hk, scratch.kv_row.data());
    double dot = 0.0;
    for (int64_t d = 0; d < d_count; ++d) dot += q_row[d] * k_row[d];
    if (fp8 != nullptr) {
      double size = 0.0;
      for (int64_t d = 0; d < d_count; ++d) size += std::fabs(q_row[d] * k_row[d]);
      *fp8->qk_magnitude = std::max(*fp8->qk_magnitude, size * scale);
    }
    scores[j] = capped_score(dot * scale, variant.softcap) + alibi_bias(variant, mask, shape, b, h, i, j);
    if (variant.user_score) scores[j] = variant.user_score(scores[j], b, h, i, j);
    row_max = std::max(row_max, scores[j]);
  }
  row_max = std::max(row_max, sink);
  if (row_max == -std::numeric_limits<double>::infinity()) return;  // a user mask hid every key, and no sink
  double row_sum = std::exp(sink - row_max);  // 0 without a sink
  std::fill(acc, acc + dv_count, 0.0);
  double* acc_p_rounded = scratch.acc_p_rounded.data();
  if (fp8 != nullptr) std::fill(acc_p_rounded, acc_p_rounded + dv_count, 0.0);
  for (int64_t j = keys.first; j < keys.end; ++j) {
    const double p = std::exp(scores[j] - row_max);
    row_sum += p;
    const double* v_row = v.row(b, j, hk, scratch.kv_row.data());
    for (int64_t d = 0; d < dv_count; ++d) acc[d] += p * v_row[d];
    if (fp8 != nullptr) {
      const double p_rounded = round_p_to_e4m3(p);
      for (int64_t d = 0; d < dv_count; ++d) acc_p_rounded[d] += p_rounded * v_row[d];
    }
  }
  for (int64_t d = 0; d < dv_count; ++d) out_row[d] = acc[d] / row_sum;
  if (fp8 != nullptr) {
    for (int64_t d = 0; d < dv_count; ++d) fp8->out_p_rounded[d] = acc_p_rounded[d] / row_sum;
  }
  *lse = row_max + std::log(row_sum);
}

// fn(i) for every i in [0, count), on up to `threads` threads (the calling one among them). fn must not throw.
template <class Fn>
void for_each_row(size_t count, int threads, const Fn& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < count; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
}

}  // namespace

namespace {

// Every code's value (fp8_bits_to_double), for reading FP8 inputs a row at a time.
const std::array<double, 256>& fp8_values(HostInput::Element element) {
  static const std::array<std::array<double, 256>, 2> tables = [] {
    std::array<std::array<double, 256>, 2> t{};
    for (int code = 0; code < 256; ++code) {
      t[0][size_t(code)] = fp8_bits_to_double(static_cast<uint8_t>(code), DType::kFloat8E4M3);
      t[1][size_t(code)] = fp8_bits_to_double(static_cast<uint8_t>(code), DType::kFloat8E5M2);
    }
    return t;
  }();
  return tables[element == HostInput::Element::kFloat8E4M3 ? 0 : 1];
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Problems and their masks.

int64_t StridedView::span() const {
  if (elements() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) last += (shape[i] - 1) * stride[i];
  return last + 1;
}

StridedView StridedView::contiguous(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  StridedView view;
  view.shape[0] = batch;
  view.shape[1] = seqlen;
  view.shape[2] = heads;
  view.shape[3] = head_dim;
  view.stride[3] = 1;
  view.stride[2] = head_dim;
  view.stride[1] = heads * head_dim;
  view.stride[0] = seqlen * heads * head_dim;
  return view;
}

double effective_softmax_scale(float softmax_scale, int64_t head_dim) {
  return softmax_scale > 0.0f ? static_cast<double>(softmax_scale)
                              : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

KeyRange visible_keys(Mask mask, int64_t i, int64_t seqlen_q, int64_t seqlen_k, ReferenceWindow window) {
  const int64_t diagonal = i + seqlen_k - seqlen_q;  // the bottom-right alignment's
  int64_t first = 0, last = seqlen_k - 1;            // the first and last visible keys
  if (mask == Mask::kCausal) last = diagonal;
  if (mask == Mask::kCausalTopLeft) last = i;
  if (mask == Mask::kSlidingWindow) {
    if (window.left >= 0) first = diagonal - window.left;
    if (window.right >= 0) last = diagonal + window.right;
  }
  if (window.chunk > 0 && mask != Mask::kCausalTopLeft) {
    const int64_t chunk_first = (diagonal >= 0 ? diagonal : diagonal - window.chunk + 1) / window.chunk * window.chunk;
    first = std::max(first, chunk_first);
    last = std::min(last, chunk_first + window.chunk - 1);
  }
  KeyRange keys;
  keys.first = std::clamp<int64_t>(first, 0, seqlen_k);
  keys.end = std::clamp<int64_t>(last + 1, keys.first, seqlen_k);
  return keys;
}

int64_t visible_pairs(Mask mask, int64_t seqlen_q, int64_t seqlen_k, ReferenceWindow window) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < seqlen_q; ++i) pairs += visible_key_count(mask, i, seqlen_q, seqlen_k, window);
  return pairs;
}

std::vector<float> standard_alibi_slopes(int64_t heads_q) {
  std::vector<float> slopes(static_cast<size_t>(std::max<int64_t>(heads_q, 0)));
  for (size_t h = 0; h < slopes.size(); ++h) {
    slopes[h] = static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(heads_q)));
  }
  return slopes;
}

ReferenceVariant variant_of(const AttentionProblem& problem) {
  ReferenceVariant variant{problem.softcap, window_of(problem), {}, 0};
  if (problem.alibi) variant.alibi_slopes = standard_alibi_slopes(problem.shape.heads_q);
  return variant;
}

double forward_flops(const AttentionShape& shape, Mask mask, ReferenceWindow window) {
  // QKᵀ over the keys' head dim and PV over the values', 2 FLOPs a multiply-add each.
  return 2.0 * static_cast<double>(shape.batch * shape.heads_q * (shape.head_dim + shape.value_dim())) *
         static_cast<double>(visible_pairs(mask, shape.seqlen_q, shape.seqlen_k, window));
}

// ---------------------------------------------------------------------------------------------------
// References.

HostInput HostInput::fp8_codes(const uint8_t* codes, DType fp8, const StridedView& view, double descale) {
  FLASHGEN_REQUIRE(is_fp8(fp8), std::string("HostInput::fp8_codes: an FP8 type is e4m3 or e5m2, got ") +
                                    dtype_name(fp8));
  return HostInput{codes, fp8 == DType::kFloat8E4M3 ? Element::kFloat8E4M3 : Element::kFloat8E5M2, view, descale};
}

double HostInput::at(int64_t b, int64_t s, int64_t h, int64_t d) const {
  const int64_t offset = view.offset(b, s, h, d);
  switch (element) {
    case Element::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(data)[offset]);
    case Element::kBFloat16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(data)[offset]);
    case Element::kFloat8E4M3:
    case Element::kFloat8E5M2:
      return fp8_values(element)[static_cast<const uint8_t*>(data)[offset]] * descale;
    case Element::kFloat64:
      break;
  }
  return static_cast<const double*>(data)[offset];
}

const double* HostInput::row(int64_t b, int64_t s, int64_t h, double* scratch) const {
  const int64_t base = view.offset(b, s, h, 0);
  const int64_t step = view.stride[3];
  const int64_t count = view.shape[3];
  switch (element) {
    case Element::kFloat16: {
      const uint16_t* bits = static_cast<const uint16_t*>(data) + base;
      for (int64_t d = 0; d < count; ++d) scratch[d] = half_bits_to_float(bits[d * step]);
      return scratch;
    }
    case Element::kBFloat16: {
      const uint16_t* bits = static_cast<const uint16_t*>(data) + base;
      for (int64_t d = 0; d < count; ++d) scratch[d] = bf16_bits_to_float(bits[d * step]);
      return scratch;
    }
    case Element::kFloat8E4M3:
    case Element::kFloat8E5M2: {
      const uint8_t* codes = static_cast<const uint8_t*>(data) + base;
      const std::array<double, 256>& values = fp8_values(element);
      for (int64_t d = 0; d < count; ++d) scratch[d] = values[codes[d * step]] * descale;
      return scratch;
    }
    case Element::kFloat64:
      break;
  }
  const double* values = static_cast<const double*>(data) + base;
  if (step == 1) return values;
  for (int64_t d = 0; d < count; ++d) scratch[d] = values[d * step];
  return scratch;
}

void require_reference_inputs(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                              const HostInput& v) {
  FLASHGEN_REQUIRE(shape.heads_kv > 0 && shape.heads_q % shape.heads_kv == 0,
                   "reference: heads_q must be a positive multiple of heads_kv");
  const int64_t want_q[4] = {shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim};
  const int64_t want_kv[4] = {shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim};
  for (int i = 0; i < 4; ++i) {
    FLASHGEN_REQUIRE(q.view.shape[i] == want_q[i], "reference: q view does not match the problem shape");
    FLASHGEN_REQUIRE(k.view.shape[i] == want_kv[i], "reference: k view does not match the problem shape");
    FLASHGEN_REQUIRE(v.view.shape[i] == want_kv[i] || (i == 3 && v.view.shape[3] > 0),
                     "reference: v view does not match the problem shape");
  }
}

AttentionResult attention_reference_f64(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                        const HostInput& v, double scale, Mask mask,
                                        const ReferenceVariant& variant) {
  require_reference_inputs(shape, q, k, v);
  require_reference_variant(shape, variant);
  const int64_t d_count = v.view.shape[3];
  AttentionResult result;
  result.out.assign(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * d_count), 0.0);
  result.lse.assign(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q),
                    -std::numeric_limits<double>::infinity());
  RowScratch scratch(shape, d_count);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        double* out_row = result.out.data() + ((b * shape.seqlen_q + i) * shape.heads_q + h) * d_count;
        double* lse = result.lse.data() + (b * shape.heads_q + h) * shape.seqlen_q + i;
        reference_row_f64(shape, q, k, v, scale, mask, variant, b, h, i, scratch, out_row, lse);
      }
    }
  }
  return result;
}

ReferenceRow attention_reference_row(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                     const HostInput& v, double scale, Mask mask, int64_t batch,
                                     int64_t head, int64_t row, const ReferenceVariant& variant) {
  require_reference_inputs(shape, q, k, v);
  require_reference_variant(shape, variant);
  require_row(shape, {batch, head, row});
  ReferenceRow result;
  result.out.assign(static_cast<size_t>(v.view.shape[3]), 0.0);
  result.lse = -std::numeric_limits<double>::infinity();
  RowScratch scratch(shape, v.view.shape[3]);
  reference_row_f64(shape, q, k, v, scale, mask, variant, batch, head, row, scratch, result.out.data(),
                    &result.lse);
  return result;
}

namespace {

// row_of(sample) for each of rows on up to `threads` threads, the inputs, variant and rows checked here first so that
// no worker thread throws.
template <class Row, class RowOf>
std::vector<Row> sampled_rows(const AttentionShape& shape, const HostInput& q, const HostInput& k, const HostInput& v,
                              const std::vector<RowSample>& rows, int threads, const ReferenceVariant& variant,
                              const RowOf& row_of) {
  require_reference_inputs(shape, q, k, v);
  require_reference_variant(shape, variant);
  for (const RowSample& r : rows) require_row(shape, r);
  std::vector<Row> reference(rows.size());
  for_each_row(rows.size(), threads, [&](size_t i) { reference[i] = row_of(rows[i]); });
  return reference;
}

}  // namespace

std::vector<ReferenceRow> attention_reference_rows(const AttentionShape& shape, const HostInput& q,
                                                   const HostInput& k, const HostInput& v, double scale,
                                                   Mask mask, const std::vector<RowSample>& rows,
                                                   int threads, const ReferenceVariant& variant) {
  return sampled_rows<ReferenceRow>(shape, q, k, v, rows, threads, variant, [&](const RowSample& r) {
    return attention_reference_row(shape, q, k, v, scale, mask, r.batch, r.head, r.row, variant);
  });
}

Fp8ReferenceRow attention_reference_row_fp8(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                            const HostInput& v, double scale, Mask mask, int64_t batch, int64_t head,
                                            int64_t row, const ReferenceVariant& variant) {
  require_reference_inputs(shape, q, k, v);
  require_reference_variant(shape, variant);
  require_row(shape, {batch, head, row});
  const size_t dv_count = static_cast<size_t>(v.view.shape[3]);
  Fp8ReferenceRow result;
  result.exact.out.assign(dv_count, 0.0);
  result.exact.lse = -std::numeric_limits<double>::infinity();
  result.out_p_rounded.assign(dv_count, 0.0);
  RowScratch scratch(shape, v.view.shape[3]);
  const Fp8RowParts parts{result.out_p_rounded.data(), &result.qk_magnitude};
  reference_row_f64(shape, q, k, v, scale, mask, variant, batch, head, row, scratch, result.exact.out.data(),
                    &result.exact.lse, &parts);
  return result;
}

std::vector<Fp8ReferenceRow> attention_reference_rows_fp8(const AttentionShape& shape, const HostInput& q,
                                                          const HostInput& k, const HostInput& v, double scale,
                                                          Mask mask, const std::vector<RowSample>& rows, int threads,
                                                          const ReferenceVariant& variant) {
  return sampled_rows<Fp8ReferenceRow>(shape, q, k, v, rows, threads, variant, [&](const RowSample& r) {
    return attention_reference_row_fp8(shape, q, k, v, scale, mask, r.batch, r.head, r.row, variant);
  });
}

AttentionGradients attention_backward_reference_f64(const AttentionShape& shape, const HostInput& q,
                                                    const HostInput& k, const HostInput& v, const HostInput& dout,
                                                    double scale, Mask mask,
                                                    const ReferenceVariant& variant) {
  require_reference_inputs(shape, q, k, v);
  require_reference_variant(shape, variant);
  const int64_t d = shape.head_dim;
  const int64_t dv = v.view.shape[3];
  FLASHGEN_REQUIRE(dout.view.shape[0] == shape.batch && dout.view.shape[1] == shape.seqlen_q &&
                       dout.view.shape[2] == shape.heads_q && dout.view.shape[3] == dv,
                   "dout: shape must be [batch, seqlen_q, heads_q, v's head dim]");
  AttentionGradients grads;
  grads.dq.assign(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * d), 0.0);
  grads.dk.assign(static_cast<size_t>(shape.batch * shape.seqlen_k * shape.heads_kv * d), 0.0);
  grads.dv.assign(static_cast<size_t>(shape.batch * shape.seqlen_k * shape.heads_kv * dv), 0.0);
  if (!variant.sinks.empty()) grads.dsinks.assign(static_cast<size_t>(shape.heads_q), 0.0);
  const StridedView q_out = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, d);
  const StridedView kv_out = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, d);
  const StridedView v_out = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, dv);

  std::vector<double> q_scratch(d), k_scratch(d), v_scratch(dv), do_scratch(dv), out(dv), p, cap_slope;
  for (int64_t b = 0; b < shape.batch; ++b)
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = shape.kv_head(h);
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const KeyRange keys = visible_keys(mask, i, shape.seqlen_q, shape.seqlen_k, variant.window);
        if (keys.count() == 0) continue;
        const double* qi = q.row(b, i, h, q_scratch.data());
        const double* doi = dout.row(b, i, h, do_scratch.data());
        // P of row i, exactly as the forward reference forms it (key j's at j - keys.first).
        p.assign(static_cast<size_t>(keys.count()), 0.0);
        cap_slope.assign(static_cast<size_t>(keys.count()), 1.0);  // d capped_score / d s
        double row_max = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const size_t at = static_cast<size_t>(j - keys.first);
          if (variant.user_mask && !variant.user_mask(b, h, i, j)) {
            p[at] = -std::numeric_limits<double>::infinity();
            continue;
          }
          const double* kj = k.row(b, j, hk, k_scratch.data());
          double s = 0;
          for (int64_t x = 0; x < d; ++x) s += qi[x] * kj[x];
          const double cap = variant.softcap;
          p[at] = capped_score(s * scale, cap);
          if (cap > 0) cap_slope[at] = 1 - (p[at] / cap) * (p[at] / cap);
          p[at] += alibi_bias(variant, mask, shape, b, h, i, j);
          if (variant.user_score) {
            p[at] = variant.user_score(p[at], b, h, i, j);
            if (variant.user_score_grad) cap_slope[at] *= variant.user_score_grad(p[at], b, h, i, j);
          }
          row_max = std::max(row_max, p[at]);
        }
        const double sink = sink_of(variant, h);
        row_max = std::max(row_max, sink);
        if (row_max == -std::numeric_limits<double>::infinity()) continue;  // every key hidden, no sink
        double sum = std::exp(sink - row_max);  // 0 without a sink
        for (double& pj : p) sum += (pj = std::exp(pj - row_max));
        std::fill(out.begin(), out.end(), 0.0);
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const size_t at = static_cast<size_t>(j - keys.first);
          p[at] /= sum;
          const double* vj = v.row(b, j, hk, v_scratch.data());
          for (int64_t x = 0; x < dv; ++x) out[x] += p[at] * vj[x];
        }
        double dsum = 0;  // D = rowsum(dO ∘ O)
        for (int64_t x = 0; x < dv; ++x) dsum += doi[x] * out[x];
        if (!grads.dsinks.empty()) grads.dsinks[static_cast<size_t>(h)] -= std::exp(sink - row_max) / sum * dsum;
        double* dqi = &grads.dq[static_cast<size_t>(q_out.offset(b, i, h, 0))];
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const size_t at = static_cast<size_t>(j - keys.first);
          const double* kj = k.row(b, j, hk, k_scratch.data());
          const double* vj = v.row(b, j, hk, v_scratch.data());
          double dp = 0;
          for (int64_t x = 0; x < dv; ++x) dp += doi[x] * vj[x];
          const double ds = p[at] * (dp - dsum) * cap_slope[at];
          double* dkj = &grads.dk[static_cast<size_t>(kv_out.offset(b, j, hk, 0))];
          double* dvj = &grads.dv[static_cast<size_t>(v_out.offset(b, j, hk, 0))];
          for (int64_t x = 0; x < d; ++x) {
            dqi[x] += scale * ds * kj[x];
            dkj[x] += scale * ds * qi[x];
          }
          for (int64_t x = 0; x < dv; ++x) dvj[x] += p[at] * doi[x];
        }
      }
    }
  return grads;
}

double backward_flops(const AttentionShape& shape, Mask mask, ReferenceWindow window) {
  return 2.5 * forward_flops(shape, mask, window);
}

}  // namespace flashgen
