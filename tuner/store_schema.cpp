// The tuning database's file format (see store_schema.hpp): schema version 3, the migrations that bring
// an older file to it, WAL and the damaged-or-foreign checks run before TuningStore touches a file.
#include "tuner/store_schema.hpp"

#include <chrono>
#include <iterator>
#include <memory>
#include <thread>

#include "flashgen/error.hpp"
#include "tuner/store.hpp"

namespace flashgen {
namespace {

namespace fs = std::filesystem;
using sqlite::exec;
using sqlite::Statement;
using sqlite::Transaction;
using sqlite::user_version;

// Writers wait this long for another process's transaction before failing with "database is locked".
constexpr int kBusyTimeoutMs = 10000;

// ---- Schema -------------------------------------------------------------------------------------

// Version 1. Device and problem rows keep every field of their key so rows can be rebuilt; the text ids
// are the keys the lookups use. A window key's bucket and shape live in its mask text (problem_key.hpp's
// mask_text: "window1024c"), so the schema needs no column for them and older rows read as they did.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE devices (
  id TEXT PRIMARY KEY,
  gpu_name TEXT NOT NULL,
  sm INTEGER NOT NULL,
  sm_count INTEGER NOT NULL,
  driver_version INTEGER NOT NULL,
  nvrtc_version TEXT NOT NULL,
  generator_version TEXT NOT NULL
);
CREATE TABLE problems (
  id TEXT PRIMARY KEY,
  class_id TEXT NOT NULL,
  family TEXT NOT NULL,
  dtype TEXT NOT NULL,
  head_dim INTEGER NOT NULL,
  mask TEXT NOT NULL,
  gqa_ratio INTEGER NOT NULL,
  seqlen_q_bucket INTEGER NOT NULL,
  seqlen_k_bucket INTEGER NOT NULL,
  batch_heads_bucket INTEGER NOT NULL
);
CREATE INDEX problems_by_class ON problems (class_id);
CREATE TABLE candidates (
  device_id TEXT NOT NULL REFERENCES devices (id),
  problem_id TEXT NOT NULL REFERENCES problems (id),
  config_name TEXT NOT NULL,
  config_json TEXT NOT NULL,
  status TEXT NOT NULL,
  median_ms REAL NOT NULL,
  spread REAL NOT NULL,
  samples INTEGER NOT NULL,
  detail TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (device_id, problem_id, config_name)
);
CREATE TABLE winners (
  device_id TEXT NOT NULL REFERENCES devices (id),
  problem_id TEXT NOT NULL REFERENCES problems (id),
  config_name TEXT NOT NULL,
  config_json TEXT NOT NULL,
  median_ms REAL NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (device_id, problem_id)
);
)sql";

// Version 2: how each winner was decided against the incumbent it would replace (tune()'s never-regress rule), in a
// table of its own so that the tables lookups read keep version 1's columns (a read-only store of version 1 still
// answers lookups).
constexpr const char* kSchemaV2 = R"sql(
CREATE TABLE decisions (
  device_id TEXT NOT NULL REFERENCES devices (id),
  problem_id TEXT NOT NULL REFERENCES problems (id),
  incumbent TEXT NOT NULL,
  incumbent_source TEXT NOT NULL,
  decision TEXT NOT NULL,
  margin REAL NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (device_id, problem_id)
);
)sql";

// Version 3: the values' head dim of a problem whose values have one of their own (ProblemKey::head_dim_v), 0 for the
// rest, as every row written before it is. Lookups of an older file read 0 in its place.
constexpr const char* kSchemaV3 = R"sql(
ALTER TABLE problems ADD COLUMN head_dim_v INTEGER NOT NULL DEFAULT 0;
)sql";

void migrate_0_to_1(sqlite3* db) { exec(db, kSchemaV1); }
void migrate_1_to_2(sqlite3* db) { exec(db, kSchemaV2); }
void migrate_2_to_3(sqlite3* db) { exec(db, kSchemaV3); }

// kMigrations[v] upgrades a database at user_version v to v + 1; a new schema version appends a step
// (e.g. migrate_1_to_2 running ALTER TABLE) and bumps TuningStore::kSchemaVersion.
using Migration = void (*)(sqlite3*);
constexpr Migration kMigrations[] = {migrate_0_to_1, migrate_1_to_2, migrate_2_to_3};
static_assert(std::size(kMigrations) == TuningStore::kSchemaVersion, "one migration step per schema version");

// Whether the file holds any table (a version-0 file that does is another program's database).
bool holds_tables(sqlite3* db) {
  Statement tables(db, "SELECT count(*) FROM sqlite_master");
  return tables.step() && tables.integer(0) > 0;
}

// Brings the schema to kSchemaVersion. Runs in one BEGIN IMMEDIATE transaction and re-reads the version
// inside it, so processes opening a new file at once migrate it exactly once. Returns why the file is
// not a flashgen database (version 0 but already holding tables), or nullopt.
std::optional<std::string> migrate(sqlite3* db) {
  Transaction transaction(db);
  const int version = user_version(db);
  if (version >= TuningStore::kSchemaVersion) return std::nullopt;  // another process got here first
  if (version == 0 && holds_tables(db))
    return std::string("user_version 0 but the file already holds tables: not a flashgen database");
  for (int v = version; v < TuningStore::kSchemaVersion; ++v) kMigrations[v](db);
  exec(db, "PRAGMA user_version = " + std::to_string(TuningStore::kSchemaVersion));
  transaction.commit();
  return std::nullopt;
}

// ---- Checks -------------------------------------------------------------------------------------

bool is_damage_code(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT;
}

// Why the open file is damaged (not a database, or quick_check not "ok"), or nullopt. Other failures
// (I/O, permissions) throw: they are not the file's fault and moving it aside would not help.
std::optional<std::string> find_damage(sqlite3* db) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &raw, nullptr);
  if (is_damage_code(rc)) {
    sqlite3_finalize(raw);
    return std::string(sqlite3_errmsg(db));
  }
  if (rc != SQLITE_OK) {
    sqlite3_finalize(raw);
    sqlite::throw_error(db, rc, "sqlite3_prepare_v2(PRAGMA quick_check)", __FILE__, __LINE__);
  }
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> statement(raw, sqlite3_finalize);
  rc = sqlite3_step(raw);
  if (is_damage_code(rc)) return std::string(sqlite3_errmsg(db));
  if (rc != SQLITE_ROW) sqlite::throw_error(db, rc, "sqlite3_step(PRAGMA quick_check)", __FILE__, __LINE__);
  const auto* first = reinterpret_cast<const char*>(sqlite3_column_text(raw, 0));
  const std::string result = first != nullptr ? first : "";
  if (result != "ok") return "quick_check: " + result;
  return std::nullopt;
}

// WAL lets readers run beside one writer. The mode is stored in the file, so only the first open of a
// new file switches it; a file system without WAL support keeps its old mode, which is still correct.
// The switch needs an exclusive lock and SQLite returns SQLITE_BUSY for it without calling the busy
// handler (processes creating one file at once hit this), so it is retried here up to the busy timeout.
void enable_wal(sqlite3* db) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (;;) {
    {
      Statement mode(db, "PRAGMA journal_mode");
      if (mode.step() && mode.text(0) == "wal") return;
    }
    const int rc = sqlite3_exec(db, "PRAGMA journal_mode = WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return;
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() > deadline)
      sqlite::throw_error(db, rc, "sqlite3_exec(\"PRAGMA journal_mode = WAL\")", __FILE__, __LINE__);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

sqlite::Connection open_tuning_database(const fs::path& path, int flags) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  sqlite::Connection db(raw);
  if ((rc & 0xff) == SQLITE_CANTOPEN)  // the path's fault (no such folder, no permission), not flashgen's
    fail(Status::kInvalidArgument, "cannot open tuning database " + path.string() + ": " +
                                       (raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  if (rc != SQLITE_OK)
    sqlite::throw_error(raw, rc, ("sqlite3_open_v2(\"" + path.string() + "\")").c_str(), __FILE__, __LINE__);
  FLASHGEN_SQLITE_CHECK(raw, sqlite3_busy_timeout(raw, kBusyTimeoutMs));
  FLASHGEN_SQLITE_CHECK(raw, sqlite3_extended_result_codes(raw, 1));
  return db;
}

std::optional<std::string> prepare_read_write(sqlite3* db, const fs::path& path) {
  if (auto damage = find_damage(db)) return damage;
  const int version = user_version(db);
  if (version > TuningStore::kSchemaVersion) throw_newer_version(path, version);
  enable_wal(db);
  exec(db, "PRAGMA foreign_keys = ON");
  if (version < TuningStore::kSchemaVersion) return migrate(db);
  return std::nullopt;
}

std::optional<std::string> unusable_reason(sqlite3* db) {
  if (auto damage = find_damage(db)) return "damaged (" + *damage + ")";
  if (user_version(db) == 0 && holds_tables(db))
    return std::string("not a flashgen database (user_version 0 but it holds tables)");
  return std::nullopt;
}

void throw_newer_version(const fs::path& path, int version) {
  fail(Status::kUnsupported, "tuning database " + path.string() + " has schema version " +
                                 std::to_string(version) + ", newer than this flashgen's " +
                                 std::to_string(TuningStore::kSchemaVersion) +
                                 ": it was written by a newer flashgen; upgrade, or point FLASHGEN_TUNING_DB "
                                 "at another file");
}

}  // namespace flashgen
