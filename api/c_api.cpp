// The C ABI of include/flashgen/flashgen.h: exceptions become status codes plus a thread-local message
// that keeps the text of the last failure until the next one; JSON answers go into caller buffers.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "api/explain.hpp"
#include "api/from_c.hpp"
#include "dispatch/dispatch.hpp"
#include "dispatch/select.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
#include "launch/tensor_checks.hpp"
#include "problem/user_variant.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/stream_memory.hpp"
#include "tuner/store.hpp"

namespace {

thread_local std::string g_last_error;

template <class Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    return FLASHGEN_SUCCESS;
  } catch (const flashgen::Error& e) {
    g_last_error = e.what();
    return static_cast<int>(e.status());
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return FLASHGEN_ERROR_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return FLASHGEN_ERROR_INTERNAL;
  }
}

// A JSON answer into the caller's buffer: *length (when given) gets the text's length either way; the text
// and its NUL are copied only when they fit.
void copy_json(const nlohmann::json& answer, char* json, size_t capacity, size_t* length) {
  const std::string text = answer.dump();
  if (length != nullptr) *length = text.size();
  FLASHGEN_REQUIRE(json != nullptr, "json: null pointer");
  FLASHGEN_REQUIRE(capacity > text.size(), "json_capacity: " + std::to_string(capacity) +
                                               " bytes is too small; the answer needs " +
                                               std::to_string(text.size() + 1) + " (json_length holds its length)");
  text.copy(json, text.size());
  json[text.size()] = '\0';
}

// A pointer argument as the C++ API takes it, after the null check the launcher would make.
template <class T>
const T& required(const T* argument, const char* name) {
  FLASHGEN_REQUIRE(argument != nullptr, std::string(name) + ": null pointer");
  return *argument;
}

// A tensor argument as the library takes it, after the null check the launcher would make.
flashgen::TensorView view(const flashgen_tensor* tensor, const char* name) {
  return flashgen::from_c(required(tensor, name));
}

// A size-prefixed struct's size (`field`, e.g. "args.size") against this library's struct of `expected` bytes
// (`what`, e.g. "argument struct"): smaller is a caller that did not set it, or one built against an older
// flashgen.h (whose structs were smaller); larger one built against `larger_from` (a newer flashgen.h, or, for the
// options, one older than their size field, whose first bytes, softmax_scale and mask, read as a large size).
void check_struct_size(size_t size, size_t expected, const std::string& field, const std::string& what,
                       const std::string& larger_from = "a newer one") {
  FLASHGEN_REQUIRE(size >= expected, field + " is " + std::to_string(size) + "; this flashgen's " + what + " has " +
                                         std::to_string(expected) +
                                         " bytes (set size to sizeof; rebuild a caller compiled against an older "
                                         "flashgen.h)");
  FLASHGEN_REQUIRE(size == expected, field + " is " + std::to_string(size) + ", not this flashgen's " +
                                         std::to_string(expected) +
                                         " bytes: rebuild the caller against this library's flashgen.h (it was "
                                         "compiled against " + larger_from + ")");
}

// flashgen_attention_options' size, wherever they are passed.
void check_options_size(const flashgen_attention_options& options, const std::string& field) {
  check_struct_size(options.size, sizeof(flashgen_attention_options), field, "options struct",
                    "a newer one, or one whose options had no size");
}

// The options of a dense call: given, and of this library's size (checked before the tensors, so that a caller
// built against another flashgen.h hears of that first).
const flashgen_attention_options& checked_options(const flashgen_attention_options* opts) {
  const flashgen_attention_options& checked = required(opts, "opts");
  check_options_size(checked, "opts.size");
  return checked;
}

// A size-prefixed argument struct: given, of this library's size, and so are the options it holds.
template <class Args>
const Args& checked_args(const Args* args) {
  const Args& checked = required(args, "args");
  check_struct_size(checked.size, sizeof(Args), "args.size", "argument struct");
  check_options_size(checked.options, "args.options.size");
  return checked;
}

// The variant's functions compiled on their own, their errors named as the description's.
void check_desc_compiles(const flashgen::UserVariant& user) {
  try {
    flashgen::check_user_functions_compile(user);
  } catch (const flashgen::Error& e) {
    if (e.status() != flashgen::Status::kCompile) throw;
    flashgen::fail(flashgen::Status::kCompile, "desc: the variant's functions do not compile; " + std::string(e.what()));
  }
}

// The problem of a flashgen_forward_problem, checked like the calls check their tensors.
flashgen::AttentionProblem forward_problem_of(const flashgen_forward_problem* problem) {
  FLASHGEN_REQUIRE(problem != nullptr, "problem: null pointer");
  const int dtype = flashgen::raw_enum(problem->dtype);
  FLASHGEN_REQUIRE(dtype == FLASHGEN_FLOAT16 || dtype == FLASHGEN_BFLOAT16,
                   "problem.dtype: unknown value " + std::to_string(dtype));
  const std::pair<int64_t, const char*> sizes[] = {
      {problem->batch, "batch"},       {problem->seqlen_q, "seqlen_q"}, {problem->seqlen_k, "seqlen_k"},
      {problem->heads_q, "heads_q"},   {problem->heads_kv, "heads_kv"}, {problem->head_dim, "head_dim"}};
  for (const auto& [size, name] : sizes) {
    FLASHGEN_REQUIRE(size >= 1 && size <= flashgen::kMaxExtent,
                     std::string("problem.") + name + " must be in [1, 2^30], got " + std::to_string(size));
  }
  if (problem->head_dim % 8 != 0 || problem->head_dim > 512) {  // above 256: the Hopper family's forward
    flashgen::fail(flashgen::Status::kUnsupported, "problem.head_dim = " + std::to_string(problem->head_dim) +
                                                       " is unsupported: head_dim must be a multiple of 8 up to 512");
  }
  FLASHGEN_REQUIRE(problem->heads_q % problem->heads_kv == 0,
                   "problem.heads_q = " + std::to_string(problem->heads_q) + " must be a multiple of problem.heads_kv = " +
                       std::to_string(problem->heads_kv));
  FLASHGEN_REQUIRE(problem->batch <= 65535 && problem->heads_q <= 65535,
                   "problem: batch and heads_q must each be at most 65535 (grid limits)");
  const int mask = flashgen::raw_enum(problem->mask);
  if (mask == FLASHGEN_MASK_SLIDING_WINDOW) {
    flashgen::fail(flashgen::Status::kUnsupported,
                   "problem.mask: flashgen_forward_problem carries no window; a windowed call is tuned on its "
                   "first use (flashgen_set_tune_on_first_use)");
  }
  FLASHGEN_REQUIRE(mask == FLASHGEN_MASK_NONE || mask == FLASHGEN_MASK_CAUSAL || mask == FLASHGEN_MASK_CAUSAL_TOP_LEFT,
                   "problem.mask: unknown value " + std::to_string(mask));

  const flashgen::AttentionShape shape{problem->batch,   problem->seqlen_q, problem->seqlen_k,
                                      problem->heads_q, problem->heads_kv, problem->head_dim};
  return flashgen::forward_problem(flashgen::from_c(problem->dtype), shape, flashgen::from_c(problem->mask));
}

}  // namespace

extern "C" int flashgen_attention_forward(const flashgen_tensor* q, const flashgen_tensor* k,
                                          const flashgen_tensor* v, const flashgen_tensor* out, float* lse,
                                          const flashgen_attention_options* opts, void* cuda_stream) {
  return guarded([&] {
    const flashgen_attention_options& options = checked_options(opts);
    flashgen::attention_forward(view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"), lse,
                                flashgen::from_c(options), static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_varlen_forward(const flashgen_varlen_forward_args* args, void* cuda_stream) {
  return guarded([&] {
    const flashgen_varlen_forward_args& checked = checked_args(args);
    flashgen::attention_forward(flashgen::from_c(checked), static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_varlen_backward(const flashgen_varlen_backward_args* args, void* cuda_stream) {
  return guarded([&] {
    const flashgen_varlen_backward_args& checked = checked_args(args);
    flashgen::attention_backward(flashgen::from_c(checked), static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_kvcache(const flashgen_kvcache_args* args, void* cuda_stream) {
  return guarded([&] {
    const flashgen_kvcache_args& checked = checked_args(args);
    flashgen::attention_kvcache(flashgen::from_c(checked), static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_kvcache_workspace_size(const flashgen_kvcache_args* args, void* cuda_stream,
                                                         size_t* workspace_bytes) {
  return guarded([&] {
    const flashgen_kvcache_args& checked = checked_args(args);
    FLASHGEN_REQUIRE(workspace_bytes != nullptr, "workspace_bytes: null pointer");
    *workspace_bytes = flashgen::kvcache_workspace_size(flashgen::from_c(checked), static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_backward(const flashgen_tensor* q, const flashgen_tensor* k,
                                           const flashgen_tensor* v, const flashgen_tensor* out,
                                           const flashgen_tensor* dout, const float* lse, const flashgen_tensor* dq,
                                           const flashgen_tensor* dk, const flashgen_tensor* dv,
                                           const flashgen_attention_options* opts, void* cuda_stream) {
  return guarded([&] {
    const flashgen_attention_options& options = checked_options(opts);
    flashgen::attention_backward(view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"), view(dout, "dout"), lse,
                                 view(dq, "dq"), view(dk, "dk"), view(dv, "dv"), flashgen::from_c(options),
                                 static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_backward_workspace_size(
    const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v, const flashgen_tensor* out,
    const flashgen_tensor* dout, const float* lse, const flashgen_tensor* dq, const flashgen_tensor* dk,
    const flashgen_tensor* dv, const flashgen_attention_options* opts, void* cuda_stream, size_t* workspace_bytes) {
  return guarded([&] {
    FLASHGEN_REQUIRE(workspace_bytes != nullptr, "workspace_bytes: null pointer");
    const flashgen::BackwardCall call =
        flashgen::make_backward_call(q, k, v, out, dout, lse, dq, dk, dv, &checked_options(opts));
    *workspace_bytes = flashgen::plan_backward(call, static_cast<CUstream>(cuda_stream)).launch.workspace_bytes;
  });
}

extern "C" int flashgen_attention_backward_with_workspace(
    const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v, const flashgen_tensor* out,
    const flashgen_tensor* dout, const float* lse, const flashgen_tensor* dq, const flashgen_tensor* dk,
    const flashgen_tensor* dv, const flashgen_attention_options* opts, void* workspace, size_t workspace_bytes,
    void* cuda_stream) {
  return guarded([&] {
    const flashgen_attention_options& options = checked_options(opts);
    FLASHGEN_REQUIRE(workspace != nullptr,
                     "workspace: null pointer (flashgen_attention_backward takes its workspace from flashgen's pool)");
    flashgen::attention_backward(view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"), view(dout, "dout"), lse,
                                 view(dq, "dq"), view(dk, "dk"), view(dv, "dv"), flashgen::from_c(options),
                                 static_cast<CUstream>(cuda_stream),
                                 reinterpret_cast<CUdeviceptr>(workspace), workspace_bytes);
  });
}

extern "C" int flashgen_explain_forward(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                                        const flashgen_tensor* out, float* lse, const flashgen_attention_options* opts,
                                        void* cuda_stream, char* json, size_t json_capacity, size_t* json_length) {
  return guarded([&] {
    const flashgen::ForwardCall call = flashgen::make_forward_call(q, k, v, out, lse, &checked_options(opts));
    copy_json(flashgen::explain_forward(call, static_cast<CUstream>(cuda_stream)), json, json_capacity,
              json_length);
  });
}

extern "C" int flashgen_explain_backward(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                                         const flashgen_tensor* out, const flashgen_tensor* dout, const float* lse,
                                         const flashgen_tensor* dq, const flashgen_tensor* dk, const flashgen_tensor* dv,
                                         const flashgen_attention_options* opts, void* cuda_stream, char* json,
                                         size_t json_capacity, size_t* json_length) {
  return guarded([&] {
    const flashgen::BackwardCall call =
        flashgen::make_backward_call(q, k, v, out, dout, lse, dq, dk, dv, &checked_options(opts));
    copy_json(flashgen::explain_backward(call, static_cast<CUstream>(cuda_stream)), json, json_capacity,
              json_length);
  });
}

extern "C" int flashgen_tune_forward(const flashgen_forward_problem* problem, void* cuda_stream, char* json,
                                     size_t json_capacity, size_t* json_length) {
  return guarded([&] {
    const flashgen::AttentionProblem forward = forward_problem_of(problem);
    const flashgen::ScopedContext scope(static_cast<CUstream>(cuda_stream));
    const int arch = flashgen::launch_arch(scope.device());
    const flashgen::ProblemKey key = flashgen::problem_key(forward);
    // An explicit request throws its failure with the cause's status (CUDA, compile, a bad database path).
    const std::optional<flashgen::ForwardChoice> tuned =
        flashgen::tune_forward_on_first_use(forward, static_cast<int>(scope.device()), arch, nullptr,
                                            /*explicit_request=*/true);
    if (!tuned) flashgen::fail(flashgen::Status::kInternal, "tuning " + key.id() + " returned no winner");
    copy_json({{"problem", key.id()},
               {"config", tuned->config.name()},
               {"reason", tuned->reason},
               {"db", flashgen::TuningStore::default_path().string()}},
              json, json_capacity, json_length);
  });
}

extern "C" int flashgen_variant_create(const flashgen_variant_desc* desc, flashgen_variant** variant) {
  return guarded([&] {
    FLASHGEN_REQUIRE(variant != nullptr, "variant: null pointer");
    *variant = nullptr;
    std::shared_ptr<const flashgen::UserVariant> user = flashgen::make_user_variant(flashgen::from_c(required(desc, "desc")));
    check_desc_compiles(*user);
    *variant = new flashgen_variant{std::move(user)};
  });
}

extern "C" void flashgen_variant_destroy(flashgen_variant* variant) { delete variant; }

extern "C" const char* flashgen_variant_tag(const flashgen_variant* variant) {
  return variant != nullptr ? variant->user->tag.c_str() : "";
}

extern "C" int flashgen_block_mask_create(flashgen_block_mask** mask) {
  return guarded([&] {
    FLASHGEN_REQUIRE(mask != nullptr, "mask: null pointer");
    *mask = new flashgen_block_mask;
  });
}

extern "C" void flashgen_block_mask_destroy(flashgen_block_mask* mask) { delete mask; }

extern "C" int flashgen_release_cached_memory(void) {
  return guarded([] { flashgen::release_cached_stream_memory(); });
}

extern "C" void flashgen_set_tune_on_first_use(int enabled) { flashgen::set_tune_on_first_use(enabled != 0); }

extern "C" const char* flashgen_last_error(void) { return g_last_error.c_str(); }

extern "C" const char* flashgen_version(void) { return FLASHGEN_VERSION; }
