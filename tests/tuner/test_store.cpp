// Tests for tuner/store's contents: record/lookup round trips, nearest-bucket choice, prune, JSON export/import/merge,
// candidate statuses, and the classes (soft cap, window, user variant) a key keeps through the database.

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "support/raw_sqlite.hpp"
#include "support/store_fixtures.hpp"
#include "support/temp_dir.hpp"
#include "tuner/store.hpp"

using flashgen::CandidateResult;
using flashgen::CandidateStatus;
using flashgen::DeviceFingerprint;
using flashgen::DType;
using flashgen::KernelConfig;
using flashgen::MaskKind;
using flashgen::ProblemKey;
using flashgen::StoredChoice;
using flashgen::TuningStore;
using namespace flashgen::testing;  // the store fixtures, RawSqlite and TempDir

namespace fs = std::filesystem;

namespace {

void check_same_winner(const StoredChoice& a, const StoredChoice& b) {
  CHECK(a.device.id() == b.device.id());
  CHECK(a.device.gpu_name == b.device.gpu_name);
  CHECK(a.device.sm_count == b.device.sm_count);
  CHECK(a.problem.id() == b.problem.id());
  CHECK(a.config == b.config);
  CHECK(a.median_ms == b.median_ms);
}

void check_same_candidates(const std::vector<CandidateResult>& a, const std::vector<CandidateResult>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].config == b[i].config);
    CHECK(a[i].status == b[i].status);
    CHECK(a[i].median_ms == b[i].median_ms);
    CHECK(a[i].spread == b[i].spread);
    CHECK(a[i].samples == b[i].samples);
    CHECK(a[i].detail == b[i].detail);
  }
}

}  // namespace

TEST_CASE("a winner's decision is stored with it, exported, imported, and dropped with a winner without one",
          "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "a.sqlite");
  const flashgen::WinnerDecision decision{config(128, 64).name(), "shipped defaults h200.json",
                                          "kept the incumbent: the fastest was 0.5% faster, within the noise (1.5%)",
                                          0.0};
  store.record(device(), problem(1024, 1024), {candidate(config(128, 64), 0.5)}, config(128, 64), 0.5, decision);
  const auto read = store.decision(device(), problem(1024, 1024));
  REQUIRE(read.has_value());
  CHECK(read->incumbent == decision.incumbent);
  CHECK(read->incumbent_source == decision.incumbent_source);
  CHECK(read->decision == decision.decision);
  CHECK_FALSE(store.decision(device(), problem(2048, 2048)).has_value());

  const nlohmann::json exported = store.export_json();
  REQUIRE(exported["winners"].size() == 1);
  CHECK(exported["winners"][0]["decision"]["decision"] == decision.decision);
  TuningStore copy(dir.path() / "b.sqlite");
  CHECK(copy.import_json(exported) == 1);
  const auto imported = copy.decision(device(), problem(1024, 1024));
  REQUIRE(imported.has_value());
  CHECK(imported->decision == decision.decision);
  CHECK(imported->margin == decision.margin);

  // A winner recorded without a decision (an older tool, a hand-made row) carries none.
  store.record(device(), problem(1024, 1024), {candidate(config(64, 64), 0.4)}, config(64, 64), 0.4);
  CHECK_FALSE(store.decision(device(), problem(1024, 1024)).has_value());
}

TEST_CASE("record then lookup_exact returns the winner and every candidate", "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "tuning.sqlite");
  const DeviceFingerprint h200 = device();
  const ProblemKey p = problem(4096, 4096);
  CHECK_FALSE(store.lookup_exact(h200, p).has_value());

  KernelConfig best = config(128, 64, 4, 3);
  best.sm80()->q_in_regs = true;
  record_sweep(store, h200, p, 0.8125, best);

  const auto found = store.lookup_exact(h200, p);
  REQUIRE(found.has_value());
  CHECK(found->config == best);
  CHECK(found->median_ms == 0.8125);
  CHECK(found->device.id() == h200.id());
  CHECK(found->device.driver_version == 13000);
  CHECK(found->problem.id() == p.id());
  CHECK(found->problem.seqlen_q_bucket == 4096);
  CHECK(found->source == store.path().string());

  const auto rows = store.candidates(h200, p);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].config == best);  // fastest working first, failures last
  CHECK(rows[1].config == config(64, 64));
  CHECK(rows[2].status == CandidateStatus::kCompileError);
  CHECK(rows[2].detail == "ptxas: too many resources requested");
  CHECK(rows[0].samples == 25);
  CHECK(rows[0].spread == 0.015);

  // Another device, or another bucket, has no exact row.
  CHECK_FALSE(store.lookup_exact(device("NVIDIA H100 80GB HBM3"), p).has_value());
  CHECK_FALSE(store.lookup_exact(h200, problem(8192, 4096)).has_value());

  // Recording again replaces the winner and the candidate rows: this sweep times (64, 64) twice (one row)
  // and (128, 128) fails; the first sweep's (128, 64) row is gone.
  record_sweep(store, h200, p, 0.75, config(64, 64));
  CHECK(store.lookup_exact(h200, p)->config == config(64, 64));
  CHECK(store.lookup_exact(h200, p)->median_ms == 0.75);
  const auto again = store.candidates(h200, p);
  CHECK(again.size() == 2);
  for (const CandidateResult& row : again) CHECK(row.config != flashgen::TunedConfig(config(128, 64)));
}

TEST_CASE("lookup_nearest picks the nearest bucket of the same device and class", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const DeviceFingerprint h200 = device();
  const ProblemKey small = problem(512, 512);
  const ProblemKey large = problem(2048, 2048);
  const ProblemKey huge = problem(16384, 16384);
  const std::vector<ProblemKey> order_a = {small, large, huge};
  const std::vector<ProblemKey> order_b = {huge, large, small};

  for (const auto* order : {&order_a, &order_b}) {
    TuningStore store(dir.path() / (order == &order_a ? "a.sqlite" : "b.sqlite"));
    int block_n = 32;
    for (const ProblemKey& p : *order) record_sweep(store, h200, p, 1.0, config(128, block_n += 16));
    // Different class (bf16) and different device at the exact bucket must not be chosen.
    record_sweep(store, h200, problem(1024, 1024, 64, DType::kBFloat16), 1.0, config(64, 32, 4, 2, DType::kBFloat16));
    record_sweep(store, device("NVIDIA H100 80GB HBM3"), problem(1024, 1024), 1.0, config(64, 16));

    // 1024 is one step from both 512 and 2048 (distance 2 each): the smaller id wins, whatever the
    // insertion order.
    const ProblemKey query = problem(1024, 1024);
    CHECK(flashgen::bucket_distance(query, small) == flashgen::bucket_distance(query, large));
    const auto tie = store.lookup_nearest(h200, query);
    REQUIRE(tie.has_value());
    CHECK(tie->problem.id() == std::min(small.id(), large.id()));

    const auto near_large = store.lookup_nearest(h200, problem(4096, 2048));
    REQUIRE(near_large.has_value());
    CHECK(near_large->problem.id() == large.id());

    const auto exact = store.lookup_nearest(h200, huge);
    REQUIRE(exact.has_value());
    CHECK(exact->problem.id() == huge.id());

    CHECK_FALSE(store.lookup_nearest(h200, problem(1024, 1024, 64, DType::kFloat16, /*gqa_ratio=*/8)).has_value());
    CHECK_FALSE(store.lookup_nearest(device("NVIDIA A100-SXM4-80GB", 80), query).has_value());
  }
}

TEST_CASE("has() lets a resumed sweep skip what is stored", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "tuning.sqlite";
  const DeviceFingerprint h200 = device();
  std::vector<ProblemKey> sweep;
  for (int64_t seqlen : {256, 512, 1024, 2048, 4096}) sweep.push_back(problem(seqlen, seqlen));

  {
    // A first run that stopped after two problems.
    TuningStore store(path);
    record_sweep(store, h200, sweep[0], 0.1);
    record_sweep(store, h200, sweep[3], 0.4);
  }
  TuningStore store(path);
  CHECK(store.has(h200, sweep[0]));
  CHECK_FALSE(store.has(h200, sweep[1]));
  CHECK_FALSE(store.has(device("NVIDIA H100 80GB HBM3"), sweep[0]));
  int tuned = 0;
  for (const ProblemKey& p : sweep) {
    if (store.has(h200, p)) continue;
    record_sweep(store, h200, p, 1.0);
    ++tuned;
  }
  CHECK(tuned == 3);
  CHECK(store.winners().size() == 5);
  CHECK(store.lookup_exact(h200, sweep[3])->median_ms == 0.4);  // not re-tuned
}

TEST_CASE("prune removes matching rows and counts them", "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "tuning.sqlite");
  const DeviceFingerprint h200 = device();
  const DeviceFingerprint h100 = device("NVIDIA H100 80GB HBM3");
  const ProblemKey fp16 = problem(1024, 1024);
  const ProblemKey bf16 = problem(1024, 1024, 64, DType::kBFloat16);
  record_sweep(store, h200, fp16, 1.0);  // 3 candidates + 1 winner each
  record_sweep(store, h200, bf16, 1.0, config(128, 64, 4, 2, DType::kBFloat16));
  record_sweep(store, h100, fp16, 1.0);

  CHECK(store.prune(h200.id(), bf16.class_id()) == 4);
  CHECK_FALSE(store.has(h200, bf16));
  CHECK(store.has(h200, fp16));
  CHECK(store.prune(h200.id(), bf16.class_id()) == 0);
  CHECK(store.prune(h200.id(), "") == 4);
  CHECK(store.winners().size() == 1);
  // Orphaned device and problem rows went with them.
  const auto exported = store.export_json();
  CHECK(exported["devices"].size() == 1);
  CHECK(exported["problems"].size() == 1);
  CHECK(store.prune("", "") == 4);
  CHECK(store.winners().empty());
  CHECK(store.export_json()["devices"].empty());
  CHECK(store.export_json()["problems"].empty());
}

TEST_CASE("export then import into a fresh store reproduces every row", "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore source(dir.path() / "source.sqlite");
  const std::vector<DeviceFingerprint> devices = {device(), device("NVIDIA H100 80GB HBM3")};
  std::vector<ProblemKey> problems;
  for (int64_t seqlen : {128, 1000, 8192})
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) problems.push_back(problem(seqlen, seqlen * 2, 16, dtype));
  double ms = 0.1;
  for (const auto& d : devices)
    for (const auto& p : problems) record_sweep(source, d, p, ms *= 1.37, config(128, 64, 4, 2, p.dtype));

  const nlohmann::json exported = source.export_json();
  CHECK(exported["format"] == "flashgen-tuning");
  CHECK(exported["version"] == 1);
  CHECK(exported["devices"].size() == 2);
  CHECK(exported["problems"].size() == 6);
  CHECK(exported["winners"].size() == 12);
  CHECK(exported["candidates"].size() == 36);
  const auto& first = exported["candidates"][0];
  for (const char* key : {"device_id", "problem_id", "config_name", "config", "status", "median_ms", "spread",
                          "samples", "detail", "updated_at"})
    CHECK(first.contains(key));

  // Through text, as a file shared between machines would go.
  TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(exported.dump())) == 12);

  const auto expected = source.winners();
  const auto actual = copy.winners();
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    check_same_winner(actual[i], expected[i]);
    check_same_candidates(copy.candidates(actual[i].device, actual[i].problem),
                          source.candidates(expected[i].device, expected[i].problem));
  }
  CHECK(copy.export_json() == exported);
  // Importing the same file again changes no winner.
  CHECK(copy.import_json(exported) == 0);
}

TEST_CASE("import merges by keeping the faster winner", "[tuner][store]") {
  TempDir dir("flashgen-store");
  const DeviceFingerprint h200 = device();
  const ProblemKey p1 = problem(1024, 1024), p2 = problem(2048, 2048), p3 = problem(4096, 4096);
  TuningStore theirs(dir.path() / "theirs.sqlite");
  record_sweep(theirs, h200, p1, 0.5, config(64, 32));  // faster than ours
  record_sweep(theirs, h200, p2, 2.0, config(64, 32));  // slower than ours
  record_sweep(theirs, h200, p3, 3.0, config(64, 32));  // new to us

  TuningStore ours(dir.path() / "ours.sqlite");
  record_sweep(ours, h200, p1, 1.0, config(128, 64));
  record_sweep(ours, h200, p2, 1.0, config(128, 64));

  CHECK(ours.import_json(theirs.export_json()) == 2);
  CHECK(ours.lookup_exact(h200, p1)->config == config(64, 32));
  CHECK(ours.lookup_exact(h200, p1)->median_ms == 0.5);
  CHECK(ours.lookup_exact(h200, p2)->config == config(128, 64));
  CHECK(ours.lookup_exact(h200, p2)->median_ms == 1.0);
  CHECK(ours.lookup_exact(h200, p3)->config == config(64, 32));
  CHECK(ours.winners().size() == 3);
}

TEST_CASE("import rejects documents that are not flashgen tuning exports", "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore source(dir.path() / "source.sqlite");
  record_sweep(source, device(), problem(1024, 1024), 1.0);
  TuningStore store(dir.path() / "tuning.sqlite");

  auto status_and_message = [&](const nlohmann::json& data) -> std::pair<flashgen::Status, std::string> {
    try {
      store.import_json(data);
    } catch (const flashgen::Error& e) {
      return {e.status(), e.what()};
    }
    return {flashgen::Status::kSuccess, ""};
  };

  nlohmann::json wrong_format = source.export_json();
  wrong_format["format"] = "something-else";
  auto [status, message] = status_and_message(wrong_format);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("flashgen-tuning") != std::string::npos);

  nlohmann::json newer = source.export_json();
  newer["version"] = 2;
  std::tie(status, message) = status_and_message(newer);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("version 2") != std::string::npos);

  nlohmann::json dangling = source.export_json();
  dangling["devices"] = nlohmann::json::array();
  std::tie(status, message) = status_and_message(dangling);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("does not define") != std::string::npos);

  nlohmann::json bad_field = source.export_json();
  bad_field["winners"][0]["median_ms"] = "fast";
  std::tie(status, message) = status_and_message(bad_field);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("winners[0]") != std::string::npos);

  // Rows the run-time lookup could not use: a bucket size_bucket would not write, a winner slower than
  // any (a timing of 0 or less could never be replaced), a winner of another dtype than its problem.
  nlohmann::json odd_bucket = source.export_json();
  odd_bucket["problems"][0]["seqlen_q_bucket"] = 1000;
  std::tie(status, message) = status_and_message(odd_bucket);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("problems[0]") != std::string::npos);
  CHECK(message.find("seqlen_q_bucket must be a power of two, got 1000") != std::string::npos);

  nlohmann::json negative = source.export_json();
  negative["winners"][0]["median_ms"] = -1.0;
  std::tie(status, message) = status_and_message(negative);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("median_ms must be positive") != std::string::npos);

  nlohmann::json other_dtype = source.export_json();
  other_dtype["winners"][0]["config"]["dtype"] =
      other_dtype["winners"][0]["config"]["dtype"] == "bf16" ? "fp16" : "bf16";
  std::tie(status, message) = status_and_message(other_dtype);
  CHECK(status == flashgen::Status::kInvalidArgument);
  CHECK(message.find("is not one of problem") != std::string::npos);

  // Numbers out of their range (a plain int read would wrap 2^40 to 0), candidates whose timing or config
  // could not come from a sweep, a winner no generator can build, a second winner for one pair.
  auto refused = [&](const char* what, auto&& edit, const std::string& expected) {
    nlohmann::json doc = source.export_json();
    edit(doc);
    std::tie(status, message) = status_and_message(doc);
    INFO(what << ": " << message);
    CHECK(status == flashgen::Status::kInvalidArgument);
    CHECK(message.find(expected) != std::string::npos);
  };
  const int64_t huge = int64_t{1} << 40;
  refused("sm", [&](nlohmann::json& d) { d["devices"][0]["sm"] = huge; }, "devices[0]: sm must be from 10 to 999");
  refused("head_dim", [](nlohmann::json& d) { d["problems"][0]["head_dim"] = -128; }, "head_dim must be from 8 to 512");
  refused("head_dim", [](nlohmann::json& d) { d["problems"][0]["head_dim"] = 100; }, "multiple of 8");
  refused("ok time", [](nlohmann::json& d) { d["candidates"][0]["median_ms"] = -5.0; }, "candidates[0]: median_ms");
  refused("spread", [](nlohmann::json& d) { d["candidates"][0]["spread"] = -1.0; }, "candidates[0]: spread");
  refused("samples", [](nlohmann::json& d) { d["candidates"][0]["samples"] = -3; }, "candidates[0]: samples");
  refused("candidate", [](nlohmann::json& d) { d["candidates"][0]["config"]["head_dim"] = 64; }, "is not one of problem");
  refused("winner", [](nlohmann::json& d) { d["winners"][0]["config"]["block_m"] = 7; }, "is not a valid config");
  refused("twice", [](nlohmann::json& d) { d["winners"].push_back(d["winners"][0]); }, "a second winner of problem");
  refused("status", [](nlohmann::json& d) { d["candidates"][0]["status"] = "timed_out"; },
          "candidates[0]: tuning data: unknown candidate status 'timed_out'");

  // Nothing of the rejected documents was written.
  CHECK(store.winners().empty());
  CHECK(store.export_json()["candidates"].empty());
}

TEST_CASE("candidate statuses are stored and exported as their text and read back", "[tuner][store]") {
  // The texts existing databases and export files hold: they must not change.
  const std::vector<std::pair<CandidateStatus, std::string>> texts = {
      {CandidateStatus::kOk, "ok"},
      {CandidateStatus::kCompileError, "compile_error"},
      {CandidateStatus::kLaunchError, "launch_error"},
      {CandidateStatus::kWrongResult, "wrong_result"},
      {CandidateStatus::kCrashed, "crashed"},
      {CandidateStatus::kSkipped, "skipped"}};
  std::vector<CandidateResult> rows;
  int warps = 1;
  for (const auto& [status, text] : texts) {
    CHECK(flashgen::candidate_status_name(status) == text);
    CHECK(flashgen::parse_candidate_status(text) == status);
    rows.push_back(candidate(config(64, 64, warps++), 0.5, status));
  }
  try {
    flashgen::parse_candidate_status("OK");
    FAIL("an unknown status text was accepted");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kInvalidArgument);
    CHECK(std::string(e.what()).find("'OK'") != std::string::npos);
  }

  TempDir dir("flashgen-store");
  const fs::path path = dir.path() / "tuning.sqlite";
  TuningStore store(path);
  store.record(device(), problem(64, 64), rows, rows[0].config, 0.5);
  std::vector<std::string> expected;  // in config name order (warps 1 to 6), as both lists come
  for (const auto& entry : texts) expected.push_back(entry.second);
  CHECK(RawSqlite(path).column("SELECT status FROM candidates ORDER BY config_name") == expected);
  const nlohmann::json document = store.export_json();
  std::vector<std::string> exported;
  for (const nlohmann::json& row : document["candidates"]) exported.push_back(row.at("status").get<std::string>());
  CHECK(exported == expected);
  const std::vector<CandidateResult> read = store.candidates(device(), problem(64, 64));
  REQUIRE(read.size() == texts.size());
  CHECK(read[0].status == CandidateStatus::kOk);  // the timed row first, then the failed ones by name
  for (size_t i = 1; i < read.size(); ++i) CHECK(read[i].status == texts[i].first);

  // A row whose status this flashgen does not know is refused, naming the text, not read as some status.
  RawSqlite(path).exec("UPDATE candidates SET status = 'timed_out' WHERE status = 'crashed'");
  CHECK_THROWS_WITH(store.candidates(device(), problem(64, 64)), Catch::Contains("unknown candidate status 'timed_out'"));
}

TEST_CASE("record replaces the pair's candidate rows and refuses what import would", "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "tuning.sqlite");
  record_sweep(store, device(), problem(64, 64), 0.01);
  REQUIRE(store.candidates(device(), problem(64, 64)).size() == 3);
  // A second sweep of the pair with one candidate: the first sweep's other rows go.
  store.record(device(), problem(64, 64), {candidate(config(64, 64), 0.02)}, config(64, 64), 0.02);
  const auto rows = store.candidates(device(), problem(64, 64));
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].config == flashgen::TunedConfig(config(64, 64)));
  CHECK(rows[0].median_ms == 0.02);
  // Another pair's rows are untouched.
  record_sweep(store, device(), problem(128, 128), 0.03);
  CHECK(store.candidates(device(), problem(64, 64)).size() == 1);
  CHECK_THROWS_WITH(store.record(device(), problem(256, 256), {}, config(128, 64), 0.0),
                    Catch::Contains("is not positive"));
  CHECK_THROWS_WITH(store.record(device(), problem(256, 256), {}, config(128, 64, 4, 2, DType::kBFloat16), 0.1),
                    Catch::Contains("is not one of problem"));
  CHECK_FALSE(store.lookup_exact(device(), problem(256, 256)).has_value());
}

TEST_CASE("a soft-capped problem keeps its class through the database and its JSON", "[tuner][store]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "capped.sqlite");
  ProblemKey capped = problem(1024, 1024);
  capped.mods.softcap = true;
  KernelConfig c = config(128, 64);
  c.mods.softcap = true;
  record_sweep(store, device(), capped, 0.5, c);
  record_sweep(store, device(), problem(1024, 1024), 0.25, config(128, 64));
  const auto winners = store.winners();
  REQUIRE(winners.size() == 2);
  CHECK(winners[0].problem.mods != winners[1].problem.mods);
  const nlohmann::json exported = store.export_json();
  std::set<std::string> masks;
  for (const auto& p : exported["problems"]) masks.insert(p["mask"].get<std::string>());
  CHECK(masks == std::set<std::string>{"none", "none_softcap"});
  TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(exported.dump())) == 2);
  CHECK(copy.export_json() == exported);
  const auto found = copy.lookup_exact(device(), capped);
  REQUIRE(found.has_value());
  CHECK(found->config == c);
}

TEST_CASE("a problem whose values have a head dim of their own keeps it through the database and its JSON",
          "[tuner][store][value_dim]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "values.sqlite");
  ProblemKey mla = problem(1024, 1024);
  mla.head_dim = 192, mla.head_dim_v = 128;
  KernelConfig c = config(64, 32);
  c.head_dim = 192, c.head_dim_v = 128;
  record_sweep(store, device(), mla, 0.5, c);
  ProblemKey plain = problem(1024, 1024);
  plain.head_dim = 192;
  KernelConfig plain_config = config(64, 32);
  plain_config.head_dim = 192;
  record_sweep(store, device(), plain, 0.25, plain_config);
  const auto found = store.lookup_exact(device(), mla);
  REQUIRE(found.has_value());
  CHECK(found->problem.head_dim_v == 128);
  CHECK(found->config == c);
  // Another class: the nearest bucket of the plain 192 problem is not it.
  ProblemKey other_bucket = mla;
  other_bucket.seqlen_k_bucket = 4096;
  const auto nearest = store.lookup_nearest(device(), other_bucket);
  REQUIRE(nearest.has_value());
  CHECK(nearest->config == c);
  // A winner not of the class is refused, as import refuses it.
  CHECK_THROWS_WITH(record_sweep(store, device(), mla, 0.5, plain_config),
                    Catch::Contains("is not one of problem fwd|fp16|d192v128"));
  const nlohmann::json exported = store.export_json();
  std::set<std::string> dims;
  for (const auto& p : exported["problems"]) dims.insert(p.value("head_dim_v", 0) ? "v" : "-");
  CHECK(dims == std::set<std::string>{"v", "-"});
  TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(exported.dump())) == 2);
  CHECK(copy.export_json() == exported);
  // An import that names the queries' head dim as the values' own is refused.
  nlohmann::json same_dim = exported;
  for (auto& p : same_dim["problems"]) p["head_dim_v"] = p["head_dim"];
  TuningStore refused(dir.path() / "refused.sqlite");
  CHECK_THROWS_WITH(refused.import_json(same_dim), Catch::Contains("head_dim_v must be a multiple of 8 other than"));
}

TEST_CASE("an FP8 forward's problem keeps its input format through the database and its JSON", "[tuner][store][fp8]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "fp8.sqlite");
  const KernelConfig e4m3 = KernelConfig::from_name("fwd_sm90_e4m3_d128_m128_n128_s2_obf16_ovl_pp_pst");
  const KernelConfig e5m2 = KernelConfig::from_name("fwd_sm90_e5m2_d128_m128_n128_s3_obf16_pst");
  // The fixture's other candidates are sm80 tiles, which no FP8 problem has: each sweep here is its winner alone.
  store.record(device(), problem(4096, 4096, 64, DType::kFloat8E4M3), {candidate(e4m3, 0.5)}, e4m3, 0.5);
  store.record(device(), problem(4096, 4096, 64, DType::kFloat8E5M2), {candidate(e5m2, 0.25)}, e5m2, 0.25);
  const auto winners = store.winners();  // read back from the rows: each problem's dtype parsed from its text
  REQUIRE(winners.size() == 2);
  std::set<DType> dtypes;
  for (const auto& w : winners) dtypes.insert(w.problem.dtype);
  CHECK(dtypes == std::set<DType>{DType::kFloat8E4M3, DType::kFloat8E5M2});
  const nlohmann::json exported = store.export_json();
  std::set<std::string> names;
  for (const auto& p : exported["problems"]) names.insert(p["dtype"].get<std::string>());
  CHECK(names == std::set<std::string>{"e4m3", "e5m2"});
  TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(exported.dump())) == 2);
  CHECK(copy.export_json() == exported);
  const auto found = copy.lookup_exact(device(), problem(4096, 4096, 64, DType::kFloat8E5M2));
  REQUIRE(found.has_value());
  CHECK(found->config == e5m2);
}

TEST_CASE("a window key keeps its bucket and shape through the database and its JSON", "[tuner][store][window]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "window.sqlite");
  auto window_key = [](int64_t window_bucket, bool causal) {
    ProblemKey k = flashgen::forward_problem_key(DType::kFloat16, 128, MaskKind::kWindow, 1, 4096, 4096, 64);
    k.window_bucket = window_bucket, k.window_causal = causal;
    return k;
  };
  auto window_config = [](int block_n) {
    KernelConfig c = config(128, block_n);
    c.mask = MaskKind::kWindow;
    return c;
  };
  ProblemKey capped = window_key(1024, true);
  capped.mods.softcap = true;
  KernelConfig capped_config = window_config(64);
  capped_config.mods.softcap = true;
  record_sweep(store, device(), window_key(1024, true), 0.5, window_config(64));
  record_sweep(store, device(), window_key(256, false), 0.25, window_config(32));
  record_sweep(store, device(), capped, 0.75, capped_config);
  record_sweep(store, device(), problem(4096, 4096), 1.0, config(128, 64));
  // The mask column holds the window's bucket and shape; the class id only the variant.
  RawSqlite raw(dir.path() / "window.sqlite");
  const std::vector<std::string> masks = raw.column("SELECT mask FROM problems ORDER BY mask");
  CHECK(masks == std::vector<std::string>{"none", "window1024c", "window1024c_softcap", "window256"});
  const std::vector<std::string> classes = raw.column("SELECT DISTINCT class_id FROM problems ORDER BY class_id");
  CHECK(classes == std::vector<std::string>{"fwd|fp16|d128|none|g1", "fwd|fp16|d128|window_softcap|g1",
                                            "fwd|fp16|d128|window|g1"});
  // Each row rebuilds its key: exact lookups find each window, and only it.
  for (const auto& [key, want] : {std::pair{window_key(1024, true), window_config(64)},
                                  std::pair{window_key(256, false), window_config(32)},
                                  std::pair{capped, capped_config}}) {
    INFO(key.id());
    const auto found = store.lookup_exact(device(), key);
    REQUIRE(found.has_value());
    CHECK(found->problem == key);
    CHECK(found->config == flashgen::TunedConfig(want));
  }
  CHECK_FALSE(store.lookup_exact(device(), window_key(1024, false)).has_value());
  // The nearest window: same class, the window bucket and shape counted.
  const auto nearest = store.lookup_nearest(device(), window_key(512, true));
  REQUIRE(nearest.has_value());
  CHECK(nearest->problem == window_key(1024, true));  // distance 1, against 2 for (256, two-sided)
  // Through JSON and back, unchanged.
  const nlohmann::json exported = store.export_json();
  std::set<std::string> json_masks;
  for (const auto& p : exported["problems"]) json_masks.insert(p["mask"].get<std::string>());
  CHECK(json_masks == std::set<std::string>{"none", "window1024c", "window1024c_softcap", "window256"});
  TuningStore copy(dir.path() / "copy.sqlite");
  CHECK(copy.import_json(nlohmann::json::parse(exported.dump())) == 4);
  CHECK(copy.export_json() == exported);
  CHECK(copy.lookup_exact(device(), window_key(256, false))->config == flashgen::TunedConfig(window_config(32)));
  // A window mask text that is not one of mask_text's is refused on import.
  nlohmann::json bad = exported;
  for (auto& p : bad["problems"])
    if (p["mask"] == "window256") p["mask"] = "window300";
  TuningStore other(dir.path() / "other.sqlite");
  CHECK_THROWS_WITH(other.import_json(bad), Catch::Matchers::Contains("unknown mask 'window300'"));
}

TEST_CASE("a user variant's rows are stored apart from its base class's and read back under its tag",
          "[tuner][store][user_variant]") {
  TempDir dir("flashgen-store");
  TuningStore store(dir.path() / "tuning.sqlite");
  const DeviceFingerprint h200 = device();
  const ProblemKey base = problem(4096, 4096);
  ProblemKey tagged = base;
  tagged.user_tag = "u0123456789ab";
  record_sweep(store, h200, tagged, 0.9, config(64, 32));
  CHECK_FALSE(store.lookup_exact(h200, base).has_value());
  const auto found = store.lookup_exact(h200, tagged);
  REQUIRE(found.has_value());
  CHECK(found->problem == tagged);
  CHECK(found->config == flashgen::TunedConfig(config(64, 32)));
  CHECK(store.candidates(h200, tagged).size() == 3);
  // A neighbouring bucket of the same variant finds it; the base class's does not.
  ProblemKey longer = tagged;
  longer.seqlen_q_bucket = longer.seqlen_k_bucket = 8192;
  const auto nearest = store.lookup_nearest(h200, longer);
  REQUIRE(nearest.has_value());
  CHECK(nearest->problem == tagged);
  ProblemKey base_longer = base;
  base_longer.seqlen_q_bucket = base_longer.seqlen_k_bucket = 8192;
  CHECK_FALSE(store.lookup_nearest(h200, base_longer).has_value());
}
