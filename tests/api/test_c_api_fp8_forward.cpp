// Tests for the FP8 forward's arguments (no GPU): each bad one refused naming it, nothing launched; a valid call's
// problem, descales and output type as the kernels and the planner take them; its configs' names, JSON and the
// built-in choice; the key order P's fragments give Vᵀ.
#include <cstdint>
#include <functional>
#include <string>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
#include "generator/generator.hpp"
#include "generator/kernel_config.hpp"
#include "launch/attention.hpp"
#include "support/fake_pointer.hpp"
#include "templates/fwd_traits.cuh"
#include "tuner/heuristic.hpp"
#include "tuner/tune.hpp"

namespace {

using flashgen::DType;
using flashgen::test::fake_pointer;

flashgen_tensor bshd(void* data, flashgen_dtype dtype, int64_t n0, int64_t n1, int64_t heads, int64_t head_dim) {
  return flashgen_tensor{data, dtype, {n0, n1, heads, head_dim}, {n1 * heads * head_dim, heads * head_dim, head_dim, 1}};
}

// Two batch entries of 1000 e4m3 queries, 16 heads over 4 kv heads, d128, a bf16 output, descales per (batch entry,
// kv head) for q and k and one for v.
struct Fp8Args {
  flashgen_tensor q = bshd(fake_pointer(1), FLASHGEN_FLOAT8_E4M3, 2, 1000, 16, 128);
  flashgen_tensor k = bshd(fake_pointer(2), FLASHGEN_FLOAT8_E4M3, 2, 1000, 4, 128);
  flashgen_tensor v = bshd(fake_pointer(3), FLASHGEN_FLOAT8_E4M3, 2, 1000, 4, 128);
  flashgen_tensor out = bshd(fake_pointer(4), FLASHGEN_BFLOAT16, 2, 1000, 16, 128);
  flashgen_attention_options opts = FLASHGEN_ATTENTION_OPTIONS_INIT;
  Fp8Args() {
    opts.mask = FLASHGEN_MASK_CAUSAL;
    opts.q_descale = static_cast<const float*>(fake_pointer(5));
    opts.k_descale = static_cast<const float*>(fake_pointer(6));
    opts.v_descale = static_cast<const float*>(fake_pointer(7));
    opts.q_descale_stride[0] = opts.k_descale_stride[0] = 4;
    opts.q_descale_stride[1] = opts.k_descale_stride[1] = 1;
  }
};

void check_rejected(const std::function<void(Fp8Args&)>& edit, int status, const std::string& message) {
  Fp8Args a;
  edit(a);
  INFO("expected: " << message);
  CHECK(flashgen_attention_forward(&a.q, &a.k, &a.v, &a.out, nullptr, &a.opts, nullptr) == status);
  const std::string error = flashgen_last_error();
  INFO("got: " << error);
  CHECK(error.find(message) != std::string::npos);
}

}  // namespace

TEST_CASE("an FP8 forward refuses each bad argument with a message naming it", "[c_api][fp8][fp8_forward]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT, kUnsupported = FLASHGEN_ERROR_UNSUPPORTED;
  check_rejected([](Fp8Args& a) { a.v.dtype = FLASHGEN_FLOAT8_E5M2; }, kInvalid, "v.dtype is e5m2 but q.dtype is e4m3");
  check_rejected([](Fp8Args& a) { a.k.dtype = FLASHGEN_BFLOAT16; }, kInvalid, "k.dtype is bf16 but q.dtype is e4m3");
  check_rejected([](Fp8Args& a) { a.out.dtype = FLASHGEN_FLOAT8_E4M3; }, kUnsupported,
                 "out.dtype is e4m3: FP8 is taken by q, k and v");
  check_rejected([](Fp8Args& a) { a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.out.shape[3] = 72; }, kUnsupported,
                 "q.shape[3] (head_dim) is 72: the FP8 forward takes multiples of 16 up to 256");
  check_rejected([](Fp8Args& a) { a.v.shape[3] = a.out.shape[3] = 64; }, kInvalid, "v.shape[3]");
  check_rejected(
      [](Fp8Args& a) { a.opts.k_descale = reinterpret_cast<const float*>(static_cast<char*>(fake_pointer(6)) + 2); },
      kInvalid,
                 "opts.k_descale: pointer must be 4-byte aligned");
  check_rejected([](Fp8Args& a) { a.opts.v_descale_stride[1] = -1; }, kInvalid,
                 "opts.v_descale_stride[1] must be in [0, 2^40], got -1");
  check_rejected(
      [](Fp8Args& a) { a.q.dtype = a.k.dtype = a.v.dtype = FLASHGEN_BFLOAT16; },
      kInvalid, "opts.q_descale: given for 16-bit q, k and v (descales are an FP8 forward's); pass NULL");
}

TEST_CASE("an FP8 forward's problem carries its output type and descales to the kernels", "[c_api][fp8][fp8_forward]") {
  Fp8Args a;
  a.out.dtype = FLASHGEN_FLOAT16;
  const flashgen::ForwardCall call = flashgen::make_forward_call(&a.q, &a.k, &a.v, &a.out, nullptr, &a.opts);
  CHECK(call.problem.dtype == DType::kFloat8E4M3);
  REQUIRE(call.problem.out_dtype.has_value());
  CHECK(*call.problem.out_dtype == DType::kFloat16);
  CHECK(call.params.q_descale == a.opts.q_descale);
  CHECK(call.params.v_descale == a.opts.v_descale);
  CHECK(call.params.k_descale_strides[0] == 4);
  CHECK(call.params.k_descale_strides[1] == 1);
  CHECK(call.params.v_descale_strides[0] == 0);
  // A 16-bit call has no output type of its own.
  Fp8Args plain;
  plain.q.dtype = plain.k.dtype = plain.v.dtype = FLASHGEN_BFLOAT16;
  plain.opts.q_descale = plain.opts.k_descale = plain.opts.v_descale = nullptr;
  CHECK_FALSE(flashgen::make_forward_call(&plain.q, &plain.k, &plain.v, &plain.out, nullptr, &plain.opts)
                  .problem.out_dtype.has_value());
}

TEST_CASE("FP8 forward configs name their output type and keep to the sm90 family's FP8 tiles", "[fp8][fp8_forward]") {
  using flashgen::KernelConfig;
  const KernelConfig c = KernelConfig::from_name("fwd_sm90_e5m2_d256_m128_n128_s2_ofp16_causal_ovl_pp_pst");
  CHECK(c.dtype == DType::kFloat8E5M2);
  CHECK(c.output_dtype() == DType::kFloat16);
  CHECK_FALSE(c.invalid_reason(90).has_value());
  nlohmann::json j = c;
  CHECK(j["out_dtype"] == "fp16");
  CHECK(j.get<KernelConfig>() == c);
  // Its module holds Vᵀ's kernel beside the attention kernel, and its header the output type.
  const flashgen::GeneratedSource source = flashgen::generate(c);
  CHECK(source.translation_unit.find(c.symbol(flashgen::FwdKernel::kValuesT)) != std::string::npos);
  CHECK(source.headers.front().contents.find("kOutElem = flashgen::ElemType::kFloat16") != std::string::npos);
  // An FP8 config names its output; a 16-bit one does not; the sm80 family and 16-bit configs take no FP8 name.
  CHECK_THROWS(KernelConfig::from_name("fwd_sm80_e4m3_d128_m128_n64_w4_s2"));
  CHECK(KernelConfig::from_name("fwd_sm90_e4m3_d128_m128_n128_s2").invalid_reason(90).value().find(
            "names its output type") != std::string::npos);
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_obf16").invalid_reason(90).has_value());
  // Tiles the FP8 path cannot take, by name.
  CHECK(KernelConfig::from_name("fwd_sm90_e4m3_d128_m128_n64_s2_obf16").invalid_reason(90).value().find(
            "FP8 takes block_n 128") != std::string::npos);
  CHECK(KernelConfig::from_name("fwd_sm90_e4m3_d128_m128_n128_s2_obf16_psm").invalid_reason(90).value().find(
            "FP8 takes P in registers") != std::string::npos);
  // The built-in choice: the FP8 tiles on sm_90, none elsewhere (the reason names the need).
  const auto ranked = flashgen::heuristic_forward_configs(DType::kFloat8E4M3, 128, flashgen::MaskKind::kCausal, 90);
  REQUIRE_FALSE(ranked.empty());
  CHECK(ranked.front().name() == "fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_pst");
  for (int d : {64, 192, 256}) {
    CHECK_FALSE(
        flashgen::heuristic_forward_configs(DType::kFloat8E4M3, d, flashgen::MaskKind::kNone, 90).front().invalid_reason(90));
  }
  try {
    flashgen::heuristic_forward_configs(DType::kFloat8E4M3, 128, flashgen::MaskKind::kNone, 80);
    FAIL("sm_80 has no FP8 forward");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("FP8 attention needs sm_90a") != std::string::npos);
  }
  // The tuner's plan: the built-in choice first, then FP8 tiles only, each writing bf16 (the tiles serve both outputs)
  // and valid on sm_90.
  Fp8Args a;
  const flashgen::ForwardCall call = flashgen::make_forward_call(&a.q, &a.k, &a.v, &a.out, nullptr, &a.opts);
  flashgen::TuneOptions options;
  options.max_candidates = 64;
  const flashgen::TunePlan plan = flashgen::plan_tune(call.problem, 90, options);
  REQUIRE(plan.candidates.size() > 1);
  CHECK(flashgen::config_name(plan.candidates.front()) == flashgen::config_name(plan.builtin));
  for (const flashgen::TunedConfig& tuned : plan.candidates) {
    const KernelConfig& c = std::get<KernelConfig>(tuned);
    CHECK(c.dtype == DType::kFloat8E4M3);
    CHECK(c.out_dtype == DType::kBFloat16);
    CHECK(c.block_n == 128);
    CHECK_FALSE(c.invalid_reason(90));
  }
  CHECK(static_cast<int>(plan.space.valid) < plan.space.total);  // the 16-bit tiles FP8 cannot take, pruned by name
  // FP8 is the dense forward's: a packed or backward problem of it is refused by name.
  for (const bool varlen : {true, false}) {
    flashgen::AttentionProblem other = call.problem;
    if (varlen) other.varlen = true;
    else other.pass = flashgen::Pass::kBackward;
    try {
      flashgen::plan_tune(other, 90, {});
      FAIL("a packed or backward FP8 problem is not swept");
    } catch (const flashgen::Error& e) {
      CHECK(e.status() == flashgen::Status::kUnsupported);
      CHECK(std::string(e.what()).find("tuning e4m3 q, k and v: the dense forward only") != std::string::npos);
    }
  }
}

TEST_CASE("an FP8 forward over a paged cache reads Vᵀ gathered per sequence, its keys past every sequence's",
          "[c_api][fp8][fp8_forward][varlen]") {
  // Three sequences over 8 pages of 64 keys (2 a sequence), max_seqlen_k 100: each sequence's Vᵀ from a multiple of
  // round_up(100, 128) = 128 keys.
  flashgen_varlen_forward_args paged{};
  paged.size = sizeof(paged);
  paged.options = FLASHGEN_ATTENTION_OPTIONS_INIT;
  paged.q = bshd(fake_pointer(1), FLASHGEN_FLOAT8_E4M3, 1, 100, 4, 128);
  paged.k = paged.v = bshd(fake_pointer(2), FLASHGEN_FLOAT8_E4M3, 8, 64, 4, 128);
  paged.out = bshd(fake_pointer(3), FLASHGEN_BFLOAT16, 1, 100, 4, 128);
  paged.cu_seqlens_q = paged.cu_seqlens_k = static_cast<const int32_t*>(fake_pointer(5));
  paged.block_table = static_cast<const int32_t*>(fake_pointer(4));
  paged.batch = 3, paged.max_pages = 2, paged.max_seqlen_q = 100, paged.max_seqlen_k = 100;
  const flashgen::ForwardCall call = flashgen::make_varlen_forward_call(paged);
  CHECK(call.problem.paged);
  const flashgen::KernelConfig config =
      flashgen::KernelConfig::from_name("fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_varlen_paged");
  CHECK(config.values_t_keys(call.params) == 3 * 128);
  CHECK(config.values_t_entries(call.params) == 1);
  CHECK(config.values_t_bytes(call.params) == size_t(4 * 128 * 3 * 128));
  const flashgen::FwdTmaTensors tensors(call.problem, call.params, config);
  CHECK(tensors.v.keys_as_columns);  // Vᵀ, not the pages
  CHECK(tensors.v_rows == 128);
  CHECK(tensors.kv_rows == 64);      // K from the pages, a box a page
  CHECK_FALSE(tensors.v_fine);
}
