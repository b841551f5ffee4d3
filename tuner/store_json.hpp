// The tuning store's JSON: the export document (devices, problems, candidates, winners, with a format
// version) that TuningStore::export_json writes and import_json reads, and the text forms it shares with
// the database's columns.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen {

// ---- Text forms of the database's columns and the document's fields ----------------------------
// (candidate_status_name and parse_candidate_status, declared in store.hpp, are defined with these.)

// dtype_name's spellings back; Error(kInvalidArgument) naming the text otherwise. (The mask column's are
// problem_key.hpp's mask_text.)
DType parse_dtype(const std::string& text);
// A config_json column; Error(kInvalidArgument) when it is not JSON or not a config.
TunedConfig parse_config(const std::string& text);

// A winner's config must be of the problem's pass, dtype, head_dim and mask: the run-time choice would
// pass it over on every call otherwise. Throws Error(kInvalidArgument); record() and the import use it.
void require_config_matches(const TunedConfig& tuned, const ProblemKey& problem);

// ---- Writing an export --------------------------------------------------------------------------

// A document with no rows: its format, version and the four empty arrays.
nlohmann::json empty_export();
// One row of each array; ids are the database's, written as they are stored.
nlohmann::json device_json(const std::string& id, const DeviceFingerprint& d);
nlohmann::json problem_json(const std::string& id, const ProblemKey& p);
nlohmann::json candidate_json(const std::string& device_id, const std::string& problem_id,
                              const std::string& config_name, const CandidateResult& c, int64_t updated_at);
nlohmann::json winner_json(const std::string& device_id, const std::string& problem_id,
                           const std::string& config_name, const TunedConfig& config, double median_ms,
                           int64_t updated_at);
// A winner row's "decision": how tune() decided it against the incumbent (store.hpp's WinnerDecision).
nlohmann::json decision_json(const WinnerDecision& decision);

// ---- Reading an export --------------------------------------------------------------------------

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
  std::optional<WinnerDecision> decision;  // the row's "decision", when it has one
};
struct ImportedRows {
  std::map<std::string, DeviceFingerprint> devices;  // by this flashgen's id()
  std::map<std::string, ProblemKey> problems;        // by this flashgen's id()
  std::vector<ImportedCandidate> candidates;
  std::vector<ImportedWinner> winners;
};

// Parses every row. Ids are recomputed from the fields, so rows written under another id spelling land
// on the keys this flashgen looks up; candidates and winners must name a device and problem of the file.
// Rows without updated_at get the time of the call. Throws Error(kInvalidArgument) naming the section and
// row of the first refused field.
ImportedRows parse_import(const nlohmann::json& data);

}  // namespace flashgen
