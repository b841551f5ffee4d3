// Test runner entry point (Catch2 v2 or v3). Run with exactly the "[gpu]" filter and no usable driver,
// it runs nothing and exits with kSkipped, which ctest reports as a skipped test (SKIP_RETURN_CODE)
// rather than as GPU cases that passed without checking anything.
#define CATCH_CONFIG_RUNNER
#include <cstdio>
#include <string>

#include "catch.hpp"
#include "cuda_driver.hpp"

namespace {
constexpr int kSkipped = 77;
}

int main(int argc, char** argv) {
  std::string why;
  if (argc == 2 && std::string(argv[1]) == "[gpu]" && !flashgen::driver_available(&why)) {
    std::printf("[gpu] cases skipped: no GPU: %s\n", why.c_str());
    return kSkipped;
  }
  return Catch::Session().run(argc, argv);
}
