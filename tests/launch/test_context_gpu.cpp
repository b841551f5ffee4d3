// [gpu] tests of CUDA context handling: pointer_info with no current context, ScopedContext restoring the
// caller's current context, and KernelRegistry loading afresh into a context created after another was
// destroyed (possibly at the same address), checked by running a forward pass in each.
#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/kernel_registry.hpp"

namespace {

using flashgen::DeviceBuffer;

CUcontext current_context() {
  CUcontext current = nullptr;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&current));
  return current;
}

// Empties this thread's context stack for the test and puts it back after, so "no current context"
// holds whatever earlier tests left behind.
class EmptyContextStack {
 public:
  EmptyContextStack() {
    // Bounded: a stack deeper than this means something is pushing in a loop.
    for (int i = 0; i < 64 && current_context() != nullptr; ++i) {
      CUcontext popped = nullptr;
      FLASHGEN_CU_CHECK(cuCtxPopCurrent(&popped));
      saved_.push_back(popped);
    }
    REQUIRE(current_context() == nullptr);
  }
  ~EmptyContextStack() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) flashgen::driver().cuCtxPushCurrent(*it);
  }
  EmptyContextStack(const EmptyContextStack&) = delete;
  EmptyContextStack& operator=(const EmptyContextStack&) = delete;

 private:
  std::vector<CUcontext> saved_;  // popped order: top of the stack first
};

// A context of its own on device 0 (cuCtxCreate pushes it), destroyed at scope exit, which also pops it
// when it is current.
class CreatedContext {
 public:
  CreatedContext() {
    CUdevice device = 0;
    FLASHGEN_CU_CHECK(cuDeviceGet(&device, 0));
    // CUDA 13's cuCtxCreate (cuCtxCreate_v4) takes creation parameters first; null means none.
    FLASHGEN_CU_CHECK(cuCtxCreate(&context_, nullptr, 0, device));
  }
  ~CreatedContext() {
    if (context_ != nullptr) flashgen::driver().cuCtxDestroy(context_);  // a destructor cannot throw
  }
  CreatedContext(const CreatedContext&) = delete;
  CreatedContext& operator=(const CreatedContext&) = delete;

  CUcontext get() const { return context_; }
  void destroy() {
    if (context_ == nullptr) return;
    CUcontext context = context_;
    context_ = nullptr;
    FLASHGEN_CU_CHECK(cuCtxDestroy(context));
  }

 private:
  CUcontext context_ = nullptr;
};

// Runs flashgen::attention_forward on a tiny fp16 problem (b 1, s 64, h 2, d 64, random inputs in
// [-1, 1)) in the current context and returns what it ran. Fails the test if the launch or the
// context reports an error, or the output holds a NaN.
flashgen::ForwardLaunch run_tiny_forward(uint32_t seed) {
  constexpr int64_t kBatch = 1, kSeqlen = 64, kHeads = 2, kHeadDim = 64;
  constexpr int64_t kElements = kBatch * kSeqlen * kHeads * kHeadDim;
  std::mt19937 engine(seed);
  std::vector<uint16_t> host(kElements);
  std::vector<DeviceBuffer> inputs;
  for (int i = 0; i < 3; ++i) {
    for (uint16_t& bits : host)
      bits = flashgen::float_to_half_bits(static_cast<float>(engine() % 2048) / 1024.0f - 1.0f);
    inputs.emplace_back(kElements * sizeof(uint16_t));
    inputs.back().upload(host);
  }
  DeviceBuffer out(kElements * sizeof(uint16_t));
  out.fill_bytes(0xFF);  // NaN everywhere: an element the kernel does not write shows up below

  auto view = [](DeviceBuffer& b) {
    return flashgen::bshd_view(b.data(), flashgen::DType::kFloat16, kBatch, kSeqlen, kHeads, kHeadDim);
  };
  const flashgen::TensorView q = view(inputs[0]), k = view(inputs[1]), v = view(inputs[2]), o = view(out);
  flashgen::CallOptions options;
  options.mask = flashgen::Mask::kNone;
  const flashgen::ForwardLaunch launch = flashgen::attention_forward(q, k, v, o, nullptr, options, nullptr);
  INFO("ran " << launch.config.name() << " on sm_" << launch.arch);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());

  const std::vector<uint16_t> result = out.download_all<uint16_t>();
  REQUIRE(result.size() == static_cast<size_t>(kElements));
  int64_t nans = 0;
  for (uint16_t bits : result) nans += std::isnan(flashgen::half_bits_to_float(bits)) ? 1 : 0;
  CHECK(nans == 0);
  return launch;
}

}  // namespace

TEST_CASE("pointer_info with no current context tells device memory from host memory", "[cuda_driver][gpu]") {
  FLASHGEN_REQUIRE_GPU();
  EmptyContextStack empty;
  std::vector<DeviceBuffer> device;  // frees in its own context whatever is current then
  {
    flashgen::ScopedContext scope;  // no current context: device 0's primary context
    REQUIRE(scope.context() != nullptr);
    device.emplace_back(4096);
  }
  REQUIRE(current_context() == nullptr);

  const flashgen::PointerInfo start = flashgen::pointer_info(device[0].data());
  CHECK(start.device_accessible);
  CHECK(start.device == 0);
  const flashgen::PointerInfo interior = flashgen::pointer_info(device[0].data(1000));
  CHECK(interior.device_accessible);
  CHECK(interior.device == 0);

  void* heap = std::malloc(4096);
  REQUIRE(heap != nullptr);
  const flashgen::PointerInfo host = flashgen::pointer_info(heap);
  std::free(heap);
  CHECK_FALSE(host.device_accessible);
  CHECK(host.device == -1);
  int on_stack = 0;
  CHECK_FALSE(flashgen::pointer_info(&on_stack).device_accessible);
  CHECK_FALSE(flashgen::pointer_info(nullptr).device_accessible);

  // Asking makes no context current behind the caller's back.
  CHECK(current_context() == nullptr);

  // With a context current the answers are the same.
  flashgen::ScopedContext scope;
  CHECK(flashgen::pointer_info(device[0].data()).device_accessible);
  CHECK(flashgen::pointer_info(device[0].data()).device == 0);
  CHECK_FALSE(flashgen::pointer_info(&on_stack).device_accessible);
}

TEST_CASE("ScopedContext leaves the caller's current context as it found it", "[cuda_driver][gpu]") {
  FLASHGEN_REQUIRE_GPU();
  EmptyContextStack empty;

  SECTION("no context current: device 0's primary context for the scope, none after") {
    CUcontext inside = nullptr;
    {
      flashgen::ScopedContext scope;
      inside = scope.context();
      CHECK(inside != nullptr);
      CHECK(current_context() == inside);
      CHECK(scope.device() == 0);
    }
    CHECK(current_context() == nullptr);
    // The primary context is retained once for the process: the next scope gets the same one.
    {
      flashgen::ScopedContext scope(nullptr, 0);
      CHECK(scope.context() == inside);
    }
    CHECK(current_context() == nullptr);

    // Another device's own primary context, when there is one; a device that does not exist throws
    // and leaves nothing current.
    int count = 0;
    FLASHGEN_CU_CHECK(cuDeviceGetCount(&count));
    if (count >= 2) {
      flashgen::ScopedContext scope(nullptr, 1);
      CHECK(scope.device() == 1);
      CHECK(scope.context() != inside);
    }
    CHECK(current_context() == nullptr);
    CHECK_THROWS_AS(flashgen::ScopedContext(nullptr, count), flashgen::Error);
    CHECK(current_context() == nullptr);
  }

  SECTION("a context current: the scope uses it and it stays current") {
    CreatedContext created;
    REQUIRE(current_context() == created.get());
    {
      flashgen::ScopedContext scope;
      CHECK(scope.context() == created.get());
      CHECK(current_context() == created.get());
    }
    CHECK(current_context() == created.get());
  }

  SECTION("a stream of another context: that context for the scope, the caller's after") {
    CreatedContext stream_context;  // current until popped below
    CUstream stream = nullptr;
    FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUcontext popped = nullptr;
    FLASHGEN_CU_CHECK(cuCtxPopCurrent(&popped));
    REQUIRE(popped == stream_context.get());
    {
      CreatedContext caller_context;
      REQUIRE(current_context() == caller_context.get());
      {
        flashgen::ScopedContext scope(stream);
        CHECK(scope.context() == stream_context.get());
        CHECK(current_context() == stream_context.get());
      }
      CHECK(current_context() == caller_context.get());
    }
    CHECK(current_context() == nullptr);
    // The stream goes in its own context, before that context is destroyed (current, so also popped).
    FLASHGEN_CU_CHECK(cuCtxPushCurrent(stream_context.get()));
    FLASHGEN_CU_CHECK(cuStreamDestroy(stream));
  }

  // Every section's contexts are destroyed (and popped) by now.
  CHECK(current_context() == nullptr);
}

TEST_CASE("KernelRegistry loads afresh into a context created after another was destroyed",
          "[kernel_registry][gpu]") {
  FLASHGEN_REQUIRE_GPU();
  EmptyContextStack empty;
  flashgen::KernelRegistry& registry = flashgen::KernelRegistry::instance();

  // Several rounds: the driver often puts a new context at the address of the one just destroyed,
  // which is the case a registry keyed by the context pointer got wrong (a function from a dead module).
  constexpr int kRounds = 3;
  std::set<CUcontext> addresses;
  bool address_reused = false;
  for (int round = 0; round < kRounds; ++round) {
    INFO("round " << round);
    CreatedContext context;
    REQUIRE(current_context() == context.get());
    address_reused |= !addresses.insert(context.get()).second;

    const flashgen::ForwardLaunch launch = run_tiny_forward(1000 + round);
    // The function the forward pass used, asked for directly: loaded into this context and usable.
    CUfunction function = registry.function(launch.config, flashgen::FwdKernel::kAttend, context.get(), launch.arch);
    REQUIRE(function != nullptr);
    int max_threads = 0;
    FLASHGEN_CU_CHECK(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function));
    CHECK(max_threads >= launch.config.threads());
    // Remembered for this context: the same handle again.
    CHECK(registry.function(launch.config, flashgen::FwdKernel::kAttend, context.get(), launch.arch) == function);

    // A second forward pass in the same context goes through the remembered function.
    CHECK(run_tiny_forward(2000 + round).config == launch.config);
    context.destroy();
    CHECK(current_context() == nullptr);
  }
  // Without a reused address a pass says less: a registry keyed by the context pointer would have
  // passed this run too.
  if (!address_reused) WARN("no new context reused a destroyed one's address in " << kRounds << " rounds");
}
