// [gpu] sliding-window attention (FLASHGEN_MASK_SLIDING_WINDOW) on dense batches: out, lse and the three
// gradients against the float64 reference with the window, through the C ABI (the run-time choice) and on
// named configs of every kernel family (sm80 and sm90 forward: one and two consumers, overlapped, ping-pong,
// persistent; sm80 and sm90 backward, both dQ strategies), so that each family's walk meets windows partial
// at both ends, windows narrower than a block, rows that see no key, sq != sk, a soft cap on top, and a causal window,
// a soft cap and GQA together. The
// packed batches' windowed cases are in test_attention_varlen_gpu.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "support/dense_variant_problem.hpp"
#include "tuner/choice.hpp"

namespace {

struct WindowCase {
  const char* name;
  flashgen_dtype dtype;
  flashgen::AttentionShape shape;
  int window_left, window_right;  // -1: unbounded
  float softcap;
  std::vector<std::string> forward_configs;   // besides the heuristic choices; sm90 ones run on sm_90 only
  std::vector<std::string> backward_configs;
};

bool runs_here(const std::string& name, int arch) { return arch >= 90 || name.find("_sm90_") == std::string::npos; }

}  // namespace

TEST_CASE("windowed attention matches the float64 reference, forward and backward, on every family",
          "[gpu][window]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const WindowCase cases[] = {
      // A causal window (right 0) over several key blocks, both ends partial; GQA.
      {"bf16 d128 window (100, 0) GQA 2",
       FLASHGEN_BFLOAT16,
       {2, 333, 333, 4, 2, 128},
       100,
       0,
       0.f,
       {"fwd_sm80_bf16_d128_m128_n64_w4_s2_window", "fwd_sm80_bf16_d128_m64_n32_w4_s3_window",
        "fwd_sm90_bf16_d128_m128_n128_s2_window_ovl_pp", "fwd_sm90_bf16_d128_m64_n128_s2_window",
        "fwd_sm90_bf16_d128_m128_n128_s2_window_ovl_pst"},
       {"bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_window", "bwd_sm80_bf16_d128_m64_n64_w4_s2_x2_window_det_qm64_qn16_qw4_qs2",
        "bwd_sm90_bf16_d128_m64_n128_s2_window", "bwd_sm90_bf16_d128_m64_n128_s3_window_det"}},
      // Both sides bounded, sq < sk (the diagonal offset 213), MQA.
      {"fp16 d64 window (90, 37), 200 x 413 MQA",
       FLASHGEN_FLOAT16,
       {1, 200, 413, 2, 1, 64},
       90,
       37,
       0.f,
       {"fwd_sm80_fp16_d64_m64_n64_w4_s2_window", "fwd_sm90_fp16_d64_m128_n64_s3_window_ovl_pst",
        "fwd_sm90_fp16_d64_m192_n128_s2_window_ovl"},
       {"bwd_sm80_fp16_d64_m64_n64_w4_s2_x1_window_det_qm64_qn32_qw4_qs2"}},
      // Narrower than every block: no block is free of the mask.
      {"bf16 d64 window (5, 3)", FLASHGEN_BFLOAT16, {1, 300, 300, 2, 2, 64}, 5, 3, 0.f, {}, {}},
      // sq > sk: rows before 200 see no key (0 and -inf), the rest a window of 11.
      {"fp16 d128 window (10, 0), 300 x 100", FLASHGEN_FLOAT16, {1, 300, 100, 2, 2, 128}, 10, 0, 0.f, {}, {}},
      // The combination models run (Gemma 2: a causal window, a soft cap, grouped heads), sq < sk, with a cap
      // of 2 that bends most scores; the choices and named configs of both families, both dQ strategies.
      {"bf16 d128 window (80, 0) capped at 2, GQA 2, 190 x 301",
       FLASHGEN_BFLOAT16,
       {2, 190, 301, 4, 2, 128},
       80,
       0,
       2.f,
       {"fwd_sm80_bf16_d128_m128_n64_w4_s2_window_softcap", "fwd_sm90_bf16_d128_m128_n128_s2_window_softcap_ovl_pp"},
       {"bwd_sm90_bf16_d128_m64_n128_s2_window_softcap", "bwd_sm90_bf16_d128_m64_n128_s2_window_softcap_det"}},
      // Unbounded on the left, past the diagonal on the right; a soft cap on top.
      {"fp16 d96 window (-1, 50) capped at 3", FLASHGEN_FLOAT16, {1, 257, 257, 2, 1, 96}, -1, 50, 3.f, {}, {}},
  };
  for (const WindowCase& c : cases) {
    flashgen_attention_options opts{};
    opts.mask = FLASHGEN_MASK_SLIDING_WINDOW;
    opts.window_left = c.window_left, opts.window_right = c.window_right;
    opts.softcap = c.softcap;
    flashgen::test::DenseVariantProblem p(c.name, c.dtype, c.shape, opts,
                                          0x31d0 + uint64_t(c.shape.head_dim) + uint64_t(c.window_left));
    p.run_choice();  // through the C ABI

    // The built-in choices of both families, then the named configs.
    const flashgen::DType dtype = c.dtype == FLASHGEN_FLOAT16 ? flashgen::DType::kFloat16 : flashgen::DType::kBFloat16;
    const int head_dim = static_cast<int>(c.shape.head_dim);
    const bool capped = c.softcap > 0.f;
    std::vector<flashgen::KernelConfig> forward;
    std::vector<flashgen::BwdConfig> backward;
    for (bool sm80_only : {true, false}) {
      forward.push_back(
          flashgen::heuristic_choice(dtype, head_dim, flashgen::MaskKind::kWindow, arch, sm80_only, false, {capped, false})
              .config);
      for (bool deterministic : {false, true}) {
        backward.push_back(flashgen::heuristic_backward_choice(dtype, head_dim, flashgen::MaskKind::kWindow,
                                                               deterministic, arch, sm80_only, false, {capped, false})
                               .config);
      }
    }
    for (const std::string& name : c.forward_configs) {
      if (runs_here(name, arch)) forward.push_back(flashgen::KernelConfig::from_name(name));
    }
    for (const std::string& name : c.backward_configs) {
      if (runs_here(name, arch)) backward.push_back(flashgen::BwdConfig::from_name(name));
    }
    for (const flashgen::KernelConfig& config : forward) {
      REQUIRE(config.mask == flashgen::MaskKind::kWindow);
      p.run_forward(config);
    }
    for (const flashgen::BwdConfig& config : backward) {
      REQUIRE(config.mask == flashgen::MaskKind::kWindow);
      p.run_backward(config);
    }
  }
}
