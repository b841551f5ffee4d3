// CPU checks of the output-check rule (check/output_check.hpp): the element comparison, the tolerance
// table, the reports of whole tensors and of sampled rows. `flashgen run`, the sweeps and the tests rely on it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"

using namespace flashgen;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::nan("");

bool lists(const CheckReport& report, const std::string& text) { return report.text.find(text) != std::string::npos; }

}  // namespace

TEST_CASE("within_tolerance: abs + rel * |want|, NaN never, infinite want exactly", "[output_check]") {
  const Tolerance tol{1e-3, 1e-2};
  CHECK(within_tolerance(2.0 + 0.02, 2.0, tol));
  CHECK(within_tolerance(-2.0 - 0.02, -2.0, tol));
  CHECK_FALSE(within_tolerance(2.0 + 0.022, 2.0, tol));
  CHECK(within_tolerance(0.0, 0.0, Tolerance{}));
  CHECK_FALSE(within_tolerance(1e-300, 0.0, Tolerance{}));

  CHECK_FALSE(within_tolerance(kNaN, 1.0, tol));
  CHECK_FALSE(within_tolerance(1.0, kNaN, tol));
  CHECK_FALSE(within_tolerance(kNaN, kNaN, Tolerance{kInf, 0.0}));
  CHECK_FALSE(within_tolerance(kInf, 1.0, Tolerance{kInf, 0.0}));  // non-finite got, finite want

  // A fully masked row's LSE is -inf: only -inf matches it.
  CHECK(within_tolerance(-kInf, -kInf, tol));
  CHECK_FALSE(within_tolerance(kInf, -kInf, tol));
  CHECK_FALSE(within_tolerance(-1e30, -kInf, Tolerance{kInf, 0.0}));
}

TEST_CASE("the tolerance table: bf16 allows more than fp16, LSE the same for both", "[output_check]") {
  const DtypeTolerances& f16 = tolerances(DType::kFloat16);
  const DtypeTolerances& bf16 = tolerances(DType::kBFloat16);
  CHECK(f16.out.abs == 1e-3);
  CHECK(f16.out.rel == 4e-3);
  CHECK(bf16.out.abs == 8e-3);
  CHECK(bf16.out.rel == 3e-2);
  CHECK(f16.lse.abs == 1e-3);
  CHECK(f16.lse.rel == 0.0);
  CHECK(bf16.lse.abs == f16.lse.abs);
  CHECK(bf16.lse.rel == f16.lse.rel);
  CHECK(f16.gradient == 1e-2);
  CHECK(bf16.gradient == 3e-2);
  // The output floor is half an ulp in [2, 4), which is one ulp at 1.
  CHECK(f16.ulp == std::ldexp(1.0, -10));
  CHECK(bf16.ulp == std::ldexp(1.0, -7));
  CHECK(round_to_dtype(1.0f + static_cast<float>(f16.ulp), DType::kFloat16) == 1.0f + static_cast<float>(f16.ulp));
  CHECK(round_to_dtype(1.0f + static_cast<float>(f16.ulp) / 4, DType::kFloat16) == 1.0f);
  CHECK(round_to_dtype(1.0f + static_cast<float>(bf16.ulp) / 4, DType::kBFloat16) == 1.0f);

  // Gradients: relative to the largest element, at least kGradientMagnitudeFloor of it.
  CHECK(gradient_tolerance(DType::kFloat16, 2.0).abs == 2e-2);
  CHECK(gradient_tolerance(DType::kBFloat16, 0.0).abs == 3e-2 * kGradientMagnitudeFloor);
  // The tests' budget: twice the naive error plus a floor; a gradient's floor is one ulp of its largest element.
  CHECK(naive_budget_tolerance(0.01, 1e-3).abs == 2 * 0.01 + 1e-3);
  CHECK(gradient_budget_floor(DType::kFloat16, 4.0) == 4.0 * f16.ulp);
  CHECK(gradient_budget_floor(DType::kBFloat16, 0.0) == kGradientBudgetFloor);
  CHECK(max_magnitude({0.5, -3.0, 2.0}) == 3.0);
  CHECK(max_magnitude({}) == 0.0);
}

TEST_CASE("check_elements counts, measures and lists the first mismatches by index", "[output_check]") {
  // [2, 3] contiguous.
  const std::vector<double> want = {1.0, 2.0, 3.0, 4.0, 5.0, -kInf};
  std::vector<double> got = want;
  CheckReport report = check_elements("x", {2, 3}, got, want, Tolerance{0.1, 0.0});
  CHECK(report.ok);
  CHECK(report.checked == 6);
  CHECK(report.max_error == 0.0);

  got[1] = 2.05;  // inside
  got[3] = 4.5;   // outside: x[1, 0]
  got[4] = kNaN;  // unwritten: x[1, 1]
  got[5] = -1e30;  // a finite stand-in for -inf: x[1, 2]
  report = check_elements("x", {2, 3}, got, want, Tolerance{0.1, 0.0});
  CHECK_FALSE(report.ok);
  CHECK(report.mismatches == 3);
  CHECK(report.not_written == 1);
  CHECK(std::fabs(report.max_error - 0.5) < 1e-12);  // over the pairs where both are finite
  REQUIRE(report.first_mismatches.size() == 3);
  CHECK(report.first_mismatches[0] == "x[1, 0]: got 4.5, want 4");
  CHECK(lists(report, "x[1, 1]: got nan"));
  CHECK(lists(report, "x[1, 2]: got -1e+30, want -inf"));
  CHECK(report.text.rfind(report.summary, 0) == 0);
  CHECK(report.summary.find("3 of 6 outside it, 1 NaN") != std::string::npos);

  // Listing stops at max_listed; counting does not.
  report = check_elements("x", {2, 3}, std::vector<double>(6, kNaN), want, Tolerance{0.1, 0.0}, 2);
  CHECK(report.mismatches == 6);
  CHECK(report.first_mismatches.size() == 2);

  report = check_elements("x", {2, 3}, std::vector<double>(5, 1.0), want, Tolerance{0.1, 0.0});
  CHECK_FALSE(report.ok);
  CHECK(lists(report, "got 5 values, want 6"));
}

TEST_CASE("check_rows compares sampled rows of a strided output and their LSE", "[output_check]") {
  // Bottom-right causal with seqlen_q > seqlen_k: query row 0 sees no key (out 0, lse -inf).
  const AttentionShape shape{2, 5, 4, 2, 1, 8};
  std::vector<double> q(static_cast<size_t>(2 * 5 * 2 * 8)), kv(static_cast<size_t>(2 * 4 * 1 * 8));
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * static_cast<double>(i));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.3 * static_cast<double>(i));
  const HostInput q_in = HostInput::float64(q.data(), StridedView::contiguous(2, 5, 2, 8));
  const HostInput kv_in = HostInput::float64(kv.data(), StridedView::contiguous(2, 4, 1, 8));
  const AttentionResult whole = attention_reference_f64(shape, q_in, kv_in, kv_in, 0.5, flashgen::Mask::kCausal);

  // The kernel's output as [b, h, s, d] memory, and its lse as floats.
  StridedView bhsd = StridedView::contiguous(2, 5, 2, 8);
  bhsd.stride[0] = 2 * 5 * 8, bhsd.stride[1] = 8, bhsd.stride[2] = 5 * 8;
  std::vector<double> out(static_cast<size_t>(bhsd.span()));
  const StridedView bshd = StridedView::contiguous(2, 5, 2, 8);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 5; ++s)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 8; ++d)
          out[static_cast<size_t>(bhsd.offset(b, s, h, d))] = whole.out[static_cast<size_t>(bshd.offset(b, s, h, d))];
  std::vector<float> lse(whole.lse.begin(), whole.lse.end());

  const std::vector<RowSample> rows = {{0, 0, 0}, {0, 1, 3}, {1, 1, 4}};
  const std::vector<ReferenceRow> reference =
      attention_reference_rows(shape, q_in, kv_in, kv_in, 0.5, flashgen::Mask::kCausal, rows, 2);
  const HostInput out_in = HostInput::float64(out.data(), bhsd);
  RowsCheck check = check_rows(shape, rows, reference, out_in, lse.data(), DType::kFloat16);
  INFO(check.out.text << "\n" << check.lse.text);
  CHECK(check.ok());
  CHECK(check.out.checked == 3 * 8);
  CHECK(check.lse.checked == 3);
  CHECK(check.out.max_error == 0.0);
  CHECK(check.lse.max_error < 1e-6);  // float rounding of the LSE

  // 6.5e-3 is outside fp16's 1e-3 + 4e-3 |want| and inside bf16's 8e-3 + 3e-2 |want| for any |want| <= 1.
  out[static_cast<size_t>(bhsd.offset(0, 3, 1, 6))] += 6.5e-3;  // out[0, 3, 1, 6]
  lse[static_cast<size_t>((1 * 2 + 1) * 5 + 4)] += 2e-3f;      // lse[1, 1, 4]
  lse[0] = 0.0f;                                                // lse[0, 0, 0], whose row sees no key: -inf
  check = check_rows(shape, rows, reference, out_in, lse.data(), DType::kFloat16);
  CHECK_FALSE(check.ok());
  CHECK(check.out.mismatches == 1);
  CHECK(lists(check.out, "out[0, 3, 1, 6]"));
  CHECK(check.lse.mismatches == 2);
  CHECK(lists(check.lse, "lse[0, 0, 0]: got 0, want -inf"));
  CHECK(lists(check.lse, "lse[1, 1, 4]"));
  // bf16 allows the output error, not the LSE's.
  check = check_rows(shape, rows, reference, out_in, lse.data(), DType::kBFloat16);
  CHECK(check.out.ok);
  CHECK(check.lse.mismatches == 2);
}

TEST_CASE("check_fp8_rows holds out to twice a P-rounded float64's error plus 2 ulp, each LSE to its own bound",
          "[output_check][fp8]") {
  // e4m3 codes with one descale per tensor; bottom-right causal with seqlen_q > seqlen_k leaves query row 0 unseen.
  const AttentionShape shape{1, 6, 5, 2, 1, 16};
  std::vector<uint8_t> q(6 * 2 * 16), kv(5 * 1 * 16);
  auto code = [](double value) { return float_to_fp8_bits(static_cast<float>(value), DType::kFloat8E4M3); };
  for (size_t i = 0; i < q.size(); ++i) q[i] = code(200 * std::sin(0.9 * double(i)));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = code(200 * std::cos(0.4 * double(i)));
  const HostInput q_in = HostInput::fp8_codes(q.data(), DType::kFloat8E4M3, StridedView::contiguous(1, 6, 2, 16), 0.01);
  const HostInput kv_in =
      HostInput::fp8_codes(kv.data(), DType::kFloat8E4M3, StridedView::contiguous(1, 5, 1, 16), 0.0075);
  const std::vector<RowSample> rows = {{0, 0, 0}, {0, 1, 2}, {0, 0, 4}, {0, 1, 5}};
  const std::vector<Fp8ReferenceRow> reference =
      attention_reference_rows_fp8(shape, q_in, kv_in, kv_in, 0.25, flashgen::Mask::kCausal, rows, 2);

  // A kernel's output: the P-rounded rows rounded to bf16, in [b, s, h, d] memory, and the exact LSE as floats.
  const StridedView out_view = StridedView::contiguous(1, 6, 2, 16);
  std::vector<double> out(static_cast<size_t>(out_view.span()), kNaN);
  std::vector<float> lse(12, std::nanf(""));
  double p_rounded_error = 0, largest = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t d = 0; d < 16; ++d) {
      const Fp8ReferenceRow& want = reference[r];
      out[static_cast<size_t>(out_view.offset(0, rows[r].row, rows[r].head, d))] =
          round_to_dtype(static_cast<float>(want.out_p_rounded[size_t(d)]), DType::kBFloat16);
      p_rounded_error = std::max(p_rounded_error, std::fabs(want.out_p_rounded[size_t(d)] - want.exact.out[size_t(d)]));
      largest = std::max(largest, std::fabs(want.exact.out[size_t(d)]));
    }
    lse[static_cast<size_t>(rows[r].head * 6 + rows[r].row)] = static_cast<float>(reference[r].exact.lse);
  }
  REQUIRE(p_rounded_error > 0);
  const HostInput out_in = HostInput::float64(out.data(), out_view);
  Fp8RowsCheck check = check_fp8_rows(shape, rows, reference, out_in, lse.data(), DType::kBFloat16);
  INFO(check.rows.out.text << "\n" << check.rows.lse.text);
  CHECK(check.ok());
  CHECK(check.rows.out.checked == 4 * 16);
  CHECK(check.rows.lse.checked == 4);
  CHECK(check.p_rounded_error == p_rounded_error);
  CHECK(check.largest == largest);
  CHECK(check.bound_out == 2 * p_rounded_error + 2 * 0x1p-7 * largest);
  double largest_magnitude = 0;
  for (const Fp8ReferenceRow& row : reference) largest_magnitude = std::max(largest_magnitude, row.qk_magnitude);
  CHECK(check.bound_lse == 1e-3 + 0x1p-11 * largest_magnitude);
  CHECK(reference[0].exact.lse == -kInf);  // row 0 sees no key

  // An fp16 output is held to its own, smaller ulp.
  CHECK(check_fp8_rows(shape, rows, reference, out_in, lse.data(), DType::kFloat16).bound_out ==
        2 * p_rounded_error + 2 * 0x1p-10 * largest);

  // Just outside the output's bound, an LSE outside its row's, a finite LSE where the row sees no key: all listed.
  out[static_cast<size_t>(out_view.offset(0, 2, 1, 3))] = reference[1].exact.out[3] + 1.01 * check.bound_out;
  const double lse_bound = 1e-3 + 0x1p-11 * reference[3].qk_magnitude;
  lse[1 * 6 + 5] = static_cast<float>(reference[3].exact.lse + 1.5 * lse_bound);
  lse[0] = 0.0f;
  check = check_fp8_rows(shape, rows, reference, out_in, lse.data(), DType::kBFloat16);
  CHECK_FALSE(check.ok());
  CHECK(check.rows.out.mismatches == 1);
  CHECK(lists(check.rows.out, "out[0, 2, 1, 3]"));
  CHECK(check.rows.lse.mismatches == 2);
  CHECK(lists(check.rows.lse, "lse[0, 0, 0]: got 0, want -inf"));
  CHECK(lists(check.rows.lse, "lse[0, 1, 5]"));
  // A NaN (poison the kernel did not overwrite) never passes.
  out[static_cast<size_t>(out_view.offset(0, 4, 0, 0))] = kNaN;
  CHECK(check_fp8_rows(shape, rows, reference, out_in, lse.data(), DType::kBFloat16).rows.out.not_written == 1);
  CHECK_THROWS(check_fp8_rows(shape, rows, reference, out_in, lse.data(), DType::kFloat8E4M3));
}
