// Tests of the KV-cache tuning path without a GPU: DecodeSplitConfig's name and JSON, the decode space and its
// split counts, a plan around the built-in choice, a tune with a fake sweep, and the run-time choice from a
// store (the stored split count for the problem's own bucket, the heuristic's for a neighbour's module); the
// same for a sliding window, keyed by its window bucket.
#include <algorithm>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "support/fake_sweep.hpp"
#include "support/temp_dir.hpp"
#include "tuner/choice.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/shipped.hpp"
#include "tuner/space.hpp"
#include "tuner/store.hpp"
#include "tuner/tune.hpp"

using Catch::Matchers::Contains;
using flashgen::AttentionProblem;
using flashgen::DecodeConfig;
using flashgen::DecodeSplitConfig;
using flashgen::TunedConfig;

namespace {

// One decoding step of a GQA 32/8 model at head_dim 128 against caches of `capacity` keys.
AttentionProblem decode_problem(int64_t batch, int64_t capacity, bool paged) {
  const flashgen::AttentionShape shape{batch, /*seqlen_q=*/1, capacity, /*heads_q=*/32, /*heads_kv=*/8,
                                      /*head_dim=*/128};
  AttentionProblem p = flashgen::forward_problem(flashgen::DType::kBFloat16, shape, flashgen::Mask::kCausal);
  p.kv_cache = true;
  p.paged = paged;
  p.page_size = paged ? 16 : 0;
  return p;
}

DecodeSplitConfig some_decode(bool paged, int splits) {
  DecodeConfig c;
  c.dtype = flashgen::DType::kBFloat16;
  c.mask = flashgen::MaskKind::kCausal;
  c.rows = 16, c.block_n = 128, c.warps = 4, c.stages = 3, c.paged = paged;
  return {c, splits};
}

}  // namespace

TEST_CASE("a tuned decode config is its module and split count, by name and in JSON", "[tuner][decode]") {
  const DecodeSplitConfig tuned = some_decode(true, 12);
  CHECK(tuned.name() == "dec_sm80_bf16_d128_r16_n128_w4_s3_causal_paged_split12");
  CHECK(DecodeSplitConfig::from_name(tuned.name()) == tuned);
  CHECK_THROWS_WITH(DecodeSplitConfig::from_name("dec_sm80_bf16_d128_r16_n128_w4_s3"), Contains("ends in _split<N>"));
  CHECK_THROWS_WITH(DecodeSplitConfig::from_name("dec_sm80_bf16_d128_r16_n128_w4_s3_split1x"),
                    Contains("must be followed by a count"));
  CHECK_THROWS_WITH(DecodeSplitConfig::from_name("dec_sm80_bf16_d128_r16_n128_w4_s3_split007"),
                    Contains("did you mean 'dec_sm80_bf16_d128_r16_n128_w4_s3_split7'"));
  CHECK_THROWS_WITH(DecodeSplitConfig::from_name("dec_sm80_bf16_d128_r16_n128_w4_s3_paged_causal_split2"),
                    Contains("not canonical"));

  // JSON: the module's fields and "splits"; read back as a TunedConfig by its family.
  const nlohmann::json j = TunedConfig(tuned);
  CHECK(j.at("family") == "dec_sm80");
  CHECK(j.at("splits") == 12);
  CHECK(j.get<TunedConfig>() == tuned);
  nlohmann::json no_splits = j;
  no_splits.erase("splits");
  CHECK_THROWS_WITH(no_splits.get<TunedConfig>(), Contains("'splits' must be an integer"));

  CHECK_FALSE(tuned.invalid_reason(90).has_value());
  CHECK(some_decode(false, 0).invalid_reason(90) == std::string("splits must be 1 to 128, got 0"));
  CHECK(some_decode(false, 129).invalid_reason(90).has_value());
  CHECK(some_decode(false, 4).invalid_reason(75).has_value());  // the module's own reason

  // Of a KV-cache problem of its class and cache layout only.
  const flashgen::ProblemKey contiguous = flashgen::problem_key(decode_problem(4, 8192, false));
  const flashgen::ProblemKey paged = flashgen::problem_key(decode_problem(4, 8192, true));
  CHECK(flashgen::of_problem(some_decode(false, 3), contiguous));
  CHECK_FALSE(flashgen::of_problem(some_decode(false, 3), paged));
  CHECK(flashgen::of_problem(some_decode(true, 3), paged));
  AttentionProblem forward = decode_problem(4, 8192, false);
  forward.kv_cache = false;
  CHECK_FALSE(flashgen::of_problem(some_decode(false, 3), flashgen::problem_key(forward)));
  flashgen::KernelConfig dense;
  dense.dtype = flashgen::DType::kBFloat16;
  dense.mask = flashgen::MaskKind::kCausal;
  CHECK_FALSE(flashgen::of_problem(dense, contiguous));  // a KV-cache call runs no dense kernel
}

TEST_CASE("split counts worth timing: one range, the heuristic's, and one to four blocks per SM", "[tuner][decode]") {
  const DecodeConfig c = some_decode(false, 1).config;
  // Batch 1: 8 kv heads x 1 row block = 8 blocks; 132 SMs take 17, 33, 50, 66 ranges to fill 1-4 blocks each, and
  // hold 16, 33, 49, 66 within those waves.
  const AttentionProblem one = decode_problem(1, 32768, false);
  const int heuristic = flashgen::heuristic_decode_splits(one, c, 90, 132);
  std::vector<int> want{1, heuristic, 16, 17, 33, 49, 50, 66};
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  CHECK(flashgen::decode_split_counts(one, c, 90, 132) == want);
  // A short cache caps them at its key blocks (1024 / 128 = 8): the heuristic's count, first 7 (56 of 132 SMs
  // being within 85% of 64), becomes 8, one block per range where 7 ranges would leave one of them two.
  CHECK(flashgen::heuristic_decode_splits(decode_problem(1, 1024, false), c, 90, 132) == 8);
  CHECK(flashgen::decode_split_counts(decode_problem(1, 1024, false), c, 90, 132) == std::vector<int>{1, 8});
  // 512 blocks fill 132 SMs alone: one range, or two for four blocks per SM.
  CHECK(flashgen::decode_split_counts(decode_problem(64, 32768, false), c, 90, 132) == std::vector<int>{1, 2});
}

TEST_CASE("the decode space pairs each valid module with its split counts", "[tuner][decode]") {
  const AttentionProblem problem = decode_problem(2, 16384, true);
  flashgen::DecodeKnobs knobs;
  knobs.rows = {16, 32};
  knobs.block_n = {64, 96};  // 96 is no multiple of 16 * 4 warps
  knobs.warps = {4};
  knobs.stages = {2, 3};
  const flashgen::DecodeSpaceReport space = flashgen::decode_space(problem, 90, 132, knobs);
  for (const DecodeSplitConfig& c : space.valid) {
    INFO(c.name());
    CHECK(c.config.paged);
    CHECK(c.config.block_n == 64);
    CHECK_FALSE(c.invalid_reason(90).has_value());
  }
  size_t expected = 0;
  for (int rows : {16, 32})
    for (int stages : {2, 3}) {
      DecodeConfig module = some_decode(true, 1).config;
      module.rows = rows, module.block_n = 64, module.stages = stages;
      REQUIRE_FALSE(module.invalid_reason(90).has_value());
      expected += flashgen::decode_split_counts(problem, module, 90, 132).size();
    }
  CHECK(space.valid.size() == expected);
  CHECK(space.pruned == 4);  // each invalid module (block_n 96) counted once
  CHECK(space.pruned_by_reason.size() == 1);
  CHECK(space.total == static_cast<int>(expected) + 4);

  // A capped list: the built-in first, then its one-knob neighbours (other split counts among them).
  const flashgen::DecodeChoice builtin_choice = flashgen::heuristic_decode_choice(problem, 90, 132);
  const DecodeSplitConfig builtin{builtin_choice.config, builtin_choice.splits};
  const flashgen::DecodeSpaceReport full = flashgen::decode_space(problem, 90, 132);
  const std::vector<DecodeSplitConfig> capped = flashgen::capped_candidates(full, builtin, 6);
  REQUIRE(capped.size() == 6);
  CHECK(capped.front() == builtin);
  bool other_splits = false;
  for (const DecodeSplitConfig& c : capped) other_splits |= c.config == builtin.config && c.splits != builtin.splits;
  CHECK(other_splits);
}

TEST_CASE("a KV-cache tune plans for the GPU's SMs, sweeps and stores the module with its split count",
          "[tuner][decode]") {
  const flashgen::testing::TempDir dir("flashgen-tune-decode-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  const AttentionProblem problem = decode_problem(1, 32768, false);
  flashgen::TuneOptions options;
  options.max_candidates = 5;
  options.multiprocessors = 132;
  flashgen::testing::FakeSweep sweep;
  options.run_sweep = sweep.runner();
  const flashgen::TuneResult result = flashgen::tune(problem, store, device, 90, options);
  REQUIRE(sweep.calls.size() == 1);
  REQUIRE(sweep.calls[0].size() == 5);
  const flashgen::DecodeChoice builtin = flashgen::heuristic_decode_choice(problem, 90, 132);
  CHECK(result.plan.builtin == DecodeSplitConfig{builtin.config, builtin.splits});
  CHECK(sweep.calls[0][0] == result.plan.builtin);
  CHECK(result.plan.multiprocessors == 132);
  CHECK(result.key.id() == "dec|bf16|d128|causal|g4|q1|k32768|bh32");
  const auto stored = store.lookup_exact(device, result.key);
  REQUIRE(stored.has_value());
  CHECK(stored->config == sweep.calls[0].back());

  // Named candidates must be KV-cache configs of the problem's cache layout.
  const flashgen::ProblemKey key = flashgen::problem_key(problem);
  CHECK(flashgen::configs_of_problem({some_decode(false, 7).name()}, key).front() == some_decode(false, 7));
  CHECK_THROWS_WITH(flashgen::configs_of_problem({some_decode(false, 7).config.name()}, key),
                    Contains("ends in _split<N>"));
  CHECK_THROWS_WITH(flashgen::configs_of_problem({some_decode(true, 7).name()}, key),
                    Contains("is not a config of the problem dec|bf16"));
  CHECK_THROWS_WITH(flashgen::configs_of_problem({"fwd_sm80_bf16_d128_m128_n64_w4_s2_causal"}, key),
                    Contains("is a forward config; this problem tunes the KV-cache kernels"));
  AttentionProblem dense = problem;
  dense.kv_cache = false;
  CHECK_THROWS_WITH(flashgen::configs_of_problem({some_decode(false, 7).name()}, flashgen::problem_key(dense)),
                    Contains("is a KV-cache config; this problem tunes the forward kernels"));
}

TEST_CASE("the KV-cache choice: a stored split count for its own bucket, the heuristic's for a neighbour's module",
          "[tuner][decode][select]") {
  const flashgen::testing::TempDir dir("flashgen-decode-choice-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  const AttentionProblem tuned = decode_problem(1, 32768, false);
  const DecodeSplitConfig winner = some_decode(false, 21);
  REQUIRE(winner.config != flashgen::heuristic_decode_choice(tuned, 90, 132).config);
  flashgen::CandidateResult row;
  row.config = winner;
  row.median_ms = 0.05;
  row.samples = 10;
  store.record(device, flashgen::problem_key(tuned), {row}, winner, 0.05);

  const flashgen::DecodeChoice exact = flashgen::choose_decode_config(device, tuned, 90, 132, &store);
  CHECK(exact.config == winner.config);
  CHECK(exact.splits == 21);
  CHECK(exact.source == flashgen::ChoiceSource::kTuningDatabase);
  CHECK(exact.exact_bucket);
  CHECK_THAT(exact.reason, Contains("exact bucket dec|bf16|d128|causal|g4|q1|k32768|bh32"));

  // Four times the sequences: the module, with the split count the heuristic takes for it at these sizes.
  const AttentionProblem bigger = decode_problem(4, 32768, false);
  const flashgen::DecodeChoice nearest = flashgen::choose_decode_config(device, bigger, 90, 132, &store);
  CHECK(nearest.config == winner.config);
  CHECK(nearest.splits == flashgen::heuristic_decode_splits(bigger, winner.config, 90, 132));
  CHECK_FALSE(nearest.exact_bucket);
  CHECK_THAT(nearest.reason, Contains("nearest bucket") && Contains("at the problem's sizes"));

  // A paged call is another class: the heuristic. So is another device.
  const flashgen::DecodeChoice paged = flashgen::choose_decode_config(device, decode_problem(1, 32768, true), 90, 132, &store);
  CHECK(paged.source == flashgen::ChoiceSource::kHeuristic);
  CHECK(paged.config == flashgen::heuristic_decode_choice(decode_problem(1, 32768, true), 90, 132).config);
  const flashgen::DecodeChoice other =
      flashgen::choose_decode_config(flashgen::fingerprint_for_arch(80), tuned, 80, 108, &store);
  CHECK(other.source == flashgen::ChoiceSource::kHeuristic);
  AttentionProblem dense = tuned;
  dense.kv_cache = false;
  CHECK_THROWS_WITH(flashgen::choose_decode_config(device, dense, 90, 132, &store), Contains("not a KV-cache one"));

  // Shipped defaults: the stored split count serves their own bucket too.
  const flashgen::ShippedDefaults shipped =
      flashgen::ShippedDefaults::from_files({{"test.json", store.export_json().dump()}});
  const flashgen::DecodeChoice from_shipped = flashgen::choose_decode_config(device, tuned, 90, 132, nullptr, &shipped);
  CHECK(from_shipped.source == flashgen::ChoiceSource::kShippedDefaults);
  CHECK(from_shipped.splits == 21);
  CHECK(flashgen::choose_decode_config(device, bigger, 90, 132, nullptr, &shipped).splits == nearest.splits);
}

TEST_CASE("a KV-cache window problem is tuned and chosen per window bucket, its splits capped by the window",
          "[tuner][decode][window]") {
  const flashgen::testing::TempDir dir("flashgen-decode-window-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  AttentionProblem problem = decode_problem(1, 32768, false);
  problem.set_mask(flashgen::Mask::kSlidingWindow, 1023, 0);
  std::vector<std::pair<int, int>> swept_windows;
  flashgen::testing::FakeSweep sweep;
  flashgen::TuneOptions options;
  options.max_candidates = 5;
  options.multiprocessors = 132;
  options.run_sweep = [&](const AttentionProblem& p, const std::vector<TunedConfig>& candidates,
                          const flashgen::SweepOptions& sweep_options) {
    swept_windows.emplace_back(p.window_left, p.window_right);
    return sweep.runner()(p, candidates, sweep_options);
  };
  const flashgen::TuneResult result = flashgen::tune(problem, store, device, 90, options);
  CHECK(swept_windows == std::vector<std::pair<int, int>>{{1023, 0}});
  CHECK(result.key.id() == "dec|bf16|d128|window|g4|q1|k32768|bh32|w1024c");
  // Every candidate is a window module split at most into the blocks 1024 keys touch (17 of 64, 9 of 128).
  REQUIRE(sweep.calls.size() == 1);
  for (const TunedConfig& c : sweep.calls[0]) {
    const auto& decode = std::get<DecodeSplitConfig>(c);
    INFO(decode.name());
    CHECK(decode.config.mask == flashgen::MaskKind::kWindow);
    CHECK(decode.splits <= flashgen::max_decode_splits(problem, decode.config));
  }
  const auto& winner = std::get<DecodeSplitConfig>(sweep.calls[0].back());

  // The store keeps the window's bucket through its rows and their JSON; the run-time choice finds it.
  const flashgen::DecodeChoice exact = flashgen::choose_decode_config(device, problem, 90, 132, &store);
  CHECK(exact.config == winner.config);
  CHECK(exact.splits == winner.splits);
  CHECK(exact.exact_bucket);
  flashgen::TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(store.export_json().dump())) == 1);
  CHECK(copy.lookup_exact(device, result.key)->config == TunedConfig(winner));
  // A window of another bucket: the nearest stored one's module, split as the heuristic splits it for this
  // window (64 keys: fewer blocks to split); the causal mask is another class.
  AttentionProblem shorter = problem;
  shorter.set_mask(flashgen::Mask::kSlidingWindow, 63, 0);
  const flashgen::DecodeChoice nearest = flashgen::choose_decode_config(device, shorter, 90, 132, &store);
  CHECK(nearest.config == winner.config);
  CHECK_FALSE(nearest.exact_bucket);
  CHECK(nearest.splits == flashgen::heuristic_decode_splits(shorter, winner.config, 90, 132));
  CHECK(nearest.splits <= flashgen::max_decode_splits(shorter, winner.config));
  CHECK(flashgen::max_decode_splits(shorter, winner.config) < flashgen::max_decode_splits(problem, winner.config));
  AttentionProblem causal = problem;
  causal.set_mask(flashgen::Mask::kCausal);
  CHECK(flashgen::choose_decode_config(device, causal, 90, 132, &store).source ==
        flashgen::ChoiceSource::kHeuristic);
}

TEST_CASE("a latent cache's tuned module and split count go through the store, its JSON and shipped defaults",
          "[tuner][decode][latent]") {
  const flashgen::testing::TempDir dir("flashgen-latent-store-test");
  flashgen::TuningStore store(dir.path() / "tuning.sqlite");
  const flashgen::DeviceFingerprint device = flashgen::fingerprint_for_arch(90);
  AttentionProblem latent = decode_problem(16, 4096, true);
  latent.shape.heads_q = 128, latent.shape.heads_kv = 1;
  latent.shape.head_dim = 576, latent.shape.head_dim_v = 512;
  const DecodeSplitConfig winner{flashgen::heuristic_decode_choice(latent, 90, 132).config, 4};
  REQUIRE(winner.config.latent);
  flashgen::CandidateResult row;
  row.config = winner;
  row.median_ms = 0.07;
  row.samples = 10;
  store.record(device, flashgen::problem_key(latent), {row}, winner, 0.07);
  // An export imports (keys of 576 columns included) and serves the class as shipped defaults.
  flashgen::TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(store.export_json().dump())) == 1);
  const flashgen::ShippedDefaults shipped =
      flashgen::ShippedDefaults::from_files({{"latent.json", copy.export_json().dump()}});
  const flashgen::DecodeChoice chosen = flashgen::choose_decode_config(device, latent, 90, 132, nullptr, &shipped);
  CHECK(chosen.source == flashgen::ChoiceSource::kShippedDefaults);
  CHECK(chosen.config == winner.config);
  CHECK(chosen.splits == 4);
}
