// [gpu] Attention sinks (options.sinks, options.dsinks) on dense batches: out, lse, the three gradients and the
// sinks' gradient against the float64 reference with the sinks, through the C ABI (the run-time choice: the sm90
// family on sm_90) and on the sm80 family's built-in choice, both dQ strategies; a head without a sink (-inf),
// sinks below, about and above the rows' LSE, rows that see no key (lse = the sink), odd lengths, sq != sk, GQA,
// both causal alignments, no mask, a window, a soft cap and ALiBi beside the sinks. The packed and KV-cache
// calls' sinks are in test_attention_varlen_gpu.cpp and test_attention_kvcache_gpu.cpp.
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "support/dense_variant_problem.hpp"
#include "tuner/choice.hpp"

namespace {

struct SinkCase {
  const char* name;
  flashgen_dtype dtype;
  flashgen::AttentionShape shape;
  flashgen_mask mask;
  float softcap = 0.f;
  int window_left = -1, window_right = -1;
  bool alibi = false;
};

// Head h's sink: the rows' LSE of unit-variance scores over a few hundred keys lies near 6, so the sinks take
// from ~1% of a row's softmax to most of it; head 1 has none (-inf).
std::vector<float> sinks_of(int64_t heads_q) {
  const float values[] = {5.5f, -std::numeric_limits<float>::infinity(), 1.f, 9.f, 6.5f, 3.f};
  std::vector<float> sinks(static_cast<size_t>(heads_q));
  for (size_t h = 0; h < sinks.size(); ++h) sinks[h] = values[h % 6] - 0.25f * float(h / 6);
  return sinks;
}

flashgen::test::DenseVariantProblem sink_problem(const SinkCase& c) {
  flashgen_attention_options opts{};
  opts.mask = c.mask;
  opts.softcap = c.softcap;
  opts.window_left = c.window_left, opts.window_right = c.window_right;
  return flashgen::test::DenseVariantProblem(
      c.name, c.dtype, c.shape, opts, 0x5195 + uint64_t(c.shape.head_dim),
      c.alibi ? flashgen::standard_alibi_slopes(c.shape.heads_q) : std::vector<float>{}, 0, sinks_of(c.shape.heads_q));
}

}  // namespace

TEST_CASE("attention with sinks matches the float64 reference, forward and backward, on both families",
          "[gpu][sinks]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const SinkCase cases[] = {
      {"bf16 d128 bottom-right GQA 2", FLASHGEN_BFLOAT16, {2, 200, 333, 4, 2, 128}, FLASHGEN_MASK_CAUSAL},
      {"fp16 d64 bottom-right sq > sk (rows of no key), MQA", FLASHGEN_FLOAT16, {1, 130, 77, 3, 1, 64},
       FLASHGEN_MASK_CAUSAL},
      {"bf16 d256 no mask, cap 2, ALiBi", FLASHGEN_BFLOAT16, {1, 96, 150, 2, 2, 256}, FLASHGEN_MASK_NONE, 2.f, -1, -1,
       true},
      {"fp16 d96 window (50, 9)", FLASHGEN_FLOAT16, {2, 257, 257, 6, 2, 96}, FLASHGEN_MASK_SLIDING_WINDOW, 0.f, 50, 9},
      {"bf16 d64 top-left", FLASHGEN_BFLOAT16, {1, 190, 190, 2, 1, 64}, FLASHGEN_MASK_CAUSAL_TOP_LEFT},
  };
  for (const SinkCase& c : cases) {
    flashgen::test::DenseVariantProblem p = sink_problem(c);
    p.run_choice();
    const flashgen::ForwardCall fwd = p.forward_call();
    const flashgen::ScoreMods mods = fwd.problem.score_mods();
    p.run_forward(flashgen::heuristic_choice(fwd.problem.dtype, fwd.problem.head_dim(), fwd.problem.mask_kind(), arch,
                                             true, false, mods)
                      .config);
    for (bool deterministic : {false, true}) {
      const flashgen::BackwardCall bwd = p.backward_call(deterministic);
      p.run_backward(flashgen::heuristic_backward_choice(bwd.problem.dtype, bwd.problem.head_dim(),
                                                         bwd.problem.mask_kind(), deterministic, arch, true, false, mods)
                         .config);
    }
  }
}

TEST_CASE("the sinks' gradient is the same bits on every run, and optional", "[gpu][sinks]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const SinkCase c{"bf16 d128 causal", FLASHGEN_BFLOAT16, {3, 300, 300, 4, 4, 128}, FLASHGEN_MASK_CAUSAL};
  flashgen::test::DenseVariantProblem p = sink_problem(c);
  p.run_choice();
  const std::vector<float> first = p.dsinks.download_all<float>();
  for (int run = 0; run < 3; ++run) {
    p.dsinks.fill_bytes(0xff);
    REQUIRE(flashgen_attention_backward(&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, static_cast<const float*>(p.dlse.data()),
                                        &p.tdq, &p.tdk, &p.tdv, &p.opts, nullptr) == FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    CHECK(p.dsinks.download_all<float>() == first);
  }
  // Without dsinks the other gradients are the same and the buffer is left alone.
  p.opts.dsinks = nullptr;
  p.dsinks.fill_bytes(0x7f);
  p.poison_backward();
  REQUIRE(flashgen_attention_backward(&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, static_cast<const float*>(p.dlse.data()),
                                      &p.tdq, &p.tdk, &p.tdv, &p.opts, nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  p.check_backward("without dsinks");
  for (const float x : p.dsinks.download_all<float>()) CHECK(x == 0x1.fefefep127f);
}
