// `flashgen compile`: compiles kernels with NVRTC on a pool of threads (through the caches unless
// --no-cache) and reports each one's registers, shared memory, spills and stack; optionally cubins and SASS.
#include "cli/compile.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/table.hpp"
#include "cli/user_variant.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/sass.hpp"
#include "tuner/heuristic.hpp"

namespace flashgen::cli {

Command compile_command() {
  return Command("compile",
                 "Compiles kernels with NVRTC (through the on-disk cache unless --no-cache) and prints\n"
                 "registers, shared memory, spills, stack, ptxas's notes and compile time. Needs no GPU. A note (a\n"
                 "ptxas warning or performance loss, e.g. C7520: wgmma serialized) means the kernel runs slower\n"
                 "than its source was written to; each is printed whole after the table. With --cubin-dir it\n"
                 "also writes each kernel's cubin; with --sass it prints each kernel's SASS (cuobjdump).\n"
                 "\n"
                 "With --spec, a sweep's compile phase: compiles every kernel `flashgen tune --spec FILE` would\n"
                 "compile on a GPU of --arch (each problem's candidates as tune plans them, the built-in choices the\n"
                 "plan weighs, a backward's forward, and the shipped defaults' winners of the problem's class on GPUs\n"
                 "of the arch: the incumbents tune sweeps too) into the kernel cache, so that a tune on GPU nodes\n"
                 "reading the same cache compiles nothing. Kernels already cached are read, not compiled again: a task killed\n"
                 "and run again redoes nothing finished. Tasks share the spec's problems as tune's do (--shard,\n"
                 "else SLURM_PROCID/SLURM_NTASKS, within a job array SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT,\n"
                 "else Open MPI's rank and size). The cache may be on a shared filesystem (NFS): entries are\n"
                 "checksummed, written whole and renamed into place, and file locks are used only where they work.\n"
                 "A kernel that fails to compile or to be stored makes the exit status 1.\n"
                 "  sbatch --array=0-15 --wrap 'flashgen compile --spec sweep.json --arch sm_90a --cache-dir /shared/k'\n"
                 "  then, on GPU nodes: FLASHGEN_CACHE_DIR=/shared/k flashgen tune --spec sweep.json\n"
                 "A failed or killed array task is rerun with `scontrol requeue JOBID_INDEX`, which keeps its shard;\n"
                 "a job after the rerun depends on the tasks by id (afterok:JOBID_0:JOBID_1:...), as Slurm holds\n"
                 "afterok on the whole array failed once a task was.",
                 "[<config-name>...] [--all-defaults] [--variant FILE] [--arch SM]... [--json] [--no-cache]\n"
                 "       [--jobs N] [--cubin-dir DIR] [--sass] [--cache-dir DIR]\n"
                 "   or: flashgen compile --spec FILE [--arch SM] [--shard I/N] [--max-candidates N] [--sms N]\n"
                 "       [--variant FILE] [--jobs N] [--cache-dir DIR] [--json]",
                 -1,
                 "<config-name>: canonical config names, e.g. fwd_sm80_fp16_d128_m128_n32_w4_s3, or backward modules\n"
                 "               such as bwd_sm90_fp16_d128_m64_n128_s2 (reported by their dkdv kernel), or KV-cache\n"
                 "               modules such as dec_sm80_bf16_d128_r16_n64_w4_s3_causal (their attention kernel)\n" +
                     arch_help() + " (or its target's name, e.g. sm_90a)")
      .option("arch", "SM", "target sm_<SM> (default 80 and 90; 90 only for sm90-family configs; with --spec one "
                            "arch, that of the GPUs that will tune, default 90)", true)
      .flag("all-defaults", "add the heuristic's first forward choices of each arch (a few dozen kernels per arch; "
                            "`flashgen tune --dry-run --json --arch SM` lists every candidate of a problem)")
      .option("variant", "FILE", kVariantHelp)
      .flag("no-cache", "compile with NVRTC directly, bypassing the memory and disk caches")
      .option("jobs", "N", "compile N kernels at a time (default: the cores this process may use)", false, 'j')
      .option("cubin-dir", "DIR", "write each kernel's cubin to DIR/<config>.<target>.cubin (DIR is created)")
      .flag("sass", "print each kernel's SASS after the table (JSON: a \"sass\" field); needs cuobjdump")
      .option("cache-dir", "DIR", "the kernel cache to fill and read (default: FLASHGEN_CACHE_DIR, else "
                                  "$XDG_CACHE_HOME/flashgen or ~/.cache/flashgen); tune reads FLASHGEN_CACHE_DIR")
      .option("spec", "FILE", "compile what `flashgen tune --spec FILE` would on a GPU of --arch (tune's spec format: "
                              "`flashgen tune --help`; omitted fields take tune's flag defaults)")
      .option("shard", "I/N", "with --spec: only problems I, I+N, ... (default: the Slurm or Open MPI task's, as tune's)")
      .option("max-candidates", "N", "with --spec: as tune's --max-candidates, in place of the spec's max_candidates")
      .option("sms", "N", "with --spec: the SMs KV-cache problems' split counts are planned for, as the tuning GPU "
                          "has (default 132, an H100 or H200)")
      .flag("json", "print a JSON array instead of the table; with --spec one object: each problem's candidates and "
                    "kernels, each kernel's status (compiled, cached or failed), the counts and the seconds taken");
}

namespace {

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
    } else if (const auto* dec = std::get_if<DecodeConfig>(&job.config)) {
      outcome.usage = kernel->usage_of(dec->symbol(DecodeKernel::kAttend));
      outcome.dynamic_smem_bytes = dec->smem_bytes(DecodeKernel::kAttend);
    } else {
      const KernelConfig& forward = std::get<KernelConfig>(job.config);
      outcome.usage = kernel->usage_of(forward.name());  // a user mask's module holds its classes' kernels too
      outcome.dynamic_smem_bytes = forward.smem_bytes();
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

// The codes of ptxas's notes ("C7520"; a warning without a code counts as "W"), space-separated, or "-" for none.
std::string note_codes(const std::vector<std::string>& notes) {
  if (notes.empty()) return "-";
  std::string codes;
  for (const std::string& note : notes) {
    const size_t close = note.find(')');
    const bool coded = note.rfind("(C", 0) == 0 && close != std::string::npos;
    codes += (codes.empty() ? "" : " ") + (coded ? note.substr(1, close - 1) : std::string("W"));
  }
  return codes;
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
      j["ptxas_notes"] = o.usage.ptxas_notes;
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

}  // namespace

std::vector<CompileOutcome> compile_jobs(const std::vector<CompileJob>& jobs, bool use_cache, int threads) {
  std::vector<CompileOutcome> outcomes(jobs.size());
  const size_t thread_count = std::clamp<size_t>(static_cast<size_t>(threads), 1, std::max<size_t>(jobs.size(), 1));
  std::atomic<size_t> next{0};
  std::mutex log_mutex;
  size_t done = 0;           // under log_mutex, as the two below
  size_t compiled = 0;       // kernels NVRTC built in this process
  double compiled_ms = 0;    // their NVRTC time, which paces the estimate (a cached kernel takes milliseconds)
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      outcomes[i] = compile_one(jobs[i], use_cache);
      const CompileOutcome& o = outcomes[i];
      std::lock_guard<std::mutex> lock(log_mutex);
      const std::string counter = format("[%zu/%zu] ", ++done, jobs.size());
      const std::string what = jobs[i].name() + " for " + arch_label(jobs[i].arch);
      if (!o.ok) {
        std::cerr << counter << "FAILED " << what << ": " << o.error << '\n';
      } else if (o.cached) {
        std::cerr << counter << what << ": cached\n";
      } else {
        ++compiled;
        compiled_ms += o.compile_ms;
        const double eta_s = compiled_ms / 1000 / static_cast<double>(compiled) *
                             static_cast<double>(jobs.size() - done) / static_cast<double>(thread_count);
        std::cerr << counter << what << format(": compiled in %.1f s  (eta %.0f s)", o.compile_ms / 1000, eta_s)
                  << '\n';
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < thread_count; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
  return outcomes;
}

void print_compile_table(const std::vector<CompileOutcome>& outcomes, std::ostream& os) {
  Table table({"config", "arch", "regs", "static smem", "dyn smem", "spill st/ld", "stack", "ptxas notes", "compile ms",
               "cached"});
  for (const CompileOutcome& o : outcomes) {
    if (!o.ok) {
      table.add({o.name, arch_label(o.arch), "FAILED", "-", "-", "-", "-", "-", "-", "-"});
      continue;
    }
    // registers < 0: ptxas's report was missing from NVRTC's log, so nothing of it is known.
    const bool known = o.usage.registers >= 0;
    auto reported = [&](int value) { return known ? std::to_string(value) : std::string("?"); };
    table.add({o.name, arch_label(o.arch), reported(o.usage.registers), reported(o.usage.static_smem_bytes),
               std::to_string(o.dynamic_smem_bytes),
               reported(o.usage.spill_store_bytes) + "/" + reported(o.usage.spill_load_bytes),
               reported(o.usage.stack_bytes), note_codes(o.usage.ptxas_notes),
               o.cached ? "-" : format("%.0f", o.compile_ms), o.cached ? "yes" : "no"});
  }
  table.print(os);
}

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
  if (std::any_of(outcomes.begin(), outcomes.end(),
                  [](const CompileOutcome& o) { return o.ok && !o.usage.ptxas_notes.empty(); })) {
    std::cout << "\nptxas notes (each kernel below runs slower than its source was written to):\n";
    for (const CompileOutcome& o : outcomes) {
      if (!o.ok) continue;
      for (const std::string& note : o.usage.ptxas_notes)
        std::cout << "  " << o.name << " for " << arch_label(o.arch) << ": " << note << '\n';
    }
  }
  if (failed) {
    std::cerr << "\nfailed:\n";
    for (const CompileOutcome& o : outcomes)
      if (!o.ok) std::cerr << "  " << o.name << " for " << arch_label(o.arch) << ": " << first_line(o.error) << '\n';
  }
  return failed;
}

std::vector<CompileJob> default_jobs_for(const std::vector<int>& archs) {
  std::vector<CompileJob> jobs;
  for (int arch : archs)
    for (const KernelConfig& config : default_forward_candidates(arch)) jobs.push_back({config, arch});
  return jobs;
}

int command_compile(const Args& args) {
  if (args.has("cache-dir")) {
    // KernelRegistry::instance() takes its directory from here on first use, which is still to come.
    const fs::path dir = fs::absolute(args.string_or("cache-dir", ""));
    ::setenv("FLASHGEN_CACHE_DIR", dir.c_str(), 1);
  }
  if (args.has("spec")) return command_compile_spec(args);
  for (const char* spec_only : {"shard", "max-candidates", "sms"}) {
    if (args.has(spec_only))
      throw UsageError(std::string("--") + spec_only + " applies to --spec", args.usage());
  }
  if (args.positionals.empty() && !args.has("all-defaults"))
    throw UsageError("nothing to compile: name configs or pass --all-defaults", args.usage());
  const std::vector<int> archs = parse_archs(args, kDefaultArchs);
  const int threads = static_cast<int>(args.int_or("jobs", default_jobs(), 1, 1024));

  std::vector<CompileJob> jobs;
  std::set<std::pair<std::string, int>> seen;
  auto add = [&](const AnyConfig& config, int arch) {
    CompileJob job{config, arch};
    if (seen.insert({job.name(), arch}).second) jobs.push_back(std::move(job));
  };
  const std::shared_ptr<const UserVariant> user = variant_of(args);
  for (const std::string& name : args.positionals) {
    const AnyConfig config = config_from_name(name, user);  // a bad name stops here, before any work
    // Without --arch a Hopper-family config is compiled for sm_90a only, the one target it has.
    const bool sm90_only = std::visit(
        [](const auto& c) {
          if constexpr (std::is_same_v<std::decay_t<decltype(c)>, DecodeConfig>) {
            return c.latent;  // the sm80 decode kernels run from sm_80 up, the latent one on sm_90
          } else {
            return c.family() == KernelFamily::kSm90;
          }
        },
        config);
    for (int arch : archs)
      if (args.has("arch") || !sm90_only || arch == 90) add(config, arch);
  }
  if (args.has("all-defaults")) {
    for (const CompileJob& job : default_jobs_for(archs)) {
      AnyConfig config = job.config;
      attach_variant(config, user);
      add(config, job.arch);
    }
  }
  // A named config that cannot run on a named arch is a bad request, not a failed compile: refused before any work.
  for (const CompileJob& job : jobs) {
    if (const std::optional<std::string> why = std::visit([&](const auto& c) { return c.invalid_reason(job.arch); },
                                                          job.config)) {
      fail(Status::kInvalidArgument, "config " + job.name() + " is invalid for " + arch_label(job.arch) + ": " + *why);
    }
  }

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

}  // namespace flashgen::cli
