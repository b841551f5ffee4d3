// Uses the installed C++ API: checks a forward call whose head_dim differs between q and k, which
// flashgen::make_forward_call refuses with a flashgen::Error before any GPU work. Exit 0 on success.
#include <cstdio>
#include <cstring>

#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"

int main() {
  alignas(16) static unsigned char storage[64];  // never read: the call is refused while checking shapes
  const flashgen::TensorView q = flashgen::bshd_view(storage, flashgen::DType::kFloat16, 1, 16, 2, 64);
  const flashgen::TensorView k = flashgen::bshd_view(storage, flashgen::DType::kFloat16, 1, 16, 2, 128);
  const flashgen::CallOptions options;
  try {
    (void)flashgen::make_forward_call(&q, &k, &k, &q, nullptr, &options);
    std::fprintf(stderr, "a head_dim mismatch was accepted\n");
    return 1;
  } catch (const flashgen::Error& error) {
    std::printf("refused: %s\n", error.what());
    return error.status() == flashgen::Status::kInvalidArgument ? 0 : 1;
  }
}
