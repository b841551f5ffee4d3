// [gpu] test support: skip cleanly when no CUDA driver or device is present.
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
