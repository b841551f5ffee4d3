// Tests for an FP8 KV cache's arguments (no GPU): each bad one refused naming it, a valid call's problem, parameters,
// module and problem class as the kernels and the tuning data take them; and the host's FP8 rounding the tests and
// references use.
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "launch/attention_kvcache.hpp"
#include "support/fake_pointer.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/problem_key.hpp"

namespace {

using flashgen::test::fake_pointer;

flashgen_tensor bshd(void* data, flashgen_dtype dtype, int64_t n0, int64_t n1, int64_t heads, int64_t head_dim) {
  return flashgen_tensor{data, dtype, {n0, n1, heads, head_dim}, {n1 * heads * head_dim, heads * head_dim, head_dim, 1}};
}

// Four sequences of one bf16 token, 32 query heads over 8 kv heads, an e4m3 cache of 100 pages of 64 keys, one
// appended token, a scale per kv head for the keys and one for every value.
flashgen_kvcache_args valid_fp8_args() {
  flashgen_kvcache_args args{};
  args.size = sizeof(args);
  args.q = bshd(fake_pointer(1), FLASHGEN_BFLOAT16, 4, 1, 32, 128);
  args.k_cache = bshd(fake_pointer(2), FLASHGEN_FLOAT8_E4M3, 100, 64, 8, 128);
  args.v_cache = bshd(fake_pointer(3), FLASHGEN_FLOAT8_E4M3, 100, 64, 8, 128);
  args.k_new = bshd(fake_pointer(4), FLASHGEN_BFLOAT16, 4, 1, 8, 128);
  args.v_new = bshd(fake_pointer(5), FLASHGEN_BFLOAT16, 4, 1, 8, 128);
  args.out = bshd(fake_pointer(6), FLASHGEN_BFLOAT16, 4, 1, 32, 128);
  args.cache_seqlens = static_cast<const int32_t*>(fake_pointer(8));
  args.block_table = static_cast<const int32_t*>(fake_pointer(9));
  args.max_pages = 16;
  args.options.mask = FLASHGEN_MASK_CAUSAL;
  args.k_scale = static_cast<const float*>(fake_pointer(10));
  args.k_scale_stride[1] = 1;
  args.v_scale = static_cast<const float*>(fake_pointer(11));
  return args;
}

void check_rejected(const std::function<void(flashgen_kvcache_args&)>& edit, int status, const std::string& message) {
  flashgen_kvcache_args args = valid_fp8_args();
  edit(args);
  INFO("expected: " << message);
  CHECK(flashgen_attention_kvcache(&args, nullptr) == status);
  const std::string error = flashgen_last_error();
  INFO("got: " << error);
  CHECK(error.find(message) != std::string::npos);
}

}  // namespace

TEST_CASE("an FP8 cache's call refuses each bad argument with a message naming it", "[c_api][kvcache][fp8]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT, kUnsupported = FLASHGEN_ERROR_UNSUPPORTED;
  check_rejected([](auto& a) { a.v_cache.dtype = FLASHGEN_FLOAT8_E5M2; }, kInvalid,
                 "v_cache.dtype is e5m2 but k_cache.dtype is e4m3: an FP8 cache's keys and values share one format");
  check_rejected([](auto& a) { a.v_cache.dtype = FLASHGEN_BFLOAT16; }, kInvalid, "v_cache.dtype is bf16 but k_cache");
  check_rejected([](auto& a) { a.q.dtype = a.out.dtype = FLASHGEN_FLOAT8_E4M3; }, kUnsupported,
                 "q.dtype is e4m3: FP8 is taken by q, k and v");
  check_rejected([](auto& a) { a.k_new.dtype = a.v_new.dtype = FLASHGEN_FLOAT8_E4M3; }, kUnsupported,
                 "k_new.dtype is e4m3");
  check_rejected([](auto& a) { a.out.dtype = FLASHGEN_FLOAT16; }, kInvalid, "out.dtype is fp16 but q.dtype is bf16");
  check_rejected([](auto& a) { a.k_cache.dtype = static_cast<flashgen_dtype>(4); }, kInvalid,
                 "k_cache.dtype: unknown value 4");
  for (int64_t d : {80, 112}) {
    check_rejected(
        [d](auto& a) {
          for (flashgen_tensor* t : {&a.q, &a.k_cache, &a.v_cache, &a.k_new, &a.v_new, &a.out}) {
            t->shape[3] = d;
            t->stride[2] = d, t->stride[1] = t->shape[2] * d, t->stride[0] = t->shape[1] * t->shape[2] * d;
          }
        },
        kUnsupported, "k_cache.shape[3] (head_dim) = " + std::to_string(d) + " is unsupported for an FP8 cache");
  }
  // Strides are 16-byte multiples: 8 elements of a 16-bit tensor, 16 of an FP8 one.
  check_rejected([](auto& a) { a.k_cache.stride[2] = 136; }, kInvalid,
                 "k_cache.stride[2] must be a non-negative multiple of 16 elements (16 bytes), got 136");
  check_rejected([](auto& a) { a.k_scale_stride[0] = -1; }, kInvalid, "k_scale_stride[0] must be in [0, 2^40]");
  check_rejected([](auto& a) { a.v_scale_stride[1] = int64_t{1} << 41; }, kInvalid,
                 "v_scale_stride[1] must be in [0, 2^40]");
  check_rejected([](auto& a) { a.k_scale = reinterpret_cast<const float*>(0x100002); }, kInvalid,
                 "k_scale: pointer must be 4-byte aligned");
  // Scales belong to an FP8 cache.
  check_rejected(
      [](auto& a) {
        a.k_cache.dtype = a.v_cache.dtype = FLASHGEN_BFLOAT16;
        for (flashgen_tensor* t : {&a.k_cache, &a.v_cache}) t->stride[2] = 128;
      },
      kInvalid, "k_scale: given for a 16-bit cache (scales are an FP8 cache's); pass NULL");
  // A latent cache (v_cache a view of k_cache's first columns) is read in 16 bits only.
  check_rejected(
      [](auto& a) {
        a.q = bshd(fake_pointer(1), FLASHGEN_BFLOAT16, 4, 1, 32, 576);
        a.k_cache = bshd(fake_pointer(2), FLASHGEN_FLOAT8_E4M3, 100, 64, 1, 576);
        a.v_cache = a.k_cache, a.v_cache.shape[3] = 512;
        a.out = bshd(fake_pointer(6), FLASHGEN_BFLOAT16, 4, 1, 32, 512);
        a.k_new.data = a.v_new.data = nullptr;
      },
      kUnsupported, "k_cache.dtype is e4m3: a latent cache (values of a head dim of their own) is read in 16 bits only");
}

TEST_CASE("an FP8 cache's call carries its type and scales to the kernels, its module and its problem class",
          "[kvcache][fp8]") {
  const flashgen::KvCacheCall call = flashgen::make_kvcache_call(valid_fp8_args());
  REQUIRE(call.problem.cache_dtype == flashgen::DType::kFloat8E4M3);
  CHECK(call.problem.dtype == flashgen::DType::kBFloat16);
  CHECK(call.params.k_scale == fake_pointer(10));
  CHECK(call.params.k_scale_batch_stride == 0);
  CHECK(call.params.k_scale_head_stride == 1);
  CHECK(call.params.v_scale == fake_pointer(11));
  CHECK(call.params.v_scale_head_stride == 0);
  // Cache strides stay in elements, which are bytes here.
  CHECK(call.params.k_row_stride == 8 * 128);
  CHECK(call.params.k_batch_stride == 64 * 8 * 128);

  // Its own problem class, apart from the bf16 cache's tuning data.
  const flashgen::ProblemKey key = flashgen::problem_key(call.problem);
  CHECK(key.pass_id() == "dec_paged_kve4m3");
  flashgen::ProblemKey read;
  flashgen::read_pass_id("dec_kve5m2", read);
  CHECK((read.kv_cache && !read.paged && read.cache_dtype == flashgen::DType::kFloat8E5M2));
  CHECK_THROWS_WITH(flashgen::read_pass_id("dec_kvfp16", read),
                    Catch::Contains("an FP8 cache's type must be e4m3 or e5m2, got 'fp16'"));

  // The built-in module reads the cache as it is, bounded for three blocks per SM (a bf16 cache's for one) with as
  // many stages as three leave room for.
  const flashgen::DecodeChoice fp8 = flashgen::heuristic_decode_choice(call.problem, 90, 132);
  CHECK(fp8.config.name() == "dec_sm80_bf16_d128_r16_n64_w4_s3_causal_kve4m3_paged");
  CHECK(fp8.config.traits().min_blocks == 3);
  CHECK(3 * (fp8.config.smem_bytes(flashgen::DecodeKernel::kAttend) + 1024) <= 233472);
  CHECK(flashgen::DecodeConfig::from_name(fp8.config.name()) == fp8.config);
  nlohmann::json j = fp8.config;
  CHECK(j["cache_dtype"] == "e4m3");
  CHECK(j.get<flashgen::DecodeConfig>() == fp8.config);
  CHECK(fp8.config.invalid_reason(86).value() == "an FP8 cache needs sm_89 or newer (FP8 conversions)");
  CHECK_FALSE(fp8.config.invalid_reason(89).has_value());
  flashgen::AttentionProblem bf16 = call.problem;
  bf16.cache_dtype.reset();
  const flashgen::DecodeChoice wide = flashgen::heuristic_decode_choice(bf16, 90, 132);
  CHECK(wide.config.traits().min_blocks == 1);
  // A module of the other cache type does not serve the call.
  const flashgen::DeviceTraits h100{90, 132, 50 << 20};
  CHECK_FALSE(wide.config.can_implement(call.problem, call.params, h100));
  CHECK(fp8.config.can_implement(call.problem, call.params, h100));
  CHECK_THROWS_WITH(flashgen::DecodeConfig::from_name("dec_sm80_bf16_d128_r16_n64_w4_s5_causal_kvbf16"),
                    Catch::Contains("an FP8 cache's type must be e4m3 or e5m2, got 'bf16'"));
}

TEST_CASE("the host rounds to FP8 as the appends do and reads every code back exactly", "[fp8]") {
  using flashgen::DType;
  for (DType t : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    INFO(flashgen::dtype_name(t));
    // Every finite code reads back to a value that rounds to the same code.
    for (int code = 0; code < 256; ++code) {
      const double value = flashgen::fp8_bits_to_double(static_cast<uint8_t>(code), t);
      if (!std::isfinite(value)) continue;
      INFO("code " << code);
      if (value == 0.0) {
        CHECK((flashgen::float_to_fp8_bits(static_cast<float>(value), t) & 0x7F) == 0);
      } else {
        CHECK(flashgen::float_to_fp8_bits(static_cast<float>(value), t) == code);
      }
    }
  }
  const DType e4m3 = DType::kFloat8E4M3;
  CHECK(flashgen::fp8_bits_to_double(0x7E, e4m3) == 448.0);
  CHECK(flashgen::fp8_bits_to_double(0x01, e4m3) == std::ldexp(1.0, -9));  // the least subnormal
  CHECK(flashgen::float_to_fp8_bits(1e6f, e4m3) == 0x7E);                  // saturates
  CHECK(flashgen::float_to_fp8_bits(-470.f, e4m3) == 0xFE);
  CHECK(flashgen::float_to_fp8_bits(1.0625f, e4m3) == 0x38);  // a tie between 1 and 1.125: to even, 1
  CHECK(flashgen::float_to_fp8_bits(1.1875f, e4m3) == 0x3A);  // a tie between 1.125 and 1.25: to even, 1.25
  CHECK(std::isnan(flashgen::fp8_bits_to_double(flashgen::float_to_fp8_bits(NAN, e4m3), e4m3)));
  CHECK(flashgen::fp8_bits_to_double(0x7B, DType::kFloat8E5M2) == 57344.0);
  CHECK(flashgen::float_to_fp8_bits(1e9f, DType::kFloat8E5M2) == 0x7B);
}
