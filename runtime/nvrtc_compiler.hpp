// NVRTC stage: GeneratedSource -> CompiledKernel (cubin, log, options, resource usage). Needs no GPU:
// any target architecture compiles on any machine with libnvrtc.
#pragma once

#include <string>
#include <vector>

#include "generator/generator.hpp"

namespace flashgen {

// What ptxas reported for the kernel (--ptxas-options=-v).
struct ResourceUsage {
  int registers = -1;
  int static_smem_bytes = 0;
  int stack_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  // ptxas's warnings and performance-loss notes about the kernel, as it words them without the "ptxas info : "
  // prefix, e.g. "(C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized ...": each says
  // the kernel runs slower than its source was written to (a kernel compiled as intended has none).
  std::vector<std::string> ptxas_notes;
};

struct CompiledKernel {
  std::string kernel_name;
  int arch = 0;                      // sm number the cubin targets (90 means sm_90a)
  std::string cubin;                 // raw bytes
  std::string log;                   // NVRTC + ptxas log
  std::vector<std::string> options;  // NVRTC options used
  ResourceUsage usage;               // of the first entry function (the only one of a forward module)
  double compile_ms = 0;             // 0 when it came from a cache
  bool from_cache = false;

  // ptxas's report for one entry function of a module holding several (backward).
  ResourceUsage usage_of(const std::string& symbol) const;
  // ptxas's notes about every entry function of the module (ResourceUsage::ptxas_notes): none for a module
  // compiled as intended.
  std::vector<std::string> ptxas_notes() const;
};

// "-arch=sm_90a" on Hopper (wgmma/setmaxnreg need the a-suffix), "-arch=sm_<arch>" otherwise.
std::string arch_flag(int arch);

// Every option passed to NVRTC for this arch (deterministic order; part of the cache key).
std::vector<std::string> nvrtc_options(int arch);

// "13.0"
std::string nvrtc_version();

// Parses registers, shared memory, stack, spill bytes and notes out of a ptxas -v log: for the entry function
// named entry_name, or the first one when entry_name is empty (default-constructed usage when absent). A note
// belongs to the entry function it names, and to every one when it names none.
ResourceUsage parse_ptxas_log(const std::string& log, const std::string& entry_name = "");

// Compiles with NVRTC. On failure throws Error(kCompile) whose message holds the log and the path
// where the full source was dumped ($FLASHGEN_CACHE_DIR/failed/<kernel>.cu).
CompiledKernel compile_nvrtc(const GeneratedSource& source, int arch);

}  // namespace flashgen
