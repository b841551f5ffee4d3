// [gpu] soft-capped attention (options.softcap) on dense batches: out, lse and the three gradients against the
// float64 reference with the cap, through the C ABI (the run-time choice: the sm90 family on sm_90) and on the
// sm80 family's built-in choice, both dQ strategies, odd lengths, GQA, both causal alignments and no mask. The
// packed batches' soft-capped cases are in test_attention_varlen_gpu.cpp.
#include <string>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "support/dense_variant_problem.hpp"
#include "tuner/choice.hpp"

namespace {

struct CapCase {
  const char* name;
  flashgen_dtype dtype;
  int64_t head_dim;
  flashgen::AttentionShape shape;  // head_dim set from the case
  flashgen_mask mask;
  float softcap;
  float softmax_scale;  // 0: 1/sqrt(head_dim)
};

flashgen::test::DenseVariantProblem cap_problem(const CapCase& c) {
  flashgen::AttentionShape shape = c.shape;
  shape.head_dim = c.head_dim;
  flashgen_attention_options opts{};
  opts.softmax_scale = c.softmax_scale;
  opts.mask = c.mask;
  opts.softcap = c.softcap;
  return flashgen::test::DenseVariantProblem(c.name, c.dtype, shape, opts, 0x50f7ca9 + uint64_t(c.head_dim));
}

}  // namespace

TEST_CASE("soft-capped attention matches the float64 reference, forward and backward, on both families",
          "[gpu][softcap]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  // Caps of 1.5-5 bend most scores of unit-variance inputs; 30 leaves them nearly straight.
  const CapCase cases[] = {
      {"bf16 d128 bottom-right GQA 2, cap 1.5", FLASHGEN_BFLOAT16, 128, {2, 200, 333, 4, 2, 0}, FLASHGEN_MASK_CAUSAL,
       1.5f, 0.f},
      {"fp16 d64 no mask MQA, cap 5, scale 0.3", FLASHGEN_FLOAT16, 64, {1, 130, 77, 2, 1, 0}, FLASHGEN_MASK_NONE, 5.f,
       0.3f},
      {"bf16 d256 top-left, cap 2", FLASHGEN_BFLOAT16, 256, {1, 96, 150, 2, 2, 0}, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 2.f,
       0.f},
      {"fp16 d96 bottom-right, cap 30", FLASHGEN_FLOAT16, 96, {1, 257, 257, 2, 1, 0}, FLASHGEN_MASK_CAUSAL, 30.f,
       0.f},
  };
  for (const CapCase& c : cases) {
    flashgen::test::DenseVariantProblem p = cap_problem(c);
    // The run-time choice, through the C ABI, then the sm80 family's built-in choice.
    p.run_choice();
    const flashgen::ForwardCall fwd = p.forward_call();
    const flashgen::KernelConfig sm80 = flashgen::heuristic_choice(fwd.problem.dtype, fwd.problem.head_dim(),
                                                                   fwd.problem.mask_kind(), arch, true, false, {true, false})
                                            .config;
    REQUIRE(sm80.mods.softcap);
    p.run_forward(sm80);
    for (bool deterministic : {false, true}) {
      const flashgen::BackwardCall bwd = p.backward_call(deterministic);
      const flashgen::BwdConfig config =
          flashgen::heuristic_backward_choice(bwd.problem.dtype, bwd.problem.head_dim(), bwd.problem.mask_kind(),
                                              deterministic, arch, true, false, {true, false})
              .config;
      REQUIRE(config.mods.softcap);
      p.run_backward(config);
    }
  }
}

TEST_CASE("a config must match the problem's soft cap", "[gpu][softcap]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const CapCase c{"fp16 d64", FLASHGEN_FLOAT16, 64, {1, 64, 64, 1, 1, 0}, FLASHGEN_MASK_NONE, 2.f, 0.f};
  flashgen::test::DenseVariantProblem p = cap_problem(c);
  const flashgen::ForwardCall capped = p.forward_call();
  flashgen::KernelConfig plain = flashgen::KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2");
  CHECK_THROWS_WITH(flashgen::launch_forward(capped, nullptr, plain),
                    Catch::Matchers::Contains("does not match the problem (dtype, head_dim, mask, soft cap, ALiBi)"));
}
