// The C ABI of include/flashgen/flashgen.h: exceptions become status codes plus a thread-local message
// that keeps the text of the last failure until the next one.
#include <string>

#include "attention.hpp"
#include "attention_backward.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
#include "select.hpp"

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

}  // namespace

extern "C" int flashgen_attention_forward(const flashgen_tensor* q, const flashgen_tensor* k,
                                          const flashgen_tensor* v, const flashgen_tensor* out, float* lse,
                                          const flashgen_attention_options* opts, void* cuda_stream) {
  return guarded([&] {
    const flashgen::ForwardProblem problem = flashgen::make_forward_problem(q, k, v, out, lse, opts);
    flashgen::launch_forward(problem, static_cast<CUstream>(cuda_stream));
  });
}

extern "C" int flashgen_attention_backward(const flashgen_tensor* q, const flashgen_tensor* k,
                                           const flashgen_tensor* v, const flashgen_tensor* out,
                                           const flashgen_tensor* dout, const float* lse, const flashgen_tensor* dq,
                                           const flashgen_tensor* dk, const flashgen_tensor* dv,
                                           const flashgen_attention_options* opts, void* cuda_stream) {
  return guarded([&] {
    const flashgen::BackwardProblem problem =
        flashgen::make_backward_problem(q, k, v, out, dout, lse, dq, dk, dv, opts);
    flashgen::launch_backward(problem, static_cast<CUstream>(cuda_stream));
  });
}

extern "C" void flashgen_set_tune_on_first_use(int enabled) { flashgen::set_tune_on_first_use(enabled != 0); }

extern "C" const char* flashgen_last_error(void) { return g_last_error.c_str(); }

extern "C" const char* flashgen_version(void) { return FLASHGEN_VERSION; }
