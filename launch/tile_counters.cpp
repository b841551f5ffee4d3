// Per-stream tile counters: one slab of kTileCounterSlots ints per context, a slot per stream, zeroed in that
// stream's order when it is handed out.
#include "launch/tile_counters.hpp"

#include <map>
#include <mutex>

#include "runtime/cuda_driver.hpp"

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
  if (slab.base == 0) FLASHGEN_CU_CHECK(cuMemAlloc(&slab.base, sizeof(int) * kTileCounterSlots));
  // Zeroed in this stream's order (only this stream ever uses the slot), queued before the slot is handed out,
  // under the lock so that no other thread's launch into the stream gets it first; nothing waits for the
  // stream's earlier work.
  const CUdeviceptr counter = slab.base + sizeof(int) * static_cast<size_t>(slab.used);
  FLASHGEN_CU_CHECK(cuMemsetD32Async(counter, 0, 1, stream));
  ++slab.used;
  slab.slots.emplace(stream_id, counter);
  return counter;
}

}  // namespace flashgen
