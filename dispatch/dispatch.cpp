// Dispatch of both passes and of KV-cache calls: the planner's sources (the process's choice, tune-on-first-use, the
// kernel registry's spill reports, the config's can_implement), and the per-process store of prepared launches that
// keeps a warm call to a few driver calls.
#include "dispatch/dispatch.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dispatch/planner.hpp"
#include "dispatch/select.hpp"
#include "flashgen/error.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {

namespace {

// The sm80 family's candidates, for problems the chosen family cannot implement.
std::vector<KernelConfig> sm80_candidates(const ForwardCall& call, int arch) {
  const AttentionProblem& p = call.problem;
  return heuristic_candidates(p.dtype, p.head_dim(), p.mask_kind(), arch, /*sm80_only=*/true, p.varlen,
                              p.score_mods(), p.value_dim());
}

std::vector<BwdConfig> sm80_candidates(const BackwardCall& call, int arch) {
  const AttentionProblem& p = call.problem;
  return heuristic_backward_candidates(p.dtype, p.head_dim(), p.mask_kind(), p.deterministic(), arch,
                                       /*sm80_only=*/true, p.varlen, p.score_mods(), p.value_dim());
}

// The call's arguments of its user variant, from its params' variant arguments (the variant's counts of them).
UserVariantArgs user_args_of(const AttentionProblem& problem, const VariantArgs& v) {
  UserVariantArgs args;
  args.buffers.assign(v.user_buffers, v.user_buffers + problem.user->buffers.size());
  args.scalars.assign(v.user_scalars, v.user_scalars + problem.user->scalars.size());
  return args;
}

// The arguments a first-use sweep of a user variant calls its functions with: the call's own, once the work queued on
// its stream (which may still be writing them) is done; the sweep runs on a stream of its own.
template <class Call>
UserVariantArgs first_use_args(const Call& call, CUstream stream) {
  if (!call.problem.user) return {};
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  return user_args_of(call.problem, call.params.variant);
}

// The planner's sources that differ by pass: the process's choice, the first-use sweep, the kernel registry's spill
// reports, the paged step's read_through_pages.
PlanSources<ForwardChoice> pass_sources(const ForwardCall& call, CUstream stream, int device, int arch) {
  PlanSources<ForwardChoice> sources;
  sources.choose = [device, arch](const ProblemKey& key) { return choose_forward_config(device, key, arch); };
  sources.tune = [&call, stream, device, arch](std::string* failure) {
    const UserVariantArgs args = first_use_args(call, stream);
    return tune_forward_on_first_use(call.problem, device, arch, failure, false, &args);
  };
  sources.spilled_bytes = compiled_spills(arch);
  sources.read_through_pages = [arch](ForwardChoice choice) {
    return read_through_pages(std::move(choice), arch, compiled_spills(arch));
  };
  return sources;
}

PlanSources<BackwardChoice> pass_sources(const BackwardCall& call, CUstream stream, int device, int arch) {
  PlanSources<BackwardChoice> sources;
  sources.choose = [device, arch](const ProblemKey& key) { return choose_backward_config(device, key, arch); };
  sources.tune = [&call, stream, device, arch](std::string* failure) {
    const UserVariantArgs args = first_use_args(call, stream);
    return tune_backward_on_first_use(call.problem, device, arch, failure, &args);
  };
  sources.spilled_bytes = compiled_backward_spills(arch);
  return sources;
}

// The planner (planner.hpp) of a call in scope's context on sm_<arch>, with the process's sources: no first-use sweep
// while the switch is off, none but a plan that is not final while the stream captures a graph.
template <class Call>
auto plan_in_scope(const Call& call, const ScopedContext& scope, CUstream stream, int arch) {
  auto sources = pass_sources(call, stream, static_cast<int>(scope.device()), arch);
  sources.arch = arch;
  if (!tune_on_first_use()) {
    sources.tune = nullptr;
  } else {
    sources.tuning_deferred = stream_capturing(stream);
  }
  const DeviceTraits& device = device_traits(scope.device());
  sources.can_implement = [&call, &device](const auto& config) {
    return config.can_implement(call.problem, call.params, device);
  };
  sources.sm80_candidates = [&call, arch] { return sm80_candidates(call, arch); };
  return plan_call(call, sources);
}

// A problem class: everything of a call but its data pointers, in one context. Two calls of one class
// make the same choice, the same checks pass for both, and they launch the same kernel on the same grid.
struct ClassKey {
  unsigned long long context_id = 0;
  std::array<int64_t, 56> values{};

  bool operator<(const ClassKey& other) const {
    return std::tie(context_id, values) < std::tie(other.context_id, other.values);
  }
};

// The values of the key: the problem's sizes and options, then each tensor's three strides (and for the forward
// whether a packed batch has seqused_k, and its paged cache's shape). A window's sides and chunk are among the
// options: the kept launch's params are rebuilt from each call, but its config was chosen for the window's
// bucket.
template <class Params>
ClassKey class_key(const ScopedContext& scope, const AttentionProblem& problem, const Params& p,
                   std::initializer_list<int64_t> strides) {
  ClassKey key;
  FLASHGEN_CU_CHECK(cuCtxGetId(scope.context(), &key.context_id));
  int32_t scale_bits = 0, softcap_bits = 0;
  std::memcpy(&scale_bits, &p.variant.scale, sizeof scale_bits);
  std::memcpy(&softcap_bits, &problem.softcap, sizeof softcap_bits);
  const AttentionShape& s = problem.shape;
  const int64_t head[] = {static_cast<int64_t>(problem.dtype), static_cast<int64_t>(problem.kv_dtype()),
                          static_cast<int64_t>(problem.output_dtype()), s.head_dim,
                          s.value_dim(),
                          static_cast<int64_t>(problem.mask),
                          problem.deterministic(), s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv,
                          scale_bits, problem.varlen,
                          problem.total_q, problem.total_k, softcap_bits, problem.window_left, problem.window_right,
                          problem.attention_chunk, problem.alibi, problem.sink_grad,
                          static_cast<int64_t>(reinterpret_cast<std::intptr_t>(problem.user.get()))};
  size_t i = 0;
  for (int64_t v : head) key.values[i++] = v;
  for (int64_t v : strides) key.values[i++] = v;
  return key;
}

ClassKey class_key(const ForwardCall& call, const ScopedContext& scope) {
  const AttnFwdParams& p = call.params;
  return class_key(scope, call.problem, p,
                   {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride, p.k_row_stride,
                    p.k_head_stride, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.o_batch_stride,
                    p.o_row_stride, p.o_head_stride, p.seqused_k != nullptr, p.block_table != nullptr,
                    p.block_table_stride, p.k_page_stride, p.v_page_stride, p.page_size, p.num_pages});
}

ClassKey class_key(const BackwardCall& call, const ScopedContext& scope) {
  const AttnBwdParams& p = call.params;
  return class_key(scope, call.problem, p,
                   {p.q_batch_stride,  p.q_row_stride,  p.q_head_stride,  p.k_batch_stride,  p.k_row_stride,
                    p.k_head_stride,   p.v_batch_stride,  p.v_row_stride,  p.v_head_stride,  p.o_batch_stride,
                    p.o_row_stride,    p.o_head_stride,   p.do_batch_stride, p.do_row_stride, p.do_head_stride,
                    p.dq_batch_stride, p.dq_row_stride,   p.dq_head_stride,  p.dk_batch_stride, p.dk_row_stride,
                    p.dk_head_stride,  p.dv_batch_stride, p.dv_row_stride,   p.dv_head_stride,
                    // a block mask keeps the user mask's classes out of the workspace, whose size the plan holds
                    call.block_mask != nullptr,
                    // an FP8 call widens q, k and v first (a kernel and workspace of its own)
                    p.fp8_format});
}

// A prepared launch kept for its problem class, with what the call reports.
template <class Prepared, class Launch>
struct Kept {
  Prepared prepared;
  Launch launch;
  uint64_t generation = 0;  // choice_generation() when it was planned
};

// The kept launches of one pass. Bounded: a program that calls with ever new sizes starts it afresh.
template <class Entry>
class KeptLaunches {
 public:
  std::shared_ptr<const Entry> find(const ClassKey& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = entries_.find(key);
    if (found == entries_.end() || found->second->generation != choice_generation()) return nullptr;
    return found->second;
  }

  void keep(const ClassKey& key, std::shared_ptr<const Entry> entry) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= kMaxEntries) entries_.clear();
    entries_[key] = std::move(entry);
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  mutable std::mutex mutex_;
  std::map<ClassKey, std::shared_ptr<const Entry>> entries_;
};

using KeptForward = Kept<PreparedForward, ForwardLaunch>;
using KeptBackward = Kept<PreparedBackward, BackwardLaunch>;
using KeptKvCache = Kept<PreparedKvCache, KvCacheLaunch>;

ClassKey class_key(const KvCacheCall& call, const ScopedContext& scope) {
  const AttnDecodeParams& p = call.params;
  return class_key(scope, call.problem, p,
                   {p.q_batch_stride,  p.q_row_stride,  p.q_head_stride,  p.k_batch_stride,  p.k_row_stride,
                    p.k_head_stride,   p.v_batch_stride,  p.v_row_stride,  p.v_head_stride,  p.o_batch_stride,
                    p.o_row_stride,    p.o_head_stride,   p.kn_batch_stride, p.kn_row_stride, p.kn_head_stride,
                    p.vn_batch_stride, p.vn_row_stride,   p.vn_head_stride,  p.block_table_stride, p.page_size,
                    p.num_pages,       p.seqlen_new,      call.problem.paged, p.cache_seqlens != nullptr,
                    call.num_splits,   p.causal_bottom_right});
}

template <class Entry>
KeptLaunches<Entry>& kept_launches() {
  static KeptLaunches<Entry> kept;
  return kept;
}

// The launcher's preparation of a chosen config, and what a call of each pass reports about it.
PreparedForward prepare(const ForwardCall& call, CUstream stream, const KernelConfig& config) {
  return prepare_forward(call, stream, config);
}

PreparedBackward prepare(const BackwardCall& call, CUstream stream, const BwdConfig& config) {
  return prepare_backward(call, stream, config);
}

ForwardLaunch report_of(ForwardChoice&& choice, int arch, const PreparedForward&) {
  return {std::move(choice.config), arch, std::move(choice.reason), choice.source};
}

BackwardLaunch report_of(BackwardChoice&& choice, int arch, const PreparedBackward& prepared) {
  return {std::move(choice.config), arch, std::move(choice.reason), choice.source, prepared.workspace_bytes};
}

// The kept launch of problem's class, prepared (and kept) now when there is none.
template <class Entry, class Call>
std::shared_ptr<const Entry> launch_of(const Call& call, const ScopedContext& scope, CUstream stream) {
  KeptLaunches<Entry>& kept = kept_launches<Entry>();
  const ClassKey key = class_key(call, scope);
  if (auto found = kept.find(key)) return found;
  // Read before planning: a tuning result stored while this call plans leaves the entry stale, not lost.
  const uint64_t generation = choice_generation();
  const int arch = launch_arch(scope.device());
  auto plan = plan_in_scope(call, scope, stream, arch);
  auto entry = std::make_shared<Entry>();
  entry->prepared = prepare(call, stream, plan.choice.config);
  entry->launch = report_of(std::move(plan.choice), arch, entry->prepared);
  entry->generation = generation;
  if (plan.final) kept.keep(key, entry);
  return entry;
}

}  // namespace

ForwardPlan plan_forward(const ForwardCall& call, CUstream stream) {
  const ScopedContext scope(stream, call.params.q);
  const std::shared_ptr<const KeptForward> kept = launch_of<KeptForward>(call, scope, stream);
  return {kept->launch, kept->prepared};
}

ForwardLaunch attention_forward(const ForwardCall& call, CUstream stream) {
  const ScopedContext scope(stream, call.params.q);
  const std::shared_ptr<const KeptForward> kept = launch_of<KeptForward>(call, scope, stream);
  PreparedForward prepared = kept->prepared;
  prepared.rebind(call, static_cast<int>(scope.device()));
  prepared(stream);
  return kept->launch;
}

ForwardLaunch attention_forward(const ForwardCall& call, CUstream stream, const KernelConfig& requested) {
  const ScopedContext scope(stream, call.params.q);
  const PreparedForward prepared = prepare_forward(call, stream, requested);
  prepared(stream);
  return {requested, prepared.arch, "requested by the caller", ChoiceSource::kRequested};
}

ForwardLaunch attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                float* lse, const CallOptions& opts, CUstream stream) {
  return attention_forward(make_forward_call(&q, &k, &v, &out, lse, &opts), stream);
}

ForwardLaunch attention_forward(const VarlenForwardArgs& args, CUstream stream) {
  return attention_forward(make_varlen_forward_call(args), stream);
}

BackwardPlan plan_backward(const BackwardCall& call, CUstream stream) {
  const ScopedContext scope(stream, call.params.q);
  const std::shared_ptr<const KeptBackward> kept = launch_of<KeptBackward>(call, scope, stream);
  return {kept->launch, kept->prepared};
}

BackwardLaunch attention_backward(const BackwardCall& call, CUstream stream, CUdeviceptr workspace,
                                  size_t workspace_bytes) {
  check_workspace_alignment(workspace);  // before anything needs a GPU
  const ScopedContext scope(stream, call.params.q);
  const std::shared_ptr<const KeptBackward> kept = launch_of<KeptBackward>(call, scope, stream);
  PreparedBackward prepared = kept->prepared;
  const int device = static_cast<int>(scope.device());
  prepared.rebind(call, device);
  launch_prepared_backward(prepared, stream, device, workspace, workspace_bytes);
  return kept->launch;
}

BackwardLaunch attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                  const TensorView& dout, const float* lse, const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv, const CallOptions& opts, CUstream stream,
                                  CUdeviceptr workspace, size_t workspace_bytes) {
  return attention_backward(make_backward_call(&q, &k, &v, &out, &dout, lse, &dq, &dk, &dv, &opts), stream, workspace,
                            workspace_bytes);
}

BackwardLaunch attention_backward(const VarlenBackwardArgs& args, CUstream stream) {
  return attention_backward(make_varlen_backward_call(args), stream);
}

KvCachePlan plan_kvcache(const KvCacheCall& call, CUstream stream) {
  const ScopedContext scope(stream, call.params.q);
  const int arch = launch_arch(scope.device());
  const DeviceTraits& device = device_traits(scope.device());
  const DecodeChoice choice = plan_call(call, [&] {
    return choose_decode_config(static_cast<int>(scope.device()), call.problem, arch, device.multiprocessors);
  });
  KvCachePlan plan;
  plan.launch.config = choice.config;
  plan.launch.arch = arch;
  plan.launch.reason = choice.reason;
  plan.launch.source = choice.source;
  plan.prepared = prepare_kvcache(call, stream, choice.config, choice.splits);
  plan.launch.splits = plan.prepared.splits;
  plan.launch.workspace_bytes = plan.prepared.workspace_bytes;
  return plan;
}

namespace {

// The kept launch of a KV-cache call's problem class, planned (and kept) now when there is none.
std::shared_ptr<const KeptKvCache> kept_kvcache(const KvCacheCall& call, const ScopedContext& scope, CUstream stream) {
  KeptLaunches<KeptKvCache>& kept = kept_launches<KeptKvCache>();
  const ClassKey key = class_key(call, scope);
  if (auto found = kept.find(key)) return found;
  const uint64_t generation = choice_generation();
  KvCachePlan plan = plan_kvcache(call, stream);
  auto entry = std::make_shared<KeptKvCache>();
  entry->prepared = std::move(plan.prepared);
  entry->launch = std::move(plan.launch);
  entry->generation = generation;
  kept.keep(key, entry);
  return entry;
}

}  // namespace

size_t kvcache_workspace_size(const KvCacheArgs& args, CUstream stream) {
  const KvCacheCall call = make_kvcache_call(args);
  const ScopedContext scope(stream, call.params.q);
  return kept_kvcache(call, scope, stream)->launch.workspace_bytes;
}

KvCacheLaunch attention_kvcache(const KvCacheArgs& args, CUstream stream) {
  const KvCacheCall call = make_kvcache_call(args);
  const ScopedContext scope(stream, call.params.q);
  const int device = static_cast<int>(scope.device());
  // A warm call of a kept problem class only checks its pointers and launches.
  const std::shared_ptr<const KeptKvCache> entry = kept_kvcache(call, scope, stream);
  PreparedKvCache prepared = entry->prepared;
  prepared.rebind(call, device);
  launch_prepared_kvcache(prepared, call, stream, device);
  return entry->launch;
}

}  // namespace flashgen
