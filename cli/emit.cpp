// `flashgen emit`: prints the generated source of one kernel config (by name or as JSON), with a user-defined variant's
// functions compiled in when one is described, as a single self-contained CUDA translation unit, to stdout or a file.
#include <algorithm>
#include <deque>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "flashgen/error.hpp"
#include "generator/bwd_config.hpp"
#include "generator/generator.hpp"
#include "generator/kernel_config.hpp"
#include "problem/user_variant.hpp"

namespace flashgen::cli {

Command emit_command() {
  return Command("emit",
                 "Prints the generated kernel as one self-contained CUDA translation unit; nvcc compiles it\n"
                 "unchanged: nvcc -gencode=arch=compute_90a,code=sm_90a -c <file>.cu",
                 "<config-name> [--variant FILE] [--arch SM] [-o FILE] | --config-json FILE|- [--variant FILE] "
                 "[--arch SM] [-o FILE]",
                 1,
                 "<config-name>: a canonical config name, e.g. fwd_sm80_fp16_d128_m128_n32_w4_s3, a backward\n"
                 "module's, e.g. bwd_sm90_bf16_d128_m64_n128_s2_causal, or a KV-cache (decode) module's, e.g.\n"
                 "dec_sm80_bf16_d128_r16_n64_w4_s3_causal_paged\n" + arch_help())
      .option("config-json", "FILE",
              "read a forward config as JSON from FILE ('-' for stdin) instead of a name; fields: family (fwd_sm80 or "
              "fwd_sm90), dtype, head_dim, mask (none or causal), block_m, block_n, stages, the sm80 family's warps "
              "and q_in_regs, the sm90 family's overlap, pingpong, persistent, p_smem, cluster, groups, tensor_sum; "
              "omitted ones take the defaults, the other family's may appear at their defaults only")
      .option("variant", "FILE",
              "compile a user-defined variant in (flashgen_variant_desc as JSON, '-' for stdin): mask_mod, score_mod, "
              "score_grad, score_bias and helpers as strings of C++, buffers and scalars as lists of {\"name\", "
              "\"type\"} (float32, int32, int64 or uint8; scalars float32 or int32), mask_same_for_heads; the config "
              "name may end with the variant's tag (_u<12 hex digits>), which must then be this description's")
      .option("arch", "SM", "check the config is valid for sm_<SM> (default 90)")
      .option("output", "FILE", "write to FILE (replaced whole) instead of stdout; - is stdout", false, 'o');
}

namespace {

std::string read_text(const std::string& path, const char* what) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in = open_input(path, what);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

KernelConfig read_config_json(const std::string& path) {
  const std::string text = read_text(path, "config JSON");
  try {
    return Json::parse(text).get<KernelConfig>();
  } catch (const Json::exception& error) {
    fail(Status::kInvalidArgument, "config JSON '" + path + "': " + error.what());
  }
}

// A user variant from its description as JSON (flashgen_variant_desc's fields by name), checked as
// flashgen_variant_create checks it.
std::shared_ptr<const UserVariant> read_variant_json(const std::string& path) {
  const std::string where = "variant JSON '" + path + "'";
  Json j;
  try {
    j = Json::parse(read_text(path, "variant JSON"));
  } catch (const Json::exception& error) {
    fail(Status::kInvalidArgument, where + ": " + error.what());
  }
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
    return make_user_variant(desc);
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

}  // namespace

int command_emit(const Args& args) {
  const bool from_json = args.has("config-json");
  if (from_json == !args.positionals.empty())
    throw UsageError("emit takes either a config name or --config-json, exactly one of them", args.usage());
  if (from_json && args.has("variant") && args.string_or("config-json", "-") == "-" &&
      args.string_or("variant", "-") == "-") {
    throw UsageError("--config-json and --variant cannot both read standard input", args.usage());
  }
  std::string given = from_json ? std::string() : args.positionals[0];
  const std::optional<std::string> tag = cut_variant_tag(given);
  AnyConfig config = from_json ? AnyConfig(read_config_json(args.string_or("config-json", "-"))) : config_from_name(given);
  if (args.has("variant")) {
    std::shared_ptr<const UserVariant> user = read_variant_json(args.string_or("variant", "-"));
    if (std::holds_alternative<BwdConfig>(config) && !user->has_gradient()) {
      fail(Status::kInvalidArgument, "--variant " + user->tag + " has a score_mod but no score_grad: a backward module "
                                     "needs the derivative");
    }
    if (tag && *tag != user->tag) {
      fail(Status::kInvalidArgument, "config " + args.positionals[0] + " names the user variant " + *tag +
                                         ", but --variant describes " + user->tag);
    }
    std::visit([&](auto& c) { c.user = std::move(user); }, config);
  } else if (tag) {
    fail(Status::kInvalidArgument, "config " + args.positionals[0] + " names the user variant " + *tag +
                                       ": give its description with --variant FILE");
  }
  const std::vector<int> archs = parse_archs(args, {90});
  if (archs.size() != 1) throw UsageError("emit writes the source of one --arch", args.usage());
  const int arch = archs.front();
  const std::string name = std::visit([](const auto& c) { return c.name(); }, config);
  if (std::optional<std::string> why = std::visit([&](const auto& c) { return c.invalid_reason(arch); }, config))
    fail(Status::kInvalidArgument, "config " + name + " is invalid for sm_" + std::to_string(arch) + ": " + *why);

  const std::string source = std::visit([](const auto& c) { return generate(c).self_contained(); }, config);
  if (!args.has("output")) {
    std::cout << source;
    return 0;
  }
  const std::string path = args.string_or("output", "");
  write_file(path, source);
  std::cerr << "wrote " << name << " (" << source.size() << " bytes) to " << path << '\n';
  return 0;
}

}  // namespace flashgen::cli
