// A dense [gpu] test problem of the attention variants (soft cap, sliding window, ALiBi, sinks): random inputs on
// the host and the device, outputs and gradients poisoned (NaN) before each run, the float64 references of the
// options' mask, cap and window and the given ALiBi slopes and sinks, and the checks of out, lse, the three
// gradients and the sinks' gradient against them.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/device_inputs.hpp"

namespace flashgen::test {

struct DenseVariantProblem {
  std::string name;
  flashgen_dtype dtype;
  AttentionShape s;
  std::vector<uint16_t> q, k, v, dout;
  DeviceBuffer dq_in, dk_in, dv_in, ddout, dout_buf, dlse, dq, dk, dv, dslopes, dsink_logits, dsinks;
  flashgen_tensor tq{}, tk{}, tv{}, tout{}, tdout{}, tdq{}, tdk{}, tdv{};
  flashgen_attention_options opts;
  ReferenceVariant variant;  // what the references apply besides the mask
  AttentionResult ref;
  AttentionGradients grads;

  static flashgen_tensor bshd(const DeviceBuffer& b, flashgen_dtype dt, int64_t n, int64_t sl, int64_t h,
                              int64_t d) {
    return flashgen_tensor{b.data(), dt, {n, sl, h, d}, {sl * h * d, h * d, d, 1}};
  }

  // Inputs of shape (random normal from seed), run with options (deterministic cleared), when slopes are given
  // ALiBi with them (slopes_batch_stride apart; options.alibi_slopes is set to their device copy), and when sinks
  // are given those sinks (options.sinks) and their gradient (options.dsinks); user_reference gives the references
  // the functions of a user variant in options.variant.
  DenseVariantProblem(std::string problem_name, flashgen_dtype problem_dtype, const AttentionShape& shape,
                      const flashgen_attention_options& options, uint64_t seed, std::vector<float> slopes = {},
                      int64_t slopes_batch_stride = 0, std::vector<float> sinks = {},
                      const std::function<void(ReferenceVariant&)>& user_reference = {})
      : name(std::move(problem_name)), dtype(problem_dtype), s(shape), opts(options) {
    opts.deterministic = 0;
    if (!slopes.empty()) {
      dslopes = DeviceBuffer(slopes.size() * sizeof(float));
      dslopes.upload(slopes);
      opts.alibi_slopes = static_cast<const float*>(dslopes.data());
      opts.alibi_batch_stride = slopes_batch_stride;
    }
    if (!sinks.empty()) {
      dsink_logits = DeviceBuffer(sinks.size() * sizeof(float));
      dsink_logits.upload(sinks);
      dsinks = DeviceBuffer(sinks.size() * sizeof(float));
      opts.sinks = static_cast<const float*>(dsink_logits.data());
      opts.dsinks = static_cast<float*>(dsinks.data());
    }
    std::mt19937_64 rng(seed);
    const size_t nq = size_t(s.batch * s.seqlen_q * s.heads_q * s.head_dim);
    const size_t nk = size_t(s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
    q = random_bits(nq, dtype, rng), k = random_bits(nk, dtype, rng), v = random_bits(nk, dtype, rng);
    dout = random_bits(nq, dtype, rng);
    dq_in = upload(q), dk_in = upload(k), dv_in = upload(v), ddout = upload(dout);
    dout_buf = DeviceBuffer(nq * 2), dq = DeviceBuffer(nq * 2), dk = DeviceBuffer(nk * 2), dv = DeviceBuffer(nk * 2);
    dlse = DeviceBuffer(size_t(s.batch * s.heads_q * s.seqlen_q) * sizeof(float));
    tq = bshd(dq_in, dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tk = bshd(dk_in, dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tv = bshd(dv_in, dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tout = bshd(dout_buf, dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdout = bshd(ddout, dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdq = bshd(dq, dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdk = bshd(dk, dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tdv = bshd(dv, dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    variant = ReferenceVariant(opts.softcap, {opts.window_left, opts.window_right, opts.attention_chunk},
                               std::move(slopes), slopes_batch_stride);
    variant.sinks = std::move(sinks);
    if (user_reference) user_reference(variant);  // a user variant's functions (options.variant)
    compute_references();
  }

  // q read by every batch entry from the first one's rows (batch stride 0): a valid layout that no TMA descriptor
  // describes. The references follow.
  void share_q_across_batch() {
    const size_t one = size_t(s.seqlen_q * s.heads_q * s.head_dim);
    for (size_t i = one; i < q.size(); ++i) q[i] = q[i % one];
    dq_in.upload(q);
    tq.stride[0] = 0;
    compute_references();
  }

  void compute_references() {
    const double scale = effective_softmax_scale(opts.softmax_scale, s.head_dim);
    const auto q_view = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    const auto kv_view = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    const DType elem = from_c(dtype);
    ref = attention_reference_f64(
        s, HostInput::bits16(q.data(), elem, q_view), HostInput::bits16(k.data(), elem, kv_view),
        HostInput::bits16(v.data(), elem, kv_view), scale, from_c(opts.mask), variant);
    grads = attention_backward_reference_f64(
        s, HostInput::bits16(q.data(), elem, q_view), HostInput::bits16(k.data(), elem, kv_view),
        HostInput::bits16(v.data(), elem, kv_view), HostInput::bits16(dout.data(), elem, q_view), scale,
        from_c(opts.mask), variant);
  }

  std::vector<double> values(const DeviceBuffer& b) const {
    const std::vector<uint16_t> bits = b.download_all<uint16_t>();
    std::vector<double> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = dtype_bits_to_float(bits[i], from_c(dtype));
    return out;
  }

  void check_forward(const std::string& label) const {
    INFO(name << ", " << label);
    const DtypeTolerances& tol = tolerances(from_c(dtype));
    const std::vector<float> lse_f = dlse.download_all<float>();
    const std::vector<double> lse(lse_f.begin(), lse_f.end());
    const auto out_check =
        check_elements("out", {s.batch, s.seqlen_q, s.heads_q, s.head_dim}, values(dout_buf), ref.out, tol.out);
    const auto lse_check = check_elements("lse", {s.batch, s.heads_q, s.seqlen_q}, lse, ref.lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }

  void check_backward(const std::string& label) const {
    INFO(name << ", " << label);
    const struct {
      const char* name;
      const DeviceBuffer& got;
      const std::vector<double>& want;
      std::vector<int64_t> dims;
    } checks[] = {{"dq", dq, grads.dq, {s.batch, s.seqlen_q, s.heads_q, s.head_dim}},
                  {"dk", dk, grads.dk, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}},
                  {"dv", dv, grads.dv, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}}};
    for (const auto& g : checks) {
      const auto report = check_elements(g.name, g.dims, values(g.got), g.want,
                                         gradient_tolerance(from_c(dtype), max_magnitude(g.want)));
      INFO(report.text);
      CHECK(report.ok);
    }
    if (opts.dsinks != nullptr) {  // fp32 sums over every row of a head: the dtype's gradient tolerance
      const std::vector<float> got_f = dsinks.download_all<float>();
      const auto report = check_elements("dsinks", {s.heads_q}, std::vector<double>(got_f.begin(), got_f.end()),
                                         grads.dsinks, gradient_tolerance(from_c(dtype), max_magnitude(grads.dsinks)));
      INFO(report.text);
      CHECK(report.ok);
    }
  }

  void poison_forward() { dout_buf.fill_bytes(0xff), dlse.fill_bytes(0xff); }
  void poison_backward() {
    dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff);
    if (opts.dsinks != nullptr) dsinks.fill_bytes(0xff);
  }

  ForwardCall forward_call() { return make_forward_call(&tq, &tk, &tv, &tout, static_cast<float*>(dlse.data()), &opts); }
  BackwardCall backward_call(bool deterministic) {
    opts.deterministic = deterministic ? 1 : 0;
    BackwardCall call = make_backward_call(&tq, &tk, &tv, &tout, &tdout, static_cast<const float*>(dlse.data()), &tdq,
                                           &tdk, &tdv, &opts);
    opts.deterministic = 0;
    return call;
  }

  // The run-time choice through the C ABI: the forward, then the backward with both dQ strategies.
  void run_choice() {
    poison_forward();
    REQUIRE(flashgen_attention_forward(&tq, &tk, &tv, &tout, static_cast<float*>(dlse.data()), &opts, nullptr) ==
            FLASHGEN_SUCCESS);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    check_forward("the run-time choice");
    for (bool deterministic : {false, true}) {
      opts.deterministic = deterministic ? 1 : 0;
      poison_backward();
      REQUIRE(flashgen_attention_backward(&tq, &tk, &tv, &tout, &tdout, static_cast<const float*>(dlse.data()), &tdq,
                                          &tdk, &tdv, &opts, nullptr) == FLASHGEN_SUCCESS);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      check_backward(deterministic ? "the run-time choice, deterministic" : "the run-time choice");
    }
    opts.deterministic = 0;
  }

  // A given forward config, then a given backward module (its own dQ strategy), each checked.
  void run_forward(const KernelConfig& config) {
    const ForwardCall call = forward_call();
    poison_forward();
    launch_forward(call, nullptr, config);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    check_forward(config.name());
  }
  void run_backward(const BwdConfig& config) {
    const BackwardCall call = backward_call(config.deterministic);
    poison_backward();
    launch_backward(call, nullptr, config);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    check_backward(config.name());
  }
};

}  // namespace flashgen::test
