// Host-side ground truth for attention tests and tools: 16-bit conversions, the float64 and naive
// same-dtype references, the tolerance checks and the device buffer helper declared in the header.
#include "attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "cuda_driver.hpp"
#include "flashgen/error.hpp"

namespace flashgen::test {
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

// Keys visible to query i form a prefix [0, count) under every mask flashgen has; count in [0, seqlen_k].
int64_t visible_key_count(flashgen_mask mask, int64_t i, int64_t seqlen_q, int64_t seqlen_k) {
  int64_t last = seqlen_k - 1;  // last visible key index
  if (mask == FLASHGEN_MASK_CAUSAL) last = i + seqlen_k - seqlen_q;
  if (mask == FLASHGEN_MASK_CAUSAL_TOP_LEFT) last = i;
  return std::clamp<int64_t>(last + 1, 0, seqlen_k);
}

int64_t kv_head_of(const AttentionShape& shape, int64_t head_q) {
  return head_q / (shape.heads_q / shape.heads_kv);
}

void require_shapes(const AttentionShape& shape, const HostInput& q, const HostInput& k, const HostInput& v) {
  FLASHGEN_REQUIRE(shape.heads_kv > 0 && shape.heads_q % shape.heads_kv == 0,
                   "reference: heads_q must be a positive multiple of heads_kv");
  const int64_t want_q[4] = {shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim};
  const int64_t want_kv[4] = {shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim};
  for (int i = 0; i < 4; ++i) {
    FLASHGEN_REQUIRE(q.view.shape[i] == want_q[i], "reference: q view does not match the problem shape");
    FLASHGEN_REQUIRE(k.view.shape[i] == want_kv[i], "reference: k view does not match the problem shape");
    FLASHGEN_REQUIRE(v.view.shape[i] == want_kv[i], "reference: v view does not match the problem shape");
  }
}

std::string format_double(double value) {
  std::ostringstream s;
  s.precision(7);
  s << value;
  return s.str();
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

uint16_t float_to_dtype_bits(float value, flashgen_dtype dtype) {
  return dtype == FLASHGEN_BFLOAT16 ? float_to_bf16_bits(value) : float_to_half_bits(value);
}

float dtype_bits_to_float(uint16_t bits, flashgen_dtype dtype) {
  return dtype == FLASHGEN_BFLOAT16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

float round_to_dtype(float value, flashgen_dtype dtype) {
  return dtype_bits_to_float(float_to_dtype_bits(value, dtype), dtype);
}

const char* dtype_label(flashgen_dtype dtype) { return dtype == FLASHGEN_BFLOAT16 ? "bf16" : "fp16"; }

const char* mask_label(flashgen_mask mask) {
  switch (mask) {
    case FLASHGEN_MASK_CAUSAL:
      return "causal";
    case FLASHGEN_MASK_CAUSAL_TOP_LEFT:
      return "causal_top_left";
    default:
      return "none";
  }
}

// ---------------------------------------------------------------------------------------------------
// Views.

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

// ---------------------------------------------------------------------------------------------------
// References.

AttentionResult attention_reference_f64(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                        const HostInput& v, double scale, flashgen_mask mask) {
  require_shapes(shape, q, k, v);
  const int64_t d_count = shape.head_dim;
  AttentionResult result;
  result.out.assign(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * d_count), 0.0);
  result.lse.assign(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q),
                    -std::numeric_limits<double>::infinity());

  std::vector<double> q_row(static_cast<size_t>(d_count));
  std::vector<double> scores(static_cast<size_t>(shape.seqlen_k));
  std::vector<double> acc(static_cast<size_t>(d_count));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = kv_head_of(shape, h);
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t visible = visible_key_count(mask, i, shape.seqlen_q, shape.seqlen_k);
        const size_t lse_index = static_cast<size_t>((b * shape.heads_q + h) * shape.seqlen_q + i);
        if (visible == 0) continue;  // fully masked row: out stays 0, lse stays -inf
        for (int64_t d = 0; d < d_count; ++d) q_row[d] = q.data[q.view.offset(b, i, h, d)];

        double row_max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const double* k_row = k.data + k.view.offset(b, j, hk, 0);
          double dot = 0.0;
          for (int64_t d = 0; d < d_count; ++d) dot += q_row[d] * k_row[d * k.view.stride[3]];
          scores[j] = dot * scale;
          row_max = std::max(row_max, scores[j]);
        }
        double row_sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < visible; ++j) {
          const double p = std::exp(scores[j] - row_max);
          row_sum += p;
          const double* v_row = v.data + v.view.offset(b, j, hk, 0);
          for (int64_t d = 0; d < d_count; ++d) acc[d] += p * v_row[d * v.view.stride[3]];
        }
        double* out_row = result.out.data() + ((b * shape.seqlen_q + i) * shape.heads_q + h) * d_count;
        for (int64_t d = 0; d < d_count; ++d) out_row[d] = acc[d] / row_sum;
        result.lse[lse_index] = row_max + std::log(row_sum);
      }
    }
  }
  return result;
}

AttentionResult attention_reference_naive(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                          const HostInput& v, double scale, flashgen_mask mask,
                                          flashgen_dtype dtype) {
  require_shapes(shape, q, k, v);
  const int64_t d_count = shape.head_dim;
  const float scale_f = static_cast<float>(scale);
  AttentionResult result;
  result.out.assign(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * d_count), 0.0);
  result.lse.assign(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q),
                    -std::numeric_limits<double>::infinity());

  std::vector<float> q_row(static_cast<size_t>(d_count));
  std::vector<float> scores(static_cast<size_t>(shape.seqlen_k));
  std::vector<float> acc(static_cast<size_t>(d_count));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = kv_head_of(shape, h);
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t visible = visible_key_count(mask, i, shape.seqlen_q, shape.seqlen_k);
        const size_t lse_index = static_cast<size_t>((b * shape.heads_q + h) * shape.seqlen_q + i);
        if (visible == 0) continue;
        // Inputs hold 16-bit values, so these float conversions are exact.
        for (int64_t d = 0; d < d_count; ++d) q_row[d] = static_cast<float>(q.data[q.view.offset(b, i, h, d)]);

        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const double* k_row = k.data + k.view.offset(b, j, hk, 0);
          float dot = 0.0f;
          for (int64_t d = 0; d < d_count; ++d) dot += q_row[d] * static_cast<float>(k_row[d * k.view.stride[3]]);
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
          const float p = round_to_dtype(scores[j] / row_sum, dtype);
          const double* v_row = v.data + v.view.offset(b, j, hk, 0);
          for (int64_t d = 0; d < d_count; ++d) acc[d] += p * static_cast<float>(v_row[d * v.view.stride[3]]);
        }
        double* out_row = result.out.data() + ((b * shape.seqlen_q + i) * shape.heads_q + h) * d_count;
        for (int64_t d = 0; d < d_count; ++d) out_row[d] = round_to_dtype(acc[d], dtype);
        result.lse[lse_index] = static_cast<double>(row_max + std::log(row_sum));
      }
    }
  }
  return result;
}

// ---------------------------------------------------------------------------------------------------
// Checks.

double output_abs_floor(flashgen_dtype dtype) { return dtype == FLASHGEN_BFLOAT16 ? 8e-3 : 1e-3; }

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

CheckReport check_output(const AttentionShape& shape, const std::vector<double>& got,
                         const AttentionResult& ref64, const AttentionResult& naive, flashgen_dtype dtype,
                         int max_listed) {
  CheckReport report;
  const std::vector<int64_t> dims = {shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim};
  const size_t count = ref64.out.size();
  if (got.size() != count || naive.out.size() != count) {
    report.ok = false;
    report.text = "output sizes differ: got " + std::to_string(got.size()) + ", ref64 " +
                  std::to_string(count) + ", naive " + std::to_string(naive.out.size());
    return report;
  }
  double naive_error = 0.0;
  for (size_t i = 0; i < count; ++i) naive_error = std::max(naive_error, std::fabs(naive.out[i] - ref64.out[i]));
  const double floor = output_abs_floor(dtype);
  report.bound = 2.0 * naive_error + floor;
  report.checked = static_cast<int64_t>(count);

  std::ostringstream listed;
  int listed_count = 0;
  for (size_t i = 0; i < count; ++i) {
    const double g = got[i];
    const double want = ref64.out[i];
    bool bad = false;
    if (std::isnan(g)) {
      ++report.not_written;
      bad = true;
    } else if (!std::isfinite(g)) {
      bad = true;
    } else {
      const double error = std::fabs(g - want);
      report.max_error = std::max(report.max_error, error);
      bad = error > report.bound;
    }
    if (!bad) continue;
    ++report.mismatches;
    if (listed_count < max_listed) {
      ++listed_count;
      listed << "\n  out" << format_index(static_cast<int64_t>(i), dims) << " [b, sq, hq, d]: got "
             << format_double(g) << ", want " << format_double(want) << " (naive " << format_double(naive.out[i])
             << ")";
    }
  }
  report.ok = report.mismatches == 0;
  std::ostringstream text;
  text << "output: max |got - ref64| = " << format_double(report.max_error) << ", bound = 2 * "
       << format_double(naive_error) << " (max |naive - ref64|) + " << floor << " = " << format_double(report.bound)
       << "; " << report.mismatches << " of " << count << " elements outside it, " << report.not_written
       << " NaN (unwritten poison or produced)";
  report.text = text.str() + listed.str();
  return report;
}

CheckReport check_lse(const AttentionShape& shape, const std::vector<float>& got, const AttentionResult& ref64,
                      int max_listed) {
  CheckReport report;
  const std::vector<int64_t> dims = {shape.batch, shape.heads_q, shape.seqlen_q};
  const size_t count = ref64.lse.size();
  if (got.size() < count) {
    report.ok = false;
    report.text = "lse: got " + std::to_string(got.size()) + " values, want " + std::to_string(count);
    return report;
  }
  report.bound = kLseTolerance;
  report.checked = static_cast<int64_t>(count);
  std::ostringstream listed;
  int listed_count = 0;
  for (size_t i = 0; i < count; ++i) {
    const double g = got[i];
    const double want = ref64.lse[i];
    bool bad = false;
    if (std::isnan(g)) {
      ++report.not_written;
      bad = true;
    } else if (std::isinf(want)) {
      bad = g != want;  // a fully masked row: -inf exactly
    } else if (!std::isfinite(g)) {
      bad = true;
    } else {
      const double error = std::fabs(g - want);
      report.max_error = std::max(report.max_error, error);
      bad = error > kLseTolerance * std::max(1.0, std::fabs(want));
    }
    if (!bad) continue;
    ++report.mismatches;
    if (listed_count < max_listed) {
      ++listed_count;
      listed << "\n  lse" << format_index(static_cast<int64_t>(i), dims) << " [b, hq, sq]: got " << format_double(g)
             << ", want " << format_double(want);
    }
  }
  report.ok = report.mismatches == 0;
  std::ostringstream text;
  text << "lse: max |got - ref64| = " << format_double(report.max_error) << " (bound " << kLseTolerance
       << " * max(1, |want|)); " << report.mismatches << " of " << count << " entries wrong, "
       << report.not_written << " NaN (unwritten poison or produced)";
  report.text = text.str() + listed.str();
  return report;
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
          out[index++] = dtype_bits_to_float(storage[static_cast<size_t>(view.offset(b, s, h, d))], dtype);
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
// DeviceBuffer.

DeviceBuffer::DeviceBuffer(size_t bytes) {
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&context_));
  if (context_ == nullptr) {
    fail(Status::kCuda, "DeviceBuffer: no current CUDA context; hold a flashgen::ScopedContext");
  }
  // cuMemAlloc rejects 0 bytes; one byte keeps an empty buffer a valid address.
  FLASHGEN_CU_CHECK(cuMemAlloc(&ptr_, std::max<size_t>(bytes, 1)));
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(other.ptr_), bytes_(other.bytes_), context_(other.context_) {
  other.ptr_ = 0;
  other.bytes_ = 0;
  other.context_ = nullptr;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    context_ = other.context_;
    other.ptr_ = 0;
    other.bytes_ = 0;
    other.context_ = nullptr;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (ptr_ == 0) return;
  try {
    // Free in the context that allocated, whatever is current now; failures cannot be reported here.
    const DriverApi& api = driver();
    CUcontext current = nullptr;
    api.cuCtxGetCurrent(&current);
    const bool push = current != context_;
    if (push) api.cuCtxPushCurrent(context_);
    api.cuMemFree(ptr_);
    if (push) {
      CUcontext popped = nullptr;
      api.cuCtxPopCurrent(&popped);
    }
  } catch (...) {
  }
  ptr_ = 0;
  bytes_ = 0;
  context_ = nullptr;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t byte_offset) {
  FLASHGEN_REQUIRE(byte_offset <= bytes_ && bytes <= bytes_ - byte_offset, "DeviceBuffer::upload past the end");
  if (bytes == 0) return;
  FLASHGEN_CU_CHECK(cuMemcpyHtoD(ptr_ + byte_offset, host, bytes));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t byte_offset) const {
  FLASHGEN_REQUIRE(byte_offset <= bytes_ && bytes <= bytes_ - byte_offset, "DeviceBuffer::download past the end");
  if (bytes == 0) return;
  FLASHGEN_CU_CHECK(cuMemcpyDtoH(host, ptr_ + byte_offset, bytes));
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  FLASHGEN_CU_CHECK(cuMemsetD8(ptr_, value, bytes_));
}

}  // namespace flashgen::test
