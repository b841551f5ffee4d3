// The CUDA driver API, opened at run time with dlopen("libcuda.so.1") so the library and the CLI start
// on machines with no GPU or driver: compile-only work never touches it, GPU calls get a clear error.
#pragma once

#include <cuda.h>

#include <string>

#include "flashgen/error.hpp"
#include "generator/implementability.hpp"

namespace flashgen {

// X-macro of every driver entry point flashgen uses. The names are cuda.h's, so versioned aliases
// (cuMemAlloc -> cuMemAlloc_v2) resolve to the symbol the header means.
#define FLASHGEN_DRIVER_FUNCTIONS(X) \
  X(cuInit)                          \
  X(cuDriverGetVersion)              \
  X(cuGetErrorName)                  \
  X(cuGetErrorString)                \
  X(cuDeviceGetCount)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetName)                 \
  X(cuDeviceGetAttribute)            \
  X(cuDeviceTotalMem)                \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxCreate)                     \
  X(cuCtxDestroy)                    \
  X(cuCtxGetId)                      \
  X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent)                 \
  X(cuCtxPushCurrent)                \
  X(cuCtxPopCurrent)                 \
  X(cuCtxGetDevice)                  \
  X(cuCtxSynchronize)                \
  X(cuStreamGetCtx)                  \
  X(cuStreamCreate)                  \
  X(cuStreamDestroy)                 \
  X(cuStreamSynchronize)             \
  X(cuStreamIsCapturing)             \
  X(cuStreamWaitEvent)               \
  X(cuStreamGetId)                   \
  X(cuModuleLoadData)                \
  X(cuModuleUnload)                  \
  X(cuModuleGetFunction)             \
  X(cuFuncSetAttribute)              \
  X(cuFuncGetAttribute)              \
  X(cuLaunchKernel)                  \
  X(cuLaunchKernelEx)                \
  X(cuOccupancyMaxActiveClusters)    \
  X(cuMemAlloc)                      \
  X(cuMemFree)                       \
  X(cuMemAllocAsync)                 \
  X(cuMemFreeAsync)                  \
  X(cuMemPoolCreate)                 \
  X(cuMemPoolSetAttribute)           \
  X(cuMemPoolGetAttribute)           \
  X(cuMemPoolTrimTo)                 \
  X(cuMemAllocFromPoolAsync)         \
  X(cuMemcpyHtoD)                    \
  X(cuMemcpyDtoH)                    \
  X(cuMemcpyDtoD)                    \
  X(cuMemsetD8)                      \
  X(cuMemsetD32)                     \
  X(cuMemsetD8Async)                 \
  X(cuMemsetD32Async)                \
  X(cuPointerGetAttributes)          \
  X(cuEventCreate)                   \
  X(cuEventDestroy)                  \
  X(cuEventRecord)                   \
  X(cuEventSynchronize)              \
  X(cuEventElapsedTime)              \
  X(cuTensorMapEncodeTiled)

struct DriverApi {
#define FLASHGEN_DRIVER_MEMBER(fn) decltype(&::fn) fn = nullptr;
  FLASHGEN_DRIVER_FUNCTIONS(FLASHGEN_DRIVER_MEMBER)
#undef FLASHGEN_DRIVER_MEMBER
};

// The loaded and initialised driver (cuInit done). Throws Error(kNoDevice) naming the cause when
// libcuda cannot be opened, a symbol is missing, cuInit fails or no device is present. Thread-safe.
const DriverApi& driver();

// True when driver() would succeed; otherwise fills *why.
bool driver_available(std::string* why = nullptr);

// "CUDA_ERROR_X: description" for a driver status.
std::string cu_error_text(CUresult result);

[[noreturn]] void throw_cu_error(CUresult result, const char* call, const char* file, int line);

// Where a pointer's memory lives, as the driver sees it.
struct PointerInfo {
  bool device_accessible = false;  // device or managed memory a kernel can read
  int device = -1;                 // ordinal of the device that owns it (-1 when not device memory)
};

// Asks the driver about ptr (cuPointerGetAttributes); host memory (pinned included), unknown pointers
// and null come back with device_accessible == false, never as an error. Works with no current
// context. Throws Error(kNoDevice) without a driver, Error(kCuda) on any other driver failure.
PointerInfo pointer_info(const void* ptr);

// Makes a context current for the scope: the stream's own context when the stream is not null, else
// the caller's current context, else the primary context of fallback_device (retained for the process).
class ScopedContext {
 public:
  explicit ScopedContext(CUstream stream = nullptr, int fallback_device = 0);
  // As above with the device that holds home as the fallback (device 0 when home is not device memory),
  // asked of the driver only when neither the stream nor the caller names a context.
  ScopedContext(CUstream stream, const void* home);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

  CUcontext context() const { return context_; }
  CUdevice device() const { return device_; }

 private:
  template <class FallbackDevice>
  void enter(CUstream stream, FallbackDevice fallback_device);

  CUcontext context_ = nullptr;
  CUdevice device_ = 0;
  bool pushed_ = false;
};

// Compute capability of a device as an sm number: 80, 86, 89, 90, ...
int device_sm(CUdevice device);

// What the launchers and the configs' can_implement ask of a device (generator/implementability.hpp): read from the
// driver once per device and process, so no driver query stays on a warm call's path.
const DeviceTraits& device_traits(CUdevice device);

// Whether stream is capturing a CUDA graph (nothing but the captured work may run into it).
bool stream_capturing(CUstream stream);

// cuLaunchKernel, or with overlap_previous by cuLaunchKernelEx with programmatic stream serialization
// (sm_90 on): the kernel may start once every block of the one before it in the stream has called
// launch_dependents or ended, and orders itself after that one's memory in the kernel (sm80_primitives.cuh).
void launch_kernel(CUfunction function, const unsigned (&grid)[3], unsigned threads, unsigned smem_bytes,
                   CUstream stream, void** args, bool overlap_previous = false);

}  // namespace flashgen

// Calls a driver entry point through driver() and throws Error(kCuda) with file:line, the call and
// the driver's own text on failure.
#define FLASHGEN_CU_CHECK(call_expr)                                                    \
  do {                                                                                  \
    CUresult flashgen_cu_result_ = ::flashgen::driver().call_expr;                      \
    if (flashgen_cu_result_ != CUDA_SUCCESS)                                            \
      ::flashgen::throw_cu_error(flashgen_cu_result_, #call_expr, __FILE__, __LINE__);  \
  } while (0)
