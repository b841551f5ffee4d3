// TuningStore's operations (see store.hpp): opening with damaged files moved aside, BEGIN IMMEDIATE upserts
// so several processes can write one file, lookups, export and import. Schema: store_schema; JSON: store_json.
#include "tuner/store.hpp"

#include <pwd.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "flashgen/error.hpp"
#include "tuner/sqlite.hpp"
#include "tuner/store_json.hpp"
#include "tuner/store_schema.hpp"

namespace flashgen {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sqlite::exec;
using sqlite::Statement;
using sqlite::Transaction;

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

sqlite3* connection(void* db) { return static_cast<sqlite3*>(db); }

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
                          seqlen_k_bucket, batch_heads_bucket, head_dim_v)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
    ON CONFLICT (id) DO UPDATE SET class_id = excluded.class_id, family = excluded.family,
      dtype = excluded.dtype, head_dim = excluded.head_dim, mask = excluded.mask,
      gqa_ratio = excluded.gqa_ratio, seqlen_q_bucket = excluded.seqlen_q_bucket,
      seqlen_k_bucket = excluded.seqlen_k_bucket, batch_heads_bucket = excluded.batch_heads_bucket,
      head_dim_v = excluded.head_dim_v)sql");
  statement.bind_text(1, id).bind_text(2, p.class_id()).bind_text(3, p.pass_id()).bind_text(4, dtype_name(p.dtype));
  statement.bind_int(5, p.head_dim).bind_text(6, mask_text(p)).bind_int(7, p.gqa_ratio);
  statement.bind_int(8, p.seqlen_q_bucket).bind_int(9, p.seqlen_k_bucket).bind_int(10, p.batch_heads_bucket);
  statement.bind_int(11, p.head_dim_v);
  statement.run();
}

void upsert_candidate(Statement& statement, const std::string& device_id, const std::string& problem_id,
                      const CandidateResult& c, int64_t updated_at) {
  statement.bind_text(1, device_id).bind_text(2, problem_id).bind_text(3, config_name(c.config));
  statement.bind_text(4, json(c.config).dump()).bind_text(5, candidate_status_name(c.status)).bind_real(6, c.median_ms);
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

// record() replaces the pair's winner; import_json adds a WHERE that keeps a faster one.
constexpr const char* kUpsertWinner = R"sql(
  INSERT INTO winners (device_id, problem_id, config_name, config_json, median_ms, updated_at)
  VALUES (?1, ?2, ?3, ?4, ?5, ?6)
  ON CONFLICT (device_id, problem_id) DO UPDATE SET config_name = excluded.config_name,
    config_json = excluded.config_json, median_ms = excluded.median_ms, updated_at = excluded.updated_at)sql";

void upsert_winner(Statement& statement, const std::string& device_id, const std::string& problem_id,
                   const TunedConfig& config, double median_ms, int64_t updated_at) {
  statement.bind_text(1, device_id).bind_text(2, problem_id).bind_text(3, config_name(config));
  statement.bind_text(4, json(config).dump()).bind_real(5, median_ms).bind_int(6, updated_at);
  statement.run();
}

// The pair's decision row: written with its winner, removed with a winner recorded without one (a decision
// describes the winner it came with).
void set_decision(sqlite3* db, const std::string& device_id, const std::string& problem_id,
                  const std::optional<WinnerDecision>& decision, int64_t updated_at) {
  if (!decision) {
    Statement statement(db, "DELETE FROM decisions WHERE device_id = ?1 AND problem_id = ?2");
    statement.bind_text(1, device_id).bind_text(2, problem_id);
    statement.run();
    return;
  }
  Statement statement(db, R"sql(
    INSERT INTO decisions (device_id, problem_id, incumbent, incumbent_source, decision, margin, updated_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (device_id, problem_id) DO UPDATE SET incumbent = excluded.incumbent,
      incumbent_source = excluded.incumbent_source, decision = excluded.decision, margin = excluded.margin,
      updated_at = excluded.updated_at)sql");
  statement.bind_text(1, device_id).bind_text(2, problem_id).bind_text(3, decision->incumbent);
  statement.bind_text(4, decision->incumbent_source).bind_text(5, decision->decision).bind_real(6, decision->margin);
  statement.bind_int(7, updated_at);
  statement.run();
}


// The problem columns read_problem reads, p. before each where prefixed: a file of schema version 2 or older has no
// head_dim_v and reads 0 in its place.
std::string problem_columns(int version, const char* prefix = "") {
  std::string columns;
  for (const char* name : {"family", "dtype", "head_dim", "mask", "gqa_ratio", "seqlen_q_bucket", "seqlen_k_bucket",
                           "batch_heads_bucket"}) {
    columns += std::string(prefix) + name + ", ";
  }
  return columns + (version >= 3 ? std::string(prefix) + "head_dim_v" : std::string("0"));
}

// The column list shared by the winner queries: w = winners, d = devices, p = problems.
std::string winner_columns(int version) {
  return "SELECT d.gpu_name, d.sm, d.sm_count, d.driver_version, d.nvrtc_version, d.generator_version, " +
         problem_columns(version, "p.") +
         ", w.config_json, w.median_ms, w.device_id, w.problem_id "
         "FROM winners w JOIN devices d ON d.id = w.device_id JOIN problems p ON p.id = w.problem_id ";
}

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
  read_pass_id(s.text(first), p);
  p.dtype = parse_dtype(s.text(first + 1));
  p.head_dim = static_cast<int>(s.integer(first + 2));
  read_mask_text(s.text(first + 3), p);
  p.gqa_ratio = static_cast<int>(s.integer(first + 4));
  p.seqlen_q_bucket = s.integer(first + 5);
  p.seqlen_k_bucket = s.integer(first + 6);
  p.batch_heads_bucket = s.integer(first + 7);
  p.head_dim_v = static_cast<int>(s.integer(first + 8));
  return p;
}

StoredChoice read_winner(const Statement& s, const fs::path& source) {
  StoredChoice choice;
  choice.device = read_device(s, 0);
  choice.problem = read_problem(s, 6);
  choice.config = parse_config(s.text(15));
  choice.median_ms = s.real(16);
  choice.source = source.string();
  return choice;
}

// The columns config_json, status, median_ms, spread, samples, detail from first on.
CandidateResult read_candidate(const Statement& s, int first) {
  CandidateResult c;
  c.config = parse_config(s.text(first));
  c.status = parse_candidate_status(s.text(first + 1));
  c.median_ms = s.real(first + 2);
  c.spread = s.real(first + 3);
  c.samples = static_cast<int>(s.integer(first + 4));
  c.detail = s.text(first + 5);
  return c;
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
      sqlite::Connection db = open_tuning_database(path_, SQLITE_OPEN_READONLY);
      if (auto why = unusable_reason(db.get())) {
        unreadable_ = *why;
        std::fprintf(stderr, "flashgen: warning: tuning database %s is %s; reading it as empty\n", path_.c_str(),
                     why->c_str());
        return;
      }
      const int version = sqlite::user_version(db.get());
      if (version > kSchemaVersion) throw_newer_version(path_, version);
      if (version == 0) return;  // empty: a new file
      if (version < kOldestReadableVersion) {
        unreadable_ = "schema version " + std::to_string(version) + ", older than " +
                      std::to_string(kSchemaVersion) + " (open it read-write once to migrate it)";
        std::fprintf(stderr,
                     "flashgen: warning: tuning database %s has schema version %d and is open read-only, "
                     "so it cannot be migrated to %d; reading it as empty\n",
                     path_.c_str(), version, kSchemaVersion);
        return;
      }
      version_ = version;
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
  sqlite::Connection db = open_tuning_database(path_, kFlags);
  if (auto damage = prepare_read_write(db.get(), path_)) {
    db.reset();
    const fs::path moved = move_aside(path_);
    std::fprintf(stderr, "flashgen: warning: tuning database %s is damaged (%s); moved it to %s and started a "
                 "new one\n", path_.c_str(), damage->c_str(), moved.c_str());
    db = open_tuning_database(path_, kFlags);
    if (auto again = prepare_read_write(db.get(), path_))
      fail(Status::kInternal, "new tuning database " + path_.string() + " is unusable: " + *again);
  }
  db_ = db.release();
}

std::optional<std::string> TuningStore::why_unusable(const std::filesystem::path& path) {
  if (!fs::exists(path)) return std::nullopt;
  return unusable_reason(open_tuning_database(path, SQLITE_OPEN_READONLY).get());
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
                         double winner_ms, const std::optional<WinnerDecision>& decision) {
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
  Statement statement(db, kUpsertWinner);
  upsert_winner(statement, device_id, problem_id, winner, winner_ms, now);
  set_decision(db, device_id, problem_id, decision, now);
  transaction.commit();
}

std::optional<WinnerDecision> TuningStore::decision(const DeviceFingerprint& device, const ProblemKey& problem) const {
  if (db_ == nullptr || version_ < 2) return std::nullopt;
  Statement statement(connection(db_), "SELECT incumbent, incumbent_source, decision, margin FROM decisions "
                                       "WHERE device_id = ?1 AND problem_id = ?2");
  statement.bind_text(1, device.id()).bind_text(2, problem.id());
  if (!statement.step()) return std::nullopt;
  return WinnerDecision{statement.text(0), statement.text(1), statement.text(2), statement.real(3)};
}

std::optional<StoredChoice> TuningStore::lookup_exact(const DeviceFingerprint& device,
                                                      const ProblemKey& problem) const {
  if (db_ == nullptr) return std::nullopt;
  Statement statement(connection(db_), winner_columns(version_) + "WHERE w.device_id = ?1 AND w.problem_id = ?2");
  statement.bind_text(1, device.id()).bind_text(2, problem.id());
  if (!statement.step()) return std::nullopt;
  return read_winner(statement, path_);
}

std::optional<StoredChoice> TuningStore::lookup_nearest(const DeviceFingerprint& device,
                                                        const ProblemKey& problem) const {
  if (db_ == nullptr) return std::nullopt;
  Statement statement(connection(db_), winner_columns(version_) +
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
  Statement statement(connection(db_), winner_columns(version_) + "ORDER BY w.device_id, w.problem_id");
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
    ORDER BY status != ?3, median_ms, config_name)sql");
  statement.bind_text(1, device.id()).bind_text(2, problem.id());
  statement.bind_text(3, candidate_status_name(CandidateStatus::kOk));
  while (statement.step()) result.push_back(read_candidate(statement, 0));
  return result;
}

int TuningStore::prune(const std::string& device_id, const std::string& problem_class) {
  FLASHGEN_REQUIRE(!read_only_, "tuning database " + path_.string() + " is open read-only");
  sqlite3* db = connection(db_);
  Transaction transaction(db);
  int removed = 0;
  for (const char* table : {"winners", "candidates", "decisions"}) {
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
  json out = empty_export();
  if (db_ == nullptr) return out;
  sqlite3* db = connection(db_);
  {
    Statement s(db, "SELECT gpu_name, sm, sm_count, driver_version, nvrtc_version, generator_version, id "
                    "FROM devices ORDER BY id");
    while (s.step()) out["devices"].push_back(device_json(s.text(6), read_device(s, 0)));
  }
  {
    Statement s(db, "SELECT " + problem_columns(version_) + ", id FROM problems ORDER BY id");
    while (s.step()) out["problems"].push_back(problem_json(s.text(9), read_problem(s, 0)));
  }
  {
    Statement s(db, "SELECT device_id, problem_id, config_name, config_json, status, median_ms, spread, samples, "
                    "detail, updated_at FROM candidates ORDER BY device_id, problem_id, config_name");
    while (s.step())
      out["candidates"].push_back(
          candidate_json(s.text(0), s.text(1), s.text(2), read_candidate(s, 3), s.integer(9)));
  }
  {
    // With the winner's decision where its sweep recorded one (a file of version 1 has none).
    const std::string decisions = version_ >= 2 ? "e.incumbent, e.incumbent_source, e.decision, e.margin"
                                                : "NULL, NULL, NULL, NULL";
    const std::string join = version_ >= 2 ? " LEFT JOIN decisions e ON e.device_id = w.device_id AND "
                                             "e.problem_id = w.problem_id"
                                           : "";
    Statement s(db, "SELECT w.device_id, w.problem_id, w.config_name, w.config_json, w.median_ms, w.updated_at, " +
                        decisions + " FROM winners w" + join + " ORDER BY w.device_id, w.problem_id");
    while (s.step()) {
      json row = winner_json(s.text(0), s.text(1), s.text(2), parse_config(s.text(3)), s.real(4), s.integer(5));
      if (!s.is_null(6)) row["decision"] = decision_json({s.text(6), s.text(7), s.text(8), s.real(9)});
      out["winners"].push_back(std::move(row));
    }
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
  Statement winner(db, std::string(kUpsertWinner) + "\n  WHERE excluded.median_ms < winners.median_ms");
  int changed = 0;
  for (const ImportedWinner& w : rows.winners) {
    upsert_winner(winner, w.device_id, w.problem_id, w.config, w.median_ms, w.updated_at);
    const int added = sqlite3_changes(db);
    if (added > 0) set_decision(db, w.device_id, w.problem_id, w.decision, w.updated_at);
    changed += added;
  }
  transaction.commit();
  return changed;
}

}  // namespace flashgen
