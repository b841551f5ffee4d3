// BwdConfig naming, validation, its answers of a call (can_implement, TMA, workspace) and JSON round-trip.
#include "generator/bwd_config.hpp"

#include <sstream>
#include <tuple>
#include <vector>

#include "flashgen/error.hpp"
#include "generator/kernel_module.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

const char* bwd_kernel_suffix(BwdKernel kernel) {
  switch (kernel) {
    case BwdKernel::kPreprocess: return "preprocess";
    case BwdKernel::kDkdv: return "dkdv";
    case BwdKernel::kDq: return "dq";
    case BwdKernel::kConvert: return "convert";
    case BwdKernel::kSinkGrad: return "sink_grad";
    case BwdKernel::kWiden: return "widen";
    case BwdKernel::kUserBlockTiles: return "user_tiles";
    case BwdKernel::kUserBlockRanges: return "user_ranges";
    case BwdKernel::kUserBlockBands: return "user_bands";
  }
  return "unknown";
}

std::string BwdConfig::name() const {
  // Built on every launch (it keys the loaded kernels): appends, no stream.
  using std::to_string;
  std::string name;
  const std::string value_suffix = value_dim_suffix(head_dim, value_dim());
  if (sm90()) {
    name = std::string("bwd_sm90_") + dtype_name(dtype) + "_d" + to_string(head_dim) + value_suffix + "_m" +
           to_string(block_m) +
           "_n" + to_string(block_n) + "_s" + to_string(stages);
  } else {
    const BwdSm80Knobs& k = std::get<BwdSm80Knobs>(knobs);
    name = std::string("bwd_sm80_") + dtype_name(dtype) + "_d" + to_string(head_dim) + value_suffix + "_m" +
           to_string(block_m) +
           "_n" + to_string(block_n) + "_w" + to_string(k.warps) + "_s" + to_string(stages) + "_x" +
           to_string(k.d_split);
  }
  name += mask_suffix(mask) + score_mods_suffix(mods);
  if (sink_grad) name += "_dsink";
  if (varlen) name += "_varlen";
  if (fp8_inputs) name += "_fp8in";
  if (deterministic) name += "_det";
  if (has_dq_kernel()) {
    name += "_qm" + to_string(dq_block_m) + "_qn" + to_string(dq_block_n) + "_qw" + to_string(dq_warps) + "_qs" +
            to_string(dq_stages);
  }
  return name + user_variant_suffix(user);
}

std::string BwdConfig::symbol(BwdKernel kernel) const { return name() + "_" + bwd_kernel_suffix(kernel); }

BwdConfig BwdConfig::from_name(const std::string& name) {
  std::vector<std::string> fields;
  std::istringstream in(name);
  for (std::string field; std::getline(in, field, '_');) fields.push_back(field);
  // _v<head_dim_v> after _d<head_dim>: one field more.
  const size_t value_field = fields.size() > 4 && fields[4].size() > 1 && fields[4][0] == 'v' ? 1 : 0;
  const bool sm90 = fields.size() >= 7 + value_field && fields[0] == "bwd" && fields[1] == "sm90";
  FLASHGEN_REQUIRE(sm90 || (fields.size() >= 9 + value_field && fields[0] == "bwd" && fields[1] == "sm80"),
                   "config name '" + name +
                       "': expected bwd_sm80_<fp16|bf16>_d<head_dim>[_v<head_dim_v>]_m<block_m>_n<block_n>_w<warps>_s<stages>"
                       "_x<d_split>[_causal|_window][_softcap][_alibi][_dsink][_varlen][_fp8in]"
                       "[_det_qm<m>_qn<n>_qw<warps>_qs<stages>] "
                       "or bwd_sm90_<fp16|bf16>_d<head_dim>[_v<head_dim_v>]_m<block_m>_n<block_n>_s<stages>[_causal|_window]"
                       "[_softcap][_alibi][_dsink][_varlen][_fp8in][_det]");
  BwdConfig c;
  if (sm90) c.knobs = BwdSm90Knobs{};
  BwdSm80Knobs* k80 = c.sm80();
  c.dtype = parse_dtype_field(fields[2], name);
  c.head_dim = parse_name_field(fields[3], "d", name);
  if (value_field) c.head_dim_v = parse_name_field(fields[4], "v", name);
  c.block_m = parse_name_field(fields[4 + value_field], "m", name);
  c.block_n = parse_name_field(fields[5 + value_field], "n", name);
  size_t i = 6 + value_field;
  if (k80) k80->warps = parse_name_field(fields[i++], "w", name);
  c.stages = parse_name_field(fields[i++], "s", name);
  if (k80) k80->d_split = parse_name_field(fields[i++], "x", name);
  if (i < fields.size() && read_mask_suffix(fields[i], c.mask)) ++i;
  while (i < fields.size() && read_score_mod_suffix(fields[i], c.mods)) ++i;
  if (i < fields.size() && fields[i] == "dsink") {
    c.sink_grad = true;
    ++i;
  }
  if (i < fields.size() && fields[i] == "varlen") {
    c.varlen = true;
    ++i;
  }
  if (i < fields.size() && fields[i] == "fp8in") {
    c.fp8_inputs = true;
    ++i;
  }
  if (i < fields.size() && fields[i] == "det") {
    c.deterministic = true;
    ++i;
    if (c.has_dq_kernel()) {
      FLASHGEN_REQUIRE(i + 4 == fields.size(),
                       "config name '" + name + "': the sm80 family's _det takes _qm<m>_qn<n>_qw<warps>_qs<stages>");
      c.dq_block_m = parse_name_field(fields[i], "qm", name);
      c.dq_block_n = parse_name_field(fields[i + 1], "qn", name);
      c.dq_warps = parse_name_field(fields[i + 2], "qw", name);
      c.dq_stages = parse_name_field(fields[i + 3], "qs", name);
      i += 4;
    } else {
      FLASHGEN_REQUIRE(i == fields.size(), "config name '" + name +
                                               "': the sm90 family's deterministic strategy has no dq kernel: "
                                               "end the name at _det");
    }
  }
  FLASHGEN_REQUIRE(i == fields.size(), "config name '" + name + "': unknown suffix '" +
                                           (i < fields.size() ? fields[i] : std::string()) + "'");
  FLASHGEN_REQUIRE(c.name() == name, "config name '" + name + "' is not canonical; did you mean '" + c.name() + "'?");
  return c;
}

BwdDkdvTraits BwdConfig::dkdv_traits() const {
  const BwdSm80Knobs* k = sm80();
  if (k == nullptr) fail(Status::kInternal, "config " + name() + " has no sm80-family dkdv traits");
  return bwd_dkdv_traits(head_dim, block_m, block_n, k->warps, stages, k->d_split, !deterministic, value_dim());
}

BwdDqTraits BwdConfig::dq_traits() const {
  return bwd_dq_traits(head_dim, dq_block_m, dq_block_n, dq_warps, dq_stages, value_dim());
}

BwdSm90Traits BwdConfig::sm90_traits() const {
  if (sm90() == nullptr) fail(Status::kInternal, "config " + name() + " has no sm90-family traits");
  return bwd_sm90_traits(head_dim, block_m, block_n, stages, sm90_lock_step(), value_dim());
}

bool BwdConfig::sm90_lock_step() const {
  // The variant's kWideScoreWork (variant.cuh): a user's score_mod or mask, or the soft cap under ALiBi.
  const bool wide_score_work =
      (mods.softcap && mods.alibi) || (user != nullptr && (!user->score_mod.empty() || user->masks()));
  return bwd_sm90_lock_step(wide_score_work);
}

DqAccum BwdConfig::dq_accum() const {
  if (sm90()) return DqAccum::kTiles;
  return deterministic ? DqAccum::kNone : DqAccum::kRows;
}

int BwdConfig::threads(BwdKernel kernel) const {
  switch (kernel) {
    case BwdKernel::kDkdv: return sm90() ? sm90_traits().threads : dkdv_traits().threads;
    case BwdKernel::kDq: return dq_traits().threads;
    case BwdKernel::kPreprocess:
    case BwdKernel::kConvert:
    case BwdKernel::kSinkGrad:
    case BwdKernel::kWiden: return kBwdRowKernelThreads;
    case BwdKernel::kUserBlockTiles:
    case BwdKernel::kUserBlockBands: return kUserBlockThreads;
    case BwdKernel::kUserBlockRanges: return kUserBlockRangesThreads;
  }
  fail(Status::kInternal, "unknown backward kernel");
}

int BwdConfig::pad_rows() const { return sm90() ? kBwdSm90PadRows : 1; }

int BwdConfig::sink_partial_warps() const { return sm90() ? sm90_traits().consumers * 4 : sm80()->warps; }

int BwdConfig::smem_bytes(BwdKernel kernel) const {
  if (kernel == BwdKernel::kDkdv) return sm90() ? sm90_traits().smem_bytes : dkdv_traits().smem_bytes;
  if (kernel == BwdKernel::kDq) return dq_traits().smem_bytes;
  return 0;
}

std::vector<BwdKernel> BwdConfig::spill_checked_kernels() const {
  if (has_dq_kernel()) return {BwdKernel::kDkdv, BwdKernel::kDq};
  return {BwdKernel::kDkdv};
}

std::optional<std::string> BwdConfig::invalid_reason(int arch) const {
  if (sm90()) {
    if (arch != 90) return "the sm90 kernel family needs sm_90 (wgmma, TMA and setmaxnreg are sm_90a instructions)";
    const BwdSm90Traits t = sm90_traits();
    if (t.error != nullptr) return std::string(t.error);
  } else {
    if (arch < 80) return "the sm80 kernel family needs sm_80 or newer (mma.sync m16n8k16 bf16, cp.async)";
    const BwdDkdvTraits dkdv = dkdv_traits();
    if (dkdv.error != nullptr) return std::string(dkdv.error);
  }
  const int limit = max_smem_per_block(arch);
  if (smem_bytes(BwdKernel::kDkdv) > limit) {
    return "dkdv kernel needs " + std::to_string(smem_bytes(BwdKernel::kDkdv)) + " bytes of shared memory; sm_" +
           std::to_string(arch) + " allows " + std::to_string(limit) + " per block";
  }
  if (has_dq_kernel()) {
    const BwdDqTraits dq = dq_traits();
    if (dq.error != nullptr) return std::string(dq.error);
    if (dq.smem_bytes > limit) {
      return "dq kernel needs " + std::to_string(dq.smem_bytes) + " bytes of shared memory; sm_" +
             std::to_string(arch) + " allows " + std::to_string(limit) + " per block";
    }
  }
  return std::nullopt;
}

size_t BwdConfig::workspace_rows(const AttnBwdParams& p) const {
  const size_t pad = static_cast<size_t>(pad_rows());
  return (static_cast<size_t>(p.seqlen_q) + pad - 1) / pad * pad;
}

Implementability BwdConfig::can_implement(const AttentionProblem& problem, const AttnBwdParams& params,
                                          const DeviceTraits& device) const {
  if (Implementability fit = problem_fit(*this, problem, device.sm); !fit) return fit;
  if (family() == KernelFamily::kSm90) {
    if (auto why = BwdTmaTensors(problem, params, *this).unsupported_reason()) return {Shortfall::kTmaLayout, *why};
  }
  return {};
}

BwdWorkspace BwdConfig::workspace(const AttnBwdParams& p, size_t user_classes_bytes) const {
  // Rows over every (batch, head); a packed batch's per head as packed_workspace_rows gives them (total_q, or with
  // padded rows room for each sequence's padding).
  const size_t rows = size_t(
      bwd_workspace_rows(p.cu_seqlens_q != nullptr, p.total_q, p.batch, p.heads_q, p.seqlen_q, pad_rows()));
  BwdWorkspace w;
  w.dsum = w.append(sizeof(float) * rows);
  if (sink_grad) {
    const int key_blocks = (p.seqlen_k + block_n - 1) / block_n;
    w.sink_partials = w.append(
        sizeof(float) * size_t(bwd_sink_partials_count(p.heads_q, p.batch, key_blocks, sink_partial_warps())));
  }
  if (family() == KernelFamily::kSm90) w.lse_log2 = w.append(sizeof(float) * rows);
  if (dq_accum() != DqAccum::kNone) {
    w.dq_accum = w.append(sizeof(float) * rows * size_t(dq_accum_cols(dq_accum(), head_dim)));
  }
  if (dq_accum() == DqAccum::kTiles) {
    w.dq_semaphore = w.append(sizeof(int) * kBwdSm90SemaphoreInts * (rows / kBwdSm90SemaphoreRows));
  }
  if (user_classes_bytes > 0) w.user_classes = w.append(user_classes_bytes);
  if (p.fp8_format != 0) {  // dense batches only: batch entries of seqlen rows
    const size_t q_elems = size_t(p.batch) * size_t(p.seqlen_q) * size_t(p.heads_q) * size_t(head_dim);
    const size_t k_elems = size_t(p.batch) * size_t(p.seqlen_k) * size_t(p.heads_kv) * size_t(head_dim);
    w.widened[0] = w.append(2 * q_elems);
    w.widened[1] = w.append(2 * k_elems);
    w.widened[2] = w.append(2 * size_t(p.batch) * size_t(p.seqlen_k) * size_t(p.heads_kv) * size_t(value_dim()));
  }
  return w;
}

BwdTmaTensors::BwdTmaTensors(const AttentionProblem& problem, const AttnBwdParams& p, const BwdConfig& config) {
  const TmaCallLayout layout(problem, p);
  q = layout.queries(p.q, p.heads_q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  dout = layout.queries(p.dout, p.heads_q, p.do_batch_stride, p.do_row_stride, p.do_head_stride, problem.value_dim());
  k = layout.keys(p.k, p.heads_kv, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  v = layout.keys(p.v, p.heads_kv, p.v_batch_stride, p.v_row_stride, p.v_head_stride, problem.value_dim());
  dk = layout.keys(p.dk, p.heads_kv, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  dv = layout.keys(p.dv, p.heads_kv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, problem.value_dim());
  q_rows = config.block_m;
  kv_rows = config.block_n;
}

std::optional<std::string> BwdTmaTensors::unsupported_reason() const {
  for (const auto& [t, rows, name] :
       {std::tuple{&q, q_rows, "q"}, std::tuple{&dout, q_rows, "dout"}, std::tuple{&k, kv_rows, "k"},
        std::tuple{&v, kv_rows, "v"}, std::tuple{&dk, kGradRows, "dk"}, std::tuple{&dv, kGradRows, "dv"}}) {
    if (auto why = tma_unsupported_reason(*t, rows)) return std::string(name) + ": " + *why;
  }
  return std::nullopt;
}

void to_json(nlohmann::json& j, const BwdConfig& c) {
  if (c.sm90()) {
    j = nlohmann::json{{"family", "bwd_sm90"},
                       {"dtype", dtype_name(c.dtype)},
                       {"head_dim", c.head_dim},
                       {"mask", mask_name(c.mask)},
                       {"block_m", c.block_m},
                       {"block_n", c.block_n},
                       {"stages", c.stages},
                       {"deterministic", c.deterministic}};
  } else {
    const BwdSm80Knobs& k = std::get<BwdSm80Knobs>(c.knobs);
    j = nlohmann::json{{"family", "bwd_sm80"},
                       {"dtype", dtype_name(c.dtype)},
                       {"head_dim", c.head_dim},
                       {"mask", mask_name(c.mask)},
                       {"block_m", c.block_m},
                       {"block_n", c.block_n},
                       {"warps", k.warps},
                       {"stages", c.stages},
                       {"d_split", k.d_split},
                       {"deterministic", c.deterministic}};
  }
  if (c.value_dim() != c.head_dim) j["head_dim_v"] = c.value_dim();  // absent: the values' head dim is head_dim
  if (c.varlen) j["varlen"] = true;  // absent: dense kernels, as every config before it had
  score_mods_to_json(j, c.mods);
  if (c.sink_grad) j["sink_grad"] = true;  // absent: today's formula, as every config before it had
  if (c.fp8_inputs) j["fp8_inputs"] = true;
  if (c.has_dq_kernel()) {
    j["dq_block_m"] = c.dq_block_m;
    j["dq_block_n"] = c.dq_block_n;
    j["dq_warps"] = c.dq_warps;
    j["dq_stages"] = c.dq_stages;
  }
}

void from_json(const nlohmann::json& j, BwdConfig& c) {
  FLASHGEN_REQUIRE(j.is_object(), "backward config JSON must be an object");
  BwdConfig config;
  bool sm90 = false;
  if (j.contains("family")) {
    FLASHGEN_REQUIRE(j["family"] == "bwd_sm80" || j["family"] == "bwd_sm90",
                     "backward config JSON: unknown family " + j["family"].dump() + " (bwd_sm80 or bwd_sm90)");
    sm90 = j["family"] == "bwd_sm90";
  }
  read_dtype_and_mask(j, "backward config JSON", config.dtype, config.mask);
  auto get_int = [&](const char* key, int& out) {
    if (!j.contains(key)) return;
    FLASHGEN_REQUIRE(is_int_field(j[key]), std::string("backward config JSON: '") + key + "' must be an integer, got " +
                                              j[key].dump());
    out = j[key].get<int>();
  };
  get_int("head_dim", config.head_dim);
  get_int("head_dim_v", config.head_dim_v);
  get_int("block_m", config.block_m);
  get_int("block_n", config.block_n);
  get_int("stages", config.stages);
  BwdSm80Knobs sm80_knobs;
  get_int("warps", sm80_knobs.warps);
  get_int("d_split", sm80_knobs.d_split);
  // The sm80 family's knobs may be present at their defaults in an sm90 config, which has no room for others.
  if (sm90) {
    FLASHGEN_REQUIRE(sm80_knobs == BwdSm80Knobs{}, "backward config JSON: warps and d_split are sm80-family knobs");
    config.knobs = BwdSm90Knobs{};
  } else {
    config.knobs = sm80_knobs;
  }
  get_int("dq_block_m", config.dq_block_m);
  get_int("dq_block_n", config.dq_block_n);
  get_int("dq_warps", config.dq_warps);
  get_int("dq_stages", config.dq_stages);
  if (j.contains("deterministic")) {
    FLASHGEN_REQUIRE(j["deterministic"].is_boolean(), "backward config JSON: 'deterministic' must be true or false");
    config.deterministic = j["deterministic"].get<bool>();
  }
  if (j.contains("varlen")) {
    FLASHGEN_REQUIRE(j["varlen"].is_boolean(), "backward config JSON: 'varlen' must be true or false");
    config.varlen = j["varlen"].get<bool>();
  }
  read_score_mods(j, "backward config JSON", config.mods);
  if (j.contains("fp8_inputs")) {
    FLASHGEN_REQUIRE(j["fp8_inputs"].is_boolean(), "backward config JSON: 'fp8_inputs' must be true or false");
    config.fp8_inputs = j["fp8_inputs"].get<bool>();
  }
  if (j.contains("sink_grad")) {
    FLASHGEN_REQUIRE(j["sink_grad"].is_boolean(), "backward config JSON: 'sink_grad' must be true or false");
    config.sink_grad = j["sink_grad"].get<bool>();
  }
  if (!config.has_dq_kernel()) {  // dq tiles of a module without a dq kernel (an older sm90 record) mean nothing
    const BwdConfig defaults;
    config.dq_block_m = defaults.dq_block_m, config.dq_block_n = defaults.dq_block_n;
    config.dq_warps = defaults.dq_warps, config.dq_stages = defaults.dq_stages;
  }
  c = config;
}

}  // namespace flashgen
