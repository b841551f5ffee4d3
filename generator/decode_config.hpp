// DecodeConfig: the compile-time choices of one generated KV-cache attention module (templates/decode_sm80.cuh:
// dtype, head_dim, mask, score modifiers, packed query rows per block, key tile, warps, stages, paged or
// contiguous cache), with
// validation, JSON round-trip and one canonical name. How many key ranges split a sequence is a run-time
// argument (AttnDecodeParams::splits), not part of the config. Validity lives in templates/decode_traits.cuh.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generator/implementability.hpp"
#include "problem/attention_problem.hpp"
#include "templates/attn_params.cuh"
#include "templates/decode_traits.cuh"

namespace flashgen {

// The kernels of one KV-cache module, in launch order: append (when new tokens are given), attend, combine
// (when the keys are split into more than one range).
enum class DecodeKernel { kAppend, kAttend, kCombine };

const char* decode_kernel_suffix(DecodeKernel kernel);  // "append", "attend", "combine"

// Most key ranges one sequence is split into (a call's split workspace grows with it).
constexpr int kMaxDecodeSplits = 128;

// A KV-cache call's workspace where its keys are split into more than one range: each range's fp32 output rows
// (head_dim floats each), then their LSEs; each an offset into the workspace, kAbsent with one range.
struct DecodeWorkspace : Workspace {
  size_t o_partial = kAbsent, lse_partial = kAbsent;
};

// A kernel module (generator/kernel_module.hpp).
struct DecodeConfig {
  using Kernel = DecodeKernel;
  using Params = AttnDecodeParams;
  DType dtype = DType::kFloat16;
  int head_dim = 128;
  MaskKind mask = MaskKind::kNone;
  int rows = 16;     // packed query rows (query heads of a kv head x new tokens) per block: 16, 32 or 64
  int block_n = 64;  // keys per K/V tile, block_n / warps for each warp
  int warps = 4;
  int stages = 4;    // K/V tiles in flight
  bool paged = false;  // the cache is read through a block table
  // An FP8 cache's element type (e4m3 or e5m2), read as such and widened to dtype in registers; empty: dtype.
  std::optional<DType> cache_dtype;
  // The Hopper latent kernel (decode_sm90.cuh, MLA): the values are the keys' first head_dim_v columns, one copy in
  // the cache; rows, block_n and warps are that kernel's own (64, 64, 12), stages its ring of K tiles.
  bool latent = false;
  int head_dim_v = 0;  // latent only: the values' head dim (0 elsewhere: the keys')
  // The score modifiers compiled in (soft cap, ALiBi), named after the mask as the other families' configs name
  // them.
  ScoreMods mods = {};
  // A user-defined variant compiled in around the mask (KernelConfig::user): suffix _u<hash> at the end of the name.
  // Set by dispatch on the choice for the base class; no tuning data or JSON holds one.
  std::shared_ptr<const UserVariant> user = nullptr;

  // e.g. dec_sm80_bf16_d128_r16_n64_w4_s4[_causal|_window|_chunk][_softcap][_alibi][_kve4m3|_kve5m2][_paged][_u<hash>],
  // or for the
  // latent kernel dec_sm90_bf16_d576_v512_s2[...]: the module's name, its file name in dumps and part of its cache
  // key; each kernel's symbol is name() + "_" + decode_kernel_suffix(kernel).
  std::string name() const;
  static DecodeConfig from_name(const std::string& name);  // throws Error(kInvalidArgument)
  std::string symbol(DecodeKernel kernel) const;

  int value_dim() const { return latent ? head_dim_v : head_dim; }
  DecodeTraits traits() const;                // the sm80 kernel's
  DecodeSm90Traits latent_traits() const;     // the latent kernel's
  const char* traits_error() const;           // the config's own kernel's traits' error
  int threads(DecodeKernel kernel) const;
  int smem_bytes(DecodeKernel kernel) const;  // 0 for the append and combine kernels
  // The kernels whose spills decide whether the config is worth running: the attention kernel (append and combine
  // are tiny).
  std::vector<DecodeKernel> spill_checked_kernels() const { return {DecodeKernel::kAttend}; }
  // Why this config cannot run on sm_<arch>, or nullopt when it can.
  std::optional<std::string> invalid_reason(int arch) const;

  // Blocks of packed query rows (query heads of a kv head x new tokens) per kv head of a call of params.
  int64_t row_blocks(const AttnDecodeParams& params) const;
  // Whether the config can run a call (problem, params) on device: the config is for the problem (dtype, head_dim,
  // mask, modifiers, variant, a paged or contiguous cache) and the device's sm, and its grid fits the device's.
  Implementability can_implement(const AttentionProblem& problem, const AttnDecodeParams& params,
                                 const DeviceTraits& device) const;
  // The workspace of a call of params split into params.splits key ranges: none for one range, else each range's
  // partial output and LSE for every (batch, head, query) row.
  DecodeWorkspace workspace(const AttnDecodeParams& params) const;

  bool operator==(const DecodeConfig& other) const { return name() == other.name(); }
  bool operator!=(const DecodeConfig& other) const { return !(*this == other); }
};

// "e4m3" or "e5m2" as an FP8 cache's type; throws Error(kInvalidArgument) naming what otherwise.
DType parse_cache_dtype(const std::string& text, const std::string& what);

// The latent kernel's config for (dtype, head_dim, head_dim_v): two stages, no mask, a contiguous cache.
DecodeConfig latent_decode_config(DType dtype, int head_dim, int head_dim_v);

// The key blocks of config one sequence of a KV-cache problem can visit: the capacity's (shape.seqlen_k), or under a
// window bounded on the left (or a chunk) only those holding its left side (or the rows' chunks) and the new rows
// (the kernels skip the rest; the new rows are the sequence's last keys, so its right side reaches no further key).
int64_t max_decode_blocks(const AttentionProblem& problem, const DecodeConfig& config);

// The most key ranges worth splitting one sequence into: one of those blocks each at least, at most
// kMaxDecodeSplits.
int max_decode_splits(const AttentionProblem& problem, const DecodeConfig& config);

void to_json(nlohmann::json& j, const DecodeConfig& config);
void from_json(const nlohmann::json& j, DecodeConfig& config);  // throws Error on bad fields

}  // namespace flashgen
