// `flashgen info`: the versions, the kernel cache and the GPUs of this machine, as text or one JSON
// object. Never fails for a missing GPU or driver; it says why there is none.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/table.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace flashgen::cli {

Command info_command() {
  return Command("info", "Prints the versions, the kernel cache and the GPUs of this machine.", "[--json]")
      .flag("json", "print one JSON object");
}

namespace {

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return format("%.1f %s", value, units[unit]);
}

struct CacheSummary {
  fs::path dir;
  bool exists = false;
  uint64_t entries = 0;  // compiled kernels (*.cubin)
  uint64_t bytes = 0;    // every file under the folder, failed-source dumps included
};

CacheSummary summarize_cache(const fs::path& dir) {
  CacheSummary summary;
  summary.dir = dir;
  std::error_code error;
  summary.exists = fs::is_directory(dir, error);
  if (!summary.exists) return summary;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, error), end;
       !error && it != end; it.increment(error)) {
    std::error_code file_error;
    if (!it->is_regular_file(file_error)) continue;
    const uintmax_t size = it->file_size(file_error);
    if (!file_error) summary.bytes += size;
    if (it->path().extension() == ".cubin") ++summary.entries;
  }
  return summary;
}

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm = 0;
  int sm_count = 0;
  uint64_t memory_bytes = 0;
};

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
  int count = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetCount(&count));
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    FLASHGEN_CU_CHECK(cuDeviceGet(&device, i));
    GpuInfo gpu;
    gpu.index = i;
    char name[256] = {};
    FLASHGEN_CU_CHECK(cuDeviceGetName(name, sizeof name, device));
    gpu.name = name;
    gpu.sm = device_sm(device);
    FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&gpu.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
    size_t memory = 0;
    FLASHGEN_CU_CHECK(cuDeviceTotalMem(&memory, device));
    gpu.memory_bytes = memory;
    gpus.push_back(gpu);
  }
  return gpus;
}

}  // namespace

int command_info(const Args& args) {
  const CacheSummary cache = summarize_cache(KernelCache::default_dir());
  const std::optional<std::string> template_dir = env("FLASHGEN_TEMPLATE_DIR");
  std::string no_gpu_reason;
  const bool have_driver = driver_available(&no_gpu_reason);
  int driver_version = 0;
  std::vector<GpuInfo> gpus;
  if (have_driver) {
    // A driver that loaded but then fails a query is reported like a missing GPU: info never fails for it.
    try {
      FLASHGEN_CU_CHECK(cuDriverGetVersion(&driver_version));
      gpus = list_gpus();
    } catch (const Error& error) {
      no_gpu_reason = error.what();
      gpus.clear();
    }
  }
  const bool have_gpu = !gpus.empty();
  if (!have_gpu && no_gpu_reason.empty()) no_gpu_reason = "no CUDA device";
  const std::optional<std::string> driver_text =
      driver_version > 0 ? std::optional<std::string>(format("%d.%d", driver_version / 1000, driver_version % 1000 / 10))
                         : std::nullopt;

  if (args.has("json")) {
    Json j;
    j["flashgen_version"] = FLASHGEN_VERSION;
    j["generator_version"] = kGeneratorVersion;
    j["nvrtc_version"] = nvrtc_version();
    j["nvrtc_archs"] = nvrtc_archs() ? Json(*nvrtc_archs()) : Json(nullptr);
    j["cache"] = {{"dir", cache.dir.string()}, {"exists", cache.exists}, {"entries", cache.entries},
                  {"bytes", cache.bytes}};
    j["template_dir"] = template_dir ? Json(*template_dir) : Json(nullptr);
    j["driver_version"] = driver_text ? Json(*driver_text) : Json(nullptr);
    j["gpus"] = Json::array();
    for (const GpuInfo& gpu : gpus)
      j["gpus"].push_back({{"index", gpu.index}, {"name", gpu.name}, {"sm", gpu.sm}, {"sm_count", gpu.sm_count},
                           {"memory_bytes", gpu.memory_bytes}});
    if (!have_gpu) j["no_gpu_reason"] = no_gpu_reason;
    print_json(j);
    return 0;
  }

  std::cout << "flashgen:              " << FLASHGEN_VERSION << '\n'
            << "generator:             " << kGeneratorVersion << '\n'
            << "NVRTC:                 " << nvrtc_version() << ", targets " << accepted_archs_text() << '\n'
            << "kernel cache:          " << cache.dir.string();
  if (cache.exists)
    std::cout << " (" << cache.entries << (cache.entries == 1 ? " kernel, " : " kernels, ") << format_bytes(cache.bytes)
              << ")\n";
  else if (std::error_code error; fs::exists(cache.dir, error))
    std::cout << " (not a folder: nothing is cached; point FLASHGEN_CACHE_DIR at a folder)\n";
  else
    std::cout << " (not created yet)\n";
  std::cout << "FLASHGEN_TEMPLATE_DIR: "
            << (template_dir ? "set: " + *template_dir : std::string("not set (templates embedded in the library)"))
            << '\n';
  if (driver_text) std::cout << "CUDA driver:           " << *driver_text << '\n';
  if (!have_gpu) {
    std::cout << "GPU:                   none (" << no_gpu_reason << ")\n";
    return 0;
  }
  for (const GpuInfo& gpu : gpus)
    std::cout << format("GPU %d:%*s", gpu.index, gpu.index < 10 ? 17 : 16, "") << gpu.name << ", sm_" << gpu.sm
              << ", " << gpu.sm_count << " SMs, " << format_bytes(gpu.memory_bytes) << '\n';
  return 0;
}

}  // namespace flashgen::cli
