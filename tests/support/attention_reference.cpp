// The test side of attention numerics declared in attention_reference.hpp: input data, the naive
// same-dtype forward, the whole-output checks, the out-of-bounds write scan, check_forward.
#include "support/attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "api/from_c.hpp"
#include "flashgen/error.hpp"

namespace flashgen::test {

// ---------------------------------------------------------------------------------------------------
// Input data.

double Rng::normal() {
  const double u1 = (static_cast<double>(engine_()) + 1.0) / 4294967297.0;  // (0, 1]
  const double u2 = static_cast<double>(engine_()) / 4294967296.0;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::vector<double> normal_values(Rng& rng, int64_t count, flashgen_dtype dtype) {
  std::vector<double> values(static_cast<size_t>(count));
  for (double& value : values) value = round_to_dtype(static_cast<float>(rng.normal()), from_c(dtype));
  return values;
}

void store_values(const std::vector<double>& values, const StridedView& view, int64_t base, flashgen_dtype dtype,
                  std::vector<uint16_t>& storage) {
  FLASHGEN_REQUIRE(static_cast<int64_t>(values.size()) == view.elements(),
                   "store_values: " + std::to_string(values.size()) + " values for a view of " +
                       std::to_string(view.elements()) + " elements");
  FLASHGEN_REQUIRE(base >= 0 && base + view.span() <= static_cast<int64_t>(storage.size()),
                   "store_values: view exceeds storage");
  size_t index = 0;
  for (int64_t b = 0; b < view.shape[0]; ++b)
    for (int64_t s = 0; s < view.shape[1]; ++s)
      for (int64_t h = 0; h < view.shape[2]; ++h)
        for (int64_t d = 0; d < view.shape[3]; ++d) {
          const double value = values[index++];
          const uint16_t bits = float_to_dtype_bits(static_cast<float>(value), from_c(dtype));
          FLASHGEN_REQUIRE(static_cast<double>(dtype_bits_to_float(bits, from_c(dtype))) == value,
                           "store_values: " + format_number(value) + " is not a " + dtype_label(dtype) + " value");
          storage[static_cast<size_t>(base + view.offset(b, s, h, d))] = bits;
        }
}

// ---------------------------------------------------------------------------------------------------
// Labels.

const char* dtype_label(flashgen_dtype dtype) { return dtype == FLASHGEN_BFLOAT16 ? "bf16" : "fp16"; }

const char* mask_label(Mask mask) {
  switch (mask) {
    case Mask::kCausal:
      return "causal";
    case Mask::kCausalTopLeft:
      return "causal_top_left";
    case Mask::kSlidingWindow:
      return "window";
    default:
      return "none";
  }
}

const char* mask_label(flashgen_mask mask) { return mask_label(from_c(mask)); }

// ---------------------------------------------------------------------------------------------------
// Naive same-dtype reference.

AttentionResult attention_reference_naive(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                          const HostInput& v, double scale, Mask mask,
                                          flashgen_dtype dtype) {
  require_reference_inputs(shape, q, k, v);
  const int64_t d_count = shape.head_dim;
  const int64_t dv_count = v.view.shape[3];
  const float scale_f = static_cast<float>(scale);
  AttentionResult result;
  result.out.assign(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * dv_count), 0.0);
  result.lse.assign(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q),
                    -std::numeric_limits<double>::infinity());

  std::vector<float> q_row(static_cast<size_t>(d_count));
  std::vector<double> row64(static_cast<size_t>(std::max(d_count, dv_count)));  // an input row converted to double
  std::vector<float> scores(static_cast<size_t>(shape.seqlen_k));
  std::vector<float> acc(static_cast<size_t>(dv_count));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = shape.kv_head(h);
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t visible = visible_key_count(mask, i, shape.seqlen_q, shape.seqlen_k);
        const size_t lse_index = static_cast<size_t>((b * shape.heads_q + h) * shape.seqlen_q + i);
        if (visible == 0) continue;
        // Inputs hold 16-bit values, so these float conversions are exact.
        const double* q_row64 = q.row(b, i, h, row64.data());
        for (int64_t d = 0; d < d_count; ++d) q_row[d] = static_cast<float>(q_row64[d]);

        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const double* k_row = k.row(b, j, hk, row64.data());
          float dot = 0.0f;
          for (int64_t d = 0; d < d_count; ++d) dot += q_row[d] * static_cast<float>(k_row[d]);
          scores[j] = dot * scale_f;
          row_max = std::max(row_max, scores[j]);
        }
        float row_sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) {
          scores[j] = std::exp(scores[j] - row_max);
          row_sum += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          const float p = round_to_dtype(scores[j] / row_sum, from_c(dtype));
          const double* v_row = v.row(b, j, hk, row64.data());
          for (int64_t d = 0; d < dv_count; ++d) acc[d] += p * static_cast<float>(v_row[d]);
        }
        double* out_row = result.out.data() + ((b * shape.seqlen_q + i) * shape.heads_q + h) * dv_count;
        for (int64_t d = 0; d < dv_count; ++d) out_row[d] = round_to_dtype(acc[d], from_c(dtype));
        result.lse[lse_index] = static_cast<double>(row_max + std::log(row_sum));
      }
    }
  }
  return result;
}

// ---------------------------------------------------------------------------------------------------
// Checks.

CheckReport check_within_budget(const std::string& name, const std::vector<int64_t>& dims,
                                const std::vector<double>& got, const std::vector<double>& ref64,
                                const std::vector<double>& naive, double floor) {
  FLASHGEN_REQUIRE(naive.size() == ref64.size(), name + ": naive and ref64 differ in size");
  double naive_error = 0.0;
  for (size_t i = 0; i < ref64.size(); ++i) naive_error = std::max(naive_error, std::fabs(naive[i] - ref64[i]));
  const Tolerance tolerance = naive_budget_tolerance(naive_error, floor);
  CheckReport report = check_elements(name, dims, got, ref64, tolerance);
  report.text = name + ": tolerance = " + format_number(kNaiveErrorFactor) + " * " + format_number(naive_error) +
                " (max |naive - ref64|) + " + format_number(floor) + " = " + format_number(tolerance.abs) + "\n" +
                report.text;
  return report;
}

CheckReport check_output(const AttentionShape& shape, const std::vector<double>& got,
                         const AttentionResult& ref64, const AttentionResult& naive, flashgen_dtype dtype) {
  return check_within_budget("out", {shape.batch, shape.seqlen_q, shape.heads_q, shape.value_dim()}, got, ref64.out,
                             naive.out, tolerances(from_c(dtype)).out.abs);
}

CheckReport check_lse(const AttentionShape& shape, const std::vector<float>& got, const AttentionResult& ref64,
                      flashgen_dtype dtype) {
  const size_t count = std::min(got.size(), ref64.lse.size());  // check_elements reports a short got
  return check_elements("lse", {shape.batch, shape.heads_q, shape.seqlen_q},
                        std::vector<double>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(count)), ref64.lse,
                        tolerances(from_c(dtype)).lse);
}

std::vector<double> gather_output(const std::vector<uint16_t>& storage, const StridedView& view,
                                  flashgen_dtype dtype) {
  FLASHGEN_REQUIRE(view.span() <= static_cast<int64_t>(storage.size()), "gather_output: view exceeds storage");
  std::vector<double> out(static_cast<size_t>(view.elements()));
  size_t index = 0;
  for (int64_t b = 0; b < view.shape[0]; ++b)
    for (int64_t s = 0; s < view.shape[1]; ++s)
      for (int64_t h = 0; h < view.shape[2]; ++h)
        for (int64_t d = 0; d < view.shape[3]; ++d)
          out[index++] = dtype_bits_to_float(storage[static_cast<size_t>(view.offset(b, s, h, d))], from_c(dtype));
  return out;
}

int64_t count_touched_outside(const std::vector<uint16_t>& storage, const std::vector<StridedView>& views,
                              uint16_t expected, std::string* text, int max_listed) {
  std::vector<bool> covered(storage.size(), false);
  for (const StridedView& view : views) {
    FLASHGEN_REQUIRE(view.span() <= static_cast<int64_t>(storage.size()),
                     "count_touched_outside: view exceeds storage");
    for (int64_t b = 0; b < view.shape[0]; ++b)
      for (int64_t s = 0; s < view.shape[1]; ++s)
        for (int64_t h = 0; h < view.shape[2]; ++h)
          for (int64_t d = 0; d < view.shape[3]; ++d) covered[static_cast<size_t>(view.offset(b, s, h, d))] = true;
  }
  int64_t touched = 0;
  std::ostringstream listed;
  for (size_t i = 0; i < storage.size(); ++i) {
    if (covered[i] || storage[i] == expected) continue;
    if (touched < max_listed) listed << " " << i << " (0x" << std::hex << storage[i] << std::dec << ")";
    ++touched;
  }
  if (text != nullptr && touched > 0) {
    *text = std::to_string(touched) + " elements outside the views were overwritten; first offsets:" + listed.str();
  }
  return touched;
}

// ---------------------------------------------------------------------------------------------------
// One forward run.

ForwardReference forward_reference(const AttentionShape& shape, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v, double scale,
                                   flashgen_mask mask, flashgen_dtype dtype) {
  const HostInput q_in =
      HostInput::float64(q.data(), StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim));
  const HostInput k_in = HostInput::float64(
      k.data(), StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim));
  const HostInput v_in = HostInput::float64(
      v.data(), StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim()));
  FLASHGEN_REQUIRE(static_cast<int64_t>(q.size()) == q_in.view.elements() &&
                       static_cast<int64_t>(k.size()) == k_in.view.elements() &&
                       static_cast<int64_t>(v.size()) == v_in.view.elements(),
                   "forward_reference: q, k or v does not match the shape");
  ForwardReference reference;
  reference.shape = shape;
  reference.dtype = dtype;
  reference.ref64 = attention_reference_f64(shape, q_in, k_in, v_in, scale, from_c(mask));
  reference.naive = attention_reference_naive(shape, q_in, k_in, v_in, scale, from_c(mask), dtype);
  return reference;
}

ForwardCheck check_forward(const ForwardReference& reference, const std::vector<uint16_t>& out_storage,
                           const StridedView& out_view, const std::vector<float>* lse_storage) {
  const AttentionShape& shape = reference.shape;
  ForwardCheck check;
  check.out = check_output(shape, gather_output(out_storage, out_view, reference.dtype), reference.ref64,
                           reference.naive, reference.dtype);
  std::string touched_text;
  check.out_touched = count_touched_outside(out_storage, {out_view}, kPoison16, &touched_text);
  check.out_touched_text = "out buffer: " + (check.out_touched > 0 ? touched_text : "nothing outside the view written");
  if (lse_storage == nullptr) return check;

  check.has_lse = true;
  check.lse = check_lse(shape, *lse_storage, reference.ref64, reference.dtype);
  const size_t lse_count = static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
  const size_t guard = lse_storage->size() > lse_count ? lse_storage->size() - lse_count : 0;
  for (size_t i = lse_count; i < lse_storage->size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &(*lse_storage)[i], sizeof(bits));
    if (bits != kPoison32) ++check.lse_touched;
  }
  check.lse_touched_text = "lse buffer: " + std::to_string(check.lse_touched) + " of the " + std::to_string(guard) +
                           " floats after the " + std::to_string(lse_count) +
                           " [batch, heads_q, seqlen_q] entries were overwritten";
  return check;
}

}  // namespace flashgen::test
