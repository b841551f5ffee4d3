// Number formats on the host declared in number_formats.hpp: 16-bit and FP8 conversions.
#include "check/number_formats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "flashgen/error.hpp"

namespace flashgen {
namespace {

uint32_t float_bits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bits_float(uint32_t bits) {
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// 16-bit conversions.

uint16_t float_to_half_bits(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    // NaN: keep the top payload bits and force the quiet bit so the mantissa stays non-zero.
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  if (magnitude >= 0x477FF000u) {
    // >= 65520 (halfway between 65504, the largest half, and 2^16) rounds to inf; so does inf.
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (magnitude >= 0x38800000u) {
    // Normal half (>= 2^-14): round the 23-bit mantissa to 10 bits, ties to even; a carry into the
    // exponent is the correct result. Then rebias the exponent from 127 to 15 (112 << 23 = 0x38000000).
    const uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal half (or zero): adding 0.5f puts the value's 2^-24 units in the low mantissa bits of the
  // sum (0.5 has an ulp of 2^-24), and the FPU's own round-to-nearest-even does the rounding. 2^-14
  // exactly rounds up to 0x400, the smallest normal half, which is the right encoding.
  const float shifted = bits_float(magnitude) + 0.5f;
  return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3F000000u));
}

float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000u | (mantissa << 13));  // inf / NaN
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays NaN (quiet bit set)
  }
  // Round the low 16 bits away, ties to even. Overflow carries into the exponent and gives inf, as
  // round-to-nearest must; subnormals round the same way as normals.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float bf16_bits_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_dtype_bits(float value, DType dtype) {
  return dtype == DType::kBFloat16 ? float_to_bf16_bits(value) : float_to_half_bits(value);
}

float dtype_bits_to_float(uint16_t bits, DType dtype) {
  return dtype == DType::kBFloat16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

float round_to_dtype(float value, DType dtype) {
  return dtype_bits_to_float(float_to_dtype_bits(value, dtype), dtype);
}

namespace {

// An FP8 format's fields: mantissa bits, exponent bias, largest finite value and its code.
struct Fp8Format {
  int mantissa_bits, bias;
  double largest;
  uint8_t largest_code, nan_code;
};

Fp8Format fp8_format(DType fp8) {
  FLASHGEN_REQUIRE(fp8 == DType::kFloat8E4M3 || fp8 == DType::kFloat8E5M2,
                   std::string("an FP8 type is e4m3 or e5m2, got ") + dtype_name(fp8));
  if (fp8 == DType::kFloat8E4M3) return {3, 7, 448.0, 0x7E, 0x7F};
  return {2, 15, 57344.0, 0x7B, 0x7F};
}

// value rounded to fp8's code: float_to_fp8_bits, from a double (one rounding).
uint8_t fp8_bits_of(double value, DType fp8) {
  const Fp8Format f = fp8_format(fp8);
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  if (std::isnan(value)) return f.nan_code;
  const double a = std::fabs(value);
  if (a >= f.largest) return sign | f.largest_code;
  const int min_exponent = 1 - f.bias;  // of the normal values
  int exponent = a > 0 ? std::ilogb(a) : min_exponent;
  exponent = std::max(exponent, min_exponent);
  const double quantum = std::ldexp(1.0, exponent - f.mantissa_bits);
  const double rounded = std::nearbyint(a / quantum) * quantum;  // ties to even (the default rounding mode)
  if (rounded >= f.largest) return sign | f.largest_code;
  if (rounded == 0) return sign;
  const int e = std::max(std::ilogb(rounded), min_exponent);
  const int mantissa = static_cast<int>(rounded / std::ldexp(1.0, e - f.mantissa_bits)) & ((1 << f.mantissa_bits) - 1);
  const int field = rounded < std::ldexp(1.0, min_exponent) ? 0 : e + f.bias;
  return static_cast<uint8_t>(sign | (field << f.mantissa_bits) | mantissa);
}

}  // namespace

uint8_t float_to_fp8_bits(float value, DType fp8) { return fp8_bits_of(static_cast<double>(value), fp8); }

double fp8_bits_to_double(uint8_t bits, DType fp8) {
  const Fp8Format f = fp8_format(fp8);
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int field = (bits & 0x7F) >> f.mantissa_bits, mantissa = bits & ((1 << f.mantissa_bits) - 1);
  if (fp8 == DType::kFloat8E4M3 && (bits & 0x7F) == 0x7F) return std::nan("");
  if (fp8 == DType::kFloat8E5M2 && field == 31) return mantissa == 0 ? sign * INFINITY : std::nan("");
  if (field == 0) return sign * std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp(1.0 + std::ldexp(mantissa, -f.mantissa_bits), field - f.bias);
}

double round_p_to_e4m3(double p) {
  return fp8_bits_to_double(fp8_bits_of(p * 256.0, DType::kFloat8E4M3), DType::kFloat8E4M3) / 256.0;
}

float fp8_input_descale(int tensor) { return 1.2f / kFp8CodeSpread * (1.f + 0.125f * static_cast<float>(tensor)); }

std::vector<uint8_t> random_fp8_codes(size_t count, DType fp8, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, kFp8CodeSpread);
  std::vector<uint8_t> codes(count);
  for (uint8_t& code : codes) code = float_to_fp8_bits(normal(rng), fp8);
  return codes;
}

}  // namespace flashgen
