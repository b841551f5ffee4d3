// DecodeConfig naming, validation, its answers of a call (can_implement, workspace) and JSON round-trip. Validity
// itself lives in templates/decode_traits.cuh, shared with the kernel's static_asserts.
#include "generator/decode_config.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <sstream>
#include <vector>

#include "flashgen/error.hpp"
#include "generator/kernel_config.hpp"
#include "generator/kernel_module.hpp"

namespace flashgen {

const char* decode_kernel_suffix(DecodeKernel kernel) {
  switch (kernel) {
    case DecodeKernel::kAppend:
      return "append";
    case DecodeKernel::kAttend:
      return "attend";
    case DecodeKernel::kCombine:
      return "combine";
  }
  return "?";
}

std::string DecodeConfig::name() const {
  using std::to_string;
  if (latent) {
    std::string name = std::string("dec_sm90_") + dtype_name(dtype) + "_d" + to_string(head_dim) + "_v" +
                       to_string(head_dim_v) + "_s" + to_string(stages) + mask_suffix(mask) + score_mods_suffix(mods);
    if (paged) name += "_paged";
    return name + user_variant_suffix(user);
  }
  std::string name = std::string("dec_sm80_") + dtype_name(dtype) + "_d" + to_string(head_dim) + "_r" +
                     to_string(rows) + "_n" + to_string(block_n) + "_w" + to_string(warps) + "_s" + to_string(stages);
  name += mask_suffix(mask) + score_mods_suffix(mods);
  if (cache_dtype) name += std::string("_kv") + dtype_name(*cache_dtype);
  if (paged) name += "_paged";
  return name + user_variant_suffix(user);
}

DecodeConfig DecodeConfig::from_name(const std::string& name) {
  std::vector<std::string> fields;
  std::istringstream in(name);
  for (std::string field; std::getline(in, field, '_');) fields.push_back(field);
  const bool latent = fields.size() >= 6 && fields[0] == "dec" && fields[1] == "sm90";
  FLASHGEN_REQUIRE(latent || (fields.size() >= 8 && fields[0] == "dec" && fields[1] == "sm80"),
                   "config name '" + name +
                       "': expected dec_sm80_<fp16|bf16>_d<head_dim>_r<rows>_n<block_n>_w<warps>_s<stages>"
                       "[_causal|_window|_chunk][_softcap][_alibi][_paged], or dec_sm90_<fp16|bf16>_d<head_dim>"
                       "_v<head_dim_v>_s<stages>[...] (the latent kernel)");
  DecodeConfig config;
  config.dtype = parse_dtype_field(fields[2], name);
  config.head_dim = parse_name_field(fields[3], "d", name);
  size_t first_suffix = 8;
  if (latent) {
    config = latent_decode_config(config.dtype, config.head_dim, parse_name_field(fields[4], "v", name));
    config.stages = parse_name_field(fields[5], "s", name);
    first_suffix = 6;
  } else {
    config.rows = parse_name_field(fields[4], "r", name);
    config.block_n = parse_name_field(fields[5], "n", name);
    config.warps = parse_name_field(fields[6], "w", name);
    config.stages = parse_name_field(fields[7], "s", name);
  }
  for (size_t i = first_suffix; i < fields.size(); ++i) {
    if (read_mask_suffix(fields[i], config.mask) || read_score_mod_suffix(fields[i], config.mods)) {
      continue;
    } else if (fields[i] == "paged" && !config.paged) {
      config.paged = true;
    } else if (fields[i].compare(0, 2, "kv") == 0 && !config.cache_dtype) {
      config.cache_dtype = parse_cache_dtype(fields[i].substr(2), "config name '" + name + "'");
    } else {
      fail(Status::kInvalidArgument, "config name '" + name + "': unknown suffix '" + fields[i] + "'");
    }
  }
  FLASHGEN_REQUIRE(config.name() == name,
                   "config name '" + name + "' is not canonical; did you mean '" + config.name() + "'?");
  return config;
}

std::string DecodeConfig::symbol(DecodeKernel kernel) const { return name() + "_" + decode_kernel_suffix(kernel); }

DType parse_cache_dtype(const std::string& text, const std::string& what) {
  FLASHGEN_REQUIRE(text == "e4m3" || text == "e5m2", what + ": an FP8 cache's type must be e4m3 or e5m2, got '" +
                                                         text + "'");
  return text == "e4m3" ? DType::kFloat8E4M3 : DType::kFloat8E5M2;
}

DecodeConfig latent_decode_config(DType dtype, int head_dim, int head_dim_v) {
  DecodeConfig config;
  config.dtype = dtype;
  config.latent = true;
  config.head_dim = head_dim;
  config.head_dim_v = head_dim_v;
  config.rows = kDecodeSm90Rows;
  config.block_n = kDecodeSm90BlockN;
  config.warps = 12;
  config.stages = 2;
  return config;
}

DecodeTraits DecodeConfig::traits() const {
  return decode_traits(head_dim, rows, block_n, warps, stages, paged, cache_dtype.has_value());
}

DecodeSm90Traits DecodeConfig::latent_traits() const { return decode_sm90_traits(head_dim, head_dim_v, stages); }

const char* DecodeConfig::traits_error() const { return latent ? latent_traits().error : traits().error; }

int DecodeConfig::threads(DecodeKernel kernel) const {
  if (kernel != DecodeKernel::kAttend) return kDecodeRowKernelThreads;
  return latent ? latent_traits().threads : traits().threads;
}

int DecodeConfig::smem_bytes(DecodeKernel kernel) const {
  if (kernel != DecodeKernel::kAttend) return 0;
  return latent ? latent_traits().smem_bytes : traits().smem_bytes;
}

std::optional<std::string> DecodeConfig::invalid_reason(int arch) const {
  if (arch < 80) return "the decode kernels need sm_80 or newer (mma.sync m16n8k16 bf16, cp.async)";
  if (latent && arch != 90) return "the latent decode kernel needs sm_90 (wgmma, setmaxnreg)";
  if (cache_dtype) {
    if (!is_fp8(*cache_dtype)) return std::string("a cache of its own type must be FP8 (e4m3 or e5m2), got ") +
                                      dtype_name(*cache_dtype);
    if (latent) return "the latent kernel reads a 16-bit cache";
    if (arch < 89) return "an FP8 cache needs sm_89 or newer (FP8 conversions)";
  }
  if (const char* error = traits_error()) return std::string(error);
  const int smem = smem_bytes(DecodeKernel::kAttend);
  if (smem > max_smem_per_block(arch)) {
    return "needs " + std::to_string(smem) + " bytes of shared memory; sm_" + std::to_string(arch) + " allows " +
           std::to_string(max_smem_per_block(arch)) + " per block";
  }
  return std::nullopt;
}

int64_t DecodeConfig::row_blocks(const AttnDecodeParams& p) const {
  return (static_cast<int64_t>(p.group_size) * p.seqlen_q + rows - 1) / rows;
}

Implementability DecodeConfig::can_implement(const AttentionProblem& problem, const AttnDecodeParams& params,
                                             const DeviceTraits& device) const {
  if (Implementability fit = problem_fit(*this, problem, device.sm); !fit) return fit;
  if (paged != problem.paged) {
    return {Shortfall::kProblem, paged ? "reads a paged cache, but no block_table is given"
                                       : "reads a contiguous cache, but a block_table is given"};
  }
  if (row_blocks(params) * params.heads_kv > 65535) {
    return {Shortfall::kGridLimit, "q: heads_kv * ceil(heads_q / heads_kv * seqlen_q / " + std::to_string(rows) +
                                       ") blocks must be at most 65535 (grid limits)"};
  }
  return {};
}

DecodeWorkspace DecodeConfig::workspace(const AttnDecodeParams& p) const {
  DecodeWorkspace w;
  if (p.splits <= 1) return w;
  const size_t rows = size_t(p.splits) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q);
  w.o_partial = w.append(sizeof(float) * rows * size_t(value_dim()));
  w.lse_partial = w.append(sizeof(float) * rows);
  return w;
}

int64_t max_decode_blocks(const AttentionProblem& problem, const DecodeConfig& config) {
  auto blocks_of = [&](int64_t keys) { return (keys + config.block_n - 1) / config.block_n; };
  const int64_t capacity = problem.shape.seqlen_k;
  int64_t blocks = blocks_of(capacity);
  if (problem.windowed() && (problem.window_left >= 0 || problem.attention_chunk > 0)) {
    // The new rows' keys: a window's left side and the rows, and no more than the chunks those rows lie in (at
    // most two, as far apart as seqlen_q). `keys` consecutive keys touch at most blocks_of(keys - 1) + 1 blocks,
    // wherever they start.
    int64_t keys = capacity;
    const int64_t rows = problem.shape.seqlen_q;
    if (problem.window_left >= 0) keys = std::min<int64_t>(keys, problem.window_left + rows);
    if (problem.attention_chunk > 0) keys = std::min<int64_t>(keys, problem.attention_chunk + rows);
    blocks = std::min(blocks, blocks_of(keys - 1) + 1);
  }
  return blocks;
}

int max_decode_splits(const AttentionProblem& problem, const DecodeConfig& config) {
  return static_cast<int>(std::clamp<int64_t>(max_decode_blocks(problem, config), 1, kMaxDecodeSplits));
}

void to_json(nlohmann::json& j, const DecodeConfig& c) {
  if (c.latent) {
    j = nlohmann::json{{"family", "dec_sm90"},   {"dtype", dtype_name(c.dtype)}, {"head_dim", c.head_dim},
                       {"head_dim_v", c.head_dim_v}, {"mask", mask_name(c.mask)},   {"stages", c.stages},
                       {"paged", c.paged}};
    score_mods_to_json(j, c.mods);
    return;
  }
  j = nlohmann::json{{"family", "dec_sm80"},  {"dtype", dtype_name(c.dtype)},
                     {"head_dim", c.head_dim}, {"mask", mask_name(c.mask)},
                     {"rows", c.rows},         {"block_n", c.block_n},
                     {"warps", c.warps},       {"stages", c.stages},
                     {"paged", c.paged}};
  score_mods_to_json(j, c.mods);
  if (c.cache_dtype) j["cache_dtype"] = dtype_name(*c.cache_dtype);
}

void from_json(const nlohmann::json& j, DecodeConfig& c) {
  FLASHGEN_REQUIRE(j.is_object(), "decode config JSON must be an object");
  FLASHGEN_REQUIRE(!j.contains("family") || j["family"] == "dec_sm80" || j["family"] == "dec_sm90",
                   "decode config JSON: unknown family " + (j.contains("family") ? j["family"].dump() : ""));
  const bool latent = j.contains("family") && j["family"] == "dec_sm90";
  static const char* const kKeys[] = {"family", "dtype",   "head_dim", "mask",  "rows",       "block_n",
                                      "warps",  "stages",  "paged",    "softcap", "alibi", "cache_dtype"};
  static const char* const kLatentKeys[] = {"family", "dtype", "head_dim", "head_dim_v", "mask",
                                            "stages", "paged", "softcap",  "alibi"};
  for (const auto& item : j.items()) {
    const bool known = latent ? std::find(std::begin(kLatentKeys), std::end(kLatentKeys), item.key()) !=
                                    std::end(kLatentKeys)
                              : std::find(std::begin(kKeys), std::end(kKeys), item.key()) != std::end(kKeys);
    FLASHGEN_REQUIRE(known, "decode config JSON: unknown field \"" + item.key() + "\"" +
                                (latent ? " for family dec_sm90" : ""));
  }
  DecodeConfig config;
  if (latent) config = latent_decode_config(DType::kBFloat16, 576, 512);
  read_dtype_and_mask(j, "decode config JSON", config.dtype, config.mask);
  read_score_mods(j, "decode config JSON", config.mods);
  for (const auto& [key, field] : {std::pair{"head_dim", &config.head_dim}, std::pair{"rows", &config.rows},
                                   std::pair{"block_n", &config.block_n}, std::pair{"warps", &config.warps},
                                   std::pair{"stages", &config.stages}, std::pair{"head_dim_v", &config.head_dim_v}}) {
    if (!j.contains(key)) continue;
    FLASHGEN_REQUIRE(is_int_field(j[key]),
                     std::string("decode config JSON: '") + key + "' must be an integer, got " + j[key].dump());
    *field = j[key].get<int>();
  }
  if (j.contains("paged")) {
    FLASHGEN_REQUIRE(j["paged"].is_boolean(), "decode config JSON: 'paged' must be true or false");
    config.paged = j["paged"].get<bool>();
  }
  if (j.contains("cache_dtype")) {
    FLASHGEN_REQUIRE(j["cache_dtype"].is_string(), "decode config JSON: 'cache_dtype' must be \"e4m3\" or \"e5m2\"");
    config.cache_dtype = parse_cache_dtype(j["cache_dtype"].get<std::string>(), "decode config JSON");
  }
  c = config;
}

}  // namespace flashgen
