// The kernel modules of a tune: its plan's candidates as the sweep compiles them, and what the sweep's checks run.
#include "tuner/tune_modules.hpp"

#include <set>
#include <string>

#include "tuner/choice.hpp"
#include "tuner/sweep.hpp"

namespace flashgen {

KernelConfig backward_sweep_forward(const AttentionProblem& problem, int arch) {
  ForwardChoice choice = heuristic_choice(problem.dtype, problem.head_dim(), problem.mask_kind(), arch, false,
                                          problem.varlen, problem.score_mods(), problem.value_dim());
  if (problem.user) attach_user_variant(choice, problem.user, arch);
  return choice.config;
}

std::vector<KernelModule> tune_modules(const AttentionProblem& problem, const TunePlan& plan, int arch) {
  std::vector<KernelModule> modules;
  std::set<std::string> names;
  auto add = [&](const auto& config) {
    if (names.insert(config.name()).second) modules.emplace_back(config);
  };
  for (TunedConfig candidate : plan.candidates) {
    set_user(candidate, problem.user);  // the dense sweeps' with_problem_user; packed and decode problems have none
    if (invalid_reason(candidate, arch)) continue;  // the sweep skips it without compiling
    std::visit([&](const auto& config) { add(kernel_config_of(config)); }, candidate);
  }
  if (problem.backward()) add(backward_sweep_forward(problem, arch));
  return modules;
}

std::vector<KernelModule> shipped_incumbent_modules(const AttentionProblem& problem, const TunePlan& plan, int arch,
                                                    const ShippedDefaults& shipped) {
  std::set<std::string> planned;
  for (const KernelModule& m : tune_modules(problem, plan, arch))
    std::visit([&](const auto& config) { planned.insert(config.name()); }, m);
  std::vector<KernelModule> modules;
  for (const StoredChoice& winner : shipped.winners()) {
    if (winner.device.sm != arch || winner.problem.class_id() != plan.key.class_id()) continue;
    TunedConfig config = winner.config;
    if (config.index() != plan.builtin.index() || !of_problem(config, plan.key)) continue;
    set_user(config, problem.user);
    if (invalid_reason(config, arch)) continue;
    std::visit([&](const auto& c) {
      const auto& module = kernel_config_of(c);
      if (planned.insert(module.name()).second) modules.emplace_back(module);
    }, config);
  }
  return modules;
}

}  // namespace flashgen
