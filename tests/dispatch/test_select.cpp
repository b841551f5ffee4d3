// Run-time config choice: for every head_dim, dtype and mask, the chosen forward kernel compiles for
// sm_80 and sm_90a without spills (the heuristic's first choice is passed over when ptxas says it spills), and a
// user variant's tiles are passed over the same way when its functions make them spill.
#include <memory>
#include <string>

#include "catch.hpp"
#include "dispatch/select.hpp"
#include "problem/user_variant.hpp"
#include "runtime/kernel_registry.hpp"
#include "support/raw_sqlite.hpp"
#include "support/resolved_choice.hpp"
#include "support/temp_dir.hpp"
#include "tuner/choice.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/store.hpp"

using flashgen::testing::resolved;
using flashgen::testing::resolved_paged;

using flashgen::DType;
using flashgen::MaskKind;

namespace {

// A document mask (ids per position in a buffer) with a relative-position bias per head (a table of 129 distances):
// two buffer loads per score beside the tile's accumulators.
std::shared_ptr<const flashgen::UserVariant> documents_with_relative_bias() {
  flashgen::UserVariantDesc desc;
  desc.mask_mod = "return doc[batch * seqlen + q_idx] == doc[batch * seqlen + kv_idx];";
  desc.score_bias = "return rel[head * 129 + min(max(kv_idx - q_idx, -64), 64) + 64];";
  desc.buffers = {{"doc", flashgen::UserArgType::kInt32}, {"rel", flashgen::UserArgType::kFloat32}};
  desc.scalars = {{"seqlen", flashgen::UserArgType::kInt32}};
  return flashgen::make_user_variant(desc);
}

}  // namespace

TEST_CASE("the chosen forward config never spills, for every head_dim", "[tuner][select][nvrtc]") {
  auto& registry = flashgen::KernelRegistry::instance();
  // On sm_90 the Hopper family's choice for a head_dim that is not a multiple of 64 runs the code of its
  // tiles' width (only packed batches' epilogues read head_dim itself), so the tile widths and a few padded
  // head_dims stand for the rest there.
  auto checked_on = [](int arch, int d) {
    return arch != 90 || d % 64 == 0 || d == 8 || d == 40 || d == 96 || d == 136 || d == 200;
  };
  for (int arch : {80, 90})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
        for (int d = 8; d <= 256; d += 8) {
          if (!checked_on(arch, d)) continue;
          const flashgen::ForwardChoice choice = flashgen::heuristic_choice(dtype, d, mask, arch);
          INFO("sm_" << arch << " " << flashgen::config_name(choice.config) << ": " << choice.reason);
          CHECK(choice.config.head_dim == d);
          CHECK(choice.config.dtype == dtype);
          CHECK(choice.config.mask == mask);
          CHECK_FALSE(choice.config.invalid_reason(arch).has_value());
          const auto usage = registry.compiled(choice.config, arch)->usage;
          CHECK(usage.spill_store_bytes + usage.spill_load_bytes == 0);
          CHECK(choice.reason.rfind("built-in heuristic", 0) == 0);
          // Memoized: the same answer again.
          CHECK(flashgen::heuristic_choice(dtype, d, mask, arch).config == choice.config);
        }
}

TEST_CASE("stored winners come first: exact bucket, then nearest, then the heuristic", "[tuner][select][store]") {
  flashgen::testing::TempDir dir("flashgen-select-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  const flashgen::ProblemKey key = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 4096, 4096, 64);

  flashgen::KernelConfig stored;
  stored.head_dim = 64;
  stored.block_m = 64;
  stored.block_n = 64;
  stored.sm80()->warps = 4;
  stored.stages = 2;
  REQUIRE(stored != flashgen::heuristic_forward_config(DType::kFloat16, 64, MaskKind::kNone, 90));
  flashgen::CandidateResult row;
  row.config = stored;
  row.median_ms = 1.5;
  row.samples = 10;
  store.record(device, key, {row}, stored, 1.5);

  const auto exact = resolved(flashgen::choose_forward_config(device, key, 90, &store), 90);
  CHECK(exact.config == stored);
  CHECK(exact.reason.find("exact bucket") != std::string::npos);

  const flashgen::ProblemKey longer =
      flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 16384, 16384, 64);
  const auto nearest = resolved(flashgen::choose_forward_config(device, longer, 90, &store), 90);
  CHECK(nearest.config == stored);
  CHECK(nearest.reason.find("nearest bucket") != std::string::npos);

  const flashgen::ProblemKey other_class =
      flashgen::forward_problem_key(DType::kFloat16, 128, MaskKind::kNone, 1, 4096, 4096, 64);
  const auto fallback = resolved(flashgen::choose_forward_config(device, other_class, 90, &store), 90);
  CHECK(fallback.reason.rfind("built-in heuristic", 0) == 0);
  CHECK(fallback.config == flashgen::heuristic_choice(DType::kFloat16, 128, MaskKind::kNone, 90).config);

  const auto no_store = resolved(flashgen::choose_forward_config(device, key, 90, nullptr), 90);
  CHECK(no_store.reason.rfind("built-in heuristic", 0) == 0);
}

TEST_CASE("backward choice: stored winners of its own pass and strategy, then the heuristic", "[tuner][select][store][backward]") {
  flashgen::testing::TempDir dir("flashgen-select-backward-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  const flashgen::ProblemKey key =
      flashgen::backward_problem_key(DType::kFloat16, 128, MaskKind::kCausal, false, 1, 4096, 4096, 64);
  CHECK(key.id() == "bwd|fp16|d128|causal|g1|q4096|k4096|bh64");
  const flashgen::ProblemKey det_key =
      flashgen::backward_problem_key(DType::kFloat16, 128, MaskKind::kCausal, true, 1, 4096, 4096, 64);
  CHECK(det_key.class_id() == "bwd_det|fp16|d128|causal|g1");

  flashgen::BwdConfig stored;
  stored.knobs = flashgen::BwdSm90Knobs{};
  stored.mask = MaskKind::kCausal;
  stored.block_m = 64;
  stored.block_n = 128;
  stored.stages = 3;
  const flashgen::BwdConfig builtin =
      flashgen::heuristic_backward_choice(DType::kFloat16, 128, MaskKind::kCausal, false, 90).config;
  REQUIRE(stored != builtin);
  flashgen::CandidateResult row;
  row.config = stored;
  row.median_ms = 2.5;
  row.samples = 10;
  store.record(device, key, {row}, stored, 2.5);

  const flashgen::BackwardChoice exact = resolved(flashgen::choose_backward_config(device, key, 90, &store), 90);
  CHECK(exact.config == stored);
  CHECK(exact.source == flashgen::ChoiceSource::kTuningDatabase);
  CHECK(exact.reason.find("exact bucket") != std::string::npos);
  const flashgen::BackwardChoice nearest = resolved(flashgen::choose_backward_config(
      device, flashgen::backward_problem_key(DType::kFloat16, 128, MaskKind::kCausal, false, 1, 1024, 1024, 64), 90,
      &store), 90);
  CHECK(nearest.config == stored);
  CHECK(nearest.reason.find("nearest bucket") != std::string::npos);

  // The deterministic strategy and the forward have their own data: nothing stored for them here.
  const flashgen::BackwardChoice det = resolved(flashgen::choose_backward_config(device, det_key, 90, &store), 90);
  CHECK(det.source == flashgen::ChoiceSource::kHeuristic);
  CHECK(det.config.deterministic);
  const flashgen::ProblemKey fwd_key =
      flashgen::forward_problem_key(DType::kFloat16, 128, MaskKind::kCausal, 1, 4096, 4096, 64);
  CHECK_FALSE(store.lookup_nearest(device, fwd_key).has_value());
  // On an arch the stored config cannot run on, it is passed over with the reason said.
  const flashgen::BackwardChoice on80 =
      resolved(flashgen::choose_backward_config(flashgen::fingerprint_for_arch(90), key, 80, &store), 80);
  CHECK(on80.source == flashgen::ChoiceSource::kHeuristic);
  CHECK(on80.reason.find("passed over") != std::string::npos);
}

TEST_CASE("a stored winner that cannot run on this arch is passed over", "[tuner][select][store]") {
  flashgen::testing::TempDir dir("flashgen-select-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(80);
  const flashgen::ProblemKey key = flashgen::forward_problem_key(DType::kBFloat16, 256, MaskKind::kCausal, 2, 2048, 2048, 32);
  flashgen::KernelConfig hopper_only;  // 202752 bytes of shared memory: more than sm_80 allows
  hopper_only.dtype = DType::kBFloat16;
  hopper_only.head_dim = 256;
  hopper_only.mask = MaskKind::kCausal;
  hopper_only.block_m = 128;
  hopper_only.block_n = 64;
  hopper_only.sm80()->warps = 8;
  hopper_only.stages = 2;
  REQUIRE(hopper_only.invalid_reason(80).has_value());
  flashgen::CandidateResult row;
  row.config = hopper_only;
  row.median_ms = 2.0;
  store.record(device, key, {row}, hopper_only, 2.0);

  const auto choice = resolved(flashgen::choose_forward_config(device, key, 80, &store), 80);
  CHECK(choice.config != hopper_only);
  CHECK_FALSE(choice.config.invalid_reason(80).has_value());
  CHECK(choice.reason.find("passed over") != std::string::npos);
}

TEST_CASE("a stored row the database cannot read back is passed over, not thrown", "[tuner][select][store]") {
  flashgen::testing::TempDir dir("flashgen-select-test");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  const flashgen::ProblemKey key = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 4096, 4096, 64);
  {
    flashgen::TuningStore store(dir.path() / "tuning.sqlite");
    flashgen::KernelConfig stored = flashgen::heuristic_forward_configs(DType::kFloat16, 64, MaskKind::kNone, 90).back();
    flashgen::CandidateResult row;
    row.config = stored;
    row.median_ms = 1.5;
    store.record(device, key, {row}, stored, 1.5);
  }
  // Edited by hand or by another tool: a winner whose config names a mask flashgen does not have.
  flashgen::testing::RawSqlite(dir.path() / "tuning.sqlite")
      .exec("UPDATE winners SET config_json = '{\"family\": \"fwd_sm90\", \"mask\": \"sliding\"}'");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const auto choice = resolved(flashgen::choose_forward_config(device, key, 90, &store), 90);
  CHECK(choice.config == flashgen::heuristic_choice(DType::kFloat16, 64, MaskKind::kNone, 90).config);
  CHECK(choice.reason.find("passed over") != std::string::npos);
  CHECK(choice.reason.find("mask") != std::string::npos);
}

TEST_CASE("packed batches choose their own kernels: on sm_90a the Hopper family, one block per tile",
          "[tuner][select][nvrtc][varlen]") {
  auto& registry = flashgen::KernelRegistry::instance();
  for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
    for (int d : {64, 128, 256}) {
      const flashgen::ForwardChoice choice =
          flashgen::heuristic_choice(DType::kBFloat16, d, mask, 90, /*sm80_only=*/false, /*varlen=*/true);
      INFO(flashgen::config_name(choice.config) << ": " << choice.reason);
      CHECK(choice.config.varlen);
      CHECK_FALSE(choice.config.invalid_reason(90).has_value());
      if (const flashgen::Sm90Knobs* k = choice.config.sm90()) {
        CHECK_FALSE(k->persistent);
        CHECK(k->groups == 1);
        CHECK(k->cluster == 1);
      }
      const auto usage = registry.compiled(choice.config, 90)->usage;
      CHECK(usage.spill_store_bytes + usage.spill_load_bytes == 0);
    }
  // head_dim 128 has a Hopper-family choice for packed batches.
  CHECK(flashgen::heuristic_choice(DType::kBFloat16, 128, MaskKind::kCausal, 90, false, true).config.family() ==
        flashgen::KernelFamily::kSm90);
}

TEST_CASE("a packed forward over pages takes its page size's winner, else its contiguous class's read through pages",
          "[tuner][select][store][varlen]") {
  flashgen::testing::TempDir dir("flashgen-select-paged-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  flashgen::ProblemKey contiguous =
      flashgen::forward_problem_key(DType::kBFloat16, 128, MaskKind::kNone, 1, 8192, 8192, 1024);
  contiguous.varlen = true;
  flashgen::ProblemKey pages256 = contiguous;
  pages256.paged = true, pages256.page_size = 256;
  flashgen::ProblemKey pages64 = pages256;
  pages64.page_size = 64;

  // The contiguous class's winner: a tile whose consumers a paged producer leaves too few registers.
  const auto wide = flashgen::KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n192_s2_ovl_pp_varlen");
  flashgen::KernelConfig wide_paged = wide;
  wide_paged.paged = true;
  REQUIRE_FALSE(wide.invalid_reason(90));
  REQUIRE(wide_paged.invalid_reason(90));
  auto record = [&](const flashgen::ProblemKey& key, const flashgen::KernelConfig& config) {
    flashgen::CandidateResult row;
    row.config = config;
    row.median_ms = 2.0;
    row.samples = 10;
    store.record(device, key, {row}, config, 2.0);
  };
  record(contiguous, wide);

  // No data of its own: the contiguous class's winner, made paged where it can be, else the built-in paged tile.
  const auto borrowed = resolved_paged(flashgen::choose_forward_config(device, pages256, 90, &store), 90);
  INFO(borrowed.reason);
  CHECK(borrowed.reason.find("no data for fwd_varlen_paged256|bf16|d128|none|g1") != std::string::npos);
  CHECK(borrowed.reason.find("paged, ") != std::string::npos);
  CHECK_FALSE(borrowed.exact_bucket);  // tune-on-first-use still tunes the paged class
  CHECK((borrowed.config.varlen && borrowed.config.paged));
  CHECK_FALSE(borrowed.config.invalid_reason(90));
  flashgen::KernelConfig builtin =
      flashgen::heuristic_choice(DType::kBFloat16, 128, MaskKind::kNone, 90, false, /*varlen=*/true).config;
  builtin.paged = true;
  CHECK(borrowed.config == builtin);

  // Its page size's own winner (not the built-in tile); another page size's is not its data.
  const auto own_tile = flashgen::KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n160_s2_ovl_pp_varlen_paged");
  REQUIRE(own_tile != builtin);
  record(pages256, own_tile);
  const auto own = resolved_paged(flashgen::choose_forward_config(device, pages256, 90, &store), 90);
  INFO(own.reason);
  CHECK(own.config == own_tile);
  CHECK(own.exact_bucket);
  const auto other = resolved_paged(flashgen::choose_forward_config(device, pages64, 90, &store), 90);
  CHECK(other.reason.find("no data for fwd_varlen_paged64") != std::string::npos);
  CHECK(other.config == builtin);
  // A paged config is not of the contiguous class, nor a contiguous one of a paged class: the store refuses both.
  CHECK_THROWS_WITH(record(contiguous, own_tile), Catch::Contains("is not one of problem fwd_varlen|"));
  CHECK_THROWS_WITH(record(pages64, wide), Catch::Contains("is not one of problem fwd_varlen_paged64|"));
  CHECK(resolved(flashgen::choose_forward_config(device, contiguous, 90, &store), 90).config == wide);
  // Read through pages takes packed configs only.
  flashgen::ForwardChoice dense;
  dense.config = flashgen::KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_ovl_pp");
  CHECK_THROWS_WITH(flashgen::read_through_pages(dense, 90, flashgen::compiled_spills(90)),
                    Catch::Contains("is not a packed-batch (varlen) config"));
}

TEST_CASE("an FP8 forward over pages passes over tiles that spill when read through pages, keeping its output type",
          "[tuner][select][varlen][fp8_forward]") {
  // The packed d256 choice overlaps; read through pages (232 registers a consumer) it spills, as the spill report
  // below says, so the tile without overlap is taken, with the call's fp16 output.
  flashgen::ForwardChoice choice{
      flashgen::KernelConfig::from_name("fwd_sm90_e4m3_d256_m128_n128_s2_ofp16_causal_ovl_pp_varlen"), "stored",
      flashgen::ChoiceSource::kTuningDatabase};
  const auto spills = [](const flashgen::KernelConfig& c) { return c.sm90()->overlap ? 48 : 0; };
  const flashgen::ForwardChoice paged = flashgen::read_through_pages(choice, 90, spills);
  INFO(paged.reason);
  CHECK(flashgen::config_name(paged.config) == "fwd_sm90_e4m3_d256_m128_n128_s2_ofp16_causal_pp_varlen_paged");
  CHECK(paged.reason.find("ovl_pp_varlen_paged spills 48 bytes") != std::string::npos);
  CHECK_FALSE(paged.config.invalid_reason(90));
  // A paged tile that spills nothing is kept as it is.
  const auto clean = [](const flashgen::KernelConfig&) { return 0; };
  CHECK(flashgen::config_name(flashgen::read_through_pages(choice, 90, clean).config) ==
        "fwd_sm90_e4m3_d256_m128_n128_s2_ofp16_causal_ovl_pp_varlen_paged");
}

TEST_CASE("a user variant takes the base class's next tiles where the chosen ones spill much with its functions",
          "[tuner][select][user_variant][nvrtc]") {
  auto& registry = flashgen::KernelRegistry::instance();
  const auto user = documents_with_relative_bias();
  // The sm80 family's 128x64 tile spills hundreds of bytes with a mask and a bias beside its accumulators.
  flashgen::ForwardChoice choice{flashgen::KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n64_w4_s2_causal"),
                                 "stored", flashgen::ChoiceSource::kTuningDatabase};
  flashgen::KernelConfig spilling = choice.config;
  spilling.user = user;
  REQUIRE(registry.spilled_bytes(spilling, 80) > 64);
  flashgen::attach_user_variant(choice, user, 80);
  INFO(choice.reason);
  CHECK(choice.config.user == user);
  CHECK(choice.config.family() == spilling.family());
  CHECK(choice.config.mask == MaskKind::kCausal);
  CHECK(choice.config != spilling);
  CHECK(registry.spilled_bytes(choice.config, 80) <= 64);
  CHECK(choice.reason.find(spilling.name() + " spills") != std::string::npos);

  // The 128x32 tile at two stages spills a few bytes with them, which costs less than a smaller tile: kept.
  flashgen::ForwardChoice few{flashgen::KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n32_w4_s2_causal"),
                              "stored", flashgen::ChoiceSource::kTuningDatabase};
  flashgen::KernelConfig expected = few.config;
  expected.user = user;
  REQUIRE(registry.spilled_bytes(expected, 80) > 0);
  REQUIRE(registry.spilled_bytes(expected, 80) <= 64);
  flashgen::attach_user_variant(few, user, 80);
  INFO(few.reason);
  CHECK(few.config == expected);
  CHECK(few.reason.find("spills") == std::string::npos);
}
