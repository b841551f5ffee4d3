// Host-side numerics for `flashgen run`: fp16/bf16 rounding (round-to-nearest-even) and decoding, host
// copies of the q/k/v/out tensors, the float64 attention reference for one query row, and FLOP counts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel_config.hpp"

namespace flashgen::cli {

// float -> IEEE binary16 bits, round to nearest even; overflow gives inf, NaN stays NaN.
inline uint16_t float_to_half_bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds up to inf
  if (abs < 0x38800000u) {                                               // below 2^-14: subnormal or zero
    if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);          // <= 2^-25 rounds to zero (ties to even)
    const uint32_t exponent = abs >> 23;                                 // 102..112
    const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // value / 2^-24 == mantissa >> shift
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;  // a carry makes the smallest normal
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (abs >> 13) - ((127u - 15u) << 10);  // rebias the exponent, keep 10 mantissa bits
  const uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  const uint32_t x = exponent == 31 ? sign | 0x7F800000u | (mantissa << 13)
                                    : sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  float value;
  std::memcpy(&value, &x, sizeof value);
  return value;
}

// float -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bfloat16_bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bfloat16_bits_to_float(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &x, sizeof value);
  return value;
}

inline uint16_t to_bits(DType dtype, float value) {
  return dtype == DType::kFloat16 ? float_to_half_bits(value) : float_to_bfloat16_bits(value);
}

inline float from_bits(DType dtype, uint16_t bits) {
  return dtype == DType::kFloat16 ? half_bits_to_float(bits) : bfloat16_bits_to_float(bits);
}

// Host copy of one 16-bit tensor: the raw elements in memory order plus the view the library is given
// (shape [batch, seqlen, heads, head_dim], strides in elements).
struct HostTensor {
  DType dtype = DType::kFloat16;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
  std::vector<uint16_t> bits;

  int64_t offset(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3];
  }
  float at(int64_t b, int64_t s, int64_t h, int64_t d) const { return from_bits(dtype, bits[offset(b, s, h, d)]); }
  size_t bytes() const { return bits.size() * sizeof(uint16_t); }
};

// Keys visible to a query row: [0, visible_keys). causal_offset is seqlen_k - seqlen_q (bottom-right)
// or 0 (top-left): key j is visible to query i iff j <= i + causal_offset.
struct MaskRule {
  bool causal = false;
  int64_t causal_offset = 0;

  int64_t visible_keys(int64_t row, int64_t seqlen_k) const {
    if (!causal) return seqlen_k;
    return std::clamp<int64_t>(row + causal_offset + 1, 0, seqlen_k);
  }
};

// Unmasked (query, key) pairs of one head, counted exactly.
inline int64_t unmasked_pairs(int64_t seqlen_q, int64_t seqlen_k, const MaskRule& mask) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < seqlen_q; ++i) pairs += mask.visible_keys(i, seqlen_k);
  return pairs;
}

struct ReferenceRow {
  std::vector<double> out;  // (head_dim)
  double lse = 0;           // natural log; -inf for a fully masked row
};

// softmax(q_i · K^T · scale) V for query row i of (batch, head) in float64; a fully masked row gives zeros
// and -inf, as the C ABI specifies. Query head h reads key/value head h / (heads_q / heads_kv).
inline ReferenceRow reference_row(const HostTensor& q, const HostTensor& k, const HostTensor& v, int64_t batch,
                                  int64_t head, int64_t row, double scale, const MaskRule& mask) {
  const int64_t head_dim = q.shape[3];
  const int64_t kv_head = head / (q.shape[2] / k.shape[2]);
  const int64_t keys = mask.visible_keys(row, k.shape[1]);
  ReferenceRow result;
  result.out.assign(static_cast<size_t>(head_dim), 0.0);
  if (keys == 0) {
    result.lse = -std::numeric_limits<double>::infinity();
    return result;
  }
  std::vector<double> query(static_cast<size_t>(head_dim));
  for (int64_t d = 0; d < head_dim; ++d) query[d] = q.at(batch, row, head, d);
  std::vector<double> scores(static_cast<size_t>(keys));  // (keys)
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < keys; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < head_dim; ++d) dot += query[d] * k.at(batch, j, kv_head, d);
    scores[j] = dot * scale;
    max_score = std::max(max_score, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) {
    const double p = std::exp(scores[j] - max_score);
    sum += p;
    for (int64_t d = 0; d < head_dim; ++d) result.out[d] += p * v.at(batch, j, kv_head, d);
  }
  for (double& value : result.out) value /= sum;
  result.lse = max_score + std::log(sum);
  return result;
}

}  // namespace flashgen::cli
