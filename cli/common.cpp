// The helpers that several commands of the flashgen tool share (declared and described in cli/common.hpp):
// JSON output, files, --arch, mask and pass names, config names and the tuning database's --db.
#include "cli/common.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include <dlfcn.h>
#include <nvrtc.h>
#include <sched.h>
#include <unistd.h>

#include "flashgen/error.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen::cli {
namespace {

// The kernel family needs sm_80 or newer (mma.sync m16n8k16 bf16, cp.async).
constexpr int kMinArch = 80;

}  // namespace

std::string json_text(const Json& j, int indent) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}
void print_json(const Json& j) { std::cout << json_text(j) << '\n'; }

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string arch_label(int arch) {
  const std::string flag = arch_flag(arch);
  const std::string prefix = "-arch=";
  return flag.rfind(prefix, 0) == 0 ? flag.substr(prefix.size()) : flag;
}

void reject_directory(const fs::path& path, const std::string& what) {
  std::error_code error;
  if (fs::is_directory(path, error)) fail(Status::kInvalidArgument, what + " '" + path.string() + "' is a directory");
}

std::ifstream open_input(const std::string& path, const std::string& what) {
  reject_directory(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::kInvalidArgument, "cannot read " + what + " '" + path + "': " + std::strerror(errno));
  return in;
}

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
    // A path that cannot be written (no such folder, no permission) is a bad argument; a write that fails on the
    // way (a full disk, an I/O error) is a failure of the command.
    const int cause = errno;
    const bool bad_path = cause == ENOENT || cause == ENOTDIR || cause == EACCES || cause == EPERM ||
                          cause == EROFS || cause == EISDIR || cause == ENAMETOOLONG;
    if (!in_place) fs::remove(target, error);
    fail(bad_path ? Status::kInvalidArgument : Status::kInternal, "cannot write '" + path + "': " + std::strerror(cause));
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

Json read_json_file(const std::string& path, const std::string& what) {
  try {
    if (path == "-") return Json::parse(std::cin);
    std::ifstream in = open_input(path, what);
    return Json::parse(in);
  } catch (const Json::exception& error) {
    fail(Status::kInvalidArgument, what + " '" + path + "' is not JSON: " + error.what());
  }
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

int default_jobs() {
  // The cores this process may run on (a Slurm task's, or taskset's), which can be fewer than the machine's.
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0) return CPU_COUNT(&allowed);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// libflashgen links libnvrtc privately, so the CLI cannot link NVRTC's calls; the library that is already
// loaded is asked through dlsym instead.
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

namespace {

// Whether --arch may name sm_<arch>. When NVRTC cannot list its targets any arch >= kMinArch passes, and
// a kernel for an arch NVRTC lacks fails on its own, reported like any other failed compile.
bool arch_accepted(int arch) {
  const std::optional<std::vector<int>>& archs = nvrtc_archs();
  if (!archs) return arch >= kMinArch;
  return std::find(archs->begin(), archs->end(), arch) != archs->end();
}

}  // namespace

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

std::string arch_help() { return "SM: an sm number NVRTC " + nvrtc_version() + " targets: " + accepted_archs_text(); }

std::vector<int> parse_archs(const Args& args, const std::vector<int>& fallback) {
  std::vector<int> archs;
  for (const std::string& value : args.values("arch")) {
    std::stringstream list(value);
    std::string item;
    while (std::getline(list, item, ',')) {
      // "90", or its target's name as NVRTC spells it ("sm_90a", "sm_80"; "sm_90" too).
      const bool named = item.rfind("sm_", 0) == 0;
      std::string number = named ? item.substr(3) : item;
      if (named && !number.empty() && std::isalpha(static_cast<unsigned char>(number.back()))) number.pop_back();
      const int arch = static_cast<int>(args.parse_int("arch", number, 0, 1000));
      if (named && item != "sm_" + number && item != arch_label(arch))
        throw UsageError("--arch expects one of " + accepted_archs_text() + ", got " + item, args.usage());
      if (!arch_accepted(arch))
        throw UsageError("--arch expects one of " + accepted_archs_text() + ", got " + item, args.usage());
      if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
    }
  }
  return archs.empty() ? fallback : archs;
}

std::string causal_text(Mask mask) {
  switch (mask) {
    case Mask::kCausal: return "bottom-right";
    case Mask::kCausalTopLeft: return "top-left";
    case Mask::kSlidingWindow: return "window";
    default: return "none";
  }
}

Mask mask_from_text(const std::string& text) {
  return text == "bottom-right" ? Mask::kCausal : text == "top-left" ? Mask::kCausalTopLeft
                                                                           : Mask::kNone;
}

std::string mask_description(const AttentionProblem& problem) {
  if (!problem.windowed()) return causal_text(problem.mask);
  return "window (" + std::to_string(problem.window_left) + ", " + std::to_string(problem.window_right) + ")" +
         (problem.attention_chunk > 0 ? " in chunks of " + std::to_string(problem.attention_chunk) : "");
}

void mask_from_flags(const Args& args, AttentionProblem& problem) {
  const Mask causal = mask_from_text(args.choice_or("causal", "none", {"none", "bottom-right", "top-left"}));
  const int chunk = static_cast<int>(args.int_or("chunk", 0, 1, INT32_MAX));
  if (chunk > 0 && causal == Mask::kCausalTopLeft) {
    throw UsageError("--chunk is aligned bottom-right (Llama 4's attention_chunk): it takes --causal bottom-right or "
                     "none, not top-left",
                     args.usage());
  }
  if (!args.has("window")) {
    problem.set_mask(causal, -1, -1, chunk);
    return;
  }
  const std::string text = args.string_or("window", "");
  const size_t comma = text.find(',');
  if (comma == std::string::npos) {
    throw UsageError("--window expects L,R (keys before and after the diagonal, -1: no bound), got '" + text + "'",
                     args.usage());
  }
  const int left = static_cast<int>(args.parse_int("window", text.substr(0, comma), -1, INT32_MAX));
  int right = static_cast<int>(args.parse_int("window", text.substr(comma + 1), -1, INT32_MAX));
  if (causal == Mask::kCausalTopLeft) {
    throw UsageError("--window is aligned bottom-right (FlashAttention's window_size): it takes --causal bottom-right "
                     "or none, not top-left",
                     args.usage());
  }
  if (causal == Mask::kCausal) right = 0;  // FlashAttention's causal window
  problem.set_mask(Mask::kSlidingWindow, left, right, chunk);
}

const char* pass_text(const AttentionProblem& problem) {
  if (problem.kv_cache) return problem.paged ? "forward against a paged KV cache" : "forward against a KV cache";
  if (problem.varlen) {
    return !problem.backward()         ? "forward of a packed batch"
           : problem.deterministic() ? "backward (deterministic) of a packed batch"
                                     : "backward of a packed batch";
  }
  return !problem.backward() ? "forward" : problem.deterministic() ? "backward (deterministic)" : "backward";
}

void packed_from_flags(const Args& args, AttentionProblem& problem) {
  for (const char* name : {"total-q", "total-k"}) {
    if (args.has(name) && !args.has("varlen")) fail(Status::kInvalidArgument, std::string("--") + name + " needs --varlen");
  }
  if (!args.has("varlen")) return;
  if (problem.kv_cache) fail(Status::kInvalidArgument, "--varlen and --kv-cache are different problems: pick one");
  auto total = [&](const char* name) {
    return args.has(name) ? std::optional<int64_t>(args.int_or(name, 1, 1, INT32_MAX)) : std::nullopt;
  };
  make_packed(problem, total("total-q"), total("total-k"), "--total-q", "--total-k");
}

void cache_dtype_from_flags(const Args& args, AttentionProblem& problem) {
  if (!args.has("cache-dtype")) return;
  if (!problem.kv_cache) fail(Status::kInvalidArgument, "--cache-dtype needs --kv-cache (an FP8 cache is a KV cache's)");
  problem.cache_dtype = parse_cache_dtype(args.choice_or("cache-dtype", "e4m3", {"e4m3", "e5m2"}), "--cache-dtype");
}

void make_packed(AttentionProblem& problem, std::optional<int64_t> total_q, std::optional<int64_t> total_k,
                 const std::string& what_q, const std::string& what_k) {
  const AttentionShape& s = problem.shape;
  auto total_of = [&](std::optional<int64_t> given, int64_t longest, const std::string& what) {
    const int64_t most = s.batch * longest;
    if (!given) return std::clamp<int64_t>(s.batch * (longest + std::max<int64_t>(1, longest / 64)) / 2, longest, most);
    if (*given < longest || *given > most) {
      fail(Status::kInvalidArgument, what + " must be between the longest sequence (" + std::to_string(longest) +
                                         ") and batch * that (" + std::to_string(most) + "), got " +
                                         std::to_string(*given));
    }
    return *given;
  };
  problem.varlen = true;
  problem.total_q = total_of(total_q, s.seqlen_q, what_q);
  problem.total_k = total_of(total_k, s.seqlen_k, what_k);
  FLASHGEN_REQUIRE(problem.total_q <= INT32_MAX && problem.total_k <= INT32_MAX,
                   "a packed batch holds at most 2^31 - 1 rows (int32 offsets)");
}

AnyConfig config_from_name(const std::string& name) {
  if (name.rfind("bwd_", 0) == 0) return BwdConfig::from_name(name);
  if (name.rfind("dec_", 0) == 0) return DecodeConfig::from_name(name);
  return KernelConfig::from_name(name);
}

fs::path db_path_of(const Args& args) {
  std::string path = TuningStore::default_path().string();
  // What named the path, for the messages: the flag, the environment or the default.
  std::string source = env("FLASHGEN_TUNING_DB") ? "FLASHGEN_TUNING_DB" : "the default database";
  if (args.has("db")) {
    path = args.string_or("db", "");
    source = "--db";
    if (path.empty() || path.back() == '/') throw UsageError("--db needs a file path, got '" + path + "'", args.usage());
  }
  reject_directory(path, source);
  std::error_code error;
  if (fs::exists(path, error) && !fs::is_regular_file(path, error))
    fail(Status::kInvalidArgument, source + " '" + path + "' is not a regular file (a database is one SQLite file)");
  return path;
}

Json choice_json(const StoredChoice& choice) {
  return {{"device", choice.device.id()},
          {"problem", choice.problem.id()},
          {"config", flashgen::config_name(choice.config)},
          {"median_ms", choice.median_ms}};
}

}  // namespace flashgen::cli
