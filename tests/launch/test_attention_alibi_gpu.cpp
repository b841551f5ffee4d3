// [gpu] ALiBi (options.alibi_slopes) on dense batches: out, lse and the three gradients against the float64
// reference with the bias, through the C ABI (the run-time choice: the sm90 family on sm_90) and on the sm80
// family's built-in choice, both dQ strategies; slopes per head and per batch entry and head, odd lengths,
// sq != sk, GQA, both causal alignments (the bias about each one's diagonal), no mask, a window, a soft cap under
// the bias. The packed batches' ALiBi cases are in test_attention_varlen_gpu.cpp.
#include <string>
#include <vector>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "support/dense_variant_problem.hpp"
#include "tuner/choice.hpp"

namespace {

struct AlibiCase {
  const char* name;
  flashgen_dtype dtype;
  flashgen::AttentionShape shape;
  flashgen_mask mask;
  bool per_batch;  // slopes [batch, heads_q] (alibi_batch_stride heads_q + 3) rather than [heads_q]
  float softcap = 0.f;
  int window_left = -1, window_right = -1;
};

// Slopes steep enough to reorder the softmax of unit-variance scores within a few keys, different per head (and
// per batch entry): the standard ones of 8 heads run 0.5 down to 2^-8, too flat over 300 keys to show a wrong sign.
std::vector<float> slopes_of(const AlibiCase& c, int64_t stride) {
  const int64_t entries = c.per_batch ? c.shape.batch : 1;
  std::vector<float> slopes(size_t((entries - 1) * stride + c.shape.heads_q), -1e30f);  // gaps: never read
  for (int64_t b = 0; b < entries; ++b)
    for (int64_t h = 0; h < c.shape.heads_q; ++h) slopes[size_t(b * stride + h)] = 0.04f * float(h + 1) + 0.3f * float(b);
  return slopes;
}

flashgen::test::DenseVariantProblem alibi_problem(const AlibiCase& c) {
  flashgen_attention_options opts{};
  opts.mask = c.mask;
  opts.softcap = c.softcap;
  opts.window_left = c.window_left, opts.window_right = c.window_right;
  const int64_t stride = c.per_batch ? c.shape.heads_q + 3 : 0;
  return flashgen::test::DenseVariantProblem(c.name, c.dtype, c.shape, opts, 0xa11b1 + uint64_t(c.shape.head_dim),
                                             slopes_of(c, stride), stride);
}

}  // namespace

TEST_CASE("ALiBi attention matches the float64 reference, forward and backward, on both families", "[gpu][alibi]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const AlibiCase cases[] = {
      {"bf16 d128 bottom-right GQA 2, per batch", FLASHGEN_BFLOAT16, {2, 200, 333, 4, 2, 128}, FLASHGEN_MASK_CAUSAL,
       true},
      {"fp16 d64 no mask MQA, sq > sk", FLASHGEN_FLOAT16, {1, 130, 77, 2, 1, 64}, FLASHGEN_MASK_NONE, false},
      {"bf16 d256 top-left, cap 2", FLASHGEN_BFLOAT16, {1, 96, 150, 2, 2, 256}, FLASHGEN_MASK_CAUSAL_TOP_LEFT, false,
       2.f},
      {"fp16 d96 window (50, 9), per batch", FLASHGEN_FLOAT16, {2, 257, 257, 2, 1, 96}, FLASHGEN_MASK_SLIDING_WINDOW,
       true, 0.f, 50, 9},
  };
  for (const AlibiCase& c : cases) {
    flashgen::test::DenseVariantProblem p = alibi_problem(c);
    p.run_choice();
    const flashgen::ForwardCall fwd = p.forward_call();
    const flashgen::ScoreMods mods = fwd.problem.score_mods();
    REQUIRE(mods.alibi);
    const flashgen::KernelConfig sm80 =
        flashgen::heuristic_choice(fwd.problem.dtype, fwd.problem.head_dim(), fwd.problem.mask_kind(), arch, true,
                                   false, mods)
            .config;
    REQUIRE(sm80.mods == mods);
    p.run_forward(sm80);
    for (bool deterministic : {false, true}) {
      const flashgen::BackwardCall bwd = p.backward_call(deterministic);
      const flashgen::BwdConfig config =
          flashgen::heuristic_backward_choice(bwd.problem.dtype, bwd.problem.head_dim(), bwd.problem.mask_kind(),
                                              deterministic, arch, true, false, mods)
              .config;
      REQUIRE(config.mods == mods);
      p.run_backward(config);
    }
  }
}

TEST_CASE("a config must match the problem's ALiBi", "[gpu][alibi]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const AlibiCase c{"fp16 d64", FLASHGEN_FLOAT16, {1, 64, 64, 1, 1, 64}, FLASHGEN_MASK_NONE, false};
  flashgen::test::DenseVariantProblem p = alibi_problem(c);
  const flashgen::ForwardCall biased = p.forward_call();
  const flashgen::KernelConfig plain = flashgen::KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2");
  CHECK_THROWS_WITH(flashgen::launch_forward(biased, nullptr, plain),
                    Catch::Matchers::Contains("does not match the problem (dtype, head_dim, mask, soft cap, ALiBi)"));
}
