// Shipped tuning defaults: winners the project measured with its own sweeps on the GPUs it supports
// (tuner/data/*.json, in `flashgen db export` format), embedded in the library at build time. The
// run-time choice reads them after the user's database and before the built-in heuristic.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"

namespace flashgen {

class ShippedDefaults {
 public:
  // The embedded data; a file that cannot be read is reported on stderr once and left out.
  static const ShippedDefaults& instance();

  // files: (name, export JSON text) pairs. Throws Error(kInvalidArgument) naming a file that is not a
  // valid export.
  static ShippedDefaults from_files(const std::vector<std::pair<std::string, std::string>>& files);

  // The winner for problem on a GPU of device's kind: same GPU name, sm and SM count, swept by the same
  // generator version (an older generator's sweep never timed the kernel families added since; driver
  // and NVRTC versions may differ: a shipped config is re-checked for validity by the caller). The
  // exact size bucket first, else the nearest bucket of the same problem class (bucket_distance, ties
  // broken by the smaller problem id). *exact says which.
  std::optional<StoredChoice> lookup(const DeviceFingerprint& device, const ProblemKey& problem,
                                     bool* exact = nullptr) const;

  const std::vector<StoredChoice>& winners() const { return winners_; }

 private:
  std::vector<StoredChoice> winners_;
};

}  // namespace flashgen
