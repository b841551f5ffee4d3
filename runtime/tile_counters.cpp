// Per-stream tile counters: one slab of kTileCounterSlots ints per context, zeroed once, a slot per stream.
#include "tile_counters.hpp"

#include <map>
#include <mutex>

#include "cuda_driver.hpp"

namespace flashgen {
namespace {

struct Slab {
  CUdeviceptr base = 0;
  int used = 0;
  std::map<unsigned long long, CUdeviceptr> slots;  // by stream id: a new stream may reuse a handle
};

}  // namespace

CUdeviceptr stream_tile_counter(CUstream stream) {
  if (stream == CU_STREAM_PER_THREAD || stream_capturing(stream)) return 0;
  CUcontext ctx = nullptr;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&ctx));
  unsigned long long ctx_id = 0;
  FLASHGEN_CU_CHECK(cuCtxGetId(ctx, &ctx_id));
  unsigned long long stream_id = 0;
  FLASHGEN_CU_CHECK(cuStreamGetId(stream, &stream_id));

  static std::mutex mutex;
  static std::map<unsigned long long, Slab> slabs;  // by context id: never reused, unlike the handle
  const std::lock_guard<std::mutex> lock(mutex);
  Slab& slab = slabs[ctx_id];
  if (auto it = slab.slots.find(stream_id); it != slab.slots.end()) return it->second;
  if (slab.used == kTileCounterSlots) return 0;
  if (slab.base == 0) {
    // Zeroed in this stream's order and waited for: a memset into the legacy default stream would not
    // be ordered before launches into a non-blocking stream, and every slot must read 0 before the
    // first launch into any stream.
    CUdeviceptr base = 0;
    FLASHGEN_CU_CHECK(cuMemAlloc(&base, sizeof(int) * kTileCounterSlots));
    CUresult r = driver().cuMemsetD32Async(base, 0, kTileCounterSlots, stream);
    if (r == CUDA_SUCCESS) r = driver().cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS) {
      driver().cuMemFree(base);
      throw_cu_error(r, "zeroing the tile counters", __FILE__, __LINE__);
    }
    slab.base = base;
  }
  const CUdeviceptr counter = slab.base + sizeof(int) * static_cast<size_t>(slab.used++);
  slab.slots.emplace(stream_id, counter);
  return counter;
}

}  // namespace flashgen
