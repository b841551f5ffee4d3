// [gpu] test support: skip cleanly when no CUDA driver or device is present, or when a case needs sm_90.
#pragma once

#include <string>
#include <vector>

#include "catch.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen::test_support {
// "case: reason" of each case this run skipped. Catch2 v2 has no skip (a case that returns early passes), so the
// runner prints these after the run (tests/main.cpp); Catch2 v3 reports its SKIPs itself.
inline std::vector<std::string>& skipped_cases() {
  static std::vector<std::string> cases;
  return cases;
}
}  // namespace flashgen::test_support

#ifdef FLASHGEN_CATCH3
#define FLASHGEN_SKIP_TEST(why) SKIP(why)
#else
#define FLASHGEN_SKIP_TEST(why)                                                                             \
  do {                                                                                                      \
    ::flashgen::test_support::skipped_cases().push_back(Catch::getResultCapture().getCurrentTestName() + \
                                                        ": " + std::string(why));                          \
    WARN("skipped: " << (why));                                                                            \
    return;                                                                                                 \
  } while (0)
#endif

// Skips the current test case unless a GPU can be used.
#define FLASHGEN_REQUIRE_GPU()                                          \
  do {                                                                  \
    std::string flashgen_why_;                                          \
    if (!::flashgen::driver_available(&flashgen_why_))                  \
      FLASHGEN_SKIP_TEST("no GPU: " + flashgen_why_);                   \
  } while (0)

// Skips the current case unless the context's device runs sm_90a kernels.
#define FLASHGEN_REQUIRE_SM90(context)                                                             \
  do {                                                                                             \
    if (flashgen::device_sm((context).device()) != 90) FLASHGEN_SKIP_TEST("the sm90 family needs sm_90"); \
  } while (0)
