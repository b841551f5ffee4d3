// BwdConfig: the compile-time choices of one generated backward module (dtype, head_dim, mask, the
// dQ strategy, the tiles of each of its kernels and the knobs of its family), with validation, JSON
// round-trip and one canonical name. Validity itself lives in templates/bwd_traits.cuh, shared with the kernels.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "generator/implementability.hpp"
#include "generator/kernel_config.hpp"
#include "generator/tma_layout.hpp"
#include "templates/attn_params.cuh"
#include "templates/bwd_traits.cuh"

namespace flashgen {

// The kernels of one backward module, in launch order (the sinks' gradient only for a call with sinks), after the
// three of a user mask's block classes (generator.hpp's has_user_block_classes; templates/user_blocks.cuh).
enum class BwdKernel {
  kPreprocess,
  kDkdv,
  kDq,
  kConvert,
  kSinkGrad,
  kUserBlockTiles,
  kUserBlockRanges,
  kUserBlockBands,
  kWiden,
};

// "preprocess", "dkdv", "dq", "convert", "sink_grad", "user_tiles", "user_ranges", "user_bands", "widen"
const char* bwd_kernel_suffix(BwdKernel kernel);

// The sm80 backward family's own knobs (templates/bwd_sm80.cuh: mma.sync; both dQ strategies).
struct BwdSm80Knobs {
  int warps = 4;    // dkdv kernel: block_n = 16 * key tiles per warp * warps
  int d_split = 1;  // head_dim slices of dK/dV (and dQ) accumulated by separate blocks

  bool operator==(const BwdSm80Knobs& o) const { return warps == o.warps && d_split == o.d_split; }
  bool operator!=(const BwdSm80Knobs& o) const { return !(*this == o); }
};

// The sm90 backward family (templates/bwd_sm90.cuh: wgmma and TMA, sm_90a) has no knobs of its own: its
// dkdv kernel has block_n / 64 consumer warpgroups and a producer, and keeps the whole head_dim (at 192 and
// 256 one consumer holds dK and the other dV of 64 keys; at 128 with 64 keys two consumers take turns over
// the query blocks; bwd_sm90_traits decides).
struct BwdSm90Knobs {
  bool operator==(const BwdSm90Knobs&) const { return true; }
  bool operator!=(const BwdSm90Knobs&) const { return false; }
};

// A backward call's workspace, its parts in order: D = rowsum(dO ∘ O) per row, the sinks' gradient's partials
// (sink_grad configs, at D's aligned end where the kernels find them: attn_params.cuh), the sm90 family's LSE in
// base 2, the fp32 dQ accumulator, the sm90 family's semaphores (one per 64-row tile, counting a query block's dQ
// adds: attn_params.cuh), a user mask's block classes; each an offset into the workspace, kAbsent where not needed.
struct BwdWorkspace : Workspace {
  size_t dsum = 0, sink_partials = kAbsent, lse_log2 = kAbsent, dq_accum = kAbsent, dq_semaphore = kAbsent,
         user_classes = kAbsent;
  size_t widened[3] = {kAbsent, kAbsent, kAbsent};  // an FP8 call's q, k and v as 16-bit values (BwdWiden)
};

// The fields both families share, then the knobs of one of them. A kernel module (generator/kernel_module.hpp).
struct BwdConfig {
  using Kernel = BwdKernel;
  using Params = AttnBwdParams;
  DType dtype = DType::kFloat16;
  int head_dim = 128;
  // The values' (v, out, dout, dv) head dim where it differs from head_dim (MLA's 192/128): _v<dim> after _d<head_dim>,
  // JSON field head_dim_v; 0: head_dim.
  int head_dim_v = 0;
  MaskKind mask = MaskKind::kNone;
  // dkdv kernel: block_n keys per block, block_m queries per step.
  int block_m = 64;
  int block_n = 64;
  int stages = 2;
  // false: dQ added into an fp32 accumulator with atomics by the dkdv kernel, then converted.
  // true: repeated runs give identical bits. The sm80 family runs a separate dq kernel that owns each dQ
  // element; the sm90 family's dkdv kernel adds dQ in a fixed order of key blocks (bwd_sm90.cuh).
  bool deterministic = false;
  // The sm80 family's dq kernel (deterministic only; not part of the name otherwise).
  int dq_block_m = 64;
  int dq_block_n = 32;
  int dq_warps = 4;
  int dq_stages = 2;
  // The dkdv kernel's knobs of one family, and so the family.
  std::variant<BwdSm80Knobs, BwdSm90Knobs> knobs;
  // Packed batches of sequences of different lengths (templates/sequence.cuh): kernels of their own,
  // suffix _varlen after _causal.
  bool varlen = false;
  // The score modifiers (KernelConfig::mods), suffixes _softcap, _alibi after the mask's (_causal or _window).
  ScoreMods mods = {};
  // The sinks' gradient summed in fp32 over the dkdv kernel's scores (bwd_rows.cuh's BwdSinkGrad), suffix _dsink after
  // the score modifiers'. Set by dispatch for a call with sinks that wants their gradient, never tuned over: no
  // tuning data holds it.
  bool sink_grad = false;
  // An FP8 call's module (suffix _fp8in after _varlen): the same kernels and a first one, BwdWiden, writing its FP8
  // q, k and v as dtype into the workspace. The planner chooses 16-bit configs; the launch takes their _fp8in twin.
  bool fp8_inputs = false;
  // A user-defined variant (KernelConfig::user): suffix _u<hash> at the end of the name, before a kernel's symbol
  // suffix.
  std::shared_ptr<const UserVariant> user = nullptr;

  // The values' head dim: head_dim_v, or head_dim where the config has none of its own.
  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }

  KernelFamily family() const {
    return std::holds_alternative<BwdSm90Knobs>(knobs) ? KernelFamily::kSm90 : KernelFamily::kSm80;
  }
  // The family's knobs, or nullptr when the config is of the other family.
  const BwdSm80Knobs* sm80() const { return std::get_if<BwdSm80Knobs>(&knobs); }
  BwdSm80Knobs* sm80() { return std::get_if<BwdSm80Knobs>(&knobs); }
  const BwdSm90Knobs* sm90() const { return std::get_if<BwdSm90Knobs>(&knobs); }
  BwdSm90Knobs* sm90() { return std::get_if<BwdSm90Knobs>(&knobs); }

  // e.g. bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_causal, or ..._det_qm64_qn32_qw4_qs2 when deterministic; _v<dim>
  // after _d<head_dim> for values of a head dim of their own;
  // bwd_sm90_fp16_d128_m64_n128_s2[_causal|_window][_softcap][_alibi][_dsink][_det]; _varlen before _det for packed batches.
  std::string name() const;
  static BwdConfig from_name(const std::string& name);  // throws Error(kInvalidArgument)

  // Symbol of one kernel of the module: name() + "_" + bwd_kernel_suffix(kernel).
  std::string symbol(BwdKernel kernel) const;

  // The sm80 family's dkdv sizes, the dq kernel's, and the sm90 family's dkdv sizes; a family's own
  // throw Error(kInternal) for a config of the other family.
  BwdDkdvTraits dkdv_traits() const;
  BwdDqTraits dq_traits() const;
  BwdSm90Traits sm90_traits() const;
  // The sm90 family: whether the dkdv kernel's consumers step together rather than take turns (bwd_sm90_lock_step;
  // rendered into the config header, where the kernel checks it against its variant).
  bool sm90_lock_step() const;
  // Whether the module has the dq kernel (the sm80 family's deterministic strategy), else a convert kernel.
  bool has_dq_kernel() const { return deterministic && family() == KernelFamily::kSm80; }
  // Where the module accumulates dQ in fp32 (bwd_traits.cuh).
  DqAccum dq_accum() const;
  // Block size of one kernel.
  int threads(BwdKernel kernel) const;
  // Workspace rows per (batch, head) are seqlen_q rounded up to this (bwd_rows.cuh).
  int pad_rows() const;
  // Workspace rows of one (batch, head) of a call of params: seqlen_q rounded up to pad_rows.
  size_t workspace_rows(const AttnBwdParams& params) const;
  // The sinks' gradient's partials per dkdv block and query head (with sink_grad): one per warp (the sm90 family:
  // per consumer warp).
  int sink_partial_warps() const;
  // Dynamic shared memory of one kernel (0 for the row kernels).
  int smem_bytes(BwdKernel kernel) const;
  // The kernels whose spills decide whether the config is worth running: dkdv, and the dq kernel where there is one.
  std::vector<BwdKernel> spill_checked_kernels() const;
  // Why this config cannot run on sm_<arch>, or nullopt when it can.
  std::optional<std::string> invalid_reason(int arch) const;

  // Whether the config can run a call (problem, params) on device: the config is for the problem (dtype, head_dim,
  // mask, modifiers, variant) and the device's sm, and TMA can describe the tensors (the sm90 family).
  Implementability can_implement(const AttentionProblem& problem, const AttnBwdParams& params,
                                 const DeviceTraits& device) const;
  // The workspace of a call of params: the fp32 row values (D, and the base-2 LSE for the sm90 family) of batch ·
  // heads_q · workspace_rows rows (a packed batch: heads_q times attn_params.cuh's packed_workspace_rows), the dQ
  // accumulator and semaphores of its strategy, and user_classes_bytes of a user mask's block classes (as the
  // launcher plans them; 0 where there are none or a block mask keeps them).
  BwdWorkspace workspace(const AttnBwdParams& params, size_t user_classes_bytes = 0) const;

  bool operator==(const BwdConfig& other) const { return name() == other.name(); }
  bool operator!=(const BwdConfig& other) const { return !(*this == other); }
};

// The tensors of a backward call as TMA sees them, with the box rows of the sm90 dkdv kernel's copies.
struct BwdTmaTensors {
  TmaTensor q, dout, k, v, dk, dv;
  int q_rows = 0, kv_rows = 0;
  static constexpr int kGradRows = 64;  // each consumer warpgroup stores its own 64 keys

  BwdTmaTensors(const AttentionProblem& problem, const AttnBwdParams& p, const BwdConfig& config);
  // Why TMA cannot describe one of them ("dq: ..."), or nullopt when it can describe all.
  std::optional<std::string> unsupported_reason() const;
};

void to_json(nlohmann::json& j, const BwdConfig& config);
void from_json(const nlohmann::json& j, BwdConfig& config);  // throws Error on bad fields

}  // namespace flashgen
