// Number formats on the host: the 16-bit floats and FP8 codes the kernels read and write, to and from float and
// double, rounded as the GPU rounds them. The references (reference.hpp), the CLI and the tests use them.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "problem/attention_problem.hpp"

namespace flashgen {

// ---------------------------------------------------------------------------------------------------
// 16-bit floats on the host, stored as uint16_t. Float -> 16-bit rounds to nearest, ties to even;
// overflow gives inf, NaN stays a (quiet) NaN, subnormals are produced and read exactly.

uint16_t float_to_half_bits(float value);
float half_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(uint16_t bits);

uint16_t float_to_dtype_bits(float value, DType dtype);
float dtype_bits_to_float(uint16_t bits, DType dtype);
// value rounded to the dtype and read back: what a 16-bit store of value holds.
float round_to_dtype(float value, DType dtype);

// FP8 (DType::kFloat8E4M3 or kFloat8E5M2) on the host, stored as uint8_t, as an FP8 cache and the FP8 forward's q, k
// and v hold it. Float -> FP8 rounds to nearest, ties to even, and saturates at the largest finite value (±448,
// ±57344), as the kernels' appends do; NaN gives a NaN. FP8 -> double is exact (an e4m3 NaN, an e5m2 infinity or NaN
// read as such).
uint8_t float_to_fp8_bits(float value, DType fp8);
double fp8_bits_to_double(uint8_t bits, DType fp8);

// A softmax probability p in [0, 1] rounded to e4m3 as the FP8 forward's kernels round it for P·V: p · 2^8 (p taken
// against the row's max, so 1 at the max becomes 256, exact; below 2^-18 it becomes 0), divided by 2^8 again. (The
// kernels take p against the running max, the row's own from the block that holds it: fwd_sm90_layout.cuh's kPBias.)
double round_p_to_e4m3(double p);

// The FP8 forward's random inputs of `flashgen run` and the tuning sweeps: normal values of spread kFp8CodeSpread
// rounded to the FP8 type (e4m3's reach its largest, ±448), and one descale per tensor bringing them to about 1.2 —
// q's, k's and v's an eighth apart (fp8_input_descale), so a kernel that reads one tensor's in place of another's
// fails the check.
constexpr float kFp8CodeSpread = 150.f;
float fp8_input_descale(int tensor);  // 0: q, 1: k, 2: v
std::vector<uint8_t> random_fp8_codes(size_t count, DType fp8, std::mt19937_64& rng);

}  // namespace flashgen
