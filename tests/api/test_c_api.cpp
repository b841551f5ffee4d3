// C ABI argument checking: every bad input returns a nonzero status and a message naming the argument,
// before any GPU work (on a machine without a driver these still report the argument, not the GPU). Where a
// call runs and which memory it refuses: test_c_api_devices.cpp.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "support/c_api_call.hpp"
#include "tuner/choice.hpp"
#include "tuner/problem_key.hpp"

using flashgen::test::bshd;
using flashgen::test::fake_pointer;
using flashgen::test::Call;

namespace {

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
    check_rejected([](Call& c) { c.out.data = nullptr; }, kInvalid, "out.data: null pointer");
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
    check_rejected([](Call& c) { c.q.shape[1] = 0; }, kInvalid, "q.shape[1] (seqlen) must be in [1, 2^30], got 0");
    check_rejected([](Call& c) { c.k.shape[1] = -5; }, kInvalid, "k.shape[1] (seqlen) must be in [1, 2^30], got -5");
    check_rejected([](Call& c) { c.q.shape[1] = int64_t(1) << 31; }, kInvalid, "q.shape[1] (seqlen)");
    check_rejected([](Call& c) { c.q.shape[2] = c.out.shape[2] = 6; }, kInvalid,
                   "q.shape[2] (heads) = 6 must be a multiple of k.shape[2] (heads) = 4");
    // gridDim.y and gridDim.z stop at 65535.
    check_rejected(
        [](Call& c) {
          for (flashgen_tensor* t : {&c.q, &c.k, &c.v, &c.out}) t->shape[0] = 65536;
        },
        kInvalid, "q: batch and heads must each be at most 65535 (grid limits)");
    check_rejected(
        [](Call& c) {
          for (flashgen_tensor* t : {&c.q, &c.out}) *t = bshd(t->data, 2, 100, 65536, 64);
        },
        kInvalid, "q: batch and heads must each be at most 65535 (grid limits)");
  }
  SECTION("head_dim") {
    auto set_d = [](int64_t d) {
      return [d](Call& c) {
        for (flashgen_tensor* t : {&c.q, &c.k, &c.v, &c.out}) *t = bshd(t->data, t->shape[0], t->shape[1], t->shape[2], d);
      };
    };
    check_rejected(set_d(100), FLASHGEN_ERROR_UNSUPPORTED, "q.shape[3] (head_dim) = 100 is unsupported");
    check_rejected(set_d(520), FLASHGEN_ERROR_UNSUPPORTED,
                   "q.shape[3] (head_dim) = 520 is unsupported: head_dim must be a multiple of 8 up to 512");
  }
  SECTION("a values' head dim of its own") {
    auto set_dv = [](int64_t dv, int64_t out_dv) {
      return [dv, out_dv](Call& c) {
        c.v = bshd(c.v.data, 2, 75, 4, dv);
        c.out = bshd(c.out.data, 2, 100, 8, out_dv);
      };
    };
    check_rejected(set_dv(32, 64), kInvalid,
                   "out.shape[3] (head_dim) is 64 but v.shape[3] (head_dim) is 32: the output has the values' head dim");
    check_rejected(set_dv(100, 100), FLASHGEN_ERROR_UNSUPPORTED,
                   "v.shape[3] (head_dim) = 100 is unsupported: a values' head dim of its own must be a multiple of 8 "
                   "up to 512");
    check_rejected(set_dv(520, 520), FLASHGEN_ERROR_UNSUPPORTED, "v.shape[3] (head_dim) = 520 is unsupported");
  }
  SECTION("strides and alignment") {
    check_rejected([](Call& c) { c.q.stride[3] = 2; }, kInvalid, "q.stride[3] must be 1");
    check_rejected([](Call& c) { c.k.stride[1] = 260; }, kInvalid, "k.stride[1] must be a non-negative multiple of 8");
    check_rejected([](Call& c) { c.out.stride[0] = -8; }, kInvalid, "out.stride[0]");
    // Rows 8 elements apart with head_dim 64: each row would overwrite the next one's first 56 elements.
    check_rejected([](Call& c) { c.out.stride[2] = 8; }, kInvalid,
                   "out.stride[2] = 8 is less than the 64 elements the smaller strides span");
    check_rejected([](Call& c) { c.v.data = static_cast<char*>(c.v.data) + 8; }, kInvalid,
                   "v.data: pointer must be 16-byte aligned");
    // Strides whose products overflow int64 (UB before this check) or reach past 2^60 elements.
    check_rejected([](Call& c) { c.out.stride[0] = int64_t{1} << 62; }, kInvalid,
                   "out: its strides reach past 2^60 elements");
    check_rejected([](Call& c) { c.k.stride[1] = int64_t{1} << 56; }, kInvalid, "k: its strides reach past 2^60");
    check_rejected([](Call& c) { c.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(c.lse) + 2); }, kInvalid,
                   "lse: pointer must be 4-byte aligned");
  }
  SECTION("options") {
    check_rejected([](Call& c) { c.opts.mask = static_cast<flashgen_mask>(4); }, kInvalid,
                   "opts.mask: unknown value 4");
    check_rejected([](Call& c) { c.opts.softmax_scale = std::nanf(""); }, kInvalid, "opts.softmax_scale must be finite");
    check_rejected([](Call& c) { c.opts.softmax_scale = std::numeric_limits<float>::infinity(); }, kInvalid,
                   "opts.softmax_scale must be finite");
    // Finite, but scale * log2(e), what the kernels multiply by, is not.
    check_rejected([](Call& c) { c.opts.softmax_scale = 3e38f; }, kInvalid, "opts.softmax_scale must be finite");
    check_rejected([](Call& c) { c.opts.softcap = -1.f; }, kInvalid, "opts.softcap must be 0 (none) or a positive");
    check_rejected([](Call& c) { c.opts.softcap = std::nanf(""); }, kInvalid, "opts.softcap must be 0");
    check_rejected([](Call& c) { c.opts.softcap = std::numeric_limits<float>::infinity(); }, kInvalid,
                   "opts.softcap must be 0");
    // Finite, and within 1e30 of the scale, but softcap * log2(e), the forward's scale of capped scores, is not.
    check_rejected([](Call& c) { c.opts.softcap = 3e38f, c.opts.softmax_scale = 1e9f; }, kInvalid,
                   "opts.softcap must be 0 (none) or a positive finite cap below 2.3e38");
    // The kernels multiply by softcap / scale and scale / softcap.
    check_rejected([](Call& c) { c.opts.softcap = 1e-38f, c.opts.softmax_scale = 1e30f; }, kInvalid,
                   "opts.softcap = ");
  }
  SECTION("window") {
    auto window = [](Call& c, int left, int right) {
      c.opts.mask = FLASHGEN_MASK_SLIDING_WINDOW, c.opts.window_left = left, c.opts.window_right = right;
    };
    check_rejected([&](Call& c) { window(c, -2, 0); }, kInvalid,
                   "opts.window_left must be >= 0, or -1 for no bound on that side, got -2");
    check_rejected([&](Call& c) { window(c, 16, -7); }, kInvalid,
                   "opts.window_right must be >= 0, or -1 for no bound on that side, got -7");
    check_rejected([&](Call& c) { window(c, INT32_MIN, 0); }, kInvalid, "opts.window_left must be >= 0");
  }
  SECTION("ALiBi") {
    static const float slopes[8] = {};
    check_rejected([](Call& c) { c.opts.alibi_slopes = reinterpret_cast<const float*>(
                                     reinterpret_cast<uintptr_t>(slopes) + 2); },
                   kInvalid, "opts.alibi_slopes: pointer must be 4-byte aligned");
    // q has heads_q = 8: a batch stride below it would read another sequence's slopes.
    check_rejected([](Call& c) { c.opts.alibi_slopes = slopes, c.opts.alibi_batch_stride = 3; }, kInvalid,
                   "opts.alibi_batch_stride must be 0 (one slope per query head for every sequence) or at least "
                   "heads_q = 8, got 3");
    check_rejected([](Call& c) { c.opts.alibi_slopes = slopes, c.opts.alibi_batch_stride = -4; }, kInvalid,
                   "opts.alibi_batch_stride must be 0");
    check_rejected([](Call& c) { c.opts.alibi_slopes = slopes, c.opts.softmax_scale = 1e-35f; }, kInvalid,
                   "is too small for ALiBi");
  }
  SECTION("sinks") {
    static const float sinks[8] = {};
    check_rejected([](Call& c) { c.opts.sinks = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(sinks) + 2); },
                   kInvalid, "opts.sinks: pointer must be 4-byte aligned (an fp32 array)");
  }
  SECTION("attention_chunk") {
    check_rejected([](Call& c) { c.opts.attention_chunk = -3; }, kInvalid,
                   "opts.attention_chunk must be >= 0 (0: none), got -3");
    check_rejected([](Call& c) { c.opts.attention_chunk = 64, c.opts.mask = FLASHGEN_MASK_CAUSAL_TOP_LEFT; }, kInvalid,
                   "opts.attention_chunk: chunks lie about the bottom-right diagonal; not with "
                   "FLASHGEN_MASK_CAUSAL_TOP_LEFT");
  }
}

TEST_CASE("C ABI refuses options that do not carry this library's size, on every dense call", "[c_api]") {
  Call call;
  flashgen_attention_options unsized = call.opts;
  unsized.size = 0;
  // A caller compiled against a flashgen.h whose options began with softmax_scale (0: the default) and mask
  // (causal): those eight bytes are what the library reads as size.
  flashgen_attention_options legacy{};
  const float legacy_scale = 0.f;
  const int32_t legacy_mask = FLASHGEN_MASK_CAUSAL;
  std::memcpy(reinterpret_cast<char*>(&legacy), &legacy_scale, sizeof(float));
  std::memcpy(reinterpret_cast<char*>(&legacy) + sizeof(float), &legacy_mask, sizeof(int32_t));
  flashgen_attention_options newer = call.opts;
  newer.size += 8;
  const std::pair<const flashgen_attention_options*, std::string> cases[] = {
      {&unsized, "opts.size is 0; this flashgen's options struct has 176 bytes (set size to sizeof"},
      {&legacy, "opts.size is 4294967296, not this flashgen's 176 bytes: rebuild the caller against this library's "
                "flashgen.h (it was compiled against a newer one, or one whose options had no size)"},
      {&newer, "opts.size is 184, not this flashgen's 176 bytes"}};
  char json[64];
  size_t bytes = 0;
  for (const auto& [opts, message] : cases) {
    // The options are checked first: the calls without tensors are refused for them, not for q.
    const std::function<int()> calls[] = {
        [&, opts = opts] {
          return flashgen_attention_forward(&call.q, &call.k, &call.v, &call.out, call.lse, opts, nullptr);
        },
        [&, opts = opts] {
          return flashgen_attention_backward(&call.q, &call.k, &call.v, &call.out, &call.out, call.lse, &call.q,
                                             &call.k, &call.v, opts, nullptr);
        },
        [&, opts = opts] {
          return flashgen_attention_backward_workspace_size(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                            nullptr, nullptr, nullptr, opts, nullptr, &bytes);
        },
        [&, opts = opts] {
          return flashgen_attention_backward_with_workspace(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                            nullptr, nullptr, nullptr, opts, fake_pointer(6), 1 << 20,
                                                            nullptr);
        },
        [&, opts = opts] {
          return flashgen_explain_forward(nullptr, nullptr, nullptr, nullptr, nullptr, opts, nullptr, json,
                                          sizeof(json), nullptr);
        },
        [&, opts = opts] {
          return flashgen_explain_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                           nullptr, opts, nullptr, json, sizeof(json), nullptr);
        }};
    for (size_t i = 0; i < std::size(calls); ++i) {
      INFO("call " << i << ", expected: " << message);
      CHECK(calls[i]() == FLASHGEN_ERROR_INVALID_ARGUMENT);
      const std::string error = flashgen_last_error();
      INFO("got: " << error);
      CHECK(error.find(message) != std::string::npos);
    }
  }
}

TEST_CASE("C ABI runs a chunked call on the chunked window's kernels, the chunk bounded by seqlen_k",
          "[c_api][chunk]") {
  Call c;  // q [2, 100, 8, 64], k and v [2, 75, 4, 64]
  const flashgen::ForwardCall causal = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(causal.problem.mask_kind() == flashgen::MaskKind::kCausal);
  CHECK(causal.params.variant.attention_chunk == 0);
  // Chunked causal: the window (-1, 0) with the chunk, the left side bounded by seqlen_k as a window's.
  c.opts.attention_chunk = 32;
  const flashgen::ForwardCall chunked = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(chunked.problem.mask_kind() == flashgen::MaskKind::kChunk);
  CHECK(chunked.problem.attention_chunk == 32);
  CHECK(chunked.params.variant.window_left == 75);
  CHECK(chunked.params.variant.window_right == 0);
  CHECK(chunked.params.variant.attention_chunk == 32);
  // Keyed by the chunk's width as a window by its span, causal-shaped.
  const flashgen::ProblemKey key = flashgen::problem_key(chunked.problem);
  CHECK(key.mask == flashgen::MaskKind::kChunk);
  CHECK(key.window_bucket == 32);
  CHECK(key.window_causal);
  CHECK(key.id() == "fwd|fp16|d64|chunk|g2|q128|k128|bh16|w32c");
  // No mask: both sides unbounded, within chunks; a chunk past every key is bounded by seqlen_k.
  c.opts.mask = FLASHGEN_MASK_NONE, c.opts.attention_chunk = 1 << 30;
  const flashgen::ForwardCall bidirectional = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(bidirectional.problem.mask_kind() == flashgen::MaskKind::kChunk);
  CHECK(bidirectional.params.variant.window_left == 75);
  CHECK(bidirectional.params.variant.window_right == 100);
  CHECK(bidirectional.params.variant.attention_chunk == 75);
  // A window keeps its own sides under a chunk.
  c.opts.mask = FLASHGEN_MASK_SLIDING_WINDOW, c.opts.window_left = 20, c.opts.window_right = 3;
  c.opts.attention_chunk = 16;
  const flashgen::ForwardCall windowed = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(windowed.params.variant.window_left == 20);
  CHECK(windowed.params.variant.window_right == 3);
  CHECK(windowed.params.variant.attention_chunk == 16);
  CHECK(flashgen::problem_key(windowed.problem).window_bucket == 16);
}

TEST_CASE("C ABI takes values of a head dim of their own into the problem, its key and its choice",
          "[c_api][value_dim]") {
  Call c;  // q [2, 100, 8, 64], k [2, 75, 4, 64]
  c.q = bshd(c.q.data, 2, 100, 8, 192), c.k = bshd(c.k.data, 2, 75, 4, 192);
  c.v = bshd(c.v.data, 2, 75, 4, 128), c.out = bshd(c.out.data, 2, 100, 8, 128);
  const flashgen::ForwardCall call = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(call.problem.head_dim() == 192);
  CHECK(call.problem.value_dim() == 128);
  CHECK(call.params.v_row_stride == 4 * 128);
  CHECK(call.params.o_row_stride == 8 * 128);
  const flashgen::ProblemKey key = flashgen::problem_key(call.problem);
  CHECK(key.head_dim_v == 128);
  CHECK(key.id() == "fwd|fp16|d192v128|causal|g2|q128|k128|bh16");
  // Values of the queries' head dim keep their key as it was.
  Call same;
  CHECK(flashgen::problem_key(flashgen::make_forward_call(&same.q, &same.k, &same.v, &same.out, same.lse, &same.opts)
                                  .problem)
            .id() == "fwd|fp16|d64|causal|g2|q128|k128|bh16");
  // The heuristic's candidates for the class each have such values; a config of the queries' dims is refused.
  for (int arch : {80, 90}) {
    const std::vector<flashgen::KernelConfig> candidates =
        flashgen::heuristic_candidates(key.dtype, key.head_dim, key.mask, arch, false, false, key.mods, key.head_dim_v);
    REQUIRE_FALSE(candidates.empty());
    for (const flashgen::KernelConfig& config : candidates) {
      INFO(config.name());
      CHECK(config.value_dim() == 128);
      CHECK_FALSE(config.invalid_reason(arch));
    }
  }
}

TEST_CASE("C ABI passes the sinks to the kernels as a run-time argument of any config", "[c_api][sinks]") {
  Call c;
  static const float sinks[8] = {};
  static float sink_grads[8];
  const flashgen::ForwardCall plain = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(plain.params.variant.sinks == nullptr);
  c.opts.sinks = sinks;
  c.opts.dsinks = sink_grads;  // a forward call ignores it
  const flashgen::ForwardCall with_sinks = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(with_sinks.params.variant.sinks == sinks);
  // The sinks change no kernel: the problem class, and with it the tuned and chosen config, is the plain one's.
  CHECK(flashgen::problem_key(with_sinks.problem).class_id() == flashgen::problem_key(plain.problem).class_id());
}

TEST_CASE("C ABI passes ALiBi's slopes to the kernels and keys the problem apart", "[c_api][alibi]") {
  Call c;
  static const float slopes[16] = {};
  const flashgen::ForwardCall plain = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK_FALSE(plain.problem.alibi);
  CHECK(plain.params.variant.alibi_slopes == nullptr);
  c.opts.alibi_slopes = slopes, c.opts.alibi_batch_stride = 0, c.opts.softmax_scale = 0.25f;
  const flashgen::ForwardCall biased = flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  CHECK(biased.problem.alibi);
  CHECK(biased.problem.score_mods() == flashgen::ScoreMods{false, true});
  CHECK(biased.params.variant.alibi_slopes == slopes);
  CHECK(biased.params.variant.inv_scale == 4.f);
  CHECK(flashgen::problem_key(biased.problem).class_id() != flashgen::problem_key(plain.problem).class_id());
  // The bias lies about the causal mask's diagonal: bottom-right but under the top-left mask, and with no mask.
  for (const auto& [mask, offset] : {std::pair{FLASHGEN_MASK_NONE, 75 - 100}, std::pair{FLASHGEN_MASK_CAUSAL, 75 - 100},
                                     std::pair{FLASHGEN_MASK_CAUSAL_TOP_LEFT, 0}}) {
    c.opts.mask = mask;
    CHECK(flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts).params.variant.causal_offset == offset);
  }
}

TEST_CASE("C ABI reads the window fields under the window mask only, and normalizes the window",
          "[c_api][window]") {
  Call c;
  auto problem_of = [&](flashgen_mask mask, int left, int right) {
    c.opts.mask = mask, c.opts.window_left = left, c.opts.window_right = right;
    return flashgen::make_forward_call(&c.q, &c.k, &c.v, &c.out, c.lse, &c.opts);
  };
  // Under the other masks the fields are not read: garbage there is no error and no window.
  for (flashgen_mask mask : {FLASHGEN_MASK_NONE, FLASHGEN_MASK_CAUSAL, FLASHGEN_MASK_CAUSAL_TOP_LEFT}) {
    const flashgen::ForwardCall call = problem_of(mask, -1000, 12345);
    CHECK(call.problem.mask == flashgen::from_c(mask));
    CHECK_FALSE(call.problem.windowed());
    CHECK(call.params.variant.window_left == 0);
    CHECK(call.params.variant.window_right == 0);
  }
  // No bound on either side is no mask; none on the left and 0 on the right the bottom-right causal mask.
  CHECK(problem_of(FLASHGEN_MASK_SLIDING_WINDOW, -1, -1).problem.mask == flashgen::Mask::kNone);
  const flashgen::ForwardCall causal = problem_of(FLASHGEN_MASK_SLIDING_WINDOW, -1, 0);
  CHECK(causal.problem.mask == flashgen::Mask::kCausal);
  CHECK(causal.params.variant.causal_offset == 75 - 100);
  // A window keeps its sides: the kernels' diagonal is bottom-right, an unbounded side the least that reaches
  // every key from every row (seqlen_k = 75 on the left, seqlen_q = 100 on the right), and a side past every key
  // clamped to it.
  const flashgen::ForwardCall window = problem_of(FLASHGEN_MASK_SLIDING_WINDOW, 8, -1);
  CHECK(window.problem.mask_kind() == flashgen::MaskKind::kWindow);
  CHECK(window.problem.window_left == 8);
  CHECK(window.problem.window_right == -1);
  CHECK(window.params.variant.causal_offset == 75 - 100);
  CHECK(window.params.variant.window_left == 8);
  CHECK(window.params.variant.window_right == 100);
  const flashgen::ForwardCall wide = problem_of(FLASHGEN_MASK_SLIDING_WINDOW, 0, 100000);
  CHECK(wide.params.variant.window_left == 0);
  CHECK(wide.params.variant.window_right == 100);
  CHECK(problem_of(FLASHGEN_MASK_SLIDING_WINDOW, 100000, 3).params.variant.window_left == 75);
  // A window that shows some rows no key at all is allowed (those rows give 0 and lse -inf).
  CHECK(problem_of(FLASHGEN_MASK_SLIDING_WINDOW, 0, 0).problem.windowed());
}
