// Tests for runtime/nvrtc_compiler: ptxas log parsing on real log text, compiling a hand-written source
// with an in-memory header for sm_80 and sm_90a, and a compile error carrying its log and dump path.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace {

namespace fs = std::filesystem;

// Points $FLASHGEN_CACHE_DIR at a fresh directory under /tmp for the test; restores and removes it after.
class ScopedCacheDir {
 public:
  ScopedCacheDir() {
    char pattern[] = "/tmp/flashgen-nvrtc-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    REQUIRE(made != nullptr);
    path_ = made;
    if (const char* old = std::getenv("FLASHGEN_CACHE_DIR")) previous_ = old;
    ::setenv("FLASHGEN_CACHE_DIR", path_.c_str(), 1);
  }
  ~ScopedCacheDir() {
    if (previous_) {
      ::setenv("FLASHGEN_CACHE_DIR", previous_->c_str(), 1);
    } else {
      ::unsetenv("FLASHGEN_CACHE_DIR");
    }
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScopedCacheDir(const ScopedCacheDir&) = delete;
  ScopedCacheDir& operator=(const ScopedCacheDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  std::optional<std::string> previous_;
};

// A kernel in the shape the generator produces: extern "C", no toolkit headers, one project include.
flashgen::GeneratedSource tiny_source(const std::string& body_extra = "") {
  flashgen::GeneratedSource source;
  source.kernel_name = "flashgen_test_tiny_kernel";
  source.headers.push_back({"tiny_math.cuh",
                            "#pragma once\n"
                            "__device__ inline float tiny_scale(float x) { return x * 2.0f + 1.0f; }\n"});
  source.translation_unit =
      "#include \"tiny_math.cuh\"\n"
      "extern \"C\" __global__ void flashgen_test_tiny_kernel(const float* in, float* out, int n) {\n"
      "  __shared__ float tile[128];  // (blockDim.x,)\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  tile[threadIdx.x % 128] = i < n ? tiny_scale(in[i]) : 0.0f;\n"
      "  __syncthreads();\n"
      "  if (i < n) out[i] = tile[(threadIdx.x + 1) % 128];\n" +
      body_extra + "}\n";
  return source;
}

}  // namespace

TEST_CASE("parse_ptxas_log reads NVRTC 13 ptxas -v output", "[nvrtc]") {
  // Verbatim NVRTC 13.0 log: a kernel, a non-inlined helper and a second kernel.
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'tiny_kernel' for 'sm_80'\n"
      "ptxas info    : Function properties for tiny_kernel\n"
      "ptxas         .     320 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 24 registers, used 0 barriers, 256 bytes smem, 320 bytes cumulative stack size, "
      "364 bytes cmem[0]\n"
      "ptxas info    : Compile time = 19.697 ms\n"
      "ptxas info    : Function properties for _Z6helperPfi\n"
      "ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'other_kernel' for 'sm_80'\n"
      "ptxas info    : Function properties for other_kernel\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]\n";
  flashgen::ResourceUsage usage = flashgen::parse_ptxas_log(log);
  CHECK(usage.registers == 24);
  CHECK(usage.static_smem_bytes == 256);
  CHECK(usage.stack_bytes == 320);
  CHECK(usage.spill_store_bytes == 8);
  CHECK(usage.spill_load_bytes == 12);
}

TEST_CASE("parse_ptxas_log gives each entry function the notes ptxas printed about it", "[nvrtc]") {
  // NVRTC 13.0's log of a backward module whose dkdv kernel had its wgmma serialized (the notes come first), with a
  // warning that names no function, which belongs to every one.
  const std::string log =
      "ptxas info    : (C7519) warpgroup.arrive is injected in around line 2676 by compiler to allow use of "
      "registers in GMMA in function 'bwd_dkdv'\n"
      "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
      "program dependence on compiler-inserted WG.AR in divergent path in the function 'bwd_dkdv'\n"
      "ptxas warning : a warning about no function\n"
      "ptxas info    : 422 bytes gmem\n"
      "ptxas info    : Compiling entry function 'bwd_convert' for 'sm_90a'\n"
      "ptxas info    : Function properties for bwd_convert\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 32 registers, used 1 barriers\n"
      "ptxas info    : Compile time = 7.307 ms\n"
      "ptxas info    : Compiling entry function 'bwd_dkdv' for 'sm_90a'\n"
      "ptxas info    : Function properties for bwd_dkdv\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 16 barriers\n";
  const flashgen::ResourceUsage dkdv = flashgen::parse_ptxas_log(log, "bwd_dkdv");
  CHECK(dkdv.registers == 168);
  REQUIRE(dkdv.ptxas_notes.size() == 2);  // C7519 alone is printed for kernels that run as written too
  CHECK(dkdv.ptxas_notes[0].rfind("(C7520) Potential Performance Loss: wgmma.mma_async", 0) == 0);
  CHECK(dkdv.ptxas_notes[0].find("'bwd_dkdv'") != std::string::npos);
  CHECK(dkdv.ptxas_notes[1] == "a warning about no function");
  // The first entry function, asked for by no name, gets only the warning that names none.
  const flashgen::ResourceUsage first = flashgen::parse_ptxas_log(log);
  CHECK(first.registers == 32);
  CHECK(first.ptxas_notes == std::vector<std::string>{"a warning about no function"});
  // The module's: both.
  flashgen::CompiledKernel module;
  module.log = log;
  CHECK(module.ptxas_notes().size() == 2);
  CHECK(flashgen::parse_ptxas_log("ptxas info    : Used 8 registers\n").ptxas_notes.empty());
}

TEST_CASE("parse_ptxas_log reads the older ptxas formats", "[nvrtc]") {
  SECTION("no smem, barriers listed") {
    flashgen::ResourceUsage usage = flashgen::parse_ptxas_log(
        "ptxas info    : Function properties for fwd_sm80_fp16_d128_m128_n64_w4_s2\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cmem[0]\n");
    CHECK(usage.registers == 168);
    CHECK(usage.static_smem_bytes == 0);
    CHECK(usage.stack_bytes == 0);
  }
  SECTION("smem after cmem") {
    flashgen::ResourceUsage usage = flashgen::parse_ptxas_log(
        "ptxas info    : Function properties for fwd_sm80_fp16_d64_m64_n64_w4_s2\n"
        "    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 168 registers, 400 bytes cmem[0], 16 bytes smem\n");
    CHECK(usage.registers == 168);
    CHECK(usage.static_smem_bytes == 16);
    CHECK(usage.stack_bytes == 16);
    CHECK(usage.spill_store_bytes == 4);
    CHECK(usage.spill_load_bytes == 8);
  }
  SECTION("no ptxas lines at all") {
    flashgen::ResourceUsage usage = flashgen::parse_ptxas_log("");
    CHECK(usage.registers == -1);
    CHECK(usage.static_smem_bytes == 0);
  }
}

TEST_CASE("arch_flag and nvrtc_options", "[nvrtc]") {
  CHECK(flashgen::arch_flag(80) == "-arch=sm_80");
  CHECK(flashgen::arch_flag(89) == "-arch=sm_89");
  CHECK(flashgen::arch_flag(90) == "-arch=sm_90a");
  CHECK(flashgen::nvrtc_options(90).front() == "-arch=sm_90a");
  CHECK(flashgen::nvrtc_options(80) == flashgen::nvrtc_options(80));
  const std::string version = flashgen::nvrtc_version();
  CHECK(version.find('.') != std::string::npos);
}

TEST_CASE("FLASHGEN_NVRTC_LINEINFO adds -lineinfo to the options", "[nvrtc]") {
  std::optional<std::string> previous;
  if (const char* old = std::getenv("FLASHGEN_NVRTC_LINEINFO")) previous = old;
  auto has_lineinfo = [] {
    const std::vector<std::string> options = flashgen::nvrtc_options(90);
    return std::find(options.begin(), options.end(), "-lineinfo") != options.end();
  };
  ::unsetenv("FLASHGEN_NVRTC_LINEINFO");
  CHECK_FALSE(has_lineinfo());
  ::setenv("FLASHGEN_NVRTC_LINEINFO", "0", 1);
  CHECK_FALSE(has_lineinfo());
  ::setenv("FLASHGEN_NVRTC_LINEINFO", "1", 1);
  CHECK(has_lineinfo());  // the options are part of the kernel cache key (kernel_cache_key)
  if (previous) {
    ::setenv("FLASHGEN_NVRTC_LINEINFO", previous->c_str(), 1);
  } else {
    ::unsetenv("FLASHGEN_NVRTC_LINEINFO");
  }
}

TEST_CASE("compile_nvrtc builds a cubin with an in-memory header", "[nvrtc]") {
  const int arch = GENERATE(80, 90);
  INFO("arch " << arch);
  flashgen::CompiledKernel kernel = flashgen::compile_nvrtc(tiny_source(), arch);
  CHECK(kernel.kernel_name == "flashgen_test_tiny_kernel");
  CHECK(kernel.arch == arch);
  REQUIRE(kernel.cubin.size() > 4);
  CHECK(kernel.cubin.compare(0, 4, "\x7f" "ELF") == 0);
  INFO("log:\n" << kernel.log);
  CHECK(kernel.usage.registers > 0);
  CHECK(kernel.usage.static_smem_bytes == 128 * 4);
  CHECK(kernel.compile_ms > 0);
  CHECK_FALSE(kernel.from_cache);
  CHECK(kernel.log.find("flashgen_test_tiny_kernel") != std::string::npos);
  const std::string flag = arch == 90 ? "-arch=sm_90a" : "-arch=sm_80";
  CHECK(std::find(kernel.options.begin(), kernel.options.end(), flag) != kernel.options.end());
}

TEST_CASE("compile_nvrtc reports a syntax error with the log and the dumped source", "[nvrtc]") {
  ScopedCacheDir cache_dir;
  const fs::path dumped = cache_dir.path() / "failed" / "flashgen_test_tiny_kernel.cu";
  try {
    flashgen::compile_nvrtc(tiny_source("  this is not C++;\n"), 80);
    FAIL("compile_nvrtc accepted a syntax error");
  } catch (const flashgen::Error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(e.status() == flashgen::Status::kCompile);
    CHECK(message.find("flashgen_test_tiny_kernel") != std::string::npos);
    CHECK(message.find("-arch=sm_80") != std::string::npos);
    CHECK(message.find("error") != std::string::npos);
    CHECK(message.find(dumped.string()) != std::string::npos);
  }
  REQUIRE(fs::exists(dumped));
  CHECK(fs::file_size(dumped) > 0);
}
