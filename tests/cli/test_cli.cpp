// The flashgen command-line tool run as a process (FLASHGEN_CLI_PATH): help, exit codes, emit, compile
// --json and the JSON error object. CPU only; each run compiles into a fresh, temporary kernel cache.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/sass.hpp"
#include "support/cli_runner.hpp"
#include "support/temp_dir.hpp"

namespace {

using flashgen::testing::CliResult;
using flashgen::testing::TempDir;
using flashgen::testing::parse_json;
using flashgen::testing::run_cli;

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A valid config for every arch the CLI accepts (85 KiB of shared memory) that compiles in seconds.
const std::string kConfigName = "fwd_sm80_fp16_d64_m64_n64_w4_s2";


}  // namespace

TEST_CASE("cli: --help lists the commands and exits 0", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"--help"}, dir);
  CHECK(result.exit_code == 0);
  for (const char* command : {"info", "emit", "compile", "run", "demo"}) {
    INFO("command " << command << " in:\n" << result.out);
    CHECK(result.out.find("\n  " + std::string(command) + " ") != std::string::npos);
  }
}

TEST_CASE("cli: a usage error names the mistake and the command's synopsis, not every option", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"tune", "--max-candidates", "0"}, dir);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 2);
  CHECK(result.err.rfind("flashgen: error: --max-candidates", 0) == 0);
  CHECK(result.err.find("usage: flashgen tune ") != std::string::npos);
  CHECK(result.err.find("(flashgen tune --help lists every option)") != std::string::npos);
  CHECK(result.err.find("options:") == std::string::npos);
  // The help lists what a user may pass; what one flashgen process passes another (a --devices worker) it leaves out.
  const CliResult help = run_cli({"tune", "--help"}, dir);
  CHECK(help.out.find("--dry-run") != std::string::npos);
  CHECK(help.out.find("--worker") == std::string::npos);
  CHECK(help.out.find("--journal") == std::string::npos);
}

TEST_CASE("cli: an unknown command exits 2", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"frobnicate"}, dir);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("unknown command 'frobnicate'") != std::string::npos);
  CHECK(result.out.empty());
}

TEST_CASE("cli: emit prints the kernel's translation unit", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"emit", kConfigName}, dir);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK(result.out.find(kConfigName) != std::string::npos);
  CHECK(result.out.find("__global__") != std::string::npos);
}

TEST_CASE("cli: emit writes to -o - as to stdout and refuses directories as files", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult to_stdout = run_cli({"emit", kConfigName, "-o", "-"}, dir);
  CHECK(to_stdout.exit_code == 0);
  CHECK(to_stdout.out.find("__global__") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.path() / "-"));
  const CliResult into_directory = run_cli({"emit", kConfigName, "-o", dir.path().string()}, dir);
  CHECK(into_directory.exit_code == 2);
  CHECK(into_directory.err.find("is a directory") != std::string::npos);
  const CliResult from_directory = run_cli({"emit", "--config-json", dir.path().string()}, dir);
  CHECK(from_directory.exit_code == 2);
  CHECK(from_directory.err.find("config JSON '" + dir.path().string() + "' is a directory") != std::string::npos);
  const CliResult two_archs = run_cli({"emit", kConfigName, "--arch", "80,90"}, dir);
  CHECK(two_archs.exit_code == 2);

  // -o through a symbolic link replaces the file it points at, keeping the link and the file's mode.
  const fs::path real = dir.path() / "kernel.cu", link = dir.path() / "link.cu";
  std::ofstream(real) << "old";
  fs::permissions(real, fs::perms::owner_all | fs::perms::group_read);
  fs::create_symlink(real, link);
  REQUIRE(run_cli({"emit", kConfigName, "-o", link.string()}, dir).exit_code == 0);
  CHECK(fs::is_symlink(link));
  CHECK(fs::file_size(real) > 100);
  CHECK(fs::status(real).permissions() == (fs::perms::owner_all | fs::perms::group_read));
}

TEST_CASE("cli: emit compiles a user variant's functions in, named by its tag", "[cli][user_variant]") {
  const TempDir dir{"flashgen-cli-test"};
  const fs::path variant = dir.path() / "documents.json";
  std::ofstream(variant) << R"({"mask_mod": "return doc[q_idx] == doc[kv_idx];",
                                "buffers": [{"name": "doc", "type": "int32"}], "mask_same_for_heads": true})";
  const std::string module = "bwd_sm90_bf16_d128_m64_n128_s2_causal";
  const CliResult result = run_cli({"emit", module, "--variant", variant.string()}, dir);
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out.find("return doc[q_idx] == doc[kv_idx];") != std::string::npos);
  const size_t tag_at = result.out.find(module + "_u");
  REQUIRE(tag_at != std::string::npos);
  const std::string tagged = result.out.substr(tag_at, module.size() + 14);
  CHECK(result.out.find(tagged + "_user_bands(") != std::string::npos);  // the backward's block classes
  // The tagged name with its description gives the same source; with another description, or none, it is refused.
  CHECK(run_cli({"emit", tagged, "--variant", variant.string()}, dir).out == result.out);
  const CliResult other = run_cli({"emit", module + "_u0123456789ab", "--variant", variant.string()}, dir);
  CHECK(other.exit_code == 2);
  CHECK(other.err.find("names the user variant u0123456789ab, but --variant describes") != std::string::npos);
  const CliResult untold = run_cli({"emit", tagged}, dir);
  CHECK(untold.exit_code == 2);
  CHECK(untold.err.find("give its description with --variant FILE") != std::string::npos);
  std::ofstream(variant) << R"({"mask_mod": "return true;", "buffers": [{"name": "doc", "type": "half"}]})";
  const CliResult bad = run_cli({"emit", module, "--variant", variant.string()}, dir);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("'buffers' type 'half' is not float32, int32, int64 or uint8") != std::string::npos);
  std::ofstream(variant) << R"({"score_mod": "return score * 0.5f;"})";  // no score_grad: forward modules only
  CHECK(run_cli({"emit", "fwd_sm80_fp16_d128_m128_n64_w4_s2_causal", "--variant", variant.string()}, dir).exit_code == 0);
  const CliResult no_grad = run_cli({"emit", module, "--variant", variant.string()}, dir);
  CHECK(no_grad.exit_code == 2);
  CHECK(no_grad.err.find("has a score_mod but no score_grad") != std::string::npos);
  const CliResult two_stdin = run_cli({"emit", "--config-json", "-", "--variant", "-"}, dir);
  CHECK(two_stdin.exit_code == 2);
  CHECK(two_stdin.err.find("cannot both read standard input") != std::string::npos);
  // Functions that do not compile are reported now, with NVRTC's messages at their own lines, not by a later nvcc.
  std::ofstream(variant) << R"({"mask_mod": "return doc[q_idx] == ;", "buffers": [{"name": "doc", "type": "int32"}]})";
  const fs::path out = dir.path() / "out.cu";
  const CliResult broken = run_cli({"emit", module, "--variant", variant.string(), "-o", out.string()}, dir);
  CHECK(broken.exit_code == 1);
  CHECK(broken.err.find("mask_mod(1): error") != std::string::npos);
  CHECK(!fs::exists(out));
}

TEST_CASE("cli: compile --variant reports the registers of a user variant's kernel", "[cli][nvrtc][user_variant]") {
  const TempDir dir{"flashgen-cli-test"};
  const fs::path variant = dir.path() / "bias.json";
  std::ofstream(variant) << R"({"score_bias": "return slope * (kv_idx - q_idx);",
                                "scalars": [{"name": "slope", "type": "float32"}]})";
  const CliResult result = run_cli({"compile", kConfigName, "--arch", "80", "--variant", variant.string(), "--json"},
                                   dir);
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  const Json j = parse_json(result);
  REQUIRE(j.size() == 1);
  CHECK(j[0]["config"].get<std::string>().rfind(kConfigName + "_u", 0) == 0);
  CHECK(j[0]["registers"].get<int>() > 0);
  // Without the description a tagged name is refused; a config that cannot run on a named arch is a bad request.
  const CliResult untold = run_cli({"compile", j[0]["config"].get<std::string>()}, dir);
  CHECK(untold.exit_code == 2);
  CHECK(untold.err.find("give its description with --variant FILE") != std::string::npos);
  const CliResult wrong_arch = run_cli({"compile", "fwd_sm90_fp16_d64_m128_n64_s2_ovl", "--arch", "80"}, dir);
  CHECK(wrong_arch.exit_code == 2);
  CHECK(wrong_arch.err.find("is invalid for sm_80") != std::string::npos);
}

TEST_CASE("cli: emit of an invalid config exits 2 with the reason", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"emit", "fwd_sm80_fp16_d128_m128_n24_w4_s3"}, dir);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("block_n must be a multiple of 16") != std::string::npos);
  CHECK(result.out.empty());
}

TEST_CASE("cli: --arch takes every target NVRTC lists and nothing below sm_80", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const Json info = parse_json(run_cli({"info", "--json"}, dir));
  if (info["nvrtc_archs"].is_array()) {
    CHECK_FALSE(info["nvrtc_archs"].empty());
    for (const Json& arch : info["nvrtc_archs"]) {
      INFO("emit --arch " << arch);
      CHECK(arch.get<int>() >= 80);
      CHECK(run_cli({"emit", kConfigName, "--arch", std::to_string(arch.get<int>())}, dir).exit_code == 0);
    }
  }
  const CliResult old_arch = run_cli({"emit", kConfigName, "--arch", "75"}, dir);
  CHECK(old_arch.exit_code == 2);
  CHECK(old_arch.err.find("got 75") != std::string::npos);
}

TEST_CASE("cli: compile --json reports registers, no spills and no ptxas notes", "[cli][nvrtc]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"compile", kConfigName, "--arch", "80", "--json"}, dir);
  CHECK(result.exit_code == 0);
  const Json j = parse_json(result);
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 1);
  const Json& entry = j[0];
  INFO(entry.dump(2));
  CHECK(entry["config"] == kConfigName);
  CHECK(entry["arch"] == 80);
  CHECK(entry["ok"] == true);
  CHECK(entry["registers"].get<int>() > 0);
  CHECK(entry["spill_store_bytes"] == 0);
  CHECK(entry["spill_load_bytes"] == 0);
  CHECK(entry["ptxas_notes"] == Json::array());  // no ptxas warning or performance loss
  CHECK(entry["cached"] == false);
}

TEST_CASE("cli: emit prints a backward module's source too", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"emit", "bwd_sm90_bf16_d128_m64_n128_s2_causal"}, dir);
  CHECK(result.exit_code == 0);
  CHECK(result.out.find("bwd_sm90_bf16_d128_m64_n128_s2_causal") != std::string::npos);
  CHECK(result.out.find("BwdDkdvSm90") != std::string::npos);
}

TEST_CASE("cli: emit prints a KV-cache module's source, its three kernels", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  const std::string name = "dec_sm80_bf16_d128_r16_n64_w4_s3_causal_paged";
  const CliResult result = run_cli({"emit", name, "--arch", "80"}, dir);
  CHECK(result.exit_code == 0);
  for (const char* kernel : {"_append(", "_attend(", "_combine("}) CHECK(result.out.find(name + kernel) != std::string::npos);
  const CliResult bad = run_cli({"emit", "dec_sm80_bf16_d128_r48_n64_w4_s3"}, dir);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("rows must be 16, 32 or 64") != std::string::npos);
}

TEST_CASE("cli: compile without --arch takes a Hopper-family config to sm_90a only", "[cli][nvrtc]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"compile", "fwd_sm90_fp16_d64_m128_n64_s2_ovl", "--json"}, dir);
  CHECK(result.exit_code == 0);
  const Json j = parse_json(result);
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 1);
  CHECK(j[0]["arch"] == 90);
  CHECK(j[0]["ok"] == true);
}

TEST_CASE("cli: compile --cubin-dir writes each kernel's cubin", "[cli][nvrtc]") {
  const TempDir dir{"flashgen-cli-test"};
  const fs::path cubins = dir.path() / "cubins" / "nested";  // created by the CLI
  const CliResult result = run_cli({"compile", kConfigName, "--arch", "80", "--json", "--cubin-dir", cubins.string()}, dir);
  CHECK(result.exit_code == 0);
  const Json j = parse_json(result);
  REQUIRE(j.size() == 1);
  const fs::path expected = cubins / (kConfigName + ".sm_80.cubin");
  CHECK(j[0]["cubin_path"] == expected.string());
  REQUIRE(fs::exists(expected));
  std::ifstream in(expected, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  CHECK(bytes.size() > 1000);
  CHECK(bytes.compare(0, 4, "\x7f" "ELF") == 0);  // a cubin is an ELF image
  CHECK(result.err.find("wrote " + expected.string()) != std::string::npos);
}

TEST_CASE("cli: compile --sass prints the SASS, or says why it cannot", "[cli][nvrtc][sass]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult result = run_cli({"compile", kConfigName, "--arch", "80", "--sass"}, dir);
  INFO(result.err);
  if (flashgen::find_cuobjdump().empty()) {
    // Refused before compiling anything, with where it looked and what to do instead.
    CHECK(result.exit_code == 2);  // unsupported here
    CHECK(result.err.find("no cuobjdump") != std::string::npos);
    CHECK(result.err.find("--cubin-dir") != std::string::npos);
    CHECK(result.err.find("compiling") == std::string::npos);
  } else {
    CHECK(result.exit_code == 0);
    const size_t header = result.out.find("// SASS of " + kConfigName + " for sm_80");
    REQUIRE(header != std::string::npos);
    CHECK(flashgen::sass_opcode_count(result.out.substr(header), "HMMA") > 0);  // the sm80 family's mma.sync
  }
}

TEST_CASE("cli: output that cannot be written fails the command", "[cli]") {
  if (!fs::exists("/dev/full")) {
    WARN("skipped: no /dev/full");
    return;
  }
  const std::string command = std::string(FLASHGEN_CLI_PATH) + " emit " + kConfigName + " > /dev/full 2>/dev/null";
  const int status = std::system(command.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  // So does -o naming it: a write that fails on the way is a failure (1), a path that cannot be written a bad
  // argument (2).
  const TempDir dir{"flashgen-cli-test"};
  const CliResult full = run_cli({"emit", kConfigName, "-o", "/dev/full"}, dir);
  CHECK(full.exit_code == 1);
  CHECK(full.err.find("cannot write '/dev/full'") != std::string::npos);
  const CliResult nowhere = run_cli({"emit", kConfigName, "-o", (dir.path() / "no" / "such.cu").string()}, dir);
  CHECK(nowhere.exit_code == 2);
}

TEST_CASE("cli: failures under --json print one JSON error object", "[cli]") {
  const TempDir dir{"flashgen-cli-test"};
  SECTION("a usage error exits 2 with status invalid_argument") {
    const CliResult result = run_cli({"compile", "--json"}, dir);
    CHECK(result.exit_code == 2);
    const Json j = parse_json(result);
    REQUIRE(j.is_object());
    CHECK(j["status"] == "invalid_argument");
    CHECK(j["error"].get<std::string>().find("nothing to compile") != std::string::npos);
  }
  SECTION("run without a GPU exits 3 with status no_device") {
    std::string why;
    if (flashgen::driver_available(&why)) {
      WARN("skipped: a CUDA driver is present (the [gpu] tests cover run)");
      return;
    }
    const CliResult result = run_cli({"run", "--json"}, dir);
    CHECK(result.exit_code == 3);
    const Json j = parse_json(result);
    REQUIRE(j.is_object());
    CHECK(j["status"] == "no_device");
    CHECK(j["error"].is_string());
  }
  SECTION("run refuses a problem whose host tensors exceed the machine's memory, before looking for a GPU") {
    const CliResult result = run_cli({"run", "--json", "--batch", "1024", "--seqlen-q", "1048576", "--seqlen-k",
                                      "1048576", "--heads-q", "64", "--heads-kv", "64"},
                                     dir);
    CHECK(result.exit_code == 2);
    const Json j = parse_json(result);
    REQUIRE(j.is_object());
    CHECK(j["status"] == "invalid_argument");
    CHECK(j["error"].get<std::string>().find("host tensors need") != std::string::npos);
  }
  SECTION("run refuses a bad problem or config name before looking for a GPU") {
    for (const std::vector<std::string>& words :
         {std::vector<std::string>{"run", "--head-dim", "100"}, {"run", "--heads-kv", "5"}, {"run", "--config", "x"},
          {"run", "--backward", "--config", "fwd_sm90_fp16_d128_m128_n128_s2"},
          // valid configs, but not of the problem (head_dim 64 for the default 128; causal for no mask)
          {"run", "--config", "fwd_sm80_fp16_d64_m128_n64_w8_s2"},
          {"run", "--backward", "--config", "bwd_sm80_fp16_d128_m64_n64_w4_s2_x1_causal"},
          // a config no GPU can run (more shared memory than sm_90 has)
          {"run", "--config", "fwd_sm90_fp16_d128_m128_n192_s4"},
          // KV-cache runs: options of their own, the library's checks of the cache, decode configs
          {"run", "--page-size", "16"}, {"run", "--kv-cache", "--page-size", "40"},
          {"run", "--kv-cache", "--backward"}, {"run", "--kv-cache", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2"},
          {"run", "--kv-cache", "--page-size", "16", "--config", "dec_sm80_fp16_d128_r16_n64_w4_s3"},
          {"run", "--kv-cache", "--splits", "500"},
          // packed runs: their totals, and configs of the packed kernels only
          {"run", "--total-q", "100"}, {"run", "--varlen", "--kv-cache"}, {"run", "--varlen", "--layout", "bhsd"},
          {"run", "--varlen", "--batch", "2", "--seqlen-q", "100", "--total-q", "201"},
          {"run", "--varlen", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2"},
          {"run", "--varlen", "--backward", "--config", "bwd_sm80_fp16_d128_m64_n64_w4_s2_x1"},
          {"run", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2_varlen"},
          // prefill against a paged cache: the forward only, pages of 16-key multiples, paged packed configs
          {"run", "--varlen", "--page-size", "16", "--backward"}, {"run", "--varlen", "--page-size", "24"},
          {"run", "--varlen", "--page-size", "16", "--config", "fwd_sm90_fp16_d128_m128_n128_s2_varlen"},
          {"run", "--varlen", "--config", "fwd_sm90_fp16_d128_m128_n128_s2_varlen_paged"}}) {
      const CliResult result = run_cli(words, dir);
      INFO(words.back() << ": " << result.err);
      CHECK(result.exit_code == 2);
      CHECK(result.err.find("needs a GPU") == std::string::npos);
    }
    // The library's checks name its arguments; the refusal leads with the flag that set the first of them.
    for (const auto& [words, message] :
         {std::pair<std::vector<std::string>, std::string>{{"run", "--head-dim", "100"},
                                                           "--head-dim: q.shape[3] (head_dim) = 100 is unsupported"},
          {{"run", "--heads-q", "3", "--heads-kv", "2"}, "--heads-q: q.shape[2] (heads) = 3 must be a multiple of"},
          {{"run", "--softcap", "-5"}, "--softcap: opts.softcap must be"},
          {{"run", "--varlen", "--page-size", "40"}, "--page-size: k.shape[1] (page_size) must be a multiple of 16"},
          {{"run", "--varlen", "--page-size", "16", "--config", "fwd_sm90_fp16_d128_m128_n128_s2_varlen"},
           "with --page-size the packed batch takes a ..._varlen_paged one"},
          // Values of a head dim of their own: forward and backward, a dim some family takes, not a KV-cache call's.
          {{"run", "--head-dim", "192", "--head-dim-v", "100"},
           "--head-dim-v: v.shape[3] (head_dim) = 100 is unsupported"},
          {{"run", "--head-dim", "192", "--head-dim-v", "100", "--backward"},
           "--head-dim-v: v.shape[3] (head_dim) = 100 is unsupported"},
          {{"run", "--head-dim", "192", "--head-dim-v", "128", "--backward", "--config", "bwd_sm90_fp16_d192_m64_n64_s2"},
           "config bwd_sm90_fp16_d192_m64_n64_s2 has values of head dim 192, the call's have 128"},
          // A latent cache (--kv-cache with --head-dim-v): the values are the keys' first columns, of dims the
          // latent kernel takes.
          {{"run", "--head-dim", "192", "--head-dim-v", "64", "--kv-cache"},
           "--head-dim-v: v_cache.shape[3] (head_dim) = 64 is unsupported for a latent cache"},
          {{"run", "--head-dim", "600", "--head-dim-v", "512", "--kv-cache"},
           "--head-dim: k_cache.shape[3] (head_dim) = 600 is unsupported for a latent cache"},
          {{"run", "--head-dim", "576", "--head-dim-v", "512", "--kv-cache", "--page-size", "40"},
           "--page-size: k_cache.shape[1] (page_size) must be a multiple of 16"},
          // An FP8 cache: a KV cache's, of head dims its fragments serve, in 16 bits only when latent.
          {{"run", "--cache-dtype", "e4m3"}, "--cache-dtype needs --kv-cache"},
          {{"run", "--kv-cache", "--cache-dtype", "e4m3", "--head-dim", "80"},
           "k_cache.shape[3] (head_dim) = 80 is unsupported for an FP8 cache"},
          {{"run", "--kv-cache", "--cache-dtype", "e4m3", "--head-dim", "576", "--head-dim-v", "512"},
           "a latent cache (values of a head dim of their own) is read in 16 bits only"},
          {{"run", "--kv-cache", "--cache-dtype", "e5m2", "--config", "dec_sm80_fp16_d128_r16_n64_w4_s3"},
           "reads a cache of fp16, the call's holds e5m2"},
          {{"run", "--head-dim", "192", "--head-dim-v", "128", "--config", "fwd_sm90_fp16_d192_m128_n112_s2_ovl_pp"},
           "config fwd_sm90_fp16_d192_m128_n112_s2_ovl_pp has values of head dim 192, the call's have 128"}}) {
      const CliResult result = run_cli(words, dir);
      INFO(result.err);
      CHECK(result.exit_code == 2);
      CHECK(result.err.find(message) != std::string::npos);
    }
    // DeepSeek's decode over a paged latent cache passes every check and gets as far as the GPU.
    if (!flashgen::driver_available()) {
      const CliResult latent = run_cli({"run", "--kv-cache", "--head-dim", "576", "--head-dim-v", "512", "--heads-q",
                                        "128", "--heads-kv", "1", "--page-size", "64", "--causal", "bottom-right",
                                        "--dtype", "bf16"},
                                       dir);
      INFO(latent.err);
      CHECK(latent.exit_code == 3);
    }
  }
  SECTION("run reads --window as FlashAttention's window_size and checks it before looking for a GPU") {
    const struct {
      std::vector<std::string> words;
      const char* message;
    } refused[] = {
        {{"run", "--window", "128"}, "--window expects L,R"},
        {{"run", "--window", "-2,0"}, "--window must be in [-1, "},
        {{"run", "--window", "4,x"}, "--window expects an integer, got 'x'"},
        {{"run", "--window", "64,0", "--causal", "top-left"}, "--window is aligned bottom-right"},
        {{"run", "--kv-cache", "--window", "64,0", "--config", "dec_sm80_fp16_d128_r16_n64_w4_s3_causal"},
         "does not match the problem"},
        // A window config for a problem that normalizes to the causal mask ((-1, 0)), and the converse.
        {{"run", "--window", "-1,0", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2_window"},
         "does not match the problem"},
        {{"run", "--window", "64,0", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2_causal"},
         "does not match the problem"},
    };
    for (const auto& [words, message] : refused) {
      const CliResult result = run_cli(words, dir);
      INFO(words[2] << ": " << result.err);
      CHECK(result.exit_code == 2);
      CHECK(result.err.find(message) != std::string::npos);
    }
    const CliResult help = run_cli({"run", "--help"}, dir);
    CHECK(help.out.find("--window L,R") != std::string::npos);
    // Valid windows pass every check and get as far as the GPU.
    if (!flashgen::driver_available()) {
      for (const std::vector<std::string>& words :
           {std::vector<std::string>{"run", "--window", "64,16", "--config",
                                     "fwd_sm80_fp16_d128_m128_n64_w4_s2_window"},
            {"run", "--window", "64,-1", "--causal", "bottom-right", "--backward"},
            {"run", "--window", "-1,-1", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2"},
            {"run", "--varlen", "--window", "100,0"}, {"run", "--kv-cache", "--window", "64,0"},
            {"run", "--kv-cache", "--window", "64,8", "--page-size", "16", "--config",
             "dec_sm80_fp16_d128_r16_n64_w4_s3_window_paged"}}) {
        const CliResult result = run_cli(words, dir);
        INFO(words[2] << ": " << result.err);
        CHECK(result.exit_code == 3);
      }
    }
  }
  SECTION("text that is not UTF-8 comes back replaced, inside valid JSON") {
    const CliResult result = run_cli({"run", "--json", "--config", "fwd\xff"}, dir);
    CHECK(result.exit_code == 2);
    const Json j = parse_json(result);
    REQUIRE(j.is_object());
    CHECK(j["error"].get<std::string>().find("fwd\xef\xbf\xbd") != std::string::npos);  // U+FFFD
  }
  SECTION("tune refuses the sizes run refuses, dry run included") {
    const CliResult result = run_cli({"tune", "--dry-run", "--batch", "100000"}, dir);
    CHECK(result.exit_code == 2);
    CHECK(result.err.find("batch") != std::string::npos);
  }
  SECTION("run takes sizes up to the library's 2^30 only") {
    const CliResult result = run_cli({"run", "--seqlen-q", "2000000000"}, dir);
    CHECK(result.exit_code == 2);
    CHECK(result.err.find("seqlen-q") != std::string::npos);
  }
}

TEST_CASE("cli: run --dtype e4m3|e5m2 serves the dense FP8 forward and refuses the rest by flag", "[cli][fp8]") {
  const TempDir dir{"flashgen-cli-test"};
  const CliResult help = run_cli({"run", "--help"}, dir);
  CHECK(help.out.find("e4m3 or e5m2, the FP8 forward") != std::string::npos);
  CHECK(help.out.find("--out-dtype T") != std::string::npos);
  CHECK(help.out.find("FlashAttention-3's rule") != std::string::npos);

  const struct {
    std::vector<std::string> words;
    const char* message;
  } refused[] = {
      {{"run", "--dtype", "e4m3", "--backward"}, "--dtype e4m3 runs the FP8 forward only: no --backward"},
      {{"run", "--dtype", "e5m2", "--varlen"}, "--dtype e5m2 runs the FP8 forward of dense batches: no --varlen"},
      {{"run", "--dtype", "e4m3", "--kv-cache"}, "--dtype e4m3 with --kv-cache: a KV-cache call's queries are fp16"},
      {{"run", "--dtype", "e4m3", "--kv-cache", "--cache-dtype", "e4m3"}, "--dtype e4m3 with --kv-cache"},
      {{"run", "--dtype", "e4m3", "--cache-dtype", "e4m3"}, "--cache-dtype needs --kv-cache"},
      {{"run", "--dtype", "fp8"}, "--dtype expects one of fp16|bf16|e4m3|e5m2, got 'fp8'"},
      {{"run", "--out-dtype", "fp16"}, "--out-dtype needs --dtype e4m3 or e5m2"},
      {{"run", "--dtype", "bf16", "--out-dtype", "bf16"}, "--out-dtype needs --dtype e4m3 or e5m2"},
      {{"run", "--dtype", "e4m3", "--out-dtype", "e4m3"}, "--out-dtype expects one of bf16|fp16, got 'e4m3'"},
      {{"run", "--dtype", "e4m3", "--head-dim", "192", "--head-dim-v", "128"},
       "--head-dim-v: the FP8 forward takes values of the queries' head dim"},
      // The library's own checks, led by the flag.
      {{"run", "--dtype", "e4m3", "--head-dim", "72"}, "--head-dim: q.shape[3] (head_dim) is 72: the FP8 forward takes"},
      {{"run", "--dtype", "e4m3", "--head-dim", "512"}, "the FP8 forward takes multiples of 16 up to 256"},
      // Configs: of the format, the output type and the mask; a 16-bit config is not an FP8 problem's, nor the reverse.
      {{"run", "--dtype", "e4m3", "--out-dtype", "fp16", "--causal", "bottom-right", "--config",
        "fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_pst"},
       "writes an output of bf16, the call's is fp16"},
      {{"run", "--dtype", "e4m3", "--config", "fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_pst"},
       "does not match the problem"},
      {{"run", "--dtype", "e5m2", "--causal", "bottom-right", "--config",
        "fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_pst"},
       "does not match the problem"},
      {{"run", "--dtype", "e4m3", "--config", "fwd_sm80_fp16_d128_m128_n64_w4_s2"}, "does not match the problem"},
      {{"run", "--dtype", "bf16", "--causal", "bottom-right", "--config",
        "fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_pst"},
       "does not match the problem"},
  };
  for (const auto& [words, message] : refused) {
    const CliResult result = run_cli(words, dir);
    INFO(words[2] << " ...: " << result.err);
    CHECK(result.exit_code == 2);
    CHECK(result.err.find(message) != std::string::npos);
  }
  // Valid FP8 runs pass every check and get as far as the GPU.
  if (!flashgen::driver_available()) {
    for (const std::vector<std::string>& words :
         {std::vector<std::string>{"run", "--dtype", "e4m3"},
          {"run", "--dtype", "e5m2", "--out-dtype", "fp16", "--heads-q", "32", "--heads-kv", "8", "--head-dim", "64"},
          {"run", "--dtype", "e4m3", "--causal", "bottom-right", "--config",
           "fwd_sm90_e4m3_d128_m128_n128_s2_obf16_causal_ovl_pp_pst"},
          {"run", "--dtype", "e4m3", "--layout", "bhsd", "--head-dim", "256", "--window", "128,0", "--softcap", "30",
           "--sink", "1"},
          {"run", "--dtype", "e4m3", "--json"}}) {
      const CliResult result = run_cli(words, dir);
      INFO(words[2] << " ...: " << result.err);
      CHECK(result.exit_code == 3);
      CHECK(result.err.find("needs a GPU") != std::string::npos);
    }
  }
}
