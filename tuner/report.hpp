// A sweep report of a tuning database: each (GPU, problem) pair's rows gathered with what a reader measures them
// against (the built-in choice, the GPU's datasheet peak, the knobs the candidates differ in), and rendered as one
// self-contained HTML page by `flashgen db report` (report_html.cpp; charts in report_svg.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"

namespace flashgen {

// ---- Peaks and work -----------------------------------------------------------------------------

// A GPU model's datasheet peaks: dense fp16/bf16 tensor-core math and HBM bandwidth.
struct GpuPeak {
  std::string model;    // "H100 SXM"
  double tflops = 0;       // TFLOP/s, fp16/bf16 dense (no sparsity)
  double hbm_gbps = 0;     // GB/s, 1e9 bytes per second
  double fp8_tflops = 0;   // TFLOP/s, FP8 dense; 0 without FP8 tensor cores
};

// The peaks of the GPU a fingerprint's gpu_name names (the CUDA driver's device name: "NVIDIA H100 80GB HBM3"), from
// a small table of datasheets (H100 SXM and PCIe, H200, A100 40 GB and 80 GB); nullopt for any other GPU and for a
// compile-only fingerprint ("sm_90 (no device)").
std::optional<GpuPeak> datasheet_peak(const std::string& gpu_name);

// What one call of a problem key's bucket does at the bucket's sizes (each the largest size of its bucket, which
// is what the shipped sweeps time): its FLOPs, the count `flashgen run` reports (4 * head_dim per visible pair, the
// backward 2.5 times that), and the fewest bytes it moves through HBM (each input read and each output written once).
struct ProblemWork {
  double flops = 0;
  double bytes = 0;
  bool fp8 = false;  // an FP8 forward's: its math runs at the FP8 peak
};

// nullopt for a packed batch, whose total tokens its key does not hold. A window key counts the window as its
// bucket's span (causal-shaped: all of it left of the diagonal; otherwise half on each side).
std::optional<ProblemWork> problem_work(const ProblemKey& key);

// A time against a GPU's peaks on the roofline: the call is memory-bound when moving its bytes at the HBM peak
// takes longer than its math at the compute peak, and its fraction is that of the bound it is under.
struct PeakFraction {
  double tflops = 0;  // achieved
  double gbps = 0;
  double compute = 0;  // tflops / peak (the FP8 peak for FP8 work; 0 where the GPU has none)
  double memory = 0;   // gbps / peak
  bool memory_bound = false;
  double fraction() const { return memory_bound ? memory : compute; }
};
PeakFraction peak_fraction(const ProblemWork& work, const GpuPeak& peak, double ms);

// ---- Rows ---------------------------------------------------------------------------------------

// Which rows a report shows; every list empty (and arch 0) shows them all.
struct ReportFilter {
  std::vector<std::string> problems;  // parts of problem ids, any of which a shown problem's id contains
  std::vector<std::string> gpus;      // parts of GPU names or device ids (case-insensitive)
  std::vector<int> archs;             // a shown device's sm
};

// A row's fields beyond those the report reads (what a newer export adds), each as "field" or "field.sub" and its
// text, in the export's order.
using ExtraFields = std::vector<std::pair<std::string, std::string>>;

struct ReportCandidate {
  std::string name;
  nlohmann::json config;  // the config's JSON: its knobs by field name
  CandidateStatus status = CandidateStatus::kOk;
  double median_ms = 0;
  double spread = 0;  // (p90 - p10) / median
  int samples = 0;
  std::string detail;
  int64_t updated_at = 0;
  ExtraFields extra;
};

// A knob the candidates of one sweep differ in: a config field taking at least two values among the candidates
// that have it. Values are texts ("64", "on", "fwd_sm90"), ordered numerically, off before on; kAbsent names the
// value of the candidates of another family, which lack the field, and comes last.
struct Knob {
  static constexpr const char* kAbsent = "n/a";
  std::string name;
  std::vector<std::string> values;
  std::vector<size_t> value_of;  // per candidate, an index into values
};

// One (device, problem) pair: its candidate rows and its winner.
struct ReportSweep {
  size_t device = 0;                        // index into ReportData::devices
  std::vector<ReportCandidate> candidates;  // timed ones fastest first, then the others by name
  std::string winner;                       // empty when the pair has candidate rows but no winner
  double winner_ms = 0;
  int64_t winner_updated_at = 0;
  std::optional<WinnerDecision> decision;  // how the winner was decided against its incumbent, where recorded
  ExtraFields winner_extra;
  // The built-in choice today's heuristic makes for the problem on this device (the spill rule read from the rows'
  // "spills N bytes" details instead of compiling), empty when it cannot be told; builtin_note says why, or what
  // the choice rests on when the rows lack some of the heuristic's preferences.
  std::string builtin;
  std::string builtin_note;
  // The incumbent the decision names, when it is a candidate.
  std::string incumbent;

  const ReportCandidate* find(const std::string& name) const;
  // Knobs the candidates differ in, in the order their fields first appear; fields all candidates that have them
  // agree on go to fixed (except those that define the problem: dtype, head_dim, mask, ...).
  std::vector<Knob> knobs(std::vector<std::pair<std::string, std::string>>* fixed = nullptr) const;
};

struct ReportDevice {
  std::string id;
  DeviceFingerprint fingerprint;
  std::string label;  // the GPU's name without "NVIDIA ", and what tells apart devices of one name
  std::optional<GpuPeak> peak;
};

struct ReportProblem {
  std::string id;
  ProblemKey key;
  std::optional<ProblemWork> work;
  std::vector<ReportSweep> sweeps;  // by device label
};

struct ReportData {
  std::string db_path;
  // The whole database's rows, whatever the filter shows.
  size_t problem_rows = 0, candidate_rows = 0, winner_rows = 0;
  std::map<std::string, size_t> candidates_by_status;
  int64_t first_update = 0, last_update = 0;  // unix seconds over candidate and winner rows; 0 when empty
  std::vector<ReportDevice> devices;          // every device of the database, by label
  std::vector<size_t> device_sweeps;          // per device, the sweeps shown
  ReportFilter filter;
  std::vector<ReportProblem> problems;  // those shown, by class then sizes
};

// The rows of store that filter selects (read through export_json, so a newer schema's fields come along as extra
// fields). Throws what the store throws for a file it cannot read.
ReportData read_report(const TuningStore& store, const ReportFilter& filter);

// A problem key in words: "forward, bf16, head_dim 128, causal, 4 query heads per kv head".
std::string problem_title(const ProblemKey& key);
// Its sizes in words: "seqlen_q 4096, seqlen_k 4096, batch × heads_q 64".
std::string problem_sizes(const ProblemKey& key);

// The page: a header (database, row counts, GPUs, dates), a table of contents, then per problem its GPUs side by
// side and per GPU every candidate's time against each knob. Inline SVG and CSS only: no script, font or network.
// The output depends only on data (no time of rendering), so two renders of one database are identical.
std::string render_report_html(const ReportData& data);

}  // namespace flashgen
