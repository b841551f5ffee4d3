// Loader stage: KernelConfig -> loaded CUfunction. Compiles through the in-memory map, then the disk
// cache, then NVRTC; loads each cubin once per CUDA context.
#pragma once

#include <cuda.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kernel_cache.hpp"
#include "kernel_config.hpp"
#include "nvrtc_compiler.hpp"

namespace flashgen {

// The key of one compiled kernel: name, arch and a hash of source + options + NVRTC version +
// generator version, e.g. "fwd_sm80_fp16_d128_m128_n32_w4_s3-sm90-3f2a...".
std::string kernel_cache_key(const GeneratedSource& source, int arch);

class KernelRegistry {
 public:
  // Process-wide registry using KernelCache::default_dir().
  static KernelRegistry& instance();

  explicit KernelRegistry(std::filesystem::path cache_dir);

  // Compiled kernel for (config, arch): memory, then disk cache, then NVRTC. Thread-safe.
  std::shared_ptr<const CompiledKernel> compiled(const KernelConfig& config, int arch);

  // The kernel loaded into ctx (current on this thread) with its dynamic shared-memory limit raised.
  CUfunction function(const KernelConfig& config, CUcontext ctx, int arch);

  const KernelCache& disk_cache() const { return cache_; }

 private:
  KernelCache cache_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledKernel>> compiled_;
  std::unordered_map<std::string, CUfunction> loaded_;  // key: context pointer + kernel key
};

}  // namespace flashgen
