// A user-defined variant as the library holds it: the caller's function bodies and the buffers and scalars they
// read, checked once, and the tag of their hash that kernel names carry.
// A problem and the configs chosen for it share one immutable copy; the generator renders it into the kernels
// (templates/variant.cuh's UserVariant).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flashgen {

// The type of a buffer's elements or of a scalar (flashgen.h's flashgen_arg_type values; int-sized so that a
// description may hold any value a caller gave, which make_user_variant refuses unless it is one of these).
enum class UserArgType : int { kFloat32 = 0, kInt32 = 1, kInt64 = 2, kUint8 = 3 };

// The C++ type a kernel reads an argument of type as: "float", "int", "long long", "unsigned char".
const char* user_arg_ctype(UserArgType type);

struct UserArg {
  std::string name;
  UserArgType type = UserArgType::kFloat32;
};

struct UserVariant {
  std::string mask_mod, score_mod, score_grad, score_bias, helpers;  // bodies as given; empty: none
  std::vector<UserArg> buffers, scalars;
  bool mask_same_for_heads = false;  // the forward's block classes once per batch entry, not per head
  std::string tag;  // "u" + 12 hex digits of the hash of everything above

  bool masks() const { return !mask_mod.empty(); }
  bool modifies_scores() const { return !score_mod.empty() || !score_bias.empty(); }
  // Whether the backward can take it: a score function needs its derivative.
  bool has_gradient() const { return score_mod.empty() || !score_grad.empty(); }
};

// A call's arguments of a user variant (flashgen_attention_options' variant_buffers and variant_scalars): its
// buffers' device pointers and its scalars' 4-byte values, in the variant's order.
struct UserVariantArgs {
  std::vector<const void*> buffers;
  std::vector<uint32_t> scalars;
};

// A user variant as a caller describes it (flashgen_variant_desc's fields, which api/ translates; the CLI reads
// one from JSON): each function's body or none, and the buffers and scalars as declared.
struct UserVariantDesc {
  std::optional<std::string> mask_mod, score_mod, score_grad, score_bias, helpers;  // nullopt: not given
  std::vector<UserArg> buffers, scalars;
  bool mask_same_for_heads = false;
};

// desc checked and copied; throws Error(kInvalidArgument) naming the field at fault as flashgen_variant_desc's
// ("desc.buffers[1].name"): a function given empty, score_mod with score_bias, score_grad without score_mod, too
// many buffers or scalars, a name that is not an identifier, is used twice or shadows a function's parameter, a
// type a scalar cannot have.
std::shared_ptr<const UserVariant> make_user_variant(const UserVariantDesc& desc);

// A description's count of buffers or scalars (field "buffers" or "scalars"): 0 to the kernels' limit, else
// Error(kInvalidArgument) naming desc.<field>. make_user_variant checks it; api/ too, before reading a C array.
void check_user_arg_count(int64_t count, const char* field);

}  // namespace flashgen
