// Dispatch of KV-cache (decode) calls: the built-in choice of config and split count for the call's device,
// a requested split count, then the launcher.
#include <string>

#include "dispatch/dispatch.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {

KvCachePlan plan_kvcache(const KvCacheCall& call, CUstream stream) {
  const ScopedContext scope(stream, call.params.q);
  const int arch = launch_arch(scope.device());
  const DeviceTraits& device = device_traits(scope.device());
  DecodeChoice choice = heuristic_decode_choice(call.problem, arch, device.multiprocessors);
  KvCachePlan plan;
  plan.launch.config = choice.config;
  plan.launch.arch = arch;
  plan.launch.reason = choice.reason;
  int splits = choice.splits;
  if (call.num_splits > 0) {
    splits = call.num_splits;
    plan.launch.reason += "; " + std::to_string(splits) + " key range" + (splits == 1 ? "" : "s") + " as requested";
  }
  plan.prepared = prepare_kvcache(call, stream, choice.config, splits);
  plan.launch.splits = plan.prepared.splits;
  plan.launch.workspace_bytes = plan.prepared.workspace_bytes;
  return plan;
}

KvCacheLaunch attention_kvcache(const flashgen_kvcache_args& args, CUstream stream) {
  const KvCacheCall call = make_kvcache_call(args);
  const ScopedContext scope(stream, call.params.q);
  KvCachePlan plan = plan_kvcache(call, stream);
  launch_prepared_kvcache(plan.prepared, call, stream, scope.device());
  return plan.launch;
}

}  // namespace flashgen
