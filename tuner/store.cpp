// SQLite store of tuning results (see store.hpp): schema and migrations, opening with damage detection,
// BEGIN IMMEDIATE upserts so several processes can write one file, lookups, and JSON export/import.
#include "tuner/store.hpp"

#include <pwd.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <map>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>

#include "flashgen/error.hpp"

// Throws Error(kInternal) with file:line, the call and SQLite's own text unless the call returns SQLITE_OK.
#define FLASHGEN_SQLITE_CHECK(db, call_expr)                                                    \
  do {                                                                                          \
    const int flashgen_sqlite_rc_ = (call_expr);                                                \
    if (flashgen_sqlite_rc_ != SQLITE_OK)                                                       \
      ::flashgen::throw_sqlite_error((db), flashgen_sqlite_rc_, #call_expr, __FILE__, __LINE__); \
  } while (0)

namespace flashgen {
namespace {

// Error text of a failed SQLite call; the macro and the few checks that accept other codes use it.
[[noreturn]] void throw_sqlite_error(sqlite3* db, int rc, const char* call, const char* file, int line) {
  const std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  fail(Status::kInternal, std::string(file) + ":" + std::to_string(line) + ": " + call + " failed (" +
                              std::to_string(rc) + "): " + message);
}

namespace fs = std::filesystem;
using nlohmann::json;

// The first line of a statement, for error messages: enough to tell which one failed.
std::string sql_excerpt(const char* sql) {
  std::string text = sql != nullptr ? sql : "";
  const size_t start = text.find_first_not_of(" \n");
  if (start == std::string::npos) return "";
  text = text.substr(start);
  return text.substr(0, std::min(text.find('\n'), size_t{80}));
}

// Version of the export_json() document, independent of the SQLite schema version.
constexpr int kExportVersion = 1;
constexpr const char* kExportFormat = "flashgen-tuning";
// Writers wait this long for another process's transaction before failing with "database is locked".
constexpr int kBusyTimeoutMs = 10000;

struct ConnectionCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Connection = std::unique_ptr<sqlite3, ConnectionCloser>;

// One prepared statement; bind_* take 1-based indices, column readers 0-based ones.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    FLASHGEN_SQLITE_CHECK(db_, sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt_, nullptr));
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind_text(int index, const std::string& value) {
    FLASHGEN_SQLITE_CHECK(db_, sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                                                 SQLITE_TRANSIENT));
    return *this;
  }
  Statement& bind_int(int index, int64_t value) {
    FLASHGEN_SQLITE_CHECK(db_, sqlite3_bind_int64(stmt_, index, value));
    return *this;
  }
  Statement& bind_real(int index, double value) {
    FLASHGEN_SQLITE_CHECK(db_, sqlite3_bind_double(stmt_, index, value));
    return *this;
  }

  // True when a row is ready, false when the statement is done.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw_sqlite_error(db_, rc, ("sqlite3_step(\"" + sql_excerpt(sqlite3_sql(stmt_)) + "\")").c_str(), __FILE__,
                       __LINE__);
  }
  // Steps a statement that returns no rows and resets it so it can be bound and run again.
  void run() {
    while (step()) {
    }
    sqlite3_reset(stmt_);
  }

  std::string text(int column) const {
    const auto* bytes = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    return bytes != nullptr ? std::string(bytes, static_cast<size_t>(sqlite3_column_bytes(stmt_, column)))
                            : std::string();
  }
  int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  double real(int column) const { return sqlite3_column_double(stmt_, column); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Runs SQL without results; the error names the statement.
void exec(sqlite3* db, const std::string& sql) {
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK)
    throw_sqlite_error(db, rc, ("sqlite3_exec(\"" + sql_excerpt(sql.c_str()) + "\")").c_str(), __FILE__, __LINE__);
}

// BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy timeout), so a writer never
// fails halfway through with SQLITE_BUSY on a lock upgrade. Rolled back unless commit() is reached.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) { exec(db_, "BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit() {
    exec(db_, "COMMIT");
    committed_ = true;
  }

 private:
  sqlite3* db_;
  bool committed_ = false;
};

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

int user_version(sqlite3* db) {
  Statement statement(db, "PRAGMA user_version");
  return statement.step() ? static_cast<int>(statement.integer(0)) : 0;
}

// ---- Schema -------------------------------------------------------------------------------------

// Version 1. Device and problem rows keep every field of their key so rows can be rebuilt; the text ids
// are the keys the lookups use.
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

void migrate_0_to_1(sqlite3* db) { exec(db, kSchemaV1); }

// kMigrations[v] upgrades a database at user_version v to v + 1; a new schema version appends a step
// (e.g. migrate_1_to_2 running ALTER TABLE) and bumps TuningStore::kSchemaVersion.
using Migration = void (*)(sqlite3*);
constexpr Migration kMigrations[] = {migrate_0_to_1};
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

// ---- Opening ------------------------------------------------------------------------------------

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
    throw_sqlite_error(db, rc, "sqlite3_prepare_v2(PRAGMA quick_check)", __FILE__, __LINE__);
  }
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> statement(raw, sqlite3_finalize);
  rc = sqlite3_step(raw);
  if (is_damage_code(rc)) return std::string(sqlite3_errmsg(db));
  if (rc != SQLITE_ROW) throw_sqlite_error(db, rc, "sqlite3_step(PRAGMA quick_check)", __FILE__, __LINE__);
  const auto* first = reinterpret_cast<const char*>(sqlite3_column_text(raw, 0));
  const std::string result = first != nullptr ? first : "";
  if (result != "ok") return "quick_check: " + result;
  return std::nullopt;
}

[[noreturn]] void throw_newer_version(const fs::path& path, int version) {
  fail(Status::kUnsupported, "tuning database " + path.string() + " has schema version " +
                                 std::to_string(version) + ", newer than this flashgen's " +
                                 std::to_string(TuningStore::kSchemaVersion) +
                                 ": it was written by a newer flashgen; upgrade, or point FLASHGEN_TUNING_DB "
                                 "at another file");
}

Connection open_connection(const fs::path& path, int flags) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Connection db(raw);
  if ((rc & 0xff) == SQLITE_CANTOPEN)  // the path's fault (no such folder, no permission), not flashgen's
    fail(Status::kInvalidArgument, "cannot open tuning database " + path.string() + ": " +
                                       (raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  if (rc != SQLITE_OK)
    throw_sqlite_error(raw, rc, ("sqlite3_open_v2(\"" + path.string() + "\")").c_str(), __FILE__, __LINE__);
  FLASHGEN_SQLITE_CHECK(raw, sqlite3_busy_timeout(raw, kBusyTimeoutMs));
  FLASHGEN_SQLITE_CHECK(raw, sqlite3_extended_result_codes(raw, 1));
  return db;
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
      throw_sqlite_error(db, rc, "sqlite3_exec(\"PRAGMA journal_mode = WAL\")", __FILE__, __LINE__);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Checks and prepares a read-write connection: damage, schema version, WAL, foreign keys, migration.
// Returns why the file is damaged, or nullopt when the connection is ready.
std::optional<std::string> prepare_read_write(sqlite3* db, const fs::path& path) {
  if (auto damage = find_damage(db)) return damage;
  const int version = user_version(db);
  if (version > TuningStore::kSchemaVersion) throw_newer_version(path, version);
  enable_wal(db);
  exec(db, "PRAGMA foreign_keys = ON");
  if (version < TuningStore::kSchemaVersion) return migrate(db);
  return std::nullopt;
}

// Renames a damaged database (and its -wal / -shm / -journal files) to "<path>.damaged-<unix time>".
fs::path move_aside(const fs::path& path) {
  const std::string base = path.string() + ".damaged-" + std::to_string(unix_now());
  fs::path target = base;
  for (int n = 2; fs::exists(target); ++n) target = base + "-" + std::to_string(n);
  std::error_code error;
  fs::rename(path, target, error);
  if (error && fs::exists(path))
    fail(Status::kInternal, "cannot move damaged tuning database " + path.string() + " to " + target.string() +
                                ": " + error.message());
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    const fs::path side = path.string() + suffix;
    if (fs::exists(side)) fs::rename(side, target.string() + suffix, error);
  }
  return target;
}

// ---- Rows ---------------------------------------------------------------------------------------

const char* mask_text(MaskKind mask) { return mask == MaskKind::kCausal ? "causal" : "none"; }

DType parse_dtype(const std::string& text) {
  if (text == dtype_name(DType::kFloat16)) return DType::kFloat16;
  if (text == dtype_name(DType::kBFloat16)) return DType::kBFloat16;
  fail(Status::kInvalidArgument, "tuning data: unknown dtype '" + text + "'");
}

MaskKind parse_mask(const std::string& text) {
  if (text == "none") return MaskKind::kNone;
  if (text == "causal") return MaskKind::kCausal;
  fail(Status::kInvalidArgument, "tuning data: unknown mask '" + text + "'");
}

TunedConfig parse_config(const std::string& text) {
  const json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) fail(Status::kInvalidArgument, "tuning data: config_json is not JSON: " + text);
  return parsed.get<TunedConfig>();
}

void upsert_device(sqlite3* db, const std::string& id, const DeviceFingerprint& d) {
  Statement statement(db, R"sql(
    INSERT INTO devices (id, gpu_name, sm, sm_count, driver_version, nvrtc_version, generator_version)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (id) DO UPDATE SET gpu_name = excluded.gpu_name, sm = excluded.sm,
      sm_count = excluded.sm_count, driver_version = excluded.driver_version,
      nvrtc_version = excluded.nvrtc_version, generator_version = excluded.generator_version)sql");
  statement.bind_text(1, id).bind_text(2, d.gpu_name).bind_int(3, d.sm).bind_int(4, d.sm_count);
  statement.bind_int(5, d.driver_version).bind_text(6, d.nvrtc_version).bind_text(7, d.generator_version);
  statement.run();
}

void upsert_problem(sqlite3* db, const std::string& id, const ProblemKey& p) {
  Statement statement(db, R"sql(
    INSERT INTO problems (id, class_id, family, dtype, head_dim, mask, gqa_ratio, seqlen_q_bucket,
                          seqlen_k_bucket, batch_heads_bucket)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
    ON CONFLICT (id) DO UPDATE SET class_id = excluded.class_id, family = excluded.family,
      dtype = excluded.dtype, head_dim = excluded.head_dim, mask = excluded.mask,
      gqa_ratio = excluded.gqa_ratio, seqlen_q_bucket = excluded.seqlen_q_bucket,
      seqlen_k_bucket = excluded.seqlen_k_bucket, batch_heads_bucket = excluded.batch_heads_bucket)sql");
  statement.bind_text(1, id).bind_text(2, p.class_id()).bind_text(3, p.family).bind_text(4, dtype_name(p.dtype));
  statement.bind_int(5, p.head_dim).bind_text(6, mask_text(p.mask)).bind_int(7, p.gqa_ratio);
  statement.bind_int(8, p.seqlen_q_bucket).bind_int(9, p.seqlen_k_bucket).bind_int(10, p.batch_heads_bucket);
  statement.run();
}

void upsert_candidate(Statement& statement, const std::string& device_id, const std::string& problem_id,
                      const CandidateResult& c, int64_t updated_at) {
  statement.bind_text(1, device_id).bind_text(2, problem_id).bind_text(3, config_name(c.config));
  statement.bind_text(4, json(c.config).dump()).bind_text(5, c.status).bind_real(6, c.median_ms);
  statement.bind_real(7, c.spread).bind_int(8, c.samples).bind_text(9, c.detail).bind_int(10, updated_at);
  statement.run();
}

constexpr const char* kUpsertCandidate = R"sql(
  INSERT INTO candidates (device_id, problem_id, config_name, config_json, status, median_ms, spread,
                          samples, detail, updated_at)
  VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
  ON CONFLICT (device_id, problem_id, config_name) DO UPDATE SET config_json = excluded.config_json,
    status = excluded.status, median_ms = excluded.median_ms, spread = excluded.spread,
    samples = excluded.samples, detail = excluded.detail, updated_at = excluded.updated_at)sql";

// Column lists and readers shared by the winner queries: w = winners, d = devices, p = problems.
constexpr const char* kWinnerColumns = R"sql(
  SELECT d.gpu_name, d.sm, d.sm_count, d.driver_version, d.nvrtc_version, d.generator_version,
         p.family, p.dtype, p.head_dim, p.mask, p.gqa_ratio, p.seqlen_q_bucket, p.seqlen_k_bucket,
         p.batch_heads_bucket, w.config_json, w.median_ms, w.device_id, w.problem_id
  FROM winners w JOIN devices d ON d.id = w.device_id JOIN problems p ON p.id = w.problem_id )sql";

DeviceFingerprint read_device(const Statement& s, int first) {
  DeviceFingerprint d;
  d.gpu_name = s.text(first);
  d.sm = static_cast<int>(s.integer(first + 1));
  d.sm_count = static_cast<int>(s.integer(first + 2));
  d.driver_version = static_cast<int>(s.integer(first + 3));
  d.nvrtc_version = s.text(first + 4);
  d.generator_version = s.text(first + 5);
  return d;
}

ProblemKey read_problem(const Statement& s, int first) {
  ProblemKey p;
  p.family = s.text(first);
  p.dtype = parse_dtype(s.text(first + 1));
  p.head_dim = static_cast<int>(s.integer(first + 2));
  p.mask = parse_mask(s.text(first + 3));
  p.gqa_ratio = static_cast<int>(s.integer(first + 4));
  p.seqlen_q_bucket = s.integer(first + 5);
  p.seqlen_k_bucket = s.integer(first + 6);
  p.batch_heads_bucket = s.integer(first + 7);
  return p;
}

StoredChoice read_winner(const Statement& s, const fs::path& source) {
  StoredChoice choice;
  choice.device = read_device(s, 0);
  choice.problem = read_problem(s, 6);
  choice.config = parse_config(s.text(14));
  choice.median_ms = s.real(15);
  choice.source = source.string();
  return choice;
}

// ---- JSON ---------------------------------------------------------------------------------------

json device_json(const std::string& id, const DeviceFingerprint& d) {
  return {{"id", id},
          {"gpu_name", d.gpu_name},
          {"sm", d.sm},
          {"sm_count", d.sm_count},
          {"driver_version", d.driver_version},
          {"nvrtc_version", d.nvrtc_version},
          {"generator_version", d.generator_version}};
}

json problem_json(const std::string& id, const ProblemKey& p) {
  return {{"id", id},
          {"class_id", p.class_id()},
          {"family", p.family},
          {"dtype", dtype_name(p.dtype)},
          {"head_dim", p.head_dim},
          {"mask", mask_text(p.mask)},
          {"gqa_ratio", p.gqa_ratio},
          {"seqlen_q_bucket", p.seqlen_q_bucket},
          {"seqlen_k_bucket", p.seqlen_k_bucket},
          {"batch_heads_bucket", p.batch_heads_bucket}};
}

// An integer field within [lo, hi] (a plain get<int>() would wrap larger numbers silently).
int int_field(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json& value = j.at(key);
  FLASHGEN_REQUIRE(value.is_number_integer(), std::string(key) + " must be an integer, got " + value.dump());
  const int64_t v = value.get<int64_t>();
  FLASHGEN_REQUIRE(v >= lo && v <= hi, std::string(key) + " must be from " + std::to_string(lo) + " to " +
                                           std::to_string(hi) + ", got " + value.dump());
  return static_cast<int>(v);
}

// A finite number of at least lo (spreads, failed candidates' times).
double real_field(const json& j, const char* key, double lo) {
  const double v = j.at(key).get<double>();
  FLASHGEN_REQUIRE(std::isfinite(v) && v >= lo, std::string(key) + " must be a finite number of at least " +
                                                   std::to_string(lo) + ", got " + j.at(key).dump());
  return v;
}

DeviceFingerprint device_from_json(const json& j) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  DeviceFingerprint d;
  d.gpu_name = j.at("gpu_name").get<std::string>();
  d.sm = int_field(j, "sm", 10, 999);
  d.sm_count = int_field(j, "sm_count", 0, kIntMax);
  d.driver_version = int_field(j, "driver_version", 0, kIntMax);
  d.nvrtc_version = j.at("nvrtc_version").get<std::string>();
  d.generator_version = j.at("generator_version").get<std::string>();
  return d;
}

// A problem row as the store's keys require it: a known pass, a power-of-two bucket per size (as
// size_bucket writes them), a group ratio of at least 1. Throws Error(kInvalidArgument) naming the field.
ProblemKey problem_from_json(const json& j) {
  ProblemKey p;
  p.family = j.at("family").get<std::string>();
  p.dtype = parse_dtype(j.at("dtype").get<std::string>());
  p.head_dim = int_field(j, "head_dim", 8, 256);
  FLASHGEN_REQUIRE(p.head_dim % 8 == 0, "problem head_dim must be a multiple of 8, got " + std::to_string(p.head_dim));
  p.mask = parse_mask(j.at("mask").get<std::string>());
  p.gqa_ratio = int_field(j, "gqa_ratio", 1, std::numeric_limits<int>::max());
  p.seqlen_q_bucket = j.at("seqlen_q_bucket").get<int64_t>();
  p.seqlen_k_bucket = j.at("seqlen_k_bucket").get<int64_t>();
  p.batch_heads_bucket = j.at("batch_heads_bucket").get<int64_t>();
  FLASHGEN_REQUIRE(p.family == "fwd" || p.family == "bwd" || p.family == "bwd_det",
                   "problem family must be fwd, bwd or bwd_det, got '" + p.family + "'");
  for (const auto& [name, bucket] : {std::pair{"seqlen_q_bucket", p.seqlen_q_bucket},
                                     std::pair{"seqlen_k_bucket", p.seqlen_k_bucket},
                                     std::pair{"batch_heads_bucket", p.batch_heads_bucket}}) {
    FLASHGEN_REQUIRE(bucket >= 1 && size_bucket(bucket) == bucket,
                     std::string("problem ") + name + " must be a power of two, got " + std::to_string(bucket));
  }
  return p;
}

// A timing read from a file: positive and finite, or a winner could never be replaced.
double median_from_json(const json& row) {
  const double median = row.at("median_ms").get<double>();
  FLASHGEN_REQUIRE(std::isfinite(median) && median > 0, "median_ms must be positive, got " + row.at("median_ms").dump());
  return median;
}

// A winner's config must be a kernel the generator can build: valid on sm_90, whose limits are the widest
// of the GPUs either family runs on (the run-time choice checks the GPU's own).
void require_buildable(const TunedConfig& tuned) {
  const std::optional<std::string> why = std::visit([](const auto& c) { return c.invalid_reason(90); }, tuned);
  FLASHGEN_REQUIRE(!why, "config " + config_name(tuned) + " is not a valid config: " + why.value_or(""));
}

// A winner's config must be of the problem's pass, dtype, head_dim and mask: the run-time choice would
// pass it over on every call otherwise.
void require_config_matches(const TunedConfig& tuned, const ProblemKey& problem) {
  FLASHGEN_REQUIRE(of_problem(tuned, problem), "config " + config_name(tuned) + " is not one of problem " + problem.id());
}

// Rows of an import, parsed and checked before anything is written.
struct ImportedCandidate {
  std::string device_id;
  std::string problem_id;
  CandidateResult result;
  int64_t updated_at;
};
struct ImportedWinner {
  std::string device_id;
  std::string problem_id;
  TunedConfig config;
  double median_ms;
  int64_t updated_at;
};
struct ImportedRows {
  std::map<std::string, DeviceFingerprint> devices;  // by this flashgen's id()
  std::map<std::string, ProblemKey> problems;        // by this flashgen's id()
  std::vector<ImportedCandidate> candidates;
  std::vector<ImportedWinner> winners;
};

const json& array_of(const json& data, const char* key) {
  static const json kEmpty = json::array();
  if (!data.contains(key)) return kEmpty;
  FLASHGEN_REQUIRE(data[key].is_array(), std::string("tuning import: '") + key + "' must be an array");
  return data[key];
}

// Parses every row. Ids are recomputed from the fields, so rows written under another id spelling land
// on the keys this flashgen looks up; candidates and winners must name a device and problem of the file.
ImportedRows parse_import(const json& data) {
  FLASHGEN_REQUIRE(data.is_object(), "tuning import: the document must be a JSON object");
  auto field_text = [&](const char* key) { return data.contains(key) ? data[key].dump() : std::string("nothing"); };
  FLASHGEN_REQUIRE(data.contains("format") && data["format"] == kExportFormat,
                   std::string("tuning import: not a flashgen tuning export (\"format\" must be \"") +
                       kExportFormat + "\", got " + field_text("format") + ")");
  FLASHGEN_REQUIRE(data.contains("version") && data["version"] == kExportVersion,
                   "tuning import: export version " + field_text("version") +
                       " is not supported; this flashgen reads version " + std::to_string(kExportVersion));
  ImportedRows rows;
  std::map<std::string, std::string> device_ids, problem_ids;  // id in the file -> id() here
  std::set<std::pair<std::string, std::string>> winner_pairs;  // (device, problem) of the winners so far
  const char* section = "devices";
  size_t index = 0;
  auto resolve = [&](const std::map<std::string, std::string>& ids, const json& row, const char* key) {
    const std::string id = row.at(key).get<std::string>();
    const auto found = ids.find(id);
    FLASHGEN_REQUIRE(found != ids.end(), std::string("tuning import: ") + section + "[" + std::to_string(index) +
                                             "] names " + key + " '" + id + "' that the file does not define");
    return found->second;
  };
  try {
    for (index = 0; index < array_of(data, "devices").size(); ++index) {
      const json& row = data["devices"][index];
      const DeviceFingerprint device = device_from_json(row);
      device_ids[row.at("id").get<std::string>()] = device.id();
      rows.devices[device.id()] = device;
    }
    section = "problems";
    for (index = 0; index < array_of(data, "problems").size(); ++index) {
      const json& row = data["problems"][index];
      const ProblemKey problem = problem_from_json(row);
      problem_ids[row.at("id").get<std::string>()] = problem.id();
      rows.problems[problem.id()] = problem;
    }
    const int64_t now = unix_now();
    section = "candidates";
    for (index = 0; index < array_of(data, "candidates").size(); ++index) {
      const json& row = data["candidates"][index];
      ImportedCandidate c;
      c.device_id = resolve(device_ids, row, "device_id");
      c.problem_id = resolve(problem_ids, row, "problem_id");
      c.result.config = row.at("config").get<TunedConfig>();
      require_config_matches(c.result.config, rows.problems.at(c.problem_id));
      c.result.status = row.at("status").get<std::string>();
      c.result.median_ms = c.result.status == "ok" ? median_from_json(row) : real_field(row, "median_ms", 0);
      c.result.spread = real_field(row, "spread", 0);
      c.result.samples = int_field(row, "samples", 0, std::numeric_limits<int>::max());
      c.result.detail = row.at("detail").get<std::string>();
      c.updated_at = row.value("updated_at", now);
      rows.candidates.push_back(std::move(c));
    }
    section = "winners";
    for (index = 0; index < array_of(data, "winners").size(); ++index) {
      const json& row = data["winners"][index];
      ImportedWinner w;
      w.device_id = resolve(device_ids, row, "device_id");
      w.problem_id = resolve(problem_ids, row, "problem_id");
      w.config = row.at("config").get<TunedConfig>();
      require_config_matches(w.config, rows.problems.at(w.problem_id));
      require_buildable(w.config);
      FLASHGEN_REQUIRE(winner_pairs.insert({w.device_id, w.problem_id}).second,
                       "a second winner of problem " + w.problem_id + " on device " + w.device_id);
      w.median_ms = median_from_json(row);
      w.updated_at = row.value("updated_at", now);
      rows.winners.push_back(std::move(w));
    }
  } catch (const json::exception& e) {
    fail(Status::kInvalidArgument,
         std::string("tuning import: ") + section + "[" + std::to_string(index) + "]: " + e.what());
  } catch (const Error& e) {
    fail(Status::kInvalidArgument,
         std::string("tuning import: ") + section + "[" + std::to_string(index) + "]: " + e.what());
  }
  return rows;
}

sqlite3* connection(void* db) { return static_cast<sqlite3*>(db); }

// Why an open file cannot be used as a flashgen database as it is: damaged, or another program's
// database (version 0 but holding tables); nullopt otherwise.
std::optional<std::string> unusable_reason(sqlite3* db) {
  if (auto damage = find_damage(db)) return "damaged (" + *damage + ")";
  if (user_version(db) == 0 && holds_tables(db))
    return std::string("not a flashgen database (user_version 0 but it holds tables)");
  return std::nullopt;
}

}  // namespace

// ---- TuningStore --------------------------------------------------------------------------------

TuningStore::TuningStore(std::filesystem::path path, bool read_only)
    : path_(std::move(path)), read_only_(read_only) {
  if (read_only_) {
    // Read-only stores (shipped defaults, a database another process owns) never fail a lookup: a
    // missing, unreadable or damaged file reads as an empty store. Only a newer schema throws.
    if (!fs::exists(path_)) return;
    try {
      Connection db = open_connection(path_, SQLITE_OPEN_READONLY);
      if (auto why = unusable_reason(db.get())) {
        unreadable_ = *why;
        std::fprintf(stderr, "flashgen: warning: tuning database %s is %s; reading it as empty\n", path_.c_str(),
                     why->c_str());
        return;
      }
      const int version = user_version(db.get());
      if (version > kSchemaVersion) throw_newer_version(path_, version);
      if (version == 0) return;  // empty: a new file
      if (version < kSchemaVersion) {
        unreadable_ = "schema version " + std::to_string(version) + ", older than " +
                      std::to_string(kSchemaVersion) + " (open it read-write once to migrate it)";
        std::fprintf(stderr,
                     "flashgen: warning: tuning database %s has schema version %d and is open read-only, "
                     "so it cannot be migrated to %d; reading it as empty\n",
                     path_.c_str(), version, kSchemaVersion);
        return;
      }
      db_ = db.release();
    } catch (const Error& e) {
      if (e.status() == Status::kUnsupported) throw;
      unreadable_ = std::string("unreadable: ") + e.what();
      std::fprintf(stderr, "flashgen: warning: cannot read tuning database %s (%s); reading it as empty\n",
                   path_.c_str(), e.what());
    }
    return;
  }

  if (path_.has_parent_path()) {
    std::error_code error;
    fs::create_directories(path_.parent_path(), error);
    if (error)
      fail(Status::kInvalidArgument, "cannot create the folder of tuning database " + path_.string() + ": " +
                                         error.message());
  }
  constexpr int kFlags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  Connection db = open_connection(path_, kFlags);
  if (auto damage = prepare_read_write(db.get(), path_)) {
    db.reset();
    const fs::path moved = move_aside(path_);
    std::fprintf(stderr, "flashgen: warning: tuning database %s is damaged (%s); moved it to %s and started a "
                 "new one\n", path_.c_str(), damage->c_str(), moved.c_str());
    db = open_connection(path_, kFlags);
    if (auto again = prepare_read_write(db.get(), path_))
      fail(Status::kInternal, "new tuning database " + path_.string() + " is unusable: " + *again);
  }
  db_ = db.release();
}

std::optional<std::string> TuningStore::why_unusable(const std::filesystem::path& path) {
  if (!fs::exists(path)) return std::nullopt;
  return unusable_reason(open_connection(path, SQLITE_OPEN_READONLY).get());
}

TuningStore::~TuningStore() {
  if (db_ != nullptr) sqlite3_close_v2(connection(db_));
}

std::filesystem::path TuningStore::default_path() {
  if (const char* explicit_path = std::getenv("FLASHGEN_TUNING_DB"); explicit_path && *explicit_path)
    return explicit_path;
  // XDG says a relative XDG_DATA_HOME is invalid and must be ignored.
  if (const char* data_home = std::getenv("XDG_DATA_HOME"); data_home && *data_home == '/')
    return fs::path(data_home) / "flashgen" / "tuning.sqlite";
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    const passwd* entry = getpwuid(getuid());
    home = entry != nullptr ? entry->pw_dir : nullptr;
  }
  if (home == nullptr || *home == '\0')
    fail(Status::kInvalidArgument, "no tuning database path: set FLASHGEN_TUNING_DB, XDG_DATA_HOME or HOME");
  return fs::path(home) / ".local" / "share" / "flashgen" / "tuning.sqlite";
}

void TuningStore::record(const DeviceFingerprint& device, const ProblemKey& problem,
                         const std::vector<CandidateResult>& candidates, const TunedConfig& winner,
                         double winner_ms) {
  FLASHGEN_REQUIRE(!read_only_, "tuning database " + path_.string() + " is open read-only");
  // What import_json would refuse is not written either: an export of this file must import.
  FLASHGEN_REQUIRE(std::isfinite(winner_ms) && winner_ms > 0,
                   "winner of " + problem.id() + ": time " + std::to_string(winner_ms) + " ms is not positive");
  require_config_matches(winner, problem);
  sqlite3* db = connection(db_);
  const std::string device_id = device.id();
  const std::string problem_id = problem.id();
  const int64_t now = unix_now();
  Transaction transaction(db);
  upsert_device(db, device_id, device);
  upsert_problem(db, problem_id, problem);
  // The pair's rows are this sweep's: a candidate an earlier sweep timed and this one did not would keep a
  // time measured on another occasion next to the new winner's.
  Statement stale(db, "DELETE FROM candidates WHERE device_id = ?1 AND problem_id = ?2");
  stale.bind_text(1, device_id).bind_text(2, problem_id);
  stale.run();
  Statement candidate(db, kUpsertCandidate);
  for (const CandidateResult& c : candidates) upsert_candidate(candidate, device_id, problem_id, c, now);
  Statement statement(db, R"sql(
    INSERT INTO winners (device_id, problem_id, config_name, config_json, median_ms, updated_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)
    ON CONFLICT (device_id, problem_id) DO UPDATE SET config_name = excluded.config_name,
      config_json = excluded.config_json, median_ms = excluded.median_ms, updated_at = excluded.updated_at)sql");
  statement.bind_text(1, device_id).bind_text(2, problem_id).bind_text(3, config_name(winner));
  statement.bind_text(4, json(winner).dump()).bind_real(5, winner_ms).bind_int(6, now);
  statement.run();
  transaction.commit();
}

std::optional<StoredChoice> TuningStore::lookup_exact(const DeviceFingerprint& device,
                                                      const ProblemKey& problem) const {
  if (db_ == nullptr) return std::nullopt;
  Statement statement(connection(db_), std::string(kWinnerColumns) + "WHERE w.device_id = ?1 AND w.problem_id = ?2");
  statement.bind_text(1, device.id()).bind_text(2, problem.id());
  if (!statement.step()) return std::nullopt;
  return read_winner(statement, path_);
}

std::optional<StoredChoice> TuningStore::lookup_nearest(const DeviceFingerprint& device,
                                                        const ProblemKey& problem) const {
  if (db_ == nullptr) return std::nullopt;
  Statement statement(connection(db_), std::string(kWinnerColumns) +
                                           "WHERE w.device_id = ?1 AND p.class_id = ?2 ORDER BY w.problem_id");
  statement.bind_text(1, device.id()).bind_text(2, problem.class_id());
  std::optional<StoredChoice> best;
  int best_distance = 0;
  // Rows arrive by ascending problem id and only a strictly nearer row replaces the best, so ties go
  // to the smaller id.
  while (statement.step()) {
    StoredChoice choice = read_winner(statement, path_);
    const int distance = bucket_distance(problem, choice.problem);
    if (!best || distance < best_distance) {
      best = std::move(choice);
      best_distance = distance;
    }
  }
  return best;
}

bool TuningStore::has(const DeviceFingerprint& device, const ProblemKey& problem) const {
  if (db_ == nullptr) return false;
  Statement statement(connection(db_), "SELECT 1 FROM winners WHERE device_id = ?1 AND problem_id = ?2");
  statement.bind_text(1, device.id()).bind_text(2, problem.id());
  return statement.step();
}

std::vector<StoredChoice> TuningStore::winners() const {
  std::vector<StoredChoice> result;
  if (db_ == nullptr) return result;
  Statement statement(connection(db_), std::string(kWinnerColumns) + "ORDER BY w.device_id, w.problem_id");
  while (statement.step()) result.push_back(read_winner(statement, path_));
  return result;
}

std::vector<CandidateResult> TuningStore::candidates(const DeviceFingerprint& device,
                                                     const ProblemKey& problem) const {
  std::vector<CandidateResult> result;
  if (db_ == nullptr) return result;
  // Fastest working candidates first, then the failed ones, by name.
  Statement statement(connection(db_), R"sql(
    SELECT config_json, status, median_ms, spread, samples, detail FROM candidates
    WHERE device_id = ?1 AND problem_id = ?2
    ORDER BY status != 'ok', median_ms, config_name)sql");
  statement.bind_text(1, device.id()).bind_text(2, problem.id());
  while (statement.step()) {
    CandidateResult c;
    c.config = parse_config(statement.text(0));
    c.status = statement.text(1);
    c.median_ms = statement.real(2);
    c.spread = statement.real(3);
    c.samples = static_cast<int>(statement.integer(4));
    c.detail = statement.text(5);
    result.push_back(std::move(c));
  }
  return result;
}

int TuningStore::prune(const std::string& device_id, const std::string& problem_class) {
  FLASHGEN_REQUIRE(!read_only_, "tuning database " + path_.string() + " is open read-only");
  sqlite3* db = connection(db_);
  Transaction transaction(db);
  int removed = 0;
  for (const char* table : {"winners", "candidates"}) {
    const std::string sql = std::string("DELETE FROM ") + table +
                            " WHERE (?1 = '' OR device_id = ?1) AND (?2 = '' OR problem_id IN "
                            "(SELECT id FROM problems WHERE class_id = ?2))";
    Statement statement(db, sql);
    statement.bind_text(1, device_id).bind_text(2, problem_class);
    statement.run();
    removed += sqlite3_changes(db);
  }
  // Devices and problems no row refers to any more.
  exec(db, "DELETE FROM problems WHERE id NOT IN (SELECT problem_id FROM candidates UNION "
           "SELECT problem_id FROM winners)");
  exec(db, "DELETE FROM devices WHERE id NOT IN (SELECT device_id FROM candidates UNION "
           "SELECT device_id FROM winners)");
  transaction.commit();
  return removed;
}

nlohmann::json TuningStore::export_json() const {
  json out = {{"format", kExportFormat},
              {"version", kExportVersion},
              {"devices", json::array()},
              {"problems", json::array()},
              {"candidates", json::array()},
              {"winners", json::array()}};
  if (db_ == nullptr) return out;
  sqlite3* db = connection(db_);
  {
    Statement s(db, "SELECT gpu_name, sm, sm_count, driver_version, nvrtc_version, generator_version, id "
                    "FROM devices ORDER BY id");
    while (s.step()) out["devices"].push_back(device_json(s.text(6), read_device(s, 0)));
  }
  {
    Statement s(db, "SELECT family, dtype, head_dim, mask, gqa_ratio, seqlen_q_bucket, seqlen_k_bucket, "
                    "batch_heads_bucket, id FROM problems ORDER BY id");
    while (s.step()) out["problems"].push_back(problem_json(s.text(8), read_problem(s, 0)));
  }
  {
    Statement s(db, "SELECT device_id, problem_id, config_name, config_json, status, median_ms, spread, samples, "
                    "detail, updated_at FROM candidates ORDER BY device_id, problem_id, config_name");
    while (s.step())
      out["candidates"].push_back({{"device_id", s.text(0)},
                                   {"problem_id", s.text(1)},
                                   {"config_name", s.text(2)},
                                   {"config", parse_config(s.text(3))},
                                   {"status", s.text(4)},
                                   {"median_ms", s.real(5)},
                                   {"spread", s.real(6)},
                                   {"samples", s.integer(7)},
                                   {"detail", s.text(8)},
                                   {"updated_at", s.integer(9)}});
  }
  {
    Statement s(db, "SELECT device_id, problem_id, config_name, config_json, median_ms, updated_at "
                    "FROM winners ORDER BY device_id, problem_id");
    while (s.step())
      out["winners"].push_back({{"device_id", s.text(0)},
                                {"problem_id", s.text(1)},
                                {"config_name", s.text(2)},
                                {"config", parse_config(s.text(3))},
                                {"median_ms", s.real(4)},
                                {"updated_at", s.integer(5)}});
  }
  return out;
}

int TuningStore::import_json(const nlohmann::json& data) {
  FLASHGEN_REQUIRE(!read_only_, "tuning database " + path_.string() + " is open read-only");
  const ImportedRows rows = parse_import(data);
  sqlite3* db = connection(db_);
  Transaction transaction(db);
  for (const auto& [id, device] : rows.devices) upsert_device(db, id, device);
  for (const auto& [id, problem] : rows.problems) upsert_problem(db, id, problem);
  Statement candidate(db, kUpsertCandidate);
  for (const ImportedCandidate& c : rows.candidates)
    upsert_candidate(candidate, c.device_id, c.problem_id, c.result, c.updated_at);
  // An existing winner is replaced only by a strictly faster one; sqlite3_changes() is 0 when the
  // WHERE of the upsert kept the old row, so the count is exactly the winners added or replaced.
  Statement winner(db, R"sql(
    INSERT INTO winners (device_id, problem_id, config_name, config_json, median_ms, updated_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)
    ON CONFLICT (device_id, problem_id) DO UPDATE SET config_name = excluded.config_name,
      config_json = excluded.config_json, median_ms = excluded.median_ms, updated_at = excluded.updated_at
    WHERE excluded.median_ms < winners.median_ms)sql");
  int changed = 0;
  for (const ImportedWinner& w : rows.winners) {
    winner.bind_text(1, w.device_id).bind_text(2, w.problem_id).bind_text(3, config_name(w.config));
    winner.bind_text(4, json(w.config).dump()).bind_real(5, w.median_ms).bind_int(6, w.updated_at);
    winner.run();
    changed += sqlite3_changes(db);
  }
  transaction.commit();
  return changed;
}

std::vector<StoredChoice> winners_from_export(const nlohmann::json& data, const std::string& source) {
  const ImportedRows rows = parse_import(data);
  std::vector<StoredChoice> winners;
  for (const ImportedWinner& w : rows.winners) {
    StoredChoice choice;
    choice.device = rows.devices.at(w.device_id);
    choice.problem = rows.problems.at(w.problem_id);
    choice.config = w.config;
    choice.median_ms = w.median_ms;
    choice.source = source;
    winners.push_back(std::move(choice));
  }
  return winners;
}

}  // namespace flashgen
