// Tests for tuner/problem_key: power-of-two buckets, the stable text ids the store keys rows by, bucket
// distance within one problem class (a user variant's tag among the class's fields), and device fingerprints with
// and without a driver.
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "problem/user_variant.hpp"
#include "tuner/problem_key.hpp"

using flashgen::DType;
using flashgen::MaskKind;

namespace {

flashgen::Status status_of(void (*fn)()) {
  try {
    fn();
  } catch (const flashgen::Error& e) {
    return e.status();
  }
  return flashgen::Status::kSuccess;
}

}  // namespace

TEST_CASE("size_bucket is the smallest power of two at or above n", "[tuner][problem_key]") {
  CHECK(flashgen::size_bucket(1) == 1);
  CHECK(flashgen::size_bucket(2) == 2);
  CHECK(flashgen::size_bucket(3) == 4);
  CHECK(flashgen::size_bucket(4096) == 4096);
  CHECK(flashgen::size_bucket(4097) == 8192);
  CHECK(flashgen::size_bucket(int64_t{1} << 40) == int64_t{1} << 40);
  CHECK(flashgen::size_bucket((int64_t{1} << 40) + 1) == int64_t{1} << 41);

  CHECK(status_of([] { flashgen::size_bucket(0); }) == flashgen::Status::kInvalidArgument);
  CHECK(status_of([] { flashgen::size_bucket(-5); }) == flashgen::Status::kInvalidArgument);
}

TEST_CASE("problem key ids are stable text", "[tuner][problem_key]") {
  const flashgen::ProblemKey key = flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kCausal,
                                                                 /*gqa_ratio=*/4, /*seqlen_q=*/4096,
                                                                 /*seqlen_k=*/3000, /*batch_heads=*/48);
  CHECK(key.pass == flashgen::Pass::kForward);
  CHECK(key.seqlen_q_bucket == 4096);
  CHECK(key.seqlen_k_bucket == 4096);
  CHECK(key.batch_heads_bucket == 64);
  CHECK(key.class_id() == "fwd|bf16|d128|causal|g4");
  CHECK(key.id() == "fwd|bf16|d128|causal|g4|q4096|k4096|bh64");

  const flashgen::ProblemKey plain =
      flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 1, 1, 1);
  CHECK(plain.id() == "fwd|fp16|d64|none|g1|q1|k1|bh1");

  // Sizes in one bucket share a key; the next size up does not.
  CHECK(flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kCausal, 4, 2049, 4096, 33) == key);
  CHECK_FALSE(flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kCausal, 4, 4097, 4096, 64) == key);

  CHECK(status_of([] { flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 0, 1, 1, 1); }) ==
        flashgen::Status::kInvalidArgument);
  CHECK(status_of([] { flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 0, 1, 1); }) ==
        flashgen::Status::kInvalidArgument);
}

TEST_CASE("GQA ratio, mask, dtype and head_dim are part of the problem class", "[tuner][problem_key]") {
  const auto base = flashgen::forward_problem_key(DType::kFloat16, 128, MaskKind::kNone, 1, 1024, 1024, 32);
  const auto gqa = flashgen::forward_problem_key(DType::kFloat16, 128, MaskKind::kNone, 8, 1024, 1024, 32);
  const auto causal = flashgen::forward_problem_key(DType::kFloat16, 128, MaskKind::kCausal, 1, 1024, 1024, 32);
  const auto bf16 = flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kNone, 1, 1024, 1024, 32);
  const auto d64 = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 1024, 1024, 32);
  CHECK(base.class_id() == "fwd|fp16|d128|none|g1");
  CHECK(gqa.class_id() == "fwd|fp16|d128|none|g8");
  CHECK(causal.class_id() == "fwd|fp16|d128|causal|g1");
  CHECK(bf16.class_id() == "fwd|bf16|d128|none|g1");
  CHECK(d64.class_id() == "fwd|fp16|d64|none|g1");
  const auto narrow_values = [&] {
    auto key = base;
    key.head_dim_v = 64;
    return key;
  }();
  CHECK(narrow_values.class_id() == "fwd|fp16|d128v64|none|g1");
  CHECK(narrow_values.value_dim() == 64);
  CHECK(base.value_dim() == 128);
  for (const auto* other : {&gqa, &causal, &bf16, &d64, &narrow_values}) CHECK_FALSE(*other == base);
  CHECK_THROWS_WITH(flashgen::bucket_distance(base, narrow_values), Catch::Contains("keys of different classes"));
}

TEST_CASE("a problem's key: its pass and dQ strategy, its mask kind, its group ratio and buckets",
          "[tuner][problem_key]") {
  const flashgen::AttentionShape shape{/*batch=*/3, /*seqlen_q=*/1000, /*seqlen_k=*/3000, /*heads_q=*/32,
                                      /*heads_kv=*/8, /*head_dim=*/96};
  const flashgen::AttentionProblem forward =
      flashgen::forward_problem(DType::kBFloat16, shape, flashgen::Mask::kCausalTopLeft);
  CHECK(flashgen::problem_key(forward) ==
        flashgen::forward_problem_key(DType::kBFloat16, 96, MaskKind::kCausal, 4, 1000, 3000, 96));
  CHECK(flashgen::problem_key(forward).id() == "fwd|bf16|d96|causal|g4|q1024|k4096|bh128");

  // A forward problem has no dQ strategy, whatever the field holds: one key.
  flashgen::AttentionProblem odd = forward;
  odd.dq = flashgen::DqStrategy::kDeterministic;
  CHECK(flashgen::problem_key(odd) == flashgen::problem_key(forward));

  const flashgen::AttentionProblem atomic =
      flashgen::backward_problem(DType::kFloat16, shape, flashgen::Mask::kNone, false);
  const flashgen::AttentionProblem det =
      flashgen::backward_problem(DType::kFloat16, shape, flashgen::Mask::kNone, true);
  CHECK(flashgen::problem_key(atomic).class_id() == "bwd|fp16|d96|none|g4");
  CHECK(flashgen::problem_key(det).class_id() == "bwd_det|fp16|d96|none|g4");
  CHECK(flashgen::problem_key(det) ==
        flashgen::backward_problem_key(DType::kFloat16, 96, MaskKind::kNone, true, 4, 1000, 3000, 96));

  // A packed batch: its own class, bucketed by the longest sequences and the sequence count.
  flashgen::AttentionProblem packed = forward;
  packed.varlen = true;
  CHECK(flashgen::problem_key(packed).id() == "fwd_varlen|bf16|d96|causal|g4|q1024|k4096|bh128");
  // Over a paged cache: a class per page size (the TMA boxes follow it); the backward has no paged kernels.
  packed.paged = true;
  packed.page_size = 256;
  CHECK(flashgen::problem_key(packed).id() == "fwd_varlen_paged256|bf16|d96|causal|g4|q1024|k4096|bh128");
  packed.page_size = 16;
  CHECK(flashgen::problem_key(packed).class_id() == "fwd_varlen_paged16|bf16|d96|causal|g4");
  packed.page_size = 0;  // paged without its page size: no class of the contiguous one's name
  CHECK_THROWS_WITH(flashgen::problem_key(packed), Catch::Matchers::Contains("needs its page_size"));

  // A KV-cache call: bucketed by the new tokens, the cache's capacity and batch * heads_q; paged is its own class.
  flashgen::AttentionProblem decode = forward;
  decode.kv_cache = true;
  decode.shape.seqlen_q = 3;
  CHECK(flashgen::problem_key(decode).id() == "dec|bf16|d96|causal|g4|q4|k4096|bh128");
  decode.paged = true;
  decode.page_size = 64;
  CHECK(flashgen::problem_key(decode).id() == "dec_paged|bf16|d96|causal|g4|q4|k4096|bh128");
}

TEST_CASE("pass ids read back into the key's pass and dQ strategy", "[tuner][problem_key]") {
  for (const char* text : {"fwd", "fwd_varlen", "fwd_varlen_paged16", "fwd_varlen_paged256", "fwd_varlen_paged1073741824",
                           "bwd", "bwd_det", "bwd_varlen", "bwd_det_varlen", "dec", "dec_paged"}) {
    flashgen::ProblemKey key;
    flashgen::read_pass_id(text, key);
    CHECK(key.pass_id() == text);
  }
  flashgen::ProblemKey key;
  CHECK_THROWS_WITH(flashgen::read_pass_id("bwd-det", key),
                    Catch::Matchers::Contains("bwd_det_varlen, dec or dec_paged (with _kve4m3 or _kve5m2 for an FP8 cache), got 'bwd-det'"));
  flashgen::read_pass_id("fwd_varlen_paged48", key);
  CHECK((key.varlen && key.paged && key.page_size == 48 && !key.kv_cache && key.pass == flashgen::Pass::kForward));
  // Only pass_id's spelling of a positive multiple of 16.
  for (const char* text : {"fwd_varlen_paged", "fwd_varlen_paged0", "fwd_varlen_paged24", "fwd_varlen_paged064",
                           "fwd_varlen_paged16x", "fwd_varlen_paged-16", "fwd_varlen_paged1073741840",
                           "fwd_varlen_paged99999999984"}) {
    INFO(text);
    CHECK_THROWS_WITH(flashgen::read_pass_id(text, key), Catch::Matchers::Contains("must be a positive multiple of 16"));
  }
  // A key read as a KV-cache one and then as a forward one is a forward one.
  flashgen::read_pass_id("dec_paged", key);
  CHECK((key.kv_cache && key.paged && key.pass == flashgen::Pass::kForward));
  flashgen::read_pass_id("fwd", key);
  CHECK_FALSE((key.kv_cache || key.paged || key.page_size != 0));
}

TEST_CASE("bucket_distance sums bucket exponent differences within one class", "[tuner][problem_key]") {
  const auto key = [](int64_t q, int64_t k, int64_t bh) {
    return flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kCausal, 4, q, k, bh);
  };
  CHECK(flashgen::bucket_distance(key(4096, 4096, 64), key(4096, 4096, 64)) == 0);
  CHECK(flashgen::bucket_distance(key(4096, 4096, 64), key(3000, 2049, 33)) == 0);  // same buckets
  CHECK(flashgen::bucket_distance(key(1024, 4096, 64), key(4096, 4096, 16)) == 4);  // 2 + 0 + 2
  CHECK(flashgen::bucket_distance(key(4096, 4096, 16), key(1024, 4096, 64)) == 4);  // symmetric
  CHECK(flashgen::bucket_distance(key(1, 1, 1), key(1024, 512, 2)) == 10 + 9 + 1);

  const auto other_class = flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kNone, 4, 4096, 4096, 64);
  try {
    flashgen::bucket_distance(key(4096, 4096, 64), other_class);
    FAIL("bucket_distance compared keys of different classes");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kInvalidArgument);
    const std::string message = e.what();
    CHECK(message.find("fwd|bf16|d128|causal|g4") != std::string::npos);
    CHECK(message.find("fwd|bf16|d128|none|g4") != std::string::npos);
  }
}

TEST_CASE("device fingerprint id is stable text", "[tuner][problem_key]") {
  flashgen::DeviceFingerprint fp;
  fp.gpu_name = "NVIDIA H200";
  fp.sm = 90;
  fp.sm_count = 132;
  fp.driver_version = 13000;
  fp.nvrtc_version = "13.0";
  fp.generator_version = "1";
  CHECK(fp.id() == "NVIDIA H200|sm90|132sm|drv13000|nvrtc13.0|gen1");

  flashgen::DeviceFingerprint other = fp;
  CHECK(other == fp);
  other.driver_version = 12080;  // a driver update may change which kernel wins
  CHECK_FALSE(other == fp);
}

TEST_CASE("fingerprint_for_arch names the arch and no device", "[tuner][problem_key]") {
  const flashgen::DeviceFingerprint fp = flashgen::fingerprint_for_arch(90);
  CHECK(fp.gpu_name == "sm_90 (no device)");
  CHECK(fp.sm == 90);
  CHECK(fp.sm_count == 0);
  CHECK(fp.driver_version == 0);
  CHECK(fp.nvrtc_version == flashgen::nvrtc_version());
  CHECK(fp.generator_version == flashgen::kGeneratorVersion);
  CHECK(fp.id() == "sm_90 (no device)|sm90|0sm|drv0|nvrtc" + flashgen::nvrtc_version() + "|gen" +
                       flashgen::kGeneratorVersion);
}

TEST_CASE("current_device_fingerprint needs a driver", "[tuner][problem_key]") {
  std::string why;
  if (flashgen::driver_available(&why)) {
    const flashgen::DeviceFingerprint fp = flashgen::current_device_fingerprint(0);
    INFO(fp.id());
    CHECK_FALSE(fp.gpu_name.empty());
    CHECK(fp.sm >= 80);
    CHECK(fp.sm_count > 0);
    CHECK(fp.driver_version > 0);
    CHECK(fp.nvrtc_version == flashgen::nvrtc_version());
    CHECK(fp.generator_version == flashgen::kGeneratorVersion);
    CHECK(flashgen::current_device_fingerprint(0) == fp);
  } else {
    try {
      flashgen::current_device_fingerprint(0);
      FAIL("current_device_fingerprint answered without a driver");
    } catch (const flashgen::Error& e) {
      CHECK(e.status() == flashgen::Status::kNoDevice);
      CHECK(std::string(e.what()) == why);
    }
  }
}

TEST_CASE("a soft-capped problem is a class of its own; its mask text reads back", "[tuner][problem_key]") {
  flashgen::AttentionProblem problem = flashgen::forward_problem(
      flashgen::DType::kBFloat16, flashgen::AttentionShape{2, 1024, 1024, 16, 4, 128}, flashgen::Mask::kCausal);
  const flashgen::ProblemKey plain = flashgen::problem_key(problem);
  problem.softcap = 30.f;
  const flashgen::ProblemKey capped = flashgen::problem_key(problem);
  CHECK(plain.class_id() == "fwd|bf16|d128|causal|g4");
  CHECK(capped.class_id() == "fwd|bf16|d128|causal_softcap|g4");
  CHECK(capped.mods.softcap);
  problem.pass = flashgen::Pass::kBackward;
  CHECK(flashgen::problem_key(problem).class_id() == "bwd|bf16|d128|causal_softcap|g4");
  for (const char* text : {"none", "causal", "none_softcap", "causal_softcap"}) {
    flashgen::ProblemKey key;
    flashgen::read_mask_text(text, key);
    CHECK(flashgen::variant_text(key.mask, key.mods) == text);
    CHECK(flashgen::mask_text(key) == text);
  }
  flashgen::ProblemKey key;
  CHECK_THROWS_WITH(flashgen::read_mask_text("softcap_causal", key), Catch::Matchers::Contains("unknown mask"));
  // ALiBi after the cap, in the one order names and ids spell them.
  for (const char* text : {"none_alibi", "causal_softcap_alibi", "window512_alibi", "window64c_softcap_alibi"}) {
    INFO(text);
    flashgen::read_mask_text(text, key);
    CHECK(key.mods.alibi);
    CHECK(flashgen::mask_text(key) == text);
  }
  for (const char* text : {"causal_alibi_softcap", "causal_alibi_alibi", "causal_bias"}) {
    CHECK_THROWS_WITH(flashgen::read_mask_text(text, key), Catch::Matchers::Contains("unknown mask"));
  }
}

TEST_CASE("a windowed problem is a class of its own, bucketed by the keys a row sees", "[tuner][problem_key]") {
  const flashgen::AttentionShape shape{2, 4096, 4096, 16, 4, 128};
  auto key_of = [&](int left, int right, int64_t seqlen_k = 4096) {
    flashgen::AttentionShape s = shape;
    s.seqlen_k = seqlen_k;
    return flashgen::problem_key(
        flashgen::forward_problem(DType::kBFloat16, s, flashgen::Mask::kSlidingWindow, left, right));
  };
  // A causal window of 1024 keys (Mistral's 4096-token one would bucket 4096): 1023 + 0 + 1.
  const flashgen::ProblemKey causal = key_of(1023, 0);
  CHECK(causal.mask == MaskKind::kWindow);
  CHECK(causal.class_id() == "fwd|bf16|d128|window|g4");
  CHECK(causal.window_bucket == 1024);
  CHECK(causal.window_causal);
  CHECK(causal.id() == "fwd|bf16|d128|window|g4|q4096|k4096|bh32|w1024c");
  CHECK(flashgen::mask_text(causal) == "window1024c");
  // Two-sided: 256 + 255 + 1 = 512 keys, not causal-shaped.
  const flashgen::ProblemKey two_sided = key_of(256, 255);
  CHECK(two_sided.window_bucket == 512);
  CHECK_FALSE(two_sided.window_causal);
  CHECK(two_sided.id() == "fwd|bf16|d128|window|g4|q4096|k4096|bh32|w512");
  // One unbounded side counts as seqlen_k; no row sees more than seqlen_k keys.
  CHECK(key_of(-1, 16).window_bucket == 4096);
  CHECK(key_of(100000, 0, 1000).window_bucket == 1024);
  CHECK(key_of(0, 0).window_bucket == 1);
  // The normalized windows are the plain masks' keys, and other masks' ids end as they always did.
  CHECK(key_of(-1, 0).id() == "fwd|bf16|d128|causal|g4|q4096|k4096|bh32");
  CHECK(key_of(-1, -1).id() == "fwd|bf16|d128|none|g4|q4096|k4096|bh32");
  // Soft-capped, backward, packed: the same bucket after their own pass and variant.
  flashgen::AttentionProblem problem =
      flashgen::backward_problem(DType::kBFloat16, shape, flashgen::Mask::kSlidingWindow, true, 1023, 0);
  problem.softcap = 30.f;
  const flashgen::ProblemKey capped = flashgen::problem_key(problem);
  CHECK(capped.id() == "bwd_det|bf16|d128|window_softcap|g4|q4096|k4096|bh32|w1024c");
  CHECK(flashgen::mask_text(capped) == "window1024c_softcap");
}

TEST_CASE("a KV-cache window key is bucketed by its window as a forward one is", "[tuner][problem_key][window]") {
  // One new token of 8 sequences against caches of 32k keys, a causal window of 4096 keys (4095 + 0 + 1).
  flashgen::AttentionProblem decode = flashgen::forward_problem(DType::kBFloat16, {8, 1, 32768, 32, 8, 128},
                                                                flashgen::Mask::kSlidingWindow, 4095, 0);
  decode.kv_cache = true;
  const flashgen::ProblemKey key = flashgen::problem_key(decode);
  CHECK(key.id() == "dec|bf16|d128|window|g4|q1|k32768|bh256|w4096c");
  CHECK(flashgen::mask_text(key) == "window4096c");
  decode.paged = true, decode.page_size = 16;
  decode.set_mask(flashgen::Mask::kSlidingWindow, 100, 20);  // two-sided: 121 keys
  CHECK(flashgen::problem_key(decode).id() == "dec_paged|bf16|d128|window|g4|q1|k32768|bh256|w128");
  // A window longer than the cache is bucketed by the capacity; the normalized windows are the plain masks' keys.
  decode.shape.seqlen_k = 1000;
  decode.set_mask(flashgen::Mask::kSlidingWindow, 5000, 0);
  CHECK(flashgen::problem_key(decode).id() == "dec_paged|bf16|d128|window|g4|q1|k1024|bh256|w1024c");
  decode.set_mask(flashgen::Mask::kSlidingWindow, -1, 0);
  CHECK(flashgen::problem_key(decode).id() == "dec_paged|bf16|d128|causal|g4|q1|k1024|bh256");
  // Window keys of the decode class read back from a row's pass and mask text.
  flashgen::ProblemKey read;
  flashgen::read_pass_id("dec", read);
  flashgen::read_mask_text("window4096c", read);
  CHECK((read.kv_cache && read.mask == MaskKind::kWindow && read.window_bucket == 4096 && read.window_causal));
}

TEST_CASE("a window key's mask text reads back, and only its canonical spellings", "[tuner][problem_key]") {
  for (const char* text : {"window1c", "window1024", "window1024c", "window4096_softcap", "window64c_softcap"}) {
    INFO(text);
    flashgen::ProblemKey key;
    flashgen::read_mask_text(text, key);
    CHECK(key.mask == MaskKind::kWindow);
    CHECK(flashgen::mask_text(key) == text);
  }
  flashgen::ProblemKey key;
  flashgen::read_mask_text("window2048c_softcap", key);
  CHECK(key.window_bucket == 2048);
  CHECK(key.window_causal);
  CHECK(key.mods.softcap);
  flashgen::read_mask_text("causal", key);  // a reused key drops the window it held
  CHECK(key.window_bucket == 0);
  CHECK_FALSE(key.window_causal);
  for (const char* text : {"window", "window0", "window1000", "window01024", "window1024cc", "window-4", "windowc",
                           "window1024_c", "window99999999999999999999"}) {
    INFO(text);
    CHECK_THROWS_WITH(flashgen::read_mask_text(text, key), Catch::Matchers::Contains("unknown mask"));
  }
}

TEST_CASE("bucket_distance between window keys counts their window buckets and shapes", "[tuner][problem_key]") {
  auto key = [](int64_t window_bucket, bool causal, int64_t seqlen = 4096) {
    flashgen::ProblemKey k =
        flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kWindow, 1, seqlen, seqlen, 64);
    k.window_bucket = window_bucket, k.window_causal = causal;
    return k;
  };
  CHECK(flashgen::bucket_distance(key(1024, true), key(1024, true)) == 0);
  CHECK(flashgen::bucket_distance(key(1024, true), key(256, true)) == 2);
  CHECK(flashgen::bucket_distance(key(1024, true), key(1024, false)) == 1);
  CHECK(flashgen::bucket_distance(key(1024, false, 1024), key(512, true)) == 2 + 2 + 1 + 1);
  CHECK_THROWS_WITH(flashgen::bucket_distance(key(1024, true),
                                              flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kCausal, 1,
                                                                            4096, 4096, 64)),
                    Catch::Matchers::Contains("different classes"));
}

TEST_CASE("a user variant's dense problems are a class of their own, keyed by its tag; packed and KV-cache ones are not",
          "[tuner][problem_key][user_variant]") {
  flashgen::UserVariantDesc desc;
  desc.mask_mod = "return kv_idx <= q_idx + 7;";
  const auto user = flashgen::make_user_variant(desc);
  const flashgen::AttentionShape shape{2, 1000, 1000, 16, 4, 128};
  flashgen::AttentionProblem forward = flashgen::forward_problem(DType::kFloat16, shape, flashgen::Mask::kCausal);
  forward.softcap = 30.f;
  const flashgen::ProblemKey base = flashgen::problem_key(forward);
  forward.user = user;
  const flashgen::ProblemKey key = flashgen::problem_key(forward);
  CHECK(flashgen::user_key_tag(forward) == user->tag);
  CHECK(key.user_tag == user->tag);
  CHECK(key.id() == "fwd|fp16|d128|causal_softcap_" + user->tag + "|g4|q1024|k1024|bh32");
  CHECK(key.class_id() != base.class_id());
  // The store's mask column reads back with the tag, and only with it last.
  flashgen::ProblemKey read = base;
  flashgen::read_mask_text(flashgen::mask_text(key), read);
  CHECK(read == key);
  for (const std::string& bad : {"causal_" + user->tag + "_softcap", "causal_" + user->tag + "_" + user->tag,
                                std::string("causal_u12345"), "causal_U" + user->tag.substr(1)}) {
    INFO(bad);
    CHECK_THROWS_WITH(flashgen::read_mask_text(bad, read), Catch::Matchers::Contains("unknown mask"));
  }
  flashgen::ProblemKey packed_key = base;
  packed_key.varlen = true;
  CHECK_THROWS_WITH(flashgen::read_mask_text(flashgen::mask_text(key), packed_key),
                    Catch::Matchers::Contains("unknown mask"));  // no packed or KV-cache key carries a tag
  flashgen::AttentionProblem backward = flashgen::backward_problem(DType::kFloat16, shape, flashgen::Mask::kNone, true);
  backward.user = user;
  CHECK(flashgen::problem_key(backward).class_id() == "bwd_det|fp16|d128|none_" + user->tag + "|g4");
  // Packed and KV-cache calls run their base class's data (their sweeps take no user variant).
  flashgen::AttentionProblem packed = forward;
  packed.varlen = true;
  CHECK(flashgen::problem_key(packed).user_tag.empty());
  flashgen::AttentionProblem decode = forward;
  decode.kv_cache = true;
  CHECK(flashgen::problem_key(decode).user_tag.empty());
}
