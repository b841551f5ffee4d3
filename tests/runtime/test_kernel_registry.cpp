// Tests for runtime/kernel_registry (no GPU: NVRTC only): what kernel_cache_key depends on, a second
// registry reading a kernel from the disk cache, damaged or foreign payloads being rebuilt, and threads
// asking for one kernel at once.
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "generator/generator.hpp"
#include "generator/kernel_config.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "support/temp_dir.hpp"

namespace {

using flashgen::testing::TempDir;

namespace fs = std::filesystem;

using flashgen::CompiledKernel;
using flashgen::KernelConfig;
using flashgen::KernelRegistry;


constexpr int kArch = 80;

// Small kernels (head_dim 32, 64-row tiles) compile in a fraction of the default configs' time.
KernelConfig small_config(flashgen::MaskKind mask = flashgen::MaskKind::kNone) {
  KernelConfig config;
  config.dtype = flashgen::DType::kFloat16;
  config.head_dim = 32;
  config.mask = mask;
  config.block_m = 64;
  config.block_n = 32;
  config.sm80()->warps = 4;
  config.stages = 2;
  return config;
}

// A source in the generator's shape, written by hand so single bytes can be changed.
flashgen::GeneratedSource hand_source() {
  flashgen::GeneratedSource source;
  source.kernel_name = "fwd_sm80_fp16_d32_m64_n32_w4_s2";
  source.translation_unit = "#include \"fwd_config.cuh\"\n#include \"fwd_sm80.cuh\"\n";
  source.headers.push_back({"fwd_config.cuh", "constexpr int kHeadDim = 32;\n"});
  source.headers.push_back({"fwd_sm80.cuh", "template <class Config> __global__ void fwd() {}\n"});
  return source;
}

void check_same_kernel(const CompiledKernel& got, const CompiledKernel& want) {
  CHECK(got.kernel_name == want.kernel_name);
  CHECK(got.arch == want.arch);
  CHECK(got.cubin == want.cubin);
  CHECK(got.options == want.options);
  CHECK(got.log == want.log);
  CHECK(got.usage.registers == want.usage.registers);
  CHECK(got.usage.static_smem_bytes == want.usage.static_smem_bytes);
  CHECK(got.usage.spill_store_bytes == want.usage.spill_store_bytes);
}

}  // namespace

TEST_CASE("kernel_cache_key is deterministic and changes with every input", "[kernel_registry]") {
  const flashgen::GeneratedSource source = hand_source();
  const std::string key = flashgen::kernel_cache_key(source, kArch);
  CHECK(key == flashgen::kernel_cache_key(hand_source(), kArch));
  CHECK(key.rfind(source.kernel_name + "-sm80-", 0) == 0);

  // The arch, and with it the NVRTC options (-arch=sm_80 / sm_86 / sm_90a).
  REQUIRE(flashgen::nvrtc_options(80) != flashgen::nvrtc_options(86));
  CHECK(flashgen::kernel_cache_key(source, 86) != key);
  CHECK(flashgen::kernel_cache_key(source, 90) != key);
  CHECK(flashgen::kernel_cache_key(source, 90) != flashgen::kernel_cache_key(source, 86));

  // One byte of a template (the second header), of the config header, of the translation unit.
  flashgen::GeneratedSource edited = hand_source();
  edited.headers[1].contents[edited.headers[1].contents.size() - 2] = ' ';
  CHECK(flashgen::kernel_cache_key(edited, kArch) != key);
  edited = hand_source();
  edited.headers[0].contents[edited.headers[0].contents.find("32")] = '6';
  CHECK(flashgen::kernel_cache_key(edited, kArch) != key);
  edited = hand_source();
  edited.translation_unit += "\n";
  CHECK(flashgen::kernel_cache_key(edited, kArch) != key);
  // A header renamed, and a byte moved from a header's name into its contents.
  edited = hand_source();
  edited.headers[1].name = "fwd_sm90.cuh";
  CHECK(flashgen::kernel_cache_key(edited, kArch) != key);
  edited = hand_source();
  edited.headers[0].name = "fwd_config.cu";
  edited.headers[0].contents = "h" + edited.headers[0].contents;
  CHECK(flashgen::kernel_cache_key(edited, kArch) != key);

  // Generated sources of two configs differ, so their keys do.
  CHECK(flashgen::kernel_cache_key(flashgen::generate(small_config()), kArch) !=
        flashgen::kernel_cache_key(flashgen::generate(small_config(flashgen::MaskKind::kCausal)), kArch));
}

TEST_CASE("a second registry on the same directory reads the kernel from the disk cache", "[kernel_registry]") {
  TempDir temp{"flashgen-registry-test"};
  const KernelConfig config = small_config();
  REQUIRE_FALSE(config.invalid_reason(kArch).has_value());

  std::shared_ptr<const CompiledKernel> compiled;
  {
    KernelRegistry registry(temp.path());
    compiled = registry.compiled(config, kArch);
    CHECK_FALSE(compiled->from_cache);
    CHECK(compiled->compile_ms > 0);
    CHECK(compiled->kernel_name == config.name());
    CHECK(compiled->arch == kArch);
    CHECK_FALSE(compiled->cubin.empty());
    // Asked again, the same registry answers from memory with the same object.
    CHECK(registry.compiled(config, kArch) == compiled);
  }

  KernelRegistry second(temp.path());
  const std::shared_ptr<const CompiledKernel> cached = second.compiled(config, kArch);
  CHECK(cached->from_cache);
  CHECK(cached->compile_ms == 0);
  check_same_kernel(*cached, *compiled);
}

TEST_CASE("a cached payload that does not parse or names another kernel is rebuilt", "[kernel_registry]") {
  TempDir temp{"flashgen-registry-test"};
  const KernelConfig config = small_config();
  const std::string key = flashgen::kernel_cache_key(flashgen::generate(config), kArch);
  flashgen::KernelCache cache(temp.path());

  SECTION("bytes that are no payload") {
    cache.store(key, "not a flashgen payload");
  }
  SECTION("an empty payload") {
    cache.store(key, "");
  }
  SECTION("a valid payload of another kernel") {
    const KernelConfig other = small_config(flashgen::MaskKind::kCausal);
    KernelRegistry registry(temp.path());
    REQUIRE(registry.compiled(other, kArch)->kernel_name == other.name());
    const std::optional<std::string> other_payload =
        cache.load(flashgen::kernel_cache_key(flashgen::generate(other), kArch));
    REQUIRE(other_payload.has_value());
    cache.store(key, *other_payload);
  }
  // The entry itself is intact (checksum good): only the registry can tell the payload is wrong.
  REQUIRE(cache.load(key).has_value());

  KernelRegistry registry(temp.path());
  const std::shared_ptr<const CompiledKernel> rebuilt = registry.compiled(config, kArch);
  CHECK_FALSE(rebuilt->from_cache);
  CHECK(rebuilt->kernel_name == config.name());
  CHECK(rebuilt->arch == kArch);
  CHECK_FALSE(rebuilt->cubin.empty());

  // The rebuilt kernel replaced the bad entry: the next registry reads it back.
  KernelRegistry next(temp.path());
  const std::shared_ptr<const CompiledKernel> cached = next.compiled(config, kArch);
  CHECK(cached->from_cache);
  check_same_kernel(*cached, *rebuilt);
}

TEST_CASE("threads asking one registry for one kernel get one compiled object", "[kernel_registry]") {
  TempDir temp{"flashgen-registry-test"};
  const KernelConfig config = small_config();
  KernelRegistry registry(temp.path());
  constexpr int kThreads = 4;
  std::vector<std::shared_ptr<const CompiledKernel>> results(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        results[i] = registry.compiled(config, kArch);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  for (int i = 0; i < kThreads; ++i) {
    INFO("thread " << i << ": " << errors[i]);
    REQUIRE(results[i] != nullptr);
    // Whichever thread stored its copy first, every caller gets that one object.
    CHECK(results[i] == results[0]);
  }
  CHECK(registry.compiled(config, kArch) == results[0]);
}
