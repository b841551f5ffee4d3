// TunedConfig: name, JSON and problem match of a config of any pass.
#include "tuner/tuned_config.hpp"

#include "flashgen/error.hpp"
#include "generator/kernel_module.hpp"

namespace flashgen {

namespace {

constexpr const char* kSplitSuffix = "_split";
}  // namespace

std::string DecodeSplitConfig::name() const { return config.name() + kSplitSuffix + std::to_string(splits); }

DecodeSplitConfig DecodeSplitConfig::from_name(const std::string& name) {
  const size_t at = name.rfind(kSplitSuffix);
  FLASHGEN_REQUIRE(at != std::string::npos && at + 6 < name.size(),
                   "config name '" + name + "': a tuned decode config ends in _split<N> (key ranges per sequence)");
  const std::string count = name.substr(at + 6);
  FLASHGEN_REQUIRE(count.find_first_not_of("0123456789") == std::string::npos && count.size() <= 4,
                   "config name '" + name + "': _split must be followed by a count, got '" + count + "'");
  DecodeSplitConfig tuned{DecodeConfig::from_name(name.substr(0, at)), std::stoi(count)};
  FLASHGEN_REQUIRE(tuned.name() == name,
                   "config name '" + name + "' is not canonical; did you mean '" + tuned.name() + "'?");
  return tuned;
}

std::optional<std::string> DecodeSplitConfig::invalid_reason(int arch) const {
  if (splits < 1 || splits > kMaxDecodeSplits) {
    return "splits must be 1 to " + std::to_string(kMaxDecodeSplits) + ", got " + std::to_string(splits);
  }
  return config.invalid_reason(arch);
}

void to_json(nlohmann::json& j, const DecodeSplitConfig& c) {
  j = c.config;
  j["splits"] = c.splits;
}

void from_json(const nlohmann::json& j, DecodeSplitConfig& c) {
  FLASHGEN_REQUIRE(j.is_object() && j.contains("splits") && is_int_field(j["splits"]),
                   "tuned decode config JSON: 'splits' must be an integer");
  nlohmann::json module = j;
  module.erase("splits");
  c = DecodeSplitConfig{module.get<DecodeConfig>(), j["splits"].get<int>()};
}

std::string config_name(const TunedConfig& config) {
  return std::visit([](const auto& c) { return c.name(); }, config);
}

bool is_backward(const TunedConfig& config) { return std::holds_alternative<BwdConfig>(config); }

std::optional<std::string> invalid_reason(const TunedConfig& config, int arch) {
  return std::visit([&](const auto& c) { return c.invalid_reason(arch); }, config);
}

bool same_pass(const KernelConfig& config, const ProblemKey& problem) {
  return problem.pass == Pass::kForward && !problem.kv_cache && config.varlen == problem.varlen &&
         config.paged == problem.paged;
}
bool same_pass(const BwdConfig& config, const ProblemKey& problem) {
  return problem.pass == Pass::kBackward && config.deterministic == (problem.dq == DqStrategy::kDeterministic) &&
         config.varlen == problem.varlen;
}
bool same_pass(const DecodeSplitConfig& config, const ProblemKey& problem) {
  return problem.kv_cache && config.config.paged == problem.paged && config.config.cache_dtype == problem.cache_dtype;
}

bool of_problem(const TunedConfig& config, const ProblemKey& problem) {
  return std::visit(
      [&](const auto& c) {
        const auto& module = kernel_config_of(c);
        return same_pass(c, problem) && module.dtype == problem.dtype && module.head_dim == problem.head_dim &&
               module.value_dim() == problem.value_dim() && module.mask == problem.mask &&
               module.mods == problem.mods;
      },
      config);
}

void to_json(nlohmann::json& j, const TunedConfig& config) {
  std::visit([&](const auto& c) { j = c; }, config);
}

void from_json(const nlohmann::json& j, TunedConfig& config) {
  const std::string family = j.is_object() && j.contains("family") && j["family"].is_string()
                                 ? j["family"].get<std::string>()
                                 : std::string();
  if (family.rfind("bwd_", 0) == 0) {
    config = j.get<BwdConfig>();
  } else if (family.rfind("dec_", 0) == 0) {
    config = j.get<DecodeSplitConfig>();
  } else {
    config = j.get<KernelConfig>();
  }
}

}  // namespace flashgen
