// C ABI argument checking of flashgen_attention_backward: every bad input returns a nonzero status and a
// message naming the argument, before any GPU work.
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/c_api_call.hpp"
#include "support/fake_pointer.hpp"
#include "support/mask_options.hpp"

namespace {

using flashgen::test::fake_pointer;

flashgen_tensor bshd(void* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  return flashgen::test::bshd_tensor(data, FLASHGEN_BFLOAT16, b, s, h, d);
}

struct BackwardCall {
  flashgen_tensor q = bshd(fake_pointer(1), 2, 100, 8, 64);
  flashgen_tensor k = bshd(fake_pointer(2), 2, 75, 4, 64);
  flashgen_tensor v = bshd(fake_pointer(3), 2, 75, 4, 64);
  flashgen_tensor out = bshd(fake_pointer(4), 2, 100, 8, 64);
  flashgen_tensor dout = bshd(fake_pointer(5), 2, 100, 8, 64);
  flashgen_tensor dq = bshd(fake_pointer(6), 2, 100, 8, 64);
  flashgen_tensor dk = bshd(fake_pointer(7), 2, 75, 4, 64);
  flashgen_tensor dv = bshd(fake_pointer(8), 2, 75, 4, 64);
  const float* lse = static_cast<const float*>(fake_pointer(9));
  flashgen_attention_options opts = flashgen::test::mask_options(FLASHGEN_MASK_CAUSAL, true);
  const flashgen_tensor* doutp = &dout;
  const flashgen_tensor* dqp = &dq;
  const flashgen_tensor* dkp = &dk;
  const flashgen_tensor* dvp = &dv;
  const flashgen_attention_options* optsp = &opts;

  int run() { return flashgen_attention_backward(&q, &k, &v, &out, doutp, lse, dqp, dkp, dvp, optsp, nullptr); }
};

void check_rejected(const std::function<void(BackwardCall&)>& mutate, int status, const std::string& expected) {
  BackwardCall call;
  mutate(call);
  const int result = call.run();
  const std::string message = flashgen_last_error();
  INFO("message: " << message);
  CHECK(result == status);
  CHECK(message.find(expected) != std::string::npos);
}

}  // namespace

TEST_CASE("C ABI backward rejects each bad argument with a message naming it", "[c_api][backward]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  check_rejected([](BackwardCall& c) { c.doutp = nullptr; }, kInvalid, "dout: null pointer");
  check_rejected([](BackwardCall& c) { c.dqp = nullptr; }, kInvalid, "dq: null pointer");
  check_rejected([](BackwardCall& c) { c.dkp = nullptr; }, kInvalid, "dk: null pointer");
  check_rejected([](BackwardCall& c) { c.dvp = nullptr; }, kInvalid, "dv: null pointer");
  check_rejected([](BackwardCall& c) { c.optsp = nullptr; }, kInvalid, "opts: null pointer");
  check_rejected([](BackwardCall& c) { c.lse = nullptr; }, kInvalid, "lse: null pointer");
  check_rejected([](BackwardCall& c) { c.dv.data = nullptr; }, kInvalid, "dv.data: null pointer");
  check_rejected([](BackwardCall& c) { c.dq.dtype = FLASHGEN_FLOAT16; }, kInvalid, "dq.dtype is fp16 but q.dtype is bf16");
  check_rejected([](BackwardCall& c) { c.dout.shape[1] = 99; }, kInvalid, "dout.shape[1] (seqlen) is 99");
  check_rejected([](BackwardCall& c) { c.dk.shape[2] = 8; }, kInvalid, "dk.shape[2] (heads) is 8 but k.shape[2]");
  check_rejected([](BackwardCall& c) { c.dv.shape[1] = 76; }, kInvalid, "dv.shape[1] (seqlen) is 76");
  check_rejected([](BackwardCall& c) { c.dq.stride[3] = 2; }, kInvalid, "dq.stride[3] must be 1");
  check_rejected([](BackwardCall& c) { c.dk.stride[1] = 0; }, kInvalid, "dk.stride[1] is 0");
  check_rejected([](BackwardCall& c) { c.dout.data = static_cast<char*>(c.dout.data) + 8; }, kInvalid,
                 "dout.data: pointer must be 16-byte aligned");
  check_rejected([](BackwardCall& c) { c.lse = reinterpret_cast<const float*>(reinterpret_cast<const char*>(c.lse) + 2); },
                 kInvalid, "lse: pointer must be 4-byte aligned");
  check_rejected([](BackwardCall& c) { c.opts.mask = static_cast<flashgen_mask>(9); }, kInvalid,
                 "opts.mask: unknown value 9");
  check_rejected([](BackwardCall& c) { c.opts.softmax_scale = std::nanf(""); }, kInvalid,
                 "opts.softmax_scale must be finite");
  check_rejected(
      [](BackwardCall& c) {
        for (flashgen_tensor* t : {&c.q, &c.out, &c.dout, &c.dq}) *t = bshd(t->data, 2, 100, 8, 100);
        for (flashgen_tensor* t : {&c.k, &c.v, &c.dk, &c.dv}) *t = bshd(t->data, 2, 75, 4, 100);
      },
      FLASHGEN_ERROR_UNSUPPORTED, "q.shape[3] (head_dim) = 100 is unsupported");
  // Keys past 512, the widest the forward and the backward take.
  check_rejected(
      [](BackwardCall& c) {
        for (flashgen_tensor* t : {&c.q, &c.out, &c.dout, &c.dq}) *t = bshd(t->data, 2, 100, 8, 520);
        for (flashgen_tensor* t : {&c.k, &c.v, &c.dk, &c.dv}) *t = bshd(t->data, 2, 75, 4, 520);
      },
      FLASHGEN_ERROR_UNSUPPORTED,
      "q.shape[3] (head_dim) = 520 is unsupported: head_dim must be a multiple of 8 up to 512");
  // Values of a head dim of their own: dout and dv take it, and a dim off the 8-column step is no kernel's.
  check_rejected(
      [](BackwardCall& c) {
        c.v = bshd(c.v.data, 2, 75, 4, 32);
        c.out = bshd(c.out.data, 2, 100, 8, 32);
      },
      kInvalid, "dout.shape[3] (head_dim) is 64 but out.shape[3] (head_dim) is 32");
  check_rejected(
      [](BackwardCall& c) {
        c.v = bshd(c.v.data, 2, 75, 4, 32);
        c.out = c.dout = bshd(c.out.data, 2, 100, 8, 32);
      },
      kInvalid, "dv.shape[3] (head_dim) is 64 but v.shape[3] (head_dim) is 32");
  check_rejected(
      [](BackwardCall& c) {
        c.v = c.dv = bshd(c.v.data, 2, 75, 4, 36);
        c.out = c.dout = bshd(c.out.data, 2, 100, 8, 36);
      },
      FLASHGEN_ERROR_UNSUPPORTED, "v.shape[3] (head_dim) = 36 is unsupported");
  static float sink_grads[8];
  check_rejected([](BackwardCall& c) { c.opts.dsinks = sink_grads; }, kInvalid,
                 "opts.dsinks: given without opts.sinks");
  check_rejected([](BackwardCall& c) {
    c.opts.sinks = sink_grads;
    c.opts.dsinks = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(sink_grads) + 1);
  }, kInvalid, "opts.dsinks: pointer must be 4-byte aligned");
}

TEST_CASE("C ABI backward with valid arguments reaches the GPU check", "[c_api][backward]") {
  if (flashgen::driver_available()) FLASHGEN_SKIP_TEST("with a driver the fake pointers are refused as not device memory");
  BackwardCall call;
  CHECK(call.run() == FLASHGEN_ERROR_NO_DEVICE);
}
