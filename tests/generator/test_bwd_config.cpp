// BwdConfig: canonical names, validation against the shared traits, JSON round-trip, and the generated
// module (one translation unit holding every kernel of the config, golden-checked).
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/bwd_config.hpp"
#include "generator/generator.hpp"
#include "support/golden.hpp"
#include "templates/attn_params.cuh"

using flashgen::BwdConfig;
using flashgen::BwdKernel;

using flashgen::test::check_golden;

TEST_CASE("backward config names round-trip and are canonical", "[generator][backward]") {
  BwdConfig c;
  CHECK(c.name() == "bwd_sm80_fp16_d128_m64_n64_w4_s2_x1");
  CHECK(BwdConfig::from_name(c.name()) == c);
  c.dtype = flashgen::DType::kBFloat16;
  c.mask = flashgen::MaskKind::kCausal;
  c.deterministic = true;
  c.sm80()->d_split = 2;
  c.dq_block_n = 16;
  CHECK(c.name() == "bwd_sm80_bf16_d128_m64_n64_w4_s2_x2_causal_det_qm64_qn16_qw4_qs2");
  const BwdConfig back = BwdConfig::from_name(c.name());
  CHECK(back == c);
  CHECK(back.dq_block_n == 16);
  CHECK(back.deterministic);
  CHECK(c.symbol(BwdKernel::kDq) == c.name() + "_dq");

  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_fp16_d128_m64_n64_w4_s2"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_fp16_d128_m64_n64_w4_s2_x1_det"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_fp16_d128_m64_n64_w4_s2_x1_qreg"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_fp16_d0128_m64_n64_w4_s2_x1"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("fwd_sm80_fp16_d128_m64_n64_w4_s2"), flashgen::Error);
}

TEST_CASE("a backward module without a dq kernel generates what its name reads back as", "[generator][backward]") {
  // Its name leaves the dq tiles out, and the name and source make the cache key: a config built with other dq tiles
  // (the heuristic's) must not make a module its name, read back from a database, would not find.
  BwdConfig c;
  c.head_dim = 64;
  c.dq_block_n = 64;
  REQUIRE_FALSE(c.has_dq_kernel());
  const BwdConfig back = BwdConfig::from_name(c.name());
  CHECK(back.dq_block_n != c.dq_block_n);
  const flashgen::GeneratedSource made = flashgen::generate(c), read = flashgen::generate(back);
  CHECK(made.translation_unit == read.translation_unit);
  REQUIRE(made.headers.size() == read.headers.size());
  for (size_t i = 0; i < made.headers.size(); ++i) CHECK(made.headers[i].contents == read.headers[i].contents);
}

TEST_CASE("sm90 backward config names round-trip", "[generator][backward][sm90]") {
  BwdConfig c;
  c.knobs = flashgen::BwdSm90Knobs{};
  c.dtype = flashgen::DType::kBFloat16;
  c.block_m = 64;
  c.block_n = 128;
  CHECK(c.name() == "bwd_sm90_bf16_d128_m64_n128_s2");
  c.mask = flashgen::MaskKind::kCausal;
  c.stages = 3;
  CHECK(c.name() == "bwd_sm90_bf16_d128_m64_n128_s3_causal");
  const BwdConfig back = BwdConfig::from_name(c.name());
  CHECK(back == c);
  CHECK(back.family() == flashgen::KernelFamily::kSm90);
  CHECK(back.stages == 3);
  CHECK(back.mask == flashgen::MaskKind::kCausal);
  c.deterministic = true;  // the same dkdv kernel, its dQ adds in a fixed order: no dq kernel to name
  CHECK(c.name() == "bwd_sm90_bf16_d128_m64_n128_s3_causal_det");
  CHECK_FALSE(c.has_dq_kernel());
  CHECK(BwdConfig::from_name(c.name()) == c);
  CHECK(BwdConfig::from_name(c.name()).deterministic);
  // A record of the first generation (dkdv then the sm80 family's dq kernel) names dq tiles: the JSON
  // form still reads, as the same module; the name is refused with the reason.
  nlohmann::json old = c;
  old["dq_block_m"] = 128;
  old["dq_warps"] = 2;
  CHECK(old.get<BwdConfig>() == c);
  CHECK(old.get<BwdConfig>().dq_block_m == BwdConfig().dq_block_m);
  try {
    BwdConfig::from_name("bwd_sm90_bf16_d128_m64_n128_s3_causal_det_qm64_qn32_qw4_qs2");
    FAIL("a first-generation sm90 deterministic name was accepted");
  } catch (const flashgen::Error& e) {
    CHECK(std::string(e.what()).find("no dq kernel") != std::string::npos);
  }
  c.deterministic = false;
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm90_fp16_d128_m64_n128"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm90_fp16_d128_m64_n128_w8_s2"), flashgen::Error);
  const nlohmann::json j = c;
  CHECK(j["family"] == "bwd_sm90");
  CHECK(j.get<BwdConfig>() == c);
}

TEST_CASE("sm90 backward validity follows bwd_sm90_traits", "[generator][backward][sm90]") {
  BwdConfig c;
  c.knobs = flashgen::BwdSm90Knobs{};
  c.block_m = 64;
  c.block_n = 128;
  CHECK_FALSE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(80)->find("sm_90") != std::string::npos);
  CHECK(c.invalid_reason(100)->find("sm_90") != std::string::npos);
  BwdConfig det = c;
  det.deterministic = true;  // the same family and tiles: dQ adds in a fixed order
  CHECK_FALSE(det.invalid_reason(90).has_value());
  // Its consumers take turns as the atomic strategy's do (three dSᵀ tiles and their barriers); its own turns at the
  // dQ semaphores are watched for and passed on by producer warps through mbarriers that every config reserves.
  CHECK(c.sm90_traits().ping_pong);
  CHECK(det.sm90_traits().ping_pong);
  CHECK_FALSE(det.sm90_lock_step());
  CHECK(c.smem_bytes(BwdKernel::kDkdv) == det.smem_bytes(BwdKernel::kDkdv));
  BwdConfig capped = c;
  capped.mods.softcap = true;  // takes turns too (its dK reads dSᵀ from the staged tile)
  CHECK_FALSE(capped.sm90_lock_step());
  CHECK(capped.sm90_traits().ping_pong);
  BwdConfig capped_alibi = capped;
  capped_alibi.mods.alibi = true;  // the soft cap under ALiBi needs more registers than the turns leave
  CHECK(capped_alibi.sm90_lock_step());
  CHECK_FALSE(capped_alibi.sm90_traits().ping_pong);
  BwdConfig biased = c;
  biased.mods.alibi = true;  // ALiBi alone takes turns
  CHECK_FALSE(biased.sm90_lock_step());
  BwdConfig three_stages = c;
  three_stages.stages = 3;  // the turns' three dSᵀ tiles fit beside two stages only
  CHECK_FALSE(three_stages.sm90_traits().ping_pong);
  CHECK(det.dq_accum() == flashgen::DqAccum::kTiles);
  det.dq_block_m = 48;  // the sm80 family's dq tiles: no dq kernel here
  CHECK_FALSE(det.invalid_reason(90).has_value());
  BwdConfig bad = c;
  bad.head_dim = 256;
  CHECK(bad.invalid_reason(90)->find("head_dim") != std::string::npos);
  bad = c;
  bad.block_n = 192;
  CHECK(bad.invalid_reason(90)->find("block_n") != std::string::npos);
  bad = c;
  bad.block_m = 128;  // Sᵀ and dPᵀ of 128 queries next to dK and dV of 128 columns
  CHECK(bad.invalid_reason(90)->find("registers") != std::string::npos);
  // 64 keys at head_dim 128: the query split, both consumers on the block's 64 keys taking turns over the
  // steps, each with its own 64-row dQ tile (two 64-column passes) and dSᵀ tile.
  BwdConfig split = c;
  split.block_n = 64;
  CHECK_FALSE(split.invalid_reason(90).has_value());
  const flashgen::BwdSm90Traits q = split.sm90_traits();
  CHECK(q.query_split);
  CHECK_FALSE(q.dkdv_split);
  CHECK(q.consumers == 2);
  CHECK(q.key_consumers == 1);
  CHECK(q.dkv_regs == 128);
  CHECK(q.dq_cols == 64);
  CHECK(q.dq_passes == 2);
  CHECK(q.dq_tiles == 2);
  CHECK(q.dq_staged);
  CHECK(q.smem_dq_bytes == 2 * 64 * 128 * 4);
  CHECK(q.smem_ds_bytes == 2 * 64 * 64 * 2);
  // mbarriers: K/V, the stages' full and empty, the deterministic turns' rings (8) and the epilogue's partials
  CHECK(q.mbarriers == 1 + 2 * 2 + 8 + 1);
  CHECK(q.smem_bytes == 2 * 64 * 128 * 2 + 2 * (2 * 64 * 128 * 2 + 2 * 64 * 4) + q.smem_ds_bytes + q.mbarriers * 8 +
                            1024 + q.smem_dq_bytes);
  split.stages = 3;
  CHECK_FALSE(split.invalid_reason(90).has_value());
  split.block_m = 128;
  CHECK(split.invalid_reason(90)->find("64-query blocks") != std::string::npos);
  CHECK_FALSE(c.sm90_traits().query_split);
  bad = c;
  bad.head_dim = 64;  // two consumers split 64 dQ columns into halves narrower than a chunk
  CHECK(bad.invalid_reason(90)->find("dQ columns") != std::string::npos);
  bad.deterministic = true;  // either strategy computes dQ
  CHECK(bad.invalid_reason(90)->find("dQ columns") != std::string::npos);
  bad.deterministic = false;
  bad.block_m = 128;
  CHECK_FALSE(bad.invalid_reason(90).has_value());
  bad.stages = 3;  // three stages of 128 queries next to 128 x 128 dSᵀ tiles and the dQ tile
  CHECK(bad.invalid_reason(90)->find("shared memory") != std::string::npos);
  bad = c;
  bad.stages = 4;
  CHECK(bad.invalid_reason(90)->find("stages") != std::string::npos);

  // head_dim 256: 64 x 64 blocks, consumer 0 holding dK and consumer 1 dV (they trade dPᵀ and Pᵀ through a
  // 16 KB exchange tile); with 2 stages dQ is added from registers in two 64-column passes each (no shared
  // dQ tile).
  BwdConfig wide = c;
  wide.head_dim = 256;
  CHECK(wide.invalid_reason(90)->find("64 x 64") != std::string::npos);
  wide.block_n = 64;
  CHECK_FALSE(wide.invalid_reason(90).has_value());
  const flashgen::BwdSm90Traits w = wide.sm90_traits();
  CHECK(w.dkdv_split);
  CHECK(w.consumers == 2);
  CHECK(w.key_consumers == 1);
  CHECK(w.dkv_regs == 128);
  CHECK(w.dq_cols == 64);
  CHECK(w.dq_passes == 2);
  CHECK(w.dq_passes_last == 2);
  CHECK_FALSE(w.dq_staged);
  CHECK(w.smem_dq_bytes == 0);
  CHECK(w.smem_exchange_bytes == 64 * 64 * 4);
  // mbarriers: K/V, the stages' full and empty, and the deterministic turns' two rings of two (8)
  CHECK(w.smem_bytes ==
        2 * 64 * 256 * 2 + 2 * (2 * 64 * 256 * 2 + 2 * 64 * 4) + 2 * 64 * 64 * 2 + 64 * 64 * 4 + (5 + 8) * 8 + 1024);
  wide.stages = 3;
  CHECK(wide.invalid_reason(90)->find("shared memory") != std::string::npos);
  wide.stages = 1;  // one stage leaves room for the staged dQ tile: the writer warp adds it
  CHECK_FALSE(wide.invalid_reason(90).has_value());
  CHECK(wide.sm90_traits().dq_staged);
  CHECK(wide.sm90_traits().smem_dq_bytes == 64 * 256 * 4);

  // head_dim 192: the same split; consumer 0 adds two chunks of dQ and consumer 1 one. The staged dQ tile
  // fits up to 2 stages.
  BwdConfig d192 = wide;
  d192.head_dim = 192;
  d192.stages = 2;
  CHECK_FALSE(d192.invalid_reason(90).has_value());
  const flashgen::BwdSm90Traits t192 = d192.sm90_traits();
  CHECK(t192.dkdv_split);
  CHECK(t192.consumers == 2);
  CHECK(t192.dkv_regs == 96);
  CHECK(t192.dq_cols == 64);
  CHECK(t192.dq_passes == 2);
  CHECK(t192.dq_passes_last == 1);
  CHECK(t192.dq_staged);
  CHECK(t192.smem_bytes == 2 * 64 * 192 * 2 + 2 * (2 * 64 * 192 * 2 + 2 * 64 * 4) + 2 * 64 * 64 * 2 + 64 * 192 * 4 +
                               64 * 64 * 4 + (5 + 8) * 8 + 1024);
  d192.stages = 3;  // three stages leave no room for the tile: dQ added from registers
  CHECK_FALSE(d192.invalid_reason(90).has_value());
  CHECK_FALSE(d192.sm90_traits().dq_staged);
  d192.stages = 1;
  CHECK_FALSE(d192.invalid_reason(90).has_value());
  d192.block_n = 128;
  CHECK(d192.invalid_reason(90)->find("64 x 64") != std::string::npos);
  // head_dim 96 and 160: tiles of 128 and 192 columns, zero-padded past head_dim; the same sizes as there.
  BwdConfig d96 = c;
  d96.head_dim = 96;
  BwdConfig d128 = c;
  d128.head_dim = 128;
  CHECK_FALSE(d96.invalid_reason(90).has_value());
  CHECK(d96.sm90_traits().tile_dim == 128);
  CHECK(d96.sm90_traits().smem_bytes == d128.sm90_traits().smem_bytes);
  CHECK(d96.sm90_traits().consumers == 2);
  CHECK_FALSE(d96.sm90_traits().dkdv_split);
  BwdConfig d160 = d192;
  d160.head_dim = 160;
  d160.block_n = 64;
  d160.stages = 2;
  CHECK_FALSE(d160.invalid_reason(90).has_value());
  CHECK(d160.sm90_traits().tile_dim == 192);
  CHECK(d160.sm90_traits().dkdv_split);
  CHECK(d160.sm90_traits().smem_bytes == t192.smem_bytes);
  BwdConfig d100 = c;
  d100.head_dim = 100;  // rows of 200 bytes: not whole 16-byte units for TMA
  CHECK(d100.invalid_reason(90)->find("multiple of 8") != std::string::npos);

  BwdConfig one_stage = c;
  one_stage.stages = 1;  // only the dK/dV split (head_dim 192, 256) takes a single stage
  CHECK(one_stage.invalid_reason(90)->find("stages") != std::string::npos);
  CHECK_FALSE(c.sm90_traits().dkdv_split);
  CHECK(c.sm90_traits().smem_exchange_bytes == 0);
  CHECK(c.sm90_traits().dq_staged);

  // K and V, a ring of Q, dO, LSE and D, three dSᵀ tiles (the consumers' turns), the fp32 dQ tile, the
  // barriers (K/V, the ring's full and empty, each dSᵀ tile's full and empty) and the 1024-byte alignment slack.
  const flashgen::BwdSm90Traits t = c.sm90_traits();
  CHECK(t.consumers == 2);
  CHECK(t.threads == 384);
  CHECK(t.dq_cols == 64);
  CHECK(t.dq_row_tiles == 1);
  CHECK(t.smem_dq_bytes == 64 * 128 * 4);
  CHECK(t.smem_bytes ==
        2 * 128 * 128 * 2 + 2 * (2 * 64 * 128 * 2 + 2 * 64 * 4) + 3 * 128 * 64 * 2 + 64 * 128 * 4 + (11 + 8) * 8 +
            1024);
  CHECK(c.smem_bytes(BwdKernel::kDkdv) == t.smem_bytes);
  CHECK(c.threads(flashgen::BwdKernel::kDkdv) == 384);
  CHECK(c.pad_rows() == flashgen::kBwdSm90PadRows);
  CHECK(BwdConfig().pad_rows() == 1);
}

TEST_CASE("sm90 backward: which configs count their dQ adds and which leave the accumulator unzeroed",
          "[generator][backward][sm90]") {
  using flashgen::dq_adds_counted;
  using flashgen::dq_first_add_stores;
  using flashgen::DqAccum;
  // Staged dQ (the writer warp's bulk adds) is counted, so the convert kernel may overlap the dkdv kernel.
  CHECK(dq_adds_counted(DqAccum::kTiles, 128, 64, 128, 2));
  CHECK(dq_adds_counted(DqAccum::kTiles, 64, 128, 128, 2));
  CHECK(dq_adds_counted(DqAccum::kTiles, 96, 64, 128, 2));
  CHECK(dq_adds_counted(DqAccum::kTiles, 256, 64, 64, 1));
  CHECK(dq_adds_counted(DqAccum::kTiles, 192, 64, 64, 2));
  // Direct adds from the consumers (no room for the staged tile) are not; nor is the sm80 family's accumulator.
  CHECK_FALSE(dq_adds_counted(DqAccum::kTiles, 256, 64, 64, 2));
  CHECK_FALSE(dq_adds_counted(DqAccum::kTiles, 192, 64, 64, 3));
  CHECK_FALSE(dq_adds_counted(DqAccum::kRows, 128, 64, 128, 2));
  // The first add stores for the deterministic turns and under a mask; the atomic strategy without one
  // adds into a zeroed accumulator; never where the adds are not counted.
  for (bool hides_keys : {false, true}) {
    CHECK(dq_first_add_stores(DqAccum::kTiles, 128, 64, 128, 2, /*deterministic=*/true, hides_keys));
    CHECK_FALSE(dq_first_add_stores(DqAccum::kTiles, 256, 64, 64, 2, true, hides_keys));
    CHECK_FALSE(dq_first_add_stores(DqAccum::kRows, 128, 64, 128, 2, true, hides_keys));
  }
  CHECK(dq_first_add_stores(DqAccum::kTiles, 64, 128, 128, 2, /*deterministic=*/false, /*hides_keys=*/true));
  CHECK_FALSE(dq_first_add_stores(DqAccum::kTiles, 64, 128, 128, 2, /*deterministic=*/false, /*hides_keys=*/false));
}

// The Hopper family's deterministic turns without a mask, where a launch group's walks rotate: at every query block
// the turns number the key blocks 0 .. n - 1, group by group in launch order, and within a group in the order the
// blocks arrive (each starting its walk at query block size - 1 - index, with equal steps), so that no block waits
// on a later group or on a block of its own group that arrives after it.
TEST_CASE("sm90 backward: rotated deterministic turns follow the order of arrival", "[generator][backward][sm90]") {
  for (int launch : {2, 4, 8}) {
    for (int n_blocks = 1; n_blocks <= 3 * launch + 1; ++n_blocks) {
      for (int walk = launch; walk <= 3 * launch; walk += launch - 1) {
        for (int m = 0; m < walk; ++m) {
          std::vector<int> block_of_turn(n_blocks, -1);
          std::vector<int> arrival(n_blocks), group(n_blocks);
          for (int order = 0; order < n_blocks; ++order) {  // the place in the head's launch order
            const int g = order / launch, index = order % launch;
            const int size = g < n_blocks / launch ? launch : n_blocks % launch;
            const int turn = flashgen::rotated_dq_turn(g * launch, index, size, m);
            REQUIRE(turn >= 0);
            REQUIRE(turn < n_blocks);
            REQUIRE(block_of_turn[turn] == -1);
            block_of_turn[turn] = order;
            group[order] = g;
            arrival[order] = (m - (size - 1 - index) + walk) % walk;  // the step of the block's walk that reaches m
          }
          for (int turn = 1; turn < n_blocks; ++turn) {
            const int before = block_of_turn[turn - 1], after = block_of_turn[turn];
            INFO("launch " << launch << ", " << n_blocks << " key blocks, walk " << walk << ", query block " << m);
            CHECK(group[before] <= group[after]);
            if (group[before] == group[after]) CHECK(arrival[before] < arrival[after]);
          }
        }
      }
    }
  }
}

TEST_CASE("backward config validity follows the shared traits", "[generator][backward]") {
  BwdConfig c;
  CHECK_FALSE(c.invalid_reason(80).has_value());
  CHECK(c.invalid_reason(75).has_value());
  BwdConfig bad = c;
  bad.block_n = 48;  // not a multiple of 16 * warps
  CHECK(bad.invalid_reason(90)->find("block_n") != std::string::npos);
  bad = c;
  bad.head_dim = 256;  // dK + dV of a 256-wide slice do not fit in registers
  CHECK(bad.invalid_reason(90)->find("registers") != std::string::npos);
  bad.sm80()->d_split = 2;
  bad.block_m = 32;
  CHECK_FALSE(bad.invalid_reason(90).has_value());
  bad.sm80()->d_split = 17;
  CHECK(bad.invalid_reason(90)->find("d_split") != std::string::npos);
  bad = c;
  bad.deterministic = true;
  bad.dq_block_m = 48;  // not a multiple of 16 * dq_warps
  CHECK(bad.invalid_reason(90)->find("dq block_m") != std::string::npos);
  bad = c;
  bad.stages = 3;
  bad.block_m = 128;
  bad.block_n = 128;
  bad.sm80()->warps = 8;
  bad.head_dim = 64;
  CHECK(bad.invalid_reason(86)->find("shared memory") != std::string::npos);
  // Traits' sizes: dkdv holds K and V plus a ring of Q, dO, LSE and D, and two dS tiles when atomic.
  const flashgen::BwdDkdvTraits t = c.dkdv_traits();
  CHECK(t.smem_bytes == 2 * 64 * 136 * 2 + 2 * (2 * 64 * 136 * 2 + 2 * 64 * 4) + 2 * 64 * 72 * 2);
  CHECK(c.smem_bytes(BwdKernel::kPreprocess) == 0);
}

TEST_CASE("keys of 512: the dkdv kernel's four column slices, the dq kernel's two", "[generator][backward]") {
  const BwdConfig wide = BwdConfig::from_name("bwd_sm80_bf16_d512_m16_n64_w4_s2_x4_causal_det_qm32_qn16_qw2_qs2");
  CHECK_FALSE(wide.invalid_reason(90).has_value());
  CHECK(wide.dkdv_traits().slice_tiles == 8);  // 128 of dK's and dV's columns a block
  CHECK(wide.smem_bytes(BwdKernel::kDkdv) == 64 * 520 * 2 * 2 + 2 * (16 * 520 * 2 * 2 + 2 * 16 * 4));
  const flashgen::BwdDqTraits dq = wide.dq_traits();
  CHECK(dq.slices == 2);
  CHECK(dq.slice_tiles == 16);
  CHECK(dq.accum_regs == 16 * 8 + 2 * 2 * 4);
  // K and V of 64 keys at 512 exceed sm_80's 163 KB; at 1 or 2 slices dK and dV exceed the registers.
  CHECK(wide.invalid_reason(80)->find("shared memory") != std::string::npos);
  BwdConfig fewer = wide;
  fewer.sm80()->d_split = 2;
  CHECK(fewer.invalid_reason(90)->find("registers") != std::string::npos);
  // Slices of 256 columns at most: one up to 256 (every narrower config as before), two above, the last short.
  CHECK(flashgen::bwd_dq_traits(256, 64, 16, 4, 2).slices == 1);
  const flashgen::BwdDqTraits d320 = flashgen::bwd_dq_traits(320, 32, 16, 2, 2);
  CHECK(d320.error == nullptr);
  CHECK(d320.slices == 2);
  CHECK(d320.slice_tiles == 10);
  CHECK(std::string(flashgen::bwd_dq_traits(520, 32, 16, 2, 2).error) == "head_dim must be a multiple of 8 in [8, 512]");
}

TEST_CASE("backward config JSON round-trips", "[generator][backward]") {
  BwdConfig c;
  c.head_dim = 96;
  c.deterministic = true;
  c.dq_warps = 2;
  c.dq_block_m = 32;
  const nlohmann::json j = c;
  CHECK(j["family"] == "bwd_sm80");
  CHECK(j.get<BwdConfig>() == c);
  CHECK_THROWS_AS(nlohmann::json({{"family", "fwd_sm80"}}).get<BwdConfig>(), flashgen::Error);
  CHECK_THROWS_AS(nlohmann::json({{"block_m", "64"}}).get<BwdConfig>(), flashgen::Error);
  // An sm90 config has no warps or head_dim slices: JSON may name them at their defaults alone.
  const nlohmann::json sm90 = {{"family", "bwd_sm90"}, {"block_n", 128}, {"warps", 4}, {"d_split", 1}};
  CHECK(sm90.get<BwdConfig>().family() == flashgen::KernelFamily::kSm90);
  CHECK_THROWS_AS(nlohmann::json({{"family", "bwd_sm90"}, {"d_split", 2}}).get<BwdConfig>(), flashgen::Error);
}

TEST_CASE("backward module holds every kernel of its strategy", "[generator][backward]") {
  BwdConfig atomic;
  atomic.dtype = flashgen::DType::kBFloat16;
  atomic.mask = flashgen::MaskKind::kCausal;
  const flashgen::GeneratedSource a = flashgen::generate(atomic);
  for (BwdKernel k : {BwdKernel::kPreprocess, BwdKernel::kDkdv, BwdKernel::kConvert})
    CHECK(a.translation_unit.find(atomic.symbol(k) + "(") != std::string::npos);
  CHECK(a.translation_unit.find(atomic.symbol(BwdKernel::kDq) + "(") == std::string::npos);
  check_golden(atomic.name() + ".cu", a.translation_unit);
  check_golden(atomic.name() + "_config.cuh", a.headers.front().contents);

  BwdConfig det = atomic;
  det.deterministic = true;
  const flashgen::GeneratedSource d = flashgen::generate(det);
  CHECK(d.translation_unit.find(det.symbol(BwdKernel::kDq) + "(") != std::string::npos);
  CHECK(d.translation_unit.find(det.symbol(BwdKernel::kConvert) + "(") == std::string::npos);
  CHECK(d.headers.front().contents.find("kAtomicDq = false") != std::string::npos);

  BwdConfig invalid;
  invalid.sm80()->warps = 0;
  CHECK_THROWS_AS(flashgen::generate(invalid), flashgen::Error);
}

TEST_CASE("sm90 backward module: the Hopper dkdv kernel between the shared row kernels", "[generator][backward][sm90]") {
  BwdConfig c;
  c.knobs = flashgen::BwdSm90Knobs{};
  c.mask = flashgen::MaskKind::kCausal;
  c.block_n = 128;
  const flashgen::GeneratedSource s = flashgen::generate(c);
  for (BwdKernel k : {BwdKernel::kPreprocess, BwdKernel::kDkdv, BwdKernel::kConvert})
    CHECK(s.translation_unit.find(c.symbol(k) + "(") != std::string::npos);
  CHECK(s.translation_unit.find("AttnBwdSm90Params") != std::string::npos);
  CHECK(s.headers.front().contents.find("kPadRows = 128") != std::string::npos);
  bool has_sm80_template = false;
  for (const auto& h : s.headers) has_sm80_template |= h.name == "bwd_sm80.cuh";
  CHECK_FALSE(has_sm80_template);  // only the templates the unit reaches
  check_golden(c.name() + ".cu", s.translation_unit);
  check_golden(c.name() + "_config.cuh", s.headers.front().contents);

  CHECK(s.headers.front().contents.find("kDqAccum = flashgen::DqAccum::kTiles") != std::string::npos);

  BwdConfig det = c;
  det.deterministic = true;  // the same kernels; the dkdv kernel orders its dQ adds
  const flashgen::GeneratedSource d = flashgen::generate(det);
  for (BwdKernel k : {BwdKernel::kPreprocess, BwdKernel::kDkdv, BwdKernel::kConvert})
    CHECK(d.translation_unit.find(det.symbol(k) + "(") != std::string::npos);
  CHECK(d.translation_unit.find("BwdDqSm80") == std::string::npos);
  CHECK(d.headers.front().contents.find("kAtomicDq = false") != std::string::npos);
  CHECK(d.headers.front().contents.find("kDqBlockM") == std::string::npos);
}
