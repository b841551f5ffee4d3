// `flashgen db` and `flashgen tune` run as processes (FLASHGEN_CLI_PATH) over a tuning database built in a
// temporary folder: list, show, export/import, merge and prune, and tune's no-device error. CPU only.
#include <stdio.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/cli_runner.hpp"
#include "support/temp_dir.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"

namespace {

using flashgen::testing::CliResult;
using flashgen::testing::TempDir;
using flashgen::testing::parse_json;
using flashgen::testing::run_cli;
namespace fs = std::filesystem;
using Json = nlohmann::json;
using namespace flashgen;

ProblemKey fp16_key() { return forward_problem_key(DType::kFloat16, 128, MaskKind::kNone, 1, 4096, 4096, 64); }
ProblemKey bf16_key() { return forward_problem_key(DType::kBFloat16, 64, MaskKind::kCausal, 4, 1024, 1024, 32); }

// A store with one sm_90 winner for each key, the fp16 one with a second, failed candidate row.
fs::path make_store(const TempDir& dir) {
  const fs::path path = dir.path() / "tuning.sqlite";
  TuningStore store(path);
  const DeviceFingerprint device = fingerprint_for_arch(90);
  for (const ProblemKey& key : {fp16_key(), bf16_key()}) {
    CandidateResult best;
    best.config = heuristic_forward_config(key.dtype, key.head_dim, key.mask, 90);
    best.median_ms = key == fp16_key() ? 1.25 : 0.5;
    best.spread = 0.01;
    best.samples = 25;
    std::vector<CandidateResult> rows = {best};
    if (key == fp16_key()) {
      CandidateResult failed;
      failed.config = heuristic_forward_configs(key.dtype, key.head_dim, key.mask, 90).back();
      failed.status = CandidateStatus::kCompileError;
      failed.detail = "ptxas: too many resources requested";
      if (flashgen::config_name(failed.config) != flashgen::config_name(best.config)) rows.push_back(failed);
    }
    store.record(device, key, rows, best.config, best.median_ms);
  }
  return path;
}

// (problem id, config name) of each winner that `db list --json` prints, in order.
std::vector<std::pair<std::string, std::string>> listed(const Json& array) {
  std::vector<std::pair<std::string, std::string>> winners;
  for (const Json& entry : array) winners.emplace_back(entry.at("problem"), entry.at("config"));
  return winners;
}

}  // namespace

TEST_CASE("cli db: list --json prints one entry per winner", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path db = make_store(dir);
  const Json j = parse_json(run_cli({"db", "list", "--db", db.string(), "--json"}, dir));
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 2);
  for (const Json& entry : j) {
    CHECK(entry.at("device") == fingerprint_for_arch(90).id());
    CHECK(entry.at("median_ms").get<double>() > 0);
  }
  const CliResult text = run_cli({"db", "list", "--db", db.string()}, dir);
  CHECK(text.exit_code == 0);
  CHECK(text.out.find(fp16_key().id()) != std::string::npos);
  CHECK(text.out.find(bf16_key().id()) != std::string::npos);
}

TEST_CASE("cli db: a --db that names no regular file is refused by name", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const std::string missing = (dir.path() / "typo.sqlite").string();
  for (const char* action : {"list", "export"}) {
    const CliResult result = run_cli({"db", action, "--db", missing}, dir);
    INFO(action << ": " << result.err);
    CHECK(result.exit_code == 2);
    CHECK(result.err.find("no database file '" + missing + "'") != std::string::npos);
    CHECK(!fs::exists(missing));
  }
  const CliResult device = run_cli({"db", "list", "--db", "/dev/null"}, dir);
  CHECK(device.exit_code == 2);
  CHECK(device.err.find("--db '/dev/null' is not a regular file") != std::string::npos);
}

TEST_CASE("cli db: export then import into a new file keeps the winners", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path db = make_store(dir);
  const fs::path exported = dir.path() / "export.json";
  const fs::path copy = dir.path() / "copy.sqlite";
  REQUIRE(run_cli({"db", "export", "--db", db.string(), "-o", exported.string()}, dir).exit_code == 0);
  REQUIRE(fs::file_size(exported) > 0);
  const CliResult imported = run_cli({"db", "import", exported.string(), "--db", copy.string(), "--json"}, dir);
  CHECK(parse_json(imported).at("winners_added_or_replaced") == 2);
  const Json original = parse_json(run_cli({"db", "list", "--db", db.string(), "--json"}, dir));
  const Json copied = parse_json(run_cli({"db", "list", "--db", copy.string(), "--json"}, dir));
  CHECK(listed(copied) == listed(original));
  // Importing the same export again changes no winner.
  CHECK(parse_json(run_cli({"db", "import", exported.string(), "--db", copy.string(), "--json"}, dir))
            .at("winners_added_or_replaced") == 0);
  SECTION("-o replaces a file whole through a file beside it, and writes other targets in place") {
    std::ofstream(exported, std::ios::trunc) << "old text that is longer than nothing";
    REQUIRE(run_cli({"db", "export", "--db", db.string(), "-o", exported.string()}, dir).exit_code == 0);
    CHECK(parse_json(run_cli({"db", "import", exported.string(), "--db", copy.string(), "--json"}, dir))
              .at("winners_added_or_replaced") == 0);
    for (const auto& entry : fs::directory_iterator(dir.path()))
      CHECK(entry.path().filename().string().find(".tmp-") == std::string::npos);
    const CliResult to_null = run_cli({"db", "export", "--db", db.string(), "-o", "/dev/null"}, dir);
    CHECK(to_null.exit_code == 0);
    CHECK(fs::is_character_file("/dev/null"));
  }
}

TEST_CASE("cli db: merge combines database files", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path db = make_store(dir);
  const fs::path fp16_only = dir.path() / "fp16.sqlite";
  {
    TuningStore store(fp16_only);
    store.import_json(TuningStore(db, true).export_json());
    store.prune("", bf16_key().class_id());
  }
  const fs::path merged = dir.path() / "merged.sqlite";
  const Json j = parse_json(run_cli({"db", "merge", merged.string(), fp16_only.string(), db.string(), "--json"}, dir));
  CHECK(j.at("winners_added_or_replaced") == 2);  // fp16 from the first file, bf16 from the second
  const Json list = parse_json(run_cli({"db", "list", "--db", merged.string(), "--json"}, dir));
  CHECK(list.size() == 2);
  SECTION("a missing input exits 2 and leaves OUT alone") {
    const fs::path out = dir.path() / "never.sqlite";
    const CliResult result = run_cli({"db", "merge", out.string(), (dir.path() / "missing.sqlite").string()}, dir);
    CHECK(result.exit_code == 2);
    CHECK_FALSE(fs::exists(out));
  }
  SECTION("a damaged input exits 2 naming it, leaves OUT alone and is not exported as empty") {
    const fs::path garbage = dir.path() / "garbage.sqlite";
    std::string bytes;
    for (int i = 0; i < 8192; ++i) bytes.push_back(static_cast<char>((i * 131 + 7) % 251));
    std::ofstream(garbage, std::ios::binary) << bytes;
    const fs::path out = dir.path() / "never.sqlite";
    const CliResult merge = run_cli({"db", "merge", out.string(), db.string(), garbage.string(), "--json"}, dir);
    CHECK(merge.exit_code == 2);
    CHECK(merge.out.find("garbage.sqlite' is") != std::string::npos);
    CHECK(merge.out.find("nothing was merged") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    const CliResult exported = run_cli({"db", "export", "--db", garbage.string()}, dir);
    CHECK(exported.exit_code == 2);
    CHECK(exported.out.empty());
    CHECK(exported.err.find("garbage.sqlite is damaged") != std::string::npos);
  }
}

TEST_CASE("cli db: a file that is not a flashgen database is never replaced by a command writing to it", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path db = make_store(dir);
  const fs::path notes = dir.path() / "notes.txt";
  const std::string text = "my notes, not a database\n";
  std::ofstream(notes, std::ios::binary) << text;
  const fs::path exported = dir.path() / "export.json";
  REQUIRE(run_cli({"db", "export", "--db", db.string(), "-o", exported.string()}, dir).exit_code == 0);
  const CliResult merge = run_cli({"db", "merge", notes.string(), db.string(), "--json"}, dir);
  CHECK(merge.exit_code == 2);
  CHECK(parse_json(merge).at("error").get<std::string>().find("nothing was merged") != std::string::npos);
  const CliResult import = run_cli({"db", "import", exported.string(), "--db", notes.string()}, dir);
  CHECK(import.exit_code == 2);
  CHECK(import.err.find("nothing was imported") != std::string::npos);
  std::ifstream kept(notes, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == text);
  for (const auto& entry : fs::directory_iterator(dir.path()))
    CHECK(entry.path().filename().string().find(".damaged-") == std::string::npos);

  SECTION("export -o naming the database itself is refused and the database kept") {
    const CliResult self = run_cli({"db", "export", "--db", db.string(), "-o", db.string()}, dir);
    CHECK(self.exit_code == 2);
    CHECK(self.err.find("is the database being exported") != std::string::npos);
    CHECK(parse_json(run_cli({"db", "list", "--db", db.string(), "--json"}, dir)).size() == 2);
  }
  SECTION("an import the store refuses creates no database file") {
    const fs::path empty_doc = dir.path() / "empty.json";
    std::ofstream(empty_doc) << "{}";
    const fs::path never = dir.path() / "never.sqlite";
    CHECK(run_cli({"db", "import", empty_doc.string(), "--db", never.string()}, dir).exit_code == 2);
    CHECK_FALSE(fs::exists(never));
  }
  SECTION("an empty --db or -o is a usage error") {
    CHECK(run_cli({"db", "list", "--db", ""}, dir).exit_code == 2);
    CHECK(run_cli({"db", "export", "--db", db.string(), "-o", ""}, dir).exit_code == 2);
    // A folder is no database, also as the stem of a shard's file (it named a hidden ".shard1-of-3").
    CHECK(run_cli({"tune", "--dry-run", "--shard", "1/3", "--db", dir.path().string() + "/"}, dir).exit_code == 2);
    CHECK(run_cli({"tune", "--dry-run", "--db", dir.path().string()}, dir).exit_code == 2);
  }
}

TEST_CASE("cli db: a missing or damaged database is refused, not read or pruned as empty", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path missing = dir.path() / "typo.sqlite";
  const CliResult prune_missing = run_cli({"db", "prune", "--all", "--db", missing.string()}, dir);
  CHECK(prune_missing.exit_code == 2);
  CHECK(prune_missing.err.find("no database file") != std::string::npos);
  CHECK_FALSE(fs::exists(missing));
  const fs::path garbage = dir.path() / "garbage.sqlite";
  std::string bytes;
  for (int i = 0; i < 8192; ++i) bytes.push_back(static_cast<char>((i * 131 + 7) % 251));
  std::ofstream(garbage, std::ios::binary) << bytes;
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"db", "list"}, {"db", "show", "fwd"}, {"db", "prune", "--all"}}) {
    std::vector<std::string> words = command;
    words.insert(words.end(), {"--db", garbage.string()});
    const CliResult r = run_cli(words, dir);
    INFO(command[1] << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("is damaged") != std::string::npos);
  }
  std::ifstream kept(garbage, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == bytes);  // not moved aside or replaced
  const CliResult directory = run_cli({"db", "list", "--db", dir.path().string()}, dir);
  CHECK(directory.exit_code == 2);
  CHECK(directory.err.find("is a directory") != std::string::npos);
  const CliResult import_directory = run_cli({"db", "import", dir.path().string(), "--db", missing.string()}, dir);
  CHECK(import_directory.exit_code == 2);
  CHECK(import_directory.err.find("is a directory") != std::string::npos);
}

TEST_CASE("cli db: prune needs a filter or --all", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path db = make_store(dir);
  const CliResult refused = run_cli({"db", "prune", "--db", db.string(), "--json"}, dir);
  CHECK(refused.exit_code == 2);
  CHECK(parse_json(refused).at("status") == "invalid_argument");
  CHECK(parse_json(run_cli({"db", "list", "--db", db.string(), "--json"}, dir)).size() == 2);

  // A whole problem id where a class is meant prunes nothing, and the note names the class it holds.
  const CliResult by_id = run_cli({"db", "prune", "--db", db.string(), "--problem-class", bf16_key().id()}, dir);
  CHECK(by_id.exit_code == 0);
  CHECK(by_id.out.find("removed 0 rows") != std::string::npos);
  CHECK(by_id.err.find("a problem id's first five fields ('" + bf16_key().class_id() + "')") != std::string::npos);
  const CliResult pruned =
      run_cli({"db", "prune", "--db", db.string(), "--problem-class", bf16_key().class_id(), "--json"}, dir);
  CHECK(pruned.exit_code == 0);
  const Json report = parse_json(pruned);
  CHECK(report.at("winners_removed") == 1);
  CHECK(report.at("removed") == 2);  // the bf16 winner and its one candidate row
  const Json left = parse_json(run_cli({"db", "list", "--db", db.string(), "--json"}, dir));
  REQUIRE(left.size() == 1);
  CHECK(left[0].at("problem") == fp16_key().id());
}

TEST_CASE("cli db: show prints the matching winners with their candidate rows", "[cli]") {
  const TempDir dir{"flashgen-cli-db"};
  const fs::path db = make_store(dir);
  const Json j = parse_json(run_cli({"db", "show", "fp16", "--db", db.string(), "--json"}, dir));
  REQUIRE(j.size() == 1);
  CHECK(j[0].at("problem") == fp16_key().id());
  const Json& rows = j[0].at("candidates");
  REQUIRE(!rows.empty());
  bool winner_row = false;
  for (const Json& row : rows) winner_row |= row.at("config") == j[0].at("config") && row.at("status") == "ok";
  CHECK(winner_row);

  const CliResult text = run_cli({"db", "show", fp16_key().id(), "--db", db.string()}, dir);
  CHECK(text.exit_code == 0);
  CHECK(text.out.find(j[0].at("config").get<std::string>()) != std::string::npos);
  CHECK(run_cli({"db", "show", "--db", db.string()}, dir).exit_code == 2);  // no problem text
  CHECK(run_cli({"db", "frobnicate", "--db", db.string()}, dir).exit_code == 2);
}

TEST_CASE("cli tune: without a GPU exits 3 with status no_device", "[cli]") {
  std::string why;
  if (driver_available(&why)) {
    WARN("skipped: a CUDA driver is present (tune needs a GPU sweep)");
    return;
  }
  const TempDir dir{"flashgen-cli-db"};
  const CliResult result = run_cli({"tune", "--json", "--max-candidates", "4"}, dir);
  CHECK(result.exit_code == 3);
  const Json j = parse_json(result);
  CHECK(j.at("status") == "no_device");
  CHECK(j.at("error").is_string());
  CHECK(run_cli({"tune", "--heads-q", "16", "--heads-kv", "3"}, dir).exit_code == 2);  // arguments first

  // Workers on GPUs: the GPU is looked for before any file is made.
  const fs::path spec = dir.path() / "spec.json";
  std::ofstream(spec) << R"({"problems": [{"head_dim": 128}]})";
  const fs::path db = dir.path() / "workers.sqlite";
  const CliResult workers = run_cli({"tune", "--spec", spec.string(), "--devices", "0,1", "--db", db.string(), "--json"}, dir);
  CHECK(workers.exit_code == 3);
  CHECK(parse_json(workers).at("status") == "no_device");
  CHECK_FALSE(fs::exists(db));
  CHECK_FALSE(fs::exists(dir.path() / "workers.sqlite.workers"));
}
