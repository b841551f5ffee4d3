// `flashgen emit`: prints the generated source of one kernel config (by name or as JSON), with a user-defined variant's
// functions compiled in when one is described, as a single self-contained CUDA translation unit, to stdout or a file.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/user_variant.hpp"
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
              "fwd_sm90), dtype, head_dim, head_dim_v, mask (none, causal, window or chunk), block_m, block_n, stages, the "
              "sm80 family's warps and q_in_regs, the sm90 family's overlap, pingpong, persistent, p_smem, cluster, "
              "groups, tensor_sum, value_split, and varlen, paged, softcap, alibi; omitted ones take the defaults, "
              "the other "
              "family's may appear at their defaults only")
      .option("variant", "FILE", kVariantHelp)
      .option("arch", "SM", "check the config is valid for sm_<SM> (default 90)")
      .option("output", "FILE", "write to FILE (replaced whole) instead of stdout; - is stdout", false, 'o');
}

namespace {

KernelConfig read_config_json(const std::string& path) {
  const Json j = read_json_file(path, "config JSON");
  try {
    return j.get<KernelConfig>();
  } catch (const Json::exception& error) {
    fail(Status::kInvalidArgument, "config JSON '" + path + "': " + error.what());
  }
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
  std::shared_ptr<const UserVariant> user = variant_of(args);
  AnyConfig config = from_json ? AnyConfig(read_config_json(args.string_or("config-json", "-")))
                               : config_from_name(args.positionals[0], user);
  if (from_json) attach_variant(config, std::move(user));
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
