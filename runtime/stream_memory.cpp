// StreamAllocation (stream_memory.hpp): one memory pool per device, created on first use, that keeps what it
// holds; allocations in stream order from it, or graph memory nodes while a stream is captured.
#include "runtime/stream_memory.hpp"

#include <cstdint>
#include <map>
#include <mutex>

#include "runtime/cuda_driver.hpp"

namespace flashgen {
namespace {

std::mutex& pools_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Pools by device ordinal; never destroyed, as the driver frees them with the process.
std::map<int, CUmemoryPool>& pools() {
  static std::map<int, CUmemoryPool> by_device;
  return by_device;
}

CUmemoryPool pool_of_current_device() {
  CUdevice device = 0;
  FLASHGEN_CU_CHECK(cuCtxGetDevice(&device));
  const std::lock_guard<std::mutex> lock(pools_mutex());
  auto [it, inserted] = pools().try_emplace(static_cast<int>(device), nullptr);
  if (!inserted) return it->second;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = static_cast<int>(device);
  CUmemoryPool pool = nullptr;
  try {
    FLASHGEN_CU_CHECK(cuMemPoolCreate(&pool, &props));
    // Keep everything between calls: released only by release_cached_stream_memory().
    cuuint64_t keep = UINT64_MAX;
    FLASHGEN_CU_CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  } catch (...) {
    pools().erase(it);
    throw;
  }
  it->second = pool;
  return pool;
}

}  // namespace

StreamAllocation::StreamAllocation(size_t bytes, CUstream stream) : stream_(stream) {
  if (stream_capturing(stream)) {
    FLASHGEN_CU_CHECK(cuMemAllocAsync(&ptr_, bytes, stream));
  } else {
    FLASHGEN_CU_CHECK(cuMemAllocFromPoolAsync(&ptr_, bytes, pool_of_current_device(), stream));
  }
}

StreamAllocation::~StreamAllocation() {
  if (ptr_ != 0) driver().cuMemFreeAsync(ptr_, stream_);  // a destructor cannot report a failure
}

void StreamAllocation::release() {
  const CUdeviceptr ptr = ptr_;
  ptr_ = 0;
  FLASHGEN_CU_CHECK(cuMemFreeAsync(ptr, stream_));
}

void release_cached_stream_memory() {
  const std::lock_guard<std::mutex> lock(pools_mutex());
  for (const auto& [device, pool] : pools()) FLASHGEN_CU_CHECK(cuMemPoolTrimTo(pool, 0));
}

size_t cached_stream_memory(int device) {
  const std::lock_guard<std::mutex> lock(pools_mutex());
  const auto it = pools().find(device);
  if (it == pools().end()) return 0;
  cuuint64_t reserved = 0;
  FLASHGEN_CU_CHECK(cuMemPoolGetAttribute(it->second, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  return static_cast<size_t>(reserved);
}

}  // namespace flashgen
