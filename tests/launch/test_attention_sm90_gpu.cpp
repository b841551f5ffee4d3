// [gpu][sm90] every built-in config of the forward's Hopper family on the C ABI cases' problems and on its own
// edge cases (causal skipping, persistent tiles, streams, L2 sections); TMA-less inputs fall back to sm80.
#include <cuda.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/kernel_registry.hpp"
#include "support/attention_reference.hpp"
#include "support/check_reports.hpp"
#include "support/forward_problem.hpp"
#include "support/parallel.hpp"
#include "support/strided_tensors.hpp"
#include "support/user_stream.hpp"
#include "tuner/heuristic.hpp"

using namespace flashgen::test;

namespace {

using flashgen::AttentionShape;
using flashgen::DeviceBuffer;
using flashgen::StridedView;

// The sm90 family's built-in tiles for a problem (the heuristic's whole preference list), each with the
// overlap, pingpong and persistent knobs both ways where valid, as two groups of consumers per
// persistent block (block_m at most 128, or 64 with 64-key blocks; overlap and pingpong both ways) and
// with the rows' sums taken the other way (tensor cores or adds; P in registers and in shared memory);
// the first tile also with P in shared memory and in clusters of two (alone and together, overlap and
// persistent off and on). None when the family does not apply to its head_dim.
std::vector<flashgen::KernelConfig> sm90_configs(const Problem& p) {
  std::vector<flashgen::KernelConfig> configs;
  std::set<std::string> grouped;
  const flashgen::DType dtype = p.dtype == FLASHGEN_BFLOAT16 ? flashgen::DType::kBFloat16 : flashgen::DType::kFloat16;
  const flashgen::MaskKind mask = p.mask == FLASHGEN_MASK_NONE ? flashgen::MaskKind::kNone : flashgen::MaskKind::kCausal;
  bool extras_done = false;
  for (const flashgen::KernelConfig& c :
       flashgen::heuristic_forward_configs(dtype, static_cast<int>(p.shape.head_dim), mask, 90)) {
    if (c.family() != flashgen::KernelFamily::kSm90) continue;
    for (bool overlap : {false, true})
      for (bool pingpong : {false, true})
        for (bool persistent : {false, true}) {
          flashgen::KernelConfig variant = c;
          variant.sm90()->overlap = overlap;
          variant.sm90()->pingpong = pingpong;
          variant.sm90()->persistent = persistent;
          if (!variant.invalid_reason(90)) configs.push_back(variant);
        }
    for (bool overlap : {false, true})
      for (bool pingpong : {false, true})
        for (int block_m : {128, 64}) {  // two or one consumers per group; 64-key blocks with one
          flashgen::KernelConfig variant = c;
          variant.block_m = std::min(c.block_m, block_m);
          if (block_m == 64) variant.block_n = 64;
          variant.sm90()->groups = 2;
          variant.sm90()->persistent = true;
          variant.sm90()->overlap = overlap;
          variant.sm90()->pingpong = pingpong;
          if (!variant.invalid_reason(90) && grouped.insert(variant.name()).second) configs.push_back(variant);
        }
    for (bool p_smem : {false, true}) {  // the rows' sums the other way, P in registers or not
      flashgen::KernelConfig variant = c;
      variant.sm90()->tensor_sum = !c.sm90()->tensor_sum;
      variant.sm90()->p_smem = p_smem;
      if (!variant.invalid_reason(90)) configs.push_back(variant);
    }
    if (extras_done) continue;
    extras_done = true;
    for (auto [p_smem, cluster] : {std::pair{true, 1}, std::pair{false, 2}, std::pair{true, 2}})
      for (bool on : {false, true}) {
        flashgen::KernelConfig variant = c;
        variant.sm90()->p_smem = p_smem;
        variant.sm90()->cluster = cluster;
        variant.sm90()->overlap = variant.sm90()->persistent = on;
        if (!variant.invalid_reason(90)) configs.push_back(variant);
      }
  }
  return configs;
}

// Every sm90 built-in config over the given problems (every head_dim: tiles of whole 64-column chunks).
// The configs are compiled first, on every core at once.
void run_sm90_family(const std::vector<Problem>& problems) {
  flashgen::testing::compile_all(problems, sm90_configs, 90);
  int ran = 0;
  for (const Problem& p : problems) {
    const std::vector<flashgen::KernelConfig> configs = sm90_configs(p);
    if (configs.empty()) continue;
    INFO(p.describe());
    run_and_check(p, nullptr, configs);
    ++ran;
  }
  CHECK(ran > 0);
}

}  // namespace

TEST_CASE("attention forward, sm90 family: randomized matrix", "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  run_sm90_family(randomized_matrix(kMatrixSeed));
}

TEST_CASE("attention forward, sm90 family: masking edge cases, layouts, lazy rescaling", "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  run_sm90_family(masking_edge_problems());
  run_sm90_family(layout_problems());
  run_sm90_family(rescale_problems());
}

TEST_CASE("attention forward, sm90 family: causal key blocks a consumer sees in part or not at all",
          "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  // Under a causal mask each consumer warpgroup (64 query rows) skips the key blocks past its last row's
  // last key and computes only the first half of a block whose second half it cannot see (fwd_sm90.cuh,
  // kHalfN). Diagonal offsets off the 64-row grid move the half blocks and the skipped ones to every
  // position in a tile, first and last block included. A consumer's last key just past a block edge
  // (offset -60, and the last of 260 keys) leaves it a block with 4 keys to compute. With 100 fewer keys
  // than queries the first consumer of the tile of rows 0..127 passes every block while the second sees
  // keys; offsets -100 and 32 also put skipped blocks in the 128-key blocks of the d128 tiles.
  run_sm90_family({
      make_problem(1, 300, 332, 2, 1, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 991),
      make_problem(1, 400, 260, 2, 1, 64, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 992),
      make_problem(1, 300, 150, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 993),
      make_problem(1, 400, 340, 2, 1, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 994),
      make_problem(1, 300, 200, 2, 1, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 998),
      make_problem(1, 300, 332, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 999),
      make_problem(1, 200, 456, 2, 1, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 995),
      make_problem(2, 361, 301, 2, 1, 256, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 996),
      make_problem(1, 160, 224, 2, 2, 256, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 997),
  });
}

TEST_CASE("attention forward, sm90 family: persistent blocks walk many tiles", "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  // At least twice as many tiles as SMs for every block_m, so each persistent block (each group of a
  // _g2 block) takes several: the K/V rings and mbarrier phases run on across tiles, the next tile's Q
  // waits for the Q rows to be free, and output staging rows are reused. Bottom-right causal with
  // seqlen_q > seqlen_k leaves most tiles without a visible key (their output is 0), between tiles that
  // have some.
  run_sm90_family({
      make_problem(2, 700, 50, 48, 16, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 961),
      make_problem(2, 300, 90, 64, 8, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_NONE, 962),
      make_problem(1, 520, 200, 96, 96, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 963),
      // Clusters of two walk several pairs of query blocks each (the last pair's second block past the
      // end), over several key blocks per tile, so both blocks' K/V rings wrap across tiles.
      make_problem(1, 520, 520, 64, 8, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_NONE, 964),
      // Unmasked head_dim 64 (the _g2 tiles): 576 tiles of 128 rows, several per walker on the fixed
      // round-robin, not a multiple of the walkers.
      make_problem(2, 700, 50, 48, 16, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_NONE, 965),
  });
}

TEST_CASE("attention forward, sm90 family: persistent launches on two streams at once, each twice", "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  // A persistent kernel hands its tiles out through a counter of its stream, which must read 0 when it
  // starts. Two problems with more tiles than SMs run at once on two streams, each launched twice in a
  // row with its output poisoned on its stream in between: a counter shared by the two streams, or one
  // the first launch did not set back to 0, would leave tiles poisoned.
  const std::vector<Problem> problems = {
      make_problem(1, 300, 300, 96, 8, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 971),
      make_problem(2, 300, 260, 48, 12, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 972),
  };
  struct Run {
    HostProblem host;
    std::vector<DeviceBuffer> inputs;
    DeviceBuffer out, lse;
    flashgen::test::ForwardReference reference;
  };
  std::vector<Run> runs;
  for (const Problem& p : problems) {
    Run run;
    run.host = make_host_problem(p);
    run.inputs = upload_inputs(run.host);
    run.out = DeviceBuffer(static_cast<size_t>(run.host.layout.out_elements) * sizeof(uint16_t));
    const AttentionShape& s = p.shape;
    run.lse = DeviceBuffer(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q + kGuardElements) * sizeof(float));
    run.reference = flashgen::test::forward_reference(s, run.host.q, run.host.k, run.host.v,
                                                      flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim),
                                                      p.mask, p.dtype);
    runs.push_back(std::move(run));
  }
  Stream streams[2] = {Stream(CU_STREAM_NON_BLOCKING), Stream(CU_STREAM_NON_BLOCKING)};

  int checked = 0;
  for (const flashgen::KernelConfig& config : sm90_configs(problems[0])) {
    if (!config.sm90()->persistent || config.sm90()->cluster != 1) continue;
    INFO("config " << config.name());
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    for (int round = 0; round < 2; ++round)
      for (size_t j = 0; j < runs.size(); ++j) {
        const Problem& p = problems[j];
        const ProblemLayout& layout = runs[j].host.layout;
        CUstream stream = streams[j].get();
        runs[j].out.fill_bytes(0xFF, stream);
        runs[j].lse.fill_bytes(0xFF, stream);
        const auto [q, k, v] = input_tensors(runs[j].inputs, layout, p.dtype);
        const flashgen_tensor o = make_tensor(runs[j].out, 0, layout.out, p.dtype);
        flashgen_attention_options options{};
        options.softmax_scale = p.softmax_scale;
        options.mask = p.mask;
        flashgen::launch_forward(
            flashgen::make_forward_call(&q, &k, &v, &o, static_cast<float*>(runs[j].lse.data()), &options), stream,
            config);
      }
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    for (size_t j = 0; j < runs.size(); ++j) {
      INFO(problems[j].describe());
      const std::vector<float> lse_values = runs[j].lse.download_all<float>();
      check_reports(flashgen::test::check_forward(runs[j].reference, runs[j].out.download_all<uint16_t>(),
                                                  runs[j].host.layout.out, &lse_values));
    }
    ++checked;
  }
  CHECK(checked > 0);
}

TEST_CASE("attention forward, sm90 family: causal tile lists in L2 sections of any width", "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  // The runtime sizes a persistent causal kernel's sections by the L2 cache, which these small problems
  // never fill: set the width by hand instead, down to one (batch, head) pair, and widths that leave a
  // narrower last section (7 pairs in sections of 2 and 3), a section wider than the problem included.
  const Problem p = make_problem(1, 333, 300, 7, 7, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 981);
  const HostProblem host = make_host_problem(p);
  const ProblemLayout& layout = host.layout;
  const std::vector<DeviceBuffer> inputs = upload_inputs(host);
  DeviceBuffer out(static_cast<size_t>(layout.out_elements) * sizeof(uint16_t));
  DeviceBuffer lse(static_cast<size_t>(p.shape.heads_q * p.shape.seqlen_q + kGuardElements) * sizeof(float));
  const auto [q, k, v] = input_tensors(inputs, layout, p.dtype);
  const flashgen_tensor o = make_tensor(out, 0, layout.out, p.dtype);
  flashgen_attention_options options{};
  options.mask = p.mask;
  const flashgen::ForwardCall problem =
      flashgen::make_forward_call(&q, &k, &v, &o, static_cast<float*>(lse.data()), &options);
  const flashgen::test::ForwardReference reference = flashgen::test::forward_reference(
      p.shape, host.q, host.k, host.v, flashgen::effective_softmax_scale(0.0f, p.shape.head_dim), p.mask, p.dtype);

  int checked = 0;
  for (const flashgen::KernelConfig& config : sm90_configs(p)) {
    if (!config.sm90()->persistent || config.sm90()->cluster != 1) continue;
    for (int section : {1, 2, 3, 7, 100}) {
      INFO("config " << config.name() << ", sections of " << section << " pairs");
      flashgen::PreparedForward prepared = flashgen::prepare_forward(problem, nullptr, config);
      prepared.sm90_params.l2_section = section;
      out.fill_bytes(0xFF);
      lse.fill_bytes(0xFF);
      prepared(nullptr);
      FLASHGEN_CU_CHECK(cuCtxSynchronize());
      const std::vector<float> lse_values = lse.download_all<float>();
      check_reports(flashgen::test::check_forward(reference, out.download_all<uint16_t>(), layout.out, &lse_values));
      ++checked;
    }
  }
  CHECK(checked > 0);
}

TEST_CASE("attention forward, sm90 family: inputs TMA cannot describe run on the sm80 family", "[gpu][attention][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  // q broadcast over the batch (batch stride 0): a valid argument, but no TMA descriptor can step by 0.
  const AttentionShape shape{2, 100, 130, 4, 2, 128};
  const flashgen_dtype dtype = FLASHGEN_FLOAT16;
  Rng rng(4242);
  const StridedView q_one = StridedView::contiguous(1, shape.seqlen_q, shape.heads_q, shape.head_dim);
  const StridedView kv_view = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
  const StridedView out_view = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
  const std::vector<double> q_batch = flashgen::test::normal_values(rng, q_one.elements(), dtype);
  std::vector<double> q = q_batch;  // what each batch reads
  q.insert(q.end(), q_batch.begin(), q_batch.end());
  const std::vector<double> k = flashgen::test::normal_values(rng, kv_view.elements(), dtype);
  const std::vector<double> v = flashgen::test::normal_values(rng, kv_view.elements(), dtype);

  auto upload = [&](const std::vector<double>& values, const StridedView& view) {
    std::vector<uint16_t> storage(static_cast<size_t>(view.elements()));
    flashgen::test::store_values(values, view, 0, dtype, storage);
    DeviceBuffer buffer(storage.size() * sizeof(uint16_t));
    buffer.upload(storage);
    return buffer;
  };
  const DeviceBuffer q_buffer = upload(q_batch, q_one), k_buffer = upload(k, kv_view), v_buffer = upload(v, kv_view);
  DeviceBuffer out(static_cast<size_t>(out_view.elements()) * sizeof(uint16_t));
  out.fill_bytes(0xFF);
  const int64_t lse_count = shape.batch * shape.heads_q * shape.seqlen_q;
  DeviceBuffer lse(static_cast<size_t>(lse_count + kGuardElements) * sizeof(float));
  lse.fill_bytes(0xFF);

  StridedView q_view = q_one;
  q_view.shape[0] = shape.batch;
  q_view.stride[0] = 0;
  flashgen::CallOptions options;
  options.mask = flashgen::Mask::kCausal;
  auto view = [&](const DeviceBuffer& buffer, const StridedView& strided) {
    return flashgen::from_c(make_tensor(buffer, 0, strided, dtype));
  };
  const flashgen::ForwardLaunch launch =
      flashgen::attention_forward(view(q_buffer, q_view), view(k_buffer, kv_view), view(v_buffer, kv_view),
                                  view(out, out_view), static_cast<float*>(lse.data()), options, nullptr);
  INFO(launch.config.name() << ": " << launch.reason);
  CHECK(launch.config.family() == flashgen::KernelFamily::kSm80);
  CHECK(launch.reason.find("TMA cannot describe q") != std::string::npos);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());

  const double scale = flashgen::effective_softmax_scale(0.0f, shape.head_dim);
  const flashgen::test::ForwardReference reference =
      flashgen::test::forward_reference(shape, q, k, v, scale, FLASHGEN_MASK_CAUSAL, dtype);
  const std::vector<float> lse_values = lse.download_all<float>();
  check_reports(flashgen::test::check_forward(reference, out.download_all<uint16_t>(), out_view, &lse_values));
}
