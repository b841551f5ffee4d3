// A user stream from cuStreamCreate for the [gpu] tests, destroyed at scope exit; create it while a
// flashgen::ScopedContext is alive.
#pragma once

#include <cuda.h>

#include "runtime/cuda_driver.hpp"

namespace flashgen::test {

// A user stream, destroyed at scope exit.
class Stream {
 public:
  explicit Stream(unsigned flags) { FLASHGEN_CU_CHECK(cuStreamCreate(&stream_, flags)); }
  ~Stream() {
    if (stream_ != nullptr) flashgen::driver().cuStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

}  // namespace flashgen::test
