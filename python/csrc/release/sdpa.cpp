// enable()'s overrides of SDPA's flash-attention pair (aten::_scaled_dot_product_flash_attention and its backward)
// as C++ kernels on torch's CUDA key, calling libflashgen's C ABI directly: a served call costs its allocations and
// the library's launch, no Python and no boxing. A call flashgen cannot serve, or one whose library call fails, runs
// torch's own kernel, captured before the override. flashgen/torch/_sdpa.py drives them through the extern "C"
// functions at the end (registration, counts, the last error); the FlashAttention-2 pair below stays in Python.
#include "native.hpp"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

namespace {

using at::Tensor;
using flashgen::torch_ops::kBhsd;
using flashgen::torch_ops::readable_in_place;
using flashgen::torch_ops::native::current_stream;
using flashgen::torch_ops::native::readable;

constexpr const char* kForwardOp = "aten::_scaled_dot_product_flash_attention";
constexpr const char* kBackwardOp = "aten::_scaled_dot_product_flash_attention_backward";

using ForwardResult = std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>;
using BackwardResult = std::tuple<Tensor, Tensor, Tensor>;

// What the overrides share: torch's own kernels, the GPUs flashgen serves, and what the calls did.
struct State {
  std::mutex lock;
  std::unique_ptr<torch::Library> library;  // the overrides while registered
  std::optional<c10::SafeKernelFunction> forward, backward;
  uint64_t sm80_devices = 0;  // bit d: device d is sm_80 or newer
  std::map<std::string, int64_t> counts[2];  // forward, backward: {"flashgen" or "fallback: <reason>": calls}
  std::string last_error;
};

State& state() {
  static State s;
  return s;
}

enum Direction { kForward = 0, kBackward = 1 };

thread_local bool falling_back = false;  // this thread runs torch's kernel for a call that fell back

void count(Direction direction, const std::string& outcome) {
  std::lock_guard<std::mutex> hold(state().lock);
  ++state().counts[direction][outcome];
}

// Why flashgen cannot take the call, or nullptr.
const char* unservable(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p) {
  if (dropout_p != 0.0) return "dropout";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return "not 4-d (nested tensors)";
  const auto type = q.scalar_type();
  if ((type != at::kHalf && type != at::kBFloat16) || k.scalar_type() != type || v.scalar_type() != type) {
    return "dtype";
  }
  const int64_t head_dim = q.size(3);
  if (head_dim % 8 != 0 || head_dim > 256 || k.size(3) != head_dim || v.size(3) != head_dim) return "head_dim";
  if (q.size(1) % k.size(1) != 0 || k.size(1) != v.size(1)) return "heads";
  if (q.numel() == 0 || k.numel() == 0) return "empty";
  const int index = q.get_device();
  if (index < 0 || index >= 64 || !((state().sm80_devices >> index) & 1)) return "GPU older than sm_80";
  return nullptr;
}

// A [batch, heads, seqlen, head_dim] tensor as the library's [batch, seqlen, heads, head_dim] view.
flashgen_tensor view(const Tensor& t) { return flashgen::torch_ops::view(t, kBhsd); }

flashgen_attention_options options(bool is_causal, std::optional<double> scale, bool deterministic) {
  flashgen_attention_options result{};
  result.size = sizeof(result);
  result.softmax_scale = static_cast<float>(scale.value_or(0.0));  // 0: 1/sqrt(head_dim), as SDPA's None
  result.mask = is_causal ? FLASHGEN_MASK_CAUSAL_TOP_LEFT : FLASHGEN_MASK_NONE;  // SDPA's is_causal is top-left
  result.deterministic = deterministic ? 1 : 0;
  result.window_left = result.window_right = -1;
  return result;
}

// Runs torch's own kernel for a call flashgen does not serve; calls made inside it are torch's too, uncounted.
void run_original(const c10::SafeKernelFunction& kernel, const char* op, torch::jit::Stack& stack) {
  static const c10::DispatchKeySet cuda(c10::DispatchKey::CUDA);
  const bool outer = !falling_back;
  falling_back = true;
  try {
    kernel.callBoxed(c10::Dispatcher::singleton().findSchemaOrThrow(op, ""), cuda, &stack);
  } catch (...) {
    falling_back = !outer;
    throw;
  }
  falling_back = !outer;
}

void library_failed(const char* call) {
  std::lock_guard<std::mutex> hold(state().lock);
  state().last_error = std::string(call) + ": " + flashgen_last_error();
}

ForwardResult forward_fallback(const char* reason, const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                               bool is_causal, bool return_debug_mask, std::optional<double> scale) {
  if (!falling_back) count(kForward, std::string("fallback: ") + reason);
  torch::jit::Stack stack{q, k, v, dropout_p, is_causal, return_debug_mask, scale};
  run_original(*state().forward, kForwardOp, stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor(), stack[3].toTensor(), stack[4].toSymInt(),
          stack[5].toSymInt(), stack[6].toTensor(), stack[7].toTensor(), stack[8].toTensor()};
}

ForwardResult forward_kernel(const Tensor& query, const Tensor& key, const Tensor& value, double dropout_p,
                             bool is_causal, bool return_debug_mask, std::optional<double> scale) {
  const char* reason = falling_back        ? ""
                       : return_debug_mask ? "debug mask"
                                           : unservable(query, key, value, dropout_p);
  if (reason != nullptr) {
    return forward_fallback(reason, query, key, value, dropout_p, is_causal, return_debug_mask, scale);
  }
  c10::DeviceGuard guard(query.device());
  const Tensor q = readable(query), k = readable(key), v = readable(value);
  Tensor out = at::empty_like(q);  // q's strides, as torch's kernel returns out
  if (!readable_in_place(out)) out = at::empty(q.sizes(), q.options());
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  const flashgen_tensor views[] = {view(q), view(k), view(v), view(out)};
  const flashgen_attention_options opts = options(is_causal, scale, false);
  if (flashgen_attention_forward(&views[0], &views[1], &views[2], &views[3], lse.data_ptr<float>(), &opts,
                                 current_stream(q.get_device())) != FLASHGEN_SUCCESS) {
    library_failed("flashgen_attention_forward");
    return forward_fallback("library error", query, key, value, dropout_p, is_causal, return_debug_mask, scale);
  }
  count(kForward, "flashgen");
  // The philox seed and offset and the debug mask: with no dropout never read, shaped as torch's meta kernel says.
  const auto uint64 = q.options().dtype(at::kUInt64);
  return {out, lse, Tensor(), Tensor(), c10::SymInt(q.size(2)), c10::SymInt(k.size(2)), at::empty({2}, uint64),
          at::empty({}, uint64), at::empty({0}, q.options())};
}

BackwardResult backward_kernel(const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
                               const Tensor& out, const Tensor& logsumexp, const Tensor& cum_seq_q,
                               const Tensor& cum_seq_k, c10::SymInt max_q, c10::SymInt max_k, double dropout_p,
                               bool is_causal, const Tensor& philox_seed, const Tensor& philox_offset,
                               std::optional<double> scale) {
  const char* reason = falling_back ? "" : unservable(query, key, value, dropout_p);
  if (reason == nullptr &&
      (logsumexp.scalar_type() != at::kFloat || logsumexp.dim() != 3 || logsumexp.size(0) != query.size(0) ||
       logsumexp.size(1) != query.size(1) || logsumexp.size(2) != query.size(2))) {
    reason = "logsumexp";
  }
  auto fall_back = [&](const char* why) -> BackwardResult {
    if (!falling_back) count(kBackward, std::string("fallback: ") + why);
    torch::jit::Stack stack{grad_out,       query,          key,          value,        out,
                            logsumexp,      cum_seq_q,      cum_seq_k,    std::move(max_q), std::move(max_k),
                            dropout_p,      is_causal,      philox_seed,  philox_offset, scale};
    run_original(*state().backward, kBackwardOp, stack);
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
  };
  if (reason != nullptr) return fall_back(reason);
  c10::DeviceGuard guard(query.device());
  const Tensor q = readable(query), k = readable(key), v = readable(value);
  const Tensor o = readable(out), dout = readable(grad_out), lse = logsumexp.contiguous();
  const Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  // In the C ABI's order: q, k, v, out, dout, then dq, dk, dv.
  const flashgen_tensor views[] = {view(q), view(k), view(v), view(o), view(dout), view(dq), view(dk), view(dv)};
  const flashgen_attention_options opts =
      options(is_causal, scale, at::globalContext().deterministicAlgorithms());
  void* stream = current_stream(q.get_device());
  size_t bytes = 0;
  if (flashgen_attention_backward_workspace_size(&views[0], &views[1], &views[2], &views[3], &views[4],
                                                 lse.data_ptr<float>(), &views[5], &views[6], &views[7], &opts,
                                                 stream, &bytes) != FLASHGEN_SUCCESS) {
    library_failed("flashgen_attention_backward_workspace_size");
    return fall_back("library error");
  }
  const Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  if (flashgen_attention_backward_with_workspace(&views[0], &views[1], &views[2], &views[3], &views[4],
                                                 lse.data_ptr<float>(), &views[5], &views[6], &views[7], &opts,
                                                 workspace.data_ptr(), bytes, stream) != FLASHGEN_SUCCESS) {
    library_failed("flashgen_attention_backward_with_workspace");
    return fall_back("library error");
  }
  count(kBackward, "flashgen");
  return {dq, dk, dv};
}

thread_local std::string message;  // what the extern "C" functions below hand back

}  // namespace

// The interface flashgen/torch/_sdpa.py calls through ctypes. Each returns 0, or -1 with the reason in
// flashgen_torch_sdpa_message().
extern "C" {

__attribute__((visibility("default"))) const char* flashgen_torch_sdpa_message() { return message.c_str(); }

// on = 1 registers the overrides (sm80_devices: bit d set where device d is sm_80 or newer), 0 removes them.
__attribute__((visibility("default"))) int flashgen_torch_sdpa_override(int on, uint64_t sm80_devices) {
  try {
    State& s = state();
    std::lock_guard<std::mutex> hold(s.lock);
    if (!on) {
      s.library.reset();
      return 0;
    }
    if (s.library) return 0;
    if (!s.forward) {  // torch's own kernels, taken before any override
      auto& dispatcher = c10::Dispatcher::singleton();
      s.forward = dispatcher.findSchemaOrThrow(kForwardOp, "").getComputedKernelForDispatchKey(c10::DispatchKey::CUDA);
      s.backward =
          dispatcher.findSchemaOrThrow(kBackwardOp, "").getComputedKernelForDispatchKey(c10::DispatchKey::CUDA);
    }
    s.sm80_devices = sm80_devices;
    auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA, __FILE__,
                                                    __LINE__);
    library->impl("_scaled_dot_product_flash_attention", TORCH_FN(forward_kernel));
    library->impl("_scaled_dot_product_flash_attention_backward", TORCH_FN(backward_kernel));
    s.library = std::move(library);
    return 0;
  } catch (const std::exception& error) {
    message = error.what();
    return -1;
  }
}

// Whether this thread is inside torch's kernel of a call that fell back (the Python overrides below then run
// torch's kernels too, uncounted).
__attribute__((visibility("default"))) int flashgen_torch_sdpa_falling_back() { return falling_back ? 1 : 0; }

// The counts as lines "forward|backward <tab> outcome <tab> calls"; reset = 1 also sets them to zero. The text is
// valid until the thread's next call here.
__attribute__((visibility("default"))) const char* flashgen_torch_sdpa_counts(int reset) {
  State& s = state();
  std::lock_guard<std::mutex> hold(s.lock);
  message.clear();
  const char* names[] = {"forward", "backward"};
  for (int direction = 0; direction < 2; ++direction) {
    for (const auto& [outcome, calls] : s.counts[direction]) {
      message += std::string(names[direction]) + "\t" + outcome + "\t" + std::to_string(calls) + "\n";
    }
    if (reset) s.counts[direction].clear();
  }
  return message.c_str();
}

// The library's message of the last call that fell back on an error ("" for none); reset = 1 forgets it.
__attribute__((visibility("default"))) const char* flashgen_torch_sdpa_last_error(int reset) {
  State& s = state();
  std::lock_guard<std::mutex> hold(s.lock);
  message = s.last_error;
  if (reset) s.last_error.clear();
  return message.c_str();
}

}  // extern "C"
