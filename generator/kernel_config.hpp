// KernelConfig: the compile-time choices of one generated kernel (dtype, head_dim, mask, tile sizes,
// warps, stages, ...), with validation, JSON round-trip and one canonical name.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "fwd_traits.cuh"

namespace flashgen {

enum class DType { kFloat16 = 0, kBFloat16 = 1 };

const char* dtype_name(DType dtype);  // "fp16", "bf16"

struct KernelConfig {
  DType dtype = DType::kFloat16;
  int head_dim = 128;
  MaskKind mask = MaskKind::kNone;
  int block_m = 128;
  int block_n = 32;
  int warps = 4;
  int stages = 3;
  bool q_in_regs = false;  // keep Q's mma fragments in registers instead of re-reading shared memory

  // Canonical name, e.g. fwd_sm80_bf16_d128_m128_n32_w4_s3_causal (suffix _qreg when q_in_regs).
  // It is the kernel's symbol, its file name in dumps and part of its cache key.
  std::string name() const;
  // Inverse of name(); throws Error(kInvalidArgument) naming what it could not read.
  static KernelConfig from_name(const std::string& name);

  FwdTraits traits() const;
  // Why this config cannot run on sm_<arch>, or nullopt when it can.
  std::optional<std::string> invalid_reason(int arch) const;

  bool operator==(const KernelConfig& other) const;
  bool operator!=(const KernelConfig& other) const { return !(*this == other); }
};

// Reads "<prefix><int>" from one '_'-separated field of the config name `name` (e.g. "d128" with prefix
// "d"); throws Error(kInvalidArgument) naming the field otherwise. Shared by the config families' names.
int parse_name_field(const std::string& field, const std::string& prefix, const std::string& name);

void to_json(nlohmann::json& j, const KernelConfig& config);
void from_json(const nlohmann::json& j, KernelConfig& config);  // throws Error on bad fields

}  // namespace flashgen
