// Tests for runtime/cuda_driver: a clear, remembered kNoDevice error without a driver; on a GPU machine,
// the device reports a supported compute capability instead.
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"

TEST_CASE("without a CUDA driver, driver() throws kNoDevice with the cause", "[cuda_driver]") {
  std::string why;
  if (flashgen::driver_available(&why)) FLASHGEN_SKIP_TEST("a CUDA driver and device are present");
  CHECK_FALSE(why.empty());

  std::string first_message;
  try {
    flashgen::driver();
    FAIL("driver() succeeded although driver_available() said no");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kNoDevice);
    first_message = e.what();
  }
  CHECK(first_message == why);
  // The failure is remembered: a second call reports the same cause.
  try {
    flashgen::driver();
    FAIL("the second driver() call succeeded after the first failed");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kNoDevice);
    CHECK(std::string(e.what()) == first_message);
  }
  // A driver call through the check macro fails the same way, before touching any entry point.
  try {
    FLASHGEN_CU_CHECK(cuInit(0));
    FAIL("FLASHGEN_CU_CHECK ran without a driver");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kNoDevice);
  }
  // So do the helpers built on the driver.
  int host_value = 0;
  try {
    flashgen::pointer_info(&host_value);
    FAIL("pointer_info answered without a driver");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kNoDevice);
  }
  try {
    flashgen::ScopedContext context;
    FAIL("ScopedContext made a context current without a driver");
  } catch (const flashgen::Error& e) {
    CHECK(e.status() == flashgen::Status::kNoDevice);
  }
}

TEST_CASE("throw_cu_error carries file:line, the call and the driver's text", "[cuda_driver]") {
  try {
    flashgen::throw_cu_error(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(&ptr, bytes)", "launch.cpp", 42);
    FAIL("throw_cu_error returned without throwing");
  } catch (const flashgen::Error& e) {
    const std::string message = e.what();
    CHECK(e.status() == flashgen::Status::kCuda);
    CHECK(message.rfind("launch.cpp:42: cuMemAlloc(&ptr, bytes) failed: ", 0) == 0);
    // With a driver: "CUDA_ERROR_INVALID_VALUE: invalid argument"; without one: the raw code.
    const bool named = message.find("CUDA_ERROR_INVALID_VALUE") != std::string::npos;
    const bool raw = message.find("CUresult 1") != std::string::npos;
    CHECK((named || raw));
    if (flashgen::driver_available()) CHECK(named);
  }
}

TEST_CASE("device 0 is sm_80 or newer", "[cuda_driver][gpu]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  CHECK(context.context() != nullptr);
  CHECK(flashgen::device_sm(context.device()) >= 80);
  CUcontext current = nullptr;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&current));
  CHECK(current == context.context());
}
