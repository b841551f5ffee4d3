// Tile counters of the persistent sm90 forward kernels of causal and windowed problems, one per stream. Such a
// kernel hands its tiles out through an int in device memory that must read 0 when it starts; the kernel's last
// claim sets it back to 0, so launches in one stream can share one counter without a memset between them.
// Launches that may run at the same time (other streams) get other counters.
#pragma once

#include <cuda.h>

namespace flashgen {

// The counter for launches into stream in the current context: 0 before the first launch and after each
// one that completed. Returns 0 (no counter) where sharing would not be safe or the slots are used up:
// while the stream captures a graph (its launches may replay on any stream), for the per-thread default
// stream (one handle, a stream per thread) and past kTileCounterSlots streams per context. Thread-safe.
CUdeviceptr stream_tile_counter(CUstream stream);

inline constexpr int kTileCounterSlots = 1024;

}  // namespace flashgen
