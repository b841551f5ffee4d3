// Forward and backward configs whose values have a head dim of their own (head_dim_v, MLA's 192 and 128): the name,
// JSON, traits and generated header, and the families that take one.
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/bwd_config.hpp"
#include "generator/generator.hpp"
#include "generator/kernel_config.hpp"

using flashgen::BwdConfig;
using flashgen::KernelConfig;

TEST_CASE("a values' head dim of its own: _v after _d in the name, a JSON field, kHeadDimV in the header",
          "[generator][config]") {
  const KernelConfig c = KernelConfig::from_name("fwd_sm80_bf16_d192_v128_m64_n32_w4_s2_causal");
  CHECK(c.head_dim == 192);
  CHECK(c.value_dim() == 128);
  CHECK(c.block_m == 64);
  CHECK(c.sm80()->warps == 4);
  CHECK(c.name() == "fwd_sm80_bf16_d192_v128_m64_n32_w4_s2_causal");
  CHECK_FALSE(c.invalid_reason(80).has_value());

  const nlohmann::json j = c;
  CHECK(j.at("head_dim_v") == 128);
  CHECK(j.get<KernelConfig>() == c);
  KernelConfig same = c;
  same.head_dim_v = 0;
  CHECK_FALSE(same == c);
  CHECK_FALSE(nlohmann::json(same).contains("head_dim_v"));
  // Equal dims are the config without one: the same name and key.
  same.head_dim_v = 192;
  CHECK(same.name() == "fwd_sm80_bf16_d192_m64_n32_w4_s2_causal");
  CHECK(same == KernelConfig::from_name(same.name()));
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_bf16_d192_v192_m64_n32_w4_s2"), flashgen::Error);
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_bf16_d192_v_m64_n32_w4_s2"), flashgen::Error);
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_bf16_d192_v128_m64_n32_w4"), flashgen::Error);

  const std::string header = flashgen::generate(c).headers.front().contents;
  CHECK(header.find("kHeadDimV = 128;") != std::string::npos);
  CHECK(flashgen::generate(same).headers.front().contents.find("kHeadDimV") == std::string::npos);
}

TEST_CASE("the sm80 forward's sizes follow both head dims", "[generator][config]") {
  // 192 / 128: K rows of 200 elements, V and output rows of 136.
  const auto mla = flashgen::fwd_traits(192, 64, 32, 4, 2, false, 128);
  REQUIRE(mla.error == nullptr);
  CHECK(mla.smem_row_elems == 200);
  CHECK(mla.smem_row_elems_v == 136);
  CHECK(mla.smem_kv_stage_bytes == 32 * (200 + 136) * 2);
  CHECK(mla.smem_bytes == 64 * 200 * 2 + 2 * 32 * (200 + 136) * 2);
  CHECK(mla.accum_regs == 1 * (128 / 8) * 4 + 1 * (32 / 8) * 4 + 1 * (32 / 16) * 4);
  // Values wider than the keys: the output tile outgrows Q and the stages, and shared memory is the output's.
  const auto wide = flashgen::fwd_traits(64, 64, 16, 4, 2, false, 384);
  REQUIRE(wide.error == nullptr);
  CHECK(wide.smem_row_elems_v == 392);
  CHECK(64 * 72 * 2 + 2 * 16 * (72 + 392) * 2 < 64 * 392 * 2);
  CHECK(wide.smem_bytes == 64 * 392 * 2);
  // 0 or head_dim itself: the equal-dims sizes.
  const auto plain = flashgen::fwd_traits(128, 128, 32, 4, 3, false);
  CHECK(flashgen::fwd_traits(128, 128, 32, 4, 3, false, 128).smem_bytes == plain.smem_bytes);
  CHECK(plain.smem_bytes == 128 * 136 * 2 + 3 * 2 * 32 * 136 * 2);
  CHECK(std::string(flashgen::fwd_traits(128, 64, 32, 4, 2, false, 520).error) ==
        "head_dim_v must be a multiple of 8 in [8, 512]");
  CHECK(std::string(flashgen::fwd_traits(128, 64, 32, 4, 2, false, 100).error) ==
        "head_dim_v must be a multiple of 8 in [8, 512]");
  // A warp's 16 rows of 512 fp32 output columns: 256 registers a thread, more than it has.
  CHECK(std::string(flashgen::fwd_traits(64, 64, 16, 4, 2, false, 512).error).find("registers") != std::string::npos);
}

TEST_CASE("the sm90 forward's sizes follow both head dims", "[generator][config]") {
  KernelConfig c = KernelConfig::from_name("fwd_sm90_bf16_d192_m128_n112_s2_causal_ovl_pp");
  c.head_dim_v = 128;
  CHECK(c.name() == "fwd_sm90_bf16_d192_v128_m128_n112_s2_causal_ovl_pp");
  CHECK(KernelConfig::from_name(c.name()) == c);
  CHECK_FALSE(c.invalid_reason(90).has_value());
  // K tiles of 192 columns, V tiles and the output of 128; O takes 64 registers a consumer thread, not 96.
  const flashgen::FwdSm90Traits mla = c.sm90_traits();
  const flashgen::FwdSm90Traits keys_wide = KernelConfig::from_name("fwd_sm90_bf16_d192_m128_n112_s2_causal_ovl_pp")
                                                .sm90_traits();
  CHECK(mla.tile_dim == 192);
  CHECK(mla.tile_dim_v == 128);
  CHECK(mla.smem_kv_stage_bytes == 112 * (192 + 128) * 2);
  CHECK(keys_wide.accum_regs - mla.accum_regs == (192 - 128) / 2);
  // Values wider than the keys: the output is staged in rows of its own, never in the narrower Q rows.
  const auto wide = flashgen::fwd_sm90_traits(64, 128, 64, 2, true, false, false, 1, flashgen::MaskKind::kCausal, 1,
                                              false, flashgen::ElemType::kBFloat16, false, 256);
  REQUIRE(wide.error == nullptr);
  CHECK(wide.smem_o_bytes == 128 * 256 * 2);
  // O of 512 columns does not fit one consumer's registers.
  c.head_dim_v = 512;
  REQUIRE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(90)->find("head_dim_v must be a multiple of 8 in [8, 256]") != std::string::npos);
}

TEST_CASE("a backward config's values' head dim: _v in the name, a JSON field, kHeadDimV in the header",
          "[generator][config][backward]") {
  for (const char* name : {"bwd_sm90_bf16_d192_v128_m64_n64_s2_causal_det",
                           "bwd_sm80_fp16_d192_v128_m32_n64_w4_s2_x2_causal_det_qm64_qn16_qw4_qs2"}) {
    const BwdConfig c = BwdConfig::from_name(name);
    CHECK(c.head_dim == 192);
    CHECK(c.value_dim() == 128);
    CHECK(c.name() == name);
    CHECK_FALSE(c.invalid_reason(90).has_value());
    const nlohmann::json j = c;
    CHECK(j.at("head_dim_v") == 128);
    CHECK(j.get<BwdConfig>() == c);
    BwdConfig same = c;
    same.head_dim_v = 192;
    CHECK(same.name().find("_v") == std::string::npos);
    CHECK_FALSE(nlohmann::json(same).contains("head_dim_v"));
    const std::string header = flashgen::generate(c).headers.front().contents;
    CHECK(header.find("kHeadDimV = 128;") != std::string::npos);
    CHECK(flashgen::generate(same).headers.front().contents.find("kHeadDimV") == std::string::npos);
  }
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm90_bf16_d192_v_m64_n64_s2"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm90_bf16_d192_v192_m64_n64_s2"), flashgen::Error);
}

TEST_CASE("the sm90 backward's sizes follow both head dims", "[generator][config][backward]") {
  // MLA's prefill: K and Q tiles of 192 columns, V and dO of 128; consumer 0 holds dK (96 registers), consumer 1 dV.
  const flashgen::BwdSm90Traits mla = flashgen::bwd_sm90_traits(192, 64, 64, 2, false, 128);
  const flashgen::BwdSm90Traits equal = flashgen::bwd_sm90_traits(192, 64, 64, 2, false);
  REQUIRE(mla.error == nullptr);
  CHECK(mla.tile_dim == 192);
  CHECK(mla.tile_dim_v == 128);
  CHECK(mla.dkdv_split);
  CHECK(mla.dkv_regs == 96);
  CHECK(mla.smem_kv_bytes == 64 * (192 + 128) * 2);
  CHECK(mla.smem_stage_bytes == 64 * (192 + 128) * 2 + 2 * 64 * 4);
  CHECK(equal.smem_bytes - mla.smem_bytes == 3 * 64 * 64 * 2);  // a V tile's and two dO tiles' last chunk
  CHECK(mla.dq_staged);
  // Narrower values beside 128-column keys keep the ping-pong tile; dK and dV take (128 + 64) / 2 registers.
  const flashgen::BwdSm90Traits narrow = flashgen::bwd_sm90_traits(128, 64, 128, 2, false, 64);
  REQUIRE(narrow.error == nullptr);
  CHECK(narrow.ping_pong);
  CHECK(narrow.dkv_regs == 96);
  // Values wider than 128 columns need the dK/dV split, which keys of 128 columns do not take.
  CHECK(std::string(flashgen::bwd_sm90_traits(128, 64, 64, 2, false, 192).error).find("head_dim_v") == 0);
  CHECK(std::string(flashgen::bwd_sm90_traits(192, 64, 64, 2, false, 320).error).find("head_dim_v") == 0);
  // Whether the dQ tile is staged follows the values' tiles too (the convert kernel reads dq_adds_counted).
  CHECK_FALSE(flashgen::dq_adds_counted(flashgen::DqAccum::kTiles, 192, 64, 64, 3));
  CHECK(flashgen::bwd_sm90_traits(192, 64, 64, 3, false, 128).dq_staged ==
        flashgen::dq_adds_counted(flashgen::DqAccum::kTiles, 192, 64, 64, 3, 128));
}
