// TunedConfig: name, JSON and problem match of a config of either pass.
#include "tuner/tuned_config.hpp"

namespace flashgen {

std::string config_name(const TunedConfig& config) {
  return std::visit([](const auto& c) { return c.name(); }, config);
}

bool is_backward(const TunedConfig& config) { return std::holds_alternative<BwdConfig>(config); }

bool same_pass(const KernelConfig& config, const ProblemKey& problem) {
  return problem.pass == Pass::kForward && config.varlen == problem.varlen;
}
bool same_pass(const BwdConfig& config, const ProblemKey& problem) {
  return problem.pass == Pass::kBackward && config.deterministic == (problem.dq == DqStrategy::kDeterministic) &&
         config.varlen == problem.varlen;
}

bool of_problem(const TunedConfig& config, const ProblemKey& problem) {
  return std::visit(
      [&](const auto& c) {
        return same_pass(c, problem) && c.dtype == problem.dtype && c.head_dim == problem.head_dim &&
               c.mask == problem.mask;
      },
      config);
}

void to_json(nlohmann::json& j, const TunedConfig& config) {
  std::visit([&](const auto& c) { j = c; }, config);
}

void from_json(const nlohmann::json& j, TunedConfig& config) {
  const bool backward = j.is_object() && j.contains("family") && j["family"].is_string() &&
                        j["family"].get<std::string>().rfind("bwd_", 0) == 0;
  if (backward) {
    config = j.get<BwdConfig>();
  } else {
    config = j.get<KernelConfig>();
  }
}

}  // namespace flashgen
