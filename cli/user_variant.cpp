// --variant FILE: a user-defined variant's description, read and checked (cli/user_variant.hpp).
#include "cli/user_variant.hpp"

#include <algorithm>
#include <deque>
#include <iterator>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "flashgen/error.hpp"
#include "runtime/kernel_registry.hpp"

namespace flashgen::cli {

const char* const kVariantHelp =
    "compile a user-defined variant in (flashgen_variant_desc as JSON, '-' for stdin): mask_mod, score_mod, "
    "score_grad, score_bias and helpers as strings of C++, buffers and scalars as lists of {\"name\", \"type\"} "
    "(float32, int32, int64 or uint8; scalars float32 or int32), mask_same_for_heads; its functions are compiled on "
    "their own first, so their errors come back with NVRTC's messages; a config name may end with the variant's tag "
    "(_u<12 hex digits>), which must then be this description's";

namespace {

// A user variant from its description as JSON (flashgen_variant_desc's fields by name), checked as
// flashgen_variant_create checks it.
std::shared_ptr<const UserVariant> read_variant_json(const std::string& path) {
  const std::string where = "variant JSON '" + path + "'";
  const Json j = read_json_file(path, "variant JSON");
  FLASHGEN_REQUIRE(j.is_object(), where + ": expected an object");
  static const char* const kBodies[] = {"mask_mod", "score_mod", "score_grad", "score_bias", "helpers"};
  static const std::pair<const char*, flashgen_arg_type> kTypes[] = {{"float32", FLASHGEN_ARG_FLOAT32},
                                                                      {"int32", FLASHGEN_ARG_INT32},
                                                                      {"int64", FLASHGEN_ARG_INT64},
                                                                      {"uint8", FLASHGEN_ARG_UINT8}};
  for (const auto& [key, value] : j.items()) {
    const bool known = key == "buffers" || key == "scalars" || key == "mask_same_for_heads" ||
                       std::find(std::begin(kBodies), std::end(kBodies), key) != std::end(kBodies);
    FLASHGEN_REQUIRE(known, where + ": unknown field '" + key + "'");
  }
  std::deque<std::string> strings;  // the desc points into these (a deque keeps them in place as it grows)
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  const char** fields[] = {&desc.mask_mod, &desc.score_mod, &desc.score_grad, &desc.score_bias, &desc.helpers};
  for (size_t i = 0; i < std::size(kBodies); ++i) {
    if (!j.contains(kBodies[i])) continue;
    FLASHGEN_REQUIRE(j[kBodies[i]].is_string(), where + ": '" + kBodies[i] + "' must be a string of C++");
    *fields[i] = strings.emplace_back(j[kBodies[i]].get<std::string>()).c_str();
  }
  auto arguments = [&](const char* key) {
    std::vector<flashgen_variant_arg> args;
    if (!j.contains(key)) return args;
    FLASHGEN_REQUIRE(j[key].is_array(), where + ": '" + key + "' must be a list of {\"name\", \"type\"}");
    for (const Json& arg : j[key]) {
      FLASHGEN_REQUIRE(arg.is_object() && arg.contains("name") && arg["name"].is_string() && arg.contains("type") &&
                           arg["type"].is_string(),
                       where + ": each of '" + key + "' must be {\"name\": string, \"type\": string}");
      const std::string type = arg["type"].get<std::string>();
      const auto found = std::find_if(std::begin(kTypes), std::end(kTypes), [&](const auto& t) { return type == t.first; });
      FLASHGEN_REQUIRE(found != std::end(kTypes),
                       where + ": '" + key + "' type '" + type + "' is not float32, int32, int64 or uint8");
      args.push_back({strings.emplace_back(arg["name"].get<std::string>()).c_str(), found->second});
    }
    return args;
  };
  const std::vector<flashgen_variant_arg> buffers = arguments("buffers");
  const std::vector<flashgen_variant_arg> scalars = arguments("scalars");
  desc.buffers = buffers.empty() ? nullptr : buffers.data();
  desc.num_buffers = static_cast<int32_t>(buffers.size());
  desc.scalars = scalars.empty() ? nullptr : scalars.data();
  desc.num_scalars = static_cast<int32_t>(scalars.size());
  if (j.contains("mask_same_for_heads")) {
    FLASHGEN_REQUIRE(j["mask_same_for_heads"].is_boolean(), where + ": 'mask_same_for_heads' must be true or false");
    desc.mask_same_for_heads = j["mask_same_for_heads"].get<bool>() ? 1 : 0;
  }
  try {
    std::shared_ptr<const UserVariant> user = make_user_variant(desc);
    check_user_functions_compile(*user);
    return user;
  } catch (const Error& error) {
    fail(error.status(), where + ": " + error.what());
  }
}

// A config name ending with a user variant's tag (_u and 12 hex digits): the tag, cut from name.
std::optional<std::string> cut_variant_tag(std::string& name) {
  const size_t at = name.rfind("_u");
  if (at == std::string::npos || name.size() - at != 14) return std::nullopt;
  if (name.find_first_not_of("0123456789abcdef", at + 2) != std::string::npos) return std::nullopt;
  std::string tag = name.substr(at + 1);
  name.resize(at);
  return tag;
}


// Compiles user (when given) into config, read from `name` (empty for a config without one), whose tag (cut from it)
// must then be user's.
void attach(AnyConfig& config, const std::string& name, const std::optional<std::string>& tag,
            std::shared_ptr<const UserVariant> user) {
  if (user == nullptr) {
    if (tag) {
      fail(Status::kInvalidArgument,
           "config " + name + " names the user variant " + *tag + ": give its description with --variant FILE");
    }
    return;
  }
  if (tag && *tag != user->tag) {
    fail(Status::kInvalidArgument,
         "config " + name + " names the user variant " + *tag + ", but --variant describes " + user->tag);
  }
  if (std::holds_alternative<BwdConfig>(config) && !user->has_gradient()) {
    fail(Status::kInvalidArgument,
         "--variant " + user->tag + " has a score_mod but no score_grad: a backward module needs the derivative");
  }
  std::visit([&](auto& c) { c.user = std::move(user); }, config);
}

}  // namespace

std::shared_ptr<const UserVariant> variant_of(const Args& args) {
  return args.has("variant") ? read_variant_json(args.string_or("variant", "-")) : nullptr;
}

void attach_variant(AnyConfig& config, std::shared_ptr<const UserVariant> user) {
  attach(config, "", std::nullopt, std::move(user));
}

AnyConfig config_from_name(const std::string& name, std::shared_ptr<const UserVariant> user) {
  std::string untagged = name;
  const std::optional<std::string> tag = cut_variant_tag(untagged);
  AnyConfig config = config_from_name(untagged);
  attach(config, name, tag, std::move(user));
  return config;
}

}  // namespace flashgen::cli
