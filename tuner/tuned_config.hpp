// A tuned config of either pass, as the store, the sweeps and the run-time choice carry it: a forward
// KernelConfig or a backward BwdConfig. Its JSON is the config's own, told apart by "family"
// (fwd_sm80, fwd_sm90, bwd_sm80, bwd_sm90).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <type_traits>
#include <variant>

#include "generator/bwd_config.hpp"
#include "generator/kernel_config.hpp"
#include "tuner/problem_key.hpp"

namespace flashgen {

using TunedConfig = std::variant<KernelConfig, BwdConfig>;

std::string config_name(const TunedConfig& config);

// A tuned config equals a forward or backward config when it holds that very config.
template <class Config, class = std::enable_if_t<std::is_same_v<Config, KernelConfig> || std::is_same_v<Config, BwdConfig>>>
bool operator==(const TunedConfig& tuned, const Config& config) {
  const Config* held = std::get_if<Config>(&tuned);
  return held != nullptr && *held == config;
}
template <class Config, class = std::enable_if_t<std::is_same_v<Config, KernelConfig> || std::is_same_v<Config, BwdConfig>>>
bool operator==(const Config& config, const TunedConfig& tuned) {
  return tuned == config;
}
template <class Config, class = std::enable_if_t<std::is_same_v<Config, KernelConfig> || std::is_same_v<Config, BwdConfig>>>
bool operator!=(const TunedConfig& tuned, const Config& config) {
  return !(tuned == config);
}
bool is_backward(const TunedConfig& config);

// Whether a config is of the pass a problem key names (the backward with its dQ strategy).
bool same_pass(const KernelConfig& config, const ProblemKey& problem);
bool same_pass(const BwdConfig& config, const ProblemKey& problem);
// Whether a config is one of the problem's: its pass, dtype, head_dim and mask.
bool of_problem(const TunedConfig& config, const ProblemKey& problem);

void to_json(nlohmann::json& j, const TunedConfig& config);
// Reads a forward or backward config by its "family" (forward when absent); throws Error on bad fields.
void from_json(const nlohmann::json& j, TunedConfig& config);

}  // namespace flashgen
