// KernelConfig: naming, parsing, validation (the shared fwd_traits rules) and JSON round-trip.
#include "catch.hpp"

#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "generator/kernel_config.hpp"
#include "templates/attn_params.cuh"

using flashgen::DType;
using flashgen::KernelConfig;
using flashgen::MaskKind;

TEST_CASE("config names are canonical and parse back", "[generator][config]") {
  KernelConfig c;
  c.dtype = DType::kBFloat16;
  c.head_dim = 128;
  c.mask = MaskKind::kCausal;
  c.block_m = 128;
  c.block_n = 64;
  c.sm80()->warps = 4;
  c.stages = 2;
  CHECK(c.name() == "fwd_sm80_bf16_d128_m128_n64_w4_s2_causal");
  CHECK(KernelConfig::from_name(c.name()) == c);

  c.sm80()->q_in_regs = true;
  c.mask = MaskKind::kNone;
  CHECK(c.name() == "fwd_sm80_bf16_d128_m128_n64_w4_s2_qreg");
  CHECK(KernelConfig::from_name(c.name()) == c);
}

TEST_CASE("malformed config names are rejected with the offending part", "[generator][config]") {
  auto message_of = [](const std::string& name) {
    try {
      KernelConfig::from_name(name);
    } catch (const flashgen::Error& e) {
      CHECK(e.status() == flashgen::Status::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message_of("fwd_sm80_fp32_d128_m128_n64_w4_s2").find("fp32") != std::string::npos);
  CHECK(message_of("fwd_sm80_fp16_d12x_m128_n64_w4_s2").find("d12x") != std::string::npos);
  CHECK(message_of("fwd_sm80_fp16_d128_m128_n64_w4_s2_sliding").find("sliding") != std::string::npos);
  CHECK(message_of("bwd_sm80_fp16_d128_m128_n64_w4_s2").find("expected") != std::string::npos);
  CHECK(message_of("fwd_sm80_fp16_d128").find("expected") != std::string::npos);
  CHECK(message_of("fwd_sm80_fp16_d99999999999_m128_n64_w4_s2").find("d99999999999") != std::string::npos);
  CHECK(message_of("fwd_sm80_fp16_d0128_m128_n64_w4_s2").find("did you mean 'fwd_sm80_fp16_d128_m128_n64_w4_s2'") !=
        std::string::npos);
  CHECK(message_of("fwd_sm80_fp16_d128_m128_n64_w4_s2_qreg_causal").find("not canonical") != std::string::npos);
}

TEST_CASE("validity follows the shared traits", "[generator][config]") {
  KernelConfig c;  // fp16 d128 m128 n32 w4 s3
  CHECK_FALSE(c.invalid_reason(80).has_value());
  CHECK(c.invalid_reason(75).has_value());

  c.head_dim = 100;
  REQUIRE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(90)->find("head_dim") != std::string::npos);

  c = KernelConfig{};
  c.block_m = 96;  // not a multiple of 16 * 4 warps
  CHECK(c.invalid_reason(90)->find("block_m") != std::string::npos);

  c = KernelConfig{};
  c.head_dim = 256;
  c.block_n = 64;
  c.sm80()->warps = 8;
  c.stages = 2;
  // 128x264 Q + 2 x 2 x 64x264 K/V = 202752 bytes: fits Hopper's 227 KB, not A100's 163 KB.
  CHECK(c.traits().smem_bytes == 202752);
  CHECK_FALSE(c.invalid_reason(90).has_value());
  REQUIRE(c.invalid_reason(80).has_value());
  CHECK(c.invalid_reason(80)->find("shared memory") != std::string::npos);

  c = KernelConfig{};
  c.block_m = 256;  // 4 tiles of 16 rows per warp: the accumulators no longer fit in registers
  CHECK(c.invalid_reason(90)->find("registers") != std::string::npos);
}

TEST_CASE("traits derive padded sizes", "[generator][config]") {
  const auto t = flashgen::fwd_traits(72, 64, 32, 4, 3, false);
  REQUIRE(t.error == nullptr);
  CHECK(t.head_dim_pad == 80);
  CHECK(t.smem_row_elems == 88);
  CHECK(t.threads == 128);
  CHECK(t.m_tiles == 1);
  CHECK(t.smem_bytes == 64 * 88 * 2 + 3 * 2 * 32 * 88 * 2);
  // Row pitch of 4 (mod 8) words keeps ldmatrix conflict-free for every head_dim.
  for (int d = 8; d <= 256; d += 8) CHECK((flashgen::fwd_traits(d, 64, 32, 4, 2, false).smem_row_elems / 2) % 8 == 4);
}

TEST_CASE("config JSON round-trips and rejects bad fields", "[generator][config]") {
  KernelConfig c;
  c.dtype = DType::kBFloat16;
  c.head_dim = 96;
  c.mask = MaskKind::kCausal;
  c.block_m = 64;
  c.block_n = 32;
  c.sm80()->warps = 4;
  c.stages = 3;
  c.sm80()->q_in_regs = true;
  const nlohmann::json j = c;
  CHECK(j.at("dtype") == "bf16");
  CHECK(j.at("mask") == "causal");
  CHECK(j.get<KernelConfig>() == c);
  CHECK(nlohmann::json::parse(j.dump()).get<KernelConfig>() == c);

  CHECK_THROWS_AS(nlohmann::json({{"dtype", "fp8"}}).get<KernelConfig>(), flashgen::Error);
  CHECK_THROWS_AS(nlohmann::json({{"block_m", "128"}}).get<KernelConfig>(), flashgen::Error);
  CHECK_THROWS_AS(nlohmann::json({{"family", "bwd"}}).get<KernelConfig>(), flashgen::Error);
  CHECK_THROWS_AS(nlohmann::json::array().get<KernelConfig>(), flashgen::Error);
}

TEST_CASE("sm90 configs: every knob in the name, the JSON and the validity rules", "[generator][config]") {
  KernelConfig c;
  c.head_dim = 128;
  c.block_m = 128;
  c.block_n = 128;
  c.stages = 2;
  flashgen::Sm90Knobs& k = c.knobs.emplace<flashgen::Sm90Knobs>();
  k.overlap = true;
  k.persistent = true;
  k.p_smem = true;
  k.cluster = 2;
  CHECK(c.name() == "fwd_sm90_fp16_d128_m128_n128_s2_ovl_pst_psm_c2");
  CHECK(KernelConfig::from_name(c.name()) == c);
  const nlohmann::json j = c;
  CHECK(j.at("p_smem") == true);
  CHECK(j.at("cluster") == 2);
  CHECK(j.get<KernelConfig>() == c);
  CHECK_FALSE(c.invalid_reason(90).has_value());
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm90_fp16_d128_m128_n128_s2_c1"), flashgen::Error);  // not canonical
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm90_fp16_d128_m128_n128_s2_c2_psm"), flashgen::Error);
  CHECK_THROWS_AS(nlohmann::json({{"p_smem", 1}}).get<KernelConfig>(), flashgen::Error);
  try {  // a misspelt knob is an error, not the default
    nlohmann::json({{"headdim", 64}}).get<KernelConfig>();
    FAIL("a misspelt key was accepted");
  } catch (const flashgen::Error& e) {
    CHECK(std::string(e.what()).find("unknown field \"headdim\"") != std::string::npos);
  }
  // Integers past int's range are refused, not wrapped (2^32 + 128 would read as 128).
  for (const nlohmann::json& big : {nlohmann::json(int64_t{4294967424}), nlohmann::json(uint64_t{18446744073709551615u}),
                                    nlohmann::json(int64_t{-4294967296})})
    CHECK_THROWS_AS(nlohmann::json({{"head_dim", big}}).get<KernelConfig>(), flashgen::Error);
  CHECK(nlohmann::json({{"head_dim", 64}}).get<KernelConfig>().head_dim == 64);

  // P in shared memory: two 8 KB chunks of (64 rows, 64 keys) per consumer; its 32 registers of packed
  // pairs give way to 24 for the stores' addressing.
  const flashgen::FwdSm90Traits in_regs = [&] {
    KernelConfig r = c;
    r.sm90()->p_smem = false;
    return r.sm90_traits();
  }();
  const flashgen::FwdSm90Traits in_smem = c.sm90_traits();
  CHECK(in_smem.smem_p_bytes == 2 * 2 * 64 * 128);
  CHECK(in_regs.smem_p_bytes == 0);
  CHECK(in_regs.accum_regs - in_smem.accum_regs == 128 / 4 - 24);
  // head_dim 64, three consumers, block_n 144: the packed P is what does not fit in registers.
  c.head_dim = 64;
  c.block_m = 192;
  c.block_n = 144;
  k.p_smem = false;
  k.persistent = false;
  REQUIRE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(90)->find("registers") != std::string::npos);
  k.p_smem = true;
  CHECK_FALSE(c.invalid_reason(90).has_value());

  k.cluster = 3;
  REQUIRE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(90)->find("cluster") != std::string::npos);
  k.cluster = 2;
  c.mask = MaskKind::kCausal;
  REQUIRE(c.invalid_reason(90).has_value());
  CHECK(c.invalid_reason(90)->find("causal") != std::string::npos);

  // A config holds its own family's knobs only: JSON may name the other family's at their defaults alone.
  CHECK(nlohmann::json({{"family", "fwd_sm80"}, {"p_smem", false}, {"cluster", 1}}).get<KernelConfig>() ==
        KernelConfig{});
  auto message_of = [](const nlohmann::json& json) {
    try {
      json.get<KernelConfig>();
    } catch (const flashgen::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message_of({{"family", "fwd_sm80"}, {"p_smem", true}}).find("sm90-family") != std::string::npos);
  CHECK(message_of({{"q_in_regs", false}, {"groups", 2}}).find("sm90-family") != std::string::npos);
  CHECK(message_of({{"family", "fwd_sm90"}, {"q_in_regs", true}}).find("sm80-family") != std::string::npos);
  CHECK(message_of({{"family", "fwd_sm90"}, {"warps", 8}}).find("sm80-family") != std::string::npos);
  CHECK(nlohmann::json({{"family", "fwd_sm90"}, {"warps", 4}}).get<KernelConfig>().family() ==
        flashgen::KernelFamily::kSm90);
}

TEST_CASE("sm90 configs: two groups of consumers per persistent block", "[generator][config]") {
  KernelConfig c = KernelConfig::from_name("fwd_sm90_fp16_d64_m128_n64_s3_causal_ovl_pst_g2");
  REQUIRE(c.sm90() != nullptr);
  CHECK(c.sm90()->groups == 2);
  CHECK(c.block_m == 128);
  const nlohmann::json j = c;
  CHECK(j.at("groups") == 2);
  CHECK(j.get<KernelConfig>() == c);
  KernelConfig one_group = c;
  one_group.sm90()->groups = 1;
  CHECK(one_group != c);
  CHECK(one_group.name() == "fwd_sm90_fp16_d64_m128_n64_s3_causal_ovl_pst");
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm90_fp16_d64_m128_n64_s3_pst_g1"), flashgen::Error);  // not canonical

  // Four consumer warpgroups in all, so each gets the registers of a block_m 256 block; every group has
  // a 128-row block's shared memory, the second starting at the next 1024-byte boundary.
  REQUIRE_FALSE(c.invalid_reason(90).has_value());
  const flashgen::FwdSm90Traits two = c.sm90_traits();
  const flashgen::FwdSm90Traits one = one_group.sm90_traits();
  KernelConfig m256 = one_group;
  m256.block_m = 256;
  CHECK(two.threads == 640);
  CHECK(two.consumers == 2);
  CHECK(two.consumer_regs == m256.sm90_traits().consumer_regs);
  CHECK(two.smem_group_bytes == one.smem_group_bytes);
  CHECK(two.smem_group_stride % 1024 == 0);
  CHECK(two.smem_group_stride >= two.smem_group_bytes);
  CHECK(two.smem_bytes == two.smem_group_stride + two.smem_group_bytes + 1024);
  CHECK(one.smem_bytes == one.smem_group_bytes + 1024);

  // Each group walks the persistent tile list, at most four consumers in all, no clusters.
  KernelConfig bad = c;
  bad.sm90()->persistent = false;
  REQUIRE(bad.invalid_reason(90).has_value());
  CHECK(bad.invalid_reason(90)->find("persistent") != std::string::npos);
  bad = c;
  bad.block_m = 256;
  REQUIRE(bad.invalid_reason(90).has_value());
  CHECK(bad.invalid_reason(90)->find("at most 4") != std::string::npos);
  bad = c;
  bad.sm90()->groups = 3;
  REQUIRE(bad.invalid_reason(90).has_value());
  CHECK(bad.invalid_reason(90)->find("groups must be 1 or 2") != std::string::npos);
  bad = c;
  bad.mask = MaskKind::kNone;
  bad.sm90()->cluster = 2;
  REQUIRE(bad.invalid_reason(90).has_value());
  CHECK(bad.invalid_reason(90)->find("clusters") != std::string::npos);

  // The sm80 family holds none of these knobs, and its traits are its own.
  const KernelConfig sm80;
  CHECK(sm80.sm90() == nullptr);
  CHECK(sm80.family() == flashgen::KernelFamily::kSm80);
  CHECK_THROWS_AS(sm80.sm90_traits(), flashgen::Error);
  CHECK_THROWS_AS(c.traits(), flashgen::Error);
}

TEST_CASE("varlen configs: a suffix of the name, a JSON field when set, the sm80 family only", "[generator][config]") {
  KernelConfig c = KernelConfig::from_name("fwd_sm80_fp16_d64_m128_n64_w4_s2_causal_qreg_varlen");
  CHECK(c.varlen);
  CHECK(c.sm80()->q_in_regs);
  CHECK(c.name() == "fwd_sm80_fp16_d64_m128_n64_w4_s2_causal_qreg_varlen");
  CHECK_FALSE(c.invalid_reason(80).has_value());
  KernelConfig dense = c;
  dense.varlen = false;
  CHECK_FALSE(dense == c);  // a kernel of its own

  const nlohmann::json j = c;
  CHECK(j.at("varlen") == true);
  CHECK(j.get<KernelConfig>() == c);
  CHECK_FALSE(nlohmann::json(dense).contains("varlen"));  // dense configs' JSON stays as it always was
  CHECK_THROWS_AS(nlohmann::json({{"varlen", 1}}).get<KernelConfig>(), flashgen::Error);

  // Spelled in canonical order only, once.
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_fp16_d64_m128_n64_w4_s2_varlen_causal"), flashgen::Error);
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_fp16_d64_m128_n64_w4_s2_varlen_varlen"), flashgen::Error);

  // The sm90 family's packed batches run one block per tile.
  CHECK_FALSE(KernelConfig::from_name("fwd_sm90_fp16_d128_m128_n128_s2_varlen").invalid_reason(90));
  const KernelConfig sm90 = KernelConfig::from_name("fwd_sm90_fp16_d128_m128_n128_s2_pst_varlen");
  REQUIRE(sm90.invalid_reason(90).has_value());
  CHECK(sm90.invalid_reason(90)->find("one block per tile") != std::string::npos);
}

TEST_CASE("paged varlen configs: _paged after _varlen, a JSON field when set, kPaged in the header",
          "[generator][config]") {
  const KernelConfig c = KernelConfig::from_name("fwd_sm80_bf16_d128_m64_n64_w4_s2_causal_varlen_paged");
  CHECK(c.varlen);
  CHECK(c.paged);
  CHECK_FALSE(c.invalid_reason(80));
  const nlohmann::json j = c;
  CHECK(j.at("paged") == true);
  CHECK(j.get<KernelConfig>() == c);
  CHECK_FALSE(nlohmann::json(KernelConfig::from_name("fwd_sm80_bf16_d128_m64_n64_w4_s2_varlen")).contains("paged"));
  CHECK(flashgen::generate(c).headers.front().contents.find("static constexpr bool kPaged = true;") != std::string::npos);
  // Paged keys come with packed batches only, and the suffix follows _varlen.
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_bf16_d128_m64_n64_w4_s2_paged"), flashgen::Error);
  CHECK_THROWS_AS(KernelConfig::from_name("fwd_sm80_bf16_d128_m64_n64_w4_s2_paged_varlen"), flashgen::Error);
  KernelConfig dense = c;
  dense.varlen = false;
  REQUIRE(dense.invalid_reason(90).has_value());
  CHECK(dense.invalid_reason(90)->find("come with packed variable-length batches") != std::string::npos);
}

TEST_CASE("sm90 paged configs: a wider producer, so the widest tiles' consumers lack registers",
          "[generator][config]") {
  const KernelConfig packed = KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_varlen");
  KernelConfig paged = packed;
  paged.paged = true;
  REQUIRE_FALSE(paged.invalid_reason(90));
  CHECK(paged.name() == "fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_varlen_paged");
  const nlohmann::json j = paged;  // the tuning data keeps it paged
  CHECK(j.at("paged") == true);
  CHECK(j.get<KernelConfig>() == paged);
  CHECK_FALSE(nlohmann::json(packed).contains("paged"));
  CHECK(packed.sm90_traits().producer_regs == flashgen::kSm90ProducerRegs);
  CHECK(paged.sm90_traits().producer_regs == flashgen::kSm90WideProducerRegs);
  CHECK(paged.sm90_traits().consumer_regs < packed.sm90_traits().consumer_regs);
  CHECK(flashgen::generate(paged).headers.front().contents.find("static constexpr bool kPaged = true;") !=
        std::string::npos);
  // 192 keys of S and P fit 240 registers, not 232.
  const KernelConfig wide = KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n192_s2_ovl_pp_varlen");
  CHECK_FALSE(wide.invalid_reason(90));
  KernelConfig wide_paged = wide;
  wide_paged.paged = true;
  REQUIRE(wide_paged.invalid_reason(90).has_value());
  CHECK(wide_paged.invalid_reason(90)->find("registers") != std::string::npos);
}

TEST_CASE("a paged cache's TMA boxes lie in one page: gcd(page_size, block_n) rows", "[generator][config]") {
  CHECK(flashgen::paged_box_rows(16, 128) == 16);
  CHECK(flashgen::paged_box_rows(48, 128) == 16);
  CHECK(flashgen::paged_box_rows(64, 128) == 64);
  CHECK(flashgen::paged_box_rows(256, 128) == 128);
  CHECK(flashgen::paged_box_rows(256, 160) == 32);
  CHECK(flashgen::paged_box_rows(144, 176) == 16);
  static_assert(flashgen::paged_box_rows(512, 64) == 64);
}

TEST_CASE("soft-capped configs: _softcap after the mask, a JSON field when set, SoftCap around the mask",
          "[generator][config]") {
  for (bool sm90 : {false, true}) {
    KernelConfig c;
    if (sm90) c.knobs = flashgen::Sm90Knobs{}, c.block_n = 128, c.stages = 2;
    c.mask = MaskKind::kCausal;
    c.mods.softcap = true;
    INFO(c.name());
    CHECK(c.name().find("_causal_softcap") != std::string::npos);
    CHECK(KernelConfig::from_name(c.name()) == c);
    const nlohmann::json j = c;
    CHECK(j.at("softcap") == true);
    CHECK(j.get<KernelConfig>() == c);
    KernelConfig plain = c;
    plain.mods.softcap = false;
    CHECK(plain != c);
    CHECK_FALSE(nlohmann::json(plain).contains("softcap"));  // absent: what every config before it meant
    const flashgen::GeneratedSource source = flashgen::generate(c);
    CHECK(source.headers.front().contents.find("using Variant = flashgen::SoftCap<flashgen::CausalMask>;") !=
          std::string::npos);
    CHECK(flashgen::generate(plain).headers.front().contents.find("SoftCap") == std::string::npos);
  }
  // The suffix belongs right after the mask's place.
  CHECK_THROWS_WITH(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_qreg_softcap"),
                    Catch::Matchers::Contains("not canonical"));
  CHECK(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_softcap").mask == MaskKind::kNone);
}

TEST_CASE("ALiBi configs: _alibi after _softcap, a JSON field when set, Alibi outermost", "[generator][config]") {
  for (bool sm90 : {false, true}) {
    KernelConfig c;
    if (sm90) c.knobs = flashgen::Sm90Knobs{}, c.block_n = 128, c.stages = 2;
    c.mask = MaskKind::kWindow;
    c.mods.alibi = true;
    INFO(c.name());
    CHECK(c.name().find("_window_alibi") != std::string::npos);
    CHECK(KernelConfig::from_name(c.name()) == c);
    CHECK(flashgen::generate(c).headers.front().contents.find(
              "using Variant = flashgen::Alibi<flashgen::SlidingWindow>;") != std::string::npos);
    c.mods.softcap = true;
    CHECK(c.name().find("_window_softcap_alibi") != std::string::npos);
    CHECK(KernelConfig::from_name(c.name()) == c);
    const nlohmann::json j = c;
    CHECK(j.at("alibi") == true);
    CHECK(j.at("softcap") == true);
    CHECK(j.get<KernelConfig>() == c);
    // The bias is added after the cap: Alibi wraps SoftCap.
    CHECK(flashgen::generate(c).headers.front().contents.find(
              "using Variant = flashgen::Alibi<flashgen::SoftCap<flashgen::SlidingWindow>>;") != std::string::npos);
    KernelConfig plain = c;
    plain.mods.alibi = false;
    CHECK(plain != c);
    CHECK_FALSE(nlohmann::json(plain).contains("alibi"));
  }
  // One order, one spelling.
  CHECK_THROWS_WITH(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_alibi_softcap"),
                    Catch::Matchers::Contains("not canonical"));
  CHECK_THROWS_WITH(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_alibi_alibi"),
                    Catch::Matchers::Contains("unknown suffix 'alibi'"));
  nlohmann::json bad = KernelConfig{};
  bad["alibi"] = 1;
  CHECK_THROWS_WITH(bad.get<KernelConfig>(), Catch::Matchers::Contains("'alibi' must be true or false"));
}

TEST_CASE("window configs: _window in the mask's place, \"window\" in JSON, SlidingWindow as the variant",
          "[generator][config]") {
  for (bool sm90 : {false, true}) {
    KernelConfig c;
    if (sm90) c.knobs = flashgen::Sm90Knobs{}, c.block_n = 128, c.stages = 2;
    c.dtype = DType::kBFloat16;
    c.mask = MaskKind::kWindow;
    c.block_m = 128;
    c.block_n = 64;
    INFO(c.name());
    CHECK(c.name() == (sm90 ? "fwd_sm90_bf16_d128_m128_n64_s2_window" : "fwd_sm80_bf16_d128_m128_n64_w4_s3_window"));
    CHECK(KernelConfig::from_name(c.name()) == c);
    const nlohmann::json j = c;
    CHECK(j.at("mask") == "window");
    CHECK(j.get<KernelConfig>() == c);
    const flashgen::GeneratedSource source = flashgen::generate(c);
    CHECK(source.headers.front().contents.find("using Variant = flashgen::SlidingWindow;") != std::string::npos);
    CHECK(source.headers.front().contents.find("kMask = flashgen::MaskKind::kWindow;") != std::string::npos);
    // With a soft cap the cap wraps the window, its suffix after the mask's.
    c.mods.softcap = true;
    CHECK(c.name().find("_window_softcap") != std::string::npos);
    CHECK(KernelConfig::from_name(c.name()) == c);
    CHECK(flashgen::generate(c).headers.front().contents.find(
              "using Variant = flashgen::SoftCap<flashgen::SlidingWindow>;") != std::string::npos);
    // Packed batches too.
    c.varlen = true;
    CHECK(KernelConfig::from_name(c.name()) == c);
  }
  CHECK(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_window_qreg_varlen").mask == MaskKind::kWindow);
  // One mask per name, in its place.
  CHECK_THROWS_WITH(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_causal_window"),
                    Catch::Matchers::Contains("unknown suffix 'window'"));
  CHECK_THROWS_WITH(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_softcap_window"),
                    Catch::Matchers::Contains("not canonical"));
  CHECK_THROWS_WITH(nlohmann::json({{"family", "fwd_sm80"}, {"mask", "sliding"}}).get<KernelConfig>(),
                    Catch::Matchers::Contains("mask must be \"none\", \"causal\", \"window\" or \"chunk\""));
}

TEST_CASE("chunked window configs name their mask, read back and instantiate ChunkedWindow", "[generator][config]") {
  for (const char* name : {"fwd_sm90_bf16_d128_m128_n128_s2_chunk_ovl_pp", "fwd_sm80_fp16_d64_m64_n64_w4_s2_chunk_varlen"}) {
    INFO(name);
    const KernelConfig c = KernelConfig::from_name(name);
    CHECK(c.mask == MaskKind::kChunk);
    CHECK(c.name() == name);
    const nlohmann::json j = c;
    CHECK(j.at("mask") == "chunk");
    CHECK(j.get<KernelConfig>() == c);
    const std::string header = flashgen::generate(c).headers.front().contents;
    CHECK(header.find("using Variant = flashgen::ChunkedWindow;") != std::string::npos);
    CHECK(header.find("kMask = flashgen::MaskKind::kChunk;") != std::string::npos);
  }
  CHECK_THROWS_WITH(KernelConfig::from_name("fwd_sm80_fp16_d64_m64_n64_w4_s2_window_chunk"),
                    Catch::Matchers::Contains("unknown suffix 'chunk'"));
  // No clusters: its query blocks see key ranges of their own, as a window's.
  KernelConfig clustered = KernelConfig::from_name("fwd_sm90_fp16_d128_m128_n128_s2_ovl_pst_c2");
  clustered.mask = MaskKind::kChunk;
  REQUIRE(clustered.invalid_reason(90).has_value());
  CHECK(clustered.invalid_reason(90)->find("cluster 2 takes unmasked problems only") != std::string::npos);
}

TEST_CASE("window configs follow the causal mask's rules: no clusters", "[generator][config]") {
  KernelConfig c = KernelConfig::from_name("fwd_sm90_fp16_d128_m128_n128_s2_ovl_pst_c2");
  CHECK_FALSE(c.invalid_reason(90));
  for (MaskKind mask : {MaskKind::kCausal, MaskKind::kWindow}) {
    c.mask = mask;
    INFO(c.name());
    REQUIRE(c.invalid_reason(90).has_value());
    CHECK(c.invalid_reason(90)->find("cluster 2 takes unmasked problems only") != std::string::npos);
  }
}
