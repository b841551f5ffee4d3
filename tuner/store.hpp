// SQLite store of tuning results: every candidate's timing and status per (device fingerprint, problem
// key), and the winner. Safe for several processes writing one file at once (WAL, busy timeout,
// BEGIN IMMEDIATE upserts); a damaged file is moved aside and recreated with a warning.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tuner/problem_key.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen {

// How a candidate's sweep ended.
enum class CandidateStatus {
  kOk,            // compiled, matched the reference and was timed
  kCompileError,  // NVRTC or ptxas failed
  kLaunchError,   // a launch failed while checking or timing
  kWrongResult,   // its output did not match the float64 reference
  kCrashed,       // it crashed a worker process before (flashgen tune --devices) and was not run again
  kSkipped,       // refused by the validity rules before compiling
};

// Its text in the database's status column, the export document and the CLI's output: "ok",
// "compile_error", "launch_error", "wrong_result", "crashed", "skipped". Files hold it, so it never changes.
const char* candidate_status_name(CandidateStatus status);
// candidate_status_name's text back (a database row, an import); Error(kInvalidArgument) naming the text
// otherwise.
CandidateStatus parse_candidate_status(const std::string& text);

// Outcome of one candidate in a sweep.
struct CandidateResult {
  TunedConfig config;
  CandidateStatus status = CandidateStatus::kOk;
  double median_ms = 0;       // meaningful when status is kOk
  double spread = 0;          // (p90 - p10) / median
  int samples = 0;
  std::string detail;         // error text or note
};

// How a sweep's winner was decided against the incumbent it would replace (tune()): the incumbent's config name
// and where it came from, the decision in words, and the margin, the winner's gain over the incumbent's time
// (incumbent_ms / winner_ms - 1; 0 when the incumbent stayed).
struct WinnerDecision {
  std::string incumbent;
  std::string incumbent_source;
  std::string decision;
  double margin = 0;
};

// The stored winner of one (device, problem) pair.
struct StoredChoice {
  DeviceFingerprint device;
  ProblemKey problem;
  TunedConfig config;
  double median_ms = 0;
  std::string source;         // database path or "shipped defaults"
};

class TuningStore {
 public:
  // Opens or creates the database at path (parent folders created). A file that is not a readable
  // flashgen database is renamed to "<path>.damaged-<timestamp>" with a warning on stderr and a fresh
  // one is created. Schema version is PRAGMA user_version; older versions are migrated.
  explicit TuningStore(std::filesystem::path path, bool read_only = false);
  ~TuningStore();
  TuningStore(const TuningStore&) = delete;
  TuningStore& operator=(const TuningStore&) = delete;

  // $FLASHGEN_TUNING_DB, else $XDG_DATA_HOME/flashgen/tuning.sqlite, else
  // $HOME/.local/share/flashgen/tuning.sqlite.
  static std::filesystem::path default_path();

  static constexpr int kSchemaVersion = 3;
  // Read-only stores read files from this version on: lookups read their columns, an older file's missing ones as
  // their defaults (no decisions before 2, head_dim_v 0 before 3).
  static constexpr int kOldestReadableVersion = 1;

  const std::filesystem::path& path() const { return path_; }

  // Why the file at path could not be opened as a flashgen database without being moved aside: damaged, or
  // another program's database; nullopt for a missing file, a sound one or one of an older schema (which
  // opening it read-write migrates). Prints nothing; an I/O or permission failure throws.
  static std::optional<std::string> why_unusable(const std::filesystem::path& path);

  // Read-only stores: why an existing file reads as empty (damaged, unreadable, an older schema that
  // cannot be migrated read-only), or nullopt. Commands that copy a database use it to refuse instead of
  // copying nothing.
  const std::optional<std::string>& unreadable() const { return unreadable_; }

  // Replaces the candidate rows of (device, problem) with candidates and upserts the winner, in one BEGIN
  // IMMEDIATE transaction. Throws Error(kInvalidArgument) for a winner import_json would refuse (a time
  // that is not positive, a config not of the problem).
  void record(const DeviceFingerprint& device, const ProblemKey& problem,
              const std::vector<CandidateResult>& candidates, const TunedConfig& winner, double winner_ms,
              const std::optional<WinnerDecision>& decision = std::nullopt);

  // How the stored winner of (device, problem) was decided, when its sweep recorded it.
  std::optional<WinnerDecision> decision(const DeviceFingerprint& device, const ProblemKey& problem) const;

  // Winner stored for exactly this device and problem key.
  std::optional<StoredChoice> lookup_exact(const DeviceFingerprint& device, const ProblemKey& problem) const;
  // Winner of the stored bucket of the same device and problem class nearest to problem (bucket_distance;
  // ties broken by the smaller id() so the answer is deterministic).
  std::optional<StoredChoice> lookup_nearest(const DeviceFingerprint& device, const ProblemKey& problem) const;

  // True when a winner exists for (device, problem): lets a resumed sweep skip it.
  bool has(const DeviceFingerprint& device, const ProblemKey& problem) const;

  std::vector<StoredChoice> winners() const;  // every stored winner, ordered by device then problem id
  std::vector<CandidateResult> candidates(const DeviceFingerprint& device, const ProblemKey& problem) const;

  // Removes rows; an empty device_id / problem_class matches everything. Returns rows removed.
  int prune(const std::string& device_id, const std::string& problem_class);

  // JSON of every row (devices, problems, candidates, winners) with a format version.
  nlohmann::json export_json() const;
  // Merges an export: rows for new (device, problem) pairs are added; for existing pairs the faster
  // winner is kept and candidate rows are upserted. Returns the number of winners added or replaced.
  int import_json(const nlohmann::json& data);

 private:
  std::filesystem::path path_;
  void* db_ = nullptr;  // sqlite3*
  bool read_only_ = false;
  int version_ = kSchemaVersion;  // the file's schema version (a read-only store may read an older one)
  std::optional<std::string> unreadable_;
};

// The winners of an export_json() document, each with source as its StoredChoice::source; throws
// Error(kInvalidArgument) on a document import_json would refuse.
std::vector<StoredChoice> winners_from_export(const nlohmann::json& data, const std::string& source);

}  // namespace flashgen
