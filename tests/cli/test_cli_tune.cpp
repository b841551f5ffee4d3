// `flashgen tune` problem lists: a JSON spec, sharding by --shard or the Slurm / Open MPI rank, the
// shard's own database file, --devices workers, and --dry-run (no GPU needed), windows and soft caps, plus
// spec errors naming the field; --candidates and its refusals; on a GPU, a worker killed by a candidate is restarted
// without it; --variant's user variants, listed on their base class's tiles and tuned under their own key. The
// backward, KV-cache and packed passes: test_cli_tune_passes.cpp.
#include <stdlib.h>

#include <fstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/cli_runner.hpp"
#include "support/temp_dir.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/store.hpp"

using flashgen::testing::NoSchedulerEnv;
using flashgen::testing::parse_json;
using flashgen::testing::run_cli;
using flashgen::testing::TempDir;
using flashgen::testing::write_spec;

namespace {

// The problems a dry run lists, each listed entry (its candidates dropped) written back as a spec and listed
// again: a spec's entries must read back as the same problems.
nlohmann::json relist(const TempDir& dir, const nlohmann::json& listed) {
  nlohmann::json again = {{"problems", nlohmann::json::array()}};
  for (nlohmann::json entry : listed["problems"]) {
    entry.erase("candidates");
    again["problems"].push_back(entry);
  }
  return parse_json(run_cli({"tune", "--spec", write_spec(dir, again.dump()), "--dry-run", "--json"}, dir));
}

// What `tune ARGS --dry-run` prints on stderr, having refused the arguments (exit 2).
std::string refused_tune(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "tune");
  args.push_back("--dry-run");
  const auto r = run_cli(args, dir);
  CHECK(r.exit_code == 2);
  return r.err;
}

// A prefix-LM mask over no base mask with a per-head bias from a buffer; values to tune with when `values` is set.
std::string write_variant(const TempDir& dir, bool values) {
  const std::string path = (dir.path() / "variant.json").string();
  std::ofstream(path) << R"({"mask_mod": "return kv_idx < prefix || kv_idx <= q_idx;",
    "score_bias": "return head_bias[head];",
    "buffers": [{"name": "head_bias", "type": "float32")"
                      << (values ? R"(, "values": [0.5, -0.25, 0.125, 0.0])" : "") << R"(}],
    "scalars": [{"name": "prefix", "type": "int32")" << (values ? R"(, "value": 40)" : "") << "}]}";
  return path;
}

const char* kSpec = R"({"max_candidates": 12, "problems": [
  {"dtype": "bf16", "head_dim": 128, "causal": "bottom-right", "seqlen_q": 8192, "seqlen_k": 8192, "batch": 2},
  {"head_dim": 64}, {"head_dim": 256, "heads_q": 8, "heads_kv": 8}, {"head_dim": 96}, {"head_dim": 32}]})";

}  // namespace

TEST_CASE("cli: tune --spec --dry-run lists the problems and the database", "[cli][tune]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const std::string spec = write_spec(dir, kSpec);
  const nlohmann::json all = parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json", "--head-dim", "80"}, dir));
  CHECK(all["shard"]["count"] == 1);
  CHECK(all["max_candidates"] == 12);
  CHECK(all["db"] == (dir.path() / "default.sqlite").string());
  REQUIRE(all["problems"].size() == 5);
  CHECK(all["problems"][0]["dtype"] == "bf16");
  CHECK(all["problems"][0]["causal"] == "bottom-right");
  CHECK(all["problems"][0]["batch"] == 2);
  CHECK(all["problems"][2]["heads_kv"] == 8);
  // Fields a spec entry omits take the flags' values.
  CHECK(all["problems"][1]["heads_q"] == 16);
  CHECK(all["problems"][1]["dtype"] == "fp16");
  const nlohmann::json capped =
      parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json", "--max-candidates", "5"}, dir));
  CHECK(capped["max_candidates"] == 5);
}

TEST_CASE("cli: tune takes windows and soft caps from flags and specs", "[cli][tune][window][softcap]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  // Flags: FlashAttention's causal window (the right side 0 under --causal bottom-right) and a cap; the
  // candidates are the window's soft-capped kernels.
  const nlohmann::json flags = parse_json(run_cli({"tune", "--window", "1024,7", "--causal", "bottom-right", "--softcap",
                                                   "30", "--dry-run", "--json", "--max-candidates", "4"},
                                                  dir));
  REQUIRE(flags["problems"].size() == 1);
  const nlohmann::json& flagged = flags["problems"][0];
  CHECK(flagged["window"] == nlohmann::json::array({1024, 0}));
  CHECK(flagged["softcap"] == 30.0);
  REQUIRE(!flagged["candidates"].empty());
  for (const auto& name : flagged["candidates"]) {
    CHECK(name.get<std::string>().find("_window") != std::string::npos);
    CHECK(name.get<std::string>().find("_softcap") != std::string::npos);
  }
  // A spec: each entry's window about the diagonal its "causal" picks; (-1, 0) is the causal mask itself. The
  // listed entries read back as the same problems.
  const std::string spec = write_spec(dir, R"({"problems": [
    {"window": [100, 20], "pass": "backward", "head_dim": 64},
    {"causal": "bottom-right", "window": [256, 9], "softcap": 5},
    {"causal": "bottom-right", "window": [-1, 3]}]})");
  const nlohmann::json listed = parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json"}, dir));
  REQUIRE(listed["problems"].size() == 3);
  CHECK(listed["problems"][0]["window"] == nlohmann::json::array({100, 20}));
  CHECK(listed["problems"][0]["candidates"][0].get<std::string>().find("bwd_") == 0);
  CHECK(listed["problems"][1]["window"] == nlohmann::json::array({256, 0}));
  CHECK(listed["problems"][1]["softcap"] == 5.0);
  CHECK(listed["problems"][2]["causal"] == "bottom-right");
  CHECK_FALSE(listed["problems"][2].contains("window"));
  CHECK(relist(dir, listed)["problems"] == listed["problems"]);
  // Refusals name the field or the flag.
  auto error_of = [&](const std::vector<std::string>& args) { return refused_tune(dir, args); };
  CHECK(error_of({"--window", "5"}).find("--window expects L,R") != std::string::npos);
  CHECK(error_of({"--window", "5,0", "--causal", "top-left"}).find("--window is aligned bottom-right") !=
        std::string::npos);
  CHECK(error_of({"--spec", write_spec(dir, R"({"problems": [{"window": [5]}]})")})
            .find("problems[0].window must be [left, right]") != std::string::npos);
  CHECK(error_of({"--spec", write_spec(dir, R"({"problems": [{"window": [5, -2]}]})")})
            .find("problems[0].window must be [left, right]") != std::string::npos);
  CHECK(error_of({"--spec", write_spec(dir, R"({"problems": [{"window": [5, 0], "causal": "top-left"}]})")})
            .find("problems[0].window is aligned bottom-right") != std::string::npos);
  CHECK(error_of({"--spec", write_spec(dir, R"({"problems": [{"softcap": -1}]})")})
            .find("problems[0].softcap must be a number >= 0") != std::string::npos);
}

TEST_CASE("cli: tune takes chunks from flags and specs, on the chunked window's kernels", "[cli][tune][chunk]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  // Chunked causal attention (Llama 4's): the window (-1, 0) with its chunk, swept on the chunked window's kernels.
  const nlohmann::json flags = parse_json(
      run_cli({"tune", "--chunk", "8192", "--causal", "bottom-right", "--dry-run", "--json", "--max-candidates", "3"},
              dir));
  REQUIRE(flags["problems"].size() == 1);
  const nlohmann::json& flagged = flags["problems"][0];
  CHECK(flagged["chunk"] == 8192);
  CHECK(flagged["window"] == nlohmann::json::array({-1, 0}));
  REQUIRE(!flagged["candidates"].empty());
  for (const auto& name : flagged["candidates"]) CHECK(name.get<std::string>().find("_chunk") != std::string::npos);
  // A spec's chunks: over no mask and inside a window; the listed entries read back as the same problems.
  const std::string spec = write_spec(dir, R"({"problems": [
    {"chunk": 1024},
    {"causal": "bottom-right", "window": [256, 0], "chunk": 4096, "pass": "backward"}]})");
  const nlohmann::json listed = parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json"}, dir));
  REQUIRE(listed["problems"].size() == 2);
  CHECK(listed["problems"][0]["chunk"] == 1024);
  CHECK(listed["problems"][0]["window"] == nlohmann::json::array({-1, -1}));
  CHECK(listed["problems"][1]["chunk"] == 4096);
  CHECK(listed["problems"][1]["window"] == nlohmann::json::array({256, 0}));
  CHECK(relist(dir, listed)["problems"] == listed["problems"]);
  auto error_of = [&](const std::vector<std::string>& args) { return refused_tune(dir, args); };
  CHECK(error_of({"--chunk", "64", "--causal", "top-left"}).find("--chunk is aligned bottom-right") !=
        std::string::npos);
  CHECK(error_of({"--chunk", "0"}).find("--chunk") != std::string::npos);
  CHECK(error_of({"--spec", write_spec(dir, R"({"problems": [{"chunk": -2}]})")})
            .find("problems[0].chunk must be an integer >= 0") != std::string::npos);
  CHECK(error_of({"--spec", write_spec(dir, R"({"problems": [{"chunk": 64, "causal": "top-left"}]})")})
            .find("problems[0].chunk is aligned bottom-right") != std::string::npos);
}

TEST_CASE("cli: tune takes a values' head dim of its own from flags and specs", "[cli][tune][value_dim]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const nlohmann::json flags = parse_json(run_cli(
      {"tune", "--head-dim", "192", "--head-dim-v", "128", "--dtype", "bf16", "--dry-run", "--json", "--max-candidates",
       "3"},
      dir));
  REQUIRE(flags["problems"].size() == 1);
  const nlohmann::json& flagged = flags["problems"][0];
  CHECK(flagged["head_dim"] == 192);
  CHECK(flagged["head_dim_v"] == 128);
  REQUIRE(!flagged["candidates"].empty());
  for (const auto& name : flagged["candidates"]) CHECK(name.get<std::string>().find("_d192_v128_") != std::string::npos);
  // A spec's entry reads back as the same problem; the queries' own dim as the values' is no dim of their own.
  const nlohmann::json listed = parse_json(run_cli(
      {"tune", "--spec", write_spec(dir, R"({"problems": [{"head_dim": 192, "head_dim_v": 128}, {"head_dim_v": 128}]})"),
       "--dry-run", "--json"},
      dir));
  REQUIRE(listed["problems"].size() == 2);
  CHECK(listed["problems"][0]["head_dim_v"] == 128);
  CHECK_FALSE(listed["problems"][1].contains("head_dim_v"));
  CHECK(relist(dir, listed)["problems"] == listed["problems"]);
  // The backward's candidates take both dims.
  const nlohmann::json backward = parse_json(run_cli(
      {"tune", "--head-dim", "192", "--head-dim-v", "128", "--backward", "--dry-run", "--json", "--max-candidates",
       "3"},
      dir));
  REQUIRE(!backward["problems"][0]["candidates"].empty());
  for (const auto& name : backward["problems"][0]["candidates"]) {
    CHECK(name.get<std::string>().rfind("bwd_", 0) == 0);
    CHECK(name.get<std::string>().find("_d192_v128_") != std::string::npos);
  }
  // A latent cache (MLA's decode) tunes the latent kernel's stages and split counts.
  const nlohmann::json latent = parse_json(run_cli(
      {"tune", "--head-dim", "576", "--head-dim-v", "512", "--kv-cache", "--page-size", "64", "--heads-q", "128",
       "--heads-kv", "1", "--dtype", "bf16", "--dry-run", "--json", "--max-candidates", "3"},
      dir));
  REQUIRE(!latent["problems"][0]["candidates"].empty());
  for (const auto& name : latent["problems"][0]["candidates"]) {
    CHECK(name.get<std::string>().rfind("dec_sm90_bf16_d576_v512_", 0) == 0);
  }
}

TEST_CASE("cli: tune shards a spec by --shard and by the scheduler's rank", "[cli][tune]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const std::string spec = write_spec(dir, kSpec);
  const std::string db = (dir.path() / "sweep.sqlite").string();
  const nlohmann::json first =
      parse_json(run_cli({"tune", "--spec", spec, "--shard", "1/2", "--db", db, "--dry-run", "--json"}, dir));
  CHECK(first["shard"]["source"] == "--shard");
  CHECK(first["db"] == (dir.path() / "sweep.shard1-of-2.sqlite").string());
  REQUIRE(first["problems"].size() == 2);  // problems 1 and 3
  CHECK(first["problems"][0]["head_dim"] == 64);
  CHECK(first["problems"][1]["head_dim"] == 96);

  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NTASKS", "3", 1);
  const nlohmann::json slurm = parse_json(run_cli({"tune", "--spec", spec, "--db", db, "--dry-run", "--json"}, dir));
  CHECK(slurm["shard"]["index"] == 2);
  CHECK(slurm["shard"]["source"] == "SLURM_PROCID/SLURM_NTASKS");
  CHECK(slurm["db"] == (dir.path() / "sweep.shard2-of-3.sqlite").string());
  REQUIRE(slurm["problems"].size() == 1);
  CHECK(slurm["problems"][0]["head_dim"] == 256);
  // --shard wins over the environment.
  const nlohmann::json flag = parse_json(run_cli({"tune", "--spec", spec, "--shard", "0/1", "--dry-run", "--json"}, dir));
  CHECK(flag["problems"].size() == 5);

  // A task of a job array: its index among the array's (a batch script's SLURM_PROCID=0 alone splits nothing), split
  // again by its rank when the job step has several tasks. A dry run without --json plans nothing.
  ::unsetenv("SLURM_NTASKS");
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_ARRAY_TASK_ID", "7", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "3", 1);
  ::setenv("SLURM_ARRAY_TASK_STEP", "2", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  const auto array = run_cli({"tune", "--spec", spec, "--db", db, "--dry-run"}, dir);
  CHECK(array.out.find("shard 2 of 4 (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT): 1 of 5 problems into " +
                       (dir.path() / "sweep.shard2-of-4.sqlite").string()) == 0);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_PROCID", "1", 1);
  const auto steps = run_cli({"tune", "--spec", spec, "--dry-run"}, dir);
  CHECK(steps.out.find("shard 5 of 8 (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT and SLURM_PROCID/SLURM_NTASKS)") ==
        0);
  ::setenv("SLURM_ARRAY_TASK_ID", "8", 1);  // not on the array's steps: no shard to guess
  const auto off_step = run_cli({"tune", "--spec", spec, "--dry-run"}, dir);
  CHECK(off_step.exit_code == 2);
  CHECK(off_step.err.find("SLURM_ARRAY_TASK_ID=8 is not one of") != std::string::npos);
  for (const char* name : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_COUNT"})
    ::unsetenv(name);

  ::unsetenv("SLURM_PROCID");
  ::unsetenv("SLURM_NTASKS");
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  const nlohmann::json mpi = parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json"}, dir));
  CHECK(mpi["shard"]["source"] == "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE");
  CHECK(mpi["problems"].size() == 2);  // problems 0 and 4
  ::setenv("OMPI_COMM_WORLD_RANK", "4", 1);
  const auto bad_rank = run_cli({"tune", "--spec", spec, "--dry-run"}, dir);
  CHECK(bad_rank.exit_code == 2);
  CHECK(bad_rank.err.find("OMPI_COMM_WORLD_RANK=4") != std::string::npos);

  // One problem given by flags is tuned whole, into --db, whatever the scheduler says; --shard needs a spec.
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  const nlohmann::json single =
      parse_json(run_cli({"tune", "--head-dim", "64", "--db", db, "--dry-run", "--json"}, dir));
  CHECK(single["shard"]["count"] == 1);
  CHECK(single["db"] == db);
  CHECK(single["problems"].size() == 1);
  const auto shard_without_spec = run_cli({"tune", "--head-dim", "64", "--shard", "1/2", "--dry-run", "--json"}, dir);
  CHECK(shard_without_spec.exit_code == 2);
  CHECK(shard_without_spec.out.find("--shard splits the problems of a --spec file") != std::string::npos);
  // A --devices worker writes the file its supervisor names, not a shard file beside it.
  const nlohmann::json worker = parse_json(
      run_cli({"tune", "--worker", "--spec", spec, "--shard", "1/2", "--db", db, "--dry-run", "--json"}, dir));
  CHECK(worker["db"] == db);
  CHECK(worker["problems"].size() == 2);
}

TEST_CASE("cli: tune --candidates times exactly the named configs of the problem", "[cli][tune]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const std::string a = "fwd_sm80_bf16_d64_m128_n64_w4_s2_causal", b = "fwd_sm90_bf16_d64_m192_n128_s2_causal_ovl";
  const std::string db = (dir.path() / "candidates.sqlite").string();
  const nlohmann::json plan = parse_json(run_cli({"tune", "--dtype", "bf16", "--head-dim", "64", "--causal", "top-left",
                                                  "--candidates", a + ", " + b + " ," + a, "--db", db, "--dry-run",
                                                  "--json"},
                                                 dir));
  REQUIRE(plan["problems"].size() == 1);
  CHECK(plan["problems"][0]["candidates"] == nlohmann::json::array({a, b}));  // trimmed, each once

  auto refused = [&](const std::vector<std::string>& args, const std::string& why) {
    std::vector<std::string> command = {"tune", "--dry-run", "--db", db};
    command.insert(command.end(), args.begin(), args.end());
    const auto r = run_cli(command, dir);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(why) != std::string::npos);
  };
  // Another dtype, head_dim or mask kind than the problem's; a backward name for a forward problem and
  // the reverse; the other dQ strategy; a name that does not parse; nothing named; a spec.
  refused({"--head-dim", "64", "--candidates", a}, "is not a config of the problem fwd|fp16|d64|none");
  refused({"--dtype", "bf16", "--head-dim", "128", "--causal", "top-left", "--candidates", a}, "is not a config");
  refused({"--dtype", "bf16", "--head-dim", "64", "--candidates", a}, "is not a config");
  refused({"--candidates", "bwd_sm80_fp16_d128_m64_n128_w8_s2"}, "is a backward config; this problem tunes the forward");
  refused({"--backward", "--candidates", a}, "is a forward config; this problem tunes the backward");
  refused({"--backward", "--deterministic", "--head-dim", "128", "--candidates",
           flashgen::heuristic_backward_config(flashgen::DType::kFloat16, 128, flashgen::MaskKind::kNone, false, 90)
               .name()},
          "is not a config of the problem bwd_det|");
  refused({"--candidates", "fwd_sm80_fp16_d128_m64"}, "--candidates: config name");
  refused({"--backward", "--candidates", "xyz"}, "--candidates: config name 'xyz'");
  refused({"--candidates", ","}, "--candidates needs at least one config name");
  refused({"--spec", write_spec(dir, R"({"problems": [{}]})"), "--candidates", a}, "does not go with --spec");
  // It needs a database of its own (its winner replaces the bucket's stored one), and a dry run says so too.
  for (const bool dry_run : {false, true}) {
    std::vector<std::string> command = {"tune", "--dtype", "bf16", "--head-dim", "64", "--causal", "top-left",
                                        "--candidates", a};
    if (dry_run) command.push_back("--dry-run");
    const auto no_db = run_cli(command, dir);
    CHECK(no_db.exit_code == 2);
    CHECK(no_db.err.find("--candidates needs --db") != std::string::npos);
  }
}

TEST_CASE("cli: tune refuses bad shards and specs, naming the field", "[cli][tune]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  auto error_of = [&](const std::string& spec_text) {
    const auto r = run_cli({"tune", "--spec", write_spec(dir, spec_text), "--dry-run"}, dir);
    CHECK(r.exit_code == 2);
    return r.err;
  };
  CHECK(error_of(R"({"problems": []})").find("\"problems\" must be a non-empty array") != std::string::npos);
  CHECK(error_of(R"({"problems": [{"head_dim": "x"}]})").find("problems[0].head_dim must be a positive integer") !=
        std::string::npos);
  CHECK(error_of(R"({"problems": [{"dtype": "fp32"}]})").find("problems[0].dtype") != std::string::npos);
  CHECK(error_of(R"({"problems": [{"heads_q": 6, "heads_kv": 4}]})").find("multiple of heads_kv") !=
        std::string::npos);
  CHECK(error_of(R"({"problems": [{"seqlen": 4}]})").find("unknown field \"seqlen\"") != std::string::npos);
  CHECK(error_of(R"({"grid": 1, "problems": [{}]})").find("unknown field \"grid\"") != std::string::npos);
  CHECK(error_of("[1, 2]").find("must be a JSON object") != std::string::npos);
  CHECK(error_of(R"({"problems": [{"pass": "both"}]})").find("problems[0].pass") != std::string::npos);
  CHECK(error_of(R"({"problems": [{"deterministic": true}]})").find("deterministic needs") != std::string::npos);
  // A head_dim no kernel family takes stops the dry run as it would stop the sweep.
  CHECK(error_of(R"({"problems": [{"head_dim": 65}]})").find("problems[0]: no forward config for head_dim 65") !=
        std::string::npos);
  const auto flags = run_cli({"tune", "--head-dim", "65", "--dry-run"}, dir);
  CHECK(flags.exit_code == 2);
  CHECK(flags.err.find("no forward config for head_dim 65") != std::string::npos);
  // Keys of 512 plan both passes (the Hopper family's forward, the sm80 family's column slices backward).
  const auto wide = run_cli({"tune", "--head-dim", "512", "--seqlen-q", "256", "--seqlen-k", "256", "--dry-run"}, dir);
  INFO(wide.err);
  CHECK(wide.exit_code == 0);
  const auto wide_backward = run_cli({"tune", "--head-dim", "512", "--backward", "--dry-run"}, dir);
  INFO(wide_backward.err);
  CHECK(wide_backward.exit_code == 0);
  const auto wider_backward = run_cli({"tune", "--head-dim", "520", "--backward", "--dry-run"}, dir);
  CHECK(wider_backward.exit_code == 2);
  CHECK(wider_backward.err.find("no backward config for head_dim 520") != std::string::npos);
  for (const char* shard : {"2/2", "-1/2", "1/0", "1", "a/b", "1/2/3"}) {
    const auto r = run_cli({"tune", "--shard", shard, "--dry-run"}, dir);
    INFO("--shard " << shard << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--shard must be I/N") != std::string::npos);
  }
}

TEST_CASE("cli: tune --devices splits the problems over worker GPUs", "[cli][tune]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const std::string spec = write_spec(dir, kSpec);
  const nlohmann::json plan = parse_json(run_cli({"tune", "--spec", spec, "--devices", "3,1", "--dry-run", "--json"}, dir));
  REQUIRE(plan["workers"].size() == 2);
  CHECK(plan["workers"][0]["device"] == 3);
  CHECK(plan["workers"][0]["problems"].size() == 3);  // problems 0, 2, 4
  CHECK(plan["workers"][1]["device"] == 1);
  CHECK(plan["workers"][1]["problems"].size() == 2);
  // Each worker's problems as a dry run without --devices lists them: spec entries with their candidates.
  for (const auto& worker : plan["workers"])
    for (const auto& problem : worker["problems"]) {
      CHECK(problem.contains("head_dim"));
      CHECK_FALSE(problem["candidates"].empty());
    }
  for (const char* devices : {"0,0", "x", "1,-2", ""}) {
    const auto r = run_cli({"tune", "--devices", devices, "--dry-run"}, dir);
    INFO("--devices '" << devices << "': " << r.err);
    CHECK(r.exit_code == 2);
  }
}

TEST_CASE("cli: a worker that crashes is restarted without its candidate", "[gpu][cli][tune]") {
  FLASHGEN_REQUIRE_GPU();
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  int arch = 0;
  {
    flashgen::ScopedContext context;
    arch = flashgen::device_sm(context.device());
  }
  // The built-in config is always among the candidates: make it crash its worker.
  const std::string victim =
      flashgen::heuristic_forward_config(flashgen::DType::kFloat16, 64, flashgen::MaskKind::kNone, arch).name();
  ::setenv("FLASHGEN_TEST_CRASH_CONFIG", victim.c_str(), 1);
  const std::string db = (dir.path() / "sweep.sqlite").string();
  const nlohmann::json summary =
      parse_json(run_cli({"tune", "--head-dim", "64", "--seqlen-q", "1024", "--seqlen-k", "1024", "--max-candidates",
                          "4", "--devices", "0", "--db", db, "--json"},
                         dir));
  ::unsetenv("FLASHGEN_TEST_CRASH_CONFIG");
  CHECK(summary["failed_workers"].empty());
  REQUIRE(summary["crashes"].size() == 1);
  CHECK(summary["crashes"][0]["config"] == victim);
  CHECK(summary["winners_merged"] == 1);
  CHECK_FALSE(std::filesystem::exists(db + ".workers"));

  const flashgen::TuningStore store(db, /*read_only=*/true);
  const std::vector<flashgen::StoredChoice> winners = store.winners();
  REQUIRE(winners.size() == 1);
  CHECK(flashgen::config_name(winners[0].config) != victim);
  bool recorded = false;
  for (const flashgen::CandidateResult& c : store.candidates(winners[0].device, winners[0].problem))
    if (flashgen::config_name(c.config) == victim)
      recorded = c.status == flashgen::CandidateStatus::kCrashed && c.detail.find("signal 6") != std::string::npos;
  CHECK(recorded);
}

TEST_CASE("cli: a dry run's problem entries read back as a spec, as --devices workers read theirs", "[cli][tune]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune");
  const std::string spec = write_spec(dir, R"({"problems": [{}, {"backward": true, "deterministic": true},
    {"varlen": true, "batch": 8, "seqlen_q": 512, "seqlen_k": 640, "total_q": 3000},
    {"kv_cache": true, "page_size": 32, "seqlen_k": 4096}]})");
  // "backward" is not a spec field: the entry above is refused, the rest are what the workers get.
  CHECK(run_cli({"tune", "--spec", spec, "--dry-run"}, dir).exit_code == 2);
  const std::string good = write_spec(dir, R"({"problems": [{}, {"pass": "backward", "deterministic": true},
    {"varlen": true, "batch": 8, "seqlen_q": 512, "seqlen_k": 640, "total_q": 3000},
    {"kv_cache": true, "page_size": 32, "seqlen_k": 4096}]})");
  const nlohmann::json first = parse_json(run_cli({"tune", "--spec", good, "--dry-run", "--json", "--max-candidates", "1"}, dir));
  nlohmann::json entries = first["problems"];
  REQUIRE(entries.size() == 4);
  for (auto& entry : entries) entry.erase("candidates");
  const std::string again = write_spec(dir, nlohmann::json{{"problems", entries}}.dump());
  const nlohmann::json second = parse_json(run_cli({"tune", "--spec", again, "--dry-run", "--json", "--max-candidates", "1"}, dir));
  CHECK(second["problems"] == first["problems"]);
  CHECK(first["problems"][2]["total_k"] == 8 * (640 + 10) / 2);
  CHECK(first["problems"][3]["page_size"] == 32);
}

TEST_CASE("cli: tune --variant lists its base class's tiles, no clusters under its mask, and refuses what it cannot "
          "tune",
          "[cli][tune][user_variant]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-variant");
  const std::string variant = write_variant(dir, false);
  const nlohmann::json listed =
      parse_json(run_cli({"tune", "--variant", variant, "--head-dim", "64", "--heads-q", "4", "--heads-kv", "4",
                          "--max-candidates", "60", "--dry-run", "--json", "--arch", "90"},
                         dir));
  const nlohmann::json& candidates = listed["problems"].at(0)["candidates"];
  CHECK(candidates.size() >= 20);
  for (const auto& name : candidates) {
    INFO(name);
    CHECK(name.get<std::string>().find("_c2") == std::string::npos);   // a user mask takes no cluster
    CHECK(name.get<std::string>().find("_u") == std::string::npos);    // stored as the base class's tiles
  }
  CHECK(refused_tune(dir, {"--variant", variant, "--varlen"}).find("--variant tunes dense problems") !=
        std::string::npos);
  CHECK(refused_tune(dir, {"--variant", variant, "--devices", "0,1"}).find("--devices") != std::string::npos);
  CHECK(refused_tune(dir, {"--variant", variant, "--softcap", "30"}).find("takes the place of --softcap") !=
        std::string::npos);
  const std::string no_grad = (dir.path() / "no_grad.json").string();
  std::ofstream(no_grad) << R"({"score_mod": "return score * 0.5f;"})";
  CHECK(refused_tune(dir, {"--variant", no_grad, "--backward"}).find("no score_grad") != std::string::npos);
}

TEST_CASE("cli: tune --variant stores its winner under the variant's key, called with the JSON's values",
          "[gpu][cli][tune][user_variant]") {
  FLASHGEN_REQUIRE_GPU();
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-tune-variant");
  const std::vector<std::string> problem = {"--dtype", "bf16", "--head-dim", "64", "--batch", "1", "--heads-q", "4",
                                            "--heads-kv", "2", "--seqlen-q", "300", "--seqlen-k", "300"};
  const std::string db = (dir.path() / "variant.sqlite").string();
  std::vector<std::string> tune = {"tune", "--variant", write_variant(dir, true), "--max-candidates", "3", "--json",
                                   "--db", db};
  tune.insert(tune.end(), problem.begin(), problem.end());
  const nlohmann::json tuned = parse_json(run_cli(tune, dir));
  REQUIRE(tuned.is_object());
  const std::string id = tuned["problem"].get<std::string>();
  INFO(id);
  CHECK(id.rfind("fwd|bf16|d64|none_u", 0) == 0);
  CHECK(tuned["passed"] == 3);
  CHECK(tuned["winner"].get<std::string>().find("_u") == std::string::npos);
  const flashgen::TuningStore store(db, /*read_only=*/true);
  REQUIRE(store.winners().size() == 1);
  CHECK(store.winners()[0].problem.id() == id);

  // Without the values the functions read, nothing is swept.
  std::vector<std::string> bare = {"tune", "--variant", write_variant(dir, false), "--db", db, "--force"};
  bare.insert(bare.end(), problem.begin(), problem.end());
  const auto r = run_cli(bare, dir);
  INFO(r.err);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("buffer 'head_bias' needs \"values\"") != std::string::npos);

  // A value its type cannot hold is refused, naming it.
  const std::string fractional = (dir.path() / "fractional.json").string();
  std::ofstream(fractional) << R"({"mask_mod": "return kv_idx < prefix || kv_idx <= q_idx;",
    "scalars": [{"name": "prefix", "type": "int32", "value": 40.5}]})";
  bare[2] = fractional;
  const auto f = run_cli(bare, dir);
  INFO(f.err);
  CHECK(f.exit_code != 0);
  CHECK(f.err.find("scalar 'prefix' value must be a whole number, got 40.5") != std::string::npos);
}
