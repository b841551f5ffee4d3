// [gpu] Attention sinks (options.sinks, options.dsinks) on dense batches: out, lse, the three gradients and the
// sinks' gradient against the float64 reference with the sinks, through the C ABI (the run-time choice: the sm90
// family on sm_90) and on the sm80 family's built-in choice, both dQ strategies; a head without a sink (-inf),
// sinks below, about and above the rows' LSE, rows that see no key (lse = the sink), odd lengths, sq != sk, GQA,
// both causal alignments, no mask, a window, a soft cap and ALiBi beside the sinks. The packed and KV-cache
// calls' sinks are in test_attention_varlen_gpu.cpp and test_attention_kvcache_gpu.cpp.
#include <algorithm>
#include <cmath>
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
      // DeepSeek-V4's layers: one kv head of 512, a 128-key window (the forward of 512 is the Hopper family's).
      {"bf16 d512 window (127, 0), MQA", FLASHGEN_BFLOAT16, {1, 300, 300, 4, 1, 512}, FLASHGEN_MASK_SLIDING_WINDOW,
       0.f, 127, 0},
  };
  for (const SinkCase& c : cases) {
    if (c.shape.head_dim > 256 && arch != 90) continue;
    flashgen::test::DenseVariantProblem p = sink_problem(c);
    p.run_choice();
    if (c.shape.head_dim > 256) continue;  // the run-time choice is its only pair: Hopper's forward, sm80's backward
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

namespace {

// The sinks' gradient's bound (bench/notes_variants.md, "The sinks' gradient's error"): -Σ P_sink · rowsum(dO ∘ O)
// over the rounded output is 2e-4 to 1.5e-3 of |dsinks| from the float64 softmax's; summed in fp32 over the scores
// (the _dsink modules) it lies within fp32 rounding of it. 5e-5 of the largest |dsink| separates the two.
constexpr double kSinkGradRelative = 5e-5;

// -Σ_rows exp(sink - lse) · rowsum(dO ∘ out) per head in float64 over the call's own out and lse: what the
// modules without the knob compute.
std::vector<double> rounded_out_formula(const flashgen::test::DenseVariantProblem& p, const std::vector<float>& sinks) {
  const auto& s = p.s;
  const std::vector<double> out = p.values(p.dout_buf);
  const std::vector<float> lse = p.dlse.download_all<float>();
  std::vector<double> dsinks(size_t(s.heads_q), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const double row_lse = lse[size_t((b * s.heads_q + h) * s.seqlen_q + i)];
        if (!std::isfinite(row_lse) || !std::isfinite(sinks[size_t(h)])) continue;
        double dsum = 0;
        for (int64_t c = 0; c < s.head_dim; ++c) {
          const size_t at = size_t(((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim + c);
          dsum += out[at] * flashgen::dtype_bits_to_float(p.dout[at], flashgen::from_c(p.dtype));
        }
        dsinks[size_t(h)] -= std::exp(double(sinks[size_t(h)]) - row_lse) * dsum;
      }
  return dsinks;
}

}  // namespace

TEST_CASE("the sinks' gradient lies within fp32 rounding of the float64 softmax's, not the rounded output's",
          "[gpu][sinks]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const SinkCase cases[] = {
      {"fp16 d64 bottom-right GQA 4", FLASHGEN_FLOAT16, {2, 300, 300, 8, 2, 64}, FLASHGEN_MASK_CAUSAL},
      {"bf16 d64 bottom-right GQA 4", FLASHGEN_BFLOAT16, {2, 300, 300, 8, 2, 64}, FLASHGEN_MASK_CAUSAL},
      {"bf16 d128 no mask sq > sk", FLASHGEN_BFLOAT16, {1, 257, 190, 4, 2, 128}, FLASHGEN_MASK_NONE},
      {"fp16 d256 bottom-right sq > sk (rows of no key)", FLASHGEN_FLOAT16, {1, 200, 130, 2, 1, 256},
       FLASHGEN_MASK_CAUSAL},
  };
  for (const SinkCase& c : cases) {
    flashgen::test::DenseVariantProblem p = sink_problem(c);
    const std::vector<float> sinks = sinks_of(c.shape.heads_q);
    REQUIRE(flashgen_attention_forward(&p.tq, &p.tk, &p.tv, &p.tout, static_cast<float*>(p.dlse.data()), &p.opts,
                                       nullptr) == FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    const flashgen::Tolerance tolerance{kSinkGradRelative * flashgen::max_magnitude(p.grads.dsinks), 0.0};
    // The old formula's distance: this problem tells the two apart.
    const std::vector<double> old = rounded_out_formula(p, sinks);
    double old_error = 0;
    for (size_t h = 0; h < old.size(); ++h) old_error = std::max(old_error, std::abs(old[h] - p.grads.dsinks[h]));
    INFO(c.name << ": the rounded output's formula lies " << old_error << " from float64, the bound is "
                << tolerance.abs);
    CHECK(old_error > tolerance.abs);

    // The run-time choice (the knob's module of its family), then each family's heuristic tiles with the knob.
    auto check_dsinks = [&](const std::string& label) {
      const std::vector<float> got = p.dsinks.download_all<float>();
      const auto report = flashgen::check_elements(
          "dsinks", {c.shape.heads_q}, std::vector<double>(got.begin(), got.end()), p.grads.dsinks, tolerance);
      INFO(c.name << ", " << label << "\n" << report.text);
      CHECK(report.ok);
    };
    for (bool deterministic : {false, true}) {
      p.opts.deterministic = deterministic ? 1 : 0;
      p.dsinks.fill_bytes(0xff);
      REQUIRE(flashgen_attention_backward(&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout,
                                          static_cast<const float*>(p.dlse.data()), &p.tdq, &p.tdk, &p.tdv, &p.opts,
                                          nullptr) == FLASHGEN_SUCCESS);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      check_dsinks(deterministic ? "the run-time choice, deterministic" : "the run-time choice");
      p.opts.deterministic = 0;
      for (bool sm80_only : {true, false}) {
        if (!sm80_only && arch != 90) continue;
        const flashgen::BackwardCall bwd = p.backward_call(deterministic);
        flashgen::BwdConfig config =
            flashgen::heuristic_backward_choice(bwd.problem.dtype, bwd.problem.head_dim(), bwd.problem.mask_kind(),
                                                deterministic, arch, sm80_only, false, bwd.problem.score_mods())
                .config;
        config.sink_grad = true;
        p.dsinks.fill_bytes(0xff);
        flashgen::launch_backward(bwd, nullptr, config);
        FLASHGEN_CU_CHECK(cuCtxSynchronize());
        check_dsinks(config.name());
        p.check_backward(config.name());  // dq, dk and dv as without the knob
      }
    }
  }
}
