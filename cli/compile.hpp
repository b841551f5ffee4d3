// What `flashgen compile` shares with `flashgen demo`, which compiles the default candidates when there
// is no GPU, and with its --spec mode (cli/compile_spec.cpp): compile jobs on a pool of threads, and their table
// and summary.
#pragma once

#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "cli/args.hpp"
#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace flashgen::cli {

// The architectures `compile` and `demo` compile for by default.
inline const std::vector<int> kDefaultArchs = {80, 90};

// A forward kernel, a backward module (reported by its dkdv kernel, the one that holds the tiles) or a
// KV-cache module (reported by its attention kernel).
struct CompileJob {
  std::variant<KernelConfig, BwdConfig, DecodeConfig> config;
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

// Compiles every job on `threads` threads, printing each to stderr as it is done (compiled, with an estimate of
// the time left; cached; or FAILED and why). Outcomes come back in the order of jobs.
std::vector<CompileOutcome> compile_jobs(const std::vector<CompileJob>& jobs, bool use_cache, int threads);

void print_compile_table(const std::vector<CompileOutcome>& outcomes, std::ostream& os);

// The summary after the table (stdout) and one line per failure (stderr). Returns the failure count.
size_t report_compile_summary(const std::vector<CompileOutcome>& outcomes, double wall_ms);

// The default candidates of each arch, in arch order.
std::vector<CompileJob> default_jobs_for(const std::vector<int>& archs);

// `flashgen compile --spec`: a sweep's compile phase into the kernel cache (the command's help says what it does).
int command_compile_spec(const Args& args);

}  // namespace flashgen::cli
