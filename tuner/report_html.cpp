// The sweep report's page (render_report_html in report.hpp): one HTML file with its CSS and SVG charts inline, no
// script, font or network, so it opens anywhere and can be mailed or attached to an issue as it is.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tuner/report.hpp"
#include "tuner/report_svg.hpp"

namespace flashgen {
namespace {

using svg::escape;

// Candidates within this fraction of the winner's time are counted in a sweep's summary: where many are, the
// winner's lead is within the noise of the timings.
constexpr double kNearWinner = 0.02;
// A built-in choice this many times the winner's time is where tuning pays: the contents show it in bold.
constexpr double kTuningGain = 1.05;

constexpr const char* kStyle = R"css(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d2330;
  margin:0 auto;max-width:1480px;padding:14px 28px 40px;background:#fff}
h1{font-size:24px;margin:6px 0 4px}
h2{font-size:19px;margin:34px 0 2px;padding-top:12px;border-top:3px solid #c9d1de}
h3{font-size:16px;margin:22px 0 4px}
code,.id{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
.id{color:#5b6474}
.note{color:#5b6474;font-size:13px;max-width:1100px}
table{border-collapse:collapse;margin:6px 0 10px}
th,td{padding:3px 10px;border-bottom:1px solid #e3e7ee;text-align:left;vertical-align:top}
th{background:#f1f4f8;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
a{color:#1f5fbf;text-decoration:none}
a:hover{text-decoration:underline}
.facts th{background:none;color:#5b6474;font-weight:500;padding-left:0}
.summary{margin:4px 0 8px;padding:8px 12px;background:#f7f9fc;border-left:4px solid #4c78a8;max-width:1180px}
.summary p{margin:2px 0}
.pct{font-weight:600}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(290px,1fr));gap:4px 16px;max-width:1440px}
.charts svg{width:100%;height:auto;display:block}
details{margin:6px 0 4px}
details summary{cursor:pointer;color:#1f5fbf}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:#2b3140}
svg .tick{font-size:10.5px}
svg .axis-label{font-size:12px;font-weight:600}
svg .band{fill:#f3f5f9}
svg .grid{stroke:#e1e5ec;stroke-width:1}
svg .axis{stroke:#8a93a3;stroke-width:1}
svg .mark .dot{fill:#4c78a8;fill-opacity:.55}
svg .mark .cross{stroke:#a0a4ab;stroke-width:1.5}
svg .mark .diamond{fill:#e4572e;stroke:#6b1f0a;stroke-width:1}
svg .mark .ring{fill:none;stroke:#111;stroke-width:1.7}
svg .mark .outer-ring{fill:none;stroke:#7b3294;stroke-width:1.5;stroke-dasharray:3 2}
svg .mark .whisker{stroke:#333;stroke-width:1.3}
svg .best{stroke:#1d2330;stroke-width:1.8}
svg .reference{stroke:#e4572e;stroke-width:1.1;stroke-dasharray:4 3}
svg .bar{fill:#4c78a8}
svg .bar-outline{fill:none;stroke:#111;stroke-width:1.2;stroke-dasharray:4 2}
svg .bar-label,svg .bar-value{font-size:12px}
.legend svg{vertical-align:middle}
.legend-item{white-space:nowrap}
.contents tr.group th{background:#e8edf4;padding-top:6px}
.contents td.cell{white-space:nowrap;font-variant-numeric:tabular-nums}
.contents td:first-child{padding-left:22px}
)css";

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

// "1 problem", "2 problems".
std::string count_text(size_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// A time in ms, or in µs below 0.1 ms (decoding's).
std::string ms_text(double ms) {
  return ms > 0 && ms < 0.1 ? format("%.3g", ms * 1000) + " µs" : format("%.4g", ms) + " ms";
}
std::string percent_text(double fraction) { return format("%.1f", fraction * 100) + "%"; }
std::string tflops_text(double tflops) { return format(tflops >= 10 ? "%.1f" : "%.3g", tflops) + " TFLOP/s"; }
std::string bandwidth_text(double gbps) {
  return gbps >= 1000 ? format("%.2f", gbps / 1000) + " TB/s" : format("%.0f", gbps) + " GB/s";
}

std::string date_text(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

// A problem's anchor: its id with '|' as '.', and anything else outside [A-Za-z0-9_-] as '-'.
std::string anchor_of(const std::string& id) {
  std::string anchor = "p-";
  for (char c : id) {
    const bool plain =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    anchor += plain ? c : (c == '|' ? '.' : '-');
  }
  return anchor;
}

// The anchors of the problems shown, unique even where two ids spell the same anchor.
std::vector<std::string> anchors_of(const std::vector<ReportProblem>& problems) {
  std::vector<std::string> anchors;
  std::set<std::string> taken;
  for (const ReportProblem& p : problems) {
    std::string anchor = anchor_of(p.id);
    for (int n = 2; taken.count(anchor) != 0; ++n) anchor = anchor_of(p.id) + "-" + std::to_string(n);
    taken.insert(anchor);
    anchors.push_back(anchor);
  }
  return anchors;
}

const ReportCandidate* winner_row(const ReportSweep& sweep) {
  return sweep.winner.empty() ? nullptr : sweep.find(sweep.winner);
}

// The time a sweep is summed up by: its stored winner's, else its fastest timed candidate's; 0 without either.
double best_ms(const ReportSweep& sweep) {
  if (!sweep.winner.empty()) return sweep.winner_ms;
  if (!sweep.candidates.empty() && sweep.candidates.front().status == CandidateStatus::kOk)
    return sweep.candidates.front().median_ms;
  return 0;
}

// The winner's speed against the device's peak, as a sentence, and the fraction alone for tables.
struct PeakText {
  std::string sentence;
  std::string cell = "–";
};
PeakText peak_text(const ReportProblem& problem, const ReportDevice& device, double ms) {
  PeakText text;
  if (ms <= 0) return text;
  if (!problem.work) {
    text.sentence = "No peak figure: a packed batch's total tokens are not part of its key, so its work is unknown.";
    return text;
  }
  if (!device.peak) {
    text.sentence = "No peak figure: no datasheet peak is known for " + device.fingerprint.gpu_name + ".";
    return text;
  }
  const GpuPeak& peak = *device.peak;
  const PeakFraction f = peak_fraction(*problem.work, peak, ms);
  const bool fp8 = problem.work->fp8;
  const std::string compute = tflops_text(f.tflops) + ", " + percent_text(f.compute) + " of the " + peak.model + "'s " +
                              format("%.0f", fp8 ? peak.fp8_tflops : peak.tflops) + (fp8 ? " FP8" : "") + " TFLOP/s";
  const std::string memory =
      bandwidth_text(f.gbps) + ", " + percent_text(f.memory) + " of its " + bandwidth_text(peak.hbm_gbps) + " HBM";
  if (f.memory_bound) {
    text.sentence = "Memory-bound: <span class=\"pct\">" + escape(memory) + "</span> (math: " + escape(compute) + ").";
    text.cell = percent_text(f.memory) + " HBM";
  } else {
    text.sentence = "Compute-bound: <span class=\"pct\">" + escape(compute) + "</span> (HBM: " + escape(memory) + ").";
    text.cell = percent_text(f.compute) + " math";
  }
  return text;
}

// The built-in choice's time against the winner's, or why it is not known.
std::string builtin_text(const ReportSweep& sweep) {
  if (sweep.builtin.empty()) return "Built-in choice: not known (" + escape(sweep.builtin_note) + ").";
  const ReportCandidate* builtin = sweep.find(sweep.builtin);
  std::string text = "Built-in choice <code>" + escape(sweep.builtin) + "</code>";
  const std::string note = sweep.builtin_note.empty() ? "" : " (" + escape(sweep.builtin_note) + ")";
  if (builtin->status != CandidateStatus::kOk)
    return text + ": " + escape(candidate_status_name(builtin->status)) + "." + note;
  text += ": " + ms_text(builtin->median_ms);
  if (sweep.builtin == sweep.winner) return text + ", the winner itself." + note;
  const double best = best_ms(sweep);
  if (best > 0) text += format(", %.3g×", builtin->median_ms / best) + " the winner's time.";
  return text + note;
}

std::string mark_title(const ReportCandidate& c, const ReportSweep& sweep) {
  std::string title = c.name;
  if (c.name == sweep.winner) title += " (winner)";
  if (c.name == sweep.builtin) title += " (built-in choice)";
  if (c.name == sweep.incumbent) title += " (incumbent)";
  if (c.status != CandidateStatus::kOk) {
    title += "\n" + std::string(candidate_status_name(c.status));
    if (!c.detail.empty()) title += ": " + c.detail.substr(0, c.detail.find('\n'));
    return title;
  }
  title += "\n" + ms_text(c.median_ms);
  const double best = best_ms(sweep);
  if (best > 0) title += format(", %.3g× the winner's time", c.median_ms / best);
  title += format(", spread %.1f%%", c.spread * 100) + ", " + std::to_string(c.samples) + " samples";
  if (!c.detail.empty()) title += "\n" + c.detail.substr(0, c.detail.find('\n'));
  return title;
}

// How much a knob matters: the best time of its slowest value over the best time of its fastest one (values of
// the candidates that have the knob, each with a timed candidate); 0 with fewer than two such values.
double knob_factor(const ReportSweep& sweep, const Knob& knob) {
  std::vector<double> best(knob.values.size(), 0);
  for (size_t i = 0; i < sweep.candidates.size(); ++i) {
    const ReportCandidate& c = sweep.candidates[i];
    double& b = best[knob.value_of[i]];
    if (c.status == CandidateStatus::kOk && knob.values[knob.value_of[i]] != Knob::kAbsent &&
        (b == 0 || c.median_ms < b))
      b = c.median_ms;
  }
  best.erase(std::remove(best.begin(), best.end(), 0.0), best.end());
  if (best.size() < 2) return 0;
  return *std::max_element(best.begin(), best.end()) / *std::min_element(best.begin(), best.end());
}

std::string knob_charts(const ReportSweep& sweep, const ReportDevice& device) {
  std::vector<std::pair<std::string, std::string>> fixed;
  const std::vector<Knob> knobs = sweep.knobs(&fixed);
  std::string html;
  if (knobs.empty() && !sweep.candidates.empty())
    html += "<p class=\"note\">The candidates do not differ in any knob.</p>";
  if (!knobs.empty()) html += "<div class=\"charts\">";
  // Decoding's times read better in microseconds.
  const bool microseconds = best_ms(sweep) > 0 && best_ms(sweep) < 0.1;
  const double scale = microseconds ? 1000 : 1;
  for (const Knob& knob : knobs) {
    svg::StripChart chart;
    chart.x_label = knob.name;
    const double factor = knob_factor(sweep, knob);
    if (factor > 0) chart.x_label += format(" · %.2f×", factor);
    chart.y_label = microseconds ? "time (µs)" : "time (ms)";
    chart.columns = knob.values;
    chart.attributes = "class=\"knob-chart\" data-knob=\"" + escape(knob.name) + "\" data-device=\"" +
                       escape(device.id) + "\" role=\"img\" aria-label=\"" +
                       escape("time of each candidate against " + knob.name) + "\"";
    const double best = best_ms(sweep);
    if (best > 0) chart.reference = best * scale;
    for (size_t i = 0; i < sweep.candidates.size(); ++i) {
      const ReportCandidate& c = sweep.candidates[i];
      svg::StripMark mark;
      mark.column = knob.value_of[i];
      const bool ok = c.status == CandidateStatus::kOk;
      if (ok) mark.value = c.median_ms * scale;
      mark.classes = ok ? "ok" : "failed";
      const bool winner = c.name == sweep.winner, builtin = c.name == sweep.builtin,
                 incumbent = c.name == sweep.incumbent;
      if (winner) mark.classes += " winner";
      if (builtin) mark.classes += " builtin";
      if (incumbent) mark.classes += " incumbent";
      mark.diamond = winner;
      mark.ring = builtin;
      mark.outer_ring = incumbent;
      mark.emphasised = winner || builtin || incumbent;
      mark.spread = c.spread;
      mark.key = c.name;
      mark.title = mark_title(c, sweep);
      chart.marks.push_back(std::move(mark));
    }
    html += svg::strip_chart(chart);
  }
  if (!knobs.empty()) html += "</div>";
  if (!fixed.empty()) {
    std::string list;
    for (const auto& [field, value] : fixed) list += (list.empty() ? "" : ", ") + field + " " + value;
    html += "<p class=\"note\">The same for every candidate that has the field: " + escape(list) + ".</p>";
  }
  return html;
}

std::string candidate_table(const ReportSweep& sweep) {
  std::vector<std::string> extra_columns;
  for (const ReportCandidate& c : sweep.candidates)
    for (const auto& [field, value] : c.extra)
      if (std::find(extra_columns.begin(), extra_columns.end(), field) == extra_columns.end())
        extra_columns.push_back(field);
  std::string html = "<details><summary>Every candidate (" + std::to_string(sweep.candidates.size()) +
                     ")</summary><table class=\"candidates\"><thead><tr><th class=\"num\">#</th><th>config</th>"
                     "<th>role</th><th>status</th><th class=\"num\">median (ms)</th><th class=\"num\">× winner</th>"
                     "<th class=\"num\">spread</th><th class=\"num\">samples</th><th>detail</th>";
  for (const std::string& column : extra_columns) html += "<th>" + escape(column) + "</th>";
  html += "</tr></thead><tbody>";
  const double best = best_ms(sweep);
  for (size_t i = 0; i < sweep.candidates.size(); ++i) {
    const ReportCandidate& c = sweep.candidates[i];
    const bool ok = c.status == CandidateStatus::kOk;
    std::string role;
    if (c.name == sweep.winner) role += "winner";
    if (c.name == sweep.builtin) role += std::string(role.empty() ? "" : ", ") + "built-in";
    if (c.name == sweep.incumbent) role += std::string(role.empty() ? "" : ", ") + "incumbent";
    html += "<tr><td class=\"num\">" + std::to_string(i + 1) + "</td><td><code>" + escape(c.name) + "</code></td><td>" +
            role + "</td><td>" + escape(candidate_status_name(c.status)) + "</td><td class=\"num\">" +
            (ok ? format("%.4f", c.median_ms) : "–") + "</td><td class=\"num\">" +
            (ok && best > 0 ? format("%.3f", c.median_ms / best) : "–") + "</td><td class=\"num\">" +
            (ok ? format("%.1f", c.spread * 100) + "%" : "–") + "</td><td class=\"num\">" + std::to_string(c.samples) +
            "</td><td>" + escape(c.detail.substr(0, c.detail.find('\n'))) + "</td>";
    for (const std::string& column : extra_columns) {
      std::string value;
      for (const auto& [field, text] : c.extra)
        if (field == column) value = text;
      html += "<td>" + escape(value) + "</td>";
    }
    html += "</tr>";
  }
  return html + "</tbody></table></details>";
}

std::string sweep_section(const ReportProblem& problem, const ReportSweep& sweep, const ReportDevice& device) {
  std::string html = "<section class=\"sweep\" data-device=\"" + escape(device.id) + "\"><h3>" + escape(device.label) +
                     "</h3><div class=\"summary\">";
  const ReportCandidate* winner = winner_row(sweep);
  if (!sweep.winner.empty()) {
    html += "<p>Winner <code>" + escape(sweep.winner) + "</code>: " + ms_text(sweep.winner_ms);
    if (winner != nullptr && winner->status == CandidateStatus::kOk)
      html += format(" (spread %.1f%%, ", winner->spread * 100) + std::to_string(winner->samples) + " samples)";
    html += ", stored " + date_text(sweep.winner_updated_at) + ".</p>";
  } else {
    html += "<p>No stored winner for these candidates.</p>";
  }
  html += "<p>" + builtin_text(sweep) + "</p>";
  if (sweep.decision) {
    const WinnerDecision& d = *sweep.decision;
    html += "<p>Incumbent <code>" + escape(d.incumbent) + "</code> (" + escape(d.incumbent_source) + ")" +
            (sweep.incumbent.empty() ? ", not among the candidates" : ", ringed dashed in the charts") +
            ". Decision: " + escape(d.decision) + ".</p>";
  }
  const PeakText peak = peak_text(problem, device, best_ms(sweep));
  if (!peak.sentence.empty()) html += "<p>" + peak.sentence + "</p>";
  if (!sweep.winner_extra.empty()) {
    std::string list;
    for (const auto& [field, value] : sweep.winner_extra)
      list += std::string(list.empty() ? "" : "; ") + "<b>" + escape(field) + "</b> " + escape(value);
    html += "<p>" + list + "</p>";
  }
  size_t timed = 0, near = 0;
  std::map<std::string, size_t> failed;
  for (const ReportCandidate& c : sweep.candidates) {
    if (c.status != CandidateStatus::kOk) {
      ++failed[candidate_status_name(c.status)];
      continue;
    }
    ++timed;
    if (c.name != sweep.winner && best_ms(sweep) > 0 && c.median_ms <= best_ms(sweep) * (1 + kNearWinner)) ++near;
  }
  if (sweep.candidates.empty()) {
    html +=
        "<p>No candidate rows: the winner was stored without them (an import of a winners-only export, such as "
        "the shipped defaults).</p>";
  } else {
    std::string counts = count_text(sweep.candidates.size(), "candidate") + ": " + std::to_string(timed) + " timed";
    for (const auto& [status, n] : failed) counts += ", " + std::to_string(n) + " " + status;
    counts += "; " + (near == 0 ? std::string("no other") : std::to_string(near) + (near == 1 ? " other" : " others")) +
              " within " + format("%.0f", kNearWinner * 100) + "% of the winner's time.";
    html += "<p>" + escape(counts) + "</p>";
  }
  html += "</div>";
  html += knob_charts(sweep, device);
  if (!sweep.candidates.empty()) html += candidate_table(sweep);
  return html + "</section>";
}

// The problem's GPUs side by side: a table, and a bar chart of the winners' times when there are several.
std::string across_gpus(const ReportProblem& problem, const std::vector<ReportDevice>& devices) {
  std::string html =
      "<table class=\"gpus\"><thead><tr><th>GPU</th><th class=\"num\">candidates</th><th>winner</th>"
      "<th class=\"num\">time</th><th class=\"num\">built-in</th><th class=\"num\">built-in ÷ winner</th>"
      "<th class=\"num\">speed</th><th class=\"num\">of peak</th></tr></thead><tbody>";
  svg::BarChart chart;
  double slowest = 0;
  for (const ReportSweep& sweep : problem.sweeps) slowest = std::max(slowest, best_ms(sweep));
  const bool microseconds = slowest < 0.1;  // as ms_text writes the times
  const double scale = microseconds ? 1000 : 1;
  chart.axis_label = std::string("winner's time (") + (microseconds ? "µs" : "ms") +
                     "); dashed outline: the built-in choice's";
  chart.attributes = "class=\"gpu-chart\" role=\"img\" aria-label=\"winner's time on each GPU\"";
  for (const ReportSweep& sweep : problem.sweeps) {
    const ReportDevice& device = devices[sweep.device];
    const double best = best_ms(sweep);
    size_t timed = 0;
    for (const ReportCandidate& c : sweep.candidates) timed += c.status == CandidateStatus::kOk;
    const ReportCandidate* builtin = sweep.builtin.empty() ? nullptr : sweep.find(sweep.builtin);
    const bool builtin_timed = builtin != nullptr && builtin->status == CandidateStatus::kOk;
    std::string speed = "–";
    if (best > 0 && problem.work) {
      // The bound's unit; without a peak to tell the bound, decoding's bandwidth and the other passes' math.
      const bool memory_bound =
          device.peak ? peak_fraction(*problem.work, *device.peak, best).memory_bound : problem.key.kv_cache;
      const double seconds = best * 1e-3;
      speed = memory_bound ? bandwidth_text(problem.work->bytes / seconds / 1e9)
                           : tflops_text(problem.work->flops / seconds / 1e12);
    }
    html += "<tr><td>" + escape(device.label) + "</td><td class=\"num\">" + std::to_string(timed) + " / " +
            std::to_string(sweep.candidates.size()) + "</td><td><code>" +
            escape(sweep.winner.empty() ? "–" : sweep.winner) + "</code></td><td class=\"num\">" +
            (best > 0 ? ms_text(best) : "–") + "</td><td class=\"num\">" +
            (builtin_timed ? ms_text(builtin->median_ms) : "–") + "</td><td class=\"num\">" +
            (builtin_timed && best > 0 ? format("%.3f", builtin->median_ms / best) : "–") + "</td><td class=\"num\">" +
            speed + "</td><td class=\"num\">" + escape(peak_text(problem, device, best).cell) + "</td></tr>";
    if (best > 0) {
      svg::Bar bar;
      bar.label = device.label;
      bar.value = best * scale;
      if (builtin_timed) bar.outline = builtin->median_ms * scale;
      bar.value_text = ms_text(best);
      bar.title = device.label + ": winner " + ms_text(best) +
                  (builtin_timed ? ", built-in choice " + ms_text(builtin->median_ms) : std::string());
      chart.bars.push_back(std::move(bar));
    }
  }
  html += "</tbody></table>";
  if (chart.bars.size() >= 2) html += svg::bar_chart(chart);
  return html;
}

std::string legend() {
  auto sample = [](const std::string& shapes, const std::string& label) {
    return "<span class=\"legend-item\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"26\" height=\"22\" "
           "viewBox=\"-13 -11 26 22\">" +
           shapes + "</svg>" + label + "</span> &#160; ";
  };
  return "<p class=\"legend\">" +
         sample("<g class=\"mark\"><circle class=\"dot\" r=\"3.2\"/></g>", "a candidate's median time") +
         sample("<g class=\"mark\"><path class=\"diamond\" d=\"M0 -6.5l6.5 6.5l-6.5 6.5l-6.5 -6.5z\"/></g>", "winner") +
         sample("<g class=\"mark\"><circle class=\"dot\" r=\"3.2\"/><circle class=\"ring\" r=\"8\"/></g>",
                "built-in choice") +
         sample("<g class=\"mark\"><circle class=\"dot\" r=\"3.2\"/><circle class=\"outer-ring\" r=\"10.5\"/></g>",
                "incumbent the winner replaced or kept (where recorded)") +
         sample("<g class=\"mark\"><path class=\"cross\" d=\"M-3 -3l6 6m0 -6l-6 6\"/></g>", "failed, no time") +
         sample("<line class=\"best\" x1=\"-10\" x2=\"10\" y1=\"0\" y2=\"0\"/>", "best time of the column") +
         sample("<line class=\"reference\" x1=\"-12\" x2=\"12\" y1=\"0\" y2=\"0\"/>", "winner's time") + "</p>";
}

std::string header(const ReportData& data) {
  std::string html = "<header><h1>Tuning sweep report</h1><table class=\"facts\"><tbody>";
  html += "<tr><th>database</th><td><code>" + escape(data.db_path) + "</code></td></tr>";
  std::string rows = count_text(data.problem_rows, "problem") + ", " + count_text(data.candidate_rows, "candidate row");
  if (!data.candidates_by_status.empty()) {
    std::string statuses;
    for (const auto& [status, n] : data.candidates_by_status)
      statuses += (statuses.empty() ? "" : ", ") + std::to_string(n) + " " + status;
    rows += " (" + statuses + ")";
  }
  rows += ", " + count_text(data.winner_rows, "winner") + ", " + count_text(data.devices.size(), "GPU");
  html += "<tr><th>rows</th><td>" + escape(rows) + "</td></tr>";
  if (data.first_update > 0) {
    html += "<tr><th>written</th><td>" + date_text(data.first_update) +
            (data.last_update != data.first_update ? " to " + date_text(data.last_update) : std::string()) +
            " (UTC)</td></tr>";
  }
  size_t sweeps = 0;
  for (const ReportProblem& p : data.problems) sweeps += p.sweeps.size();
  std::string shown = count_text(data.problems.size(), "problem") + ", " + count_text(sweeps, "sweep");
  std::string filters;
  for (const std::string& p : data.filter.problems)
    filters += (filters.empty() ? "" : "; ") + ("problem id holds '" + p + "'");
  for (const std::string& g : data.filter.gpus) filters += (filters.empty() ? "" : "; ") + ("GPU '" + g + "'");
  for (int arch : data.filter.archs) filters += (filters.empty() ? "" : "; ") + ("sm" + std::to_string(arch));
  if (!filters.empty()) shown += " (only " + filters + ")";
  html += "<tr><th>shown</th><td>" + escape(shown) + "</td></tr></tbody></table>";

  html +=
      "<table class=\"devices\"><thead><tr><th>GPU</th><th>device name</th><th class=\"num\">sm</th>"
      "<th class=\"num\">SMs</th><th class=\"num\">driver</th><th>NVRTC</th><th>generator</th>"
      "<th class=\"num\">sweeps shown</th><th>peak used (datasheet: dense fp16/bf16 tensor cores, FP8's; HBM)</th>"
      "</tr></thead><tbody>";
  for (size_t i = 0; i < data.devices.size(); ++i) {
    const ReportDevice& d = data.devices[i];
    const DeviceFingerprint& f = d.fingerprint;
    const std::string peak =
        d.peak ? d.peak->model + ": " + format("%.0f", d.peak->tflops) + " TFLOP/s" +
                     (d.peak->fp8_tflops > 0 ? format(" (FP8 %.0f)", d.peak->fp8_tflops) : std::string()) + ", " +
                     bandwidth_text(d.peak->hbm_gbps)
               : std::string("none known");
    html += "<tr><td>" + escape(d.label) + "</td><td>" + escape(f.gpu_name) + "</td><td class=\"num\">" +
            std::to_string(f.sm) + "</td><td class=\"num\">" + std::to_string(f.sm_count) + "</td><td class=\"num\">" +
            std::to_string(f.driver_version) + "</td><td>" + escape(f.nvrtc_version) + "</td><td>" +
            escape(f.generator_version) + "</td><td class=\"num\">" + std::to_string(data.device_sweeps[i]) +
            "</td><td>" + escape(peak) + "</td></tr>";
  }
  html += "</tbody></table>";
  html += legend();
  html +=
      "<p class=\"note\">Each chart puts every candidate of one GPU's sweep of one problem in the column of its value "
      "of one knob (a config field the candidates differ in; n/a: the candidate's kernel family has no such knob) at "
      "its median time, lower being faster. The dark bar of a column is the best time with that value: where the bars "
      "of a knob sit level, the knob matters little; the factor after its name is the best time of its slowest value "
      "over that of its fastest. The time axis turns logarithmic where the times spread over 3×. "
      "Hover a mark for its config and time. The built-in choice is the one today's heuristic makes for the GPU "
      "without "
      "tuning data (its first preference that the rows do not report spilling). The winner's speed is set against the "
      "GPU's datasheet peak: dense fp16/bf16 tensor-core TFLOP/s (FP8's for an FP8 forward), or HBM bandwidth where moving the problem's bytes "
      "at that bandwidth takes longer than its math at the compute peak (decoding, short windows); the work is counted "
      "at the size bucket's upper ends (FLOPs as flashgen run counts them; bytes: every input read and every output "
      "written once), which is what the shipped sweeps time.</p></header>";
  return html;
}

std::string contents(const ReportData& data, const std::vector<std::string>& anchors) {
  std::vector<size_t> shown;
  for (size_t i = 0; i < data.devices.size(); ++i)
    if (data.device_sweeps[i] > 0) shown.push_back(i);
  std::string html =
      "<nav><h2 id=\"contents\">Problems</h2><p class=\"note\">Each cell: the winner's time, its fraction of the "
      "GPU's peak (math or HBM, whichever bounds the problem) and the built-in choice's time over the winner's (1.00: "
      "the built-in choice won; bold from " +
      format("%.2f", kTuningGain) +
      ").</p><table class=\"contents\"><thead><tr>"
      "<th>problem</th>";
  for (size_t d : shown) html += "<th>" + escape(data.devices[d].label) + "</th>";
  html += "</tr></thead><tbody>";
  // Problems by class (their title), each class's sizes under it, in the order the classes first come.
  std::vector<std::string> titles;
  std::map<std::string, std::vector<size_t>> by_title;
  for (size_t i = 0; i < data.problems.size(); ++i) {
    const std::string title = problem_title(data.problems[i].key);
    if (by_title.count(title) == 0) titles.push_back(title);
    by_title[title].push_back(i);
  }
  for (const std::string& title : titles) {
    html +=
        "<tr class=\"group\"><th colspan=\"" + std::to_string(shown.size() + 1) + "\">" + escape(title) + "</th></tr>";
    for (size_t i : by_title[title]) {
      const ReportProblem& p = data.problems[i];
      html += "<tr><td><a href=\"#" + anchors[i] + "\">" + escape(problem_sizes(p.key)) + "</a></td>";
      for (size_t d : shown) {
        const ReportSweep* sweep = nullptr;
        for (const ReportSweep& s : p.sweeps)
          if (s.device == d) sweep = &s;
        const double best = sweep != nullptr ? best_ms(*sweep) : 0;
        if (best <= 0) {
          html += "<td>–</td>";
          continue;
        }
        std::string cell = escape(ms_text(best));
        const PeakText peak = peak_text(p, data.devices[d], best);
        if (peak.cell != "–") cell += " · " + escape(peak.cell);
        const ReportCandidate* builtin = sweep->builtin.empty() ? nullptr : sweep->find(sweep->builtin);
        if (builtin != nullptr && builtin->status == CandidateStatus::kOk) {
          const double gain = builtin->median_ms / best;
          const std::string ratio = format("%.2f", gain);
          cell += " · " + (gain >= kTuningGain ? "<b>" + ratio + "</b>" : ratio);
        }
        html += "<td class=\"cell\">" + cell + "</td>";
      }
      html += "</tr>";
    }
  }
  return html + "</tbody></table></nav>";
}

}  // namespace

std::string render_report_html(const ReportData& data) {
  const std::vector<std::string> anchors = anchors_of(data.problems);
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/><title>" +
      escape("flashgen sweep report: " + data.db_path) + "</title><style>" + kStyle + "</style></head><body>";
  html += header(data);
  if (data.problems.empty()) {
    html +=
        "<p>No rows to show" +
        std::string(data.candidate_rows + data.winner_rows == 0 ? ": the database is empty." : " under the filters.") +
        "</p>";
  } else {
    html += contents(data, anchors);
  }
  for (size_t i = 0; i < data.problems.size(); ++i) {
    const ReportProblem& p = data.problems[i];
    html += "<section class=\"problem\" id=\"" + anchors[i] + "\" data-problem=\"" + escape(p.id) + "\"><h2>" +
            escape(problem_title(p.key)) + "</h2><p class=\"id\">" + escape(problem_sizes(p.key)) + " · <code>" +
            escape(p.id) + "</code> · <a href=\"#contents\">contents</a></p>";
    html += across_gpus(p, data.devices);
    for (const ReportSweep& sweep : p.sweeps) html += sweep_section(p, sweep, data.devices[sweep.device]);
    html += "</section>";
  }
  return html + "</body></html>\n";
}

}  // namespace flashgen
