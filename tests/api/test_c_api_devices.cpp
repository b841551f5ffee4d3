// Where a C ABI call runs and what it refuses before launching: an odd but valid layout accepted (and, on a GPU,
// run for real against the reference), pointers to host memory or to another device's memory refused; with two
// devices, a call runs on its stream's device whichever context is current, and a stream of another device than
// the tensors' is refused; without a driver, the missing GPU reported clearly.
#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/attention_reference.hpp"
#include "support/c_api_call.hpp"
#include "support/fake_pointer.hpp"
#include "support/mask_options.hpp"
#include "tuner/problem_key.hpp"

using flashgen::DeviceBuffer;
using flashgen::StridedView;
using flashgen::test::bshd;
using flashgen::test::Call;
using flashgen::test::fake_pointer;
using flashgen::test::use_odd_layout;

namespace {

StridedView view_of(const flashgen_tensor& tensor) {
  StridedView view;
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = tensor.shape[i];
    view.stride[i] = tensor.stride[i];
  }
  return view;
}

// Device memory for every tensor of a Call, poisoned (0xFF) outside what its view covers: inputs hold
// standard normals, out and lse poison. The Call's data pointers are set to it.
class DeviceCall {
 public:
  explicit DeviceCall(Call& call, uint32_t seed) : call_(call) {
    flashgen::test::Rng rng(seed);
    for (flashgen_tensor* tensor : {&call.q, &call.k, &call.v}) {
      const StridedView view = view_of(*tensor);
      std::vector<uint16_t> image(static_cast<size_t>(view.span() + kGuardElements), flashgen::test::kPoison16);
      inputs_.push_back(flashgen::test::normal_values(rng, view.elements(), tensor->dtype));
      flashgen::test::store_values(inputs_.back(), view, 0, tensor->dtype, image);
      buffers_.emplace_back(image.size() * sizeof(uint16_t));
      buffers_.back().upload(image);
      tensor->data = buffers_.back().data();
    }
    out_ = DeviceBuffer(static_cast<size_t>(view_of(call.out).span() + kGuardElements) * sizeof(uint16_t));
    out_.fill_bytes(0xFF);
    call.out.data = out_.data();
    if (call.lse != nullptr) {
      lse_ = DeviceBuffer(static_cast<size_t>(lse_count() + kGuardElements) * sizeof(float));
      lse_.fill_bytes(0xFF);
      call.lse = static_cast<float*>(lse_.data());
    }
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
  }

  // The inputs as contiguous [b, s, h, d] values: q, k, v.
  const std::vector<double>& input(int i) const { return inputs_[static_cast<size_t>(i)]; }
  std::vector<uint16_t> out_storage() const { return out_.download_all<uint16_t>(); }
  std::vector<float> lse_storage() const { return lse_.download_all<float>(); }
  int64_t lse_count() const { return call_.q.shape[0] * call_.q.shape[2] * call_.q.shape[1]; }

 private:
  static constexpr int64_t kGuardElements = 64;

  Call& call_;
  std::vector<std::vector<double>> inputs_;
  std::vector<DeviceBuffer> buffers_;
  DeviceBuffer out_;
  DeviceBuffer lse_;
};

// A small valid call on device memory: q and out [1, 16, 2, 64], k and v [1, 16, 1, 64], fp16, with lse.
Call small_call() {
  Call call;
  call.q = bshd(fake_pointer(1), 1, 16, 2, 64);
  call.k = bshd(fake_pointer(2), 1, 16, 1, 64);
  call.v = bshd(fake_pointer(3), 1, 16, 1, 64);
  call.out = bshd(fake_pointer(4), 1, 16, 2, 64);
  return call;
}

// Every element of the out buffer still poison: nothing was launched.
bool out_untouched(const DeviceCall& device_call) {
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  for (uint16_t bits : device_call.out_storage())
    if (bits != flashgen::test::kPoison16) return false;
  return true;
}

// The devices the driver lists.
int device_count() {
  int count = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetCount(&count));
  return count;
}

// Retains a device's primary context for the scope (released at exit).
class PrimaryContext {
 public:
  explicit PrimaryContext(int ordinal) {
    FLASHGEN_CU_CHECK(cuDeviceGet(&device_, ordinal));
    FLASHGEN_CU_CHECK(cuDevicePrimaryCtxRetain(&context_, device_));
  }
  ~PrimaryContext() { flashgen::driver().cuDevicePrimaryCtxRelease(device_); }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  CUcontext get() const { return context_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Makes a context current for the scope.
class PushedContext {
 public:
  explicit PushedContext(CUcontext context) { FLASHGEN_CU_CHECK(cuCtxPushCurrent(context)); }
  ~PushedContext() {
    CUcontext popped = nullptr;
    flashgen::driver().cuCtxPopCurrent(&popped);
  }
  PushedContext(const PushedContext&) = delete;
  PushedContext& operator=(const PushedContext&) = delete;
};
}  // namespace

TEST_CASE("C ABI accepts odd but valid layouts before touching the GPU", "[c_api]") {
  if (flashgen::driver_available()) {
    FLASHGEN_SKIP_TEST("a driver is present: \"C ABI runs an odd but valid layout\" [gpu] launches this layout");
  }
  Call call;
  use_odd_layout(call);
  CHECK(call.run() == FLASHGEN_ERROR_NO_DEVICE);
  CHECK(std::string(flashgen_last_error()).find("CUDA") != std::string::npos);
}

TEST_CASE("C ABI runs an odd but valid layout", "[gpu][c_api]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // q [2, 100, 8, 64] in [b, h, s, d] memory; k and v [2, 75, 1, 64] with 256-element rows (NaN between
  // rows) and head stride 3; bottom-right causal, so query rows 0..24 see no key; lse NULL.
  Call call;
  use_odd_layout(call);
  const DeviceCall device_call(call, 1201);
  const int status = call.run();
  INFO("message: " << flashgen_last_error());
  REQUIRE(status == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());

  const flashgen::AttentionShape shape{call.q.shape[0], call.q.shape[1], call.k.shape[1],
                                       call.q.shape[2], call.k.shape[2], call.q.shape[3]};
  const flashgen::test::ForwardReference reference = flashgen::test::forward_reference(
      shape, device_call.input(0), device_call.input(1), device_call.input(2),
      flashgen::effective_softmax_scale(call.opts.softmax_scale, shape.head_dim), call.opts.mask, call.q.dtype);
  const flashgen::test::ForwardCheck check =
      flashgen::test::check_forward(reference, device_call.out_storage(), view_of(call.out), nullptr);
  {
    INFO(check.out.text);
    CHECK(check.out.not_written == 0);
    CHECK(check.out.ok);
  }
  INFO(check.out_touched_text);
  CHECK(check.out_touched == 0);
}

TEST_CASE("C ABI refuses host memory before launching", "[gpu][c_api]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  Call call = small_call();
  const DeviceCall device_call(call, 1202);
  // A 16-byte-aligned host pointer: it passes every check that does not ask the driver.
  const size_t bytes = static_cast<size_t>(view_of(call.k).span()) * sizeof(uint16_t);  // 2048, a multiple of 16
  std::unique_ptr<void, decltype(&std::free)> host(std::aligned_alloc(16, bytes), &std::free);
  REQUIRE(host != nullptr);
  std::memset(host.get(), 0, bytes);
  call.k.data = host.get();
  const int status = call.run();
  const std::string message = flashgen_last_error();
  INFO("message: " << message);
  CHECK(status == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(message.find("k.data") != std::string::npos);
  CHECK(message.find("not device memory") != std::string::npos);
  CHECK(out_untouched(device_call));
}

TEST_CASE("C ABI refuses memory of another device before launching", "[gpu][c_api]") {
  FLASHGEN_REQUIRE_GPU();
  if (device_count() < 2) FLASHGEN_SKIP_TEST("one device: there is no other device's memory to pass");
  flashgen::ScopedContext context;  // the launch runs here, on context.device()
  const int other_device = (static_cast<int>(context.device()) + 1) % device_count();  // device 1 in practice
  const PrimaryContext other_context(other_device);
  Call call = small_call();
  const DeviceCall device_call(call, 1203);
  DeviceBuffer other_v;
  {
    const PushedContext pushed(other_context.get());
    other_v = DeviceBuffer(static_cast<size_t>(view_of(call.v).span()) * sizeof(uint16_t));
    other_v.fill_bytes(0);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
  }
  call.v.data = other_v.data();
  const int status = call.run();
  const std::string message = flashgen_last_error();
  INFO("launch device " << context.device() << ", v on device " << other_device << "; message: " << message);
  CHECK(status == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(message.find("v.data") != std::string::npos);
  CHECK(message.find("device " + std::to_string(other_device)) != std::string::npos);
  CHECK(out_untouched(device_call));
}

TEST_CASE("C ABI runs on the stream's device while another device's context is current", "[gpu][c_api]") {
  FLASHGEN_REQUIRE_GPU();
  if (device_count() < 2) FLASHGEN_SKIP_TEST("one device: there is no second device to run on");
  const PrimaryContext first(0);
  const PrimaryContext second(1);
  // The same call on each device in turn, with device 0's context current throughout: the kernels are loaded
  // into each context, and the stream, not the current context, decides where the call runs.
  for (const int device : {0, 1}) {
    const CUcontext home = device == 0 ? first.get() : second.get();
    const PushedContext current(first.get());
    Call call = small_call();
    call.opts = flashgen::test::mask_options(FLASHGEN_MASK_CAUSAL_TOP_LEFT);
    std::unique_ptr<DeviceCall> device_call;
    CUstream stream = nullptr;
    {
      const PushedContext pushed(home);
      device_call = std::make_unique<DeviceCall>(call, 1204 + static_cast<uint32_t>(device));
      FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    }
    const int status =
        flashgen_attention_forward(call.qp, call.kp, call.vp, call.outp, call.lse, call.optsp, stream);
    INFO("tensors and stream on device " << device << ", device 0 current; message: " << flashgen_last_error());
    CHECK(status == FLASHGEN_SUCCESS);
    const PushedContext pushed(home);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    FLASHGEN_CU_CHECK(cuStreamDestroy(stream));
    if (status == FLASHGEN_SUCCESS) {
      const flashgen::AttentionShape shape{call.q.shape[0], call.q.shape[1], call.k.shape[1],
                                           call.q.shape[2], call.k.shape[2], call.q.shape[3]};
      const flashgen::test::ForwardReference reference = flashgen::test::forward_reference(
          shape, device_call->input(0), device_call->input(1), device_call->input(2),
          flashgen::effective_softmax_scale(call.opts.softmax_scale, shape.head_dim), call.opts.mask,
          call.q.dtype);
      const std::vector<float> lse = device_call->lse_storage();
      const flashgen::test::ForwardCheck check =
          flashgen::test::check_forward(reference, device_call->out_storage(), view_of(call.out), &lse);
      INFO(check.out.text << '\n' << check.out_touched_text << '\n' << check.lse.text << '\n'
                          << check.lse_touched_text);
      CHECK(check.ok());
    }
    device_call.reset();  // freed in its own context
  }
}

TEST_CASE("C ABI refuses a stream of another device than the tensors'", "[gpu][c_api]") {
  FLASHGEN_REQUIRE_GPU();
  if (device_count() < 2) FLASHGEN_SKIP_TEST("one device: there is no other device's stream to pass");
  const PrimaryContext first(0);
  const PrimaryContext second(1);
  const PushedContext current(second.get());  // the tensors' device is current; the stream is device 0's
  Call call = small_call();
  const DeviceCall device_call(call, 1206);
  CUstream stream = nullptr;
  {
    const PushedContext pushed(first.get());
    FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  }
  const int status = flashgen_attention_forward(call.qp, call.kp, call.vp, call.outp, call.lse, call.optsp, stream);
  const std::string message = flashgen_last_error();
  {
    const PushedContext pushed(first.get());
    FLASHGEN_CU_CHECK(cuStreamDestroy(stream));
  }
  INFO("tensors on device 1, stream of device 0; message: " << message);
  CHECK(status == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(message.find("q.data") != std::string::npos);
  CHECK(message.find("device 1") != std::string::npos);
  CHECK(out_untouched(device_call));
}

TEST_CASE("C ABI reports a missing GPU clearly and keeps the last error per thread", "[c_api]") {
  std::string why;
  if (flashgen::driver_available(&why)) FLASHGEN_SKIP_TEST("only meaningful without a driver");
  Call call;
  CHECK(call.run() == FLASHGEN_ERROR_NO_DEVICE);
  const std::string message = flashgen_last_error();
  CHECK_FALSE(message.empty());
  CHECK(message == why);
  CHECK(std::string(flashgen_version()) == FLASHGEN_VERSION);
}
