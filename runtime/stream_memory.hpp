// StreamAllocation: device memory a launch needs for its own kernels only (the backward's workspace, a user
// mask's block classes), taken and given back in stream order from flashgen's own memory pool of the device.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace flashgen {

// Memory of the current context's device from flashgen's pool of that device, allocated in the order of
// stream (cuMemAllocFromPoolAsync; no synchronization) and given back in its order after the work queued
// in between. The pool keeps what it holds across calls and synchronizations, so a call of the same size
// allocates no physical memory; the device's default pool would, with its release threshold of 0, give the
// memory back to the driver at every synchronization and map it again on the next call (bench/notes_variants.md,
// "Against cuDNN (2026-11-26)"). While stream is being captured the allocation is a graph memory node instead
// (cuMemAllocAsync), owned by the graph.
class StreamAllocation {
 public:
  StreamAllocation(size_t bytes, CUstream stream);
  // Gives the memory back in stream order if release() was not reached, as when a launch throws.
  ~StreamAllocation();
  StreamAllocation(const StreamAllocation&) = delete;
  StreamAllocation& operator=(const StreamAllocation&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  // Gives the memory back in stream order, after the work queued on the stream so far; throws on failure.
  void release();

 private:
  CUdeviceptr ptr_ = 0;
  CUstream stream_ = nullptr;
};

// Returns the memory flashgen's pools keep between calls to the driver, on every device that has one;
// allocations still in use, or whose kernels are still queued, stay valid. Touches no GPU if no pool exists.
void release_cached_stream_memory();

// Bytes of device memory flashgen's pool of device holds now, in use or kept (0 without a pool).
size_t cached_stream_memory(int device);

}  // namespace flashgen
