// Tests for tuner/store's file: the schema and its migrations, damaged, foreign and too-new files moved aside or
// refused, read-only stores, where the file lives, and several processes writing one file at once.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "support/raw_sqlite.hpp"
#include "support/store_fixtures.hpp"
#include "support/temp_dir.hpp"
#include "tuner/store.hpp"

using flashgen::DType;
using flashgen::ProblemKey;
using flashgen::TuningStore;
using namespace flashgen::testing;  // the store fixtures, RawSqlite and TempDir

namespace fs = std::filesystem;

namespace {

std::vector<std::string> damaged_files(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".damaged-") != std::string::npos)
      names.push_back(entry.path().filename().string());
  return names;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Sets an environment variable for one scope and restores the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("a new store has schema version 3 and the five tables", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "nested" / "tuning.sqlite";  // parent folders are created
  { TuningStore store(path); }
  REQUIRE(fs::exists(path));
  RawSqlite raw(path);
  CHECK(raw.column("PRAGMA user_version") == std::vector<std::string>{"3"});
  CHECK(raw.column("PRAGMA journal_mode") == std::vector<std::string>{"wal"});
  const auto tables = raw.column("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
  CHECK(tables == std::vector<std::string>{"candidates", "decisions", "devices", "problems", "winners"});
}

TEST_CASE("a version-1 file answers lookups read-only and is migrated read-write", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "v1.sqlite";
  {
    TuningStore store(path);
    store.record(device(), problem(1024, 1024), {candidate(config(128, 64), 0.5)}, config(128, 64), 0.5);
  }
  {
    RawSqlite raw(path);  // as schema version 1 left it
    raw.exec("DROP TABLE decisions; ALTER TABLE problems DROP COLUMN head_dim_v; PRAGMA user_version = 1;");
  }
  {
    const TuningStore read_only(path, /*read_only=*/true);
    CHECK_FALSE(read_only.unreadable().has_value());
    const auto found = read_only.lookup_exact(device(), problem(1024, 1024));
    REQUIRE(found.has_value());
    CHECK(found->config == config(128, 64));
    CHECK_FALSE(read_only.decision(device(), problem(1024, 1024)).has_value());
    CHECK(read_only.export_json()["winners"].size() == 1);
  }
  {
    TuningStore store(path);
    store.record(device(), problem(1024, 1024), {candidate(config(128, 64), 0.5)}, config(128, 64), 0.5,
                 flashgen::WinnerDecision{config(128, 64).name(), "built-in choice", "the incumbent is the fastest", 0});
    CHECK(store.decision(device(), problem(1024, 1024)).has_value());
  }
  RawSqlite raw(path);
  CHECK(raw.column("PRAGMA user_version") == std::vector<std::string>{"3"});
  CHECK(raw.column("SELECT head_dim_v FROM problems") == std::vector<std::string>{"0"});
}

TEST_CASE("a file of garbage bytes is moved aside and replaced", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "tuning.sqlite";
  std::string garbage;
  for (int i = 0; i < 8192; ++i) garbage.push_back(static_cast<char>((i * 131 + 7) % 251));
  std::ofstream(path, std::ios::binary) << garbage;

  // Read-only: an empty store, the file left where it is.
  {
    TuningStore read_only(path, /*read_only=*/true);
    CHECK_FALSE(read_only.lookup_exact(device(), problem(64, 64)).has_value());
    CHECK(read_only.winners().empty());
    REQUIRE(read_only.unreadable().has_value());
    CHECK(read_only.unreadable()->rfind("damaged", 0) == 0);
  }
  CHECK_FALSE(TuningStore(dir.path() / "missing.sqlite", /*read_only=*/true).unreadable().has_value());
  CHECK(damaged_files(dir.path()).empty());

  TuningStore store(path);
  const auto moved = damaged_files(dir.path());
  REQUIRE(moved.size() == 1);
  CHECK(moved[0].rfind("tuning.sqlite.damaged-", 0) == 0);
  CHECK(read_bytes(dir.path() / moved[0]) == garbage);
  record_sweep(store, device(), problem(64, 64), 0.01);
  CHECK(store.lookup_exact(device(), problem(64, 64)).has_value());
}

TEST_CASE("a truncated database is moved aside and replaced", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "tuning.sqlite";
  {
    TuningStore store(path);
    for (int64_t q = 1; q <= (int64_t{1} << 20); q *= 2)
      for (int64_t bh = 1; bh <= 64; bh *= 2) record_sweep(store, device(), problem(q, q, bh), 0.5);
  }  // closing the last connection checkpoints the WAL into the main file
  const auto size = fs::file_size(path);
  REQUIRE(size >= 16 * 4096);
  CHECK_FALSE(fs::exists(path.string() + "-wal"));
  fs::resize_file(path, size / 2);

  TuningStore store(path);
  CHECK(damaged_files(dir.path()).size() == 1);
  CHECK(store.winners().empty());
  record_sweep(store, device(), problem(64, 64), 0.01);
  CHECK(store.winners().size() == 1);
}

TEST_CASE("a database of a newer schema is refused and left untouched", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "tuning.sqlite";
  {
    RawSqlite raw(path);
    raw.exec("CREATE TABLE future (x INTEGER); PRAGMA user_version = 99;");
  }
  const std::string before = read_bytes(path);

  for (bool read_only : {false, true}) {
    std::string message;
    flashgen::Status status = flashgen::Status::kSuccess;
    try {
      TuningStore store(path, read_only);
    } catch (const flashgen::Error& e) {
      message = e.what();
      status = e.status();
    }
    INFO(message);
    CHECK(status == flashgen::Status::kUnsupported);
    CHECK(message.find("newer flashgen") != std::string::npos);
    CHECK(message.find("99") != std::string::npos);
  }
  CHECK(read_bytes(path) == before);
  CHECK(damaged_files(dir.path()).empty());
}

TEST_CASE("version-0 files are migrated; foreign databases are moved aside", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path zero_bytes = dir.path() / "zero.sqlite";
  std::ofstream(zero_bytes).close();
  const fs::path no_tables = dir.path() / "empty.sqlite";
  {
    RawSqlite raw(no_tables);
    raw.exec("CREATE TABLE scratch (x); DROP TABLE scratch;");
    REQUIRE(raw.column("PRAGMA user_version") == std::vector<std::string>{"0"});
  }
  for (const fs::path& path : {zero_bytes, no_tables}) {
    INFO(path);
    {
      TuningStore store(path);
      record_sweep(store, device(), problem(64, 64), 0.01);
      CHECK(store.winners().size() == 1);
    }
    RawSqlite raw(path);
    CHECK(raw.column("PRAGMA user_version") == std::vector<std::string>{std::to_string(TuningStore::kSchemaVersion)});
    CHECK(raw.column("SELECT count(*) FROM winners") == std::vector<std::string>{"1"});
  }
  CHECK(damaged_files(dir.path()).empty());

  // A version-0 file that already holds someone else's tables is not ours to add tables to.
  const fs::path foreign = dir.path() / "foreign.sqlite";
  {
    RawSqlite raw(foreign);
    raw.exec("CREATE TABLE devices (serial TEXT);");
  }
  {  // read-only it reads as empty, and says why (db export and merge refuse it)
    const TuningStore read_only(foreign, /*read_only=*/true);
    CHECK(read_only.winners().empty());
    REQUIRE(read_only.unreadable().has_value());
    CHECK(read_only.unreadable()->find("not a flashgen database") != std::string::npos);
  }
  TuningStore store(foreign);
  CHECK(damaged_files(dir.path()).size() == 1);
  record_sweep(store, device(), problem(64, 64), 0.01);
  CHECK(store.winners().size() == 1);
}

TEST_CASE("read-only stores: a missing file is empty and writes are refused", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "missing.sqlite";
  {
    TuningStore store(path, /*read_only=*/true);
    CHECK_FALSE(store.lookup_exact(device(), problem(64, 64)).has_value());
    CHECK_FALSE(store.lookup_nearest(device(), problem(64, 64)).has_value());
    CHECK_FALSE(store.has(device(), problem(64, 64)));
    CHECK(store.winners().empty());
    CHECK(store.export_json()["winners"].empty());
  }
  CHECK_FALSE(fs::exists(path));

  { TuningStore writer(path); record_sweep(writer, device(), problem(64, 64), 0.01); }
  TuningStore store(path, /*read_only=*/true);
  CHECK(store.lookup_exact(device(), problem(64, 64)).has_value());
  CHECK_THROWS_AS(record_sweep(store, device(), problem(128, 128), 0.01), flashgen::Error);
  CHECK_THROWS_AS(store.prune("", ""), flashgen::Error);
}

TEST_CASE("default_path follows FLASHGEN_TUNING_DB, XDG_DATA_HOME, then HOME", "[tuner][store]") {
  ScopedEnv db("FLASHGEN_TUNING_DB", "/data/tuning.sqlite");
  ScopedEnv xdg("XDG_DATA_HOME", "/xdg");
  ScopedEnv home("HOME", "/home/someone");
  CHECK(TuningStore::default_path() == fs::path("/data/tuning.sqlite"));
  {
    ScopedEnv unset_db("FLASHGEN_TUNING_DB", nullptr);
    CHECK(TuningStore::default_path() == fs::path("/xdg/flashgen/tuning.sqlite"));
    ScopedEnv unset_xdg("XDG_DATA_HOME", nullptr);
    CHECK(TuningStore::default_path() == fs::path("/home/someone/.local/share/flashgen/tuning.sqlite"));
  }
}

TEST_CASE("several processes record into one new file without losing rows", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "shared.sqlite";  // does not exist yet: the children race to create it
  constexpr int kProcesses = 4;
  constexpr int kProblemsEach = 50;

  // The children wait on this pipe so they open the file and write at the same moment.
  int start[2];
  REQUIRE(pipe(start) == 0);
  std::vector<pid_t> children;
  for (int child = 0; child < kProcesses; ++child) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(start[1]);
      char byte;
      (void)!read(start[0], &byte, 1);  // returns 0 when the parent closes its end
      int code = 0;
      try {
        TuningStore store(path);
        for (int i = 0; i < kProblemsEach; ++i) {
          // Distinct per child (gqa ratio) and per i (seqlen buckets).
          const ProblemKey p = problem(int64_t{1} << (i / 7), int64_t{1} << (i % 7), 64, DType::kFloat16, child + 1);
          record_sweep(store, device(), p, 0.01 * (i + 1));
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", child, e.what());
        code = 1;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  close(start[0]);
  close(start[1]);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TuningStore store(path);
  const auto winners = store.winners();
  CHECK(winners.size() == kProcesses * kProblemsEach);
  std::set<std::string> ids;
  for (const auto& w : winners) ids.insert(w.problem.id());
  CHECK(ids.size() == kProcesses * kProblemsEach);
  CHECK(store.export_json()["candidates"].size() == 3 * kProcesses * kProblemsEach);
  CHECK(damaged_files(dir.path()).empty());
}
