// The generator: KernelConfig -> GeneratedSource, a short config header plus an instantiation
// translation unit that includes the real CUDA templates under templates/ (embedded at build time).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "generator/bwd_config.hpp"
#include "generator/decode_config.hpp"
#include "generator/kernel_config.hpp"

namespace flashgen {

// Bumped whenever generated code changes meaning; part of every cache key and of the device
// fingerprint that tuning results are stored under. 2: the sm90 family.
inline constexpr const char* kGeneratorVersion = "2";

struct SourceFile {
  std::string name;      // include name, e.g. "fwd_sm80.cuh"
  std::string contents;
};

struct GeneratedSource {
  std::string kernel_name;           // extern "C" symbol == KernelConfig::name()
  std::string translation_unit;      // "<kernel_name>.cu": includes the config header and the template
  std::vector<SourceFile> headers;   // generated config header first, then the templates it includes

  // One translation unit with every project include inlined in dependency order, for `flashgen emit`;
  // nvcc compiles it unchanged.
  std::string self_contained() const;
};

GeneratedSource generate(const KernelConfig& config);
// One module holding every kernel of a backward config; kernel_name is config.name() and each kernel's
// symbol is config.symbol(kernel).
GeneratedSource generate(const BwdConfig& config);
// One module holding the KV-cache kernels of a decode config; each kernel's symbol is config.symbol(kernel).
GeneratedSource generate(const DecodeConfig& config);

// Whether a config's module holds the kernels that classify a user mask's blocks (templates/user_blocks.cuh): a config
// with a user mask, but for a paged cache's. A forward module's two are FwdKernel::kUserBlockTiles (each tile's class)
// and kUserBlockRanges (each query block's walk); a backward module's three are BwdKernel::kUserBlockTiles,
// kUserBlockRanges and kUserBlockBands.
inline bool has_user_block_classes(const KernelConfig& config) {
  return config.user && config.user->masks() && !config.paged;
}
inline bool has_user_block_classes(const BwdConfig& config) { return config.user && config.user->masks(); }

// A user variant's functions as the struct templates/variant.cuh's UserVariant calls (flashgen_user::Functions),
// each caller's body under #line directives naming its function, for the config headers of its kernels.
std::string render_user_functions(const UserVariant& user);
// A module that calls each of the variant's functions once: compiled by flashgen_variant_create to report the
// caller's errors before any kernel is built.
GeneratedSource generate_user_probe(const UserVariant& user);
// A module whose one kernel evaluates the variant's functions at a list of points (UserTableParams below): the
// mask, the modified score or bias, the score's derivative. The tuner's float64 reference reads them
// (tuner/user_reference.hpp), so a sweep checks a user variant's candidates against the functions themselves.
GeneratedSource generate_user_table(const UserVariant& user);

// The parameters of generate_user_table's kernel, as its source declares them.
struct UserTableParams {
  const void* user_buffers[8];
  unsigned user_scalars[8];
  const int* points;        // count points of (batch, head, q_idx, kv_idx)
  const float* scores;      // the score each point's score_mod is asked at (softmax units); null without one
  long long count;
  unsigned char* visible;   // mask_mod's answer, 1 without one
  float* modified;          // score_mod(score) or score_bias, 0 without either
  float* gradient;          // score_grad(modified), 1 without it
};

// The templates as embedded in the library at build time, or read from $FLASHGEN_TEMPLATE_DIR when set
// (for editing templates without rebuilding).
const std::vector<SourceFile>& template_files();

}  // namespace flashgen
