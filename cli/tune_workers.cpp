// `flashgen tune --devices`: the supervisor that runs one `tune --worker` process per GPU over its share
// of the problems, restarts a worker that crashes without the candidate it was running, and merges the
// workers' databases into the one named.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "cli/args.hpp"
#include "cli/common.hpp"
#include "cli/table.hpp"
#include "cli/tune.hpp"
#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"
#include "tuner/store.hpp"

namespace flashgen::cli {
namespace {

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

}  // namespace

int supervise_workers(const Args& args, const std::vector<AttentionProblem>& problems, const fs::path& db,
                      std::optional<size_t> max_candidates) {
  const std::vector<int> devices = parse_devices(args);
  const bool json = args.has("json");
  const size_t m = devices.size();
  if (args.has("dry-run")) {  // each worker's problems, as a dry run without --devices prints them
    if (!json) std::cout << format("%zu problems on %zu GPUs into %s\n", problems.size(), m, db.string().c_str());
    Json plan = Json::array();
    for (size_t j = 0; j < m; ++j) {
      std::vector<AttentionProblem> mine;
      for (size_t i = j; i < problems.size(); i += m) mine.push_back(problems[i]);
      if (json) {
        plan.push_back({{"device", devices[j]},
                        {"problems", dry_run_entries(args, mine, {}, max_candidates.value_or(
                                                                          std::numeric_limits<int>::max()))}});
        continue;
      }
      std::cout << format("  GPU %d: %zu problems\n", devices[j], mine.size());
      for (const AttentionProblem& p : mine) std::cout << "    " << problem_line(p) << '\n';
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
  for (const AttentionProblem& p : problems) spec_problems.push_back(problem_json(p));
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
    // A worker killed by a signal before it launched anything (while compiling, or by the OOM killer or a
    // user) has no candidate to blame; it starts again where its database left off. An exit status without a
    // candidate is the worker's own reported error, which a restart would only repeat.
    const bool killed_idle = culprit.empty() && WIFSIGNALED(status);
    if ((!culprit.empty() || killed_idle) && w.restarts < kMaxWorkerRestarts) {
      if (killed_idle) {
        std::cerr << "flashgen: worker on GPU " << w.device << " ended with " << how
                  << " before launching a candidate; restarting it\n";
        crashes.push_back({{"device", w.device}, {"config", nullptr}, {"how", how}});
      } else {
        const std::string why = "crashed its worker process (" + how + ") on GPU " + std::to_string(w.device);
        std::cerr << "flashgen: worker on GPU " << w.device << " ended with " << how << " while running " << culprit
                  << "; restarting it without that candidate\n";
        crashes.push_back({{"device", w.device}, {"config", culprit}, {"how", how}});
        w.crashed.push_back(culprit + ":" + why);
      }
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
    std::cout << format("%zu problems on %zu GPUs: %d winners merged into %s; %zu worker crashes recovered%s\n",
                        problems.size(), m, merged, db.string().c_str(), crashes.size(),
                        failed.empty() ? "" : format("; %zu workers failed (files kept in %s)", failed.size(),
                                                     work.string().c_str()).c_str());
  }
  return failed.empty() ? 0 : 1;
}

}  // namespace flashgen::cli
