// `flashgen db report` run as a process (FLASHGEN_CLI_PATH) over a small database: the page written, its filters,
// and the mistakes it refuses. The page's content is tests/tuner/test_report.cpp's. CPU only.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "catch.hpp"
#include "support/cli_runner.hpp"
#include "support/temp_dir.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"

namespace {

using flashgen::testing::CliResult;
using flashgen::testing::parse_json;
using flashgen::testing::run_cli;
using flashgen::testing::TempDir;
namespace fs = std::filesystem;
using Json = nlohmann::json;
using namespace flashgen;

ProblemKey causal_key() { return forward_problem_key(DType::kFloat16, 128, MaskKind::kCausal, 1, 4096, 4096, 64); }
ProblemKey plain_key() { return forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 1024, 1024, 256); }

// Two problems on an sm_90 device, each with the heuristic's first two configs as candidates.
fs::path make_store(const TempDir& dir) {
  const fs::path path = dir.path() / "tuning.sqlite";
  TuningStore store(path);
  const DeviceFingerprint device{"NVIDIA H100 80GB HBM3", 90, 132, 13000, "13.0", "2"};
  for (const ProblemKey& key : {causal_key(), plain_key()}) {
    const std::vector<KernelConfig> configs = heuristic_forward_configs(key.dtype, key.head_dim, key.mask, 90);
    REQUIRE(configs.size() >= 2);
    std::vector<CandidateResult> rows;
    for (size_t i = 0; i < 2; ++i) {
      CandidateResult r;
      r.config = configs[i];
      r.median_ms = 1.0 + 0.5 * static_cast<double>(i);
      r.samples = 30;
      rows.push_back(r);
    }
    store.record(device, key, rows, configs[0], 1.0);
  }
  return path;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("cli db report: writes the page, filtered by problem and GPU", "[cli][report]") {
  const TempDir dir{"flashgen-cli-report"};
  const fs::path db = make_store(dir);
  const fs::path page = dir.path() / "report.html";
  const CliResult all = run_cli({"db", "report", "--db", db.string(), "--html", page.string()}, dir);
  INFO(all.err);
  REQUIRE(all.exit_code == 0);
  CHECK(all.out.find("wrote " + page.string() + ": 2 problems, 2 sweeps, 4 candidates") != std::string::npos);
  const std::string html = read_text(page);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  for (const ProblemKey& key : {causal_key(), plain_key()})
    CHECK(html.find("data-problem=\"" + key.id() + "\"") != std::string::npos);

  const Json filtered = parse_json(run_cli({"db", "report", "--db", db.string(), "--html", page.string(), "--problem",
                                            "|causal|", "--gpu", "H100", "--arch", "90", "--json"},
                                           dir));
  CHECK(filtered.at("problems") == 1);
  CHECK(filtered.at("candidates") == 2);
  const std::string one = read_text(page);
  CHECK(one.find("data-problem=\"" + causal_key().id() + "\"") != std::string::npos);
  CHECK(one.find("data-problem=\"" + plain_key().id() + "\"") == std::string::npos);
}

TEST_CASE("cli db report: refuses a filter that matches nothing and a missing --html", "[cli][report]") {
  const TempDir dir{"flashgen-cli-report"};
  const fs::path db = make_store(dir);
  const fs::path page = dir.path() / "report.html";
  const CliResult none = run_cli({"db", "report", "--db", db.string(), "--html", page.string(), "--gpu", "A100"}, dir);
  CHECK(none.exit_code == 2);
  CHECK(none.err.find("no stored sweep") != std::string::npos);
  CHECK(!fs::exists(page));
  const CliResult no_html = run_cli({"db", "report", "--db", db.string()}, dir);
  CHECK(no_html.exit_code == 2);
  CHECK(no_html.err.find("--html") != std::string::npos);
  const CliResult wrong_action = run_cli({"db", "list", "--db", db.string(), "--html", page.string()}, dir);
  CHECK(wrong_action.exit_code == 2);
  CHECK(wrong_action.err.find("--html does not apply to 'db list'") != std::string::npos);
}
