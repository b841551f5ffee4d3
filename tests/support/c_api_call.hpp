// A valid dense forward call through the C ABI over fake pointers (no GPU touched before the checks), for tests
// that break one argument of it or launch it in an odd layout (tests/api/test_c_api*.cpp).
#pragma once

#include <cstdint>

#include "api/from_c.hpp"
#include "flashgen/flashgen.h"
#include "support/fake_pointer.hpp"
#include "support/mask_options.hpp"

namespace flashgen::test {

// A flashgen_tensor over a contiguous [batch, seqlen, heads, head_dim] buffer (BSHD).
inline flashgen_tensor bshd_tensor(void* data, flashgen_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d) {
  return flashgen_tensor{data, dtype, {b, s, h, d}, {s * h * d, h * d, d, 1}};
}

inline flashgen_tensor bshd(void* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  return bshd_tensor(data, FLASHGEN_FLOAT16, b, s, h, d);
}

struct Call {
  flashgen_tensor q = bshd(fake_pointer(1), 2, 100, 8, 64);
  flashgen_tensor k = bshd(fake_pointer(2), 2, 75, 4, 64);
  flashgen_tensor v = bshd(fake_pointer(3), 2, 75, 4, 64);
  flashgen_tensor out = bshd(fake_pointer(4), 2, 100, 8, 64);
  float* lse = static_cast<float*>(fake_pointer(5));
  flashgen_attention_options opts = flashgen::test::mask_options(FLASHGEN_MASK_CAUSAL);
  const flashgen_tensor* qp = &q;
  const flashgen_tensor* kp = &k;
  const flashgen_tensor* vp = &v;
  const flashgen_tensor* outp = &out;
  const flashgen_attention_options* optsp = &opts;

  int run() { return flashgen_attention_forward(qp, kp, vp, outp, lse, optsp, nullptr); }
};

// The odd but valid layout the two "odd layout" cases use: q a [b, h, s, d] view, k and v MQA views whose
// size-1 head dimension has stride 3 (never stepped over; their rows keep the 4-head pitch), no lse.
inline void use_odd_layout(Call& call) {
  call.q.stride[2] = 64 * 100;  // BHSD view: [b, h, s, d] memory
  call.q.stride[1] = 64;
  call.q.stride[0] = 8 * 100 * 64;
  call.k.shape[2] = call.v.shape[2] = 1;  // MQA: the size-1 head dimension's stride does not matter
  call.k.stride[2] = call.v.stride[2] = 3;
  call.lse = nullptr;
}

}  // namespace flashgen::test
