// `flashgen emit`'s output: the self-contained translation unit compiles unchanged with nvcc.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <unistd.h>

#include "catch.hpp"
#include "generator/generator.hpp"

using flashgen::DType;
using flashgen::MaskKind;

TEST_CASE("emitted source compiles unchanged with nvcc for sm_90a", "[generator][emit]") {
  flashgen::KernelConfig c;
  c.dtype = DType::kBFloat16;
  c.mask = MaskKind::kCausal;
  const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  const std::string cu = dir + "/flashgen_emit_test_" + std::to_string(::getpid()) + ".cu";
  std::ofstream(cu) << flashgen::generate(c).self_contained();
  const std::string command = std::string(FLASHGEN_NVCC_PATH) +
                              " -gencode=arch=compute_90a,code=sm_90a -c " + cu + " -o " + cu + ".o 2>&1";
  const int status = std::system(command.c_str());
  CHECK(status == 0);
  std::remove(cu.c_str());
  std::remove((cu + ".o").c_str());
}
