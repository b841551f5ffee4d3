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
  // O of 512 columns does not fit one consumer's registers: it takes two (value_split 2).
  c.head_dim_v = 512;
  REQUIRE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(90)->find("head_dim_v above 256 takes value_split 2") != std::string::npos);
}

TEST_CASE("values wider than 256: two consumers for each 64 rows split O's columns (value_split)",
          "[generator][config]") {
  const KernelConfig c = KernelConfig::from_name("fwd_sm90_bf16_d64_v512_m64_n64_s2_causal_ovl_pp_pst_vs2");
  CHECK(c.sm90()->value_split == 2);
  CHECK(c.name() == "fwd_sm90_bf16_d64_v512_m64_n64_s2_causal_ovl_pp_pst_vs2");
  CHECK_FALSE(c.invalid_reason(90).has_value());
  const nlohmann::json j = c;
  CHECK(j.at("value_split") == 2);
  CHECK(j.get<KernelConfig>() == c);
  KernelConfig whole = c;
  whole.sm90()->value_split = 1;
  CHECK_FALSE(whole == c);
  CHECK_FALSE(nlohmann::json(whole).contains("value_split"));
  CHECK(whole.name().find("_vs") == std::string::npos);
  CHECK(flashgen::generate(c).headers.front().contents.find("kValueSplit = 2;") != std::string::npos);
  // A config without the split renders the header it had before the knob (and keeps its cache key).
  whole.head_dim_v = 256;
  whole.block_m = 128;
  CHECK(flashgen::generate(whole).headers.front().contents.find("kValueSplit") == std::string::npos);
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm90_bf16_d64_v512_m64_n64_s2_vs"), flashgen::Error);
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm90_bf16_d64_v512_m64_n64_s2_vs2_vs2"), flashgen::Error);

  // Two consumers of 64 rows, 256 of O's columns each (128 registers); the output in rows of its own; Q, two
  // stages of 64 keys of 64 + 512 columns and O's staging rows in 227 KB.
  const flashgen::FwdSm90Traits t = c.sm90_traits();
  REQUIRE(t.error == nullptr);
  CHECK(t.consumers == 2);
  CHECK(t.threads == 384);
  CHECK(t.tile_dim_v == 512);
  CHECK(t.part_dim_v == 256);
  CHECK(t.accum_regs == 256 / 2 + 64 / 2 + 64 / 4);
  CHECK(t.smem_o_bytes == 64 * 512 * 2);
  CHECK(t.smem_group_bytes == 64 * 64 * 2 + 2 * 64 * (64 + 512) * 2 + 64 * 512 * 2 + (3 + 4 * 2) * 8);
  // Keys of 128 columns leave room for 48 keys a stage (block_n 32 and 48 beside wide tiles only).
  KernelConfig keys128 = KernelConfig::from_name("fwd_sm90_bf16_d128_v512_m64_n48_s2_ovl_pp_vs2");
  CHECK_FALSE(keys128.invalid_reason(90).has_value());
  keys128.block_n = 64;
  REQUIRE(keys128.invalid_reason(90).has_value());
  CHECK(keys128.invalid_reason(90)->find("shared memory") != std::string::npos);
  CHECK(std::string(KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n48_s2").sm90_traits().error)
            .find("block_n must be a multiple of 16 in [64, 192]") == 0);
  // Four consumers at most; a split of values of 256 or fewer columns is valid (each consumer 128 of them).
  CHECK(std::string(KernelConfig::from_name("fwd_sm90_bf16_d64_v512_m192_n64_s2_vs2").sm90_traits().error)
            .find("block_m / 64 * value_split must be at most 4") == 0);
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d128_m64_n64_s2_vs2").sm90_traits().part_dim_v == 64);
  // Each part is whole 64-column chunks: 320 and 384 take two of 192, 448 two of 256 (TMA fills the columns past
  // the values' head dim with zeros and clips them from the stores).
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d64_v320_m64_n64_s2_vs2").sm90_traits().tile_dim_v == 384);
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d64_v320_m64_n64_s2_vs2").sm90_traits().part_dim_v == 192);
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d64_v448_m64_n64_s2_vs2").sm90_traits().tile_dim_v == 512);
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d64_v448_m64_n64_s2_vs2").sm90_traits().error == nullptr);
  // The output stages the values' chunks only (448: seven), not the split's padding chunk.
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d64_v448_m64_n64_s2_vs2").sm90_traits().out_dim_v == 448);
  CHECK(KernelConfig::from_name("fwd_sm90_bf16_d64_v448_m64_n64_s2_vs2").sm90_traits().smem_o_bytes == 64 * 448 * 2);
  // Two groups of consumers take no split.
  CHECK(std::string(KernelConfig::from_name("fwd_sm90_fp16_d128_m64_n64_s3_pst_g2_vs2").sm90_traits().error)
            .find("groups 2 takes no value_split") == 0);
}

TEST_CASE("keys of 512 on the Hopper forward: 32 keys a stage, the output staged in the Q rows",
          "[generator][config]") {
  // Q (64 KB) and two stages of 32 keys of 512 + 512 columns (64 KB each) fill 192 KB: no room for output rows of
  // their own, so both consumers of the rows stage their halves of O in the Q rows once both are done with them.
  const KernelConfig c = KernelConfig::from_name("fwd_sm90_bf16_d512_m64_n32_s2_causal_ovl_pp_pst_vs2");
  REQUIRE_FALSE(c.invalid_reason(90).has_value());
  const flashgen::FwdSm90Traits t = c.sm90_traits();
  CHECK(t.tile_dim == 512);
  CHECK(t.part_dim_v == 256);
  CHECK(t.smem_o_bytes == 0);
  CHECK(t.smem_group_bytes == 64 * 512 * 2 + 2 * 32 * (512 + 512) * 2 + (3 + 4 * 2) * 8);
  KernelConfig wider = c;
  wider.block_n = 48;
  REQUIRE(wider.invalid_reason(90).has_value());
  CHECK(wider.invalid_reason(90)->find("shared memory") != std::string::npos);
  // Keys and values of 448: the output's seven chunks staged in the Q rows (the split's eighth is padding).
  const flashgen::FwdSm90Traits t448 =
      KernelConfig::from_name("fwd_sm90_bf16_d448_m64_n32_s2_causal_ovl_pp_pst_vs2").sm90_traits();
  REQUIRE(t448.error == nullptr);
  CHECK(t448.tile_dim_v == 512);
  CHECK(t448.out_dim_v == 448);
  CHECK(t448.smem_o_bytes == 0);
  // Narrower values need no split: one consumer, O of 128 columns.
  const KernelConfig narrow = KernelConfig::from_name("fwd_sm90_bf16_d512_v128_m64_n32_s2_causal_ovl_pst");
  CHECK_FALSE(narrow.invalid_reason(90).has_value());
  CHECK(narrow.sm90_traits().consumers == 1);
  CHECK(std::string(flashgen::fwd_sm90_traits(520, 64, 32, 2, false, false, false, 1, flashgen::MaskKind::kNone)
                        .error) == "head_dim must be a multiple of 8 in [8, 512] (16-byte rows for TMA)");
  // The sm80 family's warps take keys of up to 256.
  CHECK(KernelConfig::from_name("fwd_sm80_bf16_d512_m64_n16_w4_s2").invalid_reason(80).has_value());
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
