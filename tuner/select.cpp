// Forward config choice: heuristic order, filtered by ptxas's spill report, memoized per process.
#include "select.hpp"

#include <map>
#include <mutex>
#include <tuple>

#include "heuristic.hpp"
#include "kernel_registry.hpp"

namespace flashgen {

ForwardChoice choose_forward_config(DType dtype, int head_dim, MaskKind mask, int arch) {
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

}  // namespace flashgen
