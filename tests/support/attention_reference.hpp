// Test side of attention numerics: deterministic input data, the "naive same-dtype" forward that sets the
// error budget, poison/guard helpers, and check_forward, which checks one kernel's downloaded outputs. The
// float64 reference and the tolerance rule are the library's (check/reference.hpp, check/output_check.hpp).
// No Catch2 here: checks return reports that the caller prints.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"

namespace flashgen::test {

const char* dtype_label(flashgen_dtype dtype);  // "fp16", "bf16"
const char* mask_label(Mask mask);              // "none", "causal", "causal_top_left", "window"
const char* mask_label(flashgen_mask mask);     // the same of the C ABI's mask

// Every byte 0xFF: a NaN in fp16, bf16 and fp32 alike; the poison written before a kernel runs.
constexpr uint16_t kPoison16 = 0xFFFF;
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;

// ---------------------------------------------------------------------------------------------------
// Deterministic input data.

// mt19937's output is fixed by the standard, unlike std's distributions and std::shuffle: with these
// mappings test matrices and data are the same on every machine, so a failure reproduces anywhere.
class Rng {
 public:
  explicit Rng(uint32_t seed) : engine_(seed) {}
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(engine_() % n); }
  // Standard normal by Box-Muller.
  double normal();
  template <typename T>
  void shuffle(std::vector<T>& values) {
    for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[below(static_cast<uint32_t>(i))]);
  }

 private:
  std::mt19937 engine_;
};

// count standard normals drawn in order, each rounded to dtype (so exactly what the GPU will hold).
std::vector<double> normal_values(Rng& rng, int64_t count, flashgen_dtype dtype);

// Writes values (contiguous [b, s, h, d] over view's shape) into storage as dtype bits at
// base + view.offset(b, s, h, d). Throws Error(kInvalidArgument) when the view runs past storage or a value
// is not exactly representable in dtype: the references must see the very numbers the kernel reads.
void store_values(const std::vector<double>& values, const StridedView& view, int64_t base, flashgen_dtype dtype,
                  std::vector<uint16_t>& storage);

// What a straightforward 16-bit implementation computes: S = q kᵀ · scale in float32, softmax in float32,
// P rounded to dtype, P·V accumulated in float32, output rounded to dtype (lse stays float32). Its
// distance to the float64 reference is the error budget the tolerance rule scales.
AttentionResult attention_reference_naive(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                          const HostInput& v, double scale, Mask mask,
                                          flashgen_dtype dtype);

// ---------------------------------------------------------------------------------------------------
// Checks of whole outputs, by the library's rule with the naive reference's error budget.

// The library's report (check/output_check.hpp), under the name the tests have used for it.
using flashgen::CheckReport;

// got against ref64, contiguous over dims, within naive_budget_tolerance(max|naive - ref64|, floor); the
// text opens with how the bound was formed. name ("out", "dq") and dims label the mismatches.
CheckReport check_within_budget(const std::string& name, const std::vector<int64_t>& dims,
                                const std::vector<double>& got, const std::vector<double>& ref64,
                                const std::vector<double>& naive, double floor);

// got: [b, sq, hq, d] contiguous (gather_output); check_within_budget with the dtype's out.abs as floor.
CheckReport check_output(const AttentionShape& shape, const std::vector<double>& got,
                         const AttentionResult& ref64, const AttentionResult& naive, flashgen_dtype dtype);

// got: [b, hq, sq] as the kernel wrote it (float, NaN where unwritten); entries past those are not read.
// Tolerance: the dtype's lse.
CheckReport check_lse(const AttentionShape& shape, const std::vector<float>& got, const AttentionResult& ref64,
                      flashgen_dtype dtype);

// Raw 16-bit storage read through view into a contiguous [b, s, h, d] array of doubles (NaN stays NaN).
std::vector<double> gather_output(const std::vector<uint16_t>& storage, const StridedView& view,
                                  flashgen_dtype dtype);

// Positions of storage outside every view that hold anything but `expected`: writes out of bounds.
// Lists the first few offsets in *text when it returns non-zero.
int64_t count_touched_outside(const std::vector<uint16_t>& storage, const std::vector<StridedView>& views,
                              uint16_t expected, std::string* text, int max_listed = 8);

// ---------------------------------------------------------------------------------------------------
// One forward run, checked whole.

// What a kernel's outputs are checked against: the float64 reference and the naive one's error budget.
// It depends on the problem only, so a caller running many configs on one problem computes it once.
struct ForwardReference {
  AttentionShape shape;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  AttentionResult ref64;
  AttentionResult naive;
};

// q, k, v: the inputs as contiguous [b, s, h, d] doubles (16-bit values); scale: the effective one.
ForwardReference forward_reference(const AttentionShape& shape, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v, double scale,
                                   flashgen_mask mask, flashgen_dtype dtype);

// Every check of one run. The caller prints each text with INFO and CHECKs the matching field.
struct ForwardCheck {
  CheckReport out;               // check_output of the gathered output
  int64_t out_touched = 0;       // elements of the out buffer outside its view that are no longer kPoison16
  std::string out_touched_text;  // "out buffer: ..." naming the first such offsets
  bool has_lse = false;          // false: lse was NULL, the lse fields below are empty
  CheckReport lse;               // check_lse of the first b * hq * sq floats
  int64_t lse_touched = 0;       // floats after those that are no longer kPoison32
  std::string lse_touched_text;  // "lse buffer: ..."

  bool ok() const {
    return out.ok && out.not_written == 0 && out_touched == 0 &&
           (!has_lse || (lse.ok && lse.not_written == 0 && lse_touched == 0));
  }
};

// out_storage: the whole output buffer as downloaded, poisoned with kPoison16 before the run; out_view:
// where the output tensor lies in it. lse_storage: the whole lse buffer, poisoned with kPoison32, whose
// first b * hq * sq floats are the lse; null when the kernel was given no lse.
ForwardCheck check_forward(const ForwardReference& reference, const std::vector<uint16_t>& out_storage,
                           const StridedView& out_view, const std::vector<float>* lse_storage);

}  // namespace flashgen::test
