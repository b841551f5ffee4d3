// DeviceBuffer (device_buffer.hpp): allocation in the current context, release in the allocating one,
// and checked synchronous copies.
#include "runtime/device_buffer.hpp"

#include <algorithm>

#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {

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

void DeviceBuffer::copy_from(const DeviceBuffer& from, size_t bytes, size_t byte_offset, size_t from_offset) {
  FLASHGEN_REQUIRE(byte_offset <= bytes_ && bytes <= bytes_ - byte_offset, "DeviceBuffer::copy_from past the end");
  FLASHGEN_REQUIRE(from_offset <= from.bytes_ && bytes <= from.bytes_ - from_offset,
                   "DeviceBuffer::copy_from past the end of the source");
  if (bytes == 0) return;
  FLASHGEN_CU_CHECK(cuMemcpyDtoD(ptr_ + byte_offset, from.ptr_ + from_offset, bytes));
}

void DeviceBuffer::fill_bytes(unsigned char value, CUstream stream) {
  if (bytes_ == 0) return;
  FLASHGEN_CU_CHECK(cuMemsetD8Async(ptr_, value, bytes_, stream));
}

}  // namespace flashgen
