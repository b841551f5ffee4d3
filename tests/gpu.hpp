// [gpu] test support: skip cleanly when no CUDA driver or device is present, or when a case needs sm_90.
#pragma once

#include <string>

#include "catch.hpp"
#include "runtime/cuda_driver.hpp"

#ifdef FLASHGEN_CATCH3
#define FLASHGEN_SKIP_TEST(why) SKIP(why)
#else
#define FLASHGEN_SKIP_TEST(why) \
  do {                          \
    WARN("skipped: " << (why)); \
    return;                     \
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
