// Tests for dispatch's planner (dispatch/planner.hpp) with fake sources: each step's effect and reason, their order,
// and that the reason a plan ends with names what runs. No GPU, no compile: spills, can_implement, the data
// sources and the first-use sweep are the fakes'.
#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "catch.hpp"
#include "dispatch/planner.hpp"
#include "flashgen/error.hpp"
#include "problem/user_variant.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/heuristic.hpp"

using flashgen::ChoiceSource;
using flashgen::ForwardChoice;
using flashgen::KernelConfig;
using flashgen::KernelFamily;
using flashgen::Shortfall;

namespace {

std::shared_ptr<const flashgen::UserVariant> relative_bias(bool masks) {
  flashgen::UserVariantDesc desc;
  desc.score_bias = "return rel[min(max(kv_idx - q_idx, -64), 64) + 64];";
  if (masks) desc.mask_mod = "return kv_idx <= q_idx + 64;";
  desc.buffers = {{"rel", flashgen::UserArgType::kFloat32}};
  return flashgen::make_user_variant(desc);
}

flashgen::AttentionProblem causal_problem() {
  return flashgen::forward_problem(flashgen::DType::kBFloat16, {2, 4096, 4096, 16, 16, 128}, flashgen::Mask::kCausal);
}

bool persistent(const KernelConfig& c) { return c.sm90() != nullptr && c.sm90()->persistent; }

// The planner's sources as fakes that log each question in order: stored choices by key id (a key without one gets
// the heuristic's ranked candidates where there are any, else `builtin` whole), spills by config name (0 unless
// listed), and can_implement: TMA cannot describe q for the sm90 family where tma_fails, and a persistent walk has
// too many tiles where tiles_fail.
struct FakeWorld {
  std::map<std::string, ForwardChoice> stored;
  std::vector<KernelConfig> ranked;
  ForwardChoice builtin;
  std::vector<KernelConfig> sm80{KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n64_w4_s2_causal"),
                                 KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n32_w4_s2_causal")};
  std::map<std::string, int> spills;
  bool tma_fails = false, tiles_fail = false;
  std::vector<std::string> log;

  flashgen::PlanSources<ForwardChoice> sources() {
    flashgen::PlanSources<ForwardChoice> s;
    s.arch = 90;
    s.choose = [this](const flashgen::ProblemKey& key) {
      log.push_back("choose " + key.id());
      auto found = stored.find(key.id());
      flashgen::SourcesAnswer<ForwardChoice> answer;
      if (found != stored.end()) {
        answer.stored = found->second;
      } else if (!ranked.empty()) {
        answer.ranked = ranked;
        answer.passed_over = "; stored x passed over";
      } else {
        answer.stored = builtin;
      }
      return answer;
    };
    s.spilled_bytes = [this](const KernelConfig& c) {
      log.push_back("spills " + c.name());
      auto found = spills.find(c.name());
      return found == spills.end() ? 0 : found->second;
    };
    s.can_implement = [this](const KernelConfig& c) -> flashgen::Implementability {
      log.push_back("can_implement " + c.name());
      if (tma_fails && c.family() == KernelFamily::kSm90) return {Shortfall::kTmaLayout, "q: a stride"};
      if (tiles_fail && persistent(c)) return {Shortfall::kTileCount, "too many tiles"};
      return {};
    };
    s.sm80_candidates = [this] {
      log.push_back("sm80_candidates");
      return sm80;
    };
    return s;
  }

  // How many log entries start with prefix.
  long count(const std::string& prefix) const {
    return std::count_if(log.begin(), log.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  }
};

flashgen::ForwardCall call_of(const flashgen::AttentionProblem& problem) {
  flashgen::ForwardCall call;
  call.problem = problem;
  return call;
}

}  // namespace

TEST_CASE("planner: a call without data takes the heuristic's first candidate that does not spill, asked after the "
          "sources answer, checked once by can_implement", "[dispatch][planner]") {
  FakeWorld world;
  world.ranked = flashgen::heuristic_forward_configs(flashgen::DType::kBFloat16, 128, flashgen::MaskKind::kCausal, 90);
  REQUIRE(world.ranked.size() >= 2);
  world.spills[world.ranked[0].name()] = 200;
  const auto plan = flashgen::plan_call(call_of(causal_problem()), world.sources());
  CHECK(plan.choice.config == world.ranked[1]);
  CHECK(plan.choice.source == ChoiceSource::kHeuristic);
  CHECK(plan.choice.reason == "built-in heuristic (no tuning data); passed over " + world.ranked[0].name() +
                              " spills 200 bytes; stored x passed over");
  CHECK(plan.final);
  CHECK(world.log == std::vector<std::string>{"choose " + flashgen::problem_key(causal_problem()).id(),
                                              "spills " + world.ranked[0].name(), "spills " + world.ranked[1].name(),
                                              "can_implement " + world.ranked[1].name()});
}

TEST_CASE("planner: steps run in order, each once, and the reason ends with what runs", "[dispatch][planner]") {
  // A dense call with a user variant and no data of its own: its base class's stored tiles, a failed first-use
  // sweep, the variant's spills, then TMA's fallback to the sm80 family: its first candidate spills, the second is
  // taken and fitted with the variant in turn.
  FakeWorld world;
  flashgen::AttentionProblem problem = causal_problem();
  problem.user = relative_bias(/*masks=*/true);
  const KernelConfig stored = KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_c2");
  REQUIRE(stored.sm90()->cluster == 2);
  flashgen::ProblemKey base = flashgen::problem_key(problem);
  const std::string own_id = base.id();
  base.user_tag.clear();
  world.stored[base.id()] = {stored, "tuning database x, exact bucket", ChoiceSource::kTuningDatabase, true};
  world.builtin = {stored, "built-in heuristic", ChoiceSource::kHeuristic};
  world.tma_fails = true;
  world.spills[world.sm80[0].name()] = 96;
  auto sources = world.sources();
  sources.tune = [&](std::string* failure) -> std::optional<ForwardChoice> {
    world.log.push_back("tune");
    *failure = "no GPU";
    return std::nullopt;
  };
  const auto plan = flashgen::plan_call(call_of(problem), sources);

  KernelConfig sm80 = world.sm80[1];
  sm80.user = problem.user;
  CHECK(plan.choice.config == sm80);
  CHECK(plan.choice.source == ChoiceSource::kHeuristic);
  KernelConfig unclustered = stored;
  unclustered.sm90()->cluster = 1;
  unclustered.user = problem.user;
  const std::string variant = "; with the user variant " + problem.user->tag + " compiled in";
  CHECK(plan.choice.reason == "its base class's choice: tuning database x, exact bucket; tuning on first use failed: "
                              "no GPU; no cluster: a user mask hides keys" + variant +
                              "; TMA cannot describe q: a stride, so the sm80 family's built-in heuristic (no "
                              "tuning data); passed over " + world.sm80[0].name() + " spills 96 bytes" + variant);
  CHECK(world.log == std::vector<std::string>{"choose " + own_id, "choose " + base.id(), "tune",
                                              "spills " + unclustered.name(), "can_implement " + unclustered.name(),
                                              "sm80_candidates", "spills " + world.sm80[0].name(),
                                              "spills " + world.sm80[1].name(), "spills " + sm80.name(),
                                              "can_implement " + sm80.name()});
}

TEST_CASE("planner: where TMA cannot describe a tensor and no sm80-family kernel takes the problem, the call is "
          "refused naming both", "[dispatch][planner]") {
  // Values of 512 columns: the Hopper family's value split only (an sm80 warp cannot hold O's columns).
  FakeWorld world;
  world.builtin = {KernelConfig::from_name("fwd_sm90_bf16_d64_v512_m64_n64_s2_causal_ovl_pp_pst_vs2"),
                   "built-in heuristic", ChoiceSource::kHeuristic};
  world.tma_fails = true;
  world.sm80.clear();
  try {
    flashgen::plan_call(call_of(causal_problem()), world.sources());
    FAIL("planned a call no family can run");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kUnsupported);
    CHECK(std::string(e.what()) == "TMA cannot describe q: a stride, which " + world.builtin.config.name() +
                                       " needs, and no sm80-family kernel takes the problem");
  }
  CHECK(world.count("sm80_candidates") == 1);
}

TEST_CASE("planner: tiles a variant spills with are replaced from the list, and the fallbacks apply to those",
          "[dispatch][planner]") {
  FakeWorld world;
  flashgen::AttentionProblem problem = causal_problem();
  problem.user = relative_bias(/*masks=*/false);
  const std::vector<KernelConfig> list =
      flashgen::heuristic_forward_configs(problem.dtype, 128, flashgen::MaskKind::kCausal, 90);
  REQUIRE(list.front().family() == KernelFamily::kSm90);
  // The chosen tiles spill, and so does every alternative but the first persistent one of the family.
  world.builtin = {list.front(), "built-in heuristic", ChoiceSource::kHeuristic};
  KernelConfig chosen = list.front();
  chosen.user = problem.user;
  world.spills[chosen.name()] = 200;
  std::optional<KernelConfig> replacement;
  for (KernelConfig c : list) {
    c.user = problem.user;
    if (c.family() != KernelFamily::kSm90 || c == chosen) continue;
    if (!replacement && persistent(c)) {
      replacement = c;
    } else {
      world.spills[c.name()] = 300;
    }
  }
  REQUIRE(replacement);
  world.tiles_fail = true;
  const auto plan = flashgen::plan_call(call_of(problem), world.sources());

  KernelConfig expected = *replacement;
  expected.sm90()->persistent = false;
  expected.sm90()->groups = 1;
  CHECK(plan.choice.config == expected);
  CHECK(plan.choice.config.user == problem.user);
  const std::string& reason = plan.choice.reason;
  INFO(reason);
  const size_t spilled = reason.find("; with it " + chosen.name() + " spills 200 bytes");
  const size_t replaced = reason.find(", so the heuristic's " + replacement->name());
  const size_t unpersisted = reason.find("; not persistent: too many tiles");
  CHECK(spilled != std::string::npos);
  CHECK(replaced > spilled);
  CHECK(replaced != std::string::npos);
  CHECK(unpersisted > replaced);
  CHECK(unpersisted != std::string::npos);
  CHECK(world.count("sm80_candidates") == 0);
}

TEST_CASE("planner: a variant's own tuning data runs as it is, its TMA fallback unchecked for spills as before",
          "[dispatch][planner]") {
  FakeWorld world;
  flashgen::AttentionProblem problem = causal_problem();
  problem.user = relative_bias(/*masks=*/true);
  const KernelConfig stored = KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_c2");
  world.stored[flashgen::problem_key(problem).id()] = {stored, "tuning database x, exact bucket",
                                                       ChoiceSource::kTuningDatabase, true};
  auto sources = world.sources();
  sources.tune = [&](std::string*) -> std::optional<ForwardChoice> {
    world.log.push_back("tune");
    return std::nullopt;
  };
  SECTION("its tiles, cluster included (they were timed with the mask)") {
    const auto plan = flashgen::plan_call(call_of(problem), sources);
    KernelConfig expected = stored;
    expected.user = problem.user;
    CHECK(plan.choice.config == expected);
    CHECK(plan.variant_timed);
    CHECK(plan.choice.reason ==
          "tuning database x, exact bucket; with the user variant " + problem.user->tag + " compiled in");
  }
  SECTION("the sm80 fallback's built-in tiles with the variant as they are, though they spill with it") {
    world.tma_fails = true;
    KernelConfig expected = world.sm80[0];
    expected.user = problem.user;
    world.spills[expected.name()] = 200;
    const auto plan = flashgen::plan_call(call_of(problem), sources);
    CHECK(plan.choice.config == expected);
    CHECK(world.count("spills " + world.sm80[0].name()) == 1);  // the built-in choice's own check, without it
  }
  CHECK(world.count("tune") == 0);
  KernelConfig with_variant = stored;
  with_variant.user = problem.user;
  const std::string suffix = with_variant.name().substr(stored.name().size());
  REQUIRE_FALSE(suffix.empty());
  CHECK(std::none_of(world.log.begin(), world.log.end(), [&](const std::string& e) {
    return e.rfind("spills ", 0) == 0 && e.find(suffix) != std::string::npos;
  }));
  CHECK(world.count("choose") == 1);
}

TEST_CASE("planner: tune-on-first-use runs only where the problem's own bucket has no data", "[dispatch][planner]") {
  FakeWorld world;
  flashgen::AttentionProblem problem = causal_problem();
  const std::vector<KernelConfig> list =
      flashgen::heuristic_forward_configs(problem.dtype, 128, flashgen::MaskKind::kCausal, 90);
  REQUIRE(list.size() >= 2);
  const KernelConfig winner = list[1];
  world.builtin = {list[0], "built-in heuristic", ChoiceSource::kHeuristic};
  auto sources = world.sources();
  std::string cause;  // the sweep's failure, none where empty
  sources.tune = [&](std::string* failure) -> std::optional<ForwardChoice> {
    world.log.push_back("tune");
    if (!cause.empty()) return *failure = cause, std::nullopt;
    return ForwardChoice{winner, "tuned on first use", ChoiceSource::kTunedOnFirstUse};
  };
  auto plan = [&] { return flashgen::plan_call(call_of(problem), sources); };

  SECTION("no data: the sweep's winner replaces the choice and its reason") {
    const auto planned = plan();
    CHECK(planned.choice.config == winner);
    CHECK(planned.choice.reason == "tuned on first use");
    CHECK(planned.final);
    CHECK(world.count("tune") == 1);
  }
  SECTION("a neighbouring bucket's winner is only a stand-in: swept") {
    world.builtin.source = ChoiceSource::kTuningDatabase;
    CHECK(plan().choice.config == winner);
    CHECK(world.count("tune") == 1);
  }
  SECTION("the database's own bucket, or a bucket tuned in this process: not swept") {
    world.builtin.exact_bucket = true;
    for (ChoiceSource source : {ChoiceSource::kTuningDatabase, ChoiceSource::kTunedOnFirstUse}) {
      world.builtin.source = source;
      CHECK(plan().choice.config == list[0]);
    }
    CHECK(world.count("tune") == 0);
  }
  SECTION("a failed sweep keeps the choice and says why") {
    cause = "not-a-directory";
    const auto planned = plan();
    CHECK(planned.choice.config == list[0]);
    CHECK(planned.choice.reason == "built-in heuristic; tuning on first use failed: not-a-directory");
  }
  SECTION("a stream capturing a graph: no sweep, and the plan is not final") {
    sources.tuning_deferred = true;
    const auto planned = plan();
    CHECK_FALSE(planned.final);
    CHECK(planned.choice.config == list[0]);
    CHECK(world.count("tune") == 0);
  }
  SECTION("the switch off: no sweep") {
    sources.tune = nullptr;
    CHECK(plan().final);
    CHECK(world.count("tune") == 0);
  }
  SECTION("a packed call with a user variant runs its base class's choice, unswept") {
    problem.varlen = true;
    problem.user = relative_bias(/*masks=*/false);
    world.builtin.config = flashgen::heuristic_forward_configs(problem.dtype, 128, flashgen::MaskKind::kCausal, 90,
                                                               /*varlen=*/true).front();
    const auto planned = plan();
    CHECK(world.count("tune") == 0);
    CHECK(world.count("choose") == 1);  // its key carries no tag: the base class's choice is its own
    CHECK(planned.choice.config.user == problem.user);
  }
}

TEST_CASE("planner: a paged packed call reads its choice, and a TMA fallback's, through the block table",
          "[dispatch][planner]") {
  FakeWorld world;
  flashgen::AttentionProblem problem = causal_problem();
  problem.varlen = true;
  problem.paged = true;
  problem.page_size = 256;
  const std::vector<KernelConfig> list =
      flashgen::heuristic_forward_configs(problem.dtype, 128, flashgen::MaskKind::kCausal, 90, /*varlen=*/true);
  world.builtin = {list.front(), "built-in heuristic", ChoiceSource::kHeuristic};
  for (KernelConfig& c : world.sm80) c.varlen = true;
  world.tma_fails = true;
  auto sources = world.sources();
  sources.read_through_pages = [&](ForwardChoice choice) {
    world.log.push_back("paged " + choice.config.name());
    choice.config.paged = true;
    choice.reason += "; paged";
    return choice;
  };
  const auto plan = flashgen::plan_call(call_of(problem), sources);
  CHECK(plan.choice.config.family() == KernelFamily::kSm80);
  CHECK(plan.choice.config.paged);
  CHECK(plan.choice.reason == "built-in heuristic; paged; TMA cannot describe q: a stride, so the sm80 family's "
                              "built-in heuristic (no tuning data); paged");
  CHECK(plan.choice.config.name() == world.sm80[0].name() + "_paged");
  CHECK(world.count("paged") == 2);
  CHECK(world.log.front().rfind("choose fwd_varlen_paged256|", 0) == 0);
}

TEST_CASE("planner: no fallback that lets a family implement the call is an internal error", "[dispatch][planner]") {
  FakeWorld world;
  world.builtin = {flashgen::heuristic_forward_configs(flashgen::DType::kBFloat16, 128, flashgen::MaskKind::kCausal,
                                                       90).front(), "built-in heuristic", ChoiceSource::kHeuristic};
  world.sm80 = {world.builtin.config};  // a fake whose fallback is of the same family: TMA never describes the call
  world.tma_fails = true;
  CHECK_THROWS_WITH(flashgen::plan_call(call_of(causal_problem()), world.sources()),
                    Catch::Contains("no fallback lets a kernel family implement the problem"));
  CHECK(world.count("can_implement") == 3);
}

TEST_CASE("planner: the backward falls back to the sm80 family, and has no persistent walk to drop",
          "[dispatch][planner]") {
  const flashgen::AttentionProblem problem = flashgen::backward_problem(
      flashgen::DType::kBFloat16, {2, 4096, 4096, 16, 16, 128}, flashgen::Mask::kCausal, false);
  const std::vector<flashgen::BwdConfig> list =
      flashgen::heuristic_backward_configs(problem.dtype, 128, flashgen::MaskKind::kCausal, false, 90);
  auto sm90 = std::find_if(list.begin(), list.end(), [](const auto& c) { return c.family() == KernelFamily::kSm90; });
  auto sm80 = std::find_if(list.begin(), list.end(), [](const auto& c) { return c.family() == KernelFamily::kSm80; });
  REQUIRE(sm90 != list.end());
  REQUIRE(sm80 != list.end());
  flashgen::PlanSources<flashgen::BackwardChoice> sources;
  sources.arch = 90;
  sources.choose = [&](const flashgen::ProblemKey&) {
    flashgen::SourcesAnswer<flashgen::BackwardChoice> answer;
    answer.ranked = {*sm90};
    return answer;
  };
  sources.sm80_candidates = [&] { return std::vector<flashgen::BwdConfig>{*sm80}; };
  sources.spilled_bytes = [](const flashgen::BwdConfig&) { return 0; };
  flashgen::BackwardCall call;
  call.problem = problem;
  SECTION("TMA cannot describe a tensor") {
    sources.can_implement = [](const flashgen::BwdConfig& c) -> flashgen::Implementability {
      if (c.family() == KernelFamily::kSm90) return {Shortfall::kTmaLayout, "dq: a stride"};
      return {};
    };
    const auto plan = flashgen::plan_call(call, sources);
    CHECK(plan.choice.config == *sm80);
    CHECK(plan.choice.reason == "built-in heuristic (no tuning data); TMA cannot describe dq: a stride, so the sm80 "
                                "family's built-in heuristic (no tuning data)");
  }
  SECTION("a tile count no backward kernel reports") {
    sources.can_implement = [](const flashgen::BwdConfig&) {
      return flashgen::Implementability{Shortfall::kTileCount, "too many tiles"};
    };
    CHECK_THROWS_WITH(flashgen::plan_call(call, sources), Catch::Contains("too many tiles for a persistent walk"));
  }
}

TEST_CASE("planner: a backward call that wants its sinks' gradient sums it in the chosen tiles, no other call",
          "[dispatch][planner][sinks]") {
  const flashgen::AttentionProblem problem = flashgen::backward_problem(
      flashgen::DType::kBFloat16, {2, 1024, 1024, 8, 2, 64}, flashgen::Mask::kCausal, false);
  const std::vector<flashgen::BwdConfig> list =
      flashgen::heuristic_backward_configs(problem.dtype, 64, flashgen::MaskKind::kCausal, false, 90);
  auto sm90 = std::find_if(list.begin(), list.end(), [](const auto& c) { return c.family() == KernelFamily::kSm90; });
  auto sm80 = std::find_if(list.begin(), list.end(), [](const auto& c) { return c.family() == KernelFamily::kSm80; });
  REQUIRE(sm90 != list.end());
  REQUIRE(sm80 != list.end());
  flashgen::BwdConfig ranked = *sm80;
  flashgen::PlanSources<flashgen::BackwardChoice> sources;
  sources.arch = 90;
  std::vector<std::string> keys;
  sources.choose = [&](const flashgen::ProblemKey& key) {
    keys.push_back(key.id());
    flashgen::SourcesAnswer<flashgen::BackwardChoice> answer;
    answer.ranked = {ranked};
    return answer;
  };
  sources.sm80_candidates = [&] { return std::vector<flashgen::BwdConfig>{*sm80}; };
  sources.spilled_bytes = [](const flashgen::BwdConfig&) { return 0; };
  sources.can_implement = [](const flashgen::BwdConfig&) { return flashgen::Implementability{}; };
  flashgen::BackwardCall call;
  call.problem = problem;
  const auto without = flashgen::plan_call(call, sources);
  CHECK(without.choice.config == *sm80);
  CHECK_FALSE(without.choice.config.sink_grad);
  call.problem.sink_grad = true;
  const auto with = flashgen::plan_call(call, sources);
  CHECK(with.choice.config.sink_grad);
  CHECK(with.choice.config.name() == sm80->name() + "_dsink");
  CHECK(with.choice.reason == without.choice.reason + "; the sinks' gradient summed over its scores");
  // The same problem key asked both times: the knob is not tuned over.
  REQUIRE(keys.size() == 2);
  CHECK(keys[0] == keys[1]);
  // The Hopper family's tiles alike.
  ranked = *sm90;
  const auto hopper = flashgen::plan_call(call, sources);
  CHECK(hopper.choice.config.name() == sm90->name() + "_dsink");
  // Where the chosen tiles spill with it, the next of the class's Hopper tiles that does not.
  auto next_sm90 = std::find_if(std::next(sm90), list.end(),
                                [](const auto& c) { return c.family() == KernelFamily::kSm90; });
  REQUIRE(next_sm90 != list.end());
  const std::string spilling = sm90->name() + "_dsink";
  sources.spilled_bytes = [&](const flashgen::BwdConfig& c) {
    return c.name() == spilling ? flashgen::kCheapSpillBytes + 4 : 0;
  };
  CHECK(flashgen::plan_call(call, sources).choice.config.name() == next_sm90->name() + "_dsink");
  call.problem.sink_grad = false;
  CHECK(flashgen::plan_call(call, sources).choice.config == *sm90);
}

namespace {

flashgen::KvCacheCall window_kvcache_call(int num_splits) {
  flashgen::KvCacheCall call;
  call.problem = flashgen::forward_problem(flashgen::DType::kBFloat16, {1, 1, 32768, 32, 8, 128},
                                           flashgen::Mask::kSlidingWindow, 256, 0);
  call.problem.kv_cache = true;
  call.num_splits = num_splits;
  return call;
}

}  // namespace

TEST_CASE("planner: a KV-cache call's variant and split count, the reason naming the count that runs",
          "[dispatch][planner][decode]") {
  // A 256-key window over a 32k cache visits at most 5 key blocks of 64.
  flashgen::KvCacheCall call = window_kvcache_call(0);
  flashgen::DecodeChoice chosen = flashgen::heuristic_decode_choice(call.problem, 90, 132);
  REQUIRE(flashgen::max_decode_splits(call.problem, chosen.config) == 5);
  int asked = 0;
  auto choose = [&] {
    ++asked;
    return chosen;
  };
  SECTION("the chosen count within the visited blocks runs as it is") {
    chosen.splits = 3;
    const flashgen::DecodeChoice plan = flashgen::plan_call(call, choose);
    CHECK(plan.splits == 3);
    CHECK(plan.reason == chosen.reason);
  }
  SECTION("a chosen count past them runs capped, and says so") {
    chosen.splits = 16;
    const flashgen::DecodeChoice plan = flashgen::plan_call(call, choose);
    CHECK(plan.splits == 5);
    CHECK(plan.reason == chosen.reason + "; 16 key ranges chosen, run as 5 key ranges (the key blocks a sequence's "
                                         "rows visit)");
  }
  SECTION("a requested count replaces the chosen one, after the variant") {
    call = window_kvcache_call(16);
    call.problem.user = relative_bias(/*masks=*/false);
    const flashgen::DecodeChoice plan = flashgen::plan_call(call, choose);
    CHECK(plan.splits == 5);
    CHECK(plan.config.user == call.problem.user);
    CHECK(plan.reason == chosen.reason + "; with the user variant " + call.problem.user->tag +
                             " compiled in; 16 key ranges as requested, run as 5 key ranges (the key blocks a "
                             "sequence's rows visit)");
  }
  CHECK(asked == 1);
}
