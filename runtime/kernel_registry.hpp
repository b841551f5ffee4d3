// Loader stage: a kernel module's config (KernelConfig, BwdConfig, DecodeConfig) -> loaded CUfunction. Compiles
// through the in-memory map, then the disk cache, then NVRTC; loads each cubin once per CUDA context.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "generator/kernel_module.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace flashgen {

// The key of one compiled kernel: name, arch and a hash of source + options + NVRTC version +
// generator version, e.g. "fwd_sm80_fp16_d128_m128_n32_w4_s3-sm90-3f2a...".
std::string kernel_cache_key(const GeneratedSource& source, int arch);

// A user variant's functions compiled once on their own (for sm_80: any GPU's compiler checks the same C++), so that
// a caller's mistakes come back before any kernel is built, as Error(kCompile) with NVRTC's messages at the
// functions' own lines ("mask_mod(2): error: ..."); each tag once per process. Needs no GPU.
void check_user_functions_compile(const UserVariant& user);

class KernelRegistry {
 public:
  // Process-wide registry using KernelCache::default_dir().
  static KernelRegistry& instance();

  explicit KernelRegistry(std::filesystem::path cache_dir);

  // Compiled module for (config, arch): memory, then disk cache, then NVRTC. Thread-safe. Config: any kernel
  // module (generator/kernel_module.hpp).
  template <class Config>
  std::shared_ptr<const CompiledKernel> compiled(const Config& config, int arch) {
    static_assert(IsKernelModule<Config>::value, "a config type of a generated module");
    return compiled_module(ModuleId{config.name(), arch}, [&] { return generate(config); });
  }

  // Local-memory bytes (spill stores + loads) ptxas reported for the config's spill_checked_kernels(), compiling
  // them first if needed.
  template <class Config>
  int spilled_bytes(const Config& config, int arch) {
    const std::shared_ptr<const CompiledKernel> module = compiled(config, arch);
    int spilled = 0;
    for (const typename Config::Kernel kernel : config.spill_checked_kernels()) {
      const ResourceUsage usage = module->usage_of(config.symbol(kernel));
      spilled += usage.spill_store_bytes + usage.spill_load_bytes;
    }
    return spilled;
  }

  // One kernel of the config's module loaded into ctx (current on this thread), its dynamic shared-memory limit
  // raised to what it uses. Modules and functions are remembered per context by the driver's unique context id
  // (cuCtxGetId), so a context created at a destroyed one's address, or a reset primary context, loads afresh.
  // Once loaded, a call costs one cuCtxGetId and a hash lookup.
  template <class Config>
  CUfunction function(const Config& config, typename Config::Kernel kernel, CUcontext ctx, int arch) {
    static_assert(IsKernelModule<Config>::value, "a config type of a generated module");
    return load(ModuleId{config.name(), arch}, config.symbol(kernel), config.smem_bytes(kernel), ctx,
                [&] { return generate(config); });
  }

  const KernelCache& disk_cache() const { return cache_; }

 private:
  using Generate = std::function<GeneratedSource()>;

  // In-process identity of a module: a process's templates never change, and a config's canonical
  // name covers every field, so (name, arch) picks the same module as kernel_cache_key without
  // regenerating and hashing the source on every launch.
  struct ModuleId {
    std::string name;
    int arch = 0;
    bool operator==(const ModuleId& other) const { return arch == other.arch && name == other.name; }
  };
  // A module (symbol empty) or one kernel of it, loaded in one context.
  struct LoadedId {
    unsigned long long context_id = 0;  // cuCtxGetId: unique for the life of the process
    ModuleId module;
    std::string symbol;
    bool operator==(const LoadedId& other) const {
      return context_id == other.context_id && module == other.module && symbol == other.symbol;
    }
  };
  struct ModuleIdHash {
    size_t operator()(const ModuleId& id) const;
  };
  struct LoadedIdHash {
    size_t operator()(const LoadedId& id) const;
  };

  std::shared_ptr<const CompiledKernel> compiled_module(const ModuleId& id, const Generate& generate_source);
  CUfunction load(const ModuleId& id, const std::string& symbol, int smem_bytes, CUcontext ctx,
                  const Generate& generate_source);

  KernelCache cache_;
  std::mutex mutex_;
  std::unordered_map<ModuleId, std::shared_ptr<const CompiledKernel>, ModuleIdHash> compiled_;
  std::unordered_map<LoadedId, CUmodule, LoadedIdHash> modules_;
  std::unordered_map<LoadedId, CUfunction, LoadedIdHash> loaded_;
};

}  // namespace flashgen
