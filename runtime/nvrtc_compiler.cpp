// NVRTC stage: compiles a GeneratedSource (in-memory headers, no toolkit includes) to a cubin for one
// sm arch, keeps the NVRTC + ptxas log and the resource usage ptxas reported, dumps failing sources.
#include "runtime/nvrtc_compiler.hpp"

#include <nvrtc.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "flashgen/error.hpp"
#include "runtime/kernel_cache.hpp"

// Throws Error(kCompile) with file:line, the call and NVRTC's own text when an NVRTC call fails.
#define FLASHGEN_NVRTC_CHECK(call_expr)                                                          \
  do {                                                                                           \
    nvrtcResult flashgen_nvrtc_result_ = (call_expr);                                            \
    if (flashgen_nvrtc_result_ != NVRTC_SUCCESS)                                                 \
      ::flashgen::fail(::flashgen::Status::kCompile,                                             \
                       std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call_expr \
                       " failed: " + nvrtcGetErrorString(flashgen_nvrtc_result_));               \
  } while (0)

namespace flashgen {
namespace {

// Destroys the program on every path out of compile_nvrtc.
class ProgramGuard {
 public:
  explicit ProgramGuard(nvrtcProgram program) : program_(program) {}
  ~ProgramGuard() { nvrtcDestroyProgram(&program_); }
  ProgramGuard(const ProgramGuard&) = delete;
  ProgramGuard& operator=(const ProgramGuard&) = delete;

 private:
  nvrtcProgram program_;
};

std::string program_log(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();  // size counts the NUL
  return log;
}

// Writes the whole failing source where a person can compile it by hand; returns the path, or why not.
std::string dump_failed_source(const GeneratedSource& source) {
  try {
    std::filesystem::path dir = KernelCache::default_dir() / "failed";
    std::filesystem::create_directories(dir);
    std::filesystem::path path = dir / (source.kernel_name + ".cu");
    std::string text;
    try {
      text = source.self_contained();
    } catch (const std::exception&) {
      // A source the generator cannot inline (hand-written, or broken includes): keep every piece.
      for (const SourceFile& header : source.headers)
        text += "// ---- header " + header.name + "\n" + header.contents + "\n";
      text += "// ---- " + source.kernel_name + ".cu\n" + source.translation_unit;
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return "(not dumped: writing " + path.string() + " failed)";
    return path.string();
  } catch (const std::exception& e) {
    return std::string("(not dumped: ") + e.what() + ")";
  }
}

// The integer that ends right before `suffix` in line ("168" for " registers" in "Used 168 registers").
bool number_before(const std::string& line, const std::string& suffix, int* value) {
  size_t end = line.find(suffix);
  if (end == std::string::npos) return false;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
  if (begin == end) return false;
  *value = std::atoi(line.substr(begin, end - begin).c_str());
  return true;
}

// The text between the first pair of single quotes, or after `marker` to the end of the line.
std::string name_after(const std::string& line, const std::string& marker) {
  size_t at = line.find(marker);
  if (at == std::string::npos) return {};
  std::string rest = line.substr(at + marker.size());
  size_t quote = rest.find('\'');
  if (quote != std::string::npos) {
    size_t close = rest.find('\'', quote + 1);
    return rest.substr(quote + 1, close == std::string::npos ? std::string::npos : close - quote - 1);
  }
  size_t first = rest.find_first_not_of(" \t");
  size_t last = rest.find_last_not_of(" \t\r");
  return first == std::string::npos ? std::string() : rest.substr(first, last - first + 1);
}

// ptxas's warnings and performance-loss notes about `entry` ("ptxas info    : (C7520) Potential Performance Loss:
// ... in the function 'k'", "ptxas warning : ..."), without their prefix: those that name it in quotes or name no
// function (every one when entry is empty). NVRTC 13 prints them before the entry functions' blocks. Other coded
// notes are not kept: C7519 (an arrive injected before a wgmma reads registers) accompanies a serialization but is
// also printed for kernels whose wgmma run as written.
std::vector<std::string> ptxas_notes(const std::string& log, const std::string& entry) {
  std::vector<std::string> notes;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(": ");
    if (line.rfind("ptxas", 0) != 0 || colon == std::string::npos) continue;
    std::string text = line.substr(colon + 2);
    const bool warning = line.substr(0, colon).find("warning") != std::string::npos;
    const bool loss = text.find("Performance Loss") != std::string::npos;
    if (!warning && !loss) continue;
    while (!text.empty() && (text.back() == '\r' || text.back() == ' ')) text.pop_back();
    const bool names_a_function = text.find("function '") != std::string::npos;
    if (!entry.empty() && names_a_function && text.find("'" + entry + "'") == std::string::npos) continue;
    notes.push_back(text);
  }
  return notes;
}

}  // namespace

std::string arch_flag(int arch) {
  // Hopper and Blackwell's arch-specific instructions (wgmma, setmaxnreg, tcgen05) need the a-suffix.
  if (arch == 90 || arch == 100) return "-arch=sm_" + std::to_string(arch) + "a";
  return "-arch=sm_" + std::to_string(arch);
}

std::vector<std::string> nvrtc_options(int arch) {
  // No --use_fast_math: numerics stay IEEE except where a template asks for a PTX approximation itself.
  // No -lineinfo by default: it grows every cached cubin; FLASHGEN_NVRTC_LINEINFO=1 adds it, so that
  // compute-sanitizer and nvdisasm -g name source lines (it leaves the SASS as it is). The options are part
  // of the kernel cache key, so such cubins never mix with the plain ones.
  // No include paths: templates include only each other (in-memory headers), never toolkit headers.
  std::vector<std::string> options{arch_flag(arch), "--std=c++17", "-default-device", "--ptxas-options=-v",
                                   "-DFLASHGEN_NVRTC=1"};
  if (const char* lineinfo = std::getenv("FLASHGEN_NVRTC_LINEINFO");
      lineinfo != nullptr && *lineinfo != '\0' && std::string(lineinfo) != "0")
    options.push_back("-lineinfo");
  return options;
}

std::string nvrtc_version() {
  int major = 0;
  int minor = 0;
  FLASHGEN_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  return std::to_string(major) + "." + std::to_string(minor);
}

ResourceUsage parse_ptxas_log(const std::string& log, const std::string& entry_name) {
  // ptxas -v as NVRTC 13 prints it (per entry function, after "Compiling entry function 'k' for 'sm_80'"):
  //   ptxas info    : Function properties for k
  //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  //   ptxas info    : Used 48 registers, used 1 barriers, 256 bytes smem, 364 bytes cmem[0]
  // Older toolkits: "Used 168 registers, 400 bytes cmem[0], 16 bytes smem". Non-inlined device
  // functions get their own "Function properties" block, which is not the kernel's and is skipped.
  ResourceUsage usage;
  std::string first_entry;  // the first kernel the log names, which an empty entry_name asks for
  std::string entry;        // the kernel being compiled, once a "Compiling entry function" line named it
  std::string properties;   // the function the current "Function properties" block describes
  bool skipping = false;    // inside another entry function's block
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("Compiling entry function") != std::string::npos) {
      if (usage.registers >= 0) break;  // the wanted kernel is complete; the next one is not ours
      entry = name_after(line, "Compiling entry function");
      if (first_entry.empty()) first_entry = entry;
      skipping = !entry_name.empty() && entry != entry_name;
      continue;
    }
    if (skipping) continue;
    if (line.find("Function properties for") != std::string::npos) {
      properties = name_after(line, "Function properties for");
      continue;
    }
    if (line.find("bytes stack frame") != std::string::npos) {
      if (!entry.empty() && properties != entry) continue;
      number_before(line, " bytes stack frame", &usage.stack_bytes);
      number_before(line, " bytes spill stores", &usage.spill_store_bytes);
      number_before(line, " bytes spill loads", &usage.spill_load_bytes);
      continue;
    }
    int registers = 0;
    if (usage.registers < 0 && number_before(line, " registers", &registers) &&
        line.find("Used ") != std::string::npos) {
      usage.registers = registers;
      number_before(line, " bytes smem", &usage.static_smem_bytes);
      if (entry.empty()) break;  // no entry-function markers: the first "Used" line is the kernel's
    }
  }
  usage.ptxas_notes = ptxas_notes(log, entry_name.empty() ? first_entry : entry_name);
  return usage;
}

ResourceUsage CompiledKernel::usage_of(const std::string& symbol) const { return parse_ptxas_log(log, symbol); }

std::vector<std::string> CompiledKernel::ptxas_notes() const { return flashgen::ptxas_notes(log, ""); }

CompiledKernel compile_nvrtc(const GeneratedSource& source, int arch) {
  CompiledKernel kernel;
  kernel.kernel_name = source.kernel_name;
  kernel.arch = arch;
  kernel.options = nvrtc_options(arch);

  std::vector<const char*> header_names;
  std::vector<const char*> header_contents;
  for (const SourceFile& header : source.headers) {
    header_names.push_back(header.name.c_str());
    header_contents.push_back(header.contents.c_str());
  }
  std::vector<const char*> options;
  for (const std::string& option : kernel.options) options.push_back(option.c_str());
  const std::string unit_name = source.kernel_name + ".cu";

  auto start = std::chrono::steady_clock::now();
  nvrtcProgram program = nullptr;
  FLASHGEN_NVRTC_CHECK(nvrtcCreateProgram(&program, source.translation_unit.c_str(), unit_name.c_str(),
                                          static_cast<int>(header_names.size()), header_contents.data(),
                                          header_names.data()));
  ProgramGuard guard(program);

  nvrtcResult result = nvrtcCompileProgram(program, static_cast<int>(options.size()), options.data());
  kernel.log = program_log(program);
  if (result != NVRTC_SUCCESS) {
    std::string dumped = dump_failed_source(source);
    fail(Status::kCompile, "NVRTC failed to compile " + source.kernel_name + " for " + arch_flag(arch) +
                               " (" + nvrtcGetErrorString(result) + "):\n" + kernel.log +
                               "\nsource: " + dumped);
  }

  size_t cubin_size = 0;
  FLASHGEN_NVRTC_CHECK(nvrtcGetCUBINSize(program, &cubin_size));
  kernel.cubin.resize(cubin_size);
  FLASHGEN_NVRTC_CHECK(nvrtcGetCUBIN(program, kernel.cubin.data()));
  kernel.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  kernel.usage = parse_ptxas_log(kernel.log);
  return kernel;
}

}  // namespace flashgen
