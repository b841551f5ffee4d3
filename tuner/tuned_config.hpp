// A tuned config of any pass, as the store, the sweeps and the run-time choice carry it: a forward
// KernelConfig, a backward BwdConfig, or a KV-cache DecodeSplitConfig. Its JSON is the config's own, told apart
// by "family" (fwd_sm80, fwd_sm90, bwd_sm80, bwd_sm90, dec_sm80).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <type_traits>
#include <variant>

#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"
#include "tuner/problem_key.hpp"

namespace flashgen {

// What a KV-cache sweep times and the store keeps: a decode module and the key ranges per sequence it is
// launched with (a run-time argument, so one compiled module serves every split count).
struct DecodeSplitConfig {
  DecodeConfig config;
  int splits = 1;

  // The module's name and the split count, e.g. dec_sm80_bf16_d128_r16_n64_w4_s4_causal_split8.
  std::string name() const;
  static DecodeSplitConfig from_name(const std::string& name);  // throws Error(kInvalidArgument)
  // The module's reason, or a split count outside 1..128.
  std::optional<std::string> invalid_reason(int arch) const;

  bool operator==(const DecodeSplitConfig& other) const { return name() == other.name(); }
};

void to_json(nlohmann::json& j, const DecodeSplitConfig& config);    // the module's JSON and "splits"
void from_json(const nlohmann::json& j, DecodeSplitConfig& config);  // throws Error on bad fields

using TunedConfig = std::variant<KernelConfig, BwdConfig, DecodeSplitConfig>;

template <class Config>
inline constexpr bool kIsTunedConfig = std::is_same_v<Config, KernelConfig> || std::is_same_v<Config, BwdConfig> ||
                                       std::is_same_v<Config, DecodeSplitConfig>;

std::string config_name(const TunedConfig& config);

// A tuned config equals a config when it holds that very config.
template <class Config, class = std::enable_if_t<kIsTunedConfig<Config>>>
bool operator==(const TunedConfig& tuned, const Config& config) {
  const Config* held = std::get_if<Config>(&tuned);
  return held != nullptr && *held == config;
}
template <class Config, class = std::enable_if_t<kIsTunedConfig<Config>>>
bool operator==(const Config& config, const TunedConfig& tuned) {
  return tuned == config;
}
template <class Config, class = std::enable_if_t<kIsTunedConfig<Config>>>
bool operator!=(const TunedConfig& tuned, const Config& config) {
  return !(tuned == config);
}
bool is_backward(const TunedConfig& config);

// The compiled module a config of any pass names: itself, or a decode choice's module (in a visit of a
// TunedConfig: its dtype, head_dim, mask, compiled kernel).
template <class Config, class = std::enable_if_t<!std::is_same_v<Config, DecodeSplitConfig>>>
const Config& kernel_config_of(const Config& config) {
  return config;
}
inline const DecodeConfig& kernel_config_of(const DecodeSplitConfig& tuned) { return tuned.config; }

// Why a config cannot run on sm_<arch>, or nullopt.
std::optional<std::string> invalid_reason(const TunedConfig& config, int arch);

// Whether a config is of the pass a problem key names (the backward with its dQ strategy; a packed forward's or a
// KV-cache key's kernels with its cache layout).
bool same_pass(const KernelConfig& config, const ProblemKey& problem);
bool same_pass(const BwdConfig& config, const ProblemKey& problem);
bool same_pass(const DecodeSplitConfig& config, const ProblemKey& problem);
// Whether a config is one of the problem's: its pass, dtype, head_dim and mask.
bool of_problem(const TunedConfig& config, const ProblemKey& problem);

void to_json(nlohmann::json& j, const TunedConfig& config);
// Reads a config by its "family" (forward when absent); throws Error on bad fields.
void from_json(const nlohmann::json& j, TunedConfig& config);

}  // namespace flashgen
