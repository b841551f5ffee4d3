// C ABI argument checking: every bad input returns a nonzero status and a message naming the argument,
// before any GPU work (on a machine without a driver these still report the argument, not the GPU).
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "catch.hpp"
#include "cuda_driver.hpp"
#include "flashgen/flashgen.h"

namespace {

// Never dereferenced: validation rejects the call first. 16-byte aligned like real allocations.
void* fake_pointer(std::uintptr_t n) { return reinterpret_cast<void*>(0x100000 + n * 0x1000000); }

flashgen_tensor bshd(void* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  flashgen_tensor t{};
  t.data = data;
  t.dtype = FLASHGEN_FLOAT16;
  t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
  t.stride[0] = s * h * d, t.stride[1] = h * d, t.stride[2] = d, t.stride[3] = 1;
  return t;
}

struct Call {
  flashgen_tensor q = bshd(fake_pointer(1), 2, 100, 8, 64);
  flashgen_tensor k = bshd(fake_pointer(2), 2, 75, 4, 64);
  flashgen_tensor v = bshd(fake_pointer(3), 2, 75, 4, 64);
  flashgen_tensor out = bshd(fake_pointer(4), 2, 100, 8, 64);
  float* lse = static_cast<float*>(fake_pointer(5));
  flashgen_attention_options opts{0.f, FLASHGEN_MASK_CAUSAL, 0};
  const flashgen_tensor* qp = &q;
  const flashgen_tensor* kp = &k;
  const flashgen_tensor* vp = &v;
  const flashgen_tensor* outp = &out;
  const flashgen_attention_options* optsp = &opts;

  int run() { return flashgen_attention_forward(qp, kp, vp, outp, lse, optsp, nullptr); }
};

// Applies a mutation to a valid call and checks the status and that the message names `expected`.
void check_rejected(const std::function<void(Call&)>& mutate, int status, const std::string& expected) {
  Call call;
  mutate(call);
  const int result = call.run();
  const std::string message = flashgen_last_error();
  INFO("message: " << message);
  CHECK(result == status);
  CHECK(message.find(expected) != std::string::npos);
}

}  // namespace

TEST_CASE("C ABI rejects each bad argument with a message naming it", "[c_api]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  SECTION("null pointers") {
    check_rejected([](Call& c) { c.qp = nullptr; }, kInvalid, "q: null pointer");
    check_rejected([](Call& c) { c.kp = nullptr; }, kInvalid, "k: null pointer");
    check_rejected([](Call& c) { c.vp = nullptr; }, kInvalid, "v: null pointer");
    check_rejected([](Call& c) { c.outp = nullptr; }, kInvalid, "out: null pointer");
    check_rejected([](Call& c) { c.optsp = nullptr; }, kInvalid, "opts: null pointer");
    check_rejected([](Call& c) { c.v.data = nullptr; }, kInvalid, "v.data: null pointer");
  }
  SECTION("dtypes") {
    check_rejected([](Call& c) { c.k.dtype = FLASHGEN_BFLOAT16; }, kInvalid, "k.dtype is bf16 but q.dtype is fp16");
    check_rejected([](Call& c) { c.out.dtype = FLASHGEN_BFLOAT16; }, kInvalid, "out.dtype");
    check_rejected([](Call& c) { c.q.dtype = static_cast<flashgen_dtype>(7); }, kInvalid, "q.dtype: unknown value 7");
  }
  SECTION("shapes") {
    check_rejected([](Call& c) { c.k.shape[0] = 3; }, kInvalid, "k.shape[0] (batch) is 3 but q.shape[0] (batch) is 2");
    check_rejected([](Call& c) { c.v.shape[1] = 74; }, kInvalid, "v.shape[1] (seqlen) is 74 but k.shape[1]");
    check_rejected([](Call& c) { c.v.shape[2] = 2; }, kInvalid, "v.shape[2] (heads)");
    check_rejected([](Call& c) { c.k.shape[3] = 32; }, kInvalid, "k.shape[3] (head_dim) is 32 but q.shape[3]");
    check_rejected([](Call& c) { c.out.shape[1] = 99; }, kInvalid, "out.shape[1] (seqlen) is 99");
    check_rejected([](Call& c) { c.q.shape[1] = 0; }, kInvalid, "q.shape[1] (seqlen) must be in [1, 2^31), got 0");
    check_rejected([](Call& c) { c.k.shape[1] = -5; }, kInvalid, "k.shape[1] (seqlen) must be in [1, 2^31), got -5");
    check_rejected([](Call& c) { c.q.shape[1] = int64_t(1) << 31; }, kInvalid, "q.shape[1] (seqlen)");
    check_rejected([](Call& c) { c.q.shape[2] = c.out.shape[2] = 6; }, kInvalid,
                   "q.shape[2] (heads) = 6 must be a multiple of k.shape[2] (heads) = 4");
  }
  SECTION("head_dim") {
    auto set_d = [](int64_t d) {
      return [d](Call& c) {
        for (flashgen_tensor* t : {&c.q, &c.k, &c.v, &c.out}) *t = bshd(t->data, t->shape[0], t->shape[1], t->shape[2], d);
      };
    };
    check_rejected(set_d(100), FLASHGEN_ERROR_UNSUPPORTED, "q.shape[3] (head_dim) = 100 is unsupported");
    check_rejected(set_d(264), FLASHGEN_ERROR_UNSUPPORTED, "q.shape[3] (head_dim) = 264 is unsupported");
  }
  SECTION("strides and alignment") {
    check_rejected([](Call& c) { c.q.stride[3] = 2; }, kInvalid, "q.stride[3] must be 1");
    check_rejected([](Call& c) { c.k.stride[1] = 260; }, kInvalid, "k.stride[1] must be a non-negative multiple of 8");
    check_rejected([](Call& c) { c.out.stride[0] = -8; }, kInvalid, "out.stride[0]");
    check_rejected([](Call& c) { c.v.data = static_cast<char*>(c.v.data) + 8; }, kInvalid,
                   "v.data: pointer must be 16-byte aligned");
    check_rejected([](Call& c) { c.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(c.lse) + 2); }, kInvalid,
                   "lse: pointer must be 4-byte aligned");
  }
  SECTION("options") {
    check_rejected([](Call& c) { c.opts.mask = static_cast<flashgen_mask>(3); }, kInvalid, "opts.mask: unknown value 3");
    check_rejected([](Call& c) { c.opts.softmax_scale = std::nanf(""); }, kInvalid, "opts.softmax_scale must be finite");
  }
}

TEST_CASE("C ABI accepts odd but valid layouts before touching the GPU", "[c_api]") {
  std::string why;
  if (flashgen::driver_available(&why)) return;  // [gpu] tests cover these with real launches
  Call call;
  call.q.stride[2] = 64 * 100;  // BHSD view: [b, h, s, d] memory
  call.q.stride[1] = 64;
  call.q.stride[0] = 8 * 100 * 64;
  call.k.shape[2] = call.v.shape[2] = 1;  // MQA: the size-1 head dimension's stride does not matter
  call.k.stride[2] = call.v.stride[2] = 3;
  call.lse = nullptr;
  CHECK(call.run() == FLASHGEN_ERROR_NO_DEVICE);
  CHECK(std::string(flashgen_last_error()).find("CUDA") != std::string::npos);
}

TEST_CASE("C ABI reports a missing GPU clearly and keeps the last error per thread", "[c_api]") {
  std::string why;
  if (flashgen::driver_available(&why)) return;  // only meaningful without a driver
  Call call;
  CHECK(call.run() == FLASHGEN_ERROR_NO_DEVICE);
  const std::string message = flashgen_last_error();
  CHECK_FALSE(message.empty());
  CHECK(message == why);
  CHECK(std::string(flashgen_version()) == FLASHGEN_VERSION);
}
