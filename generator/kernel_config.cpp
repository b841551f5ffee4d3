// KernelConfig naming, validation, its answers of a call (can_implement, TMA) and JSON round-trip. Validity itself
// lives in templates/fwd_traits.cuh, shared with the kernel's static_asserts.
#include "generator/kernel_config.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <limits>
#include <sstream>
#include <tuple>

#include "flashgen/error.hpp"
#include "generator/kernel_module.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

const char* mask_name(MaskKind mask) {
  switch (mask) {
    case MaskKind::kCausal: return "causal";
    case MaskKind::kWindow: return "window";
    case MaskKind::kChunk: return "chunk";
    case MaskKind::kNone: break;
  }
  return "none";
}

std::string mask_suffix(MaskKind mask) { return mask == MaskKind::kNone ? "" : std::string("_") + mask_name(mask); }

bool read_mask_suffix(const std::string& field, MaskKind& mask) {
  if (mask != MaskKind::kNone) return false;
  for (MaskKind kind : {MaskKind::kCausal, MaskKind::kWindow, MaskKind::kChunk}) {
    if (field == mask_name(kind)) {
      mask = kind;
      return true;
    }
  }
  return false;
}

std::string user_variant_suffix(const std::shared_ptr<const UserVariant>& user) {
  return user ? "_" + user->tag : std::string();
}

bool same_user_variant(const std::shared_ptr<const UserVariant>& a, const std::shared_ptr<const UserVariant>& b) {
  return a == b || (a && b && a->tag == b->tag);
}

std::string score_mods_suffix(const ScoreMods& mods) {
  std::string suffix;
  if (mods.softcap) suffix += "_softcap";
  if (mods.alibi) suffix += "_alibi";
  return suffix;
}

bool read_score_mod_suffix(const std::string& field, ScoreMods& mods) {
  for (auto [name, flag] : {std::pair{"softcap", &mods.softcap}, std::pair{"alibi", &mods.alibi}}) {
    if (field == name && !*flag) return *flag = true;
  }
  return false;
}

void score_mods_to_json(nlohmann::json& j, const ScoreMods& mods) {
  if (mods.softcap) j["softcap"] = true;
  if (mods.alibi) j["alibi"] = true;
}

void read_score_mods(const nlohmann::json& j, const char* what, ScoreMods& mods) {
  for (auto [name, flag] : {std::pair{"softcap", &mods.softcap}, std::pair{"alibi", &mods.alibi}}) {
    if (!j.contains(name)) continue;
    FLASHGEN_REQUIRE(j[name].is_boolean(), std::string(what) + ": '" + name + "' must be true or false");
    *flag = j[name].get<bool>();
  }
}

std::string value_dim_suffix(int head_dim, int value_dim) {
  return value_dim != head_dim ? "_v" + std::to_string(value_dim) : std::string();
}

std::string KernelConfig::name() const {
  // Built on every launch (it keys the loaded kernels): appends, no stream.
  using std::to_string;
  if (const Sm90Knobs* k = sm90()) {
    std::string name = std::string("fwd_sm90_") + dtype_name(dtype) + "_d" + to_string(head_dim) +
                       value_dim_suffix(head_dim, value_dim()) + "_m" + to_string(block_m) + "_n" + to_string(block_n) + "_s" +
                       to_string(stages);
    if (out_dtype) name += std::string("_o") + dtype_name(*out_dtype);
    name += mask_suffix(mask) + score_mods_suffix(mods);
    if (k->overlap) name += "_ovl";
    if (k->pingpong) name += "_pp";
    if (k->persistent) name += "_pst";
    if (k->p_smem) name += "_psm";
    if (k->cluster != 1) name += "_c" + to_string(k->cluster);
    if (k->groups != 1) name += "_g" + to_string(k->groups);
    if (k->tensor_sum) name += "_tsum";
    if (k->value_split != 1) name += "_vs" + to_string(k->value_split);
    if (varlen) name += "_varlen";
    if (paged) name += "_paged";
    return name + user_variant_suffix(user);
  }
  const Sm80Knobs& k = std::get<Sm80Knobs>(knobs);
  std::string name = std::string("fwd_sm80_") + dtype_name(dtype) + "_d" + to_string(head_dim) + value_dim_suffix(head_dim, value_dim()) +
                     "_m" + to_string(block_m) + "_n" + to_string(block_n) + "_w" + to_string(k.warps) + "_s" +
                     to_string(stages);
  name += mask_suffix(mask) + score_mods_suffix(mods);
  if (k.q_in_regs) name += "_qreg";
  if (varlen) name += "_varlen";
  if (paged) name += "_paged";
  return name + user_variant_suffix(user);
}

DType parse_dtype_field(const std::string& field, const std::string& name, bool fp8_taken) {
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    if (field == dtype_name(t) && (fp8_taken || !is_fp8(t))) return t;
  }
  fail(Status::kInvalidArgument, "config name '" + name + "': dtype must be fp16 or bf16" +
                                     (fp8_taken ? std::string(" (or e4m3, e5m2)") : "") + ", got '" + field + "'");
}

int parse_name_field(const std::string& field, const std::string& prefix, const std::string& name) {
  int value = 0;
  const bool has_prefix = field.size() > prefix.size() && field.compare(0, prefix.size(), prefix) == 0;
  const char* first = field.data() + prefix.size();
  const char* last = field.data() + field.size();
  const std::from_chars_result parsed =
      has_prefix ? std::from_chars(first, last, value) : std::from_chars_result{first, std::errc::invalid_argument};
  FLASHGEN_REQUIRE(parsed.ec == std::errc() && parsed.ptr == last,
                   "config name '" + name + "': expected '" + prefix + "<number>', got '" + field + "'");
  return value;
}

KernelConfig KernelConfig::from_name(const std::string& name) {
  std::vector<std::string> fields;
  std::istringstream in(name);
  for (std::string field; std::getline(in, field, '_');) fields.push_back(field);
  const bool sm90 = fields.size() >= 7 && fields[0] == "fwd" && fields[1] == "sm90";
  FLASHGEN_REQUIRE(sm90 || (fields.size() >= 8 && fields[0] == "fwd" && fields[1] == "sm80"),
                   "config name '" + name +
                       "': expected fwd_sm80_<fp16|bf16>_d<head_dim>[_v<head_dim_v>]_m<block_m>_n<block_n>_w<warps>_s<stages>"
                       "[_causal|_window|_chunk][_softcap][_alibi][_qreg][_varlen[_paged]] or "
                       "fwd_sm90_<fp16|bf16>_d<head_dim>[_v<head_dim_v>]_m<block_m>_n<block_n>_s<stages>[_causal|_window|_chunk][_softcap]"
                       "[_alibi]"
                       "[_ovl][_pp][_pst][_psm][_c2][_g2][_tsum][_vs2]");
  KernelConfig config;
  if (sm90) config.knobs = Sm90Knobs{};
  Sm80Knobs* k80 = config.sm80();  // exactly one of the two is set
  Sm90Knobs* k90 = config.sm90();
  config.dtype = parse_dtype_field(fields[2], name, /*fp8_taken=*/sm90);
  config.head_dim = parse_name_field(fields[3], "d", name);
  size_t next = 4;
  if (fields[next].size() > 1 && fields[next][0] == 'v') config.head_dim_v = parse_name_field(fields[next++], "v", name);
  FLASHGEN_REQUIRE(fields.size() >= next + (k80 ? 4 : 3), "config name '" + name + "': too few fields");
  config.block_m = parse_name_field(fields[next++], "m", name);
  config.block_n = parse_name_field(fields[next++], "n", name);
  if (k80) k80->warps = parse_name_field(fields[next++], "w", name);
  config.stages = parse_name_field(fields[next++], "s", name);
  for (size_t i = next; i < fields.size(); ++i) {
    if (read_mask_suffix(fields[i], config.mask) || read_score_mod_suffix(fields[i], config.mods)) {
      continue;
    } else if ((fields[i] == "ofp16" || fields[i] == "obf16") && k90 && !config.out_dtype) {
      config.out_dtype = parse_dtype_field(fields[i].substr(1), name, false);
    } else if (fields[i] == "qreg" && k80 && !k80->q_in_regs) {
      k80->q_in_regs = true;
    } else if (fields[i] == "ovl" && k90 && !k90->overlap) {
      k90->overlap = true;
    } else if (fields[i] == "pp" && k90 && !k90->pingpong) {
      k90->pingpong = true;
    } else if (fields[i] == "pst" && k90 && !k90->persistent) {
      k90->persistent = true;
    } else if (fields[i] == "psm" && k90 && !k90->p_smem) {
      k90->p_smem = true;
    } else if (fields[i].size() > 1 && fields[i][0] == 'c' && k90 && k90->cluster == 1) {
      k90->cluster = parse_name_field(fields[i], "c", name);
    } else if (fields[i].size() > 1 && fields[i][0] == 'g' && k90 && k90->groups == 1) {
      k90->groups = parse_name_field(fields[i], "g", name);
    } else if (fields[i] == "tsum" && k90 && !k90->tensor_sum) {
      k90->tensor_sum = true;
    } else if (fields[i].size() > 2 && fields[i].compare(0, 2, "vs") == 0 && k90 && k90->value_split == 1) {
      k90->value_split = parse_name_field(fields[i], "vs", name);
    } else if (fields[i] == "varlen" && !config.varlen) {
      config.varlen = true;
    } else if (fields[i] == "paged" && config.varlen && !config.paged) {
      config.paged = true;
    } else {
      fail(Status::kInvalidArgument, "config name '" + name + "': unknown suffix '" + fields[i] + "'");
    }
  }
  // Only canonical spellings name a kernel: "d0128" would parse but is another cache key.
  FLASHGEN_REQUIRE(config.name() == name,
                   "config name '" + name + "' is not canonical; did you mean '" + config.name() + "'?");
  return config;
}

FwdTraits KernelConfig::traits() const {
  const Sm80Knobs* k = sm80();
  if (k == nullptr) fail(Status::kInternal, "config " + name() + " has no sm80-family traits");
  return fwd_traits(head_dim, block_m, block_n, k->warps, stages, k->q_in_regs, value_dim());
}

FwdSm90Traits KernelConfig::sm90_traits() const {
  const Sm90Knobs* k = sm90();
  if (k == nullptr) fail(Status::kInternal, "config " + name() + " has no sm90-family traits");
  return fwd_sm90_traits(head_dim, block_m, block_n, stages, k->pingpong, k->persistent, k->p_smem, k->cluster, mask,
                         k->groups, k->tensor_sum, dtype, paged, value_dim(), k->value_split);
}

std::string KernelConfig::symbol(FwdKernel kernel) const {
  switch (kernel) {
    case FwdKernel::kAttend: return name();
    case FwdKernel::kUserBlockTiles: return name() + "_blocks";
    case FwdKernel::kUserBlockRanges: return name() + "_blocks_ranges";
    case FwdKernel::kValuesT: return name() + "_values_t";
  }
  fail(Status::kInternal, "unknown forward kernel");
}

int64_t KernelConfig::values_t_keys(const AttnFwdParams& p) const {
  if (paged) return fp8_values_t_origin(true, 0, p.batch, p.seqlen_k, kFp8BlockN);  // where a next sequence would start
  return varlen ? packed_workspace_rows(p.total_k, p.batch, kFp8BlockN) : (int64_t(p.seqlen_k) + 31) / 32 * 32;
}

size_t KernelConfig::values_t_bytes(const AttnFwdParams& p) const {
  if (!is_fp8(dtype)) return 0;
  return size_t(values_t_entries(p)) * size_t(p.heads_kv) * size_t(head_dim) * size_t(values_t_keys(p));
}

int64_t KernelConfig::values_t_key_blocks(const AttnFwdParams& p) const {
  const int64_t keys = varlen ? (int64_t(p.seqlen_k) + kFp8BlockN - 1) / kFp8BlockN * kFp8BlockN : values_t_keys(p);
  return (keys + 63) / 64;
}

int KernelConfig::threads(FwdKernel kernel) const {
  switch (kernel) {
    case FwdKernel::kAttend: return sm90() ? sm90_traits().threads : traits().threads;
    case FwdKernel::kUserBlockTiles: return kUserBlockThreads;
    case FwdKernel::kUserBlockRanges: return kUserBlockRangesThreads;
    case FwdKernel::kValuesT: return kValuesThreads;
  }
  fail(Status::kInternal, "unknown forward kernel");
}

int KernelConfig::smem_bytes(FwdKernel kernel) const {
  if (kernel != FwdKernel::kAttend) return 0;
  return sm90() ? sm90_traits().smem_bytes : traits().smem_bytes;
}

const char* KernelConfig::shape_error() const { return sm90() ? sm90_traits().error : traits().error; }

std::optional<std::string> KernelConfig::invalid_reason(int arch) const {
  if (is_fp8(dtype) && !sm90()) return "FP8 attention runs on the sm90 kernel family (8-bit wgmma) only";
  if (out_dtype.has_value() != is_fp8(dtype) || (out_dtype && is_fp8(*out_dtype))) {
    return "an FP8 config names its output type (bf16 or fp16), and only an FP8 config does";
  }
  if (sm90()) {
    if (arch != 90) return "the sm90 kernel family needs sm_90a (wgmma, TMA, setmaxnreg)";
    if (user && user->masks() && sm90()->cluster != 1) {
      return "a user mask hides keys, and the sm90 family's clusters share every key block between their tiles";
    }
    if (varlen && (sm90()->persistent || sm90()->cluster != 1 || sm90()->groups != 1)) {
      return "the sm90 kernel family reads packed variable-length batches one block per tile: no persistent walk, "
             "clusters or groups";
    }
  } else if (arch < 80) {
    return "the sm80 kernel family needs sm_80 or newer (mma.sync m16n8k16 bf16, cp.async)";
  }
  if (paged && !varlen) return "paged keys and values come with packed variable-length batches (varlen)";
  if (const char* error = shape_error()) return std::string(error);
  if (smem_bytes() > max_smem_per_block(arch)) {
    return "needs " + std::to_string(smem_bytes()) + " bytes of shared memory; sm_" + std::to_string(arch) +
           " allows " + std::to_string(max_smem_per_block(arch)) + " per block";
  }
  return std::nullopt;
}

int KernelConfig::cluster_size() const { return sm90() != nullptr ? sm90()->cluster : 1; }

bool KernelConfig::persistent() const { return sm90() != nullptr && sm90()->persistent; }

int64_t KernelConfig::query_blocks(const AttnFwdParams& p) const { return (p.seqlen_q + block_m - 1) / block_m; }

int64_t KernelConfig::persistent_tiles(const AttnFwdParams& p) const {
  const int cluster = cluster_size();
  return (query_blocks(p) + cluster - 1) / cluster * p.heads_q * p.batch;
}

Implementability KernelConfig::can_implement(const AttentionProblem& problem, const AttnFwdParams& params,
                                             const DeviceTraits& device) const {
  if (Implementability fit = problem_fit(*this, problem, device.sm); !fit) return fit;
  if (varlen != problem.varlen || paged != problem.paged) {
    const char* config_batch =
        varlen ? (paged ? "packed batches over a paged cache" : "packed batches") : "dense batches";
    const char* call_batch =
        problem.varlen ? (problem.paged ? "packed batch over a paged cache" : "packed batch") : "dense batch";
    return {Shortfall::kProblem, std::string("is for ") + config_batch + ", not for this call's " + call_batch};
  }
  if (family() == KernelFamily::kSm90) {
    if (auto why = FwdTmaTensors(problem, params, *this).unsupported_reason()) return {Shortfall::kTmaLayout, *why};
  }
  // The kernel walks the tile list with int indices, up to a walker count past its end.
  const int64_t tiles = persistent_tiles(params);
  if (persistent() && tiles > INT32_MAX - 2 * int64_t(device.multiprocessors)) {
    return {Shortfall::kTileCount, std::to_string(tiles) + " tiles are more than a persistent kernel indexes"};
  }
  return {};
}

FwdTmaTensors::FwdTmaTensors(const AttentionProblem& problem, const AttnFwdParams& p, const KernelConfig& config) {
  const TmaCallLayout layout(problem, p);
  q = layout.queries(p.q, p.heads_q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  k = layout.keys(p.k, p.heads_kv, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  v = layout.keys(p.v, p.heads_kv, p.v_batch_stride, p.v_row_stride, p.v_head_stride, problem.value_dim());
  o = layout.queries(p.o, p.heads_q, p.o_batch_stride, p.o_row_stride, p.o_head_stride, problem.value_dim());
  o.dtype = problem.output_dtype();
  q_rows = config.block_m;
  kv_rows = v_rows = config.block_n;
  if (is_fp8(config.dtype)) {
    const int64_t keys = config.values_t_keys(p), dim = problem.value_dim();
    v = TmaTensor{p.v_t, problem.dtype, config.values_t_entries(p), dim, p.heads_kv, keys, p.heads_kv * dim * keys,
                  keys,  dim * keys,    true};
    v_rows = config.sm90_traits().tile_dim_v;
  }
  paged = problem.paged;
  if (paged) {
    auto pages = [&](const void* data, int dim, long long page_stride, long long rs, long long hs) {
      return TmaTensor{data, problem.dtype, p.num_pages, p.page_size, p.heads_kv, dim, page_stride, rs, hs};
    };
    k = pages(p.k, problem.head_dim(), p.k_page_stride, p.k_row_stride, p.k_head_stride);
    kv_rows = paged_box_rows(p.page_size, config.block_n);  // each box within one page
    if (!is_fp8(config.dtype)) {  // FP8 reads Vᵀ, gathered from the pages (above)
      v = pages(p.v, problem.value_dim(), p.v_page_stride, p.v_row_stride, p.v_head_stride);
      v_rows = kv_rows;
      v_fine = true;
    }
  }
}

std::optional<std::string> FwdTmaTensors::unsupported_reason() const {
  for (const auto& [t, rows, name] : {std::tuple{&q, q_rows, "q"}, std::tuple{&k, kv_rows, "k"},
                                      std::tuple{&v, v_rows, "v"}, std::tuple{&o, kORows, "out"}}) {
    if (auto why = tma_unsupported_reason(*t, rows)) return std::string(name) + ": " + *why;
  }
  return std::nullopt;
}

bool KernelConfig::operator==(const KernelConfig& o) const {
  // Configs that share a name are equal: the same family, and the same knobs of it.
  return dtype == o.dtype && out_dtype == o.out_dtype && head_dim == o.head_dim && value_dim() == o.value_dim() && mask == o.mask &&
         block_m == o.block_m &&
         block_n == o.block_n && stages == o.stages && knobs == o.knobs && varlen == o.varlen && paged == o.paged &&
         mods == o.mods && same_user_variant(user, o.user);
}

void to_json(nlohmann::json& j, const KernelConfig& c) {
  if (const Sm90Knobs* k = c.sm90()) {
    j = nlohmann::json{{"family", "fwd_sm90"},       {"dtype", dtype_name(c.dtype)}, {"head_dim", c.head_dim},
                       {"mask", mask_name(c.mask)}, {"block_m", c.block_m},      {"block_n", c.block_n},
                       {"stages", c.stages},          {"overlap", k->overlap},     {"pingpong", k->pingpong},
                       {"persistent", k->persistent}, {"p_smem", k->p_smem},     {"cluster", k->cluster},
                       {"groups", k->groups},         {"tensor_sum", k->tensor_sum}};
    if (c.value_dim() != c.head_dim) j["head_dim_v"] = c.value_dim();  // absent: the values' head dim is head_dim
    if (k->value_split != 1) j["value_split"] = k->value_split;        // absent: 1, as every config before it had
    if (c.out_dtype) j["out_dtype"] = dtype_name(*c.out_dtype);       // FP8 configs only
    if (c.varlen) j["varlen"] = true;  // absent: a dense kernel, as every config before it had
    if (c.paged) j["paged"] = true;
    score_mods_to_json(j, c.mods);
    return;
  }
  const Sm80Knobs& k = std::get<Sm80Knobs>(c.knobs);
  j = nlohmann::json{{"family", "fwd_sm80"},    {"dtype", dtype_name(c.dtype)}, {"head_dim", c.head_dim},
                     {"mask", mask_name(c.mask)}, {"block_m", c.block_m},      {"block_n", c.block_n},
                     {"warps", k.warps},          {"stages", c.stages},        {"q_in_regs", k.q_in_regs}};
  if (c.value_dim() != c.head_dim) j["head_dim_v"] = c.value_dim();  // absent: the values' head dim is head_dim
  if (c.varlen) j["varlen"] = true;
  if (c.paged) j["paged"] = true;
  score_mods_to_json(j, c.mods);
}

bool is_int_field(const nlohmann::json& value) {
  constexpr int64_t kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  if (value.is_number_unsigned()) return value.get<uint64_t>() <= uint64_t{kMax};
  return value.is_number_integer() && value.get<int64_t>() >= kMin && value.get<int64_t>() <= kMax;
}

void read_dtype_and_mask(const nlohmann::json& j, const char* what, DType& dtype, MaskKind& mask, bool fp8_taken) {
  if (j.contains("dtype")) {
    const auto& d = j["dtype"];
    bool read = false;
    for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2}) {
      if (d == dtype_name(t) && (fp8_taken || !is_fp8(t))) dtype = t, read = true;
    }
    FLASHGEN_REQUIRE(read, std::string(what) + ": dtype must be \"fp16\" or \"bf16\"" +
                               (fp8_taken ? std::string(" (or \"e4m3\", \"e5m2\")") : ""));
  }
  if (j.contains("mask")) {
    const auto& m = j["mask"];
    for (MaskKind kind : {MaskKind::kNone, MaskKind::kCausal, MaskKind::kWindow, MaskKind::kChunk}) {
      if (m == mask_name(kind)) {
        mask = kind;
        return;
      }
    }
    fail(Status::kInvalidArgument,
         std::string(what) + ": mask must be \"none\", \"causal\", \"window\" or \"chunk\"");
  }
}

void from_json(const nlohmann::json& j, KernelConfig& c) {
  FLASHGEN_REQUIRE(j.is_object(), "kernel config JSON must be an object");
  // A misspelt key would otherwise leave its knob at the default without a word.
  static const char* const kKeys[] = {"family", "dtype",      "head_dim",  "mask",       "block_m", "block_n",
                                      "warps",  "stages",     "q_in_regs", "overlap",    "pingpong", "persistent",
                                      "p_smem", "cluster",    "groups",    "tensor_sum", "varlen", "paged",
                                      "softcap", "alibi", "head_dim_v", "value_split", "out_dtype"};
  for (const auto& item : j.items()) {
    FLASHGEN_REQUIRE(std::find(std::begin(kKeys), std::end(kKeys), item.key()) != std::end(kKeys),
                     "kernel config JSON: unknown field \"" + item.key() + "\"");
  }
  auto get_int = [&](const char* key, int& out) {
    if (!j.contains(key)) return;
    FLASHGEN_REQUIRE(is_int_field(j[key]), std::string("kernel config JSON: '") + key + "' must be an integer, got " +
                                              j[key].dump());
    out = j[key].get<int>();
  };
  auto get_bool = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;
    FLASHGEN_REQUIRE(j[key].is_boolean(), std::string("kernel config JSON: '") + key + "' must be true or false");
    out = j[key].get<bool>();
  };
  KernelConfig config;
  bool sm90 = false;  // older JSON, from before the sm90 family, has no "family"
  if (j.contains("family")) {
    FLASHGEN_REQUIRE(j["family"] == "fwd_sm80" || j["family"] == "fwd_sm90",
                     "kernel config JSON: unknown family " + j["family"].dump());
    sm90 = j["family"] == "fwd_sm90";
  }
  read_dtype_and_mask(j, "kernel config JSON", config.dtype, config.mask, /*fp8_taken=*/sm90);
  if (j.contains("out_dtype")) {
    const auto& d = j["out_dtype"];
    FLASHGEN_REQUIRE(d == "fp16" || d == "bf16", "kernel config JSON: out_dtype must be \"fp16\" or \"bf16\"");
    config.out_dtype = d == "bf16" ? DType::kBFloat16 : DType::kFloat16;
  }
  get_int("head_dim", config.head_dim);
  get_int("head_dim_v", config.head_dim_v);
  get_int("block_m", config.block_m);
  get_int("block_n", config.block_n);
  get_int("stages", config.stages);
  Sm80Knobs sm80_knobs;
  get_int("warps", sm80_knobs.warps);
  get_bool("q_in_regs", sm80_knobs.q_in_regs);
  Sm90Knobs sm90_knobs;
  get_int("cluster", sm90_knobs.cluster);
  get_int("groups", sm90_knobs.groups);
  get_bool("tensor_sum", sm90_knobs.tensor_sum);
  get_int("value_split", sm90_knobs.value_split);
  get_bool("overlap", sm90_knobs.overlap);
  get_bool("pingpong", sm90_knobs.pingpong);
  get_bool("persistent", sm90_knobs.persistent);
  get_bool("p_smem", sm90_knobs.p_smem);
  get_bool("varlen", config.varlen);
  get_bool("paged", config.paged);
  read_score_mods(j, "kernel config JSON", config.mods);
  // The other family's knobs may be present at their defaults (off); a config has no room for others.
  if (sm90) {
    FLASHGEN_REQUIRE(sm80_knobs == Sm80Knobs{}, "kernel config JSON: warps and q_in_regs are sm80-family knobs");
    config.knobs = sm90_knobs;
  } else {
    FLASHGEN_REQUIRE(sm90_knobs == Sm90Knobs{},
                     "kernel config JSON: overlap, pingpong, persistent, p_smem, cluster, groups, tensor_sum and "
                     "value_split are sm90-family knobs");
    config.knobs = sm80_knobs;
  }
  c = config;
}

}  // namespace flashgen
