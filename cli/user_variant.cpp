// --variant FILE: a user-defined variant's description, read and checked (cli/user_variant.hpp).
#include "cli/user_variant.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
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

const char* const kTuneVariantHelp =
    "tune a user-defined variant of the problem (dense calls; as emit --variant takes it): its base class's tiles "
    "with its functions compiled in, checked against them, stored under its tag; each buffer needs \"values\" (a "
    "list of numbers of its type, covering every index the functions read at the problem's sizes) and each scalar "
    "\"value\" in the JSON, which the sweep calls the functions with";

namespace {

// A JSON value that must be a whole number in [low, high]; an error naming `what` otherwise.
int64_t integer_in(const Json& v, int64_t low, int64_t high, const std::string& what) {
  FLASHGEN_REQUIRE(v.is_number_integer(), what + " must be a whole number, got " + v.dump());
  FLASHGEN_REQUIRE(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                   what + " is out of range: " + v.dump());
  const int64_t value = v.get<int64_t>();
  FLASHGEN_REQUIRE(value >= low && value <= high, what + " must be in [" + std::to_string(low) + ", " +
                                                      std::to_string(high) + "], got " + v.dump());
  return value;
}

// The --variant file's JSON, read once (it may be stdin).
const Json& variant_json(const std::string& path) {
  static std::map<std::string, Json> read;
  auto found = read.find(path);
  if (found == read.end()) found = read.emplace(path, read_json_file(path, "variant JSON")).first;
  return found->second;
}

// A user variant from its description as JSON (flashgen_variant_desc's fields by name), checked as
// flashgen_variant_create checks it.
std::shared_ptr<const UserVariant> read_variant_json(const std::string& path) {
  const std::string where = "variant JSON '" + path + "'";
  const Json& j = variant_json(path);
  FLASHGEN_REQUIRE(j.is_object(), where + ": expected an object");
  static const char* const kBodies[] = {"mask_mod", "score_mod", "score_grad", "score_bias", "helpers"};
  static const std::pair<const char*, UserArgType> kTypes[] = {{"float32", UserArgType::kFloat32},
                                                                {"int32", UserArgType::kInt32},
                                                                {"int64", UserArgType::kInt64},
                                                                {"uint8", UserArgType::kUint8}};
  for (const auto& [key, value] : j.items()) {
    const bool known = key == "buffers" || key == "scalars" || key == "mask_same_for_heads" ||
                       std::find(std::begin(kBodies), std::end(kBodies), key) != std::end(kBodies);
    FLASHGEN_REQUIRE(known, where + ": unknown field '" + key + "'");
  }
  UserVariantDesc desc;
  std::optional<std::string>* fields[] = {&desc.mask_mod, &desc.score_mod, &desc.score_grad, &desc.score_bias,
                                          &desc.helpers};
  for (size_t i = 0; i < std::size(kBodies); ++i) {
    if (!j.contains(kBodies[i])) continue;
    FLASHGEN_REQUIRE(j[kBodies[i]].is_string(), where + ": '" + kBodies[i] + "' must be a string of C++");
    *fields[i] = j[kBodies[i]].get<std::string>();
  }
  auto arguments = [&](const char* key) {
    std::vector<UserArg> args;
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
      args.push_back({arg["name"].get<std::string>(), found->second});
    }
    return args;
  };
  desc.buffers = arguments("buffers");
  desc.scalars = arguments("scalars");
  if (j.contains("mask_same_for_heads")) {
    FLASHGEN_REQUIRE(j["mask_same_for_heads"].is_boolean(), where + ": 'mask_same_for_heads' must be true or false");
    desc.mask_same_for_heads = j["mask_same_for_heads"].get<bool>();
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

VariantValues variant_values_of(const Args& args, const UserVariant& user) {
  const std::string path = args.string_or("variant", "-");
  const std::string where = "variant JSON '" + path + "'";
  const Json& j = variant_json(path);
  VariantValues values;
  values.buffers.reserve(user.buffers.size());
  for (size_t i = 0; i < user.buffers.size(); ++i) {
    const UserArg& arg = user.buffers[i];
    const Json& entry = j.at("buffers").at(i);
    FLASHGEN_REQUIRE(entry.contains("values") && entry["values"].is_array() && !entry["values"].empty(),
                     where + ": buffer '" + arg.name + "' needs \"values\", a list of numbers, to be tuned with");
    std::vector<unsigned char> bytes;
    for (size_t k = 0; k < entry["values"].size(); ++k) {
      const Json& v = entry["values"][k];
      const std::string at = where + ": buffer '" + arg.name + "' value " + std::to_string(k);
      auto append = [&](auto value) {
        const auto* raw = reinterpret_cast<const unsigned char*>(&value);
        bytes.insert(bytes.end(), raw, raw + sizeof value);
      };
      switch (arg.type) {
        case UserArgType::kFloat32:
          FLASHGEN_REQUIRE(v.is_number(), at + " must be a number");
          append(v.get<float>());
          break;
        case UserArgType::kInt32:
          append(static_cast<int32_t>(integer_in(v, INT32_MIN, INT32_MAX, at)));
          break;
        case UserArgType::kInt64:
          append(integer_in(v, INT64_MIN, INT64_MAX, at));
          break;
        case UserArgType::kUint8:
          append(static_cast<uint8_t>(integer_in(v, 0, 255, at)));
          break;
      }
    }
    values.buffers.emplace_back(bytes.size());
    values.buffers.back().upload(bytes.data(), bytes.size());
    values.args.buffers.push_back(values.buffers.back().data());
  }
  for (size_t i = 0; i < user.scalars.size(); ++i) {
    const UserArg& arg = user.scalars[i];
    const Json& entry = j.at("scalars").at(i);
    FLASHGEN_REQUIRE(entry.contains("value") && entry["value"].is_number(),
                     where + ": scalar '" + arg.name + "' needs \"value\", a number, to be tuned with");
    uint32_t bits = 0;
    if (arg.type == UserArgType::kFloat32) {
      const float value = entry["value"].get<float>();
      std::memcpy(&bits, &value, sizeof bits);
    } else {
      const auto value = static_cast<int32_t>(
          integer_in(entry["value"], INT32_MIN, INT32_MAX, where + ": scalar '" + arg.name + "' value"));
      std::memcpy(&bits, &value, sizeof bits);
    }
    values.args.scalars.push_back(bits);
  }
  return values;
}

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
