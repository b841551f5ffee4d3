// Test side of attention numerics: the "naive same-dtype" forward that sets the error budget, the
// tolerance rule and its mismatch reports, and poison/guard helpers. The float64 reference itself is the
// library's (runtime/reference.hpp). No Catch2 here: checks return reports that the caller prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashgen/flashgen.h"
#include "reference.hpp"

namespace flashgen::test {

const char* dtype_label(flashgen_dtype dtype);  // "fp16", "bf16"
const char* mask_label(flashgen_mask mask);     // "none", "causal", "causal_top_left"

// Every byte 0xFF: a NaN in fp16, bf16 and fp32 alike; the poison written before a kernel runs.
constexpr uint16_t kPoison16 = 0xFFFF;
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;

// What a straightforward 16-bit implementation computes: S = q kᵀ · scale in float32, softmax in float32,
// P rounded to dtype, P·V accumulated in float32, output rounded to dtype (lse stays float32). Its
// distance to the float64 reference is the error budget the tolerance rule scales.
AttentionResult attention_reference_naive(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                          const HostInput& v, double scale, flashgen_mask mask,
                                          flashgen_dtype dtype);

// ---------------------------------------------------------------------------------------------------
// Tolerance (the FlashAttention test rule): max|got - ref64| <= 2 * max|naive - ref64| + abs_floor.

// Absolute floor of the output check: half an ulp of the dtype at |x| in [2, 4), the range random-normal
// attention outputs stay within (an output is a convex mix of value rows). fp16 keeps 11 significant bits,
// so half an ulp there is 2^-10 ≈ 9.8e-4 -> 1e-3; bf16 keeps 8, half an ulp there is 2^-7 ≈ 7.8e-3 -> 8e-3.
// It absorbs one output rounding that lands on the other side of a tie from the naive reference's, where
// max|naive - ref64| happens to be tiny (short rows, e.g. seqlen_k = 1, where the naive path is exact).
double output_abs_floor(flashgen_dtype dtype);

// LSE: |got - want| <= kLseTolerance * max(1, |want|) on finite entries; -inf must match exactly.
// The kernels compute S with fp32 accumulation of exact 16-bit products and a base-2 fp32 softmax, so
// their LSE error is ~1e-6 relative; 1e-3 leaves room for a different summation order, not for a bug.
constexpr double kLseTolerance = 1e-3;

// Outcome of one check; text holds the summary and the first mismatches (index, got, want), for INFO.
struct CheckReport {
  bool ok = true;
  double max_error = 0.0;  // over finite pairs
  double bound = 0.0;      // the tolerance that applied
  int64_t checked = 0;
  int64_t mismatches = 0;  // elements outside the bound, NaN or non-finite disagreement included
  int64_t not_written = 0; // NaN in got: poison the kernel left (or a NaN it produced)
  std::string text;
};

// got: [b, sq, hq, d] contiguous (gather_output). naive supplies the error budget.
CheckReport check_output(const AttentionShape& shape, const std::vector<double>& got,
                         const AttentionResult& ref64, const AttentionResult& naive, flashgen_dtype dtype,
                         int max_listed = 8);

// got: [b, hq, sq] as the kernel wrote it (float, NaN where unwritten).
CheckReport check_lse(const AttentionShape& shape, const std::vector<float>& got, const AttentionResult& ref64,
                      int max_listed = 8);

// Raw 16-bit storage read through view into a contiguous [b, s, h, d] array of doubles (NaN stays NaN).
std::vector<double> gather_output(const std::vector<uint16_t>& storage, const StridedView& view,
                                  flashgen_dtype dtype);

// Positions of storage outside every view that hold anything but `expected`: writes out of bounds.
// Lists the first few offsets in *text when it returns non-zero.
int64_t count_touched_outside(const std::vector<uint16_t>& storage, const std::vector<StridedView>& views,
                              uint16_t expected, std::string* text, int max_listed = 8);

// "[i0, i1, i2, i3]" for a flat index into a contiguous array of the given dims.
std::string format_index(int64_t flat, const std::vector<int64_t>& dims);

}  // namespace flashgen::test
