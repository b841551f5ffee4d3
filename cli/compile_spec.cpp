// `flashgen compile --spec`: a sweep's compile phase. Compiles, on any machine, every kernel `flashgen tune --spec`
// would compile on a GPU of the named arch into the kernel cache that tune then reads; sharded as tune shards, and
// resumable: a kernel already in the cache is read back, not compiled again.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cli/args.hpp"
#include "cli/common.hpp"
#include "cli/compile.hpp"
#include "cli/table.hpp"
#include "cli/tune.hpp"
#include "cli/user_variant.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/kernel_registry.hpp"
#include "tuner/tune.hpp"
#include "tuner/tune_modules.hpp"

namespace flashgen::cli {
namespace {

// One problem of the shard: its plan on the arch and the modules tune compiles for it, or why it cannot be planned
// (a tune of it would stop there too).
struct PlannedProblem {
  AttentionProblem problem;
  TunePlan plan;
  std::vector<KernelModule> modules;
  std::string error;
};

// Plans every problem on `threads` threads, printing each as it is planned. plan_tune compiles the built-in choices
// it weighs through the kernel cache, as tune's plan does, so they land in the cache too.
std::vector<PlannedProblem> plan_problems(const std::vector<AttentionProblem>& problems, int arch,
                                          const TuneOptions& options, int threads) {
  std::vector<PlannedProblem> planned(problems.size());
  std::atomic<size_t> next{0};
  std::mutex log_mutex;
  size_t done = 0;  // under log_mutex
  auto worker = [&] {
    for (size_t i = next++; i < problems.size(); i = next++) {
      PlannedProblem& p = planned[i];
      p.problem = problems[i];
      try {
        p.plan = plan_tune(p.problem, arch, options);
        p.modules = tune_modules(p.problem, p.plan, arch);
        for (KernelModule& m : shipped_incumbent_modules(p.problem, p.plan, arch, ShippedDefaults::instance()))
          p.modules.push_back(std::move(m));
      } catch (const std::exception& error) {  // reported with the problem; the others go on
        p.error = error.what();
      }
      std::lock_guard<std::mutex> lock(log_mutex);
      std::cerr << format("problem %zu/%zu: ", ++done, problems.size()) << problem_line(p.problem) << ": "
                << (p.error.empty() ? format("%zu candidates, %zu kernels", p.plan.candidates.size(), p.modules.size())
                                    : "FAILED: " + first_line(p.error))
                << '\n';
    }
  };
  const size_t thread_count = std::clamp<size_t>(static_cast<size_t>(threads), 1, std::max<size_t>(problems.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < thread_count; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
  return planned;
}

// The kernel cache's directory, made and checked writable: a compile phase whose kernels cannot be stored would
// compile them for nothing, where any other command would just run uncached.
fs::path writable_cache_dir() {
  const fs::path dir = KernelRegistry::instance().disk_cache().dir();
  std::error_code error;
  fs::create_directories(dir, error);
  if (error || ::access(dir.c_str(), W_OK | X_OK) != 0) {
    fail(Status::kInvalidArgument, "the kernel cache " + dir.string() + " cannot be written" +
                                       (error ? ": " + error.message() : std::string()) +
                                       " (--cache-dir or FLASHGEN_CACHE_DIR names it)");
  }
  return dir;
}

// Whether the module's entry, under the key tune will look up, is whole in the disk cache: what the phase is for.
bool stored_whole(const KernelModule& module, int arch) {
  const GeneratedSource source = std::visit([](const auto& config) { return generate(config); }, module);
  return KernelRegistry::instance().disk_cache().load(kernel_cache_key(source, arch)).has_value();
}

}  // namespace

int command_compile_spec(const Args& args) {
  constexpr long long kIntMax = std::numeric_limits<int>::max();
  if (!args.positionals.empty()) throw UsageError("--spec compiles a spec's candidates: name no configs", args.usage());
  for (const char* other : {"all-defaults", "no-cache", "cubin-dir", "sass"}) {
    if (args.has(other))
      throw UsageError(std::string("--spec fills the kernel cache; it does not go with --") + other, args.usage());
  }
  const std::vector<int> archs = parse_archs(args, {90});
  if (archs.size() != 1) {
    throw UsageError("--spec compiles for one --arch, the GPUs that will tune the spec (run once per arch)",
                     args.usage());
  }
  const int arch = archs.front();
  const int threads = static_cast<int>(args.int_or("jobs", default_jobs(), 1, 1024));
  const std::string spec_path = args.string_or("spec", "");
  TuneSpec spec = read_tune_spec(spec_path, problem_from_flags(Args()));  // omitted fields: tune's flag defaults
  size_t max_candidates = spec.max_candidates.value_or(static_cast<size_t>(kIntMax));
  if (args.has("max-candidates")) max_candidates = static_cast<size_t>(args.int_or("max-candidates", kIntMax, 1, kIntMax));
  attach_variant_to(spec.problems, variant_of(args), args);
  const Shard shard = shard_of(args);
  std::vector<AttentionProblem> mine;
  for (size_t i = static_cast<size_t>(shard.index); i < spec.problems.size(); i += static_cast<size_t>(shard.count))
    mine.push_back(spec.problems[i]);
  const fs::path cache_dir = writable_cache_dir();
  TuneOptions options;
  options.max_candidates = max_candidates;
  options.multiprocessors = static_cast<int>(args.int_or("sms", 132, 1, 1 << 16));

  const std::string target = arch_label(arch);
  std::cerr << format("compile phase: %zu of %zu problems", mine.size(), spec.problems.size())
            << (shard.count > 1 ? format(" (shard %d of %d, from %s)", shard.index, shard.count, shard.source.c_str())
                                : std::string())
            << " for " << target << " into " << cache_dir.string() << '\n';
  const Clock::time_point start = Clock::now();
  const std::vector<PlannedProblem> planned = plan_problems(mine, arch, options, threads);

  // Each module once, in the order the problems first name it: problems of one class share their candidates.
  std::vector<CompileJob> jobs;
  std::map<std::string, size_t> job_of;
  for (const PlannedProblem& p : planned) {
    for (const KernelModule& module : p.modules) {
      const CompileJob job{module, arch};
      if (job_of.emplace(job.name(), jobs.size()).second) jobs.push_back(job);
    }
  }
  std::vector<CompileOutcome> outcomes = compile_jobs(jobs, /*use_cache=*/true, threads);
  for (size_t i = 0; i < jobs.size(); ++i) {
    CompileOutcome& o = outcomes[i];
    if (o.ok && !stored_whole(jobs[i].config, arch)) {
      o.ok = false;
      o.error = "compiled, but its entry is not whole in " + cache_dir.string() + " (a full or read-only disk?)";
      std::cerr << "FAILED " << o.name << " for " << target << ": " << o.error << '\n';
    }
  }
  const double seconds = ms_since(start) / 1000;

  size_t compiled = 0, cached = 0, failed = 0;
  Json kernels = Json::array();
  for (const CompileOutcome& o : outcomes) {
    const char* status = !o.ok ? "failed" : o.cached ? "cached" : "compiled";
    compiled += o.ok && !o.cached;
    cached += o.ok && o.cached;
    failed += !o.ok;
    Json k = {{"name", o.name}, {"status", status}};
    if (o.ok && !o.cached) k["compile_ms"] = o.compile_ms;
    if (!o.ok) k["error"] = o.error;
    kernels.push_back(std::move(k));
  }
  Json problems = Json::array();
  for (const PlannedProblem& p : planned) {
    Json entry = problem_json(p.problem);
    if (!p.error.empty()) {
      entry["error"] = p.error;
      ++failed;
    } else {
      Json candidates = Json::array(), names = Json::array();
      for (const TunedConfig& c : p.plan.candidates) candidates.push_back(flashgen::config_name(c));
      for (const KernelModule& m : p.modules) names.push_back(std::visit([](const auto& c) { return c.name(); }, m));
      entry["candidates"] = candidates;
      entry["kernels"] = names;
    }
    problems.push_back(std::move(entry));
  }

  if (args.has("json")) {
    print_json({{"spec", spec_path},
                {"arch", arch},
                {"target", target},
                {"cache_dir", cache_dir.string()},
                {"shard", {{"index", shard.index}, {"count", shard.count}, {"source", shard.source}}},
                {"max_candidates", max_candidates < static_cast<size_t>(kIntMax) ? Json(max_candidates) : Json(nullptr)},
                {"problems", problems},
                {"kernels", kernels},
                {"compiled", compiled},
                {"cached", cached},
                {"failed", failed},
                {"seconds", seconds}});
  } else {
    std::cout << format("%zu kernels of %zu problems for %s: %zu compiled, %zu already cached, %zu failed, in %.1f s\n",
                        jobs.size(), planned.size(), target.c_str(), compiled, cached, failed, seconds)
              << "cache: " << cache_dir.string() << '\n';
    if (failed) {
      std::cerr << "\nfailed:\n";
      for (const PlannedProblem& p : planned)
        if (!p.error.empty()) std::cerr << "  " << problem_line(p.problem) << ": " << first_line(p.error) << '\n';
      for (const CompileOutcome& o : outcomes)
        if (!o.ok) std::cerr << "  " << o.name << ": " << first_line(o.error) << '\n';
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace flashgen::cli
