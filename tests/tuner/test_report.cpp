// Tests for tuner/report: a small database (three problems, two GPUs, candidates of known times) read into a report
// and rendered, the page then read back at the level a reader relies on: well-formed, every problem and sweep there,
// one chart per knob with one mark per candidate, the winner and the built-in choice marked, the peak fractions, the
// escaping of names. Also the datasheet peaks, the problems' work and the knobs of hand-made rows. CPU only.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/temp_dir.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/report.hpp"
#include "tuner/report_svg.hpp"
#include "tuner/space.hpp"
#include "tuner/store.hpp"
#include "tuner/tuned_config.hpp"

namespace {

using namespace flashgen;
using flashgen::testing::TempDir;
using nlohmann::json;

// ---- Reading the page back --------------------------------------------------------------------

// An element found in the page: its opening tag and everything up to its closing tag.
struct Element {
  std::string open;
  std::string whole;
};

std::string attribute(const std::string& open_tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = open_tag.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  return open_tag.substr(from, open_tag.find('"', from) - from);
}

bool has_class(const std::string& open_tag, const std::string& name) {
  const std::string classes = " " + attribute(open_tag, "class") + " ";
  return classes.find(" " + name + " ") != std::string::npos;
}

// Tag names of the page in order with their offsets, each "name" for an opening tag and "/name" for a closing one
// (self-closing ones left out); fails the test on a '<' that starts no tag.
std::vector<std::pair<std::string, size_t>> tags(const std::string& html) {
  std::vector<std::pair<std::string, size_t>> found;
  std::string bad;
  for (size_t at = html.find('<'); at != std::string::npos && bad.empty(); at = html.find('<', at + 1)) {
    if (html.compare(at, 9, "<!DOCTYPE") == 0) continue;
    const size_t end = html.find('>', at);
    const std::string tag = end == std::string::npos ? "" : html.substr(at + 1, end - at - 1);
    if (tag.empty() || !(std::isalpha(static_cast<unsigned char>(tag[0])) || tag[0] == '/')) {
      bad = "at " + std::to_string(at) + ": " + html.substr(at, 40);
      break;
    }
    if (tag.back() == '/') continue;  // self-closing
    found.emplace_back(tag.substr(0, tag.find_first_of(" \t\n")), at);
  }
  INFO("a '<' that starts no tag " << bad);
  REQUIRE(bad.empty());
  return found;
}

// Every opening tag has its closing tag in order; every '&' starts a character reference.
void check_well_formed(const std::string& html) {
  std::vector<std::string> open;
  std::string bad;
  for (const auto& [name, at] : tags(html)) {
    if (name[0] != '/') {
      open.push_back(name);
    } else if (open.empty() || open.back() != name.substr(1)) {
      bad =
          "<" + name + "> at " + std::to_string(at) + " closes " + (open.empty() ? "nothing" : "<" + open.back() + ">");
      break;
    } else {
      open.pop_back();
    }
  }
  INFO(bad);
  CHECK(bad.empty());
  CHECK(open.empty());
  for (size_t at = html.find('&'); at != std::string::npos && bad.empty(); at = html.find('&', at + 1)) {
    const size_t semicolon = html.find(';', at);
    if (semicolon == std::string::npos || semicolon - at > 7)
      bad = "'&' at " + std::to_string(at) + ": " + html.substr(at, 12);
  }
  INFO(bad);
  CHECK(bad.empty());
}

// The elements named `name` inside html (nested ones too), each with its whole text.
std::vector<Element> elements(const std::string& html, const std::string& name) {
  std::vector<Element> found;
  const std::vector<std::pair<std::string, size_t>> all = tags(html);
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].first != name) continue;
    int depth = 0;
    for (size_t j = i; j < all.size(); ++j) {
      if (all[j].first == name) ++depth;
      if (all[j].first == "/" + name && --depth == 0) {
        const size_t from = all[i].second, to = all[j].second + name.size() + 3;
        const std::string whole = html.substr(from, to - from);
        found.push_back({whole.substr(0, whole.find('>') + 1), whole});
        break;
      }
    }
  }
  return found;
}

std::vector<Element> with_class(const std::vector<Element>& all, const std::string& name) {
  std::vector<Element> kept;
  for (const Element& e : all)
    if (has_class(e.open, name)) kept.push_back(e);
  return kept;
}

// ---- The database -----------------------------------------------------------------------------

DeviceFingerprint h100() { return {"NVIDIA H100 80GB HBM3", 90, 132, 13000, "13.0", "2"}; }
// An A100 whose name needs escaping in the page (and still matches the A100 80GB datasheet).
DeviceFingerprint a100() { return {"NVIDIA A100-SXM4-80GB <lab & \"co\">", 80, 108, 12080, "13.0", "2"}; }

ProblemKey forward_key() { return forward_problem_key(DType::kBFloat16, 128, MaskKind::kNone, 1, 4096, 4096, 64); }
ProblemKey backward_key() {
  return backward_problem_key(DType::kFloat16, 64, MaskKind::kCausal, false, 1, 2048, 2048, 32);
}
// Decoding one token over a 32k cache, 32 query heads on 8 kv heads, batch 1.
AttentionProblem decode_problem() {
  AttentionProblem p =
      forward_problem(DType::kBFloat16, AttentionShape{1, 1, 32768, 32, 8, 128}, flashgen::Mask::kCausal);
  p.kv_cache = true;
  return p;
}

CandidateResult row(const TunedConfig& config, double ms, CandidateStatus status = CandidateStatus::kOk,
                    const std::string& detail = "") {
  CandidateResult r;
  r.config = config;
  r.status = status;
  r.median_ms = status == CandidateStatus::kOk ? ms : 0;
  r.spread = status == CandidateStatus::kOk ? 0.01 : 0;
  r.samples = status == CandidateStatus::kOk ? 30 : 0;
  r.detail = detail;
  return r;
}

// What the test recorded, to check the page against.
struct Expected {
  std::string builtin;
  std::string winner;
  size_t candidates = 0;
  std::string incumbent;
};
using ExpectedSweeps = std::map<std::pair<std::string, std::string>, Expected>;  // (problem id, device id)

// The forward problem on both GPUs; the backward (its first preference reported spilling) and a decode problem on
// the H100. Times in ms.
ExpectedSweeps make_database(const std::filesystem::path& path) {
  TuningStore store(path);
  ExpectedSweeps expected;
  {
    // H100: the built-in choice, three of the sm80 family and one more of the sm90 family, the winner.
    const KernelConfig builtin = heuristic_forward_config(DType::kBFloat16, 128, MaskKind::kNone, 90);
    const KernelConfig winner = KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n176_s2_ovl_pp");
    REQUIRE(builtin.family() == KernelFamily::kSm90);
    REQUIRE(builtin != winner);
    std::vector<CandidateResult> rows = {row(builtin, 1.25), row(winner, 1.0),
                                         row(KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n64_w4_s2"), 1.9),
                                         row(KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n32_w8_s3"), 2.4),
                                         row(KernelConfig::from_name("fwd_sm80_bf16_d128_m64_n64_w4_s2"), 0,
                                             CandidateStatus::kCompileError, "ptxas: too many resources requested")};
    store.record(h100(), forward_key(), rows, winner, 1.0);
    expected[{forward_key().id(), h100().id()}] = {builtin.name(), winner.name(), rows.size(), ""};
  }
  {
    // A100: the sm80 family only, the built-in choice the winner, one wrong result.
    const std::vector<KernelConfig> space = forward_space(DType::kBFloat16, 128, MaskKind::kNone, 80).valid;
    const KernelConfig builtin = heuristic_forward_config(DType::kBFloat16, 128, MaskKind::kNone, 80);
    std::vector<CandidateResult> rows = {row(builtin, 2.0)};
    for (size_t i = 0; rows.size() < 6 && i < space.size(); i += std::max<size_t>(1, space.size() / 7))
      if (space[i] != builtin) rows.push_back(row(space[i], 2.2 + 0.3 * static_cast<double>(rows.size())));
    rows.push_back(row(space.back(), 0, CandidateStatus::kWrongResult, "max |err| 0.3"));
    store.record(a100(), forward_key(), rows, builtin, 2.0);
    expected[{forward_key().id(), a100().id()}] = {builtin.name(), builtin.name(), rows.size(), ""};
  }
  {
    // The heuristic's first backward preference spills past what the run-time choice accepts, so the built-in
    // choice is its second. The winner replaced an incumbent from the shipped defaults.
    const std::vector<BwdConfig> list = heuristic_backward_configs(DType::kFloat16, 64, MaskKind::kCausal, false, 90);
    REQUIRE(list.size() >= 3);
    std::vector<CandidateResult> rows = {row(list[0], 0.9, CandidateStatus::kOk, "spills 512 bytes"), row(list[1], 1.2),
                                         row(list[2], 0.8)};
    const WinnerDecision decision{list[0].name(), "shipped defaults", "12.5% faster than the incumbent <beyond noise>",
                                  0.125};
    store.record(h100(), backward_key(), rows, list[2], 0.8, decision);
    expected[{backward_key().id(), h100().id()}] = {list[1].name(), list[2].name(), rows.size(), list[0].name()};
  }
  {
    const AttentionProblem problem = decode_problem();
    const DecodeChoice choice = heuristic_decode_choice(problem, 90, 132);
    const DecodeSplitConfig builtin{choice.config, choice.splits};
    DecodeSplitConfig fewer = builtin, more = builtin, wider = builtin;
    fewer.splits = std::max(1, builtin.splits / 2);
    more.splits = builtin.splits * 2;
    wider.config.block_n = builtin.config.block_n == 64 ? 128 : 64;
    REQUIRE(fewer != builtin);
    std::vector<CandidateResult> rows = {row(builtin, 0.06), row(more, 0.05), row(fewer, 0.08), row(wider, 0.07)};
    store.record(h100(), problem_key(problem), rows, more, 0.05);
    expected[{problem_key(problem).id(), h100().id()}] = {builtin.name(), more.name(), rows.size(), ""};
  }
  return expected;
}

// The knobs the candidates of a sweep differ in, worked out here from the configs' JSON: the oracle of the charts.
std::set<std::string> expected_knobs(const ReportSweep& sweep) {
  std::map<std::string, std::set<std::string>> values;
  for (const ReportCandidate& c : sweep.candidates)
    for (const auto& item : c.config.items()) values[item.key()].insert(item.value().dump());
  std::set<std::string> knobs;
  for (const auto& [field, seen] : values)
    if (seen.size() >= 2) knobs.insert(field);
  return knobs;
}

std::string device_id_of(const ReportData& data, const ReportSweep& sweep) { return data.devices[sweep.device].id; }

}  // namespace

TEST_CASE("report: the rows of each problem and GPU, the built-in choice and the filters", "[report]") {
  const TempDir dir{"flashgen-report"};
  const ExpectedSweeps expected = make_database(dir.path() / "tuning.sqlite");
  const TuningStore store(dir.path() / "tuning.sqlite", true);
  const ReportData data = read_report(store, {});
  CHECK(data.problem_rows == 3);
  CHECK(data.winner_rows == 4);
  CHECK(data.devices.size() == 2);
  CHECK(data.first_update > 0);
  REQUIRE(data.problems.size() == 3);
  size_t sweeps = 0;
  for (const ReportProblem& p : data.problems) {
    for (const ReportSweep& s : p.sweeps) {
      ++sweeps;
      const auto it = expected.find({p.id, device_id_of(data, s)});
      REQUIRE(it != expected.end());
      INFO(p.id << " on " << device_id_of(data, s) << ": " << s.builtin_note);
      CHECK(s.builtin == it->second.builtin);
      CHECK(s.winner == it->second.winner);
      CHECK(s.candidates.size() == it->second.candidates);
      CHECK(s.incumbent == it->second.incumbent);
      CHECK(s.decision.has_value() == !it->second.incumbent.empty());
      // Timed candidates fastest first, then the failed ones.
      for (size_t i = 1; i < s.candidates.size(); ++i) {
        const ReportCandidate &a = s.candidates[i - 1], &b = s.candidates[i];
        if (b.status == CandidateStatus::kOk) CHECK((a.status == CandidateStatus::kOk && a.median_ms <= b.median_ms));
      }
    }
  }
  CHECK(sweeps == expected.size());

  ReportFilter only_h100;
  only_h100.gpus = {"h100"};
  for (const ReportProblem& p : read_report(store, only_h100).problems)
    for (const ReportSweep& s : p.sweeps) CHECK(device_id_of(data, s) == h100().id());
  ReportFilter sm80;
  sm80.archs = {80};
  const ReportData a100_only = read_report(store, sm80);
  REQUIRE(a100_only.problems.size() == 1);
  CHECK(a100_only.problems[0].sweeps.size() == 1);
  ReportFilter backward;
  backward.problems = {"bwd|", "no such problem"};
  const ReportData backward_only = read_report(store, backward);
  REQUIRE(backward_only.problems.size() == 1);
  CHECK(backward_only.problems[0].id == backward_key().id());
}

TEST_CASE("report: the page holds every problem, one chart per knob, one mark per candidate", "[report]") {
  const TempDir dir{"flashgen-report"};
  const ExpectedSweeps expected = make_database(dir.path() / "tuning.sqlite");
  const TuningStore store(dir.path() / "tuning.sqlite", true);
  const ReportData data = read_report(store, {});
  const std::string html = render_report_html(data);
  check_well_formed(html);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  // Self-contained: nothing fetched, nothing run (the SVG namespace is a name, not an address to fetch).
  for (const char* outside : {"<script", "src=", "@import", "url(", "<link"}) {
    INFO(outside);
    CHECK(html.find(outside) == std::string::npos);
  }
  size_t addresses = 0, namespaces = 0;
  for (size_t at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1)) ++addresses;
  for (size_t at = html.find("http://www.w3.org/2000/svg"); at != std::string::npos;
       at = html.find("http://www.w3.org/2000/svg", at + 1))
    ++namespaces;
  CHECK(addresses == namespaces);
  CHECK(render_report_html(data) == html);  // nothing in it depends on the time of rendering

  const std::vector<Element> problems = with_class(elements(html, "section"), "problem");
  REQUIRE(problems.size() == data.problems.size());
  size_t charts_seen = 0;
  for (const ReportProblem& p : data.problems) {
    const auto section = std::find_if(problems.begin(), problems.end(),
                                      [&](const Element& e) { return attribute(e.open, "data-problem") == p.id; });
    INFO(p.id);
    REQUIRE(section != problems.end());
    CHECK(html.find("href=\"#" + attribute(section->open, "id") + "\"") != std::string::npos);  // in the contents
    const std::vector<Element> sweeps = with_class(elements(section->whole, "section"), "sweep");
    REQUIRE(sweeps.size() == p.sweeps.size());
    for (const ReportSweep& s : p.sweeps) {
      const std::string device_id = device_id_of(data, s);
      INFO("device " << device_id);
      const Expected& want = expected.at({p.id, device_id});
      const auto sweep = std::find_if(sweeps.begin(), sweeps.end(), [&](const Element& e) {
        return attribute(e.open, "data-device") == svg::escape(device_id);
      });
      REQUIRE(sweep != sweeps.end());
      const std::vector<Element> charts = with_class(elements(sweep->whole, "svg"), "knob-chart");
      std::set<std::string> knobs;
      for (const Element& chart : charts) {
        const std::string knob = attribute(chart.open, "data-knob");
        INFO("chart of " << knob);
        CHECK(knobs.insert(knob).second);
        const std::vector<Element> marks = with_class(elements(chart.whole, "g"), "mark");
        CHECK(marks.size() == want.candidates);
        std::vector<std::string> winners, builtins, keys;
        for (const Element& m : marks) {
          keys.push_back(attribute(m.open, "data-key"));
          if (has_class(m.open, "winner")) winners.push_back(keys.back());
          if (has_class(m.open, "builtin")) builtins.push_back(keys.back());
          CHECK(m.whole.find("<title>") != std::string::npos);
        }
        CHECK(winners == std::vector<std::string>{want.winner});
        CHECK(builtins == std::vector<std::string>{want.builtin});
        CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == want.candidates);
        ++charts_seen;
      }
      CHECK(knobs == expected_knobs(s));
      CHECK(!knobs.empty());
    }
  }
  CHECK(charts_seen >= 8);
  // The H100's forward sweep mixes both families: the family is a knob, and the sm90 switches have an n/a column.
  const ReportProblem& forward = *std::find_if(data.problems.begin(), data.problems.end(),
                                               [](const ReportProblem& p) { return p.id == forward_key().id(); });
  const ReportSweep& forward_h100 =
      *std::find_if(forward.sweeps.begin(), forward.sweeps.end(),
                    [&](const ReportSweep& s) { return device_id_of(data, s) == h100().id(); });
  const std::set<std::string> forward_knobs = expected_knobs(forward_h100);
  for (const char* knob : {"family", "block_m", "block_n", "warps", "stages", "persistent"}) {
    INFO(knob << " (builtin " << forward_h100.builtin << ")");
    CHECK(forward_knobs.count(knob) == 1);
  }
  // The GPUs of the forward problem side by side.
  CHECK(with_class(elements(html, "svg"), "gpu-chart").size() == 1);
}

TEST_CASE("report: the winner against the datasheet peak, the escaping of names", "[report]") {
  const TempDir dir{"flashgen-report"};
  make_database(dir.path() / "tuning.sqlite");
  const ReportData data = read_report(TuningStore(dir.path() / "tuning.sqlite", true), {});
  const std::string html = render_report_html(data);
  auto sweep_text = [&](const ProblemKey& key, const DeviceFingerprint& device) {
    for (const Element& p : with_class(elements(html, "section"), "problem")) {
      if (attribute(p.open, "data-problem") != svg::escape(key.id())) continue;
      for (const Element& s : with_class(elements(p.whole, "section"), "sweep"))
        if (attribute(s.open, "data-device") == svg::escape(device.id())) return s.whole;
    }
    FAIL("no sweep of " << key.id() << " on " << device.id());
    return std::string();
  };
  // 4 * 64 heads * 128 * 4096^2 = 549.8 GFLOP in 1 ms: 549.8 TFLOP/s, 55.6% of the H100's 989.
  const std::string forward = sweep_text(forward_key(), h100());
  CHECK(forward.find("Compute-bound") != std::string::npos);
  CHECK(forward.find("549.8 TFLOP/s, 55.6% of the H100 SXM's 989 TFLOP/s") != std::string::npos);
  // 274.9 TFLOP/s in 2 ms on the A100's 312: 88.1%.
  CHECK(sweep_text(forward_key(), a100()).find("274.9 TFLOP/s, 88.1% of the A100 SXM 80GB's 312 TFLOP/s") !=
        std::string::npos);
  // K and V of 8 kv heads over 32768 keys, Q and O of 32 heads, 128 bf16 wide: 134,234,112 bytes in 0.05 ms.
  const std::string decode = sweep_text(problem_key(decode_problem()), h100());
  CHECK(decode.find("Memory-bound") != std::string::npos);
  CHECK(decode.find("2.68 TB/s, 80.1% of its 3.35 TB/s HBM") != std::string::npos);
  // The backward's built-in choice (the heuristic's second preference) against the winner: 1.2 / 0.8.
  CHECK(sweep_text(backward_key(), h100()).find("1.5× the winner's time") != std::string::npos);

  // A device name is text, never markup.
  CHECK(html.find("<lab") == std::string::npos);
  CHECK(html.find("A100-SXM4-80GB &lt;lab &amp; &quot;co&quot;&gt;") != std::string::npos);
}

TEST_CASE("report: the winner's decision against its incumbent, and a newer export's fields", "[report]") {
  const TempDir dir{"flashgen-report"};
  const ExpectedSweeps expected = make_database(dir.path() / "tuning.sqlite");
  ReportData data = read_report(TuningStore(dir.path() / "tuning.sqlite", true), {});
  REQUIRE(data.problems[0].id == backward_key().id());
  ReportSweep& sweep = data.problems[0].sweeps[0];
  const std::string incumbent = expected.at({backward_key().id(), h100().id()}).incumbent;
  REQUIRE(sweep.incumbent == incumbent);
  // Fields a newer export adds to a winner row come to the page as they are.
  sweep.winner_extra = {{"measured.by", "node <7>"}, {"measured.repeats", "3"}};
  const std::string html = render_report_html(data);
  check_well_formed(html);
  CHECK(html.find("Incumbent <code>" + incumbent +
                  "</code> (shipped defaults), ringed dashed in the charts. "
                  "Decision: 12.5% faster than the incumbent &lt;beyond noise&gt;.") != std::string::npos);
  CHECK(html.find("<b>measured.by</b> node &lt;7&gt;; <b>measured.repeats</b> 3") != std::string::npos);
  size_t charts = 0;
  for (const Element& chart : with_class(elements(html, "svg"), "knob-chart")) {
    if (chart.whole.find(svg::escape(sweep.winner)) == std::string::npos) continue;  // another problem's chart
    const std::vector<Element> ringed = with_class(elements(chart.whole, "g"), "incumbent");
    REQUIRE(ringed.size() == 1);
    CHECK(attribute(ringed[0].open, "data-key") == incumbent);
    ++charts;
  }
  CHECK(charts >= 1);
}

TEST_CASE("report: knobs are the fields the candidates differ in, values in order", "[report]") {
  ReportSweep sweep;
  auto add = [&](const json& config) {
    ReportCandidate c;
    c.name = config.dump();
    c.config = config;
    sweep.candidates.push_back(c);
  };
  add({{"family", "fwd_sm80"}, {"dtype", "bf16"}, {"block_m", 128}, {"warps", 4}, {"q_in_regs", true}});
  add({{"family", "fwd_sm80"}, {"dtype", "bf16"}, {"block_m", 64}, {"warps", 8}, {"q_in_regs", false}});
  add({{"family", "fwd_sm90"}, {"dtype", "bf16"}, {"block_m", 192}, {"overlap", true}, {"cluster", 1}});
  std::vector<std::pair<std::string, std::string>> fixed;
  const std::vector<Knob> knobs = sweep.knobs(&fixed);
  std::vector<std::string> names;
  for (const Knob& k : knobs) names.push_back(k.name);
  CHECK(names == std::vector<std::string>{"family", "block_m", "warps", "q_in_regs"});
  CHECK(knobs[1].values == std::vector<std::string>{"64", "128", "192"});
  CHECK(knobs[1].value_of == std::vector<size_t>{1, 0, 2});
  CHECK(knobs[2].values == std::vector<std::string>{"4", "8", Knob::kAbsent});
  CHECK(knobs[3].values == std::vector<std::string>{"off", "on", Knob::kAbsent});
  // overlap and cluster take one value where they are present; dtype defines the problem and is not listed.
  CHECK(fixed == std::vector<std::pair<std::string, std::string>>{{"overlap", "on"}, {"cluster", "1"}});
}

TEST_CASE("report: datasheet peaks and the work of a problem", "[report]") {
  CHECK(datasheet_peak("NVIDIA H100 80GB HBM3")->model == "H100 SXM");
  CHECK(datasheet_peak("NVIDIA H100 PCIe")->model == "H100 PCIe");
  CHECK(datasheet_peak("NVIDIA H200")->hbm_gbps == 4800);
  CHECK(datasheet_peak("NVIDIA A100-SXM4-40GB")->hbm_gbps == 1555);
  CHECK(datasheet_peak("NVIDIA A100 80GB PCIe")->model == "A100 PCIe 80GB");
  CHECK(!datasheet_peak("NVIDIA GeForce RTX 4090"));
  CHECK(!datasheet_peak("sm_90 (no device)"));

  const ProblemWork forward = *problem_work(forward_key());
  CHECK(forward.flops == 4.0 * 64 * 128 * 4096.0 * 4096.0);
  // Q, K, V read and O written (bf16), the log-sum-exp written (fp32).
  CHECK(forward.bytes == 2.0 * 128 * 4 * 64 * 4096 + 4.0 * 64 * 4096);
  const ProblemWork backward = *problem_work(backward_key());
  CHECK(backward.flops == 2.5 * 4.0 * 32 * 64 * (2048.0 * 2049.0 / 2));
  // A causal-shaped window of 128 keys: each row sees at most 128.
  ProblemKey window = forward_key();
  window.mask = MaskKind::kWindow;
  window.window_bucket = 128;
  window.window_causal = true;
  CHECK(problem_work(window)->flops == 4.0 * 64 * 128 * (4096.0 * 128 - 127.0 * 128 / 2));
  ProblemKey packed = forward_key();
  packed.varlen = true;
  CHECK(!problem_work(packed));

  const PeakFraction f = peak_fraction(forward, *datasheet_peak("NVIDIA H100 80GB HBM3"), 1.0);
  CHECK(!f.memory_bound);
  CHECK(f.fraction() == Approx(549.755813888 / 989));

  // An FP8 forward: Q, K and V of a byte, O of two; its math against the FP8 peak (twice the 16-bit one on Hopper).
  const ProblemWork fp8 =
      *problem_work(forward_problem_key(DType::kFloat8E4M3, 128, MaskKind::kNone, 1, 4096, 4096, 64));
  CHECK(fp8.fp8);
  CHECK_FALSE(forward.fp8);
  CHECK(fp8.flops == forward.flops);
  CHECK(fp8.bytes == 1.0 * 128 * 3 * 64 * 4096 + 2.0 * 128 * 64 * 4096 + 4.0 * 64 * 4096);
  CHECK(datasheet_peak("NVIDIA H200")->fp8_tflops == 1979);
  CHECK(datasheet_peak("NVIDIA A100-SXM4-40GB")->fp8_tflops == 0);
  const PeakFraction g = peak_fraction(fp8, *datasheet_peak("NVIDIA H100 80GB HBM3"), 1.0);
  CHECK(!g.memory_bound);
  CHECK(g.fraction() == Approx(549.755813888 / 1979));
}
