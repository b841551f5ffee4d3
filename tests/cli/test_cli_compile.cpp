// `flashgen compile --spec`, a sweep's compile phase run as a process: it fills the kernel cache with every module
// tune's plan names (tune's dry run then compiles nothing and lists the same candidates), a rerun compiles nothing,
// shards as tune does, and refuses what it cannot do. CPU only, in a fresh temporary kernel cache.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/cli_runner.hpp"
#include "support/temp_dir.hpp"

using flashgen::testing::NoSchedulerEnv;
using flashgen::testing::parse_json;
using flashgen::testing::run_cli;
using flashgen::testing::TempDir;
using flashgen::testing::write_spec;

namespace {

// The files of a folder, by name.
std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// A forward, a backward and a KV-cache problem of head_dim 64, two candidates each.
const char* kSpec = R"({"max_candidates": 2, "problems": [
  {"head_dim": 64, "seqlen_q": 512, "seqlen_k": 512},
  {"pass": "backward", "head_dim": 64, "seqlen_q": 512, "seqlen_k": 512},
  {"kv_cache": true, "dtype": "bf16", "head_dim": 64, "batch": 8, "seqlen_k": 4096}]})";

}  // namespace

TEST_CASE("cli: compile --spec caches every kernel tune compiles, and a rerun compiles none", "[cli][nvrtc][compile]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-compile");
  const std::string spec = write_spec(dir, kSpec);
  const nlohmann::json first = parse_json(run_cli({"compile", "--spec", spec, "--arch", "sm_80", "--json"}, dir));
  CHECK(first["target"] == "sm_80");
  CHECK(first["failed"] == 0);
  CHECK(first["shard"]["count"] == 1);
  const size_t kernels = first["kernels"].size();
  CHECK(first["compiled"] == kernels);
  REQUIRE(first["problems"].size() == 3);
  std::set<std::string> names;
  for (const auto& k : first["kernels"]) names.insert(k["name"].get<std::string>());
  for (const auto& p : first["problems"]) {
    INFO(p.dump());
    REQUIRE(p["candidates"].size() == 2);
    for (const auto& c : p["candidates"]) {
      const std::string module = std::regex_replace(c.get<std::string>(), std::regex("_split[0-9]+$"), "");
      CHECK(names.count(module) == 1);
    }
  }
  // The backward's sweep runs a forward first: its module is compiled too.
  const auto& backward = first["problems"][1]["kernels"];
  CHECK(backward.size() == 3);
  CHECK(backward.back().get<std::string>().rfind("fwd_sm80_fp16_d64_", 0) == 0);

  // Tune plans the same candidates and compiles nothing doing so; every module its sweep loads is cached whole.
  const std::set<std::string> cached = files_in(dir.path() / "cache");
  const nlohmann::json dry = parse_json(run_cli({"tune", "--spec", spec, "--dry-run", "--json", "--arch", "80"}, dir));
  REQUIRE(dry["problems"].size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(dry["problems"][i]["candidates"] == first["problems"][i]["candidates"]);
  CHECK(files_in(dir.path() / "cache") == cached);
  std::vector<std::string> listed = {"compile", "--arch", "80", "--json"};
  listed.insert(listed.end(), names.begin(), names.end());
  const nlohmann::json each = parse_json(run_cli(listed, dir));
  REQUIRE(each.size() == names.size());
  for (const auto& k : each) CHECK(k["cached"] == true);

  const nlohmann::json again = parse_json(run_cli({"compile", "--spec", spec, "--arch", "80", "--json"}, dir));
  CHECK(again["compiled"] == 0);
  CHECK(again["cached"] == kernels);
  CHECK(again["failed"] == 0);
}

TEST_CASE("cli: compile --spec shards as tune does and refuses what it cannot do", "[cli][compile]") {
  const NoSchedulerEnv no_scheduler;
  const TempDir dir("flashgen-cli-compile");
  const std::string spec = write_spec(dir, kSpec);
  ::setenv("SLURM_ARRAY_TASK_ID", "2", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "3", 1);
  // A KV-cache problem alone: its decode modules compile in a second or two.
  const std::string elsewhere = (dir.path() / "elsewhere").string();
  const nlohmann::json shard =
      parse_json(run_cli({"compile", "--spec", spec, "--arch", "80", "--cache-dir", elsewhere, "--json"}, dir));
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("SLURM_ARRAY_TASK_COUNT");
  CHECK(shard["shard"]["index"] == 2);
  CHECK(shard["shard"]["source"] == "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT");
  CHECK(shard["cache_dir"] == elsewhere);
  REQUIRE(shard["problems"].size() == 1);
  CHECK(shard["problems"][0]["kv_cache"] == true);
  CHECK(shard["failed"] == 0);
  CHECK(files_in(elsewhere).size() >= 2);

  auto refused = [&](const std::vector<std::string>& args, const std::string& why) {
    const auto r = run_cli(args, dir);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(why) != std::string::npos);
  };
  refused({"compile", "--spec", spec, "--arch", "80,90"}, "--spec compiles for one --arch");
  refused({"compile", "--spec", spec, "fwd_sm80_fp16_d64_m128_n64_w4_s2"}, "name no configs");
  refused({"compile", "--spec", spec, "--sass"}, "does not go with --sass");
  refused({"compile", "--shard", "0/2", "fwd_sm80_fp16_d64_m128_n64_w4_s2"}, "--shard applies to --spec");
  refused({"compile", "--spec", spec, "--arch", "sm_80a"}, "--arch expects one of");
  std::ofstream(dir.path() / "a-file") << "x";
  refused({"compile", "--spec", spec, "--cache-dir", (dir.path() / "a-file" / "cache").string()}, "cannot be written");
}
