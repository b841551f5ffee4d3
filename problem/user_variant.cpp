// Checks a user variant's description and names it by the hash of what it holds.
#include "problem/user_variant.hpp"

#include <cstdint>
#include <cctype>
#include <cstdio>
#include <set>

#include "flashgen/error.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

namespace {

// The parameters of the functions a body is compiled into, and the names the generated code uses: a buffer or
// scalar of one of these names would shadow it or collide.
const std::set<std::string>& reserved_names() {
  static const std::set<std::string> names = {"batch", "head", "q_idx", "kv_idx", "score", "modified", "of",
                                              "mask_mod", "score_mod", "score_grad", "score_bias", "kMasks",
                                              "kScore", "Functions", "p", "f"};
  return names;
}

bool is_identifier(const std::string& name) {
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return name.rfind("__", 0) != 0;  // reserved for the implementation
}

// The body of one function: empty when not given; a given body must hold something.
std::string body_of(const std::optional<std::string>& text, const char* field) {
  if (!text) return {};
  FLASHGEN_REQUIRE(text->find_first_not_of(" \t\r\n") != std::string::npos,
                   std::string("desc.") + field + " must be NULL (none) or a function body, got an empty string");
  return *text;
}

std::vector<UserArg> args_of(const std::vector<UserArg>& args, const char* field, std::set<std::string>& seen) {
  const std::string what = std::string("desc.") + field;
  const bool scalars = std::string(field) == "scalars";
  check_user_arg_count(static_cast<int64_t>(args.size()), field);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string at = what + "[" + std::to_string(i) + "]";
    const std::string& name = args[i].name;
    FLASHGEN_REQUIRE(is_identifier(name), at + ".name '" + name + "' is not a C++ identifier (letters, digits, _)");
    FLASHGEN_REQUIRE(reserved_names().count(name) == 0,
                     at + ".name '" + name + "' is taken by the functions' parameters or the generated code");
    FLASHGEN_REQUIRE(seen.insert(name).second, at + ".name '" + name + "' is declared twice");
    const int type = static_cast<int>(args[i].type);
    const int types = scalars ? 2 : 4;
    FLASHGEN_REQUIRE(type >= 0 && type < types,
                     at + ".type must be " +
                         (scalars ? "FLASHGEN_ARG_FLOAT32 or FLASHGEN_ARG_INT32" : "a flashgen_arg_type value") +
                         ", got " + std::to_string(type));
  }
  return args;
}

uint64_t fnv1a(const std::string& bytes, uint64_t hash) {
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The hash of every field, each preceded by its length so that no two descriptions run together.
std::string tag_of(const UserVariant& v) {
  uint64_t hash = 0xcbf29ce484222325ull;
  auto add = [&](const std::string& field) {
    hash = fnv1a(std::to_string(field.size()) + ":", hash);
    hash = fnv1a(field, hash);
  };
  for (const std::string* body : {&v.mask_mod, &v.score_mod, &v.score_grad, &v.score_bias, &v.helpers}) add(*body);
  add(v.mask_same_for_heads ? "shared" : "per head");
  for (const auto* list : {&v.buffers, &v.scalars}) {
    add(std::to_string(list->size()));
    for (const UserArg& a : *list) add(a.name + " " + user_arg_ctype(a.type));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return "u" + std::string(hex).substr(0, 12);
}

}  // namespace

const char* user_arg_ctype(UserArgType type) {
  switch (type) {
    case UserArgType::kInt32: return "int";
    case UserArgType::kInt64: return "long long";
    case UserArgType::kUint8: return "unsigned char";
    case UserArgType::kFloat32: break;
  }
  return "float";
}

void check_user_arg_count(int64_t count, const char* field) {
  const int64_t limit = std::string(field) == "scalars" ? kMaxUserScalars : kMaxUserBuffers;
  FLASHGEN_REQUIRE(count >= 0 && count <= limit, std::string("desc.") + field + ": num_" + field + " must be 0 to " +
                                                     std::to_string(limit) + ", got " + std::to_string(count));
}

std::shared_ptr<const UserVariant> make_user_variant(const UserVariantDesc& desc) {
  auto v = std::make_shared<UserVariant>();
  v->mask_mod = body_of(desc.mask_mod, "mask_mod");
  v->score_mod = body_of(desc.score_mod, "score_mod");
  v->score_grad = body_of(desc.score_grad, "score_grad");
  v->score_bias = body_of(desc.score_bias, "score_bias");
  v->helpers = body_of(desc.helpers, "helpers");
  FLASHGEN_REQUIRE(v->masks() || v->modifies_scores(),
                   "desc: give at least one of mask_mod, score_mod and score_bias");
  FLASHGEN_REQUIRE(v->score_mod.empty() || v->score_bias.empty(),
                   "desc.score_bias: give score_mod or score_bias, not both (a bias can be added in score_mod)");
  FLASHGEN_REQUIRE(v->score_grad.empty() || !v->score_mod.empty(),
                   "desc.score_grad is the derivative of score_mod, which is not given");
  std::set<std::string> seen;
  v->buffers = args_of(desc.buffers, "buffers", seen);
  v->scalars = args_of(desc.scalars, "scalars", seen);
  v->mask_same_for_heads = desc.mask_same_for_heads;
  v->tag = tag_of(*v);
  return v;
}

}  // namespace flashgen
