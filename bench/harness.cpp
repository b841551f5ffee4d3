// The cuDNN comparison programs' shared harness (harness.hpp): errors, argument lists, buffers, timing and CSV.
#include "bench/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <sstream>

namespace cudnn_variants {

void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgramName, what.c_str());
  std::exit(1);
}

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(status));
}

void flashgen_check(int status, const char* what) {
  if (status != FLASHGEN_SUCCESS) fail(std::string(what) + ": " + flashgen_last_error());
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

std::vector<int> split_ints(const std::string& text, const char* flag) {
  std::vector<int> values;
  for (const std::string& part : split(text)) {
    char* end = nullptr;
    const long value = std::strtol(part.c_str(), &end, 10);
    if (*end != '\0' || value <= 0) fail(std::string(flag) + ": not a positive integer: " + part);
    values.push_back(static_cast<int>(value));
  }
  return values;
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  cuda_check(cudaMalloc(&ptr, std::max<size_t>(bytes, 256)), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr); }

CudnnDevice open_device() {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "no GPU\n");
    std::exit(77);
  }
  CudnnDevice d;
  cuda_check(cudaGetDeviceProperties(&d.prop, 0), "device properties");
  cuda_check(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "stream");
  if (cudnnCreate(&d.handle) != CUDNN_STATUS_SUCCESS) fail("cudnnCreate");
  cudnnSetStream(d.handle, d.stream);
  return d;
}

flashgen_tensor tensor_of(const Shape& s, const DeviceBuffer& buffer, flashgen_dtype dtype) {
  flashgen_tensor t{};
  t.data = buffer.ptr;
  t.dtype = dtype;
  const int64_t shape[4] = {s.batch, s.seqlen, s.heads, s.head_dim};
  const int64_t stride[4] = {s.seqlen * s.heads * s.head_dim, s.heads * s.head_dim, s.head_dim, 1};
  std::copy(shape, shape + 4, t.shape);
  std::copy(stride, stride + 4, t.stride);
  return t;
}

flashgen::AttentionShape counted_shape(const Shape& s) {
  flashgen::AttentionShape counted;
  counted.batch = s.batch;
  counted.seqlen_q = counted.seqlen_k = s.seqlen;
  counted.heads_q = counted.heads_kv = s.heads;
  counted.head_dim = s.head_dim;
  return counted;
}

std::vector<float> half_values(const void* device, int64_t count, flashgen::DType dtype) {
  std::vector<uint16_t> bits(static_cast<size_t>(count));
  cuda_check(cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost), "copy back");
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = flashgen::dtype_bits_to_float(bits[i], dtype);
  return values;
}

std::vector<float> fp32_values(const void* device, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  cuda_check(cudaMemcpy(values.data(), device, count * 4, cudaMemcpyDeviceToHost), "copy back");
  return values;
}

double largest_difference(const std::vector<float>& a, const std::vector<float>& b, bool relative) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    diff = std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return relative && scale > 0 ? diff / scale : diff;
}

Timer::Timer(cudaStream_t s) : stream(s) {
  cuda_check(cudaEventCreate(&start), "event");
  cuda_check(cudaEventCreate(&stop), "event");
}

Timer::~Timer() {
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

double Timer::once(const std::function<void()>& call) {
  cuda_check(cudaMemsetAsync(flush.ptr, 0, 256u << 20, stream), "flush");
  cuda_check(cudaEventRecord(start, stream), "event");
  call();
  cuda_check(cudaEventRecord(stop, stream), "event");
  cuda_check(cudaEventSynchronize(stop), "event");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, start, stop), "event");
  return ms;
}

std::vector<double> Timer::medians(int samples, const std::vector<std::function<void()>>& calls) {
  for (int i = 0; i < 3; ++i) {  // warm-up
    for (const auto& call : calls) {
      if (call) once(call);
    }
  }
  std::vector<std::vector<double>> times(calls.size());
  for (int i = 0; i < samples; ++i) {
    for (size_t c = 0; c < calls.size(); ++c) {
      if (calls[c]) times[c].push_back(once(calls[c]));
    }
  }
  std::vector<double> result;
  for (std::vector<double>& t : times) {
    std::sort(t.begin(), t.end());
    result.push_back(t.empty() ? double(NAN) : t[t.size() / 2]);
  }
  return result;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

std::string cudnn_version() {
  char text[32];
  std::snprintf(text, sizeof text, "%zu", cudnnGetVersion());
  return text;
}

std::string csv_field(std::string text) {
  std::replace(text.begin(), text.end(), ',', ';');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text.substr(0, 200);
}

CsvWriter::CsvWriter(const std::string& path, const char* header) : to_file_(!path.empty()) {
  if (to_file_) {
    file_.open(path);
    if (!file_) fail("--csv: cannot write " + path);
  }
  out() << header;
}

std::ostream& CsvWriter::out() { return to_file_ ? static_cast<std::ostream&>(file_) : std::cout; }

void CsvWriter::row(const char* line) {
  out() << line;
  out().flush();
  if (to_file_) std::fputs(line, stderr);
}

}  // namespace cudnn_variants
