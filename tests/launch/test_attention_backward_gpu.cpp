// [gpu] numerics of flashgen_attention_backward through the C ABI: a deterministic randomized matrix
// (odd lengths, seqlen_q != seqlen_k both ways under both causal alignments, GQA/MQA, head_dims 32..256,
// both dtypes, three layouts, both dQ strategies), each gradient checked against the float64 reference
// with poisoned outputs and guarded buffers; bitwise repeatability of the deterministic strategy; and a
// directional-derivative check of the whole forward + backward; tune-on-first-use of a backward bucket.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "dispatch/select.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/attention_reference.hpp"
#include "support/backward_reference.hpp"
#include "support/first_use_scope.hpp"
#include "support/parallel.hpp"
#include "support/resolved_choice.hpp"
#include "support/strided_tensors.hpp"
#include "support/temp_dir.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/problem_key.hpp"
#include "tuner/space.hpp"
#include "tuner/store.hpp"

namespace {

using flashgen::AttentionGradients;
using flashgen::AttentionShape;
using flashgen::DeviceBuffer;
using flashgen::HostInput;
using flashgen::StridedView;
using flashgen::test::kGuardElements;
using flashgen::test::Rng;

enum class Layout { kBSHD, kBHSD, kPadded };

const char* layout_label(Layout layout) {
  return layout == Layout::kBHSD ? "BHSD" : layout == Layout::kPadded ? "padded" : "BSHD";
}

StridedView make_view(Layout layout, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  if (layout == Layout::kBHSD) return flashgen::test::bhsd_view(batch, seqlen, heads, head_dim);
  // Gaps (NaN in inputs, poison in outputs) after every head, row and batch; strides stay multiples of 8.
  if (layout == Layout::kPadded) return flashgen::test::padded_view(batch, seqlen, heads, head_dim);
  return StridedView::contiguous(batch, seqlen, heads, head_dim);
}

struct Problem {
  AttentionShape shape;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  float softmax_scale = 0.0f;
  Layout layout = Layout::kBSHD;
  bool deterministic = false;
  bool q_shared = false;  // q broadcast over the batch (batch stride 0): valid, but no TMA descriptor steps by 0
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
    s << "b=" << shape.batch << " sq=" << shape.seqlen_q << " sk=" << shape.seqlen_k << " hq=" << shape.heads_q
      << " hkv=" << shape.heads_kv << " d=" << shape.head_dim << " d_v=" << shape.value_dim() << " "
      << flashgen::test::dtype_label(dtype)
      << " mask=" << flashgen::test::mask_label(mask) << " scale=" << softmax_scale
      << " layout=" << layout_label(layout) << " deterministic=" << deterministic << " q_shared=" << q_shared
      << " seed=" << seed;
    return s.str();
  }
};

// One tensor on the device: its buffer (span + guard, 16-bit) and view.
struct DeviceTensor {
  StridedView view;
  DeviceBuffer buffer;

  DeviceTensor(const StridedView& v) : view(v), buffer(static_cast<size_t>(v.span() + kGuardElements) * 2) {}
  flashgen_tensor tensor(flashgen_dtype dtype) const { return flashgen::test::make_tensor(buffer, 0, view, dtype); }
  void upload(const std::vector<double>& values, flashgen_dtype dtype) {
    std::vector<uint16_t> storage(static_cast<size_t>(view.span() + kGuardElements), flashgen::test::kPoison16);
    flashgen::test::store_values(values, view, 0, dtype, storage);
    buffer.upload(storage);
  }
  std::vector<uint16_t> raw() const { return buffer.download_all<uint16_t>(); }
};

struct Inputs {
  std::vector<double> q, k, v, dout;  // contiguous [b, s, h, d] (v and dout: d_v), values of dtype
};

Inputs make_inputs(const Problem& p) {
  const AttentionShape& s = p.shape;
  Rng rng(p.seed);
  Inputs in;
  in.q = flashgen::test::normal_values(rng, s.batch * s.seqlen_q * s.heads_q * s.head_dim, p.dtype);
  if (p.q_shared) {  // every batch entry reads the first one's q
    const size_t one = static_cast<size_t>(s.seqlen_q * s.heads_q * s.head_dim);
    for (size_t i = one; i < in.q.size(); ++i) in.q[i] = in.q[i % one];
  }
  in.k = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * s.head_dim, p.dtype);
  in.v = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * s.value_dim(), p.dtype);
  in.dout = flashgen::test::normal_values(rng, s.batch * s.seqlen_q * s.heads_q * s.value_dim(), p.dtype);
  return in;
}

// What one problem's runs left in the gradient buffers.
struct Outputs {
  std::vector<uint16_t> dq, dk, dv;      // whole buffers, poisoned before each backward
  StridedView dq_view, dk_view, dv_view;
  std::string choice;                // without a config: what the dispatch layer chose and why
};

// Uploads inputs, runs the forward, then `repeats` backwards (re-poisoning the gradients before each)
// and returns the raw gradient buffers of every run. The backward runs `config` through the C++ API when
// given, else the C ABI's own choice.
std::vector<Outputs> run_problem(const Problem& p, const Inputs& in, int repeats,
                                 const flashgen::BwdConfig* config = nullptr) {
  const AttentionShape& s = p.shape;
  flashgen::ScopedContext scope;
  const StridedView q_view = make_view(p.layout, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  StridedView q_read = q_view;
  if (p.q_shared) q_read.stride[0] = 0;
  DeviceTensor q(q_read);
  DeviceTensor k(make_view(p.layout, s.batch, s.seqlen_k, s.heads_kv, s.head_dim));
  DeviceTensor v(make_view(p.layout, s.batch, s.seqlen_k, s.heads_kv, s.value_dim()));
  const StridedView out_view = make_view(p.layout, s.batch, s.seqlen_q, s.heads_q, s.value_dim());
  DeviceTensor out(out_view), dout(out_view), dq(q_view), dk(k.view), dv(v.view);
  DeviceBuffer lse(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q) * sizeof(float));
  q.upload(in.q, p.dtype);
  k.upload(in.k, p.dtype);
  v.upload(in.v, p.dtype);
  dout.upload(in.dout, p.dtype);
  out.buffer.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);

  flashgen_attention_options opts{};
  opts.softmax_scale = p.softmax_scale;
  opts.mask = p.mask;
  opts.deterministic = p.deterministic ? 1 : 0;
  const flashgen_tensor tq = q.tensor(p.dtype), tk = k.tensor(p.dtype), tv = v.tensor(p.dtype);
  const flashgen_tensor tout = out.tensor(p.dtype), tdout = dout.tensor(p.dtype);
  const flashgen_tensor tdq = dq.tensor(p.dtype), tdk = dk.tensor(p.dtype), tdv = dv.tensor(p.dtype);
  float* lse_ptr = static_cast<float*>(lse.data());
  {
    const int status = flashgen_attention_forward(&tq, &tk, &tv, &tout, lse_ptr, &opts, nullptr);
    INFO(flashgen_last_error());
    REQUIRE(status == FLASHGEN_SUCCESS);
  }
  std::string choice;
  if (config == nullptr) {
    const flashgen::BackwardLaunch launch = flashgen::plan_backward(
        flashgen::make_backward_call(&tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &tdk, &tdv, &opts), nullptr)
                                                .launch;
    choice = launch.config.name() + ": " + launch.reason;
  }
  std::vector<Outputs> runs;
  for (int r = 0; r < repeats; ++r) {
    dq.buffer.fill_bytes(0xFF);
    dk.buffer.fill_bytes(0xFF);
    dv.buffer.fill_bytes(0xFF);
    if (config != nullptr) {
      // A poisoned workspace: the kernels must write what they read of it (the dQ accumulator is zeroed
      // by no one where the first add stores: dq_first_add_stores).
      const flashgen::BackwardCall problem =
          flashgen::make_backward_call(&tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &tdk, &tdv, &opts);
      DeviceBuffer workspace(flashgen::backward_workspace_bytes(problem, *config));
      workspace.fill_bytes(0xFF);
      flashgen::launch_backward(problem, nullptr, *config, workspace.ptr(), workspace.bytes());
    } else {
      const int status = flashgen_attention_backward(&tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &tdk, &tdv, &opts,
                                                     nullptr);
      INFO(flashgen_last_error());
      REQUIRE(status == FLASHGEN_SUCCESS);
    }
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    runs.push_back(Outputs{dq.raw(), dk.raw(), dv.raw(), dq.view, dk.view, dv.view, choice});
  }
  return runs;
}

// Returns the dispatch layer's choice and its reason (without a config).
std::string check_problem(const Problem& p, int repeats = 1, const flashgen::BwdConfig* config = nullptr) {
  INFO(p.describe());
  INFO((config != nullptr ? "config " + config->name() : std::string("the C ABI's choice")));
  const AttentionShape& s = p.shape;
  const Inputs in = make_inputs(p);
  const std::vector<Outputs> runs = run_problem(p, in, repeats, config);

  const StridedView qc = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const StridedView kc = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  const StridedView vc = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.value_dim());
  const StridedView oc = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.value_dim());
  const HostInput q64 = HostInput::float64(in.q.data(), qc), k64 = HostInput::float64(in.k.data(), kc);
  const HostInput v64 = HostInput::float64(in.v.data(), vc), do64 = HostInput::float64(in.dout.data(), oc);
  const double scale = flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim);
  const AttentionGradients ref =
      flashgen::attention_backward_reference_f64(s, q64, k64, v64, do64, scale, flashgen::from_c(p.mask));
  const AttentionGradients naive =
      flashgen::test::attention_backward_naive(s, q64, k64, v64, do64, scale, flashgen::from_c(p.mask),
                                               p.dtype);

  const Outputs& first = runs.front();
  const std::vector<int64_t> q_dims = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  const std::vector<int64_t> kv_dims = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  const std::vector<int64_t> v_dims = {s.batch, s.seqlen_k, s.heads_kv, s.value_dim()};
  const struct {
    const char* name;
    const std::vector<uint16_t>& raw;
    const StridedView& view;
    const std::vector<double>& ref;
    const std::vector<double>& naive;
    const std::vector<int64_t>& dims;
  } grads[] = {{"dq", first.dq, first.dq_view, ref.dq, naive.dq, q_dims},
               {"dk", first.dk, first.dk_view, ref.dk, naive.dk, kv_dims},
               {"dv", first.dv, first.dv_view, ref.dv, naive.dv, v_dims}};
  for (const auto& g : grads) {
    const flashgen::test::CheckReport report = flashgen::test::check_gradient(
        g.name, g.dims, flashgen::test::gather_output(g.raw, g.view, p.dtype), g.ref, g.naive, p.dtype);
    INFO(report.text);
    CHECK(report.not_written == 0);
    CHECK(report.ok);
    std::string touched_text;
    const int64_t touched =
        flashgen::test::count_touched_outside(g.raw, {g.view}, flashgen::test::kPoison16, &touched_text);
    INFO(g.name << " buffer: " << touched_text);
    CHECK(touched == 0);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    INFO("run " << r << " against run 0");
    CHECK(runs[r].dq == first.dq);
    CHECK(runs[r].dk == first.dk);
    CHECK(runs[r].dv == first.dv);
  }
  return first.choice;
}

// The randomized matrix: every feature crossed with a few odd shapes, the same on every machine.
std::vector<Problem> backward_matrix() {
  Rng rng(20261122);
  const int64_t seqlens[] = {1, 7, 17, 64, 100, 128, 129, 200, 255};
  const int64_t head_dims[] = {32, 40, 64, 72, 96, 128, 136, 160, 192, 256};
  const int64_t groups[][2] = {{2, 2}, {4, 2}, {3, 1}, {1, 1}};
  const flashgen_mask masks[] = {FLASHGEN_MASK_NONE, FLASHGEN_MASK_CAUSAL, FLASHGEN_MASK_CAUSAL_TOP_LEFT};
  std::vector<Problem> problems;
  for (int i = 0; i < 48; ++i) {
    Problem p;
    p.shape.batch = 1 + rng.below(2);
    p.shape.seqlen_q = seqlens[rng.below(9)];
    p.shape.seqlen_k = rng.below(3) == 0 ? p.shape.seqlen_q : seqlens[rng.below(9)];
    const auto& group = groups[rng.below(4)];
    p.shape.heads_q = group[0];
    p.shape.heads_kv = group[1];
    p.shape.head_dim = head_dims[i % 10];
    p.dtype = rng.below(2) == 0 ? FLASHGEN_FLOAT16 : FLASHGEN_BFLOAT16;
    p.mask = masks[rng.below(3)];
    p.softmax_scale = rng.below(4) == 0 ? 0.3f : 0.0f;
    p.layout = static_cast<Layout>(rng.below(3));
    p.deterministic = (i / 10) % 2 == 1;
    p.seed = 1000 + i;
    problems.push_back(p);
  }
  return problems;
}

}  // namespace

TEST_CASE("backward: randomized matrix against the float64 reference", "[gpu][backward]") {
  FLASHGEN_REQUIRE_GPU();
  for (const Problem& p : backward_matrix()) check_problem(p);
}

TEST_CASE("backward: every head_dim from 32 to 256", "[gpu][backward]") {
  FLASHGEN_REQUIRE_GPU();
  for (int64_t head_dim = 32; head_dim <= 256; head_dim += 8) {
    for (bool deterministic : {false, true}) {
      Problem p;
      p.shape.head_dim = head_dim;
      p.shape.seqlen_q = 70, p.shape.seqlen_k = 45;
      p.shape.heads_q = 2, p.shape.heads_kv = 1;
      p.dtype = head_dim % 16 == 0 ? FLASHGEN_BFLOAT16 : FLASHGEN_FLOAT16;
      p.mask = deterministic ? FLASHGEN_MASK_CAUSAL : FLASHGEN_MASK_CAUSAL_TOP_LEFT;
      p.layout = Layout::kPadded;
      p.deterministic = deterministic;
      p.seed = static_cast<uint32_t>(head_dim);
      check_problem(p);
    }
  }
}

TEST_CASE("backward: masking edge cases and longer sequences", "[gpu][backward]") {
  FLASHGEN_REQUIRE_GPU();
  for (bool deterministic : {false, true}) {
    for (flashgen_dtype dtype : {FLASHGEN_FLOAT16, FLASHGEN_BFLOAT16}) {
      Problem p;
      p.dtype = dtype;
      p.deterministic = deterministic;
      p.shape.head_dim = 64;
      // Bottom-right causal with seqlen_q > seqlen_k: the first rows see no key (zero gradients).
      p.mask = FLASHGEN_MASK_CAUSAL;
      p.shape.seqlen_q = 300, p.shape.seqlen_k = 77;
      check_problem(p);
      // Top-left causal with seqlen_k > seqlen_q: keys past the last query are seen by nobody.
      p.mask = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
      p.shape.seqlen_q = 70, p.shape.seqlen_k = 333;
      check_problem(p);
      // Several key and query blocks with the standard head_dim.
      p.mask = FLASHGEN_MASK_CAUSAL;
      p.shape.head_dim = 128;
      p.shape.seqlen_q = p.shape.seqlen_k = 513;
      p.shape.heads_q = 4, p.shape.heads_kv = 1;
      check_problem(p);
    }
  }
}

// Every valid config of one family for a problem's dtype, head dims, mask and dQ strategy, as the tuner's backward
// space enumerates them for sm_<arch> (empty when the family does not take the head dims).
std::vector<flashgen::BwdConfig> family_backward_configs(const Problem& p, flashgen::KernelFamily family, int arch) {
  std::vector<flashgen::BwdConfig> configs;
  const flashgen::BackwardSpaceReport space = flashgen::backward_space(
      p.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16,
      static_cast<int>(p.shape.head_dim),
      p.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone : flashgen::MaskKind::kCausal, p.deterministic, arch,
      {}, static_cast<int>(p.shape.value_dim()));
  for (const flashgen::BwdConfig& c : space.valid) {
    if (c.family() == family) configs.push_back(c);
  }
  return configs;
}

std::vector<flashgen::BwdConfig> sm90_backward_configs(const Problem& p) {
  return family_backward_configs(p, flashgen::KernelFamily::kSm90, 90);
}

TEST_CASE("backward, sm90 family: every config of both strategies over the matrix and the masking edge cases",
          "[gpu][backward][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  {
    flashgen::ScopedContext context;
    FLASHGEN_REQUIRE_SM90(context);
  }
  // Every head_dim of the matrix (32 to 256; tiles of 64 to 256 columns, zero-padded past head_dim); each tile
  // width in both dtypes, both dQ strategies and both kinds of mask (the configs the tuner may pick).
  std::vector<Problem> problems = backward_matrix();
  for (flashgen_dtype dtype : {FLASHGEN_FLOAT16, FLASHGEN_BFLOAT16}) {
    for (int64_t head_dim : {64, 96, 128, 160, 192, 256}) {
      for (bool deterministic : {false, true}) {
        Problem p;
        p.dtype = dtype;
        p.shape.head_dim = head_dim;
        p.layout = (dtype == FLASHGEN_FLOAT16) == deterministic ? Layout::kBHSD : Layout::kPadded;
        p.deterministic = deterministic;
        p.mask = FLASHGEN_MASK_CAUSAL;  // the first rows see no key
        p.shape.seqlen_q = 300, p.shape.seqlen_k = 77;
        problems.push_back(p);
        p.mask = FLASHGEN_MASK_CAUSAL_TOP_LEFT;  // keys past the last query are seen by nobody
        p.shape.seqlen_q = 70, p.shape.seqlen_k = 333;
        problems.push_back(p);
        p.mask = FLASHGEN_MASK_NONE;  // several blocks both ways, GQA
        p.shape.seqlen_q = 385, p.shape.seqlen_k = 257;
        p.shape.heads_q = 4, p.shape.heads_kv = 2;
        problems.push_back(p);
        p.mask = FLASHGEN_MASK_CAUSAL;
        p.shape.seqlen_q = p.shape.seqlen_k = 513;
        p.shape.heads_q = 3, p.shape.heads_kv = 1;
        p.softmax_scale = 0.3f;
        problems.push_back(p);
      }
    }
  }
  flashgen::testing::compile_all(problems, sm90_backward_configs, 90);  // on every core at once
  int ran = 0;
  int deterministic = 0;
  for (const Problem& p : problems) {
    for (const flashgen::BwdConfig& c : sm90_backward_configs(p)) {
      check_problem(p, c.deterministic ? 2 : 1, &c);  // deterministic: bitwise equal on a second run
      ++ran;
      deterministic += c.deterministic;
    }
  }
  CHECK(ran > 50);
  CHECK(deterministic > 0);
}

TEST_CASE("backward, sm90 family: inputs TMA cannot describe run on the sm80 family", "[gpu][backward][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  {
    flashgen::ScopedContext context;
    FLASHGEN_REQUIRE_SM90(context);
  }
  for (bool deterministic : {false, true}) {
    Problem p;
    p.shape = {2, 100, 130, 4, 2, 128};
    p.mask = FLASHGEN_MASK_CAUSAL;
    p.deterministic = deterministic;
    p.q_shared = true;
    const std::string choice = check_problem(p, deterministic ? 2 : 1);  // deterministic: bitwise on a second run
    INFO(choice);
    CHECK(choice.rfind("bwd_sm80_", 0) == 0);
    CHECK(choice.find("TMA cannot describe q") != std::string::npos);
  }
}

namespace {

Problem value_dim_problem(int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                          int64_t head_dim_v, flashgen_dtype dtype, flashgen_mask mask, uint32_t seed) {
  Problem p;
  p.shape = {1, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v};
  p.dtype = dtype;
  p.mask = mask;
  p.seed = seed;
  return p;
}

// The sm80 family's heuristic tiles for a problem's class on sm_80.
std::vector<flashgen::BwdConfig> sm80_heuristic_configs(const Problem& p) {
  return flashgen::heuristic_backward_configs(
      p.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16,
      static_cast<int>(p.shape.head_dim),
      p.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone : flashgen::MaskKind::kCausal, p.deterministic, 80,
      static_cast<int>(p.shape.value_dim()));
}

// MLA's prefill (192/128) with GQA and rows that see no key, both layouts' strides; narrower and wider values; d_v
// off the 16-column step: the first four run every tile of both families, all six the C ABI's choice.
std::vector<Problem> value_dim_problems(bool deterministic) {
  const flashgen_mask none = FLASHGEN_MASK_NONE, br = FLASHGEN_MASK_CAUSAL, tl = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  std::vector<Problem> problems = {
      value_dim_problem(300, 77, 4, 2, 192, 128, FLASHGEN_BFLOAT16, br, 3101),
      value_dim_problem(385, 257, 4, 1, 192, 128, FLASHGEN_FLOAT16, none, 3102),
      value_dim_problem(70, 333, 2, 2, 128, 64, FLASHGEN_FLOAT16, tl, 3103),
      value_dim_problem(129, 129, 3, 1, 64, 128, FLASHGEN_BFLOAT16, br, 3104),
      value_dim_problem(200, 150, 2, 1, 256, 128, FLASHGEN_BFLOAT16, br, 3105),
      value_dim_problem(100, 77, 2, 1, 96, 40, FLASHGEN_FLOAT16, none, 3106),
  };
  problems[1].shape.batch = 2;
  problems[1].layout = Layout::kBHSD;
  problems[5].layout = Layout::kPadded;
  for (Problem& p : problems) p.deterministic = deterministic;
  return problems;
}

}  // namespace

TEST_CASE("backward: values of a head dim of their own, the C ABI's choice", "[gpu][backward][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  for (bool deterministic : {false, true}) {
    for (const Problem& p : value_dim_problems(deterministic)) {
      check_problem(p, deterministic ? 2 : 1);  // deterministic: bitwise equal on a second run
    }
  }
}

TEST_CASE("backward: values of a head dim of their own, each family's tiles", "[gpu][backward][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  bool sm90 = false;
  {
    flashgen::ScopedContext context;
    sm90 = flashgen::device_sm(context.device()) == 90;
  }
  std::vector<Problem> problems;
  for (bool deterministic : {false, true}) {
    const std::vector<Problem> all = value_dim_problems(deterministic);
    problems.insert(problems.end(), all.begin(), all.begin() + 4);
  }
  auto configs_of = [&](const Problem& p) {
    std::vector<flashgen::BwdConfig> configs = sm80_heuristic_configs(p);
    if (sm90) {
      for (flashgen::BwdConfig& c : sm90_backward_configs(p)) configs.push_back(std::move(c));
    }
    return configs;
  };
  flashgen::testing::compile_all(problems, configs_of, sm90 ? 90 : 80);
  int ran = 0;
  for (const Problem& p : problems) {
    for (const flashgen::BwdConfig& c : configs_of(p)) {
      check_problem(p, c.deterministic ? 2 : 1, &c);
      ++ran;
    }
  }
  CHECK(ran >= 16);
}

TEST_CASE("backward: keys of 512, 448 and 328 on the sm80 family's column slices", "[gpu][backward][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  {
    flashgen::ScopedContext context;
    if (flashgen::device_sm(context.device()) != 90) {
      WARN("skipped: the forward of keys above 256 runs on the Hopper family only");
      return;
    }
  }
  const flashgen_mask none = FLASHGEN_MASK_NONE, br = FLASHGEN_MASK_CAUSAL, tl = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  // Gemma 4's global layers (GQA) with rows that see no key, a batch in BHSD strides, a head dim whose last column
  // slices run short and end inside a tile (328: 21 tiles, dK's and dV's slices 6, 6, 6 and 3, dQ's 11 and 10), 448
  // beside values of 128.
  std::vector<Problem> problems;
  for (bool deterministic : {false, true}) {
    std::vector<Problem> these = {
        value_dim_problem(150, 120, 4, 2, 512, 0, FLASHGEN_BFLOAT16, br, 5121),
        value_dim_problem(97, 200, 2, 1, 512, 0, FLASHGEN_FLOAT16, none, 5122),
        value_dim_problem(130, 130, 2, 2, 328, 0, FLASHGEN_BFLOAT16, tl, 5123),
        value_dim_problem(100, 140, 2, 1, 448, 128, FLASHGEN_BFLOAT16, br, 5124),
    };
    these[1].shape.batch = 2;
    these[1].layout = Layout::kBHSD;
    these[2].layout = Layout::kPadded;
    for (Problem& p : these) p.deterministic = deterministic;
    problems.insert(problems.end(), these.begin(), these.end());
  }
  auto configs_of = [](const Problem& p) {
    return flashgen::heuristic_backward_configs(
        p.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16,
        static_cast<int>(p.shape.head_dim),
        p.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone : flashgen::MaskKind::kCausal, p.deterministic, 90,
        static_cast<int>(p.shape.value_dim()));
  };
  flashgen::testing::compile_all(problems, configs_of, 90);
  int ran = 0;
  for (const Problem& p : problems) {
    const std::string choice = check_problem(p, p.deterministic ? 2 : 1);
    INFO(choice);
    CHECK(choice.rfind("bwd_sm80_", 0) == 0);
    for (const flashgen::BwdConfig& c : configs_of(p)) {
      check_problem(p, c.deterministic ? 2 : 1, &c);
      ++ran;
    }
  }
  CHECK(ran >= 16);
}

TEST_CASE("backward: a batch whose column slices pass the grid's limit is refused naming it, nothing launched",
          "[gpu][backward][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  if (flashgen::device_sm(scope.device()) < 90) {
    WARN("skipped: the run-time choice of keys of 512 needs Hopper's shared memory");
    return;
  }
  // 16384 entries of one row: the dkdv kernel's four column slices would take 65536 blocks along z.
  const StridedView view = StridedView::contiguous(16384, 1, 1, 512);
  DeviceTensor q(view), k(view), v(view), out(view), dout(view), dq(view), dk(view), dv(view);
  DeviceBuffer lse(16384 * sizeof(float));
  for (DeviceTensor* t : {&q, &k, &v, &out, &dout}) t->buffer.fill_bytes(0x3C);  // 16-bit values near 1
  lse.fill_bytes(0);
  for (DeviceTensor* t : {&dq, &dk, &dv}) t->buffer.fill_bytes(0xFF);
  flashgen_attention_options opts{};
  const flashgen_tensor tq = q.tensor(FLASHGEN_BFLOAT16), tk = k.tensor(FLASHGEN_BFLOAT16),
                        tv = v.tensor(FLASHGEN_BFLOAT16), tout = out.tensor(FLASHGEN_BFLOAT16),
                        tdout = dout.tensor(FLASHGEN_BFLOAT16), tdq = dq.tensor(FLASHGEN_BFLOAT16),
                        tdk = dk.tensor(FLASHGEN_BFLOAT16), tdv = dv.tensor(FLASHGEN_BFLOAT16);
  const int status = flashgen_attention_backward(&tq, &tk, &tv, &tout, &tdout, static_cast<const float*>(lse.data()),
                                                 &tdq, &tdk, &tdv, &opts, nullptr);
  CHECK(status == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(flashgen_last_error(), Catch::Contains("batch is 16384") && Catch::Contains("at most 16383"));
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  for (DeviceTensor* t : {&dq, &dk, &dv}) {
    const std::vector<uint16_t> raw = t->raw();
    CHECK(std::all_of(raw.begin(), raw.end(), [](uint16_t x) { return x == 0xFFFF; }));
  }
}

TEST_CASE("backward: deterministic mode gives identical bits on repeated runs", "[gpu][backward]") {
  FLASHGEN_REQUIRE_GPU();
  for (int64_t head_dim : {64, 96, 128, 192, 256}) {
    Problem p;
    p.deterministic = true;
    p.dtype = FLASHGEN_BFLOAT16;
    p.mask = FLASHGEN_MASK_CAUSAL;
    p.shape.batch = 2, p.shape.heads_q = 4, p.shape.heads_kv = 2, p.shape.head_dim = head_dim;
    p.shape.seqlen_q = 333, p.shape.seqlen_k = 401;
    check_problem(p, 3);
  }
}

TEST_CASE("backward: gradients are the derivative of the forward", "[gpu][backward]") {
  FLASHGEN_REQUIRE_GPU();
  // L(q, k, v) = sum(dout ∘ attention(q, k, v)). The GPU's gradients contracted with a random direction
  // must match the float64 forward's central difference along it.
  Problem p;
  p.dtype = FLASHGEN_FLOAT16;
  p.mask = FLASHGEN_MASK_CAUSAL;
  p.shape.seqlen_q = 19, p.shape.seqlen_k = 23, p.shape.heads_q = 2, p.shape.heads_kv = 1, p.shape.head_dim = 32;
  const AttentionShape& s = p.shape;
  const Inputs in = make_inputs(p);
  const Outputs run = run_problem(p, in, 1).front();
  const std::vector<double> dq = flashgen::test::gather_output(run.dq, run.dq_view, p.dtype);
  const std::vector<double> dk = flashgen::test::gather_output(run.dk, run.dk_view, p.dtype);
  const std::vector<double> dv = flashgen::test::gather_output(run.dv, run.dv_view, p.dtype);

  Rng rng(7);
  auto direction = [&](size_t n) {
    std::vector<double> d(n);
    for (double& x : d) x = rng.normal();
    return d;
  };
  const std::vector<double> eq = direction(in.q.size()), ek = direction(in.k.size()), ev = direction(in.v.size());
  const StridedView qc = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const StridedView kc = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  const double scale = flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim);
  auto loss = [&](double t) {
    std::vector<double> q = in.q, k = in.k, v = in.v;
    for (size_t i = 0; i < q.size(); ++i) q[i] += t * eq[i];
    for (size_t i = 0; i < k.size(); ++i) k[i] += t * ek[i], v[i] += t * ev[i];
    const flashgen::AttentionResult r = flashgen::attention_reference_f64(
        s, HostInput::float64(q.data(), qc), HostInput::float64(k.data(), kc), HostInput::float64(v.data(), kc),
        scale, flashgen::from_c(p.mask));
    double sum = 0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += in.dout[i] * r.out[i];
    return sum;
  };
  const double h = 1e-4;
  const double numeric = (loss(h) - loss(-h)) / (2 * h);
  double analytic = 0;
  for (size_t i = 0; i < dq.size(); ++i) analytic += dq[i] * eq[i];
  for (size_t i = 0; i < dk.size(); ++i) analytic += dk[i] * ek[i] + dv[i] * ev[i];
  INFO("directional derivative: gpu " << analytic << ", central difference " << numeric);
  CHECK(std::fabs(analytic - numeric) <= 1e-2 * std::fabs(numeric) + 1e-3);
}

TEST_CASE("backward: tune-on-first-use sweeps a new problem, stores it and the call runs the winner",
          "[gpu][backward][tuner][first_use]") {
  FLASHGEN_REQUIRE_GPU();
  const flashgen::testing::TempDir dir("flashgen-first-use-backward");
  const std::string db = (dir.path() / "tuning.sqlite").string();
  const flashgen::testing::FirstUseScope first_use(db);

  Problem p;  // a bucket nothing else in the suite uses
  p.shape = AttentionShape{1, 555, 555, 2, 1, 64};
  p.mask = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  p.seed = 555;
  check_problem(p);  // its forward and backward calls each sweep their bucket first

  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const flashgen::ProblemKey key = flashgen::backward_problem_key(flashgen::DType::kFloat16, 64,
                                                                  flashgen::MaskKind::kCausal, false, 2, 555, 555, 2);
  const flashgen::BackwardChoice choice =
      flashgen::testing::resolved(flashgen::choose_backward_config(static_cast<int>(scope.device()), key, arch), arch);
  INFO(choice.config.name() << ": " << choice.reason);
  CHECK(choice.source == flashgen::ChoiceSource::kTunedOnFirstUse);
  CHECK(choice.reason.find(db) != std::string::npos);
  const flashgen::TuningStore store(db, /*read_only=*/true);
  const auto fingerprint = flashgen::current_device_fingerprint(static_cast<int>(scope.device()));
  const auto stored = store.lookup_exact(fingerprint, key);
  REQUIRE(stored.has_value());
  CHECK(stored->config == flashgen::TunedConfig(choice.config));
  CHECK(store.candidates(fingerprint, key).size() >= 2);
}
