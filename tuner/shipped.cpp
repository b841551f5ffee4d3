#include "tuner/shipped.hpp"

#include <cstdio>

#include "flashgen/error.hpp"

namespace flashgen {

const std::vector<std::pair<std::string, std::string>>& shipped_tuning_data();  // shipped_tuning_data.cpp

namespace {

bool same_kind(const DeviceFingerprint& a, const DeviceFingerprint& b) {
  return a.gpu_name == b.gpu_name && a.sm == b.sm && a.sm_count == b.sm_count &&
         a.generator_version == b.generator_version;
}

}  // namespace

ShippedDefaults ShippedDefaults::from_files(const std::vector<std::pair<std::string, std::string>>& files) {
  ShippedDefaults shipped;
  for (const auto& [name, text] : files) {
    nlohmann::json data;
    try {
      data = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(Status::kInvalidArgument, "shipped tuning data " + name + ": not JSON (" + e.what() + ")");
    }
    try {
      for (StoredChoice& choice : winners_from_export(data, "shipped defaults " + name))
        shipped.winners_.push_back(std::move(choice));
    } catch (const Error& e) {
      fail(Status::kInvalidArgument, "shipped tuning data " + name + ": " + e.what());
    }
  }
  return shipped;
}

const ShippedDefaults& ShippedDefaults::instance() {
  static const ShippedDefaults shipped = [] {
    ShippedDefaults all;
    for (const auto& file : shipped_tuning_data()) {
      try {
        ShippedDefaults one = from_files({file});
        for (StoredChoice& choice : one.winners_) all.winners_.push_back(std::move(choice));
      } catch (const Error& e) {
        std::fprintf(stderr, "flashgen: warning: %s; not used\n", e.what());
      }
    }
    return all;
  }();
  return shipped;
}

std::optional<StoredChoice> ShippedDefaults::lookup(const DeviceFingerprint& device, const ProblemKey& problem,
                                                    bool* exact) const {
  const StoredChoice* best = nullptr;
  int best_distance = 0;
  for (const StoredChoice& choice : winners_) {
    if (!same_kind(choice.device, device) || choice.problem.class_id() != problem.class_id()) continue;
    const int distance = bucket_distance(choice.problem, problem);
    if (best == nullptr || distance < best_distance ||
        (distance == best_distance && choice.problem.id() < best->problem.id())) {
      best = &choice;
      best_distance = distance;
    }
  }
  if (best == nullptr) return std::nullopt;
  if (exact != nullptr) *exact = best_distance == 0 && best->problem.id() == problem.id();
  return *best;
}

}  // namespace flashgen
