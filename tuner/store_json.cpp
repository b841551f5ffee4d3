// The tuning store's JSON (see store_json.hpp): writing and reading the export document, with the checks
// an import makes on every row before TuningStore writes any of them.
#include "tuner/store_json.hpp"

#include <cmath>
#include <ctime>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include "flashgen/error.hpp"

namespace flashgen {
namespace {

using nlohmann::json;

// Version of the export_json() document, independent of the SQLite schema version.
constexpr int kExportVersion = 1;
constexpr const char* kExportFormat = "flashgen-tuning";

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
  read_pass_id(j.at("family").get<std::string>(), p);
  p.dtype = parse_dtype(j.at("dtype").get<std::string>());
  // Above 256 the Hopper forward's, and a latent cache's keys (MLA's decode) up to 576.
  p.head_dim = int_field(j, "head_dim", 8, p.kv_cache ? 576 : 512);
  FLASHGEN_REQUIRE(p.head_dim % 8 == 0, "problem head_dim must be a multiple of 8, got " + std::to_string(p.head_dim));
  if (j.contains("head_dim_v")) {  // absent: the values have head_dim
    p.head_dim_v = int_field(j, "head_dim_v", 8, 512);
    FLASHGEN_REQUIRE(p.head_dim_v % 8 == 0 && p.head_dim_v != p.head_dim,
                     "problem head_dim_v must be a multiple of 8 other than head_dim (absent where it is head_dim), "
                     "got " + std::to_string(p.head_dim_v));
  }
  read_mask_text(j.at("mask").get<std::string>(), p);
  p.gqa_ratio = int_field(j, "gqa_ratio", 1, std::numeric_limits<int>::max());
  p.seqlen_q_bucket = j.at("seqlen_q_bucket").get<int64_t>();
  p.seqlen_k_bucket = j.at("seqlen_k_bucket").get<int64_t>();
  p.batch_heads_bucket = j.at("batch_heads_bucket").get<int64_t>();
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

// The array under key, or an empty one when the document has none.
const json& array_of(const json& data, const char* key) {
  static const json kEmpty = json::array();
  if (!data.contains(key)) return kEmpty;
  FLASHGEN_REQUIRE(data[key].is_array(), std::string("tuning import: '") + key + "' must be an array");
  return data[key];
}

}  // namespace

// ---- Text forms ---------------------------------------------------------------------------------

DType parse_dtype(const std::string& text) {
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    if (text == dtype_name(dtype)) return dtype;
  }
  fail(Status::kInvalidArgument, "tuning data: unknown dtype '" + text + "'");
}

const char* candidate_status_name(CandidateStatus status) {
  switch (status) {
    case CandidateStatus::kOk: return "ok";
    case CandidateStatus::kCompileError: return "compile_error";
    case CandidateStatus::kLaunchError: return "launch_error";
    case CandidateStatus::kWrongResult: return "wrong_result";
    case CandidateStatus::kCrashed: return "crashed";
    case CandidateStatus::kSkipped: return "skipped";
  }
  fail(Status::kInternal, "candidate status " + std::to_string(static_cast<int>(status)) + " has no name");
}

CandidateStatus parse_candidate_status(const std::string& text) {
  for (CandidateStatus status : {CandidateStatus::kOk, CandidateStatus::kCompileError, CandidateStatus::kLaunchError,
                                 CandidateStatus::kWrongResult, CandidateStatus::kCrashed, CandidateStatus::kSkipped}) {
    if (text == candidate_status_name(status)) return status;
  }
  fail(Status::kInvalidArgument, "tuning data: unknown candidate status '" + text + "'");
}

TunedConfig parse_config(const std::string& text) {
  const json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) fail(Status::kInvalidArgument, "tuning data: config_json is not JSON: " + text);
  return parsed.get<TunedConfig>();
}

void require_config_matches(const TunedConfig& tuned, const ProblemKey& problem) {
  FLASHGEN_REQUIRE(of_problem(tuned, problem), "config " + config_name(tuned) + " is not one of problem " + problem.id());
}

// ---- Writing an export --------------------------------------------------------------------------

json empty_export() {
  return {{"format", kExportFormat},
          {"version", kExportVersion},
          {"devices", json::array()},
          {"problems", json::array()},
          {"candidates", json::array()},
          {"winners", json::array()}};
}

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
  json row = {{"id", id},
              {"class_id", p.class_id()},
              {"family", p.pass_id()},
              {"dtype", dtype_name(p.dtype)},
              {"head_dim", p.head_dim},
              {"mask", mask_text(p)},
              {"gqa_ratio", p.gqa_ratio},
              {"seqlen_q_bucket", p.seqlen_q_bucket},
              {"seqlen_k_bucket", p.seqlen_k_bucket},
              {"batch_heads_bucket", p.batch_heads_bucket}};
  if (p.head_dim_v > 0) row["head_dim_v"] = p.head_dim_v;  // absent: the values have head_dim
  return row;
}

json candidate_json(const std::string& device_id, const std::string& problem_id, const std::string& config_name,
                    const CandidateResult& c, int64_t updated_at) {
  return {{"device_id", device_id},
          {"problem_id", problem_id},
          {"config_name", config_name},
          {"config", c.config},
          {"status", candidate_status_name(c.status)},
          {"median_ms", c.median_ms},
          {"spread", c.spread},
          {"samples", c.samples},
          {"detail", c.detail},
          {"updated_at", updated_at}};
}

json winner_json(const std::string& device_id, const std::string& problem_id, const std::string& config_name,
                 const TunedConfig& config, double median_ms, int64_t updated_at) {
  return {{"device_id", device_id},
          {"problem_id", problem_id},
          {"config_name", config_name},
          {"config", config},
          {"median_ms", median_ms},
          {"updated_at", updated_at}};
}

json decision_json(const WinnerDecision& decision) {
  return {{"incumbent", decision.incumbent},
          {"incumbent_source", decision.incumbent_source},
          {"decision", decision.decision},
          {"margin", decision.margin}};
}

// ---- Reading an export --------------------------------------------------------------------------

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
    // (the catch below says which row)
    FLASHGEN_REQUIRE(found != ids.end(), std::string("it names ") + key + " '" + id + "', which the file does not define");
    return found->second;
  };
  for (const char* key : {"devices", "problems", "candidates", "winners"}) array_of(data, key);  // each an array
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
    const int64_t now = static_cast<int64_t>(std::time(nullptr));
    section = "candidates";
    for (index = 0; index < array_of(data, "candidates").size(); ++index) {
      const json& row = data["candidates"][index];
      ImportedCandidate c;
      c.device_id = resolve(device_ids, row, "device_id");
      c.problem_id = resolve(problem_ids, row, "problem_id");
      c.result.config = row.at("config").get<TunedConfig>();
      require_config_matches(c.result.config, rows.problems.at(c.problem_id));
      c.result.status = parse_candidate_status(row.at("status").get<std::string>());
      c.result.median_ms =
          c.result.status == CandidateStatus::kOk ? median_from_json(row) : real_field(row, "median_ms", 0);
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
      if (row.contains("decision")) {  // exports of schema 1 and the shipped defaults have none
        const json& d = row["decision"];
        w.decision = WinnerDecision{d.at("incumbent").get<std::string>(), d.at("incumbent_source").get<std::string>(),
                                    d.at("decision").get<std::string>(), d.at("margin").get<double>()};
      }
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
