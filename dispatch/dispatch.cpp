// Dispatch of both passes and of KV-cache calls: the run-time choice, tune-on-first-use, the fallbacks in one
// order, and the per-process store of prepared launches that keeps a warm call to a few driver calls.
#include "dispatch/dispatch.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dispatch/select.hpp"
#include "flashgen/error.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"
#include "tuner/decode_choice.hpp"

namespace flashgen {

namespace {

// The sm80 family's built-in choice, for problems the chosen family cannot implement.
ForwardChoice sm80_fallback(const ForwardCall& call, int arch) {
  const AttentionProblem& p = call.problem;
  return heuristic_choice(p.dtype, p.head_dim(), p.mask_kind(), arch, /*sm80_only=*/true, p.varlen, p.score_mods());
}

BackwardChoice sm80_fallback(const BackwardCall& call, int arch) {
  const AttentionProblem& p = call.problem;
  return heuristic_backward_choice(p.dtype, p.head_dim(), p.mask_kind(), p.deterministic(), arch, /*sm80_only=*/true,
                                   p.varlen, p.score_mods());
}

// The kTileCount fallback: the same tiles, one block each instead of a persistent walk (groups walk a
// persistent list too). Only the sm90 family has persistent kernels; the backward has none.
void without_persistence(KernelConfig& config) {
  Sm90Knobs* k = config.sm90();
  if (k == nullptr) {
    fail(Status::kInternal, "config " + config.name() + " reported too many tiles for a persistent walk");
  }
  k->persistent = false;
  k->groups = 1;
}

void without_persistence(BwdConfig& config) {
  fail(Status::kInternal, "backward config " + config.name() + " reported too many tiles for a persistent walk");
}

// Step (3) of both passes: until the choice's family can implement the problem, take the fallback for what
// it lacks, saying so in the reason.
template <class Call, class Choice>
void apply_fallbacks(const Call& call, Choice& choice, int arch, const DeviceTraits& device) {
  // Each fallback removes its shortfall for good (the sm80 family uses no TMA and is never persistent).
  for (int step = 0; step < 3; ++step) {
    const Implementability answer = can_implement(call, choice.config, device);
    switch (answer.shortfall) {
      case Shortfall::kNone:
        return;
      case Shortfall::kTmaLayout: {
        Choice fallback = sm80_fallback(call, arch);
        choice.reason += "; TMA cannot describe " + answer.reason + ", so the sm80 family's " + fallback.reason;
        choice.config = std::move(fallback.config);
        choice.source = fallback.source;
        break;
      }
      case Shortfall::kTileCount:
        without_persistence(choice.config);
        choice.reason += "; not persistent: too many tiles";
        break;
    }
  }
  fail(Status::kInternal, "no fallback lets a kernel family implement the problem with " + choice.config.name());
}

// A packed batch over a paged cache reads keys and values through the block table: its paged class's tuned
// config as it is, or the contiguous class's (or a fallback's) made paged, where it can be (tuner/choice.hpp's
// read_through_pages). The backward has no paged kernels.
void read_through_pages(const ForwardCall& call, ForwardChoice& choice, int arch) {
  if (call.problem.paged) choice = flashgen::read_through_pages(std::move(choice), arch);
}

void read_through_pages(const BackwardCall&, BackwardChoice&, int) {}

// The call's arguments of its user variant, from its params (the variant's counts of them).
template <class Params>
UserVariantArgs user_args_of(const AttentionProblem& problem, const Params& p) {
  UserVariantArgs args;
  args.buffers.assign(p.user_buffers, p.user_buffers + problem.user->buffers.size());
  args.scalars.assign(p.user_scalars, p.user_scalars + problem.user->scalars.size());
  return args;
}

// The arguments a first-use sweep of a user variant calls its functions with: the call's own, once the work queued on
// its stream (which may still be writing them) is done; the sweep runs on a stream of its own.
template <class Call>
UserVariantArgs first_use_args(const Call& call, CUstream stream) {
  if (!call.problem.user) return {};
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  return user_args_of(call.problem, call.params);
}

std::optional<ForwardChoice> tune_on_first_use_of(const ForwardCall& call, CUstream stream, int device, int arch,
                                                  std::string* failure) {
  const UserVariantArgs args = first_use_args(call, stream);
  return tune_forward_on_first_use(call.problem, device, arch, failure, false, &args);
}

std::optional<BackwardChoice> tune_on_first_use_of(const BackwardCall& call, CUstream stream, int device, int arch,
                                                   std::string* failure) {
  const UserVariantArgs args = first_use_args(call, stream);
  return tune_backward_on_first_use(call.problem, device, arch, failure, &args);
}

// The process's choice for a key of the call's pass.
ForwardChoice choice_for_key(int device, const ProblemKey& key, int arch, const ForwardCall*) {
  return choose_forward_config(device, key, arch);
}

BackwardChoice choice_for_key(int device, const ProblemKey& key, int arch, const BackwardCall*) {
  return choose_backward_config(device, key, arch);
}

bool tuned(ChoiceSource source) {
  return source == ChoiceSource::kTuningDatabase || source == ChoiceSource::kTunedOnFirstUse;
}

// The process's choice for a call. A dense call with a user variant takes the variant's own tuning data (its key
// carries the variant's tag; *variant_data is set), else its base class's choice, which is not the variant's own
// bucket (so tune-on-first-use still tunes the variant).
template <class Call>
auto process_choice(const Call& call, int device, int arch, bool* variant_data) {
  ProblemKey key = problem_key(call.problem);
  auto choice = choice_for_key(device, key, arch, &call);
  *variant_data = !key.user_tag.empty() && tuned(choice.source);
  if (key.user_tag.empty() || *variant_data) return choice;
  key.user_tag.clear();
  choice = choice_for_key(device, key, arch, &call);
  // Not the variant's own data, whatever the base class's was: tune-on-first-use still tunes the variant.
  choice.exact_bucket = false;
  if (choice.source == ChoiceSource::kTunedOnFirstUse) choice.source = ChoiceSource::kTuningDatabase;
  choice.reason = "its base class's choice: " + choice.reason;
  return choice;
}

// A user variant's functions join the tiles chosen for it: as they are where they were timed with them (the
// variant's own data), else through attach_user_variant (the base class's tiles, or others of the base class
// where those spill with the functions).
template <class Choice>
void with_user_variant(const AttentionProblem& problem, Choice& choice, int arch, bool variant_data) {
  if (!problem.user) return;
  if (!variant_data) return attach_user_variant(choice, problem.user, arch);
  choice.config.user = problem.user;
  choice.reason += "; with the user variant " + problem.user->tag + " compiled in";
}

// Steps (1) to (3) for a problem in scope's context. final is false when tune-on-first-use had to be skipped
// (the stream captures a graph): such a plan serves this call but is not kept for the next.
template <class Choice>
struct Plan {
  Choice choice;
  int arch = 0;
  bool final = true;
};

template <class Call>
auto plan_in_scope(const Call& call, const ScopedContext& scope, CUstream stream) {
  const int device = static_cast<int>(scope.device());
  const int arch = launch_arch(scope.device());
  bool variant_data = false;
  Plan<decltype(process_choice(call, device, arch, &variant_data))> plan{
      process_choice(call, device, arch, &variant_data), arch};
  // A packed or KV-cache call with a user variant runs its base class's choice: their sweeps do not take one.
  if (call.problem.user == nullptr || !user_key_tag(call.problem).empty()) {
    if (tune_on_first_use() && stream_capturing(stream)) {
      plan.final = false;
    } else {
      apply_tune_on_first_use(plan.choice, [&](std::string* failure) {
        auto swept = tune_on_first_use_of(call, stream, device, arch, failure);
        variant_data = variant_data || (swept && call.problem.user != nullptr);
        return swept;
      });
    }
  }
  apply_fallbacks(call, plan.choice, arch, device_traits(scope.device()));
  read_through_pages(call, plan.choice, arch);
  with_user_variant(call.problem, plan.choice, plan.arch, variant_data);
  if (call.problem.user) {
    // Tiles taken for the variant's spills come from the heuristic's list: what the fallbacks removed (a persistent
    // walk past the tile counters) is removed from them again, in place, the variant kept.
    apply_fallbacks(call, plan.choice, arch, device_traits(scope.device()));
    plan.choice.config.user = call.problem.user;
  }
  return plan;
}

// A problem class: everything of a call but its data pointers, in one context. Two calls of one class
// make the same choice, the same checks pass for both, and they launch the same kernel on the same grid.
struct ClassKey {
  unsigned long long context_id = 0;
  std::array<int64_t, 48> values{};

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
  std::memcpy(&scale_bits, &p.scale, sizeof scale_bits);
  std::memcpy(&softcap_bits, &problem.softcap, sizeof softcap_bits);
  const AttentionShape& s = problem.shape;
  const int64_t head[] = {static_cast<int64_t>(problem.dtype), s.head_dim, static_cast<int64_t>(problem.mask),
                          problem.deterministic(), s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv,
                          scale_bits, problem.varlen,
                          problem.total_q, problem.total_k, softcap_bits, problem.window_left, problem.window_right,
                          problem.attention_chunk, problem.alibi,
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
                    call.block_mask != nullptr});
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
  auto [choice, arch, final] = plan_in_scope(call, scope, stream);
  auto entry = std::make_shared<Entry>();
  entry->prepared = prepare(call, stream, choice.config);
  entry->launch = report_of(std::move(choice), arch, entry->prepared);
  entry->generation = generation;
  if (final) kept.keep(key, entry);
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

ForwardLaunch attention_forward(const flashgen_tensor& q, const flashgen_tensor& k, const flashgen_tensor& v,
                                const flashgen_tensor& out, float* lse, const flashgen_attention_options& opts,
                                CUstream stream) {
  return attention_forward(make_forward_call(&q, &k, &v, &out, lse, &opts), stream);
}

ForwardLaunch attention_forward(const flashgen_varlen_forward_args& args, CUstream stream) {
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

BackwardLaunch attention_backward(const flashgen_tensor& q, const flashgen_tensor& k, const flashgen_tensor& v,
                                  const flashgen_tensor& out, const flashgen_tensor& dout, const float* lse,
                                  const flashgen_tensor& dq, const flashgen_tensor& dk, const flashgen_tensor& dv,
                                  const flashgen_attention_options& opts, CUstream stream, CUdeviceptr workspace,
                                  size_t workspace_bytes) {
  return attention_backward(make_backward_call(&q, &k, &v, &out, &dout, lse, &dq, &dk, &dv, &opts), stream, workspace,
                            workspace_bytes);
}

BackwardLaunch attention_backward(const flashgen_varlen_backward_args& args, CUstream stream) {
  return attention_backward(make_varlen_backward_call(args), stream);
}

KvCachePlan plan_kvcache(const KvCacheCall& call, CUstream stream) {
  const ScopedContext scope(stream, call.params.q);
  const int arch = launch_arch(scope.device());
  const DeviceTraits& device = device_traits(scope.device());
  DecodeChoice choice = choose_decode_config(static_cast<int>(scope.device()), call.problem, arch,
                                             device.multiprocessors);
  if (call.problem.user) {  // the base class's choice, with the user's functions compiled in
    choice.config.user = call.problem.user;
    choice.reason += "; with the user variant " + call.problem.user->tag + " compiled in";
  }
  if (call.num_splits > 0) choice = with_requested_splits(std::move(choice), call.problem, call.num_splits);
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

size_t kvcache_workspace_size(const flashgen_kvcache_args& args, CUstream stream) {
  const KvCacheCall call = make_kvcache_call(args);
  const ScopedContext scope(stream, call.params.q);
  return kept_kvcache(call, scope, stream)->launch.workspace_bytes;
}

KvCacheLaunch attention_kvcache(const flashgen_kvcache_args& args, CUstream stream) {
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
