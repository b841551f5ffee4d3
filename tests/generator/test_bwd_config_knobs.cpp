// BwdConfig's layout and score-modifier knobs (_varlen, _softcap, _alibi, _window, _dsink): where each sits in the
// name, its JSON field, what it puts in the generated config header, and the sinks' gradient's workspace part.
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/bwd_config.hpp"
#include "generator/generator.hpp"
#include "templates/attn_params.cuh"

using flashgen::BwdConfig;

TEST_CASE("varlen backward configs: _varlen before _det, a JSON field when set, both families",
          "[generator][backward]") {
  const BwdConfig c = BwdConfig::from_name("bwd_sm80_fp16_d64_m64_n64_w4_s2_x1_causal_varlen_det_qm64_qn32_qw4_qs2");
  CHECK(c.varlen);
  CHECK(c.deterministic);
  CHECK_FALSE(c.invalid_reason(80).has_value());
  BwdConfig dense = c;
  dense.varlen = false;
  CHECK_FALSE(dense == c);
  const nlohmann::json j = c;
  CHECK(j.at("varlen") == true);
  CHECK(j.get<BwdConfig>() == c);
  CHECK_FALSE(nlohmann::json(dense).contains("varlen"));
  CHECK(flashgen::generate(c).headers.front().contents.find("kVarlen = true") != std::string::npos);
  CHECK(flashgen::generate(dense).headers.front().contents.find("kVarlen") == std::string::npos);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_fp16_d64_m64_n64_w4_s2_x1_varlen_causal"), flashgen::Error);
  // The Hopper family's packed kernels pad each sequence's workspace rows to whole query blocks.
  const BwdConfig sm90 = BwdConfig::from_name("bwd_sm90_fp16_d128_m64_n128_s2_varlen_det");
  CHECK_FALSE(sm90.invalid_reason(90).has_value());
  CHECK(sm90.varlen);
  CHECK(sm90.deterministic);
  const std::string header = flashgen::generate(sm90).headers.front().contents;
  CHECK(header.find("kVarlen = true") != std::string::npos);
  CHECK(header.find("kPadRows = 128") != std::string::npos);
  // Rows per head: each sequence starts on a multiple of 128 with room for its padding.
  CHECK(flashgen::packed_workspace_rows(1000, 3, 1) == 1000);
  CHECK(flashgen::packed_workspace_rows(1000, 3, 128) == 1408);
  const int begins[] = {0, 130, 131, 900, 1000};  // lengths 130, 1, 769, 100
  for (int i = 0; i + 1 < 5; ++i) {
    const long long first = flashgen::packed_workspace_first_row(begins[i], i, 128);
    const long long next = flashgen::packed_workspace_first_row(begins[i + 1], i + 1, 128);
    const long long padded = (begins[i + 1] - begins[i] + 127) / 128 * 128;
    INFO("sequence " << i);
    CHECK(first % 128 == 0);
    CHECK(first + padded <= next);
    CHECK(first + padded <= flashgen::packed_workspace_rows(1000, 4, 128));
  }
}

TEST_CASE("soft-capped backward configs: _softcap after the mask, both families", "[generator][backward]") {
  for (bool sm90 : {false, true}) {
    BwdConfig c;
    if (sm90) c.knobs = flashgen::BwdSm90Knobs{}, c.block_n = 128;
    c.mask = flashgen::MaskKind::kCausal;
    c.mods.softcap = true;
    c.varlen = true;
    c.deterministic = true;
    INFO(c.name());
    CHECK(c.name().find("_causal_softcap_varlen_det") != std::string::npos);
    CHECK(BwdConfig::from_name(c.name()) == c);
    const nlohmann::json j = c;
    CHECK(j.at("softcap") == true);
    CHECK(j.get<BwdConfig>() == c);
    CHECK(flashgen::generate(c).headers.front().contents.find("flashgen::SoftCap<flashgen::CausalMask>") !=
          std::string::npos);
  }
}

TEST_CASE("ALiBi backward configs: _alibi after _softcap, both families", "[generator][backward]") {
  for (bool sm90 : {false, true}) {
    BwdConfig c;
    if (sm90) c.knobs = flashgen::BwdSm90Knobs{}, c.block_n = 128;
    c.mask = flashgen::MaskKind::kCausal;
    c.mods = {true, true};
    c.varlen = true;
    c.deterministic = true;
    INFO(c.name());
    CHECK(c.name().find("_causal_softcap_alibi_varlen_det") != std::string::npos);
    CHECK(BwdConfig::from_name(c.name()) == c);
    const nlohmann::json j = c;
    CHECK(j.at("alibi") == true);
    CHECK(j.get<BwdConfig>() == c);
    CHECK(flashgen::generate(c).headers.front().contents.find(
              "flashgen::Alibi<flashgen::SoftCap<flashgen::CausalMask>>") != std::string::npos);
  }
}

TEST_CASE("window backward configs: _window in the mask's place, both families", "[generator][backward]") {
  for (bool sm90 : {false, true}) {
    BwdConfig c;
    if (sm90) c.knobs = flashgen::BwdSm90Knobs{}, c.block_n = 128;
    c.mask = flashgen::MaskKind::kWindow;
    c.deterministic = true;
    INFO(c.name());
    CHECK(c.name().find("_window_det") != std::string::npos);
    CHECK(BwdConfig::from_name(c.name()) == c);
    nlohmann::json j = c;
    CHECK(j.at("mask") == "window");
    CHECK(j.get<BwdConfig>() == c);
    CHECK(flashgen::generate(c).headers.front().contents.find("using Variant = flashgen::SlidingWindow;") !=
          std::string::npos);
    c.mods.softcap = true;
    c.varlen = true;
    CHECK(c.name().find("_window_softcap_varlen_det") != std::string::npos);
    CHECK(BwdConfig::from_name(c.name()) == c);
    j = c;
    CHECK(j.get<BwdConfig>() == c);
    CHECK(flashgen::generate(c).headers.front().contents.find("flashgen::SoftCap<flashgen::SlidingWindow>") !=
          std::string::npos);
  }
  CHECK(BwdConfig::from_name("bwd_sm90_bf16_d128_m64_n128_s2_window").mask == flashgen::MaskKind::kWindow);
  CHECK_THROWS_WITH(BwdConfig::from_name("bwd_sm90_bf16_d128_m64_n128_s2_causal_window"),
                    Catch::Matchers::Contains("unknown suffix 'window'"));
}

TEST_CASE("sinks' gradient backward configs: _dsink after the score modifiers, both families",
          "[generator][backward][sinks]") {
  const BwdConfig c =
      BwdConfig::from_name("bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_causal_alibi_dsink_varlen_det_qm64_qn32_qw4_qs2");
  CHECK(c.sink_grad);
  CHECK(c.mods.alibi);
  CHECK(c.varlen);
  CHECK(c.deterministic);
  CHECK_FALSE(c.invalid_reason(80).has_value());
  CHECK(c.sink_partial_warps() == 4);
  BwdConfig plain = c;
  plain.sink_grad = false;
  CHECK_FALSE(plain == c);
  CHECK(plain.name() == "bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_causal_alibi_varlen_det_qm64_qn32_qw4_qs2");
  const nlohmann::json j = c;
  CHECK(j.at("sink_grad") == true);
  CHECK(j.get<BwdConfig>() == c);
  CHECK_FALSE(nlohmann::json(plain).contains("sink_grad"));
  // The knob's two constants are in its header alone: a config without it generates what it did before.
  const std::string header = flashgen::generate(c).headers.front().contents;
  CHECK(header.find("kSinkGrad = true") != std::string::npos);
  CHECK(header.find("kSinkPartialWarps = 4") != std::string::npos);
  const std::string plain_header = flashgen::generate(plain).headers.front().contents;
  CHECK(plain_header.find("kSinkGrad") == std::string::npos);
  CHECK(plain_header.find("kSinkPartialWarps") == std::string::npos);
  // _dsink sits after the modifiers and before _varlen; anywhere else it is an unknown suffix.
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_dsink_causal"), flashgen::Error);
  CHECK_THROWS_AS(BwdConfig::from_name("bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_varlen_dsink"), flashgen::Error);
  CHECK(BwdConfig::from_name("bwd_sm80_fp16_d64_m64_n64_w4_s2_x1_dsink").sink_grad);
  // The Hopper family: one partial per consumer warp.
  const BwdConfig sm90 = BwdConfig::from_name("bwd_sm90_fp16_d128_m64_n128_s2_causal_dsink_det");
  CHECK(sm90.sink_grad);
  CHECK_FALSE(sm90.invalid_reason(90).has_value());
  CHECK(sm90.sink_partial_warps() == 4 * sm90.sm90_traits().consumers);
  CHECK(flashgen::generate(sm90).headers.front().contents.find("kSinkGrad = true") != std::string::npos);
}

TEST_CASE("the sinks' gradient's partials follow D in the workspace at a 256-byte boundary", "[generator][backward]") {
  // Dense: batch · heads_q · seqlen_q rounded to the pad; packed: heads_q · packed_workspace_rows.
  CHECK(flashgen::bwd_workspace_rows(false, 0, 2, 3, 100, 1) == 600);
  CHECK(flashgen::bwd_workspace_rows(false, 0, 2, 3, 100, 128) == 768);
  CHECK(flashgen::bwd_workspace_rows(true, 1000, 3, 2, 500, 1) == 2000);
  CHECK(flashgen::bwd_workspace_rows(true, 1000, 3, 2, 500, 128) == 2 * 1408);
  CHECK(flashgen::bwd_sink_partials_offset(600) == 640);
  CHECK(flashgen::bwd_sink_partials_offset(640) == 640);
  CHECK(flashgen::bwd_sink_partials_offset(0) == 0);
  CHECK(flashgen::bwd_sink_partials_count(8, 3, 5, 4) == 480);
}
