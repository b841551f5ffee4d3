// The sweep report's data (see report.hpp): a tuning database's rows grouped per problem and GPU, the built-in
// choice told from today's heuristic and the rows' spill notes, the work of each problem and the GPUs' datasheet peaks.
#include "tuner/report.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>
#include <tuple>
#include <variant>

#include "check/reference.hpp"
#include "flashgen/error.hpp"
#include "generator/decode_config.hpp"
#include "tuner/choice.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/store_json.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen {
namespace {

using nlohmann::json;

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- Peaks --------------------------------------------------------------------------------------

// One datasheet, matched when the lower-case device name holds every one of `parts`; the table is searched in
// order, so a more specific entry comes before the entries it would also match.
struct PeakEntry {
  std::vector<const char*> parts;
  GpuPeak peak;
};

const std::vector<PeakEntry>& peak_table() {
  static const std::vector<PeakEntry> table = {
      {{"h100", "nvl"}, {"H100 NVL", 835, 3900, 1671}},
      {{"h100", "pcie"}, {"H100 PCIe", 756, 2000, 1513}},
      {{"h100"}, {"H100 SXM", 989, 3350, 1979}},
      {{"h200", "nvl"}, {"H200 NVL", 835, 4800, 1671}},
      {{"h200"}, {"H200 SXM", 989, 4800, 1979}},
      {{"a100", "80gb", "pcie"}, {"A100 PCIe 80GB", 312, 1935}},
      {{"a100", "80gb"}, {"A100 SXM 80GB", 312, 2039}},
      {{"a100"}, {"A100 40GB", 312, 1555}},
  };
  return table;
}

// ---- Work ---------------------------------------------------------------------------------------

// The mask and window the references count a key's visible pairs under (report.hpp says how a window is read).
std::pair<Mask, ReferenceWindow> mask_of(const ProblemKey& key) {
  const int64_t span = std::max<int64_t>(key.window_bucket, 1);
  switch (key.mask) {
    case MaskKind::kNone:
      return {Mask::kNone, {}};
    case MaskKind::kCausal:
      return {Mask::kCausal, {}};
    case MaskKind::kWindow:
      if (key.window_causal) return {Mask::kSlidingWindow, {span - 1, 0, 0}};
      return {Mask::kSlidingWindow, {span / 2, span - span / 2 - 1, 0}};
    case MaskKind::kChunk:
      return {Mask::kSlidingWindow, {-1, key.window_causal ? 0 : -1, span}};
  }
  return {Mask::kNone, {}};
}

// Keys one row of a decode problem reads at most: the window's span, else the whole cache.
int64_t keys_read(const ProblemKey& key) {
  if (key.mask == MaskKind::kWindow || key.mask == MaskKind::kChunk)
    return std::min(key.seqlen_k_bucket, std::max<int64_t>(key.window_bucket, 1));
  return key.seqlen_k_bucket;
}

// ---- Built-in choice ----------------------------------------------------------------------------

// The bytes a row's detail says its kernel spills ("spills 96 bytes", sweep_driver.hpp's note), 0 otherwise.
int spilled_bytes(const std::string& detail) {
  int bytes = 0;
  if (std::sscanf(detail.c_str(), "spills %d bytes", &bytes) == 1) return bytes;
  return 0;
}

// The heuristic's preference list for key on sm_<arch> (names, best first), with the most bytes an entry may spill
// and still be chosen (choice.cpp's rule). Compiles nothing.
std::pair<std::vector<std::string>, int> preference_list(const ProblemKey& key, int arch) {
  std::vector<std::string> names;
  if (key.pass == Pass::kBackward) {
    for (BwdConfig c :
         heuristic_backward_configs(key.dtype, key.head_dim, key.mask, key.dq == DqStrategy::kDeterministic, arch)) {
      c.varlen = key.varlen, c.mods = key.mods;
      names.push_back(c.name());
    }
    return {names, builtin_spill_allowance(Pass::kBackward, arch)};
  }
  for (KernelConfig c : heuristic_forward_configs(key.dtype, key.head_dim, key.mask, arch, key.varlen, key.head_dim_v)) {
    c.mods = key.mods;
    c.paged = key.paged;
    if (key.paged && c.invalid_reason(arch)) continue;  // read_through_pages passes over tiles a paged kernel lacks
    names.push_back(c.name());
  }
  return {names, builtin_spill_allowance(Pass::kForward, arch)};
}

// The decode heuristic's choice at the bucket's sizes on the device's SMs.
std::string decode_builtin(const ProblemKey& key, const DeviceFingerprint& device) {
  const int64_t heads_q = key.batch_heads_bucket;
  AttentionShape shape{1,
                       key.seqlen_q_bucket,
                       key.seqlen_k_bucket,
                       heads_q,
                       std::max<int64_t>(1, heads_q / std::max(key.gqa_ratio, 1)),
                       key.head_dim};
  Mask mask = key.mask == MaskKind::kNone ? Mask::kNone : Mask::kCausal;
  int left = -1, right = -1, chunk = 0;
  const int span = static_cast<int>(std::max<int64_t>(key.window_bucket, 1));
  if (key.mask == MaskKind::kWindow) {
    mask = Mask::kSlidingWindow;
    left = key.window_causal ? span - 1 : span / 2;
    right = key.window_causal ? 0 : span - span / 2 - 1;
  } else if (key.mask == MaskKind::kChunk) {
    mask = key.window_causal ? Mask::kCausal : Mask::kNone;
    chunk = span;
  }
  AttentionProblem problem = forward_problem(key.dtype, shape, mask, left, right, chunk);
  problem.kv_cache = true;
  problem.paged = key.paged;
  problem.page_size = key.paged ? 16 : 0;
  problem.cache_dtype = key.cache_dtype;
  problem.softcap = key.mods.softcap ? 30.f : 0.f;  // the cap's value is a run-time argument: any positive one
  problem.alibi = key.mods.alibi;
  const DecodeChoice choice = heuristic_decode_choice(problem, device.sm, device.sm_count);
  return DecodeSplitConfig{choice.config, choice.splits}.name();
}

// Sets sweep.builtin (or builtin_note): the first entry of the preference list that is a candidate and spills no
// more than the rule allows, else the first that is a candidate. The sweep of the problem timed the built-in
// choice, so a preference the rows lack was passed over for spilling when the sweep planned it.
void find_builtin(ReportSweep& sweep, const ProblemKey& key, const DeviceFingerprint& device) {
  const int arch = device.sm;
  try {
    if (key.kv_cache) {
      if (device.sm_count <= 0) {
        sweep.builtin_note = "the device's SM count is not known, which the split count follows";
        return;
      }
      const std::string name = decode_builtin(key, device);
      if (sweep.find(name) != nullptr)
        sweep.builtin = name;
      else
        sweep.builtin_note = "the heuristic's " + name + " is not among the candidates";
      return;
    }
    const auto [names, cheap_bytes] = preference_list(key, arch);
    size_t absent = 0;  // preferences before the chosen one that the rows lack
    for (const std::string& name : names) {
      const ReportCandidate* row = sweep.find(name);
      if (row == nullptr) ++absent;
      if (row != nullptr && spilled_bytes(row->detail) <= cheap_bytes) {
        sweep.builtin = name;
        if (absent > 0) {
          sweep.builtin_note = "the heuristic's " + std::to_string(absent) + " earlier preference" +
                               (absent == 1 ? " is" : "s are") + " not among the candidates: passed over for " +
                               "spilling when the sweep was planned, or the sweep named its configs";
        }
        return;
      }
    }
    for (const std::string& name : names) {
      if (sweep.find(name) != nullptr) {
        sweep.builtin = name;
        sweep.builtin_note = "every preference among the candidates spills: the first of them";
        return;
      }
    }
    sweep.builtin_note = names.empty()
                             ? "the heuristic has no config for sm_" + std::to_string(arch)
                             : "none of the heuristic's configs (" + names.front() + ", ...) is among the candidates";
  } catch (const Error& e) {
    sweep.builtin_note = std::string("the heuristic has no choice here: ") + e.what();
  }
}

// ---- Rows ---------------------------------------------------------------------------------------

std::string value_text(const json& value) {
  if (value.is_boolean()) return value.get<bool>() ? "on" : "off";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  if (value.is_number()) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", value.get<double>());
    return text;
  }
  return value.dump();
}

// The fields of row that are not in `known`, flattened one level ("decision.margin").
ExtraFields extra_fields(const json& row, std::initializer_list<const char*> known) {
  ExtraFields extra;
  for (const auto& item : row.items()) {
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return item.key() == k; }) != known.end())
      continue;
    if (item.value().is_object()) {
      for (const auto& sub : item.value().items())
        extra.emplace_back(item.key() + "." + sub.key(), value_text(sub.value()));
    } else {
      extra.emplace_back(item.key(), value_text(item.value()));
    }
  }
  return extra;
}

bool selected(const ReportFilter& filter, const std::string& device_id, const DeviceFingerprint& device,
              const std::string& problem_id) {
  auto any_part = [](const std::vector<std::string>& parts, auto&& holds) {
    return parts.empty() || std::any_of(parts.begin(), parts.end(), holds);
  };
  return any_part(filter.problems, [&](const std::string& part) { return contains(problem_id, part); }) &&
         any_part(filter.gpus,
                  [&](const std::string& part) {
                    return contains(lower(device.gpu_name), lower(part)) || contains(lower(device_id), lower(part));
                  }) &&
         (filter.archs.empty() || std::count(filter.archs.begin(), filter.archs.end(), device.sm) > 0);
}

// Labels: the name without the vendor's prefix, and for devices that share a name the fields they differ in.
void label_devices(std::vector<ReportDevice>& devices) {
  for (ReportDevice& d : devices) {
    d.label = d.fingerprint.gpu_name;
    if (d.label.rfind("NVIDIA ", 0) == 0) d.label.erase(0, 7);
  }
  for (ReportDevice& d : devices) {
    std::vector<const ReportDevice*> same;
    for (const ReportDevice& other : devices)
      if (other.fingerprint.gpu_name == d.fingerprint.gpu_name) same.push_back(&other);
    if (same.size() < 2) continue;
    const DeviceFingerprint& f = d.fingerprint;
    auto differs = [&](auto field) {
      return std::any_of(same.begin(), same.end(),
                         [&](const ReportDevice* o) { return field(o->fingerprint) != field(f); });
    };
    std::string suffix;
    auto add = [&](const std::string& text) { suffix += (suffix.empty() ? "" : ", ") + text; };
    if (differs([](const DeviceFingerprint& x) { return x.sm_count; })) add(std::to_string(f.sm_count) + " SMs");
    if (differs([](const DeviceFingerprint& x) { return x.driver_version; }))
      add("driver " + std::to_string(f.driver_version));
    if (differs([](const DeviceFingerprint& x) { return x.nvrtc_version; })) add("NVRTC " + f.nvrtc_version);
    if (differs([](const DeviceFingerprint& x) { return x.generator_version; })) add("gen " + f.generator_version);
    if (differs([](const DeviceFingerprint& x) { return x.sm; })) add("sm" + std::to_string(f.sm));
    d.label += " (" + suffix + ")";
  }
}

// The order knob charts come in: the tile first, then the family's switches; fields this list lacks follow.
const std::vector<std::string>& knob_order() {
  static const std::vector<std::string> order = {"family",     "block_m",    "block_n",    "rows",      "warps",
                                                 "stages",     "splits",     "d_split",    "q_in_regs", "overlap",
                                                 "pingpong",   "persistent", "p_smem",     "cluster",   "groups",
                                                 "tensor_sum", "dq_block_m", "dq_block_n", "dq_warps",  "dq_stages"};
  return order;
}

// Fields that define the problem rather than tune it: never knobs, never listed as fixed.
bool defines_problem(const std::string& field) {
  for (const char* name :
       {"dtype", "head_dim", "mask", "softcap", "alibi", "varlen", "paged", "deterministic", "cache_dtype"})
    if (field == name) return true;
  return false;
}

// The order of a knob's value texts: numbers by value, off before on, other texts alphabetically; kAbsent last.
bool value_before(const std::string& a, const std::string& b) {
  auto rank = [](const std::string& v) {
    if (v == Knob::kAbsent) return 3;
    if (v == "off" || v == "on") return 1;
    char* end = nullptr;
    std::strtod(v.c_str(), &end);
    return !v.empty() && *end == '\0' ? 0 : 2;
  };
  const int ra = rank(a), rb = rank(b);
  if (ra != rb) return ra < rb;
  if (ra == 0) return std::strtod(a.c_str(), nullptr) < std::strtod(b.c_str(), nullptr);
  if (ra == 1) return a == "off" && b == "on";
  return a < b;
}

}  // namespace

std::optional<GpuPeak> datasheet_peak(const std::string& gpu_name) {
  const std::string name = lower(gpu_name);
  if (contains(name, "(no device)")) return std::nullopt;
  for (const PeakEntry& entry : peak_table()) {
    if (std::all_of(entry.parts.begin(), entry.parts.end(), [&](const char* part) { return contains(name, part); }))
      return entry.peak;
  }
  return std::nullopt;
}

std::optional<ProblemWork> problem_work(const ProblemKey& key) {
  if (key.varlen) return std::nullopt;
  constexpr double kElementBytes = 2;  // fp16 and bf16
  const double cache_bytes = elem_bytes(key.cache_dtype.value_or(key.dtype));  // a KV cache's: FP8 or 16-bit
  constexpr double kLseBytes = 4;      // one float per query row and head
  const double d = key.head_dim;
  const double heads_q = static_cast<double>(key.batch_heads_bucket);
  const double heads_kv = heads_q / std::max(key.gqa_ratio, 1);
  const double q_rows = heads_q * static_cast<double>(key.seqlen_q_bucket);
  const auto [mask, window] = mask_of(key);
  AttentionShape shape{
      1, key.seqlen_q_bucket, key.seqlen_k_bucket, key.batch_heads_bucket, key.batch_heads_bucket, key.head_dim};
  ProblemWork work;
  if (key.kv_cache) {
    work.flops = forward_flops(shape, mask, window);
    // Q read and O written, and each sequence's K and V read as far as its rows look.
    work.bytes = kElementBytes * d * 2 * q_rows + cache_bytes * d * 2 * heads_kv * static_cast<double>(keys_read(key));
  } else if (key.pass == Pass::kForward) {
    work.flops = forward_flops(shape, mask, window);
    work.fp8 = is_fp8(key.dtype);
    // Q, K, V read (FP8's of a byte); O (16-bit) and the log-sum-exp written.
    const double input_bytes = elem_bytes(key.dtype);
    work.bytes = input_bytes * d * (q_rows + 2 * heads_kv * static_cast<double>(key.seqlen_k_bucket)) +
                 kElementBytes * d * q_rows + kLseBytes * q_rows;
  } else {
    work.flops = backward_flops(shape, mask, window);
    // Q, O, dO read and dQ written; K, V read and dK, dV written; the log-sum-exp read.
    work.bytes =
        kElementBytes * d * (4 * q_rows + 4 * heads_kv * static_cast<double>(key.seqlen_k_bucket)) + kLseBytes * q_rows;
  }
  return work;
}

PeakFraction peak_fraction(const ProblemWork& work, const GpuPeak& peak, double ms) {
  PeakFraction f;
  const double seconds = ms * 1e-3;
  f.tflops = work.flops / seconds / 1e12;
  f.gbps = work.bytes / seconds / 1e9;
  const double math_peak = work.fp8 ? peak.fp8_tflops : peak.tflops;
  f.compute = math_peak > 0 ? f.tflops / math_peak : 0;
  f.memory = peak.hbm_gbps > 0 ? f.gbps / peak.hbm_gbps : 0;
  // At the peaks the math takes flops / peak_flops seconds and the traffic bytes / peak_bandwidth: the longer bounds.
  f.memory_bound = math_peak > 0 && work.bytes / (peak.hbm_gbps * 1e9) > work.flops / (math_peak * 1e12);
  return f;
}

const ReportCandidate* ReportSweep::find(const std::string& name) const {
  for (const ReportCandidate& c : candidates)
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<Knob> ReportSweep::knobs(std::vector<std::pair<std::string, std::string>>* fixed) const {
  std::vector<std::string> fields;
  for (const ReportCandidate& c : candidates) {
    if (!c.config.is_object()) continue;
    for (const auto& item : c.config.items())
      if (std::find(fields.begin(), fields.end(), item.key()) == fields.end()) fields.push_back(item.key());
  }
  const std::vector<std::string>& order = knob_order();
  auto position = [&](const std::string& field) {
    return static_cast<size_t>(std::find(order.begin(), order.end(), field) - order.begin());
  };
  std::stable_sort(fields.begin(), fields.end(), [&](const std::string& a, const std::string& b) {
    return std::make_tuple(position(a), a) < std::make_tuple(position(b), b);
  });

  std::vector<Knob> knobs;
  for (const std::string& field : fields) {
    std::vector<std::string> texts;
    std::set<std::string> present;
    for (const ReportCandidate& c : candidates) {
      const bool has = c.config.is_object() && c.config.contains(field);
      texts.push_back(has ? value_text(c.config[field]) : Knob::kAbsent);
      if (has) present.insert(texts.back());
    }
    if (present.size() < 2) {
      if (fixed != nullptr && !defines_problem(field) && !present.empty()) fixed->emplace_back(field, *present.begin());
      continue;
    }
    Knob knob;
    knob.name = field;
    std::set<std::string> distinct(texts.begin(), texts.end());
    knob.values.assign(distinct.begin(), distinct.end());
    std::sort(knob.values.begin(), knob.values.end(), value_before);
    for (const std::string& text : texts)
      knob.value_of.push_back(
          static_cast<size_t>(std::find(knob.values.begin(), knob.values.end(), text) - knob.values.begin()));
    knobs.push_back(std::move(knob));
  }
  return knobs;
}

ReportData read_report(const TuningStore& store, const ReportFilter& filter) {
  const json doc = store.export_json();
  const ImportedRows rows = parse_import(doc);
  ReportData data;
  data.db_path = store.path().string();
  data.filter = filter;
  data.problem_rows = rows.problems.size();
  data.candidate_rows = rows.candidates.size();
  data.winner_rows = rows.winners.size();

  std::map<std::string, size_t> device_index;
  for (const auto& [id, fingerprint] : rows.devices) {
    ReportDevice device;
    device.id = id;
    device.fingerprint = fingerprint;
    device.peak = datasheet_peak(fingerprint.gpu_name);
    data.devices.push_back(std::move(device));
  }
  label_devices(data.devices);
  std::sort(data.devices.begin(), data.devices.end(), [](const ReportDevice& a, const ReportDevice& b) {
    return std::tie(a.label, a.id) < std::tie(b.label, b.id);
  });
  for (size_t i = 0; i < data.devices.size(); ++i) device_index[data.devices[i].id] = i;
  data.device_sweeps.assign(data.devices.size(), 0);

  auto dated = [&](int64_t t) {
    data.first_update = data.first_update == 0 ? t : std::min(data.first_update, t);
    data.last_update = std::max(data.last_update, t);
  };
  // Sweeps by (problem id, device id); rows arrive in the export's order, which parse_import keeps.
  std::map<std::pair<std::string, std::string>, ReportSweep> sweeps;
  auto sweep_of = [&](const std::string& problem_id, const std::string& device_id) -> ReportSweep* {
    const DeviceFingerprint& device = rows.devices.at(device_id);
    if (!selected(filter, device_id, device, problem_id)) return nullptr;
    ReportSweep& sweep = sweeps[{problem_id, device_id}];
    sweep.device = device_index.at(device_id);
    return &sweep;
  };
  const json& candidate_rows = doc.at("candidates");
  for (size_t i = 0; i < rows.candidates.size(); ++i) {
    const ImportedCandidate& row = rows.candidates[i];
    ++data.candidates_by_status[candidate_status_name(row.result.status)];
    dated(row.updated_at);
    ReportSweep* sweep = sweep_of(row.problem_id, row.device_id);
    if (sweep == nullptr) continue;
    ReportCandidate c;
    c.name = config_name(row.result.config);
    c.config = row.result.config;
    c.status = row.result.status;
    c.median_ms = row.result.median_ms;
    c.spread = row.result.spread;
    c.samples = row.result.samples;
    c.detail = row.result.detail;
    c.updated_at = row.updated_at;
    c.extra = extra_fields(candidate_rows[i], {"device_id", "problem_id", "config_name", "config", "status",
                                               "median_ms", "spread", "samples", "detail", "updated_at"});
    sweep->candidates.push_back(std::move(c));
  }
  const json& winner_rows = doc.at("winners");
  for (size_t i = 0; i < rows.winners.size(); ++i) {
    const ImportedWinner& row = rows.winners[i];
    dated(row.updated_at);
    ReportSweep* sweep = sweep_of(row.problem_id, row.device_id);
    if (sweep == nullptr) continue;
    sweep->winner = config_name(row.config);
    sweep->winner_ms = row.median_ms;
    sweep->winner_updated_at = row.updated_at;
    sweep->decision = row.decision;
    sweep->winner_extra = extra_fields(
        winner_rows[i], {"device_id", "problem_id", "config_name", "config", "median_ms", "updated_at", "decision"});
  }

  std::map<std::string, ReportProblem> problems;
  for (auto& [ids, sweep] : sweeps) {
    const auto& [problem_id, device_id] = ids;
    std::stable_sort(sweep.candidates.begin(), sweep.candidates.end(),
                     [](const ReportCandidate& a, const ReportCandidate& b) {
                       const bool a_ok = a.status == CandidateStatus::kOk, b_ok = b.status == CandidateStatus::kOk;
                       if (a_ok != b_ok) return a_ok;
                       if (a_ok && a.median_ms != b.median_ms) return a.median_ms < b.median_ms;
                       return a.name < b.name;
                     });
    const ProblemKey& key = rows.problems.at(problem_id);
    find_builtin(sweep, key, rows.devices.at(device_id));
    if (sweep.decision && sweep.find(sweep.decision->incumbent) != nullptr) sweep.incumbent = sweep.decision->incumbent;
    ++data.device_sweeps[sweep.device];
    ReportProblem& problem = problems[problem_id];
    if (problem.id.empty()) {
      problem.id = problem_id;
      problem.key = key;
      problem.work = problem_work(key);
    }
    problem.sweeps.push_back(std::move(sweep));
  }
  for (auto& [id, problem] : problems) {
    std::sort(problem.sweeps.begin(), problem.sweeps.end(), [&](const ReportSweep& a, const ReportSweep& b) {
      return data.devices[a.device].label < data.devices[b.device].label;
    });
    data.problems.push_back(std::move(problem));
  }
  std::sort(data.problems.begin(), data.problems.end(), [](const ReportProblem& a, const ReportProblem& b) {
    const ProblemKey &x = a.key, &y = b.key;
    return std::make_tuple(x.class_id(), x.seqlen_q_bucket, x.seqlen_k_bucket, x.batch_heads_bucket, x.window_bucket,
                           a.id) < std::make_tuple(y.class_id(), y.seqlen_q_bucket, y.seqlen_k_bucket,
                                                   y.batch_heads_bucket, y.window_bucket, b.id);
  });
  return data;
}

std::string problem_title(const ProblemKey& key) {
  std::string pass;
  if (key.kv_cache)
    pass = std::string(key.paged ? "decode against a paged " : "decode against a ") +
           (key.cache_dtype ? std::string(dtype_name(*key.cache_dtype)) + " " : std::string()) + "KV cache";
  else if (key.pass == Pass::kForward)
    pass = key.varlen ? "forward of a packed batch" : "forward";
  else
    pass = std::string(key.dq == DqStrategy::kDeterministic ? "deterministic backward" : "backward") +
           (key.varlen ? " of a packed batch" : "");
  if (key.page_size > 0) pass += " (pages of " + std::to_string(key.page_size) + " keys)";
  std::string mask = mask_name(key.mask);
  if (key.mask == MaskKind::kWindow || key.mask == MaskKind::kChunk) {
    mask = std::string(key.mask == MaskKind::kChunk ? "chunks" : "window") + " of " +
           std::to_string(key.window_bucket) + (key.window_causal ? " keys, causal" : " keys");
  }
  if (key.mods.softcap) mask += ", soft cap";
  if (key.mods.alibi) mask += ", ALiBi";
  if (!key.user_tag.empty()) mask += ", user variant " + key.user_tag;
  std::string title = pass + ", " + dtype_name(key.dtype) + ", head_dim " + std::to_string(key.head_dim) + ", " + mask;
  if (key.gqa_ratio > 1) title += ", " + std::to_string(key.gqa_ratio) + " query heads per kv head";
  return title;
}

std::string problem_sizes(const ProblemKey& key) {
  if (key.kv_cache) {
    return std::to_string(key.seqlen_q_bucket) + " new token" + (key.seqlen_q_bucket == 1 ? "" : "s") +
           " per sequence, cache of " + std::to_string(key.seqlen_k_bucket) + " keys, batch × heads_q " +
           std::to_string(key.batch_heads_bucket);
  }
  if (key.varlen) {
    return "longest sequences " + std::to_string(key.seqlen_q_bucket) + " / " + std::to_string(key.seqlen_k_bucket) +
           ", sequences × heads_q " + std::to_string(key.batch_heads_bucket);
  }
  return "seqlen_q " + std::to_string(key.seqlen_q_bucket) + ", seqlen_k " + std::to_string(key.seqlen_k_bucket) +
         ", batch × heads_q " + std::to_string(key.batch_heads_bucket);
}

}  // namespace flashgen
