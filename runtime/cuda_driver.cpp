// The CUDA driver API loaded with dlopen on first use: one thread-safe load + cuInit per process, whose
// failure is remembered and rethrown cheaply, plus error text, context scoping and device queries.
#include "runtime/cuda_driver.hpp"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

namespace flashgen {
namespace {

// Two levels so the argument is macro-expanded first: cuMemAlloc -> "cuMemAlloc_v2", the symbol cuda.h
// means (and the one whose signature decltype(&::cuMemAlloc) describes).
#define FLASHGEN_STRINGIFY_EXPANDED(x) #x
#define FLASHGEN_STRINGIFY(x) FLASHGEN_STRINGIFY_EXPANDED(x)

constexpr const char* kDriverLibrary = "libcuda.so.1";

// The outcome of the one load attempt: either api is complete and cuInit succeeded, or failure says why.
struct DriverState {
  DriverApi api;
  bool loaded = false;       // every symbol resolved (error names usable even if cuInit failed)
  bool initialised = false;  // cuInit(0) succeeded and a device exists
  std::string failure;
};

std::string raw_result_text(CUresult result) {
  return "CUresult " + std::to_string(static_cast<int>(result));
}

std::string result_text(const DriverApi& api, CUresult result) {
  const char* name = nullptr;
  const char* description = nullptr;
  if (api.cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    // The toolkit's stub libcuda answers every call, cuGetErrorName included, with this code.
    if (result == CUDA_ERROR_STUB_LIBRARY)
      return "CUDA_ERROR_STUB_LIBRARY: the toolkit's link-time stub was loaded instead of a real driver";
    return raw_result_text(result);
  }
  if (api.cuGetErrorString(result, &description) != CUDA_SUCCESS || description == nullptr)
    return name;
  return std::string(name) + ": " + description;
}

// The file the driver was actually loaded from (LD_LIBRARY_PATH may point at a stub or an old driver).
std::string loaded_from(const DriverApi& api) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(api.cuInit), &info) != 0 && info.dli_fname != nullptr)
    return info.dli_fname;
  return kDriverLibrary;
}

DriverState load_driver() {
  DriverState state;
  // The handle is never closed: function pointers into it live for the whole process.
  void* handle = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    state.failure = std::string("no CUDA driver: ") + kDriverLibrary + " could not be opened (" +
                    (why != nullptr ? why : "unknown dlopen error") + ")";
    return state;
  }

  std::string missing;
#define FLASHGEN_DRIVER_RESOLVE(fn)                                                            \
  state.api.fn = reinterpret_cast<decltype(state.api.fn)>(dlsym(handle, FLASHGEN_STRINGIFY(fn))); \
  if (state.api.fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(FLASHGEN_STRINGIFY(fn));
  FLASHGEN_DRIVER_FUNCTIONS(FLASHGEN_DRIVER_RESOLVE)
#undef FLASHGEN_DRIVER_RESOLVE
  if (!missing.empty()) {
    state.failure = std::string("CUDA driver too old: ") + kDriverLibrary + " lacks " + missing;
    return state;
  }
  state.loaded = true;

  CUresult result = state.api.cuInit(0);
  if (result != CUDA_SUCCESS) {
    state.failure =
        "cuInit failed: " + result_text(state.api, result) + " (driver " + loaded_from(state.api) + ")";
    return state;
  }
  int count = 0;
  result = state.api.cuDeviceGetCount(&count);
  if (result != CUDA_SUCCESS) {
    state.failure = "cuDeviceGetCount failed: " + result_text(state.api, result);
    return state;
  }
  if (count <= 0) {
    state.failure = "no CUDA device found";
    return state;
  }
  state.initialised = true;
  return state;
}

// Loaded once; C++11 guarantees thread-safe initialisation of the function-local static.
const DriverState& driver_state() {
  static const DriverState state = load_driver();
  return state;
}

// The primary context of a device, retained once per device for the whole process (never released:
// the process may use it until exit, and releasing at static-destruction time races the driver's own
// teardown).
CUcontext process_primary_context(int ordinal) {
  static std::mutex mutex;
  static std::map<int, CUcontext> retained;  // device ordinal -> its primary context
  std::lock_guard<std::mutex> lock(mutex);
  auto found = retained.find(ordinal);
  if (found != retained.end()) return found->second;
  CUdevice device = 0;
  FLASHGEN_CU_CHECK(cuDeviceGet(&device, ordinal));
  CUcontext primary = nullptr;
  FLASHGEN_CU_CHECK(cuDevicePrimaryCtxRetain(&primary, device));
  retained.emplace(ordinal, primary);
  return primary;
}

// Codes with which cuPointerGetAttributes answers for memory no CUDA context knows (a plain malloc'd or
// stack pointer), depending on the driver: not a failure, just not device memory.
bool means_unknown_pointer(CUresult result) {
  return result == CUDA_ERROR_INVALID_VALUE || result == CUDA_ERROR_INVALID_CONTEXT;
}

}  // namespace

const DriverApi& driver() {
  const DriverState& state = driver_state();
  if (!state.initialised) throw Error(Status::kNoDevice, state.failure);
  return state.api;
}

bool driver_available(std::string* why) {
  const DriverState& state = driver_state();
  if (!state.initialised && why != nullptr) *why = state.failure;
  return state.initialised;
}

std::string cu_error_text(CUresult result) {
  const DriverState& state = driver_state();
  if (!state.loaded) return raw_result_text(result);
  return result_text(state.api, result);
}

void throw_cu_error(CUresult result, const char* call, const char* file, int line) {
  throw Error(Status::kCuda, std::string(file) + ":" + std::to_string(line) + ": " + call +
                                 " failed: " + cu_error_text(result));
}

PointerInfo pointer_info(const void* ptr) {
  const DriverApi& api = driver();
  PointerInfo info;
  if (ptr == nullptr) return info;
  // Sized and zeroed wider than the driver writes: IS_MANAGED is documented only as "a boolean", so
  // whichever of 1 or 4 bytes the driver stores, any non-zero value reads as true.
  unsigned int memory_type = 0;  // CUmemorytype; 0 when the driver does not know the pointer
  int ordinal = -1;
  unsigned long long is_managed = 0;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* values[] = {&memory_type, &ordinal, &is_managed};
  constexpr unsigned kCount = sizeof(attributes) / sizeof(attributes[0]);
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(ptr);
  CUresult result = api.cuPointerGetAttributes(kCount, attributes, values, address);
  if (result == CUDA_ERROR_INVALID_CONTEXT) {
    // Some drivers answer this on a thread with no current context whatever the pointer is. Under
    // unified addressing any context can describe any pointer, so ask again inside device 0's primary
    // context (retained for the process, as ScopedContext does; nothing stays current after).
    CUcontext current = nullptr;
    FLASHGEN_CU_CHECK(cuCtxGetCurrent(&current));
    if (current == nullptr) {
      ScopedContext scope;
      memory_type = 0;
      ordinal = -1;
      is_managed = 0;
      result = api.cuPointerGetAttributes(kCount, attributes, values, address);
    }
  }
  if (means_unknown_pointer(result)) return info;
  if (result != CUDA_SUCCESS) throw_cu_error(result, "cuPointerGetAttributes(ptr)", __FILE__, __LINE__);
  // Pinned host memory (CU_MEMORYTYPE_HOST) is left out on purpose: kernels reading it go over PCIe.
  if (memory_type == CU_MEMORYTYPE_DEVICE || is_managed != 0) {
    info.device_accessible = true;
    info.device = ordinal;
  }
  return info;
}

template <class FallbackDevice>
void ScopedContext::enter(CUstream stream, FallbackDevice fallback_device) {
  CUcontext current = nullptr;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&current));
  if (stream != nullptr) {
    FLASHGEN_CU_CHECK(cuStreamGetCtx(stream, &context_));
  } else if (current != nullptr) {
    context_ = current;
  } else {
    context_ = process_primary_context(fallback_device());
  }
  if (context_ != current) {
    FLASHGEN_CU_CHECK(cuCtxPushCurrent(context_));
    pushed_ = true;
  }
  try {
    FLASHGEN_CU_CHECK(cuCtxGetDevice(&device_));
  } catch (...) {
    if (pushed_) {
      CUcontext popped = nullptr;
      driver().cuCtxPopCurrent(&popped);
    }
    throw;
  }
}

ScopedContext::ScopedContext(CUstream stream, int fallback_device) {
  enter(stream, [&] { return fallback_device; });
}

ScopedContext::ScopedContext(CUstream stream, const void* home) {
  enter(stream, [&] {
    const PointerInfo info = pointer_info(home);
    return info.device_accessible ? info.device : 0;
  });
}

ScopedContext::~ScopedContext() {
  if (!pushed_) return;
  // A destructor cannot throw; a failed pop leaves nothing better to do than carry on.
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);
}

bool stream_capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  FLASHGEN_CU_CHECK(cuStreamIsCapturing(stream, &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void launch_kernel(CUfunction function, const unsigned (&grid)[3], unsigned threads, unsigned smem_bytes,
                   CUstream stream, void** args, bool overlap_previous) {
  if (!overlap_previous) {
    FLASHGEN_CU_CHECK(
        cuLaunchKernel(function, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes, stream, args, nullptr));
    return;
  }
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = grid[0], config.gridDimY = grid[1], config.gridDimZ = grid[2];
  config.blockDimX = threads, config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = smem_bytes;
  config.hStream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  FLASHGEN_CU_CHECK(cuLaunchKernelEx(&config, function, args, nullptr));
}

int device_sm(CUdevice device) {
  int major = 0;
  int minor = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device));
  return major * 10 + minor;
}

const DeviceTraits& device_traits(CUdevice device) {
  static std::mutex mutex;
  static std::map<CUdevice, DeviceTraits> known;  // nodes never move: references stay valid
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto found = known.find(device); found != known.end()) return found->second;
  }
  DeviceTraits traits;
  traits.sm = device_sm(device);
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&traits.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&traits.l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device));
  std::lock_guard<std::mutex> lock(mutex);
  return known.emplace(device, traits).first->second;
}

}  // namespace flashgen
