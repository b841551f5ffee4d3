// KernelConfig: the compile-time choices of one generated forward kernel (dtype, head_dim, mask, tile
// sizes, stages, and the knobs of its family), with validation, JSON round-trip and one canonical name.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "generator/implementability.hpp"
#include "generator/tma_layout.hpp"
#include "problem/attention_problem.hpp"
#include "templates/attn_params.cuh"
#include "templates/fwd_traits.cuh"

namespace flashgen {

// The forward kernel families: templates/fwd_sm80.cuh (mma.sync, cp.async; sm_80 and newer) and
// templates/fwd_sm90.cuh (wgmma, TMA, warp-specialized; sm_90a only).
enum class KernelFamily { kSm80 = 0, kSm90 = 1 };

// The sm80 family's own knobs (templates/fwd_sm80.cuh).
struct Sm80Knobs {
  int warps = 4;           // each owns block_m / warps query rows, whole 16-row mma tiles
  bool q_in_regs = false;  // keep Q's mma fragments in registers instead of re-reading shared memory

  bool operator==(const Sm80Knobs& o) const { return warps == o.warps && q_in_regs == o.q_in_regs; }
  bool operator!=(const Sm80Knobs& o) const { return !(*this == o); }
};

// The sm90 family's own knobs (templates/fwd_sm90.cuh). Its warps follow from block_m: block_m / 64
// consumer warpgroups (per group) and one producer. The defaults are the plain kernel, all knobs off.
struct Sm90Knobs {
  bool overlap = false;     // softmax of block j runs while the tensor cores compute P V of block j - 1
  bool pingpong = false;    // two consumers: they take turns at issuing their products
  bool persistent = false;  // one block per SM walks the tiles (grid = min(tiles, SMs)), or its groups
  bool p_smem = false;      // P V reads P from shared memory instead of registers
  int cluster = 1;          // 2: two blocks of a cluster share each K/V tile by TMA multicast
  int groups = 1;           // 2: two groups of consumers in one persistent block, each on tiles of its own
  bool tensor_sum = false;  // the rows' sums of P from the tensor cores (P times ones) instead of adds
  int value_split = 1;      // 2: two consumers for each 64 query rows, each holding half of O's columns

  bool operator==(const Sm90Knobs& o) const {
    return overlap == o.overlap && pingpong == o.pingpong && persistent == o.persistent && p_smem == o.p_smem &&
           cluster == o.cluster && groups == o.groups && tensor_sum == o.tensor_sum && value_split == o.value_split;
  }
  bool operator!=(const Sm90Knobs& o) const { return !(*this == o); }
};

// The kernels of one forward module: the attention kernel, and with a user mask (generator.hpp's
// has_user_block_classes) the two that classify its blocks before it (templates/user_blocks.cuh).
// An FP8 module's first kernel writes Vᵀ for it (templates/fwd_sm90_values.cuh).
enum class FwdKernel { kAttend, kUserBlockTiles, kUserBlockRanges, kValuesT };

// The fields both families share, then the knobs of one of them. A kernel module (generator/kernel_module.hpp).
struct KernelConfig {
  using Kernel = FwdKernel;
  using Params = AttnFwdParams;

  DType dtype = DType::kFloat16;
  int head_dim = 128;
  MaskKind mask = MaskKind::kNone;
  int block_m = 128;
  int block_n = 32;
  int stages = 3;
  // The knobs of one family, and so the family: a config cannot hold the other family's knobs.
  std::variant<Sm80Knobs, Sm90Knobs> knobs;
  // Packed batches of sequences of different lengths (cu_seqlens; templates/sequence.cuh): a kernel of its
  // own, suffix _varlen. The sm90 family's without persistence, clusters or groups.
  bool varlen = false;
  // Packed batches whose keys and values are read from a paged cache through a block table: suffix _paged
  // after _varlen. Varlen sm80 configs only.
  bool paged = false;
  // The score modifiers compiled in around the mask (templates/variant.cuh's SoftCap, then Alibi; the cap and
  // the slopes are run-time parameters): suffixes _softcap, _alibi after the mask's (_causal or _window; a
  // window's sides are run-time parameters).
  ScoreMods mods = {};
  // A user-defined variant compiled in around the mask (templates/variant.cuh's UserVariant): suffix _u<hash> at
  // the end of the name. Set by dispatch on the choice for the base class; no tuning data or JSON holds one.
  std::shared_ptr<const UserVariant> user = nullptr;
  // The values' and the output's head dim where it differs from the queries' and keys' (MLA's 192 and 128): suffix
  // _v<dim> after _d<head_dim>, JSON field head_dim_v; 0: head_dim. The sm80 family's kernels take one.
  int head_dim_v = 0;
  // An FP8 config's output type (bf16 or fp16; suffix _o<dtype> after _s<stages>, JSON field out_dtype); the sm90
  // family only. Empty: dtype, as every 16-bit config.
  std::optional<DType> out_dtype = std::nullopt;

  DType output_dtype() const { return out_dtype.value_or(dtype); }
  // The values' head dim: head_dim_v, or head_dim where the config has none of its own.
  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  KernelFamily family() const {
    return std::holds_alternative<Sm90Knobs>(knobs) ? KernelFamily::kSm90 : KernelFamily::kSm80;
  }
  // The family's knobs, or nullptr when the config is of the other family.
  const Sm80Knobs* sm80() const { return std::get_if<Sm80Knobs>(&knobs); }
  Sm80Knobs* sm80() { return std::get_if<Sm80Knobs>(&knobs); }
  const Sm90Knobs* sm90() const { return std::get_if<Sm90Knobs>(&knobs); }
  Sm90Knobs* sm90() { return std::get_if<Sm90Knobs>(&knobs); }

  // Canonical name, e.g. fwd_sm80_bf16_d128_m128_n32_w4_s3_causal or, with values of their own head dim,
  // fwd_sm80_bf16_d192_v128_m64_n32_w4_s2_causal (_window for a sliding window; then _softcap, _alibi;
  // suffix _qreg when q_in_regs,
  // _varlen for packed batches, then _paged for their paged caches) or
  // fwd_sm90_fp16_d128_m128_n128_s2_causal (suffixes _ovl, _pp, _pst, _psm, _c2, _g2, _tsum, _vs2 for overlap,
  // pingpong, persistent, p_smem, cluster 2, groups 2, tensor_sum, value_split 2). It is the kernel's symbol, its file name in dumps and part of its
  // cache key.
  std::string name() const;
  // Inverse of name(); throws Error(kInvalidArgument) naming what it could not read.
  static KernelConfig from_name(const std::string& name);

  // The family's sizes; each throws Error(kInternal) for a config of the other family.
  FwdTraits traits() const;
  FwdSm90Traits sm90_traits() const;
  // A kernel's symbol (the attention kernel's is name(), the classes' name() + "_blocks" and "_blocks_ranges"),
  // block size and dynamic shared memory (0 for the classes'), by default the attention kernel's.
  std::string symbol(FwdKernel kernel = FwdKernel::kAttend) const;
  int threads(FwdKernel kernel = FwdKernel::kAttend) const;
  int smem_bytes(FwdKernel kernel = FwdKernel::kAttend) const;
  // The kernels whose spills decide whether the config is worth running: the attention kernel.
  std::vector<FwdKernel> spill_checked_kernels() const { return {FwdKernel::kAttend}; }
  // The family's shape error (nullptr when valid somewhere).
  const char* shape_error() const;
  // Why this config cannot run on sm_<arch>, or nullopt when it can.
  std::optional<std::string> invalid_reason(int arch) const;

  // Blocks per cluster (the sm90 family's knob; 1 for the sm80 family), and whether the kernel walks a persistent
  // tile list (the sm90 family's knob).
  int cluster_size() const;
  bool persistent() const;
  // Query blocks of a call of params, and the tiles a persistent kernel walks: cluster-wide query blocks of every
  // head and batch entry.
  int64_t query_blocks(const AttnFwdParams& params) const;
  int64_t persistent_tiles(const AttnFwdParams& params) const;

  // Whether the config can run a call (problem, params) on device: the config is for the problem (its dtype,
  // head_dim, mask, modifiers, variant, and a dense or packed batch, paged or not) and the device's sm, TMA can
  // describe the tensors (the sm90 family), and a persistent walk's tiles fit its int indices.
  Implementability can_implement(const AttentionProblem& problem, const AttnFwdParams& params,
                                 const DeviceTraits& device) const;
  // The forward's kernels take no caller workspace (a user mask's classes, a tile counter and FP8's Vᵀ are per
  // launch).
  Workspace workspace(const AttnFwdParams&) const { return {}; }
  // FP8's Vᵀ (templates/fwd_sm90_values.cuh): its keys per (entry, kv head, column) row, its entries and bytes (0
  // for a 16-bit config). Dense: an entry per batch entry, seqlen_k in whole 32-key steps; packed: one entry, each
  // sequence from its own multiple of kFp8BlockN.
  int64_t values_t_keys(const AttnFwdParams& p) const;
  int64_t values_t_entries(const AttnFwdParams& p) const { return varlen ? 1 : p.batch; }
  size_t values_t_bytes(const AttnFwdParams& p) const;
  // The Vᵀ kernel's blocks of 64 keys per (sequence or batch entry, kv head).
  int64_t values_t_key_blocks(const AttnFwdParams& p) const;

  bool operator==(const KernelConfig& other) const;
  bool operator!=(const KernelConfig& other) const { return !(*this == other); }
};

// The four tensors of a forward call as TMA sees them, with the box rows of the sm90 kernel's copies. Over a
// paged cache, k and v are (num_pages, page_size, heads_kv, head_dim), copied in boxes that lie in one page, and
// v also in boxes of 16 rows (v_fine: the fine map, the rows about a sequence's last key).
// An FP8 config's v is Vᵀ (templates/fwd_sm90_values.cuh) at p.v_t, in boxes of 128 keys and the values' tile rows,
// over a paged cache too.
struct FwdTmaTensors {
  TmaTensor q, k, v, o;
  int q_rows = 0, kv_rows = 0, v_rows = 0;
  bool paged = false, v_fine = false;
  static constexpr int kORows = 64;  // each consumer warpgroup stores its own 64 rows
  static constexpr int kFineRows = 16;

  FwdTmaTensors(const AttentionProblem& problem, const AttnFwdParams& p, const KernelConfig& config);
  // Why TMA cannot describe one of them ("q: ..."), or nullopt when it can describe all.
  std::optional<std::string> unsupported_reason() const;
};

// Reads "<prefix><int>" from one '_'-separated field of the config name `name` (e.g. "d128" with prefix
// "d"); throws Error(kInvalidArgument) naming the field otherwise. Shared by the config families' names.
int parse_name_field(const std::string& field, const std::string& prefix, const std::string& name);
// Reads the dtype field ("fp16" or "bf16", with fp8_taken also "e4m3" or "e5m2") of the config name `name`; throws
// Error(kInvalidArgument).
DType parse_dtype_field(const std::string& field, const std::string& name, bool fp8_taken = false);

void to_json(nlohmann::json& j, const KernelConfig& config);
void from_json(const nlohmann::json& j, KernelConfig& config);  // throws Error on bad fields

// Whether a config JSON field is an integer within int's range (a plain get<int>() would wrap larger ones).
bool is_int_field(const nlohmann::json& value);

// The "dtype" and "mask" fields of a config family's JSON, when present, into dtype and mask; Error
// naming the field (after what, e.g. "kernel config JSON") otherwise.
void read_dtype_and_mask(const nlohmann::json& j, const char* what, DType& dtype, MaskKind& mask,
                         bool fp8_taken = false);

// A mask kind as every config family spells it: "none", "causal" or "window" in JSON, and as a name's suffix
// (none for kNone: "_causal", "_window").
const char* mask_name(MaskKind mask);
std::string mask_suffix(MaskKind mask);
// Reads a name's field as a mask suffix into mask (still kNone: a name has at most one); false for any other field.
bool read_mask_suffix(const std::string& field, MaskKind& mask);

// "_v<value_dim>", after "_d<head_dim>" in a forward or backward config's name, where the values have a head dim of
// their own; else nothing.
std::string value_dim_suffix(int head_dim, int value_dim);

// A user variant's name suffix: "_" and its tag, or nothing without one.
std::string user_variant_suffix(const std::shared_ptr<const UserVariant>& user);
// Whether two configs' user variants are the same functions (both none, or the same tag).
bool same_user_variant(const std::shared_ptr<const UserVariant>& a, const std::shared_ptr<const UserVariant>& b);

// Score modifiers as every config family spells them: name suffixes after the mask's, "_softcap" then "_alibi",
// and JSON flags "softcap" and "alibi" (true; absent when off, as in every config before them).
std::string score_mods_suffix(const ScoreMods& mods);
// Reads a name's field as a modifier's suffix not yet set into mods; false for any other field.
bool read_score_mod_suffix(const std::string& field, ScoreMods& mods);
void score_mods_to_json(nlohmann::json& j, const ScoreMods& mods);
// The flags of j into mods; Error naming the field (after what, e.g. "kernel config JSON") when not a boolean.
void read_score_mods(const nlohmann::json& j, const char* what, ScoreMods& mods);

}  // namespace flashgen
