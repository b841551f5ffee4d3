// The kernel modules a tune compiles, named ahead of it on any machine: `flashgen compile --spec` compiles them into
// the kernel cache on CPU nodes, so that `flashgen tune` on GPU nodes of the same arch finds every one there.
#pragma once

#include <variant>
#include <vector>

#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"
#include "problem/attention_problem.hpp"
#include "tuner/tune.hpp"

namespace flashgen {

// One compiled module, as the kernel registry builds it: a forward kernel, a backward module or a decode module.
using KernelModule = std::variant<KernelConfig, BwdConfig, DecodeConfig>;

// The forward a backward sweep runs before its candidates, for the outputs and LSE they read: the built-in choice of
// the problem's class on sm_<arch> (heuristic_choice, compiling its configs to see which spill), its user variant
// compiled in.
KernelConfig backward_sweep_forward(const AttentionProblem& problem, int arch);

// The modules tune compiles on sm_<arch> for plan (plan_tune's, of problem), each once, in plan order: every
// candidate as its sweep runs it (the problem's user variant compiled in; a KV-cache candidate's module, whatever its
// split count) unless it cannot run on sm_<arch>, then a backward problem's forward (backward_sweep_forward). The
// built-in choices plan_tune weighed were compiled while it planned. Needs no GPU.
std::vector<KernelModule> tune_modules(const AttentionProblem& problem, const TunePlan& plan, int arch);

// The modules of the incumbents a tune on a GPU of sm_<arch> may start from that the plan lacks: the shipped
// defaults' winners of the problem's class on every GPU of that arch (tune() sweeps the one for its GPU and bucket,
// or the nearest bucket). A tuning database's winners are the GPU node's own, compiled when they were swept.
std::vector<KernelModule> shipped_incumbent_modules(const AttentionProblem& problem, const TunePlan& plan, int arch,
                                                    const ShippedDefaults& shipped);

}  // namespace flashgen
