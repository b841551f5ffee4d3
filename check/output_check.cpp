// The output check declared in output_check.hpp: the tolerance table, the element comparison, and the
// reports of whole tensors and of sampled rows (16-bit, and an FP8 forward's by FlashAttention-3's rule).
#include "check/output_check.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "flashgen/error.hpp"

namespace flashgen {
namespace {

// "[i0, i1, i2, i3]" for a flat index into a contiguous array of the given dims.
std::string format_index(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> index(dims.size(), 0);
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] > 0) {
      index[i] = flat % dims[i];
      flat /= dims[i];
    }
  }
  std::string text = "[";
  for (size_t i = 0; i < index.size(); ++i) text += (i ? ", " : "") + std::to_string(index[i]);
  return text + "]";
}

// Builds a CheckReport one element at a time.
class ElementCheck {
 public:
  ElementCheck(std::string name, std::vector<int64_t> dims, Tolerance tolerance, int max_listed)
      : name_(std::move(name)), dims_(std::move(dims)), max_listed_(max_listed) {
    report_.tolerance = tolerance;
  }

  // Element `flat` (an index into dims).
  void compare(int64_t flat, double got, double want) { compare(flat, got, want, report_.tolerance); }
  // The same under a tolerance of its own (a row's), which the report's does not name.
  void compare(int64_t flat, double got, double want, Tolerance tolerance) {
    ++report_.checked;
    if (std::isnan(got)) ++report_.not_written;
    if (std::isfinite(got) && std::isfinite(want))
      report_.max_error = std::max(report_.max_error, std::fabs(got - want));
    if (within_tolerance(got, want, tolerance)) return;
    ++report_.mismatches;
    if (static_cast<int>(report_.first_mismatches.size()) < max_listed_) {
      report_.first_mismatches.push_back(name_ + format_index(flat, dims_) + ": got " + format_number(got) +
                                         ", want " + format_number(want));
    }
  }

  // The tolerance the summary names (the largest of those that applied, where each element had its own).
  void set_tolerance(Tolerance tolerance) { report_.tolerance = tolerance; }

  CheckReport finish() {
    const Tolerance& tolerance = report_.tolerance;
    std::ostringstream summary;
    summary << name_ << ": max |got - want| = " << format_number(report_.max_error) << " (tolerance "
            << format_number(tolerance.abs);
    if (tolerance.rel != 0.0) summary << " + " << format_number(tolerance.rel) << " |want|";
    summary << "); " << report_.mismatches << " of " << report_.checked << " outside it, " << report_.not_written
            << " NaN";
    report_.ok = report_.mismatches == 0;
    report_.summary = summary.str();
    report_.text = report_.summary;
    for (const std::string& line : report_.first_mismatches) report_.text += "\n  " + line;
    return report_;
  }

 private:
  std::string name_;
  std::vector<int64_t> dims_;
  int max_listed_;
  CheckReport report_;
};

}  // namespace

std::string format_number(double value) {
  std::ostringstream s;
  s.precision(7);
  s << value;
  return s.str();
}

const DtypeTolerances& tolerances(DType dtype) {
  return dtype == DType::kBFloat16 ? kBFloat16Tolerances : kFloat16Tolerances;
}

bool within_tolerance(double got, double want, Tolerance tolerance) {
  if (std::isnan(got) || std::isnan(want)) return false;
  if (std::isinf(want)) return got == want;
  return std::isfinite(got) && std::fabs(got - want) <= tolerance.abs + tolerance.rel * std::fabs(want);
}

Tolerance gradient_tolerance(DType dtype, double magnitude) {
  return Tolerance{tolerances(dtype).gradient * std::max(magnitude, kGradientMagnitudeFloor), 0.0};
}

Tolerance naive_budget_tolerance(double naive_error, double floor) {
  return Tolerance{kNaiveErrorFactor * naive_error + floor, 0.0};
}

double gradient_budget_floor(DType dtype, double magnitude) {
  return std::max(tolerances(dtype).ulp * magnitude, kGradientBudgetFloor);
}

double max_magnitude(const std::vector<double>& values) {
  double magnitude = 0.0;
  for (double value : values) magnitude = std::max(magnitude, std::fabs(value));
  return magnitude;
}

CheckReport check_elements(const std::string& name, const std::vector<int64_t>& dims, const std::vector<double>& got,
                           const std::vector<double>& want, Tolerance tolerance, int max_listed) {
  if (got.size() != want.size()) {
    CheckReport report;
    report.ok = false;
    report.tolerance = tolerance;
    report.summary = report.text =
        name + ": got " + std::to_string(got.size()) + " values, want " + std::to_string(want.size());
    return report;
  }
  ElementCheck check(name, dims, tolerance, max_listed);
  for (size_t i = 0; i < want.size(); ++i) check.compare(static_cast<int64_t>(i), got[i], want[i]);
  return check.finish();
}

RowsCheck check_rows(const AttentionShape& shape, const std::vector<RowSample>& rows,
                     const std::vector<ReferenceRow>& reference, const HostInput& out, const float* lse,
                     DType dtype) {
  FLASHGEN_REQUIRE(reference.size() == rows.size(), "check_rows: one reference row per sample");
  const int64_t dim_v = shape.value_dim();
  const int64_t want_shape[4] = {shape.batch, shape.seqlen_q, shape.heads_q, dim_v};
  for (int i = 0; i < 4; ++i) {
    FLASHGEN_REQUIRE(out.view.shape[i] == want_shape[i], "check_rows: out view does not match the problem shape");
  }
  const DtypeTolerances& tol = tolerances(dtype);
  ElementCheck out_check("out", {shape.batch, shape.seqlen_q, shape.heads_q, dim_v}, tol.out, kListedMismatches);
  ElementCheck lse_check("lse", {shape.batch, shape.heads_q, shape.seqlen_q}, tol.lse, kListedMismatches);
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowSample& at = rows[r];
    for (int64_t d = 0; d < dim_v; ++d) {
      const int64_t flat = ((at.batch * shape.seqlen_q + at.row) * shape.heads_q + at.head) * dim_v + d;
      out_check.compare(flat, out.at(at.batch, at.row, at.head, d), reference[r].out[static_cast<size_t>(d)]);
    }
    const int64_t flat = (at.batch * shape.heads_q + at.head) * shape.seqlen_q + at.row;
    lse_check.compare(flat, lse[flat], reference[r].lse);
  }
  return RowsCheck{out_check.finish(), lse_check.finish()};
}

Fp8RowsCheck check_fp8_rows(const AttentionShape& shape, const std::vector<RowSample>& rows,
                            const std::vector<Fp8ReferenceRow>& reference, const HostInput& out, const float* lse,
                            DType out_dtype) {
  FLASHGEN_REQUIRE(reference.size() == rows.size(), "check_fp8_rows: one reference row per sample");
  FLASHGEN_REQUIRE(out_dtype == DType::kBFloat16 || out_dtype == DType::kFloat16,
                   std::string("check_fp8_rows: the output is bf16 or fp16, got ") + dtype_name(out_dtype));
  const int64_t dim_v = shape.value_dim();
  const int64_t want_shape[4] = {shape.batch, shape.seqlen_q, shape.heads_q, dim_v};
  for (int i = 0; i < 4; ++i) {
    FLASHGEN_REQUIRE(out.view.shape[i] == want_shape[i], "check_fp8_rows: out view does not match the problem shape");
  }
  // The output's bound is the samples' together: the P-rounded rows' largest error and the largest |out|.
  Fp8RowsCheck result;
  for (const Fp8ReferenceRow& row : reference) {
    for (size_t d = 0; d < row.exact.out.size(); ++d) {
      result.p_rounded_error = std::max(result.p_rounded_error, std::fabs(row.out_p_rounded[d] - row.exact.out[d]));
      result.largest = std::max(result.largest, std::fabs(row.exact.out[d]));
    }
  }
  result.bound_out = kNaiveErrorFactor * result.p_rounded_error + 2 * tolerances(out_dtype).ulp * result.largest;
  ElementCheck out_check("out", {shape.batch, shape.seqlen_q, shape.heads_q, dim_v}, Tolerance{result.bound_out, 0.0},
                         kListedMismatches);
  ElementCheck lse_check("lse", {shape.batch, shape.heads_q, shape.seqlen_q}, Tolerance{kFp8LseAbs, 0.0},
                         kListedMismatches);
  result.bound_lse = kFp8LseAbs;
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowSample& at = rows[r];
    for (int64_t d = 0; d < dim_v; ++d) {
      const int64_t flat = ((at.batch * shape.seqlen_q + at.row) * shape.heads_q + at.head) * dim_v + d;
      out_check.compare(flat, out.at(at.batch, at.row, at.head, d), reference[r].exact.out[static_cast<size_t>(d)]);
    }
    const Tolerance lse_bound{kFp8LseAbs + kFp8LseMagnitudeShare * reference[r].qk_magnitude, 0.0};
    result.bound_lse = std::max(result.bound_lse, lse_bound.abs);
    const int64_t flat = (at.batch * shape.heads_q + at.head) * shape.seqlen_q + at.row;
    lse_check.compare(flat, lse[flat], reference[r].exact.lse, lse_bound);
  }
  lse_check.set_tolerance(Tolerance{result.bound_lse, 0.0});
  result.rows = RowsCheck{out_check.finish(), lse_check.finish()};
  return result;
}

}  // namespace flashgen
