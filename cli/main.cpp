// The `flashgen` command-line tool: info, emit, compile, run and demo over the library's stages
// (generator -> NVRTC -> cache/registry -> launcher), tune and db over the tuner. `flashgen help` lists them.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <nvrtc.h>

#include "check/reference.hpp"
#include "cli/args.hpp"
#include "cli/table.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
#include "generator/generator.hpp"
#include "generator/kernel_config.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/sass.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/problem_key.hpp"
#include "tuner/space.hpp"
#include "tuner/store.hpp"
#include "tuner/sweep.hpp"

namespace flashgen::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// JSON text for output: bytes that are not UTF-8 (a path or a name from the command line, a stored
// detail) become U+FFFD instead of an exception.
std::string json_text(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}
void print_json(const Json& j) { std::cout << json_text(j) << '\n'; }
using Clock = std::chrono::steady_clock;

// The architectures `compile` and `demo` compile for by default.
const std::vector<int> kDefaultArchs = {80, 90};

// The kernel family needs sm_80 or newer (mma.sync m16n8k16 bf16, cp.async).
constexpr int kMinArch = 80;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// "sm_90a" for Hopper (what NVRTC targets there), "sm_80" otherwise: arch_flag() without "-arch=".
std::string arch_label(int arch) {
  const std::string flag = arch_flag(arch);
  const std::string prefix = "-arch=";
  return flag.rfind(prefix, 0) == 0 ? flag.substr(prefix.size()) : flag;
}

// Refuses a directory where a file is meant (what names it: "--db", "output").
void reject_directory(const fs::path& path, const std::string& what) {
  std::error_code error;
  if (fs::is_directory(path, error)) fail(Status::kInvalidArgument, what + " '" + path.string() + "' is a directory");
}

// An input file, opened, or an invalid-argument error saying why it cannot be read (what names it).
std::ifstream open_input(const std::string& path, const std::string& what) {
  reject_directory(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::kInvalidArgument, "cannot read " + what + " '" + path + "': " + std::strerror(errno));
  return in;
}

// Writes bytes to path ("-": standard output). A regular file (or a new one) is written beside it first and
// renamed over it with the old file's mode, so a failed write (full disk, a signal) leaves the old file whole;
// other targets (/dev/stdout, a pipe) are written in place. A symbolic link's target is what gets replaced.
void write_file(const std::string& path, const std::string& bytes) {
  if (path == "-") {
    std::cout.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::cout.flush();
    if (!std::cout) fail(Status::kInternal, "cannot write to standard output");
    return;
  }
  if (path.empty()) fail(Status::kInvalidArgument, "the output path is empty");
  reject_directory(path, "output");
  std::error_code error;
  // Through a symbolic link the file it points at is replaced, the link kept.
  std::string real = path;
  if (fs::is_symlink(fs::symlink_status(path, error))) {
    real = fs::weakly_canonical(path, error).string();
    if (error) fail(Status::kInvalidArgument, "cannot write '" + path + "': " + error.message());
  }
  const fs::file_status status = fs::status(real, error);
  const bool in_place = fs::exists(status) && !fs::is_regular_file(status);
  const std::string target = in_place ? real : real + ".tmp-" + std::to_string(getpid());
  std::ofstream out(target, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    const std::string reason = std::strerror(errno);
    if (!in_place) fs::remove(target, error);
    fail(Status::kInvalidArgument, "cannot write '" + path + "': " + reason);
  }
  if (in_place) return;
  if (fs::exists(status)) fs::permissions(target, status.permissions(), error);  // the replaced file's mode
  fs::rename(target, real, error);
  if (error) {
    const std::string reason = error.message();
    fs::remove(target, error);
    fail(Status::kInternal, "cannot write '" + path + "': " + reason);
  }
}

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

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The value of an environment variable, or nullopt when unset or empty.
std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

// The sm numbers >= kMinArch that the NVRTC in this process can target, ascending; nullopt when it
// cannot list them (NVRTC before 11.2). libflashgen links libnvrtc privately, so the CLI cannot link
// NVRTC's calls; the library that is already loaded is asked through dlsym instead.
const std::optional<std::vector<int>>& nvrtc_archs() {
  static const std::optional<std::vector<int>> archs = []() -> std::optional<std::vector<int>> {
    const auto count_archs =
        reinterpret_cast<decltype(&nvrtcGetNumSupportedArchs)>(dlsym(RTLD_DEFAULT, "nvrtcGetNumSupportedArchs"));
    const auto list_archs =
        reinterpret_cast<decltype(&nvrtcGetSupportedArchs)>(dlsym(RTLD_DEFAULT, "nvrtcGetSupportedArchs"));
    int count = 0;
    if (!count_archs || !list_archs || count_archs(&count) != NVRTC_SUCCESS || count <= 0) return std::nullopt;
    std::vector<int> all(static_cast<size_t>(count));
    if (list_archs(all.data()) != NVRTC_SUCCESS) return std::nullopt;
    std::vector<int> usable;
    std::copy_if(all.begin(), all.end(), std::back_inserter(usable), [](int arch) { return arch >= kMinArch; });
    std::sort(usable.begin(), usable.end());
    return usable;
  }();
  return archs;
}

// Whether --arch may name sm_<arch>. When NVRTC cannot list its targets any arch >= kMinArch passes, and
// a kernel for an arch NVRTC lacks fails on its own, reported like any other failed compile.
bool arch_accepted(int arch) {
  const std::optional<std::vector<int>>& archs = nvrtc_archs();
  if (!archs) return arch >= kMinArch;
  return std::find(archs->begin(), archs->end(), arch) != archs->end();
}

// "80, 86, 89, 90 (sm_90a), 100 (sm_100a), 120": the targets --arch accepts, for help and errors.
std::string accepted_archs_text() {
  const std::optional<std::vector<int>>& archs = nvrtc_archs();
  if (!archs) return "any sm number >= " + std::to_string(kMinArch) + " (this NVRTC cannot list its targets)";
  std::string text;
  for (int arch : *archs) {
    const std::string label = arch_label(arch);
    text += (text.empty() ? "" : ", ") + std::to_string(arch);
    if (label != "sm_" + std::to_string(arch)) text += " (" + label + ")";
  }
  return text;
}

// The help paragraph on SM values, shared by emit and compile.
std::string arch_help() { return "SM: an sm number NVRTC " + nvrtc_version() + " targets: " + accepted_archs_text(); }

// --arch values (repeatable, or comma-separated: --arch 80,90), each one arch_accepted().
std::vector<int> parse_archs(const Args& args, const std::vector<int>& fallback) {
  std::vector<int> archs;
  for (const std::string& value : args.values("arch")) {
    std::stringstream list(value);
    std::string item;
    while (std::getline(list, item, ',')) {
      const int arch = static_cast<int>(args.parse_int("arch", item, 0, 1000));
      if (!arch_accepted(arch))
        throw UsageError("--arch expects one of " + accepted_archs_text() + ", got " + item, args.usage());
      if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
    }
  }
  return archs.empty() ? fallback : archs;
}

// ---------------------------------------------------------------------------------------------------
// flashgen info

Command info_command() {
  return Command("info", "Prints the versions, the kernel cache and the GPUs of this machine.", "[--json]")
      .flag("json", "print one JSON object");
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

// ---------------------------------------------------------------------------------------------------
// flashgen emit

Command emit_command() {
  return Command("emit",
                 "Prints the generated kernel as one self-contained CUDA translation unit; nvcc compiles it\n"
                 "unchanged: nvcc -gencode=arch=compute_90a,code=sm_90a -c <file>.cu",
                 "<config-name> [--arch SM] [-o FILE] | --config-json FILE|- [--arch SM] [-o FILE]", 1,
                 "<config-name>: a canonical config name, e.g. fwd_sm80_fp16_d128_m128_n32_w4_s3, or a\n"
                 "backward module's, e.g. bwd_sm90_bf16_d128_m64_n128_s2_causal\n" + arch_help())
      .option("config-json", "FILE",
              "read a forward config as JSON from FILE ('-' for stdin) instead of a name; fields: family (fwd_sm80 or "
              "fwd_sm90), dtype, head_dim, mask (none or causal), block_m, block_n, warps, stages, q_in_regs, "
              "overlap, pingpong, persistent, p_smem, cluster, groups, tensor_sum; omitted ones take the defaults")
      .option("arch", "SM", "check the config is valid for sm_<SM> (default 90)")
      .option("output", "FILE", "write to FILE (replaced whole) instead of stdout; - is stdout", false, 'o');
}

KernelConfig read_config_json(const std::string& path) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in = open_input(path, "config JSON");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  try {
    return Json::parse(text).get<KernelConfig>();
  } catch (const Json::exception& error) {
    fail(Status::kInvalidArgument, "config JSON '" + path + "': " + error.what());
  }
}

// A config name of either pass: bwd_... names are backward modules.
std::variant<KernelConfig, BwdConfig> config_from_name(const std::string& name) {
  if (name.rfind("bwd_", 0) == 0) return BwdConfig::from_name(name);
  return KernelConfig::from_name(name);
}

int command_emit(const Args& args) {
  const bool from_json = args.has("config-json");
  if (from_json == !args.positionals.empty())
    throw UsageError("emit takes either a config name or --config-json, exactly one of them", args.usage());
  const std::variant<KernelConfig, BwdConfig> config =
      from_json ? std::variant<KernelConfig, BwdConfig>(read_config_json(args.string_or("config-json", "-")))
                : config_from_name(args.positionals[0]);
  const std::vector<int> archs = parse_archs(args, {90});
  if (archs.size() != 1) throw UsageError("emit writes the source of one --arch", args.usage());
  const int arch = archs.front();
  const std::string name = std::visit([](const auto& c) { return c.name(); }, config);
  if (std::optional<std::string> why = std::visit([&](const auto& c) { return c.invalid_reason(arch); }, config))
    fail(Status::kInvalidArgument, "config " + name + " is invalid for sm_" + std::to_string(arch) + ": " + *why);

  const std::string source = std::visit([](const auto& c) { return generate(c).self_contained(); }, config);
  if (!args.has("output")) {
    std::cout << source;
    return 0;
  }
  const std::string path = args.string_or("output", "");
  write_file(path, source);
  std::cerr << "wrote " << name << " (" << source.size() << " bytes) to " << path << '\n';
  return 0;
}

// ---------------------------------------------------------------------------------------------------
// flashgen compile (and the compile-only demo)

Command compile_command() {
  return Command("compile",
                 "Compiles kernels with NVRTC (through the on-disk cache unless --no-cache) and prints\n"
                 "registers, shared memory, spills, stack and compile time. Needs no GPU. With --cubin-dir it\n"
                 "also writes each kernel's cubin; with --sass it prints each kernel's SASS (cuobjdump).",
                 "[<config-name>...] [--all-defaults] [--arch SM]... [--json] [--no-cache] [--jobs N]\n"
                 "       [--cubin-dir DIR] [--sass]",
                 -1,
                 "<config-name>: canonical config names, e.g. fwd_sm80_fp16_d128_m128_n32_w4_s3, or backward modules\n"
                 "               such as bwd_sm90_fp16_d128_m64_n128_s2 (reported by their dkdv kernel)\n" +
                     arch_help())
      .option("arch", "SM", "target sm_<SM> (default 80 and 90; 90 only for sm90-family configs)", true)
      .flag("all-defaults", "add the default candidates (default_forward_candidates) of each arch")
      .flag("no-cache", "compile with NVRTC directly, bypassing the memory and disk caches")
      .option("jobs", "N", "compile N kernels at a time (default: the number of cores)", false, 'j')
      .option("cubin-dir", "DIR", "write each kernel's cubin to DIR/<config>.<target>.cubin (DIR is created)")
      .flag("sass", "print each kernel's SASS after the table (JSON: a \"sass\" field); needs cuobjdump")
      .flag("json", "print a JSON array instead of the table");
}

// A forward kernel, or a backward module (reported by its dkdv kernel, the one that holds the tiles).
struct CompileJob {
  std::variant<KernelConfig, BwdConfig> config;
  int arch = 0;

  std::string name() const {
    return std::visit([](const auto& c) { return c.name(); }, config);
  }
};

struct CompileOutcome {
  std::string name;
  int arch = 0;
  bool ok = false;
  ResourceUsage usage;
  int dynamic_smem_bytes = 0;
  double compile_ms = 0;  // NVRTC time; 0 when the kernel came from a cache
  double wall_ms = 0;     // the whole call, cache lookup included
  bool cached = false;
  std::string error;
  std::shared_ptr<const CompiledKernel> kernel;  // its cubin for --cubin-dir and --sass
  std::string cubin_path;  // where --cubin-dir wrote it
  std::string sass;        // with --sass
};

CompileOutcome compile_one(const CompileJob& job, bool use_cache) {
  CompileOutcome outcome;
  outcome.name = job.name();
  outcome.arch = job.arch;
  try {
    const Clock::time_point start = Clock::now();
    std::shared_ptr<const CompiledKernel> kernel = std::visit(
        [&](const auto& config) {
          if (std::optional<std::string> why = config.invalid_reason(job.arch))
            fail(Status::kInvalidArgument, "not valid: " + *why);
          return use_cache ? KernelRegistry::instance().compiled(config, job.arch)
                           : std::make_shared<const CompiledKernel>(compile_nvrtc(generate(config), job.arch));
        },
        job.config);
    outcome.wall_ms = ms_since(start);
    if (const auto* bwd = std::get_if<BwdConfig>(&job.config)) {
      outcome.usage = kernel->usage_of(bwd->symbol(BwdKernel::kDkdv));
      outcome.dynamic_smem_bytes = bwd->smem_bytes(BwdKernel::kDkdv);
    } else {
      outcome.usage = kernel->usage;
      outcome.dynamic_smem_bytes = std::get<KernelConfig>(job.config).smem_bytes();
    }
    outcome.compile_ms = kernel->compile_ms;
    outcome.cached = kernel->from_cache;
    outcome.kernel = kernel;
    outcome.ok = true;
  } catch (const std::exception& error) {  // report it and keep going with the other kernels
    outcome.error = error.what();
  }
  return outcome;
}

// Compiles every job on `threads` threads, printing progress and each failure to stderr as it happens.
// Outcomes come back in the order of jobs.
std::vector<CompileOutcome> compile_jobs(const std::vector<CompileJob>& jobs, bool use_cache, int threads) {
  std::vector<CompileOutcome> outcomes(jobs.size());
  std::atomic<size_t> next{0};
  std::mutex log_mutex;
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const std::string counter = format("[%zu/%zu] ", i + 1, jobs.size());
      const std::string what = jobs[i].name() + " for " + arch_label(jobs[i].arch);
      {
        std::lock_guard<std::mutex> lock(log_mutex);
        std::cerr << counter << "compiling " << what << '\n';
      }
      outcomes[i] = compile_one(jobs[i], use_cache);
      if (!outcomes[i].ok) {
        std::lock_guard<std::mutex> lock(log_mutex);
        std::cerr << counter << "FAILED " << what << ": " << outcomes[i].error << '\n';
      }
    }
  };
  const size_t thread_count = std::clamp<size_t>(static_cast<size_t>(threads), 1, std::max<size_t>(jobs.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < thread_count; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
  return outcomes;
}

void print_compile_table(const std::vector<CompileOutcome>& outcomes, std::ostream& os) {
  Table table({"config", "arch", "regs", "static smem", "dyn smem", "spill st/ld", "stack", "compile ms", "cached"});
  for (const CompileOutcome& o : outcomes) {
    if (!o.ok) {
      table.add({o.name, arch_label(o.arch), "FAILED", "-", "-", "-", "-", "-", "-"});
      continue;
    }
    // registers < 0: ptxas's report was missing from NVRTC's log, so nothing of it is known.
    const bool known = o.usage.registers >= 0;
    auto reported = [&](int value) { return known ? std::to_string(value) : std::string("?"); };
    table.add({o.name, arch_label(o.arch), reported(o.usage.registers), reported(o.usage.static_smem_bytes),
               std::to_string(o.dynamic_smem_bytes),
               reported(o.usage.spill_store_bytes) + "/" + reported(o.usage.spill_load_bytes),
               reported(o.usage.stack_bytes), o.cached ? "-" : format("%.0f", o.compile_ms),
               o.cached ? "yes" : "no"});
  }
  table.print(os);
}

Json compile_outcomes_json(const std::vector<CompileOutcome>& outcomes) {
  Json array = Json::array();
  for (const CompileOutcome& o : outcomes) {
    Json j = {{"config", o.name}, {"arch", o.arch}, {"target", arch_label(o.arch)}, {"ok", o.ok}};
    if (o.ok) {
      const bool known = o.usage.registers >= 0;  // else null: ptxas's report was missing from the log
      auto reported = [&](int value) { return known ? Json(value) : Json(nullptr); };
      j["registers"] = reported(o.usage.registers);
      j["static_smem_bytes"] = reported(o.usage.static_smem_bytes);
      j["dynamic_smem_bytes"] = o.dynamic_smem_bytes;
      j["spill_store_bytes"] = reported(o.usage.spill_store_bytes);
      j["spill_load_bytes"] = reported(o.usage.spill_load_bytes);
      j["stack_bytes"] = reported(o.usage.stack_bytes);
      j["compile_ms"] = o.compile_ms;
      j["wall_ms"] = o.wall_ms;
      j["cached"] = o.cached;
      if (!o.cubin_path.empty()) j["cubin_path"] = o.cubin_path;
      if (!o.sass.empty()) j["sass"] = o.sass;
    } else {
      j["error"] = o.error;
    }
    array.push_back(std::move(j));
  }
  return array;
}

// The summary after the table (stdout) and one line per failure (stderr). Returns the failure count.
size_t report_compile_summary(const std::vector<CompileOutcome>& outcomes, double wall_ms) {
  size_t failed = 0;
  size_t cached = 0;
  for (const CompileOutcome& o : outcomes) {
    failed += !o.ok;
    cached += o.ok && o.cached;
  }
  std::cout << format("\n%zu of %zu kernels compiled (%zu from the cache) in %.1f s", outcomes.size() - failed,
                      outcomes.size(), cached, wall_ms / 1000)
            << (failed ? format("; %zu failed", failed) : std::string()) << '\n';
  if (std::any_of(outcomes.begin(), outcomes.end(), [](const CompileOutcome& o) { return o.ok && o.usage.registers < 0; }))
    std::cerr << "? : this NVRTC's log carries no ptxas report (--ptxas-options=-v), so registers, static shared "
                 "memory, spills and stack are unknown; --sass shows the code (LDL/STL are local memory)\n";
  if (failed) {
    std::cerr << "\nfailed:\n";
    for (const CompileOutcome& o : outcomes)
      if (!o.ok) std::cerr << "  " << o.name << " for " << arch_label(o.arch) << ": " << first_line(o.error) << '\n';
  }
  return failed;
}

int default_jobs() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// The default candidates of each arch, in arch order.
std::vector<CompileJob> default_jobs_for(const std::vector<int>& archs) {
  std::vector<CompileJob> jobs;
  for (int arch : archs)
    for (const KernelConfig& config : default_forward_candidates(arch)) jobs.push_back({config, arch});
  return jobs;
}

int command_compile(const Args& args) {
  if (args.positionals.empty() && !args.has("all-defaults"))
    throw UsageError("nothing to compile: name configs or pass --all-defaults", args.usage());
  const std::vector<int> archs = parse_archs(args, kDefaultArchs);
  const int threads = static_cast<int>(args.int_or("jobs", default_jobs(), 1, 1024));

  std::vector<CompileJob> jobs;
  std::set<std::pair<std::string, int>> seen;
  auto add = [&](const std::variant<KernelConfig, BwdConfig>& config, int arch) {
    CompileJob job{config, arch};
    if (seen.insert({job.name(), arch}).second) jobs.push_back(std::move(job));
  };
  for (const std::string& name : args.positionals) {
    const auto config = config_from_name(name);  // a bad name stops here, before any work
    // Without --arch a Hopper-family config is compiled for sm_90a only, the one target it has.
    const bool sm90_only = std::visit([](const auto& c) { return c.family == KernelFamily::kSm90; }, config);
    for (int arch : archs)
      if (args.has("arch") || !sm90_only || arch == 90) add(config, arch);
  }
  if (args.has("all-defaults"))
    for (const CompileJob& job : default_jobs_for(archs)) add(job.config, job.arch);

  const bool sass = args.has("sass");
  if (sass) require_cuobjdump();  // before any work
  const std::string cubin_dir = args.string_or("cubin-dir", "");
  if (!cubin_dir.empty()) {
    std::error_code error;
    fs::create_directories(cubin_dir, error);
    if (error) fail(Status::kInvalidArgument, "--cubin-dir: cannot create '" + cubin_dir + "': " + error.message());
  }

  const Clock::time_point start = Clock::now();
  std::vector<CompileOutcome> outcomes = compile_jobs(jobs, !args.has("no-cache"), threads);
  for (CompileOutcome& o : outcomes) {
    if (!o.ok) continue;
    if (!cubin_dir.empty()) {
      o.cubin_path = (fs::path(cubin_dir) / (o.name + "." + arch_label(o.arch) + ".cubin")).string();
      write_file(o.cubin_path, o.kernel->cubin);
      std::cerr << "wrote " << o.cubin_path << " (" << o.kernel->cubin.size() << " bytes)\n";
    }
    if (sass) o.sass = disassemble_cubin(o.kernel->cubin);
  }
  if (args.has("json")) {
    print_json(compile_outcomes_json(outcomes));
    return std::all_of(outcomes.begin(), outcomes.end(), [](const CompileOutcome& o) { return o.ok; }) ? 0 : 1;
  }
  print_compile_table(outcomes, std::cout);
  const size_t failed = report_compile_summary(outcomes, ms_since(start));
  for (const CompileOutcome& o : outcomes)
    if (!o.sass.empty()) std::cout << "\n// SASS of " << o.name << " for " << arch_label(o.arch) << "\n" << o.sass;
  return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------
// flashgen run (and the GPU demo)

Command run_command() {
  return Command("run",
                 "Runs one attention problem on the GPU: random normal inputs, a check of sampled rows\n"
                 "against a float64 CPU reference, then timing with CUDA events.",
                 "[options]")
      .option("batch", "B", "batch size (default 4)")
      .option("seqlen-q", "N", "query length (default 4096)")
      .option("seqlen-k", "N", "key/value length (default 4096)")
      .option("heads-q", "H", "query heads (default 16)")
      .option("heads-kv", "H", "key/value heads; heads-q must be a multiple (default 16)")
      .option("head-dim", "D", "head dimension (default 128)")
      .option("dtype", "T", "fp16 or bf16 (default fp16)")
      .option("causal", "MODE", "none, bottom-right or top-left (default none)")
      .option("scale", "S", "softmax scale; <= 0 means 1/sqrt(head_dim) (default 0)")
      .option("layout", "L", "memory order of q/k/v/out: bshd or bhsd (default bshd)")
      .option("config", "NAME", "run this config (a fwd_... name, or bwd_... with --backward) instead of the choice")
      .flag("backward", "time the backward pass (dq, dk, dv for a random dout) after one forward")
      .flag("deterministic", "with --backward: the deterministic dQ strategy (bitwise repeatable)")
      .option("iters", "N", "timed launches (default 20)")
      .option("warmup", "N", "untimed launches before timing (default 3)")
      .option("check-rows", "N", "query rows checked against the reference, plus the last one (default 64)")
      .option("seed", "S", "random seed of the inputs (default 0)")
      .flag("json", "print one JSON object");
}

struct RunOptions {
  int64_t batch = 4;
  int64_t seqlen_q = 4096;
  int64_t seqlen_k = 4096;
  int64_t heads_q = 16;
  int64_t heads_kv = 16;
  int64_t head_dim = 128;
  DType dtype = DType::kFloat16;
  std::string causal = "none";  // none | bottom-right | top-left
  float scale = 0;              // <= 0: 1/sqrt(head_dim)
  std::string layout = "bshd";  // bshd | bhsd
  std::optional<std::string> config_name;
  bool backward = false;
  bool deterministic = false;
  int iters = 20;
  int warmup = 3;
  int check_rows = 64;
  uint32_t seed = 0;
};

RunOptions parse_run_options(const Args& args) {
  constexpr long long kSizeMax = 1ll << 30;  // the library's limit on every size
  RunOptions o;
  o.batch = args.int_or("batch", o.batch, 1, kSizeMax);
  o.seqlen_q = args.int_or("seqlen-q", o.seqlen_q, 1, kSizeMax);
  o.seqlen_k = args.int_or("seqlen-k", o.seqlen_k, 1, kSizeMax);
  o.heads_q = args.int_or("heads-q", o.heads_q, 1, kSizeMax);
  o.heads_kv = args.int_or("heads-kv", o.heads_kv, 1, kSizeMax);
  o.head_dim = args.int_or("head-dim", o.head_dim, 1, 4096);
  o.dtype = args.choice_or("dtype", "fp16", {"fp16", "bf16"}) == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  o.causal = args.choice_or("causal", o.causal, {"none", "bottom-right", "top-left"});
  o.scale = static_cast<float>(args.double_or("scale", o.scale));
  o.layout = args.choice_or("layout", o.layout, {"bshd", "bhsd"});
  if (args.has("config")) o.config_name = args.string_or("config", "");
  o.backward = args.has("backward");
  o.deterministic = args.has("deterministic");
  if (o.deterministic && !o.backward) fail(Status::kInvalidArgument, "--deterministic needs --backward");
  o.iters = static_cast<int>(args.int_or("iters", o.iters, 1, 1000000));
  o.warmup = static_cast<int>(args.int_or("warmup", o.warmup, 0, 1000000));
  o.check_rows = static_cast<int>(args.int_or("check-rows", o.check_rows, 0, 1000000));
  o.seed = static_cast<uint32_t>(args.int_or("seed", o.seed, 0, std::numeric_limits<uint32_t>::max()));
  return o;
}

flashgen_mask mask_of(const RunOptions& o) {
  if (o.causal == "bottom-right") return FLASHGEN_MASK_CAUSAL;
  if (o.causal == "top-left") return FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  return FLASHGEN_MASK_NONE;
}

AttentionShape shape_of(const RunOptions& o) {
  return AttentionShape{o.batch, o.seqlen_q, o.seqlen_k, o.heads_q, o.heads_kv, o.head_dim};
}

flashgen_dtype abi_dtype(DType dtype) { return dtype == DType::kFloat16 ? FLASHGEN_FLOAT16 : FLASHGEN_BFLOAT16; }

// Host copy of one 16-bit tensor: the raw elements in memory order plus the view the library is given
// (shape [batch, seqlen, heads, head_dim], strides in elements).
struct HostTensor {
  DType dtype = DType::kFloat16;
  StridedView view;
  std::vector<uint16_t> bits;

  HostInput input() const { return HostInput::bits16(bits.data(), abi_dtype(dtype), view); }
  size_t bytes() const { return bits.size() * sizeof(uint16_t); }
};

// A host tensor of shape [batch, seqlen, heads, head_dim] laid out as bshd, or as [batch, heads, seqlen,
// head_dim] in memory for bhsd (the view's strides say so; its shape stays bshd).
HostTensor make_host_tensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                            bool bhsd) {
  HostTensor t;
  t.dtype = dtype;
  t.view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  if (bhsd) {
    t.view.stride[0] = heads * seqlen * head_dim;
    t.view.stride[1] = head_dim;
    t.view.stride[2] = seqlen * head_dim;
  }
  t.bits.resize(static_cast<size_t>(batch * seqlen * heads * head_dim));
  return t;
}

// Random normal values rounded to the tensor's type, in memory order.
void fill_normal(HostTensor& t, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& bits : t.bits) bits = float_to_dtype_bits(normal(rng), abi_dtype(t.dtype));
}

class Stream {
 public:
  Stream() { FLASHGEN_CU_CHECK(cuStreamCreate(&stream_, CU_STREAM_DEFAULT)); }
  ~Stream() { driver().cuStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

class Event {
 public:
  Event() { FLASHGEN_CU_CHECK(cuEventCreate(&event_, CU_EVENT_DEFAULT)); }
  ~Event() { driver().cuEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

flashgen_tensor tensor_view(const HostTensor& host, const DeviceBuffer& device) {
  flashgen_tensor view{};
  view.data = device.data();
  view.dtype = abi_dtype(host.dtype);
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = host.view.shape[i];
    view.stride[i] = host.view.stride[i];
  }
  return view;
}

struct RowIndex {
  int64_t batch = 0, head = 0, row = 0;
  bool operator<(const RowIndex& other) const {
    return std::tie(batch, head, row) < std::tie(other.batch, other.head, other.row);
  }
};

// `count` rows spread evenly over all (batch, head, query) rows, plus the very last query row.
std::vector<RowIndex> sample_rows(int64_t batch, int64_t heads, int64_t seqlen_q, int64_t count) {
  std::set<RowIndex> rows;
  const int64_t total = batch * heads * seqlen_q;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t t = count == 1 ? 0 : r * (total - 1) / (count - 1);
    rows.insert({t / (heads * seqlen_q), t / seqlen_q % heads, t % seqlen_q});
  }
  rows.insert({batch - 1, heads - 1, seqlen_q - 1});
  return {rows.begin(), rows.end()};
}

// Tolerances against the float64 reference. The kernel rounds P to the input type before P·V and rounds
// the output, so out's error scales with the type's unit roundoff (fp16 2^-11, bf16 2^-8) times |out|; the
// absolute term covers long rows whose many rounded terms add up. LSE is computed in fp32 throughout.
struct Tolerance {
  double out_abs, out_rel, lse_abs;
};
Tolerance tolerance_for(DType dtype) {
  return dtype == DType::kFloat16 ? Tolerance{1e-3, 4e-3, 1e-3} : Tolerance{8e-3, 3e-2, 1e-3};
}

struct CheckResult {
  size_t rows = 0;
  double max_error_out = 0;
  double max_error_lse = 0;
  int64_t mismatches = 0;
  std::vector<std::string> first_mismatches;  // at most kShownMismatches
  bool pass() const { return mismatches == 0; }
};
constexpr size_t kShownMismatches = 8;

CheckResult check_rows(const AttentionShape& shape, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                       const HostTensor& out, const std::vector<float>& lse, const std::vector<RowIndex>& rows,
                       double scale, flashgen_mask mask) {
  // The float64 reference is the slow part for long sequences: rows are independent, so use every core.
  std::vector<ReferenceRow> reference(rows.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < rows.size(); i = next++)
      reference[i] = attention_reference_row(shape, q.input(), k.input(), v.input(), scale, mask, rows[i].batch,
                                             rows[i].head, rows[i].row);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < default_jobs() && static_cast<size_t>(t) < rows.size(); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();

  const Tolerance tol = tolerance_for(q.dtype);
  const HostInput out_values = out.input();
  const int64_t heads = shape.heads_q;
  const int64_t seqlen_q = shape.seqlen_q;
  const double inf = std::numeric_limits<double>::infinity();
  CheckResult result;
  result.rows = rows.size();
  auto mismatch = [&](const std::string& text) {
    if (result.first_mismatches.size() < kShownMismatches) result.first_mismatches.push_back(text);
    ++result.mismatches;
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowIndex& at = rows[r];
    const std::string where = format("batch %lld head %lld row %lld", static_cast<long long>(at.batch),
                                     static_cast<long long>(at.head), static_cast<long long>(at.row));
    for (int64_t d = 0; d < shape.head_dim; ++d) {
      const double got = out_values.at(at.batch, at.row, at.head, d);
      const double want = reference[r].out[d];
      const double error = std::isfinite(got) ? std::abs(got - want) : inf;
      result.max_error_out = std::max(result.max_error_out, error);
      if (!(error <= tol.out_abs + tol.out_rel * std::abs(want)))
        mismatch(format("out %s dim %lld: got %.6g, expected %.6g", where.c_str(), static_cast<long long>(d), got, want));
    }
    const double got = lse[static_cast<size_t>((at.batch * heads + at.head) * seqlen_q + at.row)];
    const double want = reference[r].lse;
    const double error = std::isinf(want) ? (got == want ? 0 : inf) : std::isfinite(got) ? std::abs(got - want) : inf;
    result.max_error_lse = std::max(result.max_error_lse, error);
    if (!(error <= tol.lse_abs)) mismatch(format("lse %s: got %.8g, expected %.8g", where.c_str(), got, want));
  }
  return result;
}

struct RunReport {
  RunOptions options;
  std::string device_name;
  int device_sm = 0;
  double scale = 0;        // the scale in effect
  std::string config_name;  // what ran (the backward module with --backward)
  std::string reason;       // and why
  int arch = 0;
  double first_launch_ms = 0;  // wall clock of the first call: includes compiling or loading the kernel
  CheckResult check;           // forward: sampled rows; backward: whole gradients (see check_gradients)
  std::vector<double> times_ms;  // one per timed launch, sorted
  double flops = 0;

  double median_ms() const { return times_ms[times_ms.size() / 2]; }
  double tflops() const { return flops / (median_ms() * 1e-3) / 1e12; }
};

std::string problem_text(const RunOptions& o, double scale) {
  return format("batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld, %s, mask %s, scale %.6g, "
                "layout %s",
                static_cast<long long>(o.batch), static_cast<long long>(o.seqlen_q), static_cast<long long>(o.seqlen_k),
                static_cast<long long>(o.heads_q), static_cast<long long>(o.heads_kv),
                static_cast<long long>(o.head_dim), dtype_name(o.dtype), o.causal.c_str(), scale, o.layout.c_str());
}

// Largest problem whose backward `run --backward` checks against the whole float64 reference
// (batch * heads * seqlen_q * seqlen_k * head_dim multiply-adds, about a minute on one core).
constexpr double kMaxBackwardCheckCost = 4e9;

// Events around every launch of fn on stream; sorted milliseconds.
std::vector<double> time_launches(const std::function<void()>& fn, int warmup, int iters, CUstream stream) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<Event> starts(static_cast<size_t>(iters)), stops(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    FLASHGEN_CU_CHECK(cuEventRecord(starts[i].get(), stream));
    fn();
    FLASHGEN_CU_CHECK(cuEventRecord(stops[i].get(), stream));
  }
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    FLASHGEN_CU_CHECK(cuEventElapsedTime(&ms, starts[i].get(), stops[i].get()));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times;
}

// The backward half of `run --backward`: random dout, one checked backward (against the whole float64
// reference when the problem is small enough), then timing with a workspace allocated once.
void run_backward(const RunOptions& o, const AttentionShape& shape, const HostTensor& q, const HostTensor& k,
                  const HostTensor& v, const flashgen_tensor& q_view,
                  const flashgen_tensor& k_view, const flashgen_tensor& v_view, const flashgen_tensor& out_view,
                  const float* lse, const flashgen_attention_options& options, CUstream stream, std::mt19937& rng,
                  RunReport& report) {
  const bool bhsd = o.layout == "bhsd";
  HostTensor dout = make_host_tensor(o.dtype, o.batch, o.seqlen_q, o.heads_q, o.head_dim, bhsd);
  HostTensor dq = make_host_tensor(o.dtype, o.batch, o.seqlen_q, o.heads_q, o.head_dim, bhsd);
  HostTensor dk = make_host_tensor(o.dtype, o.batch, o.seqlen_k, o.heads_kv, o.head_dim, bhsd);
  HostTensor dv = make_host_tensor(o.dtype, o.batch, o.seqlen_k, o.heads_kv, o.head_dim, bhsd);
  fill_normal(dout, rng);
  DeviceBuffer dout_dev(dout.bytes()), dq_dev(dq.bytes()), dk_dev(dk.bytes()), dv_dev(dv.bytes());
  dout_dev.upload(dout.bits);
  for (DeviceBuffer* b : {&dq_dev, &dk_dev, &dv_dev}) b->fill_bytes(0xFF, stream);
  const flashgen_tensor dout_view = tensor_view(dout, dout_dev), dq_view = tensor_view(dq, dq_dev),
                        dk_view = tensor_view(dk, dk_dev), dv_view = tensor_view(dv, dv_dev);
  const BackwardProblem problem =
      make_backward_problem(&q_view, &k_view, &v_view, &out_view, &dout_view, lse, &dq_view, &dk_view, &dv_view,
                            &options);
  BwdConfig config;
  if (o.config_name) {
    config = BwdConfig::from_name(*o.config_name);
    FLASHGEN_REQUIRE(config.deterministic == o.deterministic,
                     "config " + config.name() + (config.deterministic ? " is" : " is not") +
                         " deterministic; pass --deterministic to match");
    report.reason = "requested with --config";
  } else {
    // The launch's own choice: tuning data first (as the library call makes it), then the built-in one.
    const BackwardLaunch chosen = plan_backward(problem, stream).launch;
    config = chosen.config;
    report.reason = chosen.reason;
  }
  report.config_name = config.name();
  DeviceBuffer workspace(backward_workspace_bytes(problem, config));
  auto launch = [&] { launch_backward(problem, stream, config, workspace.ptr(), workspace.bytes()); };

  const Clock::time_point first = Clock::now();
  launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  report.first_launch_ms = ms_since(first);

  // The forward's sampled rows were checked before: its mismatches stay in the report, the backward's join them.
  const CheckResult forward = report.check;
  report.check = CheckResult{};
  report.check.mismatches = forward.mismatches;
  for (const std::string& line : forward.first_mismatches) report.check.first_mismatches.push_back("forward: " + line);
  if (shape.reference_cost() <= kMaxBackwardCheckCost) {
    dq_dev.download(dq.bits.data(), dq.bytes());
    dk_dev.download(dk.bits.data(), dk.bytes());
    dv_dev.download(dv.bits.data(), dv.bytes());
    const AttentionGradients ref = attention_backward_reference_f64(shape, q.input(), k.input(), v.input(),
                                                                    dout.input(), report.scale, options.mask);
    // Relative to the largest gradient: the products round P and dS to the input type (unit roundoff
    // 2^-11 fp16, 2^-8 bf16) and sum seqlen terms of them.
    const double tolerance = o.dtype == DType::kFloat16 ? 1e-2 : 4e-2;
    const struct {
      const char* name;
      const HostTensor& got;
      const std::vector<double>& want;
    } grads[] = {{"dq", dq, ref.dq}, {"dk", dk, ref.dk}, {"dv", dv, ref.dv}};
    for (const auto& g : grads) {
      const HostInput got = g.got.input();
      double magnitude = 0, error = 0;
      for (double x : g.want) magnitude = std::max(magnitude, std::abs(x));
      const StridedView& view = g.got.view;
      size_t i = 0;
      for (int64_t b = 0; b < view.shape[0]; ++b)
        for (int64_t s = 0; s < view.shape[1]; ++s)
          for (int64_t h = 0; h < view.shape[2]; ++h)
            for (int64_t d = 0; d < view.shape[3]; ++d, ++i) {
              const double value = got.at(b, s, h, d);
              error = std::max(error, std::isfinite(value) ? std::abs(value - g.want[i]) : HUGE_VAL);
            }
      const double relative = magnitude > 0 ? error / magnitude : error;
      report.check.max_error_out = std::max(report.check.max_error_out, relative);
      if (!(relative <= tolerance)) {
        report.check.mismatches++;
        report.check.first_mismatches.push_back(format("%s: max |got - ref| / max |ref| = %.3g > %.0e", g.name,
                                                       relative, tolerance));
      }
    }
    report.check.rows = static_cast<size_t>(o.batch * o.heads_q * o.seqlen_q);
  }
  report.times_ms = time_launches(launch, o.warmup, o.iters, stream);
  report.flops = backward_flops(shape, options.mask);
}

// Runs, checks and times one problem. The caller has checked that a GPU is there.
RunReport run_problem(const RunOptions& o) {
  RunReport report;
  report.options = o;
  ScopedContext context;  // the current context, else device 0's primary context
  char name[256] = {};
  FLASHGEN_CU_CHECK(cuDeviceGetName(name, sizeof name, context.device()));
  report.device_name = name;
  report.device_sm = device_sm(context.device());

  std::optional<KernelConfig> config;
  if (o.config_name && !o.backward) config = KernelConfig::from_name(*o.config_name);

  const bool bhsd = o.layout == "bhsd";
  HostTensor q = make_host_tensor(o.dtype, o.batch, o.seqlen_q, o.heads_q, o.head_dim, bhsd);
  HostTensor k = make_host_tensor(o.dtype, o.batch, o.seqlen_k, o.heads_kv, o.head_dim, bhsd);
  HostTensor v = make_host_tensor(o.dtype, o.batch, o.seqlen_k, o.heads_kv, o.head_dim, bhsd);
  HostTensor out = make_host_tensor(o.dtype, o.batch, o.seqlen_q, o.heads_q, o.head_dim, bhsd);
  std::vector<float> lse(static_cast<size_t>(o.batch * o.heads_q * o.seqlen_q));

  DeviceBuffer q_dev(q.bytes()), k_dev(k.bytes()), v_dev(v.bytes()), out_dev(out.bytes());
  DeviceBuffer lse_dev(lse.size() * sizeof(float));
  const flashgen_tensor q_view = tensor_view(q, q_dev), k_view = tensor_view(k, k_dev), v_view = tensor_view(v, v_dev),
                        out_view = tensor_view(out, out_dev);
  float* lse_ptr = static_cast<float*>(lse_dev.data());
  flashgen_attention_options options{};
  options.softmax_scale = o.scale;
  options.mask = mask_of(o);
  options.deterministic = 0;
  // Validate before the slow part (host data): a bad shape fails here with the library's own message.
  const ForwardProblem problem = make_forward_problem(&q_view, &k_view, &v_view, &out_view, lse_ptr, &options);
  report.scale = problem.params.scale;

  std::mt19937 rng(o.seed);
  fill_normal(q, rng);
  fill_normal(k, rng);
  fill_normal(v, rng);
  q_dev.upload(q.bits);
  k_dev.upload(k.bits);
  v_dev.upload(v.bits);
  // 0xFF bytes are NaN in fp16, bf16 and fp32: anything the kernel fails to write shows up in the check.
  out_dev.fill_bytes(0xFF);
  lse_dev.fill_bytes(0xFF);

  Stream stream;
  auto launch = [&] {
    return config ? attention_forward(problem, stream.get(), *config)
                  : attention_forward(q_view, k_view, v_view, out_view, lse_ptr, options, stream.get());
  };

  const Clock::time_point first = Clock::now();
  const ForwardLaunch forward_launch = launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream.get()));
  report.first_launch_ms = ms_since(first);
  report.config_name = flashgen::config_name(forward_launch.config);
  report.reason = forward_launch.reason;
  report.arch = forward_launch.arch;

  out_dev.download(out.bits.data(), out.bytes());
  lse_dev.download(lse.data(), lse_dev.bytes());
  const AttentionShape shape = shape_of(o);
  report.check = check_rows(shape, q, k, v, out, lse, sample_rows(o.batch, o.heads_q, o.seqlen_q, o.check_rows),
                            report.scale, options.mask);
  if (o.backward) {
    options.deterministic = o.deterministic ? 1 : 0;
    run_backward(o, shape, q, k, v, q_view, k_view, v_view, out_view, lse_ptr, options, stream.get(), rng, report);
    return report;
  }

  report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
  report.flops = forward_flops(shape, options.mask);
  return report;
}

// One decimal for real throughput, significant digits for tiny problems that would print as 0.0.
std::string tflops_text(double tflops) { return format(tflops >= 1 ? "%.1f TFLOP/s" : "%.3g TFLOP/s", tflops); }

void print_run_report(const RunReport& r, std::ostream& os) {
  const Tolerance tol = tolerance_for(r.options.dtype);
  os << "device:   " << r.device_name << " (sm_" << r.device_sm << ")\n"
     << "problem:  " << problem_text(r.options, r.scale) << '\n'
     << "pass:     " << (r.options.backward ? (r.options.deterministic ? "backward (deterministic)" : "backward")
                                                   : "forward") << '\n'
     << "config:   " << r.config_name << " for " << arch_label(r.arch) << '\n'
     << "why:      " << r.reason << '\n'
     << format("first:    %.1f ms (first launch, includes compiling or loading the kernel)\n", r.first_launch_ms);
  if (!r.options.backward) {
    os << format("check:    %zu rows, max abs error out %.3g (tol %.0e + %.0e*|ref|), lse %.3g (tol %.0e): %s\n",
                 r.check.rows, r.check.max_error_out, tol.out_abs, tol.out_rel, r.check.max_error_lse, tol.lse_abs,
                 r.check.pass() ? "PASS" : "FAIL");
  } else if (r.check.rows == 0) {
    os << "check:    skipped: the float64 reference of this problem is too large (shrink it to check)\n";
  } else {
    os << format("check:    dq, dk, dv against the float64 reference, max |got - ref| / max |ref| %.3g: %s\n",
                 r.check.max_error_out, r.check.pass() ? "PASS" : "FAIL");
  }
  for (const std::string& line : r.check.first_mismatches) os << "          mismatch: " << line << '\n';
  if (r.check.mismatches > static_cast<int64_t>(r.check.first_mismatches.size()))
    os << "          ... " << r.check.mismatches << " mismatches in all\n";
  os << format("time:     median %.4f ms (min %.4f, max %.4f) over %zu launches after %d warm-up\n", r.median_ms(),
               r.times_ms.front(), r.times_ms.back(), r.times_ms.size(), r.options.warmup)
     << "speed:    " << tflops_text(r.tflops()) << format(" (%.4g GFLOP per launch)\n", r.flops / 1e9);
}

Json run_report_json(const RunReport& r) {
  const RunOptions& o = r.options;
  return {
      {"device", {{"name", r.device_name}, {"sm", r.device_sm}}},
      {"problem",
       {{"batch", o.batch}, {"seqlen_q", o.seqlen_q}, {"seqlen_k", o.seqlen_k}, {"heads_q", o.heads_q},
        {"heads_kv", o.heads_kv}, {"head_dim", o.head_dim}, {"dtype", dtype_name(o.dtype)}, {"causal", o.causal},
        {"scale", r.scale}, {"layout", o.layout}, {"seed", o.seed}}},
      {"pass", o.backward ? "backward" : "forward"},
      {"deterministic", o.deterministic},
      {"config", r.config_name},
      {"arch", r.arch},
      {"reason", r.reason},
      {"first_launch_ms", r.first_launch_ms},
      {"check",
       {{"rows", r.check.rows}, {"max_abs_error_out", r.check.max_error_out},
        {"max_abs_error_lse", r.check.max_error_lse}, {"mismatches", r.check.mismatches},
        {"first_mismatches", r.check.first_mismatches},
        // A backward too large for the float64 reference is not checked: pass is null unless the forward failed.
        {"skipped", o.backward && r.check.rows == 0},
        {"pass", o.backward && r.check.rows == 0 && r.check.pass() ? Json(nullptr) : Json(r.check.pass())}}},
      {"timing",
       {{"iters", r.times_ms.size()}, {"warmup", o.warmup}, {"median_ms", r.median_ms()},
        {"min_ms", r.times_ms.front()}, {"max_ms", r.times_ms.back()}, {"flops", r.flops}, {"tflops", r.tflops()}}},
  };
}

// The host copies of `run` (inputs, output, LSE; with --backward dout and the three gradients) are
// allocated before the library sees the problem: refuse what this machine cannot hold instead of being
// killed for it.
void check_host_memory(const RunOptions& o) {
  const double q_elements = double(o.batch) * o.seqlen_q * o.heads_q * o.head_dim;
  const double kv_elements = double(o.batch) * o.seqlen_k * o.heads_kv * o.head_dim;
  const double host_bytes = 2 * (o.backward ? 4 : 2) * (q_elements + kv_elements) + 4.0 * o.batch * o.heads_q * o.seqlen_q;
  const double memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (memory_bytes > 0 && host_bytes > 0.8 * memory_bytes) {
    char text[160];
    std::snprintf(text, sizeof text, "this problem's host tensors need %.1f GiB; this machine has %.1f GiB",
                  host_bytes / double(1 << 30), memory_bytes / double(1 << 30));
    fail(Status::kInvalidArgument, text);
  }
}

// The library's own checks of the problem and the --config name, on placeholder addresses (never read), so a
// bad argument is reported as one (exit 2) before the GPU is looked for. The config is checked against sm_90,
// whose limits are the widest of the GPUs either family runs on (the GPU's own come at launch).
void check_run_problem(const RunOptions& o) {
  const flashgen_dtype dtype = abi_dtype(o.dtype);
  auto placeholder = [&](int n, int64_t seqlen, int64_t heads) {
    return bshd_tensor(reinterpret_cast<void*>(uintptr_t{1} << (20 + n)), dtype, o.batch, seqlen, heads, o.head_dim);
  };
  const flashgen_tensor q = placeholder(0, o.seqlen_q, o.heads_q), k = placeholder(1, o.seqlen_k, o.heads_kv),
                        v = placeholder(2, o.seqlen_k, o.heads_kv), out = placeholder(3, o.seqlen_q, o.heads_q);
  flashgen_attention_options options{o.scale, mask_of(o), o.deterministic ? 1 : 0};
  if (o.backward) {
    const flashgen_tensor dout = placeholder(4, o.seqlen_q, o.heads_q), dq = placeholder(5, o.seqlen_q, o.heads_q),
                          dk = placeholder(6, o.seqlen_k, o.heads_kv), dv = placeholder(7, o.seqlen_k, o.heads_kv);
    const float* lse = reinterpret_cast<const float*>(uintptr_t{1} << 28);
    const BackwardProblem problem = make_backward_problem(&q, &k, &v, &out, &dout, lse, &dq, &dk, &dv, &options);
    if (o.config_name)
      check_requested_config(BwdConfig::from_name(*o.config_name), problem.dtype, problem.head_dim, problem.mask, 90);
  } else {
    const ForwardProblem problem = make_forward_problem(&q, &k, &v, &out, nullptr, &options);
    if (o.config_name)
      check_requested_config(KernelConfig::from_name(*o.config_name), problem.dtype, problem.head_dim, problem.mask,
                             90);
  }
}

int command_run(const Args& args) {
  const RunOptions options = parse_run_options(args);
  check_run_problem(options);
  check_host_memory(options);
  std::string why;
  if (!driver_available(&why)) fail(Status::kNoDevice, "run needs a GPU: " + why);
  const RunReport report = run_problem(options);
  if (args.has("json")) print_json(run_report_json(report));
  else print_run_report(report, std::cout);
  return report.check.pass() ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------
// flashgen demo

Command demo_command() {
  return Command("demo",
                 "The main job. With a GPU: runs, checks and times the default problem of `flashgen run`\n"
                 "(batch 4, seqlen 4096, 16 heads, head_dim 128, fp16). Without one: compiles the default\n"
                 "candidates for sm_80 and sm_90a and prints their table.",
                 "[--jobs N]")
      .option("jobs", "N", "without a GPU: compile N kernels at a time (default: the number of cores)", false, 'j');
}

int command_demo(const Args& args) {
  const int threads = static_cast<int>(args.int_or("jobs", default_jobs(), 1, 1024));
  std::string why;
  if (driver_available(&why)) {
    const RunReport report = run_problem(RunOptions{});
    print_run_report(report, std::cout);
    std::cout << format("\n%s on %s: %.3f ms, ", report.config_name.c_str(), report.device_name.c_str(),
                        report.median_ms())
              << tflops_text(report.tflops()) << ", check " << (report.check.pass() ? "PASS" : "FAIL") << '\n';
    return report.check.pass() ? 0 : 1;
  }
  const Clock::time_point start = Clock::now();
  const std::vector<CompileOutcome> outcomes = compile_jobs(default_jobs_for(kDefaultArchs), true, threads);
  print_compile_table(outcomes, std::cout);
  const size_t failed = report_compile_summary(outcomes, ms_since(start));
  std::cout << "No GPU found (" << why << "): compiled only; timing needs a GPU.\n";
  return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------
// flashgen db

Command db_command() {
  return Command("db",
                 "Reads and edits the tuning database: every candidate's timing per (device, problem) and the\n"
                 "winner that the run-time choice uses.",
                 "<list|show|export|import|merge|prune> [arguments] [options]", -1,
                 "actions:\n"
                 "  list                    one line per stored winner: device, problem, config, median ms\n"
                 "  show <problem-text>     the winners whose problem id contains the text, with every\n"
                 "                          candidate row (status, median, spread, samples, detail)\n"
                 "  export [-o FILE]        every row as JSON, to stdout or FILE\n"
                 "  import FILE             merges a JSON export (FILE may be -) into the database\n"
                 "  merge OUT IN1 [IN2...]  merges database files (each read-only) into the database file OUT\n"
                 "  prune                   removes the rows of --device and/or --problem-class (or --all)")
      .option("db", "PATH", "the database (default: " + TuningStore::default_path().string() + ")")
      .option("output", "FILE", "export: write to FILE (replaced whole) instead of stdout; - is stdout", false, 'o')
      .option("device", "ID", "prune: only rows of this device id (as `db list` prints it)")
      .option("problem-class", "CLASS", "prune: only rows of this problem class, e.g. fwd|bf16|d128|causal|g1")
      .flag("all", "prune: allow removing every row when no filter is given")
      .flag("json", "print JSON (list, show, import, merge, prune)");
}

// A database the command writes: a damaged file or another program's database would be moved aside to
// start a fresh one, which the library does for its own default file but a command naming it should not.
void refuse_unusable_output(const fs::path& path, const std::string& consequence) {
  if (auto why = TuningStore::why_unusable(path))
    fail(Status::kInvalidArgument, "'" + path.string() + "' is " + *why + "; " + consequence +
                                       " (move it away or name another file)");
}

// A database the command reads, opened read-only; refused (naming it as `name`, the message ending in
// consequence) when it is damaged, another program's or otherwise unreadable rather than read as empty. A
// missing one is empty.
std::unique_ptr<TuningStore> open_read_only(const fs::path& path, const std::string& name,
                                            const std::string& consequence = "") {
  if (auto why = TuningStore::why_unusable(path)) fail(Status::kInvalidArgument, name + " is " + *why + consequence);
  auto store = std::make_unique<TuningStore>(path, true);
  if (store->unreadable()) fail(Status::kInvalidArgument, name + " is " + *store->unreadable() + consequence);
  return store;
}

// --db, else the default database; a directory (or a path ending in '/') is refused.
fs::path db_path_of(const Args& args) {
  std::string path = TuningStore::default_path().string();
  if (args.has("db")) {
    path = args.string_or("db", "");
    if (path.empty() || path.back() == '/') throw UsageError("--db needs a file path, got '" + path + "'", args.usage());
  }
  reject_directory(path, "--db");
  return path;
}

// One stored winner as `db list --json` prints it.
Json choice_json(const StoredChoice& choice) {
  return {{"device", choice.device.id()},
          {"problem", choice.problem.id()},
          {"config", flashgen::config_name(choice.config)},
          {"median_ms", choice.median_ms}};
}

Json candidate_json(const CandidateResult& c) {
  return {{"config", flashgen::config_name(c.config)}, {"status", c.status},   {"median_ms", c.median_ms},
          {"spread", c.spread},        {"samples", c.samples}, {"detail", c.detail}};
}

void print_winners(const std::vector<StoredChoice>& winners, std::ostream& os) {
  Table table({"device", "problem", "config", "median ms"});
  for (const StoredChoice& w : winners)
    table.add({w.device.id(), w.problem.id(), flashgen::config_name(w.config), format("%.4f", w.median_ms)});
  table.print(os);
}

Json read_json_file(const std::string& path) {
  try {
    if (path == "-") return Json::parse(std::cin);
    std::ifstream in = open_input(path, "file");
    return Json::parse(in);
  } catch (const Json::exception& error) {
    fail(Status::kInvalidArgument, "'" + path + "' is not JSON: " + error.what());
  }
}

int command_db(const Args& args) {
  if (args.positionals.empty())
    throw UsageError("db needs an action: list, show, export, import, merge or prune", args.usage());
  const std::string action = args.positionals[0];
  const std::vector<std::string> operands(args.positionals.begin() + 1, args.positionals.end());
  const bool json = args.has("json");
  const fs::path db_path = db_path_of(args);

  // Each option belongs to one action; anything else is a mistake worth reporting.
  auto allow = [&](const std::vector<std::string>& options) {
    for (const char* name : {"output", "device", "problem-class", "all"})
      if (args.has(name) && std::find(options.begin(), options.end(), name) == options.end())
        throw UsageError("--" + std::string(name) + " does not apply to 'db " + action + "'", args.usage());
  };
  auto operand_count = [&](size_t lo, size_t hi, const char* what) {
    if (operands.size() < lo || operands.size() > hi)
      throw UsageError("'db " + action + "' takes " + what, args.usage());
  };
  auto readable = [&] { return open_read_only(db_path, "tuning database " + db_path.string()); };

  if (action == "list") {
    allow({});
    operand_count(0, 0, "no arguments");
    const std::vector<StoredChoice> winners = readable()->winners();
    if (json) {
      Json array = Json::array();
      for (const StoredChoice& w : winners) array.push_back(choice_json(w));
      print_json(array);
    } else if (winners.empty()) {
      std::cout << "no tuning results in " << db_path.string() << '\n';
    } else {
      print_winners(winners, std::cout);
    }
    return 0;
  }
  if (action == "show") {
    allow({});
    operand_count(1, 1, "one problem id or part of one");
    const std::unique_ptr<TuningStore> opened = readable();
    const TuningStore& store = *opened;
    Json array = Json::array();
    size_t matched = 0;
    for (const StoredChoice& w : store.winners()) {
      if (w.problem.id().find(operands[0]) == std::string::npos) continue;
      ++matched;
      const std::vector<CandidateResult> rows = store.candidates(w.device, w.problem);
      if (json) {
        Json entry = choice_json(w);
        entry["candidates"] = Json::array();
        for (const CandidateResult& c : rows) entry["candidates"].push_back(candidate_json(c));
        array.push_back(std::move(entry));
        continue;
      }
      std::cout << (matched > 1 ? "\n" : "") << "device:  " << w.device.id() << '\n'
                << "problem: " << w.problem.id() << '\n'
                << format("winner:  %s, %.4f ms\n", flashgen::config_name(w.config).c_str(), w.median_ms);
      Table table({"config", "status", "median ms", "spread", "samples", "detail"});
      for (const CandidateResult& c : rows)
        table.add({flashgen::config_name(c.config), c.status, c.status == "ok" ? format("%.4f", c.median_ms) : "-",
                   c.status == "ok" ? format("%.1f%%", c.spread * 100) : "-", std::to_string(c.samples),
                   first_line(c.detail)});
      table.print(std::cout);
    }
    if (json) print_json(array);
    else if (matched == 0) std::cout << "no stored problem matches '" << operands[0] << "' in " << db_path.string() << '\n';
    return 0;
  }
  if (action == "export") {
    allow({"output"});
    operand_count(0, 0, "no arguments (write to a file with -o FILE)");
    const std::string text = json_text(readable()->export_json()) + "\n";
    if (!args.has("output")) {
      std::cout << text;
      return 0;
    }
    const std::string output = args.string_or("output", "");
    std::error_code error;
    if (fs::equivalent(output, db_path, error))
      fail(Status::kInvalidArgument, "-o '" + output + "' is the database being exported");
    write_file(output, text);
    return 0;
  }
  if (action == "import") {
    allow({});
    operand_count(1, 1, "one JSON file (or - for stdin)");
    const Json data = read_json_file(operands[0]);
    winners_from_export(data, operands[0]);  // a document import would refuse creates no database either
    refuse_unusable_output(db_path, "nothing was imported");
    const int changed = TuningStore(db_path).import_json(data);
    if (json) print_json({{"db", db_path.string()}, {"winners_added_or_replaced", changed}});
    else std::cout << changed << " winners added or replaced in " << db_path.string() << '\n';
    return 0;
  }
  if (action == "merge") {
    allow({});
    if (args.has("db")) throw UsageError("'db merge' names its output file as OUT, not with --db", args.usage());
    operand_count(2, std::numeric_limits<size_t>::max(), "an output file and at least one input file");
    reject_directory(operands[0], "OUT");
    // A missing or damaged input is a mistake, not an empty database: read them all before touching OUT.
    std::vector<Json> inputs;
    for (size_t i = 1; i < operands.size(); ++i) {
      if (!fs::exists(operands[i])) fail(Status::kInvalidArgument, "no database file '" + operands[i] + "'");
      inputs.push_back(open_read_only(operands[i], "database file '" + operands[i] + "'", "; nothing was merged")
                           ->export_json());
    }
    refuse_unusable_output(operands[0], "nothing was merged");
    TuningStore out(operands[0]);
    int changed = 0;
    for (const Json& input : inputs) changed += out.import_json(input);
    if (json) {
      const std::vector<std::string> inputs(operands.begin() + 1, operands.end());
      print_json({{"db", operands[0]}, {"inputs", inputs}, {"winners_added_or_replaced", changed}});
    } else {
      std::cout << "merged " << operands.size() - 1 << " files into " << operands[0] << ": " << changed
                << " winners added or replaced\n";
    }
    return 0;
  }
  if (action == "prune") {
    allow({"device", "problem-class", "all"});
    operand_count(0, 0, "no arguments (filter with --device and --problem-class)");
    const std::string device = args.string_or("device", "");
    const std::string problem_class = args.string_or("problem-class", "");
    if (device.empty() && problem_class.empty() && !args.has("all"))
      throw UsageError("prune without --device or --problem-class removes every row: pass --all to mean that",
                       args.usage());
    // Pruning a file that is not there, or damaged, would create or replace one and report 0 rows.
    if (!fs::exists(db_path)) fail(Status::kInvalidArgument, "no database file '" + db_path.string() + "'");
    readable();
    TuningStore store(db_path);
    // prune() counts rows of both tables (winners and candidates); the winners are what `db list` shows.
    const size_t winners_before = store.winners().size();
    const int removed = store.prune(device, problem_class);
    const size_t winners_removed = winners_before - store.winners().size();
    if (json)
      print_json({{"db", db_path.string()}, {"removed", removed}, {"winners_removed", winners_removed}});
    else
      std::cout << "removed " << removed << " rows (" << winners_removed << " winners) from " << db_path.string()
                << '\n';
    return 0;
  }
  throw UsageError("unknown db action '" + action + "'", args.usage());
}

// ---------------------------------------------------------------------------------------------------
// flashgen tune

Command tune_command() {
  return Command("tune",
                 "Tunes the forward kernel (with --backward the backward's kernels) on the GPU for one\n"
                 "problem (given by flags) or for every problem of a JSON spec: enumerates and prunes the search space, compiles the candidates, checks\n"
                 "each against a float64 reference, times them and stores every row and the winner in the\n"
                 "tuning database. A problem whose bucket the database already holds for this GPU is skipped\n"
                 "unless --force, so an interrupted sweep can simply be run again.\n"
                 "\n"
                 "Across machines: --shard i/N (by default from SLURM_PROCID/SLURM_NTASKS, else\n"
                 "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE) tunes the spec's problems i, i+N, i+2N, ...\n"
                 "into its own file, .shard<i>-of-<N> put before the database's extension; `flashgen db merge` joins the files.\n"
                 "\n"
                 "Spec: {\"max_candidates\": 32, \"problems\": [{\"pass\": \"backward\", \"deterministic\": false,\n"
                 "\"dtype\": \"bf16\", \"head_dim\": 128,\n"
                 "\"causal\": \"bottom-right\", \"batch\": 4, \"heads_q\": 32, \"heads_kv\": 8, \"seqlen_q\": 4096,\n"
                 "\"seqlen_k\": 4096}, ...]}; omitted fields take the flag defaults below.",
                 "[options]")
      .flag("backward", "tune the backward pass (dq, dk, dv) instead of the forward")
      .flag("deterministic", "with --backward: the deterministic dQ strategy (bitwise repeatable)")
      .option("dtype", "T", "fp16 or bf16 (default fp16)")
      .option("head-dim", "D", "head dimension (default 128)")
      .option("causal", "MODE", "none, bottom-right or top-left (default none)")
      .option("batch", "B", "batch size (default 4)")
      .option("heads-q", "H", "query heads (default 16)")
      .option("heads-kv", "H", "key/value heads; heads-q must be a multiple (default 16)")
      .option("seqlen-q", "N", "query length (default 4096)")
      .option("seqlen-k", "N", "key/value length (default 4096)")
      .option("spec", "FILE", "tune every problem of this JSON spec instead of the one the flags describe")
      .option("shard", "I/N", "tune only problems I, I+N, ... of the spec, into their own database file")
      .option("devices", "LIST", "all, or GPU ordinals like 0,1: one worker process per GPU, each tuning its share; a "
                                 "worker that crashes is restarted without the candidate it was running")
      .option("max-candidates", "N", "time N candidates, not the whole valid space: the built-in choice, its "
                                     "one-knob neighbours, then others spread evenly")
      .option("candidates", "NAMES", "time exactly these configs (comma-separated names of the problem's pass, "
                                     "dtype, head_dim and mask), e.g. to re-time a winner against the built-in "
                                     "choice: the best three and the built-in are re-timed interleaved. Needs "
                                     "--db (its winner replaces the bucket's stored one) and implies --force")
      .option("db", "PATH", "the database (default: " + TuningStore::default_path().string() + ")")
      .flag("force", "tune even when the database already holds this problem's bucket for this GPU")
      .flag("dry-run", "print the problems this shard would tune and its database, then stop (no GPU needed)")
      .option("arch", "SM", "with --dry-run --json: list each problem's candidates for sm_SM (default 90)")
      .flag("worker", "internal: run as one worker of --devices")
      .option("journal", "FILE", "internal (--worker): names the candidate being launched, for crash isolation")
      .option("crashed", "NAME:WHY", "internal (--worker): a candidate that crashed a worker, recorded and skipped",
              true)
      .flag("json", "print JSON: the result (an array with --spec), the plan (--dry-run) or the summary (--devices)");
}


template <class Config>
std::string space_text(const BasicSpaceReport<Config>& space) {
  std::string reasons;
  for (const auto& [reason, count] : space.pruned_by_reason)
    reasons += (reasons.empty() ? "" : "; ") + reason + ": " + std::to_string(count);
  return format("%d configs, %d pruned", space.total, space.pruned) + (reasons.empty() ? "" : " (" + reasons + ")") +
         format(", %zu valid", space.valid.size());
}

std::string causal_text(flashgen_mask mask) {
  return mask == FLASHGEN_MASK_CAUSAL ? "bottom-right" : mask == FLASHGEN_MASK_CAUSAL_TOP_LEFT ? "top-left" : "none";
}

flashgen_mask mask_from_text(const std::string& text) {
  return text == "bottom-right" ? FLASHGEN_MASK_CAUSAL : text == "top-left" ? FLASHGEN_MASK_CAUSAL_TOP_LEFT
                                                                           : FLASHGEN_MASK_NONE;
}

// One problem of a tune run: its sizes and its pass (the backward with its dQ strategy).
struct TuneProblem : BackwardSweepProblem {
  bool backward = false;
};

const char* pass_text(const TuneProblem& p) {
  return !p.backward ? "forward" : p.deterministic ? "backward (deterministic)" : "backward";
}

std::string problem_line(const TuneProblem& p) {
  return format("%s %s d%d causal=%s batch %d heads %d/%d seqlen %d/%d", pass_text(p), dtype_name(p.dtype),
                p.head_dim, causal_text(p.mask).c_str(), p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k);
}

// A problem's spec entry (read_tune_spec's format).
Json problem_json(const TuneProblem& p) {
  return {{"pass", p.backward ? "backward" : "forward"}, {"deterministic", p.deterministic},
          {"dtype", dtype_name(p.dtype)}, {"head_dim", p.head_dim}, {"causal", causal_text(p.mask)},
          {"batch", p.batch}, {"heads_q", p.heads_q}, {"heads_kv", p.heads_kv},
          {"seqlen_q", p.seqlen_q}, {"seqlen_k", p.seqlen_k}};
}

// Why the library refuses the problem (its sizes, as `run` checks them) or no kernel family takes its
// head_dim (checked against the sm80 family, which every supported GPU runs), or nullopt: a sweep would
// stop at such a problem, so the dry run says it too.
std::optional<std::string> untunable(const TuneProblem& p) {
  const MaskKind mask = p.mask == FLASHGEN_MASK_NONE ? MaskKind::kNone : MaskKind::kCausal;
  RunOptions as_run;
  as_run.batch = p.batch, as_run.seqlen_q = p.seqlen_q, as_run.seqlen_k = p.seqlen_k;
  as_run.heads_q = p.heads_q, as_run.heads_kv = p.heads_kv, as_run.head_dim = p.head_dim, as_run.dtype = p.dtype;
  as_run.causal = causal_text(p.mask), as_run.backward = p.backward, as_run.deterministic = p.deterministic;
  try {
    if (p.backward) {
      heuristic_backward_configs(p.dtype, p.head_dim, mask, p.deterministic, 80);
    } else {
      heuristic_forward_configs(p.dtype, p.head_dim, mask, 80);
    }
    check_run_problem(as_run);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// The problem the flags describe (every flag has a default).
TuneProblem problem_from_flags(const Args& args) {
  constexpr long long kIntMax = std::numeric_limits<int>::max();
  TuneProblem problem;
  problem.backward = args.has("backward");
  problem.deterministic = args.has("deterministic");
  if (problem.deterministic && !problem.backward) fail(Status::kInvalidArgument, "--deterministic needs --backward");
  problem.dtype = args.choice_or("dtype", "fp16", {"fp16", "bf16"}) == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  problem.head_dim = static_cast<int>(args.int_or("head-dim", problem.head_dim, 1, 4096));
  problem.mask = mask_from_text(args.choice_or("causal", "none", {"none", "bottom-right", "top-left"}));
  problem.batch = static_cast<int>(args.int_or("batch", problem.batch, 1, kIntMax));
  problem.heads_q = static_cast<int>(args.int_or("heads-q", problem.heads_q, 1, kIntMax));
  problem.heads_kv = static_cast<int>(args.int_or("heads-kv", problem.heads_kv, 1, kIntMax));
  problem.seqlen_q = static_cast<int>(args.int_or("seqlen-q", problem.seqlen_q, 1, kIntMax));
  problem.seqlen_k = static_cast<int>(args.int_or("seqlen-k", problem.seqlen_k, 1, kIntMax));
  if (problem.heads_q % problem.heads_kv != 0) fail(Status::kInvalidArgument, "--heads-q must be a multiple of --heads-kv");
  if (auto why = untunable(problem)) fail(Status::kInvalidArgument, *why);
  return problem;
}

struct TuneSpec {
  std::vector<TuneProblem> problems;
  std::optional<size_t> max_candidates;
};

// A JSON spec; every error names the file and the field. Omitted problem fields take `defaults`.
TuneSpec read_tune_spec(const std::string& path, const TuneProblem& defaults) {
  const Json j = read_json_file(path);
  auto bad = [&](const std::string& what) { fail(Status::kInvalidArgument, "tune spec " + path + ": " + what); };
  if (!j.is_object()) bad("must be a JSON object with a \"problems\" array");
  for (const auto& [key, value] : j.items())
    if (key != "problems" && key != "max_candidates") bad("unknown field \"" + key + "\"");
  TuneSpec spec;
  if (j.contains("max_candidates")) {
    if (!j["max_candidates"].is_number_integer() || j["max_candidates"].get<long long>() < 1)
      bad("\"max_candidates\" must be a positive integer");
    spec.max_candidates = j["max_candidates"].get<size_t>();
  }
  if (!j.contains("problems") || !j["problems"].is_array() || j["problems"].empty())
    bad("\"problems\" must be a non-empty array");
  for (size_t i = 0; i < j["problems"].size(); ++i) {
    const Json& entry = j["problems"][i];
    const std::string where = "problems[" + std::to_string(i) + "]";
    if (!entry.is_object()) bad(where + " must be an object");
    TuneProblem p = defaults;
    for (const auto& [key, value] : entry.items()) {
      auto positive = [&](int& field) {
        if (!value.is_number_integer() || value.get<long long>() < 1 || value.get<long long>() > std::numeric_limits<int>::max())
          bad(where + "." + key + " must be a positive integer");
        field = value.get<int>();
      };
      if (key == "pass") {
        if (value != "forward" && value != "backward") bad(where + ".pass must be \"forward\" or \"backward\"");
        p.backward = value == "backward";
      } else if (key == "deterministic") {
        if (!value.is_boolean()) bad(where + ".deterministic must be true or false");
        p.deterministic = value.get<bool>();
      } else if (key == "dtype") {
        if (value != "fp16" && value != "bf16") bad(where + ".dtype must be \"fp16\" or \"bf16\"");
        p.dtype = value == "bf16" ? DType::kBFloat16 : DType::kFloat16;
      } else if (key == "causal") {
        if (value != "none" && value != "bottom-right" && value != "top-left")
          bad(where + ".causal must be \"none\", \"bottom-right\" or \"top-left\"");
        p.mask = mask_from_text(value.get<std::string>());
      } else if (key == "head_dim") {
        positive(p.head_dim);
      } else if (key == "batch") {
        positive(p.batch);
      } else if (key == "heads_q") {
        positive(p.heads_q);
      } else if (key == "heads_kv") {
        positive(p.heads_kv);
      } else if (key == "seqlen_q") {
        positive(p.seqlen_q);
      } else if (key == "seqlen_k") {
        positive(p.seqlen_k);
      } else {
        bad(where + ": unknown field \"" + key + "\"");
      }
    }
    if (p.heads_q % p.heads_kv != 0) bad(where + ": heads_q must be a multiple of heads_kv");
    if (p.deterministic && !p.backward) bad(where + ": deterministic needs \"pass\": \"backward\"");
    if (auto why = untunable(p)) bad(where + ": " + *why);
    spec.problems.push_back(p);
  }
  return spec;
}

struct Shard {
  int index = 0;
  int count = 1;
  std::string source;  // "--shard", "SLURM_PROCID/SLURM_NTASKS", ... or "" when not sharded
};

// "i/N" with 0 <= i < N.
std::optional<Shard> parse_shard(const std::string& text) {
  int index = -1, count = 0;
  char slash = 0, extra = 0;
  if (std::sscanf(text.c_str(), "%d %c %d %c", &index, &slash, &count, &extra) != 3 || slash != '/' || count < 1 ||
      index < 0 || index >= count)
    return std::nullopt;
  return Shard{index, count, ""};
}

// --shard, else the Slurm or Open MPI rank and size, else the whole sweep. Only a --spec's problems are
// sharded: a single problem given by flags is tuned whole, in whichever task runs it.
Shard shard_of(const Args& args) {
  if (args.has("shard")) {
    const std::string text = args.string_or("shard", "");
    std::optional<Shard> shard = parse_shard(text);
    if (!shard) throw UsageError("--shard must be I/N with 0 <= I < N, got '" + text + "'", args.usage());
    if (!args.has("spec")) throw UsageError("--shard splits the problems of a --spec file", args.usage());
    shard->source = "--shard";
    return *shard;
  }
  if (!args.has("spec")) return Shard{};
  for (const auto& [rank, size] : {std::pair{"SLURM_PROCID", "SLURM_NTASKS"},
                                   std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}}) {
    const std::optional<std::string> r = env(rank), n = env(size);
    if (!r || !n) continue;
    std::optional<Shard> shard = parse_shard(*r + "/" + *n);
    if (!shard) fail(Status::kInvalidArgument, std::string(rank) + "=" + *r + " and " + size + "=" + *n +
                                                   " do not name a shard (need 0 <= rank < size)");
    shard->source = std::string(rank) + "/" + size;
    return *shard;
  }
  return Shard{};
}

// <db> for a whole sweep; <stem>.shard<i>-of-<N><extension> next to it for one shard of several.
fs::path shard_db_path(const fs::path& db, const Shard& shard) {
  if (shard.count == 1) return db;
  fs::path path = db;
  path.replace_filename(db.stem().string() + ".shard" + std::to_string(shard.index) + "-of-" +
                        std::to_string(shard.count) + db.extension().string());
  return path;
}

// Tunes one problem into store; prints (or returns as JSON) what happened.
// Crash isolation of a worker: candidates that crashed an earlier run of it, and the file that names the
// candidate being launched.
struct WorkerState {
  std::map<std::string, std::string> known_crashes;
  std::optional<fs::path> journal;
};

// The sweep of one pass: its key, space, built-in choice and sweep function.
template <class Config>
struct PassSweep {
  ProblemKey key;
  BasicSpaceReport<Config> space;
  Config heuristic;
  std::vector<Config> named;  // --candidates: swept instead of the space when not empty
  std::function<SweepResult(const std::vector<Config>&, CUstream, const SweepOptions&)> sweep;
};

template <class Config>
Json tune_pass(const PassSweep<Config>& pass, TuningStore& store, const fs::path& db_path, size_t max_candidates,
               bool force, bool json, const DeviceFingerprint& device, const WorkerState& worker) {
  const ProblemKey& key = pass.key;
  if (!force) {
    if (const std::optional<StoredChoice> stored = store.lookup_exact(device, key)) {
      if (!json) {
        std::cout << format("already tuned: %s, %.4f ms for %s on %s (--force tunes again)\n",
                            flashgen::config_name(stored->config).c_str(), stored->median_ms, key.id().c_str(),
                            device.id().c_str());
      }
      // The stored winner under the keys a sweep's result has (device, problem, winner, winner_ms), and the
      // stored row's own fields besides.
      Json j = choice_json(*stored);
      j["winner"] = flashgen::config_name(stored->config);
      j["winner_ms"] = stored->median_ms;
      j["skipped"] = true;
      j["db"] = db_path.string();
      return j;
    }
  }

  const auto& space = pass.space;
  const Config& heuristic = pass.heuristic;
  const std::vector<Config> candidates =
      pass.named.empty() ? capped_candidates(space, heuristic, max_candidates) : pass.named;
  if (!json) std::cout << "space: " << space_text(space) << '\n';
  std::cerr << "tuning " << key.id() << " on " << device.id() << ": compiling " << candidates.size()
            << " candidates\n";
  SweepOptions options;
  options.always_retime = {heuristic.name()};  // its time, printed next to the winner's, on the same basis
  options.known_crashes = worker.known_crashes;
  if (worker.journal) {
    // FLASHGEN_TEST_CRASH_CONFIG (testing only): the worker dies at that candidate as at a kernel fault.
    const std::optional<std::string> crash_at = env("FLASHGEN_TEST_CRASH_CONFIG");
    options.on_launch = [&, crash_at](const std::string& name) {
      std::ofstream(*worker.journal, std::ios::trunc) << name << std::flush;
      if (crash_at && name == *crash_at) std::abort();
    };
  }
  Clock::time_point timing_start = Clock::now();
  Clock::time_point start = Clock::now();
  double compile_s = 0;
  options.progress = [&](const std::string& line) {
    size_t done = 0, total = 0;  // "[i/N] name: x ms": the candidate's position in the list
    if (std::sscanf(line.c_str(), "[%zu/%zu]", &done, &total) == 2 && done > 0 && total >= done) {
      const double eta_s = ms_since(timing_start) / 1000 / static_cast<double>(done) * static_cast<double>(total - done);
      std::cerr << line << format("  (eta %.0f s)", eta_s) << '\n';
      return;
    }
    if (line.rfind("compiled ", 0) == 0) {  // timing starts after compiling
      timing_start = Clock::now();
      compile_s = ms_since(start) / 1000;
    }
    std::cerr << line << '\n';
  };
  Stream stream;
  start = Clock::now();
  const SweepResult result = pass.sweep(candidates, stream.get(), options);
  const double sweep_s = ms_since(start) / 1000;
  store.record(device, result.problem, result.candidates, result.winner, result.winner_ms);

  const CandidateResult* builtin = nullptr;
  for (const CandidateResult& c : result.candidates)
    if (config_name(c.config) == heuristic.name()) builtin = &c;
  const bool builtin_timed = builtin && builtin->status == "ok";
  size_t passed = 0;
  for (const CandidateResult& c : result.candidates) passed += c.status == "ok";

  if (!json) {
    std::cout << format("swept:     %zu candidates, %zu passed, in %.1f s (compile %.1f s, check and timing %.1f s)\n",
                        result.candidates.size(), passed, sweep_s, compile_s, sweep_s - compile_s)
              << format("winner:    %s, %.4f ms\n", flashgen::config_name(result.winner).c_str(), result.winner_ms);
    if (builtin_timed)
      std::cout << format("built-in:  %s, %.4f ms (the winner is %.2fx as fast)\n", heuristic.name().c_str(),
                          builtin->median_ms, builtin->median_ms / result.winner_ms);
    else
      std::cout << "built-in:  " << heuristic.name() << ": " << (builtin ? builtin->status : "not swept") << '\n';
    std::cout << "decision:  " << result.decision << '\n'
              << "stored:    " << result.problem.id() << " for " << device.id() << " in " << db_path.string() << '\n';
  }
  return {{"device", device.id()},
          {"problem", result.problem.id()},
          {"space", {{"total", space.total}, {"pruned", space.pruned}, {"pruned_by_reason", space.pruned_by_reason},
                     {"valid", space.valid.size()}}},
          {"candidates", result.candidates.size()},
          {"passed", passed},
          {"winner", flashgen::config_name(result.winner)},
          {"winner_ms", result.winner_ms},
          {"heuristic", heuristic.name()},
          {"heuristic_ms", builtin_timed ? Json(builtin->median_ms) : Json(nullptr)},
          {"heuristic_status", builtin ? builtin->status : "not swept"},
          {"decision", result.decision},
          {"sweep_s", sweep_s},
          {"compile_s", compile_s},
          {"check_and_timing_s", sweep_s - compile_s},
          {"db", db_path.string()},
          {"skipped", false}};
}

// The problem key a sweep of problem stores its rows under.
ProblemKey tune_problem_key(const TuneProblem& problem) {
  return problem.backward ? sweep_problem_key(static_cast<const BackwardSweepProblem&>(problem))
                          : sweep_problem_key(static_cast<const ForwardSweepProblem&>(problem));
}

// --candidates for a problem of key's class: each name parsed as a Config and checked against the key.
template <class Config>
std::vector<Config> named_candidates(const std::vector<std::string>& names, const ProblemKey& key) {
  constexpr bool backward = std::is_same_v<Config, BwdConfig>;
  std::vector<Config> configs;
  for (const std::string& name : names) {
    const bool forward_name = name.rfind("fwd_", 0) == 0, backward_name = name.rfind("bwd_", 0) == 0;
    if ((backward && forward_name) || (!backward && backward_name)) {
      fail(Status::kInvalidArgument, "--candidates: " + name + " is a " + (backward ? "forward" : "backward") +
                                         " config; this problem tunes the " + (backward ? "backward" : "forward"));
    }
    Config c;
    try {
      c = Config::from_name(name);
    } catch (const Error& e) {
      fail(Status::kInvalidArgument, std::string("--candidates: ") + e.what());
    }
    bool same_pass = true;
    if constexpr (backward) same_pass = key.family == (c.deterministic ? "bwd_det" : "bwd");
    if (!same_pass || c.dtype != key.dtype || c.head_dim != key.head_dim || c.mask != key.mask) {
      fail(Status::kInvalidArgument, "--candidates: " + name + " is not a config of the problem " + key.id());
    }
    configs.push_back(c);
  }
  return configs;
}

Json tune_one(const TuneProblem& problem, TuningStore& store, const fs::path& db_path, size_t max_candidates,
              bool force, bool json, const ScopedContext& context, const WorkerState& worker,
              const std::vector<std::string>& named) {
  const int arch = device_sm(context.device());
  const DeviceFingerprint device = current_device_fingerprint(static_cast<int>(context.device()));
  const ProblemKey key = tune_problem_key(problem);
  const MaskKind mask_kind = key.mask;
  if (problem.backward) {
    PassSweep<BwdConfig> pass;
    pass.key = key;
    pass.space = backward_space(problem.dtype, problem.head_dim, mask_kind, problem.deterministic, arch);
    pass.heuristic =
        heuristic_backward_choice(problem.dtype, problem.head_dim, mask_kind, problem.deterministic, arch).config;
    pass.named = named_candidates<BwdConfig>(named, pass.key);
    pass.sweep = [&](const std::vector<BwdConfig>& candidates, CUstream stream, const SweepOptions& options) {
      return sweep_backward(problem, candidates, stream, options);
    };
    return tune_pass(pass, store, db_path, max_candidates, force, json, device, worker);
  }
  PassSweep<KernelConfig> pass;
  pass.key = key;
  pass.space = forward_space(problem.dtype, problem.head_dim, mask_kind, arch);
  pass.heuristic = heuristic_forward_config(problem.dtype, problem.head_dim, mask_kind, arch);
  pass.named = named_candidates<KernelConfig>(named, pass.key);
  pass.sweep = [&](const std::vector<KernelConfig>& candidates, CUstream stream, const SweepOptions& options) {
    return sweep_forward(problem, candidates, stream, options);
  };
  return tune_pass(pass, store, db_path, max_candidates, force, json, device, worker);
}

// --devices: "all" (every GPU the driver lists) or comma-separated ordinals.
std::vector<int> parse_devices(const Args& args) {
  const std::string text = args.string_or("devices", "");
  std::vector<int> devices;
  if (text == "all") {
    std::string why;
    if (!driver_available(&why)) fail(Status::kNoDevice, "--devices all needs a GPU: " + why);
    int count = 0;
    FLASHGEN_CU_CHECK(cuDeviceGetCount(&count));
    for (int d = 0; d < count; ++d) devices.push_back(d);
    return devices;
  }
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int device = -1;
    const auto parsed = std::from_chars(item.data(), item.data() + item.size(), device);
    if (parsed.ec != std::errc() || parsed.ptr != item.data() + item.size() || device < 0 ||
        std::find(devices.begin(), devices.end(), device) != devices.end())
      throw UsageError("--devices must be all or distinct GPU ordinals like 0,1, got '" + text + "'", args.usage());
    devices.push_back(device);
  }
  if (devices.empty()) throw UsageError("--devices must be all or GPU ordinals like 0,1", args.usage());
  return devices;
}

// What CUDA_VISIBLE_DEVICES a worker for ordinal `device` gets: the parent's own mapping when it has one.
std::string visible_device(int device) {
  const std::optional<std::string> parent = env("CUDA_VISIBLE_DEVICES");
  if (!parent) return std::to_string(device);
  std::vector<std::string> entries;
  std::istringstream in(*parent);
  for (std::string item; std::getline(in, item, ',');) entries.push_back(item);
  return static_cast<size_t>(device) < entries.size() ? entries[static_cast<size_t>(device)] : std::to_string(device);
}

// Forks and execs `args` (args[0] the executable) with CUDA_VISIBLE_DEVICES set and stdout on stderr.
pid_t spawn(const std::vector<std::string>& args, const std::string& visible) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail(Status::kInternal, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
    ::dup2(2, 1);  // the supervisor's stdout stays its own (a summary, or JSON)
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "flashgen: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

constexpr int kMaxWorkerRestarts = 3;

// A dry run's problems as spec entries, each with the candidates a sweep would time on the one --arch (90 by
// default; the names given with --candidates as they are).
Json dry_run_entries(const Args& args, const std::vector<TuneProblem>& problems, const std::vector<std::string>& named,
                     size_t max_candidates) {
  const std::vector<int> archs = parse_archs(args, {90});
  if (archs.size() != 1) throw UsageError("tune --dry-run --json lists the candidates of one --arch", args.usage());
  const int arch = archs.front();
  Json entries = Json::array();
  for (const TuneProblem& p : problems) {
    const MaskKind kind = p.mask == FLASHGEN_MASK_NONE ? MaskKind::kNone : MaskKind::kCausal;
    Json names = Json::array();
    if (!named.empty()) {
      for (const std::string& name : named) names.push_back(name);
    } else if (p.backward) {
      const BackwardSpaceReport space = backward_space(p.dtype, p.head_dim, kind, p.deterministic, arch);
      const BwdConfig builtin = heuristic_backward_config(p.dtype, p.head_dim, kind, p.deterministic, arch);
      for (const BwdConfig& c : capped_candidates(space, builtin, max_candidates)) names.push_back(c.name());
    } else {
      const SpaceReport space = forward_space(p.dtype, p.head_dim, kind, arch);
      for (const KernelConfig& c :
           capped_candidates(space, heuristic_forward_config(p.dtype, p.head_dim, kind, arch), max_candidates))
        names.push_back(c.name());
    }
    Json entry = problem_json(p);
    entry["candidates"] = names;
    entries.push_back(entry);
  }
  return entries;
}

// `tune --devices`: one worker process per GPU over its share of the problems, each into its own file in
// <db>.workers/; a worker that dies is restarted (resuming) without the candidate its journal names;
// finally every worker's rows are merged into db.
int supervise_workers(const Args& args, const std::vector<TuneProblem>& problems, const fs::path& db,
                      std::optional<size_t> max_candidates) {
  const std::vector<int> devices = parse_devices(args);
  const bool json = args.has("json");
  const size_t m = devices.size();
  if (args.has("dry-run")) {  // each worker's problems, as a dry run without --devices prints them
    if (!json) std::cout << format("%zu problems on %zu GPUs into %s\n", problems.size(), m, db.string().c_str());
    Json plan = Json::array();
    for (size_t j = 0; j < m; ++j) {
      std::vector<TuneProblem> mine;
      for (size_t i = j; i < problems.size(); i += m) mine.push_back(problems[i]);
      if (json) {
        plan.push_back({{"device", devices[j]},
                        {"problems", dry_run_entries(args, mine, {}, max_candidates.value_or(
                                                                          std::numeric_limits<int>::max()))}});
        continue;
      }
      std::cout << format("  GPU %d: %zu problems\n", devices[j], mine.size());
      for (const TuneProblem& p : mine) std::cout << "    " << problem_line(p) << '\n';
    }
    if (json) print_json({{"db", db.string()}, {"workers", plan}});
    return 0;
  }
  // Before any file is made: a GPU, and every ordinal named on this machine.
  std::string why;
  if (!driver_available(&why)) fail(Status::kNoDevice, "tune --devices needs a GPU: " + why);
  int count = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetCount(&count));
  for (int device : devices)
    if (device >= count) fail(Status::kInvalidArgument, format("--devices names GPU %d; %d visible", device, count));
  fs::path work = db;
  work += ".workers";
  fs::create_directories(work);
  Json spec_problems = Json::array();
  for (const TuneProblem& p : problems) spec_problems.push_back(problem_json(p));
  const fs::path spec = work / "spec.json";
  std::ofstream(spec) << json_text({{"problems", spec_problems}}, 1) << '\n';
  const std::string exe = fs::read_symlink("/proc/self/exe").string();

  struct Worker {
    int device = 0;
    size_t slot = 0;
    pid_t pid = -1;
    int restarts = 0;
    std::vector<std::string> crashed;  // NAME:WHY
    fs::path db, journal;
    std::string failure;
  };
  std::vector<Worker> workers(m);
  auto start = [&](Worker& w) {
    std::vector<std::string> a = {exe,          "tune", "--worker", "--spec", spec.string(), "--shard",
                                  std::to_string(w.slot) + "/" + std::to_string(m), "--db", w.db.string(),
                                  "--journal", w.journal.string()};
    if (max_candidates) a.insert(a.end(), {"--max-candidates", std::to_string(*max_candidates)});
    if (args.has("force") && w.restarts == 0) a.push_back("--force");
    for (const std::string& c : w.crashed) a.insert(a.end(), {"--crashed", c});
    std::ofstream(w.journal, std::ios::trunc);
    w.pid = spawn(a, visible_device(w.device));
  };
  for (size_t j = 0; j < m; ++j) {
    Worker& w = workers[j];
    w.device = devices[j];
    w.slot = j;
    w.db = work / ("gpu" + std::to_string(w.device) + ".sqlite");
    w.journal = work / ("gpu" + std::to_string(w.device) + ".journal");
    start(w);
    std::cerr << format("flashgen: worker %zu/%zu on GPU %d (pid %d)\n", j + 1, m, w.device, static_cast<int>(w.pid));
  }
  Json crashes = Json::array();
  for (size_t running = m; running > 0;) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    if (pid < 0) {
      if (errno == EINTR) continue;
      fail(Status::kInternal, std::string("wait failed: ") + std::strerror(errno));
    }
    auto found = std::find_if(workers.begin(), workers.end(), [&](const Worker& w) { return w.pid == pid; });
    if (found == workers.end()) continue;
    Worker& w = *found;
    w.pid = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      --running;
      continue;
    }
    const std::string how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                : "exit status " + std::to_string(WEXITSTATUS(status));
    std::ifstream journal(w.journal);
    std::string culprit;
    std::getline(journal, culprit);
    if (!culprit.empty() && w.restarts < kMaxWorkerRestarts) {
      const std::string why = "crashed its worker process (" + how + ") on GPU " + std::to_string(w.device);
      std::cerr << "flashgen: worker on GPU " << w.device << " ended with " << how << " while running " << culprit
                << "; restarting it without that candidate\n";
      crashes.push_back({{"device", w.device}, {"config", culprit}, {"how", how}});
      w.crashed.push_back(culprit + ":" + why);
      ++w.restarts;
      start(w);
      continue;
    }
    w.failure = "ended with " + how + (culprit.empty() ? "" : " while running " + culprit);
    std::cerr << "flashgen: worker on GPU " << w.device << " " << w.failure << "\n";
    --running;
  }

  TuningStore store(db);
  int merged = 0;
  Json failed = Json::array();
  for (const Worker& w : workers) {
    if (!w.failure.empty()) failed.push_back({{"device", w.device}, {"failure", w.failure}});
    std::error_code ec;
    if (!fs::exists(w.db, ec)) continue;
    const TuningStore worker_db(w.db, /*read_only=*/true);
    if (worker_db.unreadable()) {  // kept with the work folder, not merged as empty
      failed.push_back(
          {{"device", w.device}, {"failure", "its database " + w.db.string() + " is " + *worker_db.unreadable()}});
      continue;
    }
    merged += store.import_json(worker_db.export_json());
  }
  if (failed.empty()) fs::remove_all(work);
  if (json) {
    print_json({{"db", db.string()}, {"devices", devices}, {"problems", problems.size()},
                {"winners_merged", merged}, {"crashes", crashes}, {"failed_workers", failed}});
  } else {
    std::cout << format("%zu problems on %zu GPUs: %d winners merged into %s; %zu candidate crashes isolated%s\n",
                        problems.size(), m, merged, db.string().c_str(), crashes.size(),
                        failed.empty() ? "" : format("; %zu workers failed (files kept in %s)", failed.size(),
                                                     work.string().c_str()).c_str());
  }
  return failed.empty() ? 0 : 1;
}

int command_tune(const Args& args) {
  constexpr long long kIntMax = std::numeric_limits<int>::max();
  if (args.has("arch") && !(args.has("dry-run") && args.has("json")))
    throw UsageError("--arch applies to --dry-run --json (a sweep runs on the GPU it finds)", args.usage());
  const TuneProblem flags = problem_from_flags(args);
  TuneSpec spec;
  if (args.has("spec")) {
    spec = read_tune_spec(args.string_or("spec", ""), flags);
  } else {
    if (flags.heads_q % flags.heads_kv != 0) throw UsageError("--heads-q must be a multiple of --heads-kv", args.usage());
    spec.problems.push_back(flags);
  }
  size_t max_candidates = spec.max_candidates.value_or(static_cast<size_t>(kIntMax));
  if (args.has("max-candidates")) max_candidates = static_cast<size_t>(args.int_or("max-candidates", kIntMax, 1, kIntMax));
  std::vector<std::string> named;  // --candidates: trimmed, each once, in the order given
  {
    std::stringstream list(args.string_or("candidates", ""));
    for (std::string item; std::getline(list, item, ',');) {
      const size_t first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
      if (first == std::string::npos) continue;
      item = item.substr(first, last - first + 1);
      if (std::find(named.begin(), named.end(), item) == named.end()) named.push_back(item);
    }
  }
  if (args.has("candidates")) {
    if (named.empty()) throw UsageError("--candidates needs at least one config name", args.usage());
    if (!args.has("db") && !args.has("dry-run")) {
      throw UsageError("--candidates needs --db: its winner replaces the bucket's stored one, so it goes to a "
                       "database of its own",
                       args.usage());
    }
    for (const char* other : {"spec", "devices", "max-candidates"}) {
      if (args.has(other))
        throw UsageError("--candidates names one problem's configs; it does not go with --" + std::string(other),
                         args.usage());
    }
    // A bad name stops here, before any GPU work.
    if (flags.backward) named_candidates<BwdConfig>(named, tune_problem_key(flags));
    else named_candidates<KernelConfig>(named, tune_problem_key(flags));
  }
  const Shard shard = shard_of(args);
  std::vector<TuneProblem> mine;
  for (size_t i = static_cast<size_t>(shard.index); i < spec.problems.size(); i += static_cast<size_t>(shard.count))
    mine.push_back(spec.problems[i]);
  const fs::path base_db = db_path_of(args);
  // A worker of --devices writes the file its supervisor named and merges; only a shard of its own is renamed.
  const fs::path db_path = args.has("worker") ? base_db : shard_db_path(base_db, shard);
  reject_directory(db_path, "--db");
  const bool json = args.has("json");

  if (args.has("devices") && !args.has("worker")) {
    return supervise_workers(args, mine, db_path, args.has("max-candidates") || spec.max_candidates
                                                      ? std::optional<size_t>(max_candidates)
                                                      : std::nullopt);
  }

  if (args.has("dry-run")) {
    if (json) {
      print_json({{"shard", {{"index", shard.index}, {"count", shard.count}, {"source", shard.source}}},
                  {"db", db_path.string()},
                  {"max_candidates", max_candidates < static_cast<size_t>(kIntMax) ? Json(max_candidates) : Json(nullptr)},
                  {"problems", dry_run_entries(args, mine, named, max_candidates)}});
    } else {
      std::cout << format("shard %d of %d%s: %zu of %zu problems into %s\n", shard.index, shard.count,
                          shard.source.empty() ? "" : (" (from " + shard.source + ")").c_str(), mine.size(),
                          spec.problems.size(), db_path.string().c_str());
      for (const TuneProblem& p : mine) std::cout << "  " << problem_line(p) << '\n';
    }
    return 0;
  }

  std::string why;
  if (!driver_available(&why)) fail(Status::kNoDevice, "tune needs a GPU: " + why);
  WorkerState worker;
  for (const std::string& entry : args.values("crashed")) {
    const size_t colon = entry.find(':');
    worker.known_crashes[entry.substr(0, colon)] = colon == std::string::npos ? "crashed a worker" : entry.substr(colon + 1);
  }
  if (args.has("journal")) worker.journal = fs::path(args.string_or("journal", ""));
  ScopedContext context;  // the current context, else device 0's primary context
  TuningStore store(db_path);
  Json results = Json::array();
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine.size() > 1) std::cerr << format("problem %zu/%zu: %s\n", i + 1, mine.size(), problem_line(mine[i]).c_str());
    results.push_back(tune_one(mine[i], store, db_path, max_candidates, args.has("force") || !named.empty(), json,
                                context, worker, named));
  }
  if (worker.journal) std::ofstream(*worker.journal, std::ios::trunc);
  if (json) print_json(args.has("spec") || results.empty() ? results : results.front());
  return 0;
}

// ---------------------------------------------------------------------------------------------------
// Dispatch

struct Subcommand {
  Command command;
  std::function<int(const Args&)> run;
};

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> list = {
      {info_command(), command_info},       {emit_command(), command_emit}, {compile_command(), command_compile},
      {run_command(), command_run},         {demo_command(), command_demo},
      {tune_command(), command_tune},       {db_command(), command_db},
  };
  return list;
}

std::string top_usage() {
  std::string text =
      "usage: flashgen <command> [options]\n\n"
      "flashgen generates flash-attention CUDA kernels from templates and compiles them at run time\n"
      "with NVRTC for the GPU in hand.\n\ncommands:\n";
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"info", "versions, kernel cache and GPUs"},
      {"emit", "print a kernel's generated CUDA source as one translation unit"},
      {"compile", "compile kernels with NVRTC and show registers, shared memory, spills"},
      {"run", "run, check and time one attention problem on the GPU"},
      {"demo", "the main job: run the default problem, or compile the defaults without a GPU"},
      {"tune", "sweep the forward or backward configs of problems on the GPU and store the winners"},
      {"db", "list, show, export, import, merge or prune the tuning database"},
      {"help", "this list; `flashgen help <command>` or `flashgen <command> --help` for one command"},
  };
  for (const auto& row : rows) text += "  " + row.first + std::string(10 - row.first.size(), ' ') + row.second + "\n";
  text += "\nexit status: 0 success, 1 a failed check or compile (or an internal error), 2 a bad argument or an\n"
          "unsupported request, 3 a GPU is needed and none is usable. With --json, errors are printed as\n"
          "{\"error\": ..., \"status\": ...} on standard output.\n";
  return text;
}

const Subcommand* find_subcommand(const std::string& name) {
  for (const Subcommand& sub : subcommands())
    if (sub.command.name() == name) return &sub;
  return nullptr;
}

int dispatch(const std::vector<std::string>& words) {
  if (words.empty() || words[0] == "--help" || words[0] == "-h" || (words[0] == "help" && words.size() == 1)) {
    std::cout << top_usage();
    return 0;
  }
  if (words[0] == "--version") {
    std::cout << "flashgen " << FLASHGEN_VERSION << '\n';
    return 0;
  }
  if (words[0] == "help") {
    if (words.size() > 2) throw UsageError("help takes one command name", top_usage());
    if (words[1] == "--help" || words[1] == "-h") {
      std::cout << top_usage();
      return 0;
    }
    const Subcommand* sub = find_subcommand(words[1]);
    if (!sub) throw UsageError("unknown command '" + words[1] + "'", top_usage());
    std::cout << sub->command.usage();
    return 0;
  }
  const Subcommand* sub = find_subcommand(words[0]);
  if (!sub) {
    const bool is_flag = !words[0].empty() && words[0][0] == '-';
    throw UsageError(std::string(is_flag ? "unknown option '" : "unknown command '") + words[0] + "'", top_usage());
  }
  const std::optional<Args> args = sub->command.parse({words.begin() + 1, words.end()});
  if (!args) {
    std::cout << sub->command.usage();
    return 0;
  }
  return sub->run(*args);
}

int exit_code_for(Status status) {
  switch (status) {
    case Status::kInvalidArgument:
    case Status::kUnsupported: return 2;
    case Status::kNoDevice: return 3;
    default: return 1;
  }
}

// The "status" of a JSON error object: the C ABI's FLASHGEN_ERROR_* name in lower case.
const char* status_name(Status status) {
  switch (status) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid_argument";
    case Status::kUnsupported: return "unsupported";
    case Status::kNoDevice: return "no_device";
    case Status::kCompile: return "compile";
    case Status::kCuda: return "cuda";
    case Status::kInternal: return "internal";
  }
  return "internal";
}

// Whether the command line asks for JSON: --json before any "--" that ends the options.
bool wants_json(const std::vector<std::string>& words) {
  for (const std::string& word : words) {
    if (word == "--") return false;
    if (word == "--json") return true;
  }
  return false;
}

// Reports a failure that reached main and returns the exit code. The message goes to stderr, followed
// by the command's usage for a usage error; with --json, stdout also gets one object
// {"error": message, "status": status_name} for scripts, whatever the command.
int report_failure(bool json, Status status, const std::string& message, const std::string& usage = "") {
  std::cerr << "flashgen: error: " << message << '\n';
  if (!usage.empty()) std::cerr << '\n' << usage;
  if (json) print_json({{"error", message}, {"status", status_name(status)}});
  return exit_code_for(status);
}

}  // namespace
}  // namespace flashgen::cli

int main(int argc, char** argv) {
  using namespace flashgen::cli;
  using flashgen::Status;
  const std::vector<std::string> words(argv + 1, argv + argc);
  const bool json = wants_json(words);
  try {
    const int code = dispatch(words);
    // What the command printed must have reached its reader (a full disk, a closed pipe): else it failed.
    std::cout.flush();
    if (!std::cout) throw flashgen::Error(Status::kInternal, "cannot write to standard output");
    return code;
  } catch (const UsageError& error) {  // exit 2
    return report_failure(json, Status::kInvalidArgument, error.what(), error.usage());
  } catch (const flashgen::Error& error) {
    return report_failure(json, error.status(), error.what());
  } catch (const std::exception& error) {  // exit 1
    return report_failure(json, Status::kInternal, error.what());
  }
}
