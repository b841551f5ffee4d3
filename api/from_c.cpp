// The translation of flashgen.h's structs into the library's own types (api/from_c.hpp).
#include "api/from_c.hpp"

#include <string>
#include <vector>

#include "flashgen/error.hpp"

namespace flashgen {

static_assert(static_cast<int>(UserArgType::kFloat32) == FLASHGEN_ARG_FLOAT32 &&
                  static_cast<int>(UserArgType::kInt32) == FLASHGEN_ARG_INT32 &&
                  static_cast<int>(UserArgType::kInt64) == FLASHGEN_ARG_INT64 &&
                  static_cast<int>(UserArgType::kUint8) == FLASHGEN_ARG_UINT8,
              "UserArgType takes flashgen_arg_type's values");

namespace {

// A function body: not given when NULL.
std::optional<std::string> body_from_c(const char* text) {
  return text != nullptr ? std::optional<std::string>(text) : std::nullopt;
}

// The buffers or scalars (field) of a description: their count and array, and each name given.
std::vector<UserArg> args_from_c(const flashgen_variant_arg* args, int32_t count, const char* field) {
  check_user_arg_count(count, field);
  const std::string what = std::string("desc.") + field;
  FLASHGEN_REQUIRE(count == 0 || args != nullptr, what + " is NULL but num_" + field + " is " + std::to_string(count));
  std::vector<UserArg> out;
  for (int32_t i = 0; i < count; ++i) {
    FLASHGEN_REQUIRE(args[i].name != nullptr, what + "[" + std::to_string(i) + "].name is NULL");
    out.push_back({args[i].name, static_cast<UserArgType>(static_cast<int>(args[i].type))});
  }
  return out;
}

}  // namespace

UserVariantDesc from_c(const flashgen_variant_desc& desc) {
  FLASHGEN_REQUIRE(desc.size == sizeof(flashgen_variant_desc),
                   "desc.size must be sizeof(flashgen_variant_desc) = " + std::to_string(sizeof(flashgen_variant_desc)) +
                       " (the flashgen.h this library was built with), got " + std::to_string(desc.size));
  UserVariantDesc out;
  out.mask_mod = body_from_c(desc.mask_mod);
  out.score_mod = body_from_c(desc.score_mod);
  out.score_grad = body_from_c(desc.score_grad);
  out.score_bias = body_from_c(desc.score_bias);
  out.helpers = body_from_c(desc.helpers);
  out.buffers = args_from_c(desc.buffers, desc.num_buffers, "buffers");
  out.scalars = args_from_c(desc.scalars, desc.num_scalars, "scalars");
  out.mask_same_for_heads = desc.mask_same_for_heads != 0;
  return out;
}

}  // namespace flashgen
