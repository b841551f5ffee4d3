// Forward config choice: tuning database first, then the heuristic filtered by ptxas's spill report;
// memoized per process.
#include "select.hpp"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "flashgen/error.hpp"
#include "heuristic.hpp"
#include "kernel_registry.hpp"
#include "shipped.hpp"
#include "store.hpp"

namespace flashgen {

ForwardChoice heuristic_choice(DType dtype, int head_dim, MaskKind mask, int arch) {
  using Key = std::tuple<int, int, int, int>;
  static std::mutex mutex;
  static std::map<Key, ForwardChoice> chosen;
  const Key key{static_cast<int>(dtype), head_dim, static_cast<int>(mask), arch};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto found = chosen.find(key); found != chosen.end()) return found->second;
  }

  // Compiled outside the lock: two threads may both compile a first choice, the registry keeps one.
  const std::vector<KernelConfig> configs = heuristic_forward_configs(dtype, head_dim, mask, arch);
  ForwardChoice choice{configs.front(), "built-in heuristic (no tuning data)"};
  std::string spilling;
  bool clean = false;
  for (const KernelConfig& config : configs) {
    const ResourceUsage usage = KernelRegistry::instance().compiled(config, arch)->usage;
    const int spilled = usage.spill_store_bytes + usage.spill_load_bytes;
    if (spilled == 0) {
      choice.config = config;
      clean = true;
      break;
    }
    spilling += (spilling.empty() ? "" : ", ") + config.name() + " spills " + std::to_string(spilled) + " bytes";
  }
  if (!spilling.empty()) {
    choice.reason += clean ? "; passed over " + spilling
                           : "; every candidate spills (" + spilling + "), using the first";
  }

  std::lock_guard<std::mutex> lock(mutex);
  return chosen.emplace(key, choice).first->second;
}

BackwardChoice heuristic_backward_choice(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch) {
  using Key = std::tuple<int, int, int, bool, int>;
  static std::mutex mutex;
  static std::map<Key, BackwardChoice> chosen;
  const Key key{static_cast<int>(dtype), head_dim, static_cast<int>(mask), deterministic, arch};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto found = chosen.find(key); found != chosen.end()) return found->second;
  }

  const std::vector<BwdConfig> configs = heuristic_backward_configs(dtype, head_dim, mask, deterministic, arch);
  BackwardChoice choice{configs.front(), "built-in heuristic (no tuning data)"};
  std::string spilling;
  bool clean = false;
  for (const BwdConfig& config : configs) {
    const std::shared_ptr<const CompiledKernel> module = KernelRegistry::instance().compiled(config, arch);
    int spilled = 0;
    for (BwdKernel kernel : {BwdKernel::kDkdv, BwdKernel::kDq}) {
      if (kernel == BwdKernel::kDq && !deterministic) continue;
      const ResourceUsage usage = module->usage_of(config.symbol(kernel));
      spilled += usage.spill_store_bytes + usage.spill_load_bytes;
    }
    if (spilled == 0) {
      choice.config = config;
      clean = true;
      break;
    }
    spilling += (spilling.empty() ? "" : ", ") + config.name() + " spills " + std::to_string(spilled) + " bytes";
  }
  if (!spilling.empty()) {
    choice.reason += clean ? "; passed over " + spilling
                           : "; every candidate spills (" + spilling + "), using the first";
  }
  std::lock_guard<std::mutex> lock(mutex);
  return chosen.emplace(key, choice).first->second;
}

ForwardChoice choose_forward_config(const DeviceFingerprint& device, const ProblemKey& problem, int arch,
                                    const TuningStore* user_db, const ShippedDefaults* shipped) {
  std::string passed_over;
  auto usable = [&](const std::optional<StoredChoice>& stored) {
    if (!stored) return false;
    const KernelConfig& c = stored->config;
    std::optional<std::string> why = c.invalid_reason(arch);
    if (!why && (c.dtype != problem.dtype || c.head_dim != problem.head_dim || c.mask != problem.mask)) {
      why = "does not match the problem";
    }
    if (why) passed_over += "; stored " + c.name() + " passed over: " + *why;
    return !why;
  };
  if (user_db != nullptr) {
    if (auto exact = user_db->lookup_exact(device, problem); usable(exact)) {
      return {exact->config, "tuning database " + user_db->path().string() + ", exact bucket " + problem.id()};
    }
    if (auto nearest = user_db->lookup_nearest(device, problem); usable(nearest)) {
      return {nearest->config, "tuning database " + user_db->path().string() + ", nearest bucket " +
                                   nearest->problem.id() + " for " + problem.id()};
    }
  }
  if (shipped != nullptr) {
    bool exact = false;
    if (auto stored = shipped->lookup(device, problem, &exact); usable(stored)) {
      return {stored->config, stored->source + (exact ? ", exact bucket " + problem.id()
                                                      : ", nearest bucket " + stored->problem.id() + " for " +
                                                            problem.id())};
    }
  }
  ForwardChoice choice = heuristic_choice(problem.dtype, problem.head_dim, problem.mask, arch);
  choice.reason += passed_over;
  return choice;
}

namespace {

// The user's database, opened read-only once per process; null when there is none or it is unusable.
const TuningStore* user_store() {
  static std::once_flag once;
  static std::unique_ptr<TuningStore> store;
  std::call_once(once, [] {
    const std::filesystem::path path = TuningStore::default_path();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return;  // no tuning data: not worth a warning
    try {
      store = std::make_unique<TuningStore>(path, /*read_only=*/true);
    } catch (const Error& e) {
      std::fprintf(stderr, "flashgen: warning: tuning database %s not used: %s\n", path.string().c_str(), e.what());
    }
  });
  return store.get();
}

// Fingerprint of each device, read once.
const DeviceFingerprint& fingerprint_of(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceFingerprint> fingerprints;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = fingerprints.find(device);
  if (found == fingerprints.end()) found = fingerprints.emplace(device, current_device_fingerprint(device)).first;
  return found->second;
}

}  // namespace

ForwardChoice choose_forward_config(int device, const ProblemKey& problem, int arch) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, ForwardChoice> chosen;
  const std::pair<int, std::string> key{device, problem.id()};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto found = chosen.find(key); found != chosen.end()) return found->second;
  }
  const TuningStore* store = user_store();
  ForwardChoice choice;
  {
    // SQLite reads through one connection, one thread at a time.
    static std::mutex store_mutex;
    std::lock_guard<std::mutex> lock(store_mutex);
    const ShippedDefaults& shipped = ShippedDefaults::instance();
    const bool any_data = store != nullptr || !shipped.winners().empty();
    choice = choose_forward_config(any_data ? fingerprint_of(device) : DeviceFingerprint{}, problem, arch, store,
                                   &shipped);
  }
  std::lock_guard<std::mutex> lock(mutex);
  return chosen.emplace(key, choice).first->second;
}

}  // namespace flashgen
