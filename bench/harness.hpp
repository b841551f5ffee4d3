// What the cuDNN comparison programs (bench/cudnn_variants.cpp, bench/cudnn_fp8.cpp) share: failing with the
// program's name, argument lists, device buffers, the L2-flushed interleaved timer, and the CSV rows' device,
// date and versions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/cudnn_graphs.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"

namespace cudnn_variants {

// The prefix of the program's error messages ("cudnn_fp8"): each program defines it.
extern const char kProgramName[];

// Prints "<kProgramName>: what" and exits 1.
[[noreturn]] void fail(const std::string& what);
void cuda_check(cudaError_t status, const char* what);
void flashgen_check(int status, const char* what);

// A comma-separated list, empty items dropped.
std::vector<std::string> split(const std::string& text);
// A comma-separated list of positive integers; fails naming the flag otherwise.
std::vector<int> split_ints(const std::string& text, const char* flag);

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes);  // at least 256 bytes, so that an empty tensor still has an address
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// The device's properties, a non-blocking stream and a cuDNN handle on it.
struct CudnnDevice {
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
};

// Device 0 set up as above; prints "no GPU" and exits 77 (skipped) where there is none.
CudnnDevice open_device();

// A [batch, seqlen, heads, head_dim] tensor of flashgen's C ABI over a buffer, contiguous in that order.
flashgen_tensor tensor_of(const Shape& s, const DeviceBuffer& buffer, flashgen_dtype dtype);

// The problem as the FLOP counts take it (check/reference.hpp's forward_flops and backward_flops).
flashgen::AttentionShape counted_shape(const Shape& s);

// A device tensor's values on the host, as floats: 16-bit (fp16 or bf16) bits or fp32.
std::vector<float> half_values(const void* device, int64_t count, flashgen::DType dtype);
std::vector<float> fp32_values(const void* device, int64_t count);

// The largest |a - b|, over the largest |b| when relative; infinite where either holds a NaN or an infinity.
double largest_difference(const std::vector<float>& a, const std::vector<float>& b, bool relative);

// Median milliseconds of each call, the calls interleaved sample by sample after three warm-up rounds, each
// after a 256 MB write that flushes the L2; NaN for an empty call.
struct Timer {
  cudaStream_t stream;
  DeviceBuffer flush{256u << 20};
  cudaEvent_t start{}, stop{};
  explicit Timer(cudaStream_t s);
  ~Timer();
  double once(const std::function<void()>& call);
  std::vector<double> medians(int samples, const std::vector<std::function<void()>>& calls);
};

// Today's date (UTC), YYYY-MM-DD, for the CSV rows.
std::string today();
// cuDNN's version number as cudnnGetVersion gives it.
std::string cudnn_version();
// Text fit for one CSV field: commas to semicolons, newlines to spaces, at most 200 characters.
std::string csv_field(std::string text);

// CSV rows to stdout, or to a file (path not empty) with each row echoed to stderr.
class CsvWriter {
 public:
  CsvWriter(const std::string& path, const char* header);  // fails where the file cannot be written
  void row(const char* line);

 private:
  std::ostream& out();
  std::ofstream file_;
  bool to_file_;
};

}  // namespace cudnn_variants
