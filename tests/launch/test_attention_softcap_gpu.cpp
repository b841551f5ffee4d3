// [gpu] soft-capped attention (options.softcap) on dense batches: out, lse and the three gradients against the
// float64 reference with the cap, through the C ABI (the run-time choice: the sm90 family on sm_90) and on the
// sm80 family's built-in choice, both dQ strategies, odd lengths, GQA, both causal alignments and no mask. The
// packed batches' soft-capped cases are in test_attention_varlen_gpu.cpp.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/device_inputs.hpp"
#include "tuner/choice.hpp"

namespace {

using flashgen::DeviceBuffer;

struct CapCase {
  const char* name;
  flashgen_dtype dtype;
  int64_t head_dim;
  flashgen::AttentionShape shape;  // head_dim set from the case
  flashgen_mask mask;
  float softcap;
  float softmax_scale;  // 0: 1/sqrt(head_dim)
};

// Inputs, outputs (poisoned with NaN before each run) and the references of one case.
struct CapProblem {
  const CapCase& c;
  flashgen::AttentionShape s;
  std::vector<uint16_t> q, k, v, dout;
  DeviceBuffer dq_in, dk_in, dv_in, ddout, dout_buf, dlse, dq, dk, dv;
  flashgen_tensor tq{}, tk{}, tv{}, tout{}, tdout{}, tdq{}, tdk{}, tdv{};
  flashgen_attention_options opts{};
  flashgen::AttentionResult ref;
  flashgen::AttentionGradients grads;

  static flashgen_tensor bshd(const DeviceBuffer& b, flashgen_dtype dtype, int64_t n, int64_t s, int64_t h,
                              int64_t d) {
    return flashgen_tensor{b.data(), dtype, {n, s, h, d}, {s * h * d, h * d, d, 1}};
  }

  explicit CapProblem(const CapCase& cap_case) : c(cap_case), s(cap_case.shape) {
    s.head_dim = c.head_dim;
    std::mt19937_64 rng(0x50f7ca9 + uint64_t(c.head_dim));
    const size_t nq = size_t(s.batch * s.seqlen_q * s.heads_q * s.head_dim);
    const size_t nk = size_t(s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
    using flashgen::test::random_bits;
    q = random_bits(nq, c.dtype, rng), k = random_bits(nk, c.dtype, rng), v = random_bits(nk, c.dtype, rng);
    dout = random_bits(nq, c.dtype, rng);
    using flashgen::test::upload;
    dq_in = upload(q), dk_in = upload(k), dv_in = upload(v), ddout = upload(dout);
    dout_buf = DeviceBuffer(nq * 2), dq = DeviceBuffer(nq * 2), dk = DeviceBuffer(nk * 2), dv = DeviceBuffer(nk * 2);
    dlse = DeviceBuffer(size_t(s.batch * s.heads_q * s.seqlen_q) * sizeof(float));
    tq = bshd(dq_in, c.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tk = bshd(dk_in, c.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tv = bshd(dv_in, c.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tout = bshd(dout_buf, c.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdout = bshd(ddout, c.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdq = bshd(dq, c.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdk = bshd(dk, c.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tdv = bshd(dv, c.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    opts.softmax_scale = c.softmax_scale;
    opts.mask = c.mask;
    opts.softcap = c.softcap;
    const double scale = flashgen::effective_softmax_scale(c.softmax_scale, s.head_dim);
    const auto q_view = flashgen::StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    const auto kv_view = flashgen::StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    using flashgen::HostInput;
    ref = flashgen::attention_reference_f64(s, HostInput::bits16(q.data(), c.dtype, q_view),
                                            HostInput::bits16(k.data(), c.dtype, kv_view),
                                            HostInput::bits16(v.data(), c.dtype, kv_view), scale, c.mask, c.softcap);
    grads = flashgen::attention_backward_reference_f64(
        s, HostInput::bits16(q.data(), c.dtype, q_view), HostInput::bits16(k.data(), c.dtype, kv_view),
        HostInput::bits16(v.data(), c.dtype, kv_view), HostInput::bits16(dout.data(), c.dtype, q_view), scale, c.mask,
        c.softcap);
  }

  std::vector<double> values(const DeviceBuffer& b) const {
    const std::vector<uint16_t> bits = b.download_all<uint16_t>();
    std::vector<double> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = flashgen::dtype_bits_to_float(bits[i], c.dtype);
    return out;
  }

  void check_forward(const std::string& label) const {
    INFO(c.name << ", " << label);
    const flashgen::DtypeTolerances& tol = flashgen::tolerances(c.dtype);
    const std::vector<float> lse_f = dlse.download_all<float>();
    const std::vector<double> lse(lse_f.begin(), lse_f.end());
    const auto out_check = flashgen::check_elements("out", {s.batch, s.seqlen_q, s.heads_q, s.head_dim},
                                                    values(dout_buf), ref.out, tol.out);
    const auto lse_check = flashgen::check_elements("lse", {s.batch, s.heads_q, s.seqlen_q}, lse, ref.lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }

  void check_backward(const std::string& label) const {
    INFO(c.name << ", " << label);
    const struct {
      const char* name;
      const DeviceBuffer& got;
      const std::vector<double>& want;
      std::vector<int64_t> dims;
    } checks[] = {{"dq", dq, grads.dq, {s.batch, s.seqlen_q, s.heads_q, s.head_dim}},
                  {"dk", dk, grads.dk, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}},
                  {"dv", dv, grads.dv, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}}};
    for (const auto& g : checks) {
      const auto report = flashgen::check_elements(
          g.name, g.dims, values(g.got), g.want, flashgen::gradient_tolerance(c.dtype, flashgen::max_magnitude(g.want)));
      INFO(report.text);
      CHECK(report.ok);
    }
  }

  void poison_forward() { dout_buf.fill_bytes(0xff), dlse.fill_bytes(0xff); }
  void poison_backward() { dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff); }
};

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
    CapProblem p(c);
    // The run-time choice, through the C ABI, then the sm80 family's built-in choice.
    p.poison_forward();
    REQUIRE(flashgen_attention_forward(&p.tq, &p.tk, &p.tv, &p.tout, static_cast<float*>(p.dlse.data()), &p.opts,
                                       nullptr) == FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    p.check_forward("the run-time choice");
    for (bool deterministic : {false, true}) {
      p.opts.deterministic = deterministic ? 1 : 0;
      p.poison_backward();
      REQUIRE(flashgen_attention_backward(&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, static_cast<const float*>(p.dlse.data()),
                                          &p.tdq, &p.tdk, &p.tdv, &p.opts, nullptr) == FLASHGEN_SUCCESS);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      p.check_backward(deterministic ? "the run-time choice, deterministic" : "the run-time choice");
    }
    p.opts.deterministic = 0;

    const flashgen::ForwardCall fwd =
        flashgen::make_forward_call(&p.tq, &p.tk, &p.tv, &p.tout, static_cast<float*>(p.dlse.data()), &p.opts);
    const flashgen::KernelConfig sm80 = flashgen::heuristic_choice(fwd.problem.dtype, fwd.problem.head_dim(),
                                                                   fwd.problem.mask_kind(), arch, true, false, true)
                                            .config;
    REQUIRE(sm80.softcap);
    p.poison_forward();
    flashgen::launch_forward(fwd, nullptr, sm80);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    p.check_forward(sm80.name());
    for (bool deterministic : {false, true}) {
      p.opts.deterministic = deterministic ? 1 : 0;
      const flashgen::BackwardCall bwd =
          flashgen::make_backward_call(&p.tq, &p.tk, &p.tv, &p.tout, &p.tdout, static_cast<const float*>(p.dlse.data()),
                                       &p.tdq, &p.tdk, &p.tdv, &p.opts);
      const flashgen::BwdConfig config =
          flashgen::heuristic_backward_choice(bwd.problem.dtype, bwd.problem.head_dim(), bwd.problem.mask_kind(),
                                              deterministic, arch, true, false, true)
              .config;
      REQUIRE(config.softcap);
      p.poison_backward();
      flashgen::launch_backward(bwd, nullptr, config);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      p.check_backward(config.name());
    }
    p.opts.deterministic = 0;
  }
}

TEST_CASE("a config must match the problem's soft cap", "[gpu][softcap]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const CapCase c{"fp16 d64", FLASHGEN_FLOAT16, 64, {1, 64, 64, 1, 1, 0}, FLASHGEN_MASK_NONE, 2.f, 0.f};
  CapProblem p(c);
  const flashgen::ForwardCall capped =
      flashgen::make_forward_call(&p.tq, &p.tk, &p.tv, &p.tout, static_cast<float*>(p.dlse.data()), &p.opts);
  flashgen::KernelConfig plain = flashgen::KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2");
  CHECK_THROWS_WITH(flashgen::launch_forward(capped, nullptr, plain),
                    Catch::Matchers::Contains("does not match the problem (dtype, head_dim, mask, softcap)"));
}
