// `flashgen tune`'s other passes: --backward candidates of its dQ strategy, --kv-cache decode modules with their
// split counts, --varlen packed-batch configs; on a GPU, each pass's stored winner is what `flashgen run` then uses.
#include <string>
#include <vector>

#include "catch.hpp"
#include "gpu.hpp"
#include "support/cli_runner.hpp"
#include "support/temp_dir.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/tuned_config.hpp"

using flashgen::testing::NoSchedulerEnv;
using flashgen::testing::parse_json;
using flashgen::testing::run_cli;
using flashgen::testing::TempDir;
using flashgen::testing::write_spec;

TEST_CASE("cli: tune --backward lists backward candidates of its strategy", "[cli][tune][backward]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const nlohmann::json atomic = parse_json(run_cli(
      {"tune", "--backward", "--head-dim", "128", "--causal", "bottom-right", "--max-candidates", "4", "--dry-run",
       "--json", "--arch", "90"},
      dir));
  REQUIRE(atomic["problems"].size() == 1);
  const nlohmann::json& p = atomic["problems"][0];
  CHECK(p["pass"] == "backward");
  CHECK(p["deterministic"] == false);
  REQUIRE(p["candidates"].size() == 4);
  // The built-in choice first: on sm_90, the Hopper family.
  CHECK(p["candidates"][0] ==
        flashgen::heuristic_backward_config(flashgen::DType::kFloat16, 128, flashgen::MaskKind::kCausal, false, 90)
            .name());
  for (const auto& name : p["candidates"]) CHECK(name.get<std::string>().rfind("bwd_", 0) == 0);

  const std::string spec =
      write_spec(dir, R"({"problems": [{"pass": "backward", "deterministic": true, "head_dim": 64}, {}]})");
  const nlohmann::json mixed =
      parse_json(run_cli({"tune", "--spec", spec, "--max-candidates", "3", "--dry-run", "--json", "--arch", "80"}, dir));
  REQUIRE(mixed["problems"].size() == 2);
  for (const auto& name : mixed["problems"][0]["candidates"])
    CHECK(name.get<std::string>().find("_det_") != std::string::npos);
  CHECK(mixed["problems"][1]["pass"] == "forward");
  CHECK(mixed["problems"][1]["candidates"][0].get<std::string>().rfind("fwd_", 0) == 0);

  const auto refused = run_cli({"tune", "--deterministic", "--dry-run"}, dir);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("--deterministic needs --backward") != std::string::npos);
}

TEST_CASE("cli: tune --kv-cache lists decode modules with their split counts", "[cli][tune][decode]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const nlohmann::json plan = parse_json(run_cli({"tune", "--kv-cache", "--page-size", "32", "--dtype", "bf16",
                                                  "--heads-q", "32", "--heads-kv", "8", "--batch", "2", "--seqlen-k",
                                                  "8192", "--max-candidates", "6", "--dry-run", "--json", "--sms", "66"},
                                                 dir));
  REQUIRE(plan["problems"].size() == 1);
  const nlohmann::json& p = plan["problems"][0];
  CHECK(p["kv_cache"] == true);
  CHECK(p["page_size"] == 32);
  CHECK(p["seqlen_q"] == 1);  // one new token unless --seqlen-q says otherwise
  REQUIRE(p["candidates"].size() == 6);
  // The built-in choice first, planned for the 66 SMs asked for.
  flashgen::AttentionProblem problem = flashgen::forward_problem(
      flashgen::DType::kBFloat16, flashgen::AttentionShape{2, 1, 8192, 32, 8, 128}, flashgen::Mask::kNone);
  problem.kv_cache = problem.paged = true;
  problem.page_size = 32;
  const flashgen::DecodeChoice builtin = flashgen::heuristic_decode_choice(problem, 90, 66);
  CHECK(p["candidates"][0] == flashgen::DecodeSplitConfig{builtin.config, builtin.splits}.name());
  for (const auto& name : p["candidates"]) {
    CHECK(name.get<std::string>().rfind("dec_sm80_bf16_d128_", 0) == 0);
    CHECK(name.get<std::string>().find("_paged_split") != std::string::npos);
  }

  // A spec's KV-cache problem; and what is refused, named.
  const std::string spec = write_spec(dir, R"({"problems": [{"kv_cache": true, "seqlen_k": 2048}, {}]})");
  const nlohmann::json mixed =
      parse_json(run_cli({"tune", "--spec", spec, "--max-candidates", "2", "--dry-run", "--json", "--arch", "80"}, dir));
  REQUIRE(mixed["problems"].size() == 2);
  CHECK(mixed["problems"][0]["seqlen_q"] == 1);
  CHECK(mixed["problems"][0]["candidates"][0].get<std::string>().rfind("dec_sm80_fp16_d128_", 0) == 0);
  CHECK(mixed["problems"][1]["candidates"][0].get<std::string>().rfind("fwd_sm80_", 0) == 0);
  auto error_of = [&](std::vector<std::string> command) {
    command.push_back("--dry-run");
    const auto r = run_cli(command, dir);
    CHECK(r.exit_code == 2);
    return r.err;
  };
  CHECK_THAT(error_of({"tune", "--page-size", "16"}), Catch::Contains("--page-size needs --kv-cache, or --varlen"));
  CHECK_THAT(error_of({"tune", "--kv-cache", "--backward"}), Catch::Contains("--kv-cache tunes a forward"));
  CHECK_THAT(error_of({"tune", "--kv-cache", "--page-size", "24"}), Catch::Contains("page_size) must be a multiple of 16"));
  CHECK_THAT(error_of({"tune", "--sms", "8"}), Catch::Contains("--sms applies to --dry-run --json"));
  CHECK_THAT(error_of({"tune", "--cache-dtype", "e4m3"}), Catch::Contains("--cache-dtype needs --kv-cache"));
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"kv_cache": true, "cache_dtype": "fp8"}]})")}),
             Catch::Contains("problems[0].cache_dtype: an FP8 cache's type must be e4m3 or e5m2, got 'fp8'"));

  // An FP8 cache's problem tunes the modules that read it, from flags and from a spec alike.
  for (const std::vector<std::string>& source :
       {std::vector<std::string>{"--kv-cache", "--cache-dtype", "e4m3"},
        {"--spec", write_spec(dir, R"({"problems": [{"kv_cache": true, "cache_dtype": "e4m3"}]})")}}) {
    std::vector<std::string> command{"tune", "--max-candidates", "3", "--dry-run", "--json", "--arch", "90"};
    command.insert(command.end(), source.begin(), source.end());
    const nlohmann::json fp8 = parse_json(run_cli(command, dir));
    REQUIRE(fp8["problems"].size() == 1);
    CHECK(fp8["problems"][0]["cache_dtype"] == "e4m3");
    REQUIRE(fp8["problems"][0]["candidates"].size() == 3);
    for (const auto& name : fp8["problems"][0]["candidates"]) {
      CHECK(name.get<std::string>().find("_kve4m3") != std::string::npos);
    }
  }
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"page_size": 16}]})")}),
             Catch::Contains("problems[0]: page_size needs \"kv_cache\": true, or \"varlen\": true with the forward"));
}

TEST_CASE("cli: tune --varlen lists packed-batch configs for a batch of the given sizes", "[cli][tune][varlen]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const nlohmann::json plan =
      parse_json(run_cli({"tune", "--varlen", "--batch", "64", "--seqlen-q", "8192", "--seqlen-k", "8192",
                          "--max-candidates", "4", "--dry-run", "--json", "--arch", "90"},
                         dir));
  REQUIRE(plan["problems"].size() == 1);
  const nlohmann::json& p = plan["problems"][0];
  CHECK(p["varlen"] == true);
  CHECK(p["total_q"] == 64 * (8192 + 128) / 2);  // lengths spread from 8192 down to 1/64 of it
  CHECK(p["total_k"] == p["total_q"]);
  REQUIRE(p["candidates"].size() == 4);
  for (const auto& name : p["candidates"]) {
    const flashgen::KernelConfig c = flashgen::KernelConfig::from_name(name.get<std::string>());
    CHECK(c.varlen);
    CHECK_FALSE(c.invalid_reason(90).has_value());
  }
  // The backward's packed kernels; a spec's packed problem with its own totals.
  const nlohmann::json backward = parse_json(run_cli(
      {"tune", "--varlen", "--backward", "--total-q", "3000", "--batch", "4", "--seqlen-q", "1000", "--seqlen-k", "1000",
       "--max-candidates", "2", "--dry-run", "--json", "--arch", "90"},
      dir));
  CHECK(backward["problems"][0]["total_q"] == 3000);
  for (const auto& name : backward["problems"][0]["candidates"])
    CHECK(name.get<std::string>().find("_varlen") != std::string::npos);
  const std::string spec = write_spec(
      dir, R"({"problems": [{"varlen": true, "batch": 8, "seqlen_q": 512, "seqlen_k": 512, "total_q": 3000, "total_k": 3000}]})");
  const nlohmann::json from_spec = parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json"}, dir));
  CHECK(from_spec["problems"][0]["total_q"] == 3000);
  auto error_of = [&](std::vector<std::string> command) {
    command.push_back("--dry-run");
    const auto r = run_cli(command, dir);
    CHECK(r.exit_code == 2);
    return r.err;
  };
  CHECK_THAT(error_of({"tune", "--total-q", "10"}), Catch::Contains("--total-q needs --varlen"));
  // Over pages: the paged kernels, keyed by the page size; the backward has none.
  const nlohmann::json paged = parse_json(run_cli({"tune", "--varlen", "--page-size", "256", "--dtype", "bf16", "--batch",
                                                   "8", "--max-candidates", "4", "--dry-run", "--json", "--arch", "90"},
                                                  dir));
  CHECK(paged["problems"][0]["page_size"] == 256);
  REQUIRE(paged["problems"][0]["candidates"].size() == 4);
  for (const auto& name : paged["problems"][0]["candidates"]) {
    const flashgen::KernelConfig c = flashgen::KernelConfig::from_name(name.get<std::string>());
    CHECK((c.varlen && c.paged));
    CHECK_FALSE(c.invalid_reason(90).has_value());
  }
  const std::string paged_spec =
      write_spec(dir, R"({"problems": [{"varlen": true, "page_size": 64, "batch": 8, "seqlen_q": 512, "seqlen_k": 512}]})");
  const nlohmann::json paged_from_spec =
      parse_json(run_cli({"tune", "--spec", paged_spec, "--max-candidates", "2", "--dry-run", "--json", "--arch", "90"}, dir));
  CHECK(paged_from_spec["problems"][0]["page_size"] == 64);
  CHECK(paged_from_spec["problems"][0]["candidates"][0].get<std::string>().find("_varlen_paged") != std::string::npos);
  CHECK_THAT(error_of({"tune", "--varlen", "--backward", "--page-size", "16"}),
             Catch::Contains("a packed backward has no paged kernels"));
  CHECK_THAT(error_of({"tune", "--varlen", "--page-size", "40"}), Catch::Contains("must be a multiple of 16"));
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"varlen": true, "pass": "backward",
             "page_size": 16}]})")}),
             Catch::Contains("page_size needs \"kv_cache\": true, or \"varlen\": true with the forward pass"));
  CHECK_THAT(error_of({"tune", "--varlen", "--kv-cache"}), Catch::Contains("different problems"));
  CHECK_THAT(error_of({"tune", "--varlen", "--batch", "2", "--seqlen-q", "10", "--total-q", "21"}),
             Catch::Contains("--total-q must be between the longest sequence (10) and batch * that (20), got 21"));
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"total_q": 16}]})")}),
             Catch::Contains("problems[0]: total_q and total_k need \"varlen\": true"));
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"varlen": true, "total_k": 5}]})")}),
             Catch::Contains("problems[0].total_k must be between"));
}

TEST_CASE("cli: tune --dtype e4m3 lists the FP8 forward's tiles, each writing bf16", "[cli][tune][fp8]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-fp8");
  const std::string builtin =
      flashgen::heuristic_forward_configs(flashgen::DType::kFloat8E4M3, 128, flashgen::MaskKind::kCausal, 90)
          .front()
          .name();
  for (const std::vector<std::string>& source :
       {std::vector<std::string>{"--dtype", "e4m3", "--causal", "bottom-right"},
        {"--spec", write_spec(dir, R"({"problems": [{"dtype": "e4m3", "causal": "bottom-right"}]})")}}) {
    std::vector<std::string> command{"tune", "--max-candidates", "4", "--dry-run", "--json", "--arch", "90"};
    command.insert(command.end(), source.begin(), source.end());
    const nlohmann::json fp8 = parse_json(run_cli(command, dir));
    REQUIRE(fp8["problems"].size() == 1);
    CHECK(fp8["problems"][0]["dtype"] == "e4m3");
    const nlohmann::json& candidates = fp8["problems"][0]["candidates"];
    REQUIRE(candidates.size() == 4);
    CHECK(candidates[0] == builtin);
    for (const auto& name : candidates) {
      CHECK(name.get<std::string>().rfind("fwd_sm90_e4m3_d128_", 0) == 0);
      CHECK(name.get<std::string>().find("_obf16") != std::string::npos);
    }
  }
  auto error_of = [&](std::vector<std::string> command) {
    command.push_back("--dry-run");
    const auto r = run_cli(command, dir);
    CHECK(r.exit_code == 2);
    return r.err;
  };
  CHECK_THAT(error_of({"tune", "--dtype", "e5m2", "--backward"}),
             Catch::Contains("dtype e5m2 is the FP8 forward's, of dense batches: not with the backward"));
  CHECK_THAT(error_of({"tune", "--dtype", "e4m3", "--kv-cache"}),
             Catch::Contains("not with a KV cache (an FP8 cache is cache_dtype)"));
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"dtype": "e4m3", "varlen": true}]})")}),
             Catch::Contains("problems[0]: dtype e4m3 is the FP8 forward's, of dense batches: not with a packed batch"));
  CHECK_THAT(error_of({"tune", "--spec", write_spec(dir, R"({"problems": [{"dtype": "fp8"}]})")}),
             Catch::Contains(R"(problems[0].dtype must be "fp16", "bf16", "e4m3" or "e5m2")"));
}

TEST_CASE("cli: tune --dtype e4m3 stores a winner that run --dtype e4m3 then uses, for either output type",
          "[gpu][cli][tune][fp8]") {
  FLASHGEN_REQUIRE_GPU();
  {
    flashgen::ScopedContext scope;
    FLASHGEN_REQUIRE_SM90(scope);
  }
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-fp8-gpu");
  const std::vector<std::string> problem = {"--dtype", "e4m3", "--causal", "bottom-right", "--batch", "2",
                                            "--heads-q", "4", "--heads-kv", "2", "--seqlen-q", "1000",
                                            "--seqlen-k", "1000"};
  std::vector<std::string> tune = {"tune", "--max-candidates", "3", "--json"};
  tune.insert(tune.end(), problem.begin(), problem.end());
  const nlohmann::json tuned = parse_json(run_cli(tune, dir));
  REQUIRE(tuned.is_object());
  CHECK(tuned["problem"].get<std::string>().rfind("fwd|e4m3|d128|causal|g2|", 0) == 0);
  CHECK(tuned["passed"] == 3);
  const std::string winner = tuned["winner"].get<std::string>();
  CHECK(winner.rfind("fwd_sm90_e4m3_d128_", 0) == 0);
  CHECK(winner.find("_obf16") != std::string::npos);

  // The stored tiles serve both outputs: an fp16 run takes the winner with its own output type.
  for (const std::string out : {"bf16", "fp16"}) {
    std::vector<std::string> run = {"run", "--json", "--iters", "2", "--warmup", "1", "--out-dtype", out};
    run.insert(run.end(), problem.begin(), problem.end());
    const nlohmann::json ran = parse_json(run_cli(run, dir));
    std::string want = winner;
    want.replace(want.find("_obf16"), 6, "_o" + out);
    CHECK(ran["config"] == want);
    CHECK(ran["reason"].get<std::string>().find("tuning database") != std::string::npos);
    CHECK(ran["check"]["pass"] == true);
  }
}

TEST_CASE("cli: tune --backward stores a winner that run --backward then uses", "[gpu][cli][tune][backward]") {
  FLASHGEN_REQUIRE_GPU();
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-backward");
  const std::vector<std::string> problem = {"--backward", "--head-dim", "64", "--causal", "bottom-right",
                                            "--batch", "2", "--heads-q", "4", "--heads-kv", "2",
                                            "--seqlen-q", "600", "--seqlen-k", "600"};
  std::vector<std::string> tune = {"tune", "--max-candidates", "3", "--json"};
  tune.insert(tune.end(), problem.begin(), problem.end());
  const nlohmann::json tuned = parse_json(run_cli(tune, dir));  // one problem: one object
  REQUIRE(tuned.is_object());
  CHECK(tuned["problem"].get<std::string>().rfind("bwd|fp16|d64|causal|g2|", 0) == 0);
  CHECK(tuned["passed"] == 3);
  const std::string winner = tuned["winner"].get<std::string>();
  CHECK(winner.rfind("bwd_", 0) == 0);

  std::vector<std::string> run = {"run", "--json", "--iters", "2", "--warmup", "1"};
  run.insert(run.end(), problem.begin(), problem.end());
  const nlohmann::json ran = parse_json(run_cli(run, dir));
  CHECK(ran["config"] == winner);
  CHECK(ran["reason"].get<std::string>().find("tuning database") != std::string::npos);
}

TEST_CASE("cli: tune --kv-cache stores a module and split count that run --kv-cache then uses",
          "[gpu][cli][tune][decode]") {
  FLASHGEN_REQUIRE_GPU();
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-decode");
  const std::vector<std::string> problem = {"--kv-cache", "--page-size", "64", "--head-dim", "128", "--causal",
                                            "bottom-right", "--batch", "2", "--heads-q", "16", "--heads-kv", "4",
                                            "--seqlen-k", "4000"};
  std::vector<std::string> tune = {"tune", "--max-candidates", "4", "--json"};
  tune.insert(tune.end(), problem.begin(), problem.end());
  const nlohmann::json tuned = parse_json(run_cli(tune, dir));
  REQUIRE(tuned.is_object());
  CHECK(tuned["problem"] == "dec_paged|fp16|d128|causal|g4|q1|k4096|bh32");
  CHECK(tuned["passed"] == 4);
  const std::string winner = tuned["winner"].get<std::string>();
  const flashgen::DecodeSplitConfig config = flashgen::DecodeSplitConfig::from_name(winner);

  std::vector<std::string> run = {"run", "--json", "--iters", "2", "--warmup", "1"};
  run.insert(run.end(), problem.begin(), problem.end());
  const nlohmann::json ran = parse_json(run_cli(run, dir));
  CHECK(ran["config"] == config.config.name() + ", " + std::to_string(config.splits) + " key ranges");
  CHECK(ran["reason"].get<std::string>().find("tuning database") != std::string::npos);
  CHECK(ran["check"]["pass"] == true);
}

TEST_CASE("cli: tune --varlen stores a winner that run --varlen then uses, forward and backward",
          "[gpu][cli][tune][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-varlen");
  for (const bool backward : {false, true}) {
    std::vector<std::string> problem = {"--varlen", "--head-dim", "64", "--causal", "bottom-right", "--batch", "5",
                                        "--heads-q", "4", "--heads-kv", "2", "--seqlen-q", "700", "--seqlen-k", "700",
                                        "--total-q", "1777"};
    if (backward) problem.push_back("--backward");
    std::vector<std::string> tune = {"tune", "--max-candidates", "3", "--json"};
    tune.insert(tune.end(), problem.begin(), problem.end());
    const nlohmann::json tuned = parse_json(run_cli(tune, dir));
    REQUIRE(tuned.is_object());
    CHECK(tuned["problem"].get<std::string>().rfind(backward ? "bwd_varlen|fp16|d64|causal|g2|" : "fwd_varlen|fp16|d64|causal|g2|", 0) == 0);
    CHECK(tuned["passed"] == 3);
    const std::string winner = tuned["winner"].get<std::string>();
    CHECK(winner.find("_varlen") != std::string::npos);

    std::vector<std::string> run = {"run", "--json", "--iters", "2", "--warmup", "1"};
    run.insert(run.end(), problem.begin(), problem.end());
    const nlohmann::json ran = parse_json(run_cli(run, dir));
    INFO(ran.dump());
    CHECK(ran["config"] == winner);
    CHECK(ran["reason"].get<std::string>().find("tuning database") != std::string::npos);
    CHECK(ran["check"]["pass"] == true);
    CHECK(ran["check"]["rows"].get<int>() > 0);
    CHECK(ran["varlen"]["total_q"] == 1777);
    CHECK(ran["varlen"]["seqlens_q"].size() == 5);
  }
}
