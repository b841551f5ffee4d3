// Host-side ground truth for attention tests and tools: fp16/bf16 <-> float conversion, a float64
// reference forward, a "naive same-dtype" forward that sets the error budget, the tolerance rule, and a
// device buffer RAII helper. No Catch2 here: checks return reports that the caller prints.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashgen/flashgen.h"

namespace flashgen::test {

// ---------------------------------------------------------------------------------------------------
// 16-bit floats on the host, stored as uint16_t. Float -> 16-bit rounds to nearest, ties to even;
// overflow gives inf, NaN stays a (quiet) NaN, subnormals are produced and read exactly.

uint16_t float_to_half_bits(float value);
float half_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(uint16_t bits);

uint16_t float_to_dtype_bits(float value, flashgen_dtype dtype);
float dtype_bits_to_float(uint16_t bits, flashgen_dtype dtype);
// value rounded to the dtype and read back: what a 16-bit store of value holds.
float round_to_dtype(float value, flashgen_dtype dtype);
const char* dtype_label(flashgen_dtype dtype);  // "fp16", "bf16"
const char* mask_label(flashgen_mask mask);     // "none", "causal", "causal_top_left"

// Every byte 0xFF: a NaN in fp16, bf16 and fp32 alike; the poison written before a kernel runs.
constexpr uint16_t kPoison16 = 0xFFFF;
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;

// ---------------------------------------------------------------------------------------------------
// Views and problems.

// Element offset of (batch, seq, head, dim) given strides in elements; shape is [b, s, h, d].
struct StridedView {
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};

  int64_t offset(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3];
  }
  int64_t elements() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  // One past the largest offset the view touches (0 for an empty view): the storage it needs.
  int64_t span() const;
  static StridedView contiguous(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim);
};

struct AttentionShape {
  int64_t batch = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t head_dim = 64;

  // Multiply-adds of one reference pass (QKᵀ and PV each cost this much): bounds the CPU time.
  double reference_cost() const {
    return static_cast<double>(batch) * heads_q * seqlen_q * seqlen_k * head_dim;
  }
};

// The scale the library applies: softmax_scale when > 0, else 1/sqrt(head_dim).
double effective_softmax_scale(float softmax_scale, int64_t head_dim);

// Whether key j is visible to query i (flashgen.h's mask definitions).
inline bool key_visible(flashgen_mask mask, int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k) {
  switch (mask) {
    case FLASHGEN_MASK_CAUSAL:
      return j <= i + seqlen_k - seqlen_q;
    case FLASHGEN_MASK_CAUSAL_TOP_LEFT:
      return j <= i;
    default:
      return true;
  }
}

// An input tensor for the references: data indexed through view (shape [b, s, h, d]).
struct HostInput {
  const double* data = nullptr;
  StridedView view;
};

struct AttentionResult {
  std::vector<double> out;  // [batch, seqlen_q, heads_q, head_dim] contiguous
  std::vector<double> lse;  // [batch, heads_q, seqlen_q] contiguous, natural log; -inf for a fully masked row
};

// softmax(q kᵀ · scale, masked) v in float64 from inputs already rounded from the 16-bit tensors. Query
// head h reads key/value head h / (heads_q / heads_kv). A fully masked row gives out 0 and lse -inf.
AttentionResult attention_reference_f64(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                        const HostInput& v, double scale, flashgen_mask mask);

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

// ---------------------------------------------------------------------------------------------------
// Device memory through flashgen::driver(). Allocate and use while a flashgen::ScopedContext (or another
// current context) is alive; the buffer remembers its context and frees in it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  // A typed address byte_offset bytes in, for flashgen_tensor::data and kernel arguments.
  void* data(size_t byte_offset = 0) const { return reinterpret_cast<void*>(ptr_ + byte_offset); }
  size_t bytes() const { return bytes_; }

  // Synchronous copies on the legacy default stream (cuMemcpyHtoD / DtoH), byte_offset into the buffer.
  void upload(const void* host, size_t bytes, size_t byte_offset = 0);
  void download(void* host, size_t bytes, size_t byte_offset = 0) const;
  // cuMemsetD8 over the whole buffer (asynchronous on the legacy default stream).
  void fill_bytes(unsigned char value);

  template <typename T>
  void upload(const std::vector<T>& host) {
    upload(host.data(), host.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> download_all() const {
    std::vector<T> host(bytes_ / sizeof(T));
    download(host.data(), host.size() * sizeof(T));
    return host;
  }

 private:
  void release() noexcept;

  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
  CUcontext context_ = nullptr;
};

}  // namespace flashgen::test
