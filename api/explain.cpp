// Explain calls: prepare a launch exactly as the forward / backward call would (same checks, same config
// choice, same kernel loading), describe it as JSON, and write the generated source into the kernel cache.
#include "api/explain.hpp"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <system_error>
#include <utility>

#include "flashgen/error.hpp"
#include "runtime/kernel_registry.hpp"

namespace flashgen {

std::filesystem::path write_generated_source(const GeneratedSource& source, const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / (source.kernel_name + ".cu");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(Status::kInternal, "cannot create " + dir.string() + ": " + ec.message());
  // A name of our own for the temporary file: another thread or process may be writing the same source.
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path temporary =
      dir / (source.kernel_name + ".cu.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << source.self_contained();
    out.close();
    if (!out) {
      std::filesystem::remove(temporary, ec);
      fail(Status::kInternal, "cannot write " + temporary.string());
    }
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(temporary, ec);
    fail(Status::kInternal, "cannot rename " + temporary.string() + " to " + path.string() + ": " + why);
  }
  return path;
}

std::filesystem::path generated_source_dir() { return KernelRegistry::instance().disk_cache().dir() / "sources"; }

namespace {

// "source_path", or null and "source_path_error": an unwritable cache folder must not hide the answer.
void add_source_path(nlohmann::json& j, const GeneratedSource& source) {
  try {
    j["source_path"] = write_generated_source(source, generated_source_dir()).string();
  } catch (const std::exception& e) {
    j["source_path"] = nullptr;
    j["source_path_error"] = e.what();
  }
}

nlohmann::json kernel_json(const std::string& symbol, const ResourceUsage& usage) {
  return {{"symbol", symbol},
          {"registers", usage.registers},
          {"spill_store_bytes", usage.spill_store_bytes},
          {"spill_load_bytes", usage.spill_load_bytes},
          {"ptxas_notes", usage.ptxas_notes}};
}

nlohmann::json grid_json(const unsigned (&grid)[3]) { return {grid[0], grid[1], grid[2]}; }

}  // namespace

nlohmann::json explain_forward(const ForwardCall& call, CUstream stream) {
  const ForwardPlan plan = plan_forward(call, stream);
  const ForwardLaunch& launch = plan.launch;
  const PreparedForward& prepared = plan.prepared;
  const std::shared_ptr<const CompiledKernel> compiled =
      KernelRegistry::instance().compiled(launch.config, launch.arch);
  nlohmann::json j = {{"pass", "forward"},
                      {"config", launch.config.name()},
                      {"arch", launch.arch},
                      {"source", choice_source_name(launch.source)},
                      {"reason", launch.reason},
                      {"grid", grid_json(prepared.grid)},
                      {"threads", prepared.threads},
                      {"smem_bytes", prepared.smem_bytes},
                      {"kernels", {kernel_json(launch.config.name(), compiled->usage_of(launch.config.name()))}}};
  add_source_path(j, generate(launch.config));
  return j;
}

nlohmann::json explain_backward(const BackwardCall& call, CUstream stream) {
  const BackwardPlan plan = plan_backward(call, stream);
  const BackwardLaunch& launch = plan.launch;
  const PreparedBackward& prepared = plan.prepared;
  const BwdConfig& config = prepared.config;  // an FP8 call's: the chosen config's _fp8in twin
  const std::shared_ptr<const CompiledKernel> compiled = KernelRegistry::instance().compiled(config, launch.arch);
  auto kernel = [&](BwdKernel which, const unsigned (&grid)[3], unsigned threads, unsigned smem_bytes) {
    nlohmann::json k = kernel_json(config.symbol(which), compiled->usage_of(config.symbol(which)));
    k["grid"] = grid_json(grid);
    k["threads"] = threads;
    k["smem_bytes"] = smem_bytes;
    return k;
  };
  nlohmann::json kernels = {
      kernel(BwdKernel::kPreprocess, prepared.preprocess_grid, kBwdRowKernelThreads, 0),
      kernel(BwdKernel::kDkdv, prepared.dkdv_grid, prepared.dkdv_threads, prepared.dkdv_smem),
      kernel(config.has_dq_kernel() ? BwdKernel::kDq : BwdKernel::kConvert, prepared.finish_grid,
             prepared.finish_threads, prepared.finish_smem)};
  if (call.params.dsinks != nullptr) {  // the call's own: a cached plan of its class may be another call's
    kernels.push_back(kernel(BwdKernel::kSinkGrad, prepared.sink_grad_grid, kBwdRowKernelThreads, 0));
  }
  if (prepared.widen != nullptr) {  // an FP8 call's q, k and v widened first
    kernels.insert(kernels.begin(), kernel(BwdKernel::kWiden, prepared.widen_grid, kBwdRowKernelThreads, 0));
  }
  if (const UserBlockLaunch& classes = prepared.user_blocks) {  // launched first
    kernels.insert(kernels.begin(), {kernel(BwdKernel::kUserBlockTiles, classes.tiles_grid, kUserBlockThreads, 0),
                                     kernel(BwdKernel::kUserBlockRanges, classes.ranges_grid, 32, 0),
                                     kernel(BwdKernel::kUserBlockBands, classes.bands_grid, kUserBlockThreads, 0)});
  }
  nlohmann::json j = {
      {"pass", "backward"},
      {"config", config.name()},
      {"arch", launch.arch},
      {"source", choice_source_name(launch.source)},
      {"reason", launch.reason},
      {"workspace_bytes", prepared.workspace_bytes},
      {"kernels", kernels}};
  add_source_path(j, generate(config));
  return j;
}

}  // namespace flashgen
