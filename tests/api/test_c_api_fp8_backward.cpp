// Tests for the FP8 backward's arguments (no GPU): each bad one refused naming it, nothing launched; a valid call runs
// the 16-bit backward of its output's type over q, k and v widened into the workspace, with the sources, strides and
// descales the widening kernel reads.
#include <cstdint>
#include <functional>
#include <string>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "generator/bwd_config.hpp"
#include "generator/generator.hpp"
#include "launch/attention_backward.hpp"
#include "support/fake_pointer.hpp"

namespace {

using flashgen::DType;
using flashgen::test::fake_pointer;

flashgen_tensor bshd(void* data, flashgen_dtype dtype, int64_t n0, int64_t n1, int64_t heads, int64_t head_dim) {
  return flashgen_tensor{
      data, dtype, {n0, n1, heads, head_dim}, {n1 * heads * head_dim, heads * head_dim, head_dim, 1}};
}

// Two batch entries of 300 e4m3 queries against 500 keys, 8 heads over 2 kv heads, d128, with bf16 out, dout and
// gradients; descales per (batch entry, kv head) for q and k and one for v.
struct Fp8BackwardArgs {
  flashgen_tensor q = bshd(fake_pointer(1), FLASHGEN_FLOAT8_E4M3, 2, 300, 8, 128);
  flashgen_tensor k = bshd(fake_pointer(2), FLASHGEN_FLOAT8_E4M3, 2, 500, 2, 128);
  flashgen_tensor v = bshd(fake_pointer(3), FLASHGEN_FLOAT8_E4M3, 2, 500, 2, 128);
  flashgen_tensor out = bshd(fake_pointer(4), FLASHGEN_BFLOAT16, 2, 300, 8, 128);
  flashgen_tensor dout = bshd(fake_pointer(5), FLASHGEN_BFLOAT16, 2, 300, 8, 128);
  flashgen_tensor dq = bshd(fake_pointer(6), FLASHGEN_BFLOAT16, 2, 300, 8, 128);
  flashgen_tensor dk = bshd(fake_pointer(7), FLASHGEN_BFLOAT16, 2, 500, 2, 128);
  flashgen_tensor dv = bshd(fake_pointer(8), FLASHGEN_BFLOAT16, 2, 500, 2, 128);
  const float* lse = static_cast<const float*>(fake_pointer(9));
  flashgen_attention_options opts = FLASHGEN_ATTENTION_OPTIONS_INIT;
  Fp8BackwardArgs() {
    opts.mask = FLASHGEN_MASK_CAUSAL;
    opts.q_descale = static_cast<const float*>(fake_pointer(10));
    opts.k_descale = static_cast<const float*>(fake_pointer(11));
    opts.v_descale = static_cast<const float*>(fake_pointer(12));
    opts.q_descale_stride[0] = opts.k_descale_stride[0] = 2;
    opts.q_descale_stride[1] = opts.k_descale_stride[1] = 1;
  }
  flashgen::BackwardCall call() const {
    const flashgen::TensorView views[] = {flashgen::from_c(q),   flashgen::from_c(k),    flashgen::from_c(v),
                                          flashgen::from_c(out), flashgen::from_c(dout), flashgen::from_c(dq),
                                          flashgen::from_c(dk),  flashgen::from_c(dv)};
    const flashgen::CallOptions options = flashgen::from_c(opts);
    return flashgen::make_backward_call(&views[0], &views[1], &views[2], &views[3], &views[4], lse, &views[5],
                                        &views[6], &views[7], &options);
  }
};

void check_rejected(const std::function<void(Fp8BackwardArgs&)>& edit, int status, const std::string& message) {
  Fp8BackwardArgs a;
  edit(a);
  INFO("expected: " << message);
  CHECK(flashgen_attention_backward(&a.q, &a.k, &a.v, &a.out, &a.dout, a.lse, &a.dq, &a.dk, &a.dv, &a.opts, nullptr) ==
        status);
  const std::string error = flashgen_last_error();
  INFO("got: " << error);
  CHECK(error.find(message) != std::string::npos);
}

}  // namespace

TEST_CASE("an FP8 backward refuses each bad argument with a message naming it", "[c_api][fp8][fp8_backward]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT, kUnsupported = FLASHGEN_ERROR_UNSUPPORTED;
  check_rejected([](Fp8BackwardArgs& a) { a.v.dtype = FLASHGEN_FLOAT8_E5M2; }, kInvalid,
                 "v.dtype is e5m2 but q.dtype is e4m3");
  check_rejected([](Fp8BackwardArgs& a) { a.dq.dtype = FLASHGEN_FLOAT8_E4M3; }, kUnsupported,
                 "dq.dtype is e4m3: FP8 is taken by q, k and v");
  check_rejected([](Fp8BackwardArgs& a) { a.dout.dtype = FLASHGEN_FLOAT16; }, kInvalid,
                 "dout.dtype is fp16 but out.dtype is bf16");
  check_rejected([](Fp8BackwardArgs& a) { a.dk.dtype = FLASHGEN_FLOAT16; }, kInvalid,
                 "dk.dtype is fp16 but out.dtype is bf16");
  check_rejected(
      [](Fp8BackwardArgs& a) {
        for (flashgen_tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) t->shape[3] = 72;
      },
      kUnsupported, "the FP8 backward takes one head dim, a multiple of 16 up to 256");
  check_rejected(
      [](Fp8BackwardArgs& a) {
        for (flashgen_tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) t->shape[0] = 21846;
      },
      kInvalid, "q.shape[0] (batch) is 21846: an FP8 backward takes at most 21845");
  check_rejected([](Fp8BackwardArgs& a) { a.opts.v_descale_stride[0] = -2; }, kInvalid,
                 "opts.v_descale_stride[0] must be in [0, 2^40], got -2");
  check_rejected([](Fp8BackwardArgs& a) { a.q.dtype = a.k.dtype = a.v.dtype = FLASHGEN_BFLOAT16; }, kInvalid,
                 "opts.q_descale: given for 16-bit q, k and v (descales are an FP8 call's); pass NULL");
  // Packed batches: the forward only.
  flashgen_varlen_backward_args packed{};
  packed.size = sizeof packed;
  packed.q = bshd(fake_pointer(1), FLASHGEN_FLOAT8_E4M3, 1, 600, 8, 128);
  CHECK(flashgen_attention_varlen_backward(&packed, nullptr) == kUnsupported);
  CHECK(std::string(flashgen_last_error()).find("the FP8 backward takes dense batches") != std::string::npos);
}

TEST_CASE("an FP8 backward runs its output type's backward over q, k and v widened into the workspace",
          "[fp8][fp8_backward]") {
  Fp8BackwardArgs a;
  const flashgen::BackwardCall call = a.call();
  CHECK(call.problem.dtype == DType::kBFloat16);
  const flashgen::AttnBwdParams& p = call.params;
  CHECK(p.fp8_format == 1);
  CHECK(p.fp8_sources[0] == a.q.data);
  CHECK(p.fp8_sources[2] == a.v.data);
  CHECK(p.fp8_strides[1][1] == 2 * 128);  // k's rows in its own (FP8) layout
  CHECK(p.q_descale == a.opts.q_descale);
  CHECK(p.k_descale_strides[0] == 2);
  CHECK(p.v_descale_strides[0] == 0);
  // The kernels read the widened copies, BSHD contiguous.
  CHECK(p.q_batch_stride == 300 * 8 * 128);
  CHECK(p.k_row_stride == 2 * 128);
  CHECK(p.v_head_stride == 128);

  // The workspace holds the three 16-bit copies beside what a bf16 call of the same sizes needs.
  Fp8BackwardArgs plain = a;
  plain.q.dtype = plain.k.dtype = plain.v.dtype = FLASHGEN_BFLOAT16;
  plain.opts.q_descale = plain.opts.k_descale = plain.opts.v_descale = nullptr;
  const flashgen::BackwardCall bf16 = plain.call();
  CHECK(bf16.params.fp8_format == 0);
  const auto config = flashgen::BwdConfig::from_name("bwd_sm90_bf16_d128_m64_n128_s2_causal");
  const flashgen::BwdWorkspace widened = config.workspace(p);
  const flashgen::BwdWorkspace base = config.workspace(bf16.params);
  const size_t copies = 2 * (2 * 300 * 8 * 128 + 2 * (2 * 500 * 2 * 128));
  CHECK(widened.bytes == base.bytes + copies);
  CHECK(widened.widened[0] == base.bytes);
  CHECK(base.widened[0] == flashgen::Workspace::kAbsent);

  // e5m2 reads as format 2.
  Fp8BackwardArgs e5m2 = a;
  e5m2.q.dtype = e5m2.k.dtype = e5m2.v.dtype = FLASHGEN_FLOAT8_E5M2;
  CHECK(e5m2.call().params.fp8_format == 2);
}

TEST_CASE("an FP8 backward's module is its 16-bit config's _fp8in twin, with the widening kernel first",
          "[fp8][fp8_backward]") {
  const auto plain = flashgen::BwdConfig::from_name("bwd_sm80_bf16_d64_m64_n64_w4_s2_x1_causal_det_qm64_qn64_qw4_qs2");
  flashgen::BwdConfig twin = plain;
  twin.fp8_inputs = true;
  CHECK(twin.name() == "bwd_sm80_bf16_d64_m64_n64_w4_s2_x1_causal_fp8in_det_qm64_qn64_qw4_qs2");
  CHECK(flashgen::BwdConfig::from_name(twin.name()) == twin);
  nlohmann::json j = twin;
  CHECK(j.value("fp8_inputs", false));
  CHECK(j.get<flashgen::BwdConfig>() == twin);
  // Only the twin's module holds the widening kernel: 16-bit modules are as they were.
  CHECK(flashgen::generate(twin).translation_unit.find(twin.symbol(flashgen::BwdKernel::kWiden)) != std::string::npos);
  CHECK(flashgen::generate(plain).translation_unit.find("BwdWiden") == std::string::npos);
  CHECK(flashgen::BwdConfig::from_name("bwd_sm90_fp16_d128_m64_n128_s2_fp8in_det").fp8_inputs);
}
