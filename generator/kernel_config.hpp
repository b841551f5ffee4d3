// KernelConfig: the compile-time choices of one generated forward kernel (family, dtype, head_dim, mask,
// tile sizes, warps, stages, ...), with validation, JSON round-trip and one canonical name.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "problem/attention_problem.hpp"
#include "templates/fwd_traits.cuh"

namespace flashgen {

// The forward kernel families: templates/fwd_sm80.cuh (mma.sync, cp.async; sm_80 and newer) and
// templates/fwd_sm90.cuh (wgmma, TMA, warp-specialized; sm_90a only).
enum class KernelFamily { kSm80 = 0, kSm90 = 1 };

struct KernelConfig {
  DType dtype = DType::kFloat16;
  int head_dim = 128;
  MaskKind mask = MaskKind::kNone;
  int block_m = 128;
  int block_n = 32;
  int warps = 4;            // sm80 only: the sm90 family has block_m / 64 consumer warpgroups + 1 producer
  int stages = 3;
  bool q_in_regs = false;  // sm80 only: keep Q's mma fragments in registers instead of re-reading shared memory
  KernelFamily family = KernelFamily::kSm80;  // last, so aggregate initialisers of the sm80 fields still read
  bool overlap = false;   // sm90 only: softmax of block j runs while the tensor cores compute P V of block j - 1
  bool pingpong = false;  // sm90 only, two consumers: they take turns at issuing their products
  bool persistent = false;  // sm90 only: one block per SM walks the tiles (grid = min(tiles, SMs)), or its groups
  bool p_smem = false;      // sm90 only: P V reads P from shared memory instead of registers
  int cluster = 1;          // sm90 only: 2 blocks of a cluster share each K/V tile by TMA multicast
  int groups = 1;           // sm90 only: 2 groups of consumers in one persistent block, each on tiles of its own
  bool tensor_sum = false;  // sm90 only: the rows' sums of P from the tensor cores (P times ones) instead of adds

  // Canonical name, e.g. fwd_sm80_bf16_d128_m128_n32_w4_s3_causal (suffix _qreg when q_in_regs) or
  // fwd_sm90_fp16_d128_m128_n128_s2_causal (suffixes _ovl, _pp, _pst, _psm, _c2, _g2, _tsum for overlap,
  // pingpong, persistent, p_smem, cluster 2, groups 2, tensor_sum). It is the kernel's symbol, its file name in dumps and part of its
  // cache key.
  std::string name() const;
  // Inverse of name(); throws Error(kInvalidArgument) naming what it could not read.
  static KernelConfig from_name(const std::string& name);

  FwdTraits traits() const;          // the sm80 family's sizes
  FwdSm90Traits sm90_traits() const; // the sm90 family's sizes
  // The family's block size, dynamic shared memory, and shape error (nullptr when valid somewhere).
  int threads() const;
  int smem_bytes() const;
  const char* shape_error() const;
  // Why this config cannot run on sm_<arch>, or nullopt when it can.
  std::optional<std::string> invalid_reason(int arch) const;

  bool operator==(const KernelConfig& other) const;
  bool operator!=(const KernelConfig& other) const { return !(*this == other); }
};

// Reads "<prefix><int>" from one '_'-separated field of the config name `name` (e.g. "d128" with prefix
// "d"); throws Error(kInvalidArgument) naming the field otherwise. Shared by the config families' names.
int parse_name_field(const std::string& field, const std::string& prefix, const std::string& name);
// Reads the dtype field ("fp16" or "bf16") of the config name `name`; throws Error(kInvalidArgument).
DType parse_dtype_field(const std::string& field, const std::string& name);

void to_json(nlohmann::json& j, const KernelConfig& config);
void from_json(const nlohmann::json& j, KernelConfig& config);  // throws Error on bad fields

// Whether a config JSON field is an integer within int's range (a plain get<int>() would wrap larger ones).
bool is_int_field(const nlohmann::json& value);

}  // namespace flashgen
