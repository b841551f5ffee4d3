// [gpu] The FP8 backward through the C ABI: FP8 q, k and v with descales per (batch entry, kv head), per tensor or
// none, a 16-bit out, dout and gradients; each gradient checked against float64 gradients of the dequantized inputs
// within the budget of a straightforward 16-bit backward over those inputs rounded to the output type (what a 16-bit
// caller would hold, and what the FP8 backward computes from), with the deterministic strategy bitwise repeated.
#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/number_formats.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/attention_reference.hpp"
#include "support/backward_reference.hpp"
#include "support/strided_tensors.hpp"

namespace {

using flashgen::AttentionShape;
using flashgen::DeviceBuffer;
using flashgen::DType;
using flashgen::HostInput;
using flashgen::StridedView;

enum class Descales { kPerHead, kTensor, kNone };

struct Fp8BackwardCase {
  const char* name;
  flashgen_dtype fp8;
  flashgen_dtype out;
  AttentionShape shape;
  flashgen_mask mask;
  Descales descales;
  bool q_bhsd = false;  // q in (batch, head, row) order: the widening reads any strides
};

flashgen_tensor tensor_of(const void* data, flashgen_dtype dtype, const StridedView& view) {
  flashgen_tensor t{};
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  for (int i = 0; i < 4; ++i) t.shape[i] = view.shape[i], t.stride[i] = view.stride[i];
  return t;
}

void check_case(const Fp8BackwardCase& c, uint64_t seed) {
  const AttentionShape& s = c.shape;
  const DType fp8 = flashgen::from_c(c.fp8), out_type = flashgen::from_c(c.out);
  const int64_t group = s.heads_q / s.heads_kv;
  std::mt19937_64 rng(seed);
  const StridedView q_view = c.q_bhsd ? flashgen::test::bhsd_view(s.batch, s.seqlen_q, s.heads_q, s.head_dim)
                                      : StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const StridedView kv_view = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  const StridedView o_view = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);

  // Codes and descales; the dequantized values (exact in double) and the same rounded to the output type.
  std::vector<uint8_t> codes[3];
  std::vector<float> descale[3];
  std::vector<double> exact[3], rounded[3];
  const int64_t heads[3] = {s.heads_q, s.heads_kv, s.heads_kv};
  const int64_t rows[3] = {s.seqlen_q, s.seqlen_k, s.seqlen_k};
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int t = 0; t < 3; ++t) {
    const StridedView& view = t == 0 ? q_view : kv_view;
    // Codes out to ±448 with descales bringing them to about 1.2; without descales, codes of values about 1.
    if (c.descales == Descales::kNone) {
      for (int64_t i = 0; i < view.span(); ++i) codes[t].push_back(flashgen::float_to_fp8_bits(normal(rng), fp8));
    } else {
      codes[t] = flashgen::random_fp8_codes(size_t(view.span()), fp8, rng);
    }
    for (int64_t i = 0; i < s.batch * s.heads_kv; ++i) {
      const float base = c.descales == Descales::kNone ? 1.f : flashgen::fp8_input_descale(t);
      descale[t].push_back(c.descales == Descales::kPerHead ? base * (1.f + 0.125f * float(i % 5)) : base);
    }
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t r = 0; r < rows[t]; ++r)
        for (int64_t h = 0; h < heads[t]; ++h)
          for (int64_t d = 0; d < s.head_dim; ++d) {
            const double value = flashgen::fp8_bits_to_double(codes[t][size_t(view.offset(b, r, h, d))], fp8);
            const float scale = descale[t][size_t(b * s.heads_kv + h / (t == 0 ? group : 1))];
            exact[t].push_back(value * double(scale));
            rounded[t].push_back(flashgen::round_to_dtype(float(value) * scale, out_type));
          }
  }
  flashgen::test::Rng values(static_cast<uint32_t>(seed));
  const std::vector<double> dout = flashgen::test::normal_values(values, o_view.span(), c.out);

  // The truth: float64 gradients of the dequantized inputs. The budget: a straightforward 16-bit backward over them
  // rounded to the output type, as a 16-bit caller holds them; out and lse are the float64 forward's of those rounded
  // inputs (out rounded to the output type), as a 16-bit forward of them would give the backward.
  const StridedView c_q = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const HostInput hq = HostInput::float64(exact[0].data(), c_q), hk = HostInput::float64(exact[1].data(), kv_view),
                  hv = HostInput::float64(exact[2].data(), kv_view), hdo = HostInput::float64(dout.data(), o_view);
  const HostInput rq = HostInput::float64(rounded[0].data(), c_q), rk = HostInput::float64(rounded[1].data(), kv_view),
                  rv = HostInput::float64(rounded[2].data(), kv_view);
  const double scale = flashgen::effective_softmax_scale(0.f, s.head_dim);
  const flashgen::Mask mask = flashgen::from_c(c.mask);
  const flashgen::AttentionResult forward = flashgen::attention_reference_f64(s, rq, rk, rv, scale, mask);
  const flashgen::AttentionGradients ref64 =
      flashgen::attention_backward_reference_f64(s, hq, hk, hv, hdo, scale, mask);
  const flashgen::AttentionGradients naive =
      flashgen::test::attention_backward_naive(s, rq, rk, rv, hdo, scale, mask, c.out);

  DeviceBuffer dcodes[3], ddescale[3];
  for (int t = 0; t < 3; ++t) {
    dcodes[t] = DeviceBuffer(codes[t].size());
    dcodes[t].upload(codes[t]);
    ddescale[t] = DeviceBuffer(descale[t].size() * sizeof(float));
    ddescale[t].upload(descale[t]);
  }
  std::vector<uint16_t> out_bits, dout_bits;
  for (double x : forward.out) out_bits.push_back(flashgen::float_to_dtype_bits(float(x), out_type));
  for (double x : dout) dout_bits.push_back(flashgen::float_to_dtype_bits(float(x), out_type));
  std::vector<float> lse(forward.lse.begin(), forward.lse.end());
  DeviceBuffer dout_buf(dout_bits.size() * 2), out_buf(out_bits.size() * 2), lse_buf(lse.size() * sizeof(float));
  dout_buf.upload(dout_bits);
  out_buf.upload(out_bits);
  lse_buf.upload(lse);
  DeviceBuffer grads[3] = {DeviceBuffer(size_t(c_q.span()) * 2), DeviceBuffer(size_t(kv_view.span()) * 2),
                           DeviceBuffer(size_t(kv_view.span()) * 2)};

  const flashgen_tensor tq = tensor_of(dcodes[0].data(), c.fp8, q_view),
                        tk = tensor_of(dcodes[1].data(), c.fp8, kv_view),
                        tv = tensor_of(dcodes[2].data(), c.fp8, kv_view),
                        tout = tensor_of(out_buf.data(), c.out, o_view),
                        tdout = tensor_of(dout_buf.data(), c.out, o_view), tdq = tensor_of(grads[0].data(), c.out, c_q),
                        tdk = tensor_of(grads[1].data(), c.out, kv_view),
                        tdv = tensor_of(grads[2].data(), c.out, kv_view);
  std::vector<uint16_t> first[3];
  for (bool deterministic : {false, true}) {
    flashgen_attention_options opts = FLASHGEN_ATTENTION_OPTIONS_INIT;
    opts.mask = c.mask;
    opts.deterministic = deterministic;
    if (c.descales != Descales::kNone) {
      opts.q_descale = static_cast<const float*>(ddescale[0].data());
      opts.k_descale = static_cast<const float*>(ddescale[1].data());
      opts.v_descale = static_cast<const float*>(ddescale[2].data());
      if (c.descales == Descales::kPerHead) {
        opts.q_descale_stride[0] = opts.k_descale_stride[0] = opts.v_descale_stride[0] = s.heads_kv;
        opts.q_descale_stride[1] = opts.k_descale_stride[1] = opts.v_descale_stride[1] = 1;
      }
    }
    for (int run = 0; run < (deterministic ? 2 : 1); ++run) {
      for (DeviceBuffer& g : grads) g.fill_bytes(0xff);
      const int status = flashgen_attention_backward(
          &tq, &tk, &tv, &tout, &tdout, static_cast<const float*>(lse_buf.data()), &tdq, &tdk, &tdv, &opts, nullptr);
      INFO(c.name << (deterministic ? ", deterministic" : ", atomic dq") << ": " << flashgen_last_error());
      REQUIRE(status == FLASHGEN_SUCCESS);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      const char* names[3] = {"dq", "dk", "dv"};
      const std::vector<double>* want[3] = {&ref64.dq, &ref64.dk, &ref64.dv};
      const std::vector<double>* budget[3] = {&naive.dq, &naive.dk, &naive.dv};
      for (int t = 0; t < 3; ++t) {
        const std::vector<uint16_t> bits = grads[t].download_all<uint16_t>();
        if (deterministic && run == 1) {
          CHECK(bits == first[t]);  // the deterministic strategy's bits again
          continue;
        }
        if (deterministic) first[t] = bits;
        std::vector<double> got;
        for (uint16_t b : bits) got.push_back(flashgen::dtype_bits_to_float(b, out_type));
        const StridedView& view = t == 0 ? c_q : kv_view;
        const flashgen::CheckReport report = flashgen::test::check_gradient(
            names[t], {view.shape[0], view.shape[1], view.shape[2], view.shape[3]}, got, *want[t], *budget[t], c.out);
        INFO(report.text);
        CHECK(report.ok);
      }
    }
  }
}

}  // namespace

TEST_CASE("The FP8 backward's gradients match float64 gradients of the dequantized inputs",
          "[gpu][fp8][fp8_backward]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  if (flashgen::device_sm(scope.device()) < 89) FLASHGEN_SKIP_TEST("FP8 needs sm_89 or newer");
  const std::vector<Fp8BackwardCase> cases = {
      {"e4m3 d128 GQA 4/2 bottom-right causal, keys past queries, per-(batch, kv head) descales, bf16",
       FLASHGEN_FLOAT8_E4M3, FLASHGEN_BFLOAT16, AttentionShape{2, 200, 333, 4, 2, 128}, FLASHGEN_MASK_CAUSAL,
       Descales::kPerHead},
      {"e5m2 d64 MHA no mask, one descale, q in BHSD order, fp16", FLASHGEN_FLOAT8_E5M2, FLASHGEN_FLOAT16,
       AttentionShape{1, 257, 129, 3, 3, 64}, FLASHGEN_MASK_NONE, Descales::kTensor, /*q_bhsd=*/true},
      {"e4m3 d256 MQA top-left causal, queries past the keys, no descales, bf16", FLASHGEN_FLOAT8_E4M3,
       FLASHGEN_BFLOAT16, AttentionShape{1, 150, 100, 4, 1, 256}, FLASHGEN_MASK_CAUSAL_TOP_LEFT, Descales::kNone}};
  uint64_t seed = 0xbf8;
  for (const Fp8BackwardCase& c : cases) check_case(c, seed++);
}
