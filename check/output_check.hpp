// The one rule by which kernel outputs are checked against the float64 reference (check/reference.hpp): each
// dtype's tolerances, the element comparison, the report, and the FP8 forward's rule (FlashAttention-3's). `flashgen
// run`, the tuner's sweeps and the tests use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "check/reference.hpp"

namespace flashgen {

// got passes against want when |got - want| <= abs + rel * |want|.
struct Tolerance {
  double abs = 0.0;
  double rel = 0.0;
};

// The tolerances of one dtype against the float64 reference, for inputs of random normal values; the
// table follows. u is the dtype's unit roundoff: 2^-11 for fp16, 2^-8 for bf16.
struct DtypeTolerances {
  // Each element of a forward output. abs: half an ulp of the dtype at |x| in [2, 4), where attention
  // outputs of random normal values stay (each is a convex mix of value rows): one output rounding on the
  // other side of a tie (fp16 2^-10 ≈ 9.8e-4 -> 1e-3, bf16 2^-7 ≈ 7.8e-3 -> 8e-3). rel: about 8u, for P
  // rounded to the dtype before P·V and the output rounded once more (fp16 8u ≈ 3.9e-3 -> 4e-3, bf16
  // 8u ≈ 3.1e-2 -> 3e-2).
  Tolerance out;
  // Each LSE element, absolute and the same for both dtypes: LSE never passes through 16 bits. The kernels
  // form S from exact 16-bit products with fp32 accumulation and take a base-2 fp32 softmax, so their LSE
  // is off by ~1e-6 relative (~3e-5 at the largest |lse| the tests reach, ~33); 1e-3 leaves room for
  // another summation order, not for a bug. A fully masked row's -inf must match exactly.
  Tolerance lse;
  // A whole gradient checked without a naive budget (`run --backward`, the backward sweep):
  // max|got - ref| <= gradient * max(max|ref|, kGradientMagnitudeFloor). The products round P and dS to
  // the dtype and each gradient element sums seqlen of them: fp16 1e-2 ≈ 20u, bf16 3e-2 ≈ 8u.
  double gradient;
  // One ulp of the dtype at 1: the tests' gradient budget floor is this times max|ref| (see
  // gradient_budget_floor).
  double ulp;
};

//                                                   out {abs, rel}  lse {abs, rel}  gradient  ulp
inline constexpr DtypeTolerances kFloat16Tolerances{{1e-3, 4e-3}, {1e-3, 0.0}, 1e-2, 0x1p-10};
inline constexpr DtypeTolerances kBFloat16Tolerances{{8e-3, 3e-2}, {1e-3, 0.0}, 3e-2, 0x1p-7};

const DtypeTolerances& tolerances(DType dtype);

// A gradient's largest element counts as at least this: where the exact gradient is 0 by cancellation
// (a single visible key gives dS = P (dP - D) = 0 in float64), the kernel's fp32 dP - D leaves ~1e-7.
constexpr double kGradientMagnitudeFloor = 1e-3;

// The tests know the error of a naive same-dtype computation (tests/support) and allow twice it plus a
// floor, FlashAttention's test rule: a kernel that reorders sums and rescales may round differently from
// the naive path, but not twice as badly.
constexpr double kNaiveErrorFactor = 2.0;
// The smallest gradient budget floor, fp16's smallest normal: the fp32 cancellation noise above (~1e-7)
// stays well inside it.
constexpr double kGradientBudgetFloor = 0x1p-14;

// Whether got matches want: never when either is NaN; exactly when want is infinite (a fully masked
// row's LSE is -inf); otherwise got must be finite and within tolerance.
bool within_tolerance(double got, double want, Tolerance tolerance);

// gradient * max(magnitude, kGradientMagnitudeFloor), absolute; magnitude is max|ref64| of the gradient.
Tolerance gradient_tolerance(DType dtype, double magnitude);

// The tests' whole-tensor bound, absolute: kNaiveErrorFactor * naive_error + floor, naive_error being
// max|naive - ref64|. The floor passes one rounding on the other side of a tie where the naive error
// happens to be tiny: out.abs for an output (short rows, e.g. seqlen_k = 1, make the naive path exact),
// gradient_budget_floor for a gradient.
Tolerance naive_budget_tolerance(double naive_error, double floor);

// max(ulp * magnitude, kGradientBudgetFloor): one rounding of a gradient's largest element, magnitude.
double gradient_budget_floor(DType dtype, double magnitude);

// max|x| over values (0 for none).
double max_magnitude(const std::vector<double>& values);

// ---------------------------------------------------------------------------------------------------
// Reports.

// How many mismatches a report lists.
constexpr int kListedMismatches = 8;

// A number as the reports write it: 7 significant digits, "nan" and "-inf" as such.
std::string format_number(double value);

// What one check found: its worst error, its counts and its first mismatches with their indices.
struct CheckReport {
  bool ok = true;
  double max_error = 0.0;  // largest |got - want| over the pairs where both are finite
  Tolerance tolerance;     // the one that applied
  int64_t checked = 0;
  int64_t mismatches = 0;   // elements outside the tolerance, NaN and non-finite disagreement included
  int64_t not_written = 0;  // NaN in got: poison the kernel left (or a NaN it produced)
  std::string summary;      // "out: max |got - want| = ...; 2 of 4096 outside it, 0 NaN"
  std::vector<std::string> first_mismatches;  // "out[0, 5, 1, 3]: got 0.51, want 0.5", at most max_listed
  std::string text;  // summary, then first_mismatches one a line: for a log or a test's INFO
};

// got against want element by element. name ("out", "dq") and dims (the tensor's, outermost first) label
// each mismatch with its index; got and want are contiguous over dims.
CheckReport check_elements(const std::string& name, const std::vector<int64_t>& dims, const std::vector<double>& got,
                           const std::vector<double>& want, Tolerance tolerance, int max_listed = kListedMismatches);

// ---------------------------------------------------------------------------------------------------
// Sampled rows, for problems too large to check whole.

struct RowsCheck {
  CheckReport out;  // indices [b, sq, hq, d]
  CheckReport lse;  // indices [b, hq, sq]
  bool ok() const { return out.ok && lse.ok; }
};

// The kernel's output at rows against their references (attention_reference_rows): out read through its
// view ([b, sq, hq, d]), lse the [b, hq, sq] floats the kernel wrote.
RowsCheck check_rows(const AttentionShape& shape, const std::vector<RowSample>& rows,
                     const std::vector<ReferenceRow>& reference, const HostInput& out, const float* lse,
                     DType dtype);

// ---------------------------------------------------------------------------------------------------
// The FP8 forward, by FlashAttention-3's rule (its tests' for q, k and v in FP8): the output is within twice the
// error of a float64 computation that rounds P as the kernels do (Fp8ReferenceRow::out_p_rounded: FP8's P·V cannot
// be held to a 16-bit tolerance), plus two ulp of the output type at the largest |out|; each LSE (never rounded to
// FP8) within an absolute 1e-3 plus kFp8LseMagnitudeShare of its row's largest scaled sum of |q_x k_x|.

// FP8 tensor cores keep about 13 bits of a k-step's sum of products: 2^-11 of the largest sum of |q_x k_x| leaves four
// times what a score may lose.
inline constexpr double kFp8LseMagnitudeShare = 0x1p-11;
inline constexpr double kFp8LseAbs = 1e-3;

struct Fp8RowsCheck {
  RowsCheck rows;               // out within bound_out of the exact rows, each lse within its own bound
  double p_rounded_error = 0;   // max |out_p_rounded - exact out| over the sampled elements
  double largest = 0;           // max |exact out|
  double bound_out = 0;         // kNaiveErrorFactor · p_rounded_error + 2 ulp of the output type at largest
  double bound_lse = 0;         // the largest of the LSE bounds that applied
  bool ok() const { return rows.ok(); }
};

// The kernel's output (of type out_dtype, bf16 or fp16) at rows against their FP8 references
// (attention_reference_rows_fp8): out read through its view ([b, sq, hq, d_v]), lse the [b, hq, sq] floats.
Fp8RowsCheck check_fp8_rows(const AttentionShape& shape, const std::vector<RowSample>& rows,
                            const std::vector<Fp8ReferenceRow>& reference, const HostInput& out, const float* lse,
                            DType out_dtype);

}  // namespace flashgen
