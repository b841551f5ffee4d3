// `flashgen tune`: sweeps the forward or backward configs of one problem (given by flags) or of every
// problem of a JSON spec on the GPU, and stores every candidate's row and the winner in the tuning
// database; --shard splits a spec across machines (the problems and shards: cli/tune_spec.cpp), --devices across
// GPUs (cli/tune_workers.cpp).
#include "cli/tune.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <utility>

#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/run.hpp"
#include "cli/table.hpp"
#include "cli/user_variant.hpp"
#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"
#include "tuner/store.hpp"
#include "tuner/tune.hpp"

namespace flashgen::cli {

Command tune_command() {
  return Command("tune",
                 "Tunes the forward kernel (with --backward the backward's kernels, with --kv-cache the decode\n"
                 "kernels and their split count) on the GPU for one\n"
                 "problem (given by flags) or for every problem of a JSON spec: enumerates and prunes the search space, compiles the candidates, checks\n"
                 "each against a float64 reference, times them and stores every row and the winner in the\n"
                 "tuning database. A problem whose bucket the database already holds for this GPU is skipped\n"
                 "unless --force, so an interrupted sweep can simply be run again.\n"
                 "A new winner never regresses: the incumbent (what would run without it: the database's winner\n"
                 "of the bucket or the nearest one, else the shipped defaults' for this GPU, else the built-in\n"
                 "choice) is swept and re-timed with the fastest,\n"
                 "and stays the winner unless beaten beyond the measured noise; the decision is stored with it.\n"
                 "\n"
                 "Across machines: --shard i/N (by default the Slurm task's: SLURM_PROCID/SLURM_NTASKS, within a\n"
                 "job array SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT; else OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)\n"
                 "tunes the spec's problems i, i+N, i+2N, ... into its own file, .shard<i>-of-<N> put before the\n"
                 "database's extension; `flashgen db merge` joins the files. `flashgen compile --spec` compiles the\n"
                 "same candidates ahead, on machines without a GPU, into the kernel cache this command reads.\n"
                 "\n"
                 "Spec: {\"max_candidates\": 32, \"problems\": [{\"pass\": \"backward\", \"deterministic\": false,\n"
                 "\"dtype\": \"bf16\", \"head_dim\": 128,\n"
                 "\"causal\": \"bottom-right\", \"batch\": 4, \"heads_q\": 32, \"heads_kv\": 8, \"seqlen_q\": 4096,\n"
                 "\"seqlen_k\": 4096}, {\"kv_cache\": true, \"page_size\": 16, \"batch\": 8, \"seqlen_q\": 1, \"seqlen_k\": 32768},\n"
                 "{\"varlen\": true, \"batch\": 64, \"seqlen_q\": 8192, \"seqlen_k\": 8192, \"total_q\": 266240,\n"
                 "\"page_size\": 256},\n"
                 "{\"causal\": \"bottom-right\", \"window\": [4096, -1], \"softcap\": 30, \"alibi\": true, \"seqlen_q\": 16384,\n"
                 "\"seqlen_k\": 16384}, ...]};\n"
                 "omitted fields take the flag defaults below (a packed problem's totals: its own, else the default\n"
                 "spread; \"window\", \"chunk\", \"softcap\" and \"alibi\" as --window, --chunk, --softcap and --alibi).",
                 "[options]")
      .flag("backward", "tune the backward pass (dq, dk, dv) instead of the forward")
      .flag("deterministic", "with --backward: the deterministic dQ strategy (bitwise repeatable)")
      .option("dtype", "T", "fp16 or bf16 (default fp16); or e4m3 or e5m2, the FP8 forward (sm_90, dense batches; its "
                            "tiles are timed writing bf16 and serve an fp16 output too)")
      .option("head-dim", "D", "head dimension (default 128)")
      .option("head-dim-v", "D", "the values' head dimension where it is not --head-dim (MLA's prefill: --head-dim "
                                 "192 --head-dim-v 128); forward or --backward; a class of its own (d192v128)")
      .option("causal", "MODE", "none, bottom-right or top-left (default none)")
      .option("softcap", "C", "soft cap: scores s become C * tanh(s / C) before the softmax (default 0: none)")
      .flag("alibi", "ALiBi (per-head slopes, a bias linear in the distance to the diagonal): its own kernels, "
                     "swept with the standard slopes 2^(-8 (h + 1) / heads-q)")
      .option("window", "L,R", "sliding window: query i sees keys i + seqlen_k - seqlen_q - L to ... + R (-1: no "
                               "bound on that side; FlashAttention's window_size, so with --causal bottom-right R "
                               "is 0); the problem is keyed by the window's span")
      .option("chunk", "C", "chunked attention (Llama 4's attention_chunk): a query sees only keys of its own chunk "
                            "of C positions, with --causal bottom-right or none or a window; keyed as a window no "
                            "wider than C")
      .option("batch", "B", "batch size (default 4)")
      .option("heads-q", "H", "query heads (default 16)")
      .option("heads-kv", "H", "key/value heads; heads-q must be a multiple (default 16)")
      .option("seqlen-q", "N", "query length; with --kv-cache the new tokens per sequence (default 4096, 1 with "
                               "--kv-cache)")
      .option("seqlen-k", "N", "key/value length; with --kv-cache the cache's capacity, every cache full (default 4096)")
      .flag("varlen", "tune a packed batch of --batch sequences (flashgen_attention_varlen_forward/backward): "
                      "lengths spread evenly from --seqlen-q (--seqlen-k) down to what makes --total-q (--total-k) "
                      "tokens")
      .option("total-q", "N", "with --varlen: query tokens in all (default: lengths down to 1/64 of the longest)")
      .option("total-k", "N", "with --varlen: key tokens in all (default as --total-q)")
      .flag("kv-cache", "tune decoding against a KV cache (flashgen_attention_kvcache): the decode modules and "
                        "the key ranges per sequence, timed with CUDA events on full caches")
      .option("cache-dtype", "T", kCacheDtypeHelp)
      .option("page-size", "N", "with --kv-cache, or --varlen without --backward: a paged cache of N-key pages, a "
                                "multiple of 16, in a shuffled order (default 0: contiguous); a packed forward over "
                                "pages tunes the paged kernels, keyed by N (fwd_varlen_paged<N>)")
      .option("variant", "FILE", kTuneVariantHelp)
      .option("spec", "FILE", "tune every problem of this JSON spec instead of the one the flags describe")
      .option("shard", "I/N", "tune only problems I, I+N, ... of the spec, into their own database file (default: "
                              "the Slurm or Open MPI task's, as above)")
      .option("devices", "LIST", "all, or GPU ordinals like 0,1: one worker process per GPU, each tuning its share; a "
                                 "worker that crashes is restarted without the candidate it was running (a worker "
                                 "killed before it ran one is restarted as it was)")
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
      .option("sms", "N", "with --dry-run --json: the SMs KV-cache problems' split counts are planned for "
                          "(default 132, an H100 or H200)")
      .flag("worker", "run as one worker of --devices")
      .internal()
      .option("journal", "FILE", "(--worker) names the candidate being launched, for crash isolation")
      .internal()
      .option("crashed", "NAME:WHY", "(--worker) a candidate that crashed a worker, recorded and skipped", true)
      .internal()
      .flag("json", "print JSON: the result (an array with --spec), the plan (--dry-run) or the summary (--devices)");
}

namespace {

std::string space_text(const SpaceCounts& space) {
  // A shared-memory reason names each config's own size; the line counts them as one reason (JSON keeps each).
  static const std::regex smem("needs [0-9]+ bytes of shared memory; (sm_[0-9]+) allows ([0-9]+) per block");
  std::map<std::string, int> grouped;
  for (const auto& [reason, count] : space.pruned_by_reason)
    grouped[std::regex_replace(reason, smem, "needs more shared memory than $1 allows per block ($2 bytes)")] += count;
  std::string reasons;
  for (const auto& [reason, count] : grouped)
    reasons += (reasons.empty() ? "" : "; ") + reason + ": " + std::to_string(count);
  return format("%d configs, %d pruned", space.total, space.pruned) + (reasons.empty() ? "" : " (" + reasons + ")") +
         format(", %zu valid", space.valid);
}

}  // namespace

namespace {

// <db> for a whole sweep; <stem>.shard<i>-of-<N><extension> next to it for one shard of several.
fs::path shard_db_path(const fs::path& db, const Shard& shard) {
  if (shard.count == 1) return db;
  fs::path path = db;
  path.replace_filename(db.stem().string() + ".shard" + std::to_string(shard.index) + "-of-" +
                        std::to_string(shard.count) + db.extension().string());
  return path;
}

// Crash isolation of a worker: candidates that crashed an earlier run of it, and the file that names the
// candidate being launched.
struct WorkerState {
  std::map<std::string, std::string> known_crashes;
  std::optional<fs::path> journal;
};

// --candidates for problem (configs_of_problem), an error naming the option.
std::vector<TunedConfig> named_candidates(const std::vector<std::string>& names, const AttentionProblem& problem) {
  try {
    return configs_of_problem(names, problem_key(problem));
  } catch (const Error& e) {
    fail(e.status(), std::string("--candidates: ") + e.what());
  }
}

// Tunes one problem into store; prints (or returns as JSON) what happened.
Json tune_one(const AttentionProblem& problem, TuningStore& store, const fs::path& db_path, size_t max_candidates,
              bool force, bool json, const ScopedContext& context, const WorkerState& worker,
              const std::vector<std::string>& named, const UserVariantArgs& user_args) {
  const int arch = device_sm(context.device());
  const DeviceFingerprint device = current_device_fingerprint(static_cast<int>(context.device()));
  TuneOptions options;
  options.force = force;
  options.max_candidates = max_candidates;
  options.named = named_candidates(named, problem);
  options.sweep.known_crashes = worker.known_crashes;
  options.sweep.user_args = user_args;
  if (worker.journal) {
    // FLASHGEN_TEST_CRASH_CONFIG (testing only): the worker dies at that candidate as at a kernel fault.
    const std::optional<std::string> crash_at = env("FLASHGEN_TEST_CRASH_CONFIG");
    options.sweep.on_launch = [&, crash_at](const std::string& name) {
      std::ofstream(*worker.journal, std::ios::trunc) << name << std::flush;
      if (crash_at && name == *crash_at) std::abort();
    };
  }
  Clock::time_point start = Clock::now();
  Clock::time_point timing_start = start;
  double compile_s = 0;
  options.on_plan = [&](const TunePlan& plan) {
    if (!json) std::cout << "space: " << space_text(plan.space) << '\n';
    std::cerr << "tuning " << plan.key.id() << " on " << device.id() << ": compiling " << plan.candidates.size()
              << " candidates\n";
    start = Clock::now();
  };
  // On stderr: the end of compiling, then each candidate's first timing with an estimate of the time left.
  options.sweep.progress = [&](const SweepProgress& event) {
    if (event.phase == SweepPhase::kCompiled && event.index + 1 == event.count) {  // timing starts after compiling
      timing_start = Clock::now();
      compile_s = ms_since(start) / 1000;
      std::cerr << "compiled " << event.count << " candidates for sm_" << arch << '\n';
    } else if (event.phase == SweepPhase::kTimed && event.status == CandidateStatus::kOk) {
      const double done = static_cast<double>(event.index + 1);  // the candidate's position in the list
      const double eta_s = ms_since(timing_start) / 1000 / done * (static_cast<double>(event.count) - done);
      std::cerr << progress_line(event) << format("  (eta %.0f s)", eta_s) << '\n';
    }
  };
  const TuneResult result = tune(problem, store, device, arch, options);
  const double sweep_s = ms_since(start) / 1000;

  if (const std::optional<StoredChoice>& stored = result.stored) {
    if (!json) {
      std::cout << format("already tuned: %s, %.4f ms for %s on %s (--force tunes again)\n",
                          flashgen::config_name(stored->config).c_str(), stored->median_ms, result.key.id().c_str(),
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

  const std::string winner = flashgen::config_name(result.winner);
  std::cerr << "winner " << winner << ": " << std::to_string(result.winner_ms) << " ms (" << result.decision << ")\n";
  const std::string heuristic = flashgen::config_name(result.plan.builtin);
  const CandidateResult* builtin = result.builtin_row();
  const bool builtin_timed = builtin && builtin->status == CandidateStatus::kOk;
  const char* builtin_status = builtin ? candidate_status_name(builtin->status) : "not swept";
  size_t passed = 0;
  for (const CandidateResult& c : result.candidates) passed += c.status == CandidateStatus::kOk;

  if (!json) {
    std::cout << format("swept:     %zu candidates, %zu passed, in %.1f s (compile %.1f s, check and timing %.1f s)\n",
                        result.candidates.size(), passed, sweep_s, compile_s, sweep_s - compile_s)
              << format("winner:    %s, %.4f ms\n", winner.c_str(), result.winner_ms);
    if (builtin_timed)
      std::cout << format("built-in:  %s, %.4f ms (the winner is %.2fx as fast)\n", heuristic.c_str(),
                          builtin->median_ms, builtin->median_ms / result.winner_ms);
    else
      std::cout << "built-in:  " << heuristic << ": " << builtin_status << '\n';
    std::cout << "incumbent: " << result.incumbent.incumbent << " (" << result.incumbent.incumbent_source << ")\n"
              << "decision:  " << result.decision << '\n'
              << "stored:    " << result.key.id() << " for " << device.id() << " in " << db_path.string() << '\n';
  }
  const SpaceCounts& space = result.plan.space;
  return {{"device", device.id()},
          {"problem", result.key.id()},
          {"space", {{"total", space.total}, {"pruned", space.pruned}, {"pruned_by_reason", space.pruned_by_reason},
                     {"valid", space.valid}}},
          {"candidates", result.candidates.size()},
          {"passed", passed},
          {"winner", winner},
          {"winner_ms", result.winner_ms},
          {"heuristic", heuristic},
          {"heuristic_ms", builtin_timed ? Json(builtin->median_ms) : Json(nullptr)},
          {"heuristic_status", builtin_status},
          {"decision", result.decision},
          {"incumbent", result.incumbent.incumbent},
          {"incumbent_source", result.incumbent.incumbent_source},
          {"margin", result.incumbent.margin},
          {"sweep_s", sweep_s},
          {"compile_s", compile_s},
          {"check_and_timing_s", sweep_s - compile_s},
          {"db", db_path.string()},
          {"skipped", false}};
}

}  // namespace

std::string problem_line(const AttentionProblem& p) {
  const AttentionShape& s = p.shape;
  const std::string dims = std::to_string(p.head_dim()) +
                           (p.value_dim() != p.head_dim() ? "v" + std::to_string(p.value_dim()) : std::string());
  return format("%s %s d%s causal=%s batch %lld heads %lld/%lld seqlen %lld/%lld", pass_text(p), dtype_name(p.dtype),
                dims.c_str(), mask_description(p).c_str(), (long long)s.batch, (long long)s.heads_q,
                (long long)s.heads_kv, (long long)s.seqlen_q, (long long)s.seqlen_k) +
         (p.softcapped() ? format(" softcap %g", p.softcap) : std::string()) + (p.alibi ? " ALiBi" : "") +
         (p.paged ? format(" pages of %d", p.page_size) : std::string()) +
         (p.cache_dtype ? format(" %s cache", dtype_name(*p.cache_dtype)) : std::string()) +
         (p.varlen ? format(" tokens %lld/%lld", (long long)p.total_q, (long long)p.total_k) : std::string()) +
         (p.user ? " user variant " + p.user->tag : std::string());
}

Json problem_json(const AttentionProblem& p) {
  const AttentionShape& s = p.shape;
  Json j = {{"pass", p.backward() ? "backward" : "forward"}, {"deterministic", p.deterministic()},
            {"dtype", dtype_name(p.dtype)}, {"head_dim", s.head_dim}, {"causal", causal_text(p.mask)},
            {"batch", s.batch}, {"heads_q", s.heads_q}, {"heads_kv", s.heads_kv},
            {"seqlen_q", s.seqlen_q}, {"seqlen_k", s.seqlen_k}, {"kv_cache", p.kv_cache}, {"page_size", p.page_size},
            {"varlen", p.varlen}};
  if (p.value_dim() != p.head_dim()) j["head_dim_v"] = p.value_dim();
  if (p.varlen) j["total_q"] = p.total_q, j["total_k"] = p.total_k;  // a spec entry as read_tune_spec takes it
  if (p.windowed()) j["causal"] = "none", j["window"] = Json::array({p.window_left, p.window_right});
  if (p.attention_chunk > 0) j["chunk"] = p.attention_chunk;
  if (p.softcapped()) j["softcap"] = p.softcap;
  if (p.alibi) j["alibi"] = true;
  if (p.cache_dtype) j["cache_dtype"] = dtype_name(*p.cache_dtype);
  return j;
}

Json dry_run_entries(const Args& args, const std::vector<AttentionProblem>& problems, const std::vector<std::string>& named,
                     size_t max_candidates) {
  const std::vector<int> archs = parse_archs(args, {90});
  if (archs.size() != 1) throw UsageError("tune --dry-run --json lists the candidates of one --arch", args.usage());
  const int arch = archs.front();
  Json entries = Json::array();
  TuneOptions options;
  options.max_candidates = max_candidates;
  options.multiprocessors = static_cast<int>(args.int_or("sms", 132, 1, 1 << 16));
  for (const AttentionProblem& p : problems) {
    Json names = Json::array();
    if (!named.empty()) {
      for (const std::string& name : named) names.push_back(name);
    } else {
      for (const TunedConfig& c : plan_tune(p, arch, options).candidates) names.push_back(flashgen::config_name(c));
    }
    Json entry = problem_json(p);
    entry["candidates"] = names;
    entries.push_back(entry);
  }
  return entries;
}

int command_tune(const Args& args) {
  constexpr long long kIntMax = std::numeric_limits<int>::max();
  for (const char* dry_only : {"arch", "sms"}) {
    if (args.has(dry_only) && !(args.has("dry-run") && args.has("json")))
      throw UsageError(std::string("--") + dry_only + " applies to --dry-run --json (a sweep runs on the GPU it finds)",
                       args.usage());
  }
  const AttentionProblem flags = problem_from_flags(args);
  TuneSpec spec;
  if (args.has("spec")) {
    spec = read_tune_spec(args.string_or("spec", ""), flags);
  } else {
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
    if (!args.has("db")) {  // a dry run too: it checks what the run would
      throw UsageError("--candidates needs --db: its winner replaces the bucket's stored one, so it goes to a "
                       "database of its own",
                       args.usage());
    }
    for (const char* other : {"spec", "devices", "max-candidates"}) {
      if (args.has(other))
        throw UsageError("--candidates names one problem's configs; it does not go with --" + std::string(other),
                         args.usage());
    }
    named_candidates(named, flags);  // a bad name stops here, before any GPU work
  }
  // --variant: every problem's user variant, dense problems only (packed and KV-cache sweeps take none).
  const std::shared_ptr<const UserVariant> user = variant_of(args);
  if (user && args.has("devices")) throw UsageError("--variant does not go with --devices", args.usage());
  attach_variant_to(spec.problems, user, args);
  const Shard shard = shard_of(args);
  std::vector<AttentionProblem> mine;
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
      for (const AttentionProblem& p : mine) std::cout << "  " << problem_line(p) << '\n';
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
  const VariantValues values = user ? variant_values_of(args, *user) : VariantValues{};
  TuningStore store(db_path);
  Json results = Json::array();
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine.size() > 1) std::cerr << format("problem %zu/%zu: %s\n", i + 1, mine.size(), problem_line(mine[i]).c_str());
    results.push_back(tune_one(mine[i], store, db_path, max_candidates, args.has("force") || !named.empty(), json,
                                context, worker, named, values.args));
  }
  if (worker.journal) std::ofstream(*worker.journal, std::ios::trunc);
  if (json) print_json(args.has("spec") || results.empty() ? results : results.front());
  return 0;
}

}  // namespace flashgen::cli
