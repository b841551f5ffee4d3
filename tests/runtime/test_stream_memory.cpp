// Tests for runtime/stream_memory: flashgen's pool keeps a launch's memory across synchronizations, gives it back
// on request, and takes it back from an allocation that was never released. (A capturing stream's allocation,
// a graph memory node, is exercised by the PyTorch package's CUDA-graph tests through the forward's tile counter.)
#include <cuda.h>

#include <cstddef>
#include <string>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/stream_memory.hpp"

namespace {

constexpr size_t kBytes = size_t{24} << 20;

// One allocation of kBytes, written and given back in stream order, then the stream synchronized.
void allocate_write_release(CUstream stream) {
  flashgen::StreamAllocation memory(kBytes, stream);
  FLASHGEN_CU_CHECK(cuMemsetD8Async(memory.ptr(), 0x5a, kBytes, stream));
  memory.release();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
}

}  // namespace

TEST_CASE("releasing cached memory before any pool exists touches no GPU", "[stream_memory]") {
  std::string why;
  if (flashgen::driver_available(&why)) FLASHGEN_SKIP_TEST("a CUDA driver and device are present");
  CHECK(flashgen_release_cached_memory() == FLASHGEN_SUCCESS);
  CHECK(flashgen::cached_stream_memory(0) == 0);
}

TEST_CASE("flashgen's pool keeps a launch's memory across synchronizations until released", "[gpu][stream_memory]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int device = static_cast<int>(scope.device());
  CUstream stream = nullptr;
  FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  allocate_write_release(stream);
  const size_t kept = flashgen::cached_stream_memory(device);
  CHECK(kept >= kBytes);  // the device's default pool would hold nothing here
  allocate_write_release(stream);
  CHECK(flashgen::cached_stream_memory(device) == kept);  // the second call maps nothing new

  CHECK(flashgen_release_cached_memory() == FLASHGEN_SUCCESS);
  CHECK(flashgen::cached_stream_memory(device) == 0);

  {  // Unwinding without release(): the destructor gives the memory back, so a trim can return it.
    flashgen::StreamAllocation dropped(kBytes, stream);
    FLASHGEN_CU_CHECK(cuMemsetD8Async(dropped.ptr(), 0x5a, kBytes, stream));
  }
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  CHECK(flashgen::cached_stream_memory(device) >= kBytes);
  flashgen::release_cached_stream_memory();
  CHECK(flashgen::cached_stream_memory(device) == 0);
  FLASHGEN_CU_CHECK(cuStreamDestroy(stream));
}
