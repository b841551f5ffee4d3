// DeviceBuffer: device memory from cuMemAlloc through flashgen::driver(), freed on scope exit in the context
// that allocated it. `flashgen run` and the [gpu] tests hold their tensors in it.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

namespace flashgen {

// Allocate and use while a flashgen::ScopedContext (or another current context) is alive; the buffer
// remembers its context and frees in it.
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
  // A typed address byte_offset bytes in, for a tensor's data and kernel arguments.
  void* data(size_t byte_offset = 0) const { return reinterpret_cast<void*>(ptr_ + byte_offset); }
  size_t bytes() const { return bytes_; }

  // Synchronous copies on the legacy default stream (cuMemcpyHtoD / DtoH), byte_offset into the buffer.
  void upload(const void* host, size_t bytes, size_t byte_offset = 0);
  void download(void* host, size_t bytes, size_t byte_offset = 0) const;
  // bytes from `from` at from_offset to this buffer at byte_offset, synchronously, device to device.
  void copy_from(const DeviceBuffer& from, size_t bytes, size_t byte_offset = 0, size_t from_offset = 0);
  // Sets every byte, ordered on stream (the legacy default stream when null).
  void fill_bytes(unsigned char value, CUstream stream = nullptr);

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

}  // namespace flashgen
