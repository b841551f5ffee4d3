// C ABI additions for callers that manage their own memory and want to see inside (the Python package):
// the backward's workspace query and caller-workspace launch, the explain calls and flashgen_tune_forward.
// Every bad input returns a status and a message naming the argument before any GPU work; the [gpu]
// cases check that a caller workspace gives the pool path's bits and that explain describes a real launch.
#include <cuda.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/attention_reference.hpp"
#include "support/c_api_call.hpp"
#include "support/fake_pointer.hpp"
#include "support/mask_options.hpp"

namespace {

using flashgen::test::bshd;
using flashgen::test::fake_pointer;

// Arguments of one backward-shaped call (q, out, dout, dq [2, 100, 8, 64]; k, v, dk, dv [2, 75, 4, 64]).
struct Arguments {
  flashgen_tensor q = bshd(fake_pointer(1), 2, 100, 8, 64);
  flashgen_tensor k = bshd(fake_pointer(2), 2, 75, 4, 64);
  flashgen_tensor v = bshd(fake_pointer(3), 2, 75, 4, 64);
  flashgen_tensor out = bshd(fake_pointer(4), 2, 100, 8, 64);
  flashgen_tensor dout = bshd(fake_pointer(5), 2, 100, 8, 64);
  flashgen_tensor dq = bshd(fake_pointer(6), 2, 100, 8, 64);
  flashgen_tensor dk = bshd(fake_pointer(7), 2, 75, 4, 64);
  flashgen_tensor dv = bshd(fake_pointer(8), 2, 75, 4, 64);
  float* lse = static_cast<float*>(fake_pointer(9));
  flashgen_attention_options opts = flashgen::test::mask_options(FLASHGEN_MASK_CAUSAL);
  void* workspace = fake_pointer(10);
  size_t workspace_bytes = size_t(1) << 20;
  size_t* workspace_size = &workspace_size_storage;
  size_t workspace_size_storage = 0;
  std::vector<char> json = std::vector<char>(4096);
  size_t json_length = 0;
};

using Call = std::function<int(Arguments&)>;

int workspace_size(Arguments& a) {
  return flashgen_attention_backward_workspace_size(&a.q, &a.k, &a.v, &a.out, &a.dout, a.lse, &a.dq, &a.dk, &a.dv,
                                                    &a.opts, nullptr, a.workspace_size);
}
int with_workspace(Arguments& a) {
  return flashgen_attention_backward_with_workspace(&a.q, &a.k, &a.v, &a.out, &a.dout, a.lse, &a.dq, &a.dk, &a.dv,
                                                    &a.opts, a.workspace, a.workspace_bytes, nullptr);
}
int explain_forward(Arguments& a) {
  return flashgen_explain_forward(&a.q, &a.k, &a.v, &a.out, a.lse, &a.opts, nullptr, a.json.data(), a.json.size(),
                                  &a.json_length);
}
int explain_backward(Arguments& a) {
  return flashgen_explain_backward(&a.q, &a.k, &a.v, &a.out, &a.dout, a.lse, &a.dq, &a.dk, &a.dv, &a.opts, nullptr,
                                   a.json.data(), a.json.size(), &a.json_length);
}

// Applies a mutation to valid arguments, calls, and checks the status and that the message names `expected`.
void check_rejected(const Call& call, const std::function<void(Arguments&)>& mutate, int status,
                    const std::string& expected) {
  Arguments arguments;
  mutate(arguments);
  const int result = call(arguments);
  const std::string message = flashgen_last_error();
  INFO("message: " << message);
  CHECK(result == status);
  CHECK(message.find(expected) != std::string::npos);
}

flashgen_forward_problem valid_problem() {
  flashgen_forward_problem problem{};
  problem.dtype = FLASHGEN_BFLOAT16;
  problem.mask = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  problem.batch = 2, problem.seqlen_q = 512, problem.seqlen_k = 512;
  problem.heads_q = 8, problem.heads_kv = 2, problem.head_dim = 64;
  return problem;
}

void check_tune_rejected(const std::function<void(flashgen_forward_problem&)>& mutate, int status,
                         const std::string& expected) {
  flashgen_forward_problem problem = valid_problem();
  mutate(problem);
  std::vector<char> json(1024);
  const int result = flashgen_tune_forward(&problem, nullptr, json.data(), json.size(), nullptr);
  const std::string message = flashgen_last_error();
  INFO("message: " << message);
  CHECK(result == status);
  CHECK(message.find(expected) != std::string::npos);
}

}  // namespace

TEST_CASE("Backward workspace calls reject each bad argument with a message naming it", "[c_api][backward]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  for (const Call& call : {Call(workspace_size), Call(with_workspace)}) {
    check_rejected(call, [](Arguments& a) { a.dk.shape[2] = 8; }, kInvalid, "dk.shape[2] (heads) is 8 but k.shape[2]");
    check_rejected(call, [](Arguments& a) { a.lse = nullptr; }, kInvalid, "lse: null pointer");
    check_rejected(call, [](Arguments& a) { a.dq.stride[3] = 2; }, kInvalid, "dq.stride[3] must be 1");
    check_rejected(call, [](Arguments& a) { a.opts.mask = static_cast<flashgen_mask>(5); }, kInvalid,
                   "opts.mask: unknown value 5");
  }
  check_rejected(workspace_size, [](Arguments& a) { a.workspace_size = nullptr; }, kInvalid,
                 "workspace_bytes: null pointer");
  check_rejected(with_workspace, [](Arguments& a) { a.workspace = nullptr; }, kInvalid, "workspace: null pointer");
  check_rejected(with_workspace, [](Arguments& a) { a.workspace = static_cast<char*>(a.workspace) + 128; }, kInvalid,
                 "workspace: pointer must be 256-byte aligned");
}

TEST_CASE("Explain calls reject each bad argument with a message naming it", "[c_api][explain]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  for (const Call& call : {Call(explain_forward), Call(explain_backward)}) {
    check_rejected(call, [](Arguments& a) { a.v.shape[1] = 74; }, kInvalid, "v.shape[1] (seqlen) is 74");
    check_rejected(call, [](Arguments& a) { a.q.data = nullptr; }, kInvalid, "q.data: null pointer");
    check_rejected(call, [](Arguments& a) { a.opts.softmax_scale = std::nanf(""); }, kInvalid,
                   "opts.softmax_scale must be finite");
    check_rejected(
        call,
        [](Arguments& a) {
          for (flashgen_tensor* t : {&a.q, &a.out, &a.dout, &a.dq}) *t = bshd(t->data, 2, 100, 8, 72 + 1);
          for (flashgen_tensor* t : {&a.k, &a.v, &a.dk, &a.dv}) *t = bshd(t->data, 2, 75, 4, 72 + 1);
        },
        FLASHGEN_ERROR_UNSUPPORTED, "q.shape[3] (head_dim) = 73 is unsupported");
  }
  check_rejected(explain_backward, [](Arguments& a) { a.dv.data = nullptr; }, kInvalid, "dv.data: null pointer");
}

TEST_CASE("New C ABI calls with valid arguments reach the GPU check", "[c_api]") {
  std::string why;
  if (flashgen::driver_available(&why)) FLASHGEN_SKIP_TEST("with a driver the fake pointers are refused as device memory");
  for (const Call& call : {Call(workspace_size), Call(with_workspace), Call(explain_forward), Call(explain_backward)}) {
    Arguments arguments;
    CHECK(call(arguments) == FLASHGEN_ERROR_NO_DEVICE);
    CHECK(std::string(flashgen_last_error()) == why);
  }
  const flashgen_forward_problem problem = valid_problem();
  char json[256];
  CHECK(flashgen_tune_forward(&problem, nullptr, json, sizeof json, nullptr) == FLASHGEN_ERROR_NO_DEVICE);
  CHECK(std::string(flashgen_last_error()) == why);
}

TEST_CASE("flashgen_tune_forward rejects each bad problem with a message naming the field", "[c_api][tune]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  CHECK(flashgen_tune_forward(nullptr, nullptr, nullptr, 0, nullptr) == kInvalid);
  CHECK(std::string(flashgen_last_error()) == "problem: null pointer");
  check_tune_rejected([](flashgen_forward_problem& p) { p.dtype = static_cast<flashgen_dtype>(4); }, kInvalid,
                      "problem.dtype: unknown value 4");
  check_tune_rejected([](flashgen_forward_problem& p) { p.mask = static_cast<flashgen_mask>(-1); }, kInvalid,
                      "problem.mask: unknown value -1");
  // The problem has no window fields: a windowed call is tuned on its first use.
  check_tune_rejected([](flashgen_forward_problem& p) { p.mask = FLASHGEN_MASK_SLIDING_WINDOW; },
                      FLASHGEN_ERROR_UNSUPPORTED, "problem.mask: flashgen_forward_problem carries no window");
  check_tune_rejected([](flashgen_forward_problem& p) { p.seqlen_k = 0; }, kInvalid,
                      "problem.seqlen_k must be in [1, 2^30], got 0");
  check_tune_rejected([](flashgen_forward_problem& p) { p.batch = -3; }, kInvalid,
                      "problem.batch must be in [1, 2^30], got -3");
  check_tune_rejected([](flashgen_forward_problem& p) { p.heads_q = 7; }, kInvalid,
                      "problem.heads_q = 7 must be a multiple of problem.heads_kv = 2");
  check_tune_rejected([](flashgen_forward_problem& p) { p.heads_q = p.heads_kv = 70000; }, kInvalid,
                      "at most 65535 (grid limits)");
  check_tune_rejected([](flashgen_forward_problem& p) { p.head_dim = 100; }, FLASHGEN_ERROR_UNSUPPORTED,
                      "problem.head_dim = 100 is unsupported");
}

namespace {

// Device tensors for one small backward problem (q, k, v and dout standard normal), with the forward run.
struct DeviceProblem {
  static constexpr int64_t kBatch = 2, kSeqlenQ = 77, kSeqlenK = 130, kHeadsQ = 4, kHeadsKv = 2, kHeadDim = 64;
  Arguments arguments;
  flashgen::DeviceBuffer q, k, v, out, dout, dq, dk, dv, lse;

  explicit DeviceProblem(bool deterministic) {
    Arguments& a = arguments;
    a.opts = flashgen::test::mask_options(FLASHGEN_MASK_CAUSAL, deterministic);
    flashgen::test::Rng rng(1301);
    const std::pair<flashgen_tensor*, flashgen::DeviceBuffer*> tensors[] = {
        {&a.q, &q}, {&a.out, &out}, {&a.dout, &dout}, {&a.dq, &dq},
        {&a.k, &k}, {&a.v, &v},     {&a.dk, &dk},     {&a.dv, &dv}};
    for (const auto& [tensor, buffer] : tensors) {
      const bool query_side = tensor == &a.q || tensor == &a.out || tensor == &a.dout || tensor == &a.dq;
      const int64_t seqlen = query_side ? kSeqlenQ : kSeqlenK, heads = query_side ? kHeadsQ : kHeadsKv;
      const flashgen::StridedView view = flashgen::StridedView::contiguous(kBatch, seqlen, heads, kHeadDim);
      *buffer = flashgen::DeviceBuffer(static_cast<size_t>(view.span()) * sizeof(uint16_t));
      *tensor = bshd(buffer->data(), kBatch, seqlen, heads, kHeadDim);
      if (tensor == &a.q || tensor == &a.k || tensor == &a.v || tensor == &a.dout) {
        std::vector<uint16_t> image(static_cast<size_t>(view.span()));
        flashgen::test::store_values(flashgen::test::normal_values(rng, view.elements(), FLASHGEN_FLOAT16), view, 0,
                                     FLASHGEN_FLOAT16, image);
        buffer->upload(image);
      }
    }
    lse = flashgen::DeviceBuffer(static_cast<size_t>(kBatch * kHeadsQ * kSeqlenQ) * sizeof(float));
    a.lse = static_cast<float*>(lse.data());
    const int status = flashgen_attention_forward(&a.q, &a.k, &a.v, &a.out, a.lse, &a.opts, nullptr);
    INFO(flashgen_last_error());
    REQUIRE(status == FLASHGEN_SUCCESS);
  }

  // dq, dk and dv's bits, in that order.
  std::vector<uint16_t> gradients() const {
    std::vector<uint16_t> all;
    for (const flashgen::DeviceBuffer* buffer : {&dq, &dk, &dv}) {
      const std::vector<uint16_t> bits = buffer->download_all<uint16_t>();
      all.insert(all.end(), bits.begin(), bits.end());
    }
    return all;
  }
  void poison_gradients() {
    for (flashgen::DeviceBuffer* buffer : {&dq, &dk, &dv}) buffer->fill_bytes(0xFF);
  }
};

}  // namespace

TEST_CASE("A caller workspace gives the bits of the pool workspace", "[gpu][c_api][backward]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  DeviceProblem problem(/*deterministic=*/true);
  Arguments& a = problem.arguments;

  size_t bytes = 0;
  a.workspace_size = &bytes;
  REQUIRE(workspace_size(a) == FLASHGEN_SUCCESS);
  // D rows, 256-byte aligned; on sm_80 no dQ accumulator for the deterministic strategy (its dq kernel
  // writes dQ). On sm_90 (the Hopper family at head_dim 64) the rows are padded to 128 per head, and the
  // LSE in base 2, the fp32 dQ accumulator and one semaphore (two counters) per 64 rows come too.
  const bool sm90 = flashgen::device_sm(context.device()) == 90;
  const size_t rows_per_head = sm90 ? 128 : size_t(DeviceProblem::kSeqlenQ);
  const size_t rows = size_t(DeviceProblem::kBatch * DeviceProblem::kHeadsQ) * rows_per_head;
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t expected = sm90 ? 2 * aligned(rows * sizeof(float)) +
                                     aligned(rows * DeviceProblem::kHeadDim * sizeof(float)) +
                                     aligned(rows / 64 * 2 * sizeof(int))
                               : aligned(rows * sizeof(float));
  CHECK(bytes == expected);

  problem.poison_gradients();
  REQUIRE(flashgen_attention_backward(&a.q, &a.k, &a.v, &a.out, &a.dout, a.lse, &a.dq, &a.dk, &a.dv, &a.opts,
                                      nullptr) == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> from_pool = problem.gradients();

  flashgen::DeviceBuffer workspace(bytes);
  workspace.fill_bytes(0xFF);  // the kernels must not rely on a cleared workspace
  problem.poison_gradients();
  a.workspace = workspace.data();
  a.workspace_bytes = bytes - 1;
  CHECK(with_workspace(a) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(flashgen_last_error()).find("workspace: " + std::to_string(bytes - 1) + " bytes given") !=
        std::string::npos);
  a.workspace_bytes = bytes;
  // Host memory (256-byte aligned, large enough) is not a workspace the kernels could write.
  std::vector<char> host_memory(bytes + 256);
  a.workspace = host_memory.data() + (256 - reinterpret_cast<std::uintptr_t>(host_memory.data()) % 256);
  CHECK(with_workspace(a) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(flashgen_last_error()).find("workspace: not device memory") != std::string::npos);
  a.workspace = workspace.data();
  const int status = with_workspace(a);
  INFO(flashgen_last_error());
  REQUIRE(status == FLASHGEN_SUCCESS);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> from_caller = problem.gradients();
  size_t poisoned = 0;
  for (uint16_t bits : from_caller) poisoned += bits == flashgen::test::kPoison16;
  CHECK(poisoned == 0);
  CHECK(from_caller == from_pool);
}

TEST_CASE("Explain describes the launch the call makes, with its generated source", "[gpu][c_api][explain]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  DeviceProblem problem(/*deterministic=*/false);
  Arguments& a = problem.arguments;

  REQUIRE(explain_forward(a) == FLASHGEN_SUCCESS);
  const nlohmann::json forward = nlohmann::json::parse(std::string(a.json.data(), a.json_length));
  INFO(forward.dump(2));
  CHECK(forward["pass"] == "forward");
  CHECK(forward["config"].get<std::string>().rfind("fwd_", 0) == 0);
  CHECK(forward["arch"].get<int>() == flashgen::device_sm(context.device()));
  CHECK(forward["kernels"].size() == 1);
  if (forward["config"].get<std::string>().find("_pst") != std::string::npos) {
    // Persistent: at most one block per SM walks the (query block, head, batch) tiles.
    int sms = 0;
    FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, context.device()));
    CHECK(forward["grid"][0].get<int>() >= 1);
    CHECK(forward["grid"][0].get<int>() <= sms);
    CHECK(forward["grid"][1] == 1);
    CHECK(forward["grid"][2] == 1);
  } else {
    CHECK(forward["grid"][1] == DeviceProblem::kHeadsQ);
    CHECK(forward["grid"][2] == DeviceProblem::kBatch);
  }
  REQUIRE(forward["source_path"].is_string());
  std::ifstream source(forward["source_path"].get<std::string>());
  std::stringstream text;
  text << source.rdbuf();
  CHECK(text.str().find(forward["config"].get<std::string>()) != std::string::npos);

  REQUIRE(explain_backward(a) == FLASHGEN_SUCCESS);
  const nlohmann::json backward = nlohmann::json::parse(std::string(a.json.data(), a.json_length));
  INFO(backward.dump(2));
  CHECK(backward["config"].get<std::string>().rfind("bwd_", 0) == 0);
  CHECK(backward["source"] == "heuristic");
  CHECK(backward["kernels"].size() == 3);
  size_t bytes = 0;
  a.workspace_size = &bytes;
  REQUIRE(workspace_size(a) == FLASHGEN_SUCCESS);
  CHECK(backward["workspace_bytes"] == bytes);

  // Too small a buffer: the length is reported, nothing is written.
  std::vector<char> small(8, 'x');
  size_t length = 0;
  CHECK(flashgen_explain_forward(&a.q, &a.k, &a.v, &a.out, a.lse, &a.opts, nullptr, small.data(), small.size(),
                                 &length) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK(length == forward.dump().size());
  CHECK(std::string(small.data(), small.size()) == "xxxxxxxx");
  CHECK(std::string(flashgen_last_error()).find("json_capacity: 8 bytes is too small") != std::string::npos);
}
