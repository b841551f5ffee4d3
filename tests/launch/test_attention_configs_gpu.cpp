// [gpu][configs] numerics of every kernel config the library may be asked to run: each default candidate
// for the device's arch and a sweep of tile variants (stages, block_n, warps, q_in_regs) launched through
// launch_forward on odd problems and checked against the float64 reference. The CPU case checks the sweep.
#include <cuda.h>

#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
#include "generator/kernel_config.hpp"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/attention_reference.hpp"
#include "support/check_reports.hpp"
#include "support/strided_tensors.hpp"
#include "tuner/heuristic.hpp"

namespace {

using flashgen::AttentionShape;
using flashgen::DeviceBuffer;
using flashgen::DType;
using flashgen::KernelConfig;
using flashgen::MaskKind;
using flashgen::StridedView;
using flashgen::test::ForwardCheck;
using flashgen::test::check_reports;
using flashgen::test::kGuardElements;
using flashgen::test::make_tensor;

// One base config per sweep; the sweep varies one axis at a time around it and keeps what is valid on
// the arch. Three sweeps keep the whole list near 60 configs (~0.5 s of NVRTC each); sm_90 adds the
// sm90 family's default candidates (up to 16 more).
struct Sweep {
  DType dtype;
  int head_dim;
  MaskKind mask;
  int block_m, block_n, warps, stages;
};

constexpr Sweep kSweeps[] = {
    // A head_dim that is not a multiple of 16, one 16-row tile per warp: room for every block_n up to
    // 128 and for Q in registers.
    {DType::kBFloat16, 40, MaskKind::kCausal, 128, 64, 8, 2},
    // The most used head_dim under a causal mask (the default candidates' tile variants are unmasked).
    {DType::kFloat16, 128, MaskKind::kCausal, 128, 32, 4, 3},
    // A large non-standard head_dim (padded to 208 columns).
    {DType::kBFloat16, 200, MaskKind::kNone, 128, 32, 8, 2},
};

// default_forward_candidates(arch), then each sweep's variants that are valid on arch and not already
// listed.
std::vector<KernelConfig> configs_under_test(int arch) {
  std::vector<KernelConfig> configs = flashgen::default_forward_candidates(arch);
  std::set<std::string> names;
  for (const KernelConfig& c : configs) names.insert(c.name());
  auto add = [&](const KernelConfig& c) {
    if (!c.invalid_reason(arch) && names.insert(c.name()).second) configs.push_back(c);
  };
  for (const Sweep& sweep : kSweeps) {
    KernelConfig base;
    base.dtype = sweep.dtype;
    base.head_dim = sweep.head_dim;
    base.mask = sweep.mask;
    base.block_m = sweep.block_m;
    base.block_n = sweep.block_n;
    base.sm80()->warps = sweep.warps;
    base.stages = sweep.stages;
    for (int stages : {2, 3, 4}) {
      KernelConfig c = base;
      c.stages = stages;
      add(c);
    }
    for (int block_n : {16, 32, 48, 64, 128}) {
      KernelConfig c = base;
      c.block_n = block_n;
      add(c);
    }
    for (int warps : {4, 8}) {  // 32 or 16 rows per warp
      KernelConfig c = base;
      c.sm80()->warps = warps;
      add(c);
    }
    KernelConfig half_rows = base;  // 16 rows per warp in a 4-warp block
    half_rows.block_m = 64;
    half_rows.sm80()->warps = 4;
    add(half_rows);
    KernelConfig q_in_regs = base;
    q_in_regs.sm80()->q_in_regs = !base.sm80()->q_in_regs;
    add(q_in_regs);
  }
  return configs;
}

// Problems every config runs, with b = 1 and at most two heads so that the CPU references stay cheap.
// head_dim comes from the config; a kCausal config runs with causal_mask, a kNone one without a mask.
struct ConfigProblem {
  const char* what;
  AttentionShape shape;  // head_dim ignored
  flashgen_mask causal_mask;
  float softmax_scale;  // <= 0: default
};

const ConfigProblem kProblems[] = {
    {"more queries than keys, GQA 2:1 (under the causal mask rows 0..195 see no key)",
     AttentionShape{1, 203, 7, 2, 1, 0}, FLASHGEN_MASK_CAUSAL, 0.0f},
    {"a long key sequence ending in a partial block", AttentionShape{1, 130, 1023, 1, 1, 0},
     FLASHGEN_MASK_CAUSAL_TOP_LEFT, 0.0f},
    {"one partial query block and key block, custom scale", AttentionShape{1, 77, 77, 2, 2, 0},
     FLASHGEN_MASK_CAUSAL, 0.2f},
};

// One problem at one (dtype, head_dim, mask): contiguous [b, s, h, d] 16-bit inputs and the references.
struct PreparedProblem {
  std::string description;
  AttentionShape shape;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  float softmax_scale = 0.0f;
  std::vector<uint16_t> q, k, v;
  flashgen::test::ForwardReference reference;
};

PreparedProblem prepare(const ConfigProblem& problem, uint32_t problem_index, const KernelConfig& config) {
  PreparedProblem prepared;
  prepared.shape = problem.shape;
  prepared.shape.head_dim = config.head_dim;
  prepared.dtype = config.dtype == DType::kBFloat16 ? FLASHGEN_BFLOAT16 : FLASHGEN_FLOAT16;
  prepared.mask = config.mask == MaskKind::kCausal ? problem.causal_mask : FLASHGEN_MASK_NONE;
  prepared.softmax_scale = problem.softmax_scale;
  const AttentionShape& s = prepared.shape;
  std::ostringstream description;
  description << problem.what << ": b=" << s.batch << " sq=" << s.seqlen_q << " sk=" << s.seqlen_k
              << " hq=" << s.heads_q << " hkv=" << s.heads_kv << " d=" << s.head_dim << " "
              << flashgen::test::dtype_label(prepared.dtype) << " mask=" << flashgen::test::mask_label(prepared.mask)
              << " scale=" << (problem.softmax_scale > 0.0f ? std::to_string(problem.softmax_scale) : "default");
  prepared.description = description.str();

  flashgen::test::Rng rng(9000u + 1000u * problem_index + 10u * static_cast<uint32_t>(s.head_dim) +
                          static_cast<uint32_t>(prepared.dtype));
  const StridedView q_view = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const StridedView kv_view = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  const std::vector<double> q = flashgen::test::normal_values(rng, q_view.elements(), prepared.dtype);
  const std::vector<double> k = flashgen::test::normal_values(rng, kv_view.elements(), prepared.dtype);
  const std::vector<double> v = flashgen::test::normal_values(rng, kv_view.elements(), prepared.dtype);
  prepared.q.resize(static_cast<size_t>(q_view.elements()));
  prepared.k.resize(static_cast<size_t>(kv_view.elements()));
  prepared.v.resize(static_cast<size_t>(kv_view.elements()));
  flashgen::test::store_values(q, q_view, 0, prepared.dtype, prepared.q);
  flashgen::test::store_values(k, kv_view, 0, prepared.dtype, prepared.k);
  flashgen::test::store_values(v, kv_view, 0, prepared.dtype, prepared.v);
  const double scale = flashgen::effective_softmax_scale(problem.softmax_scale, s.head_dim);
  prepared.reference = flashgen::test::forward_reference(s, q, k, v, scale, prepared.mask, prepared.dtype);
  return prepared;
}

// Launches config on the prepared problem on the legacy default stream with poisoned out and lse, then
// checks both. The caller holds a ScopedContext.
void run_config(const KernelConfig& config, const PreparedProblem& prepared) {
  const AttentionShape& s = prepared.shape;
  const StridedView q_view = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const StridedView kv_view = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  DeviceBuffer q(prepared.q.size() * sizeof(uint16_t));
  DeviceBuffer k(prepared.k.size() * sizeof(uint16_t));
  DeviceBuffer v(prepared.v.size() * sizeof(uint16_t));
  q.upload(prepared.q);
  k.upload(prepared.k);
  v.upload(prepared.v);
  DeviceBuffer out(static_cast<size_t>(q_view.elements() + kGuardElements) * sizeof(uint16_t));
  out.fill_bytes(0xFF);
  DeviceBuffer lse(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q + kGuardElements) * sizeof(float));
  lse.fill_bytes(0xFF);

  const flashgen_tensor q_tensor = make_tensor(q, 0, q_view, prepared.dtype);
  const flashgen_tensor k_tensor = make_tensor(k, 0, kv_view, prepared.dtype);
  const flashgen_tensor v_tensor = make_tensor(v, 0, kv_view, prepared.dtype);
  const flashgen_tensor out_tensor = make_tensor(out, 0, q_view, prepared.dtype);
  flashgen_attention_options options{};
  options.softmax_scale = prepared.softmax_scale;
  options.mask = prepared.mask;
  try {
    const flashgen::ForwardCall problem = flashgen::make_forward_call(
        &q_tensor, &k_tensor, &v_tensor, &out_tensor, static_cast<float*>(lse.data()), &options);
    flashgen::launch_forward(problem, nullptr, config);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());  // a kernel fault surfaces here, naming the call
  } catch (const flashgen::Error& error) {
    FAIL_CHECK("launch failed: " << error.what());
    return;
  }
  const std::vector<uint16_t> out_storage = out.download_all<uint16_t>();
  const std::vector<float> lse_storage = lse.download_all<float>();
  check_reports(flashgen::test::check_forward(prepared.reference, out_storage, q_view, &lse_storage));
}

}  // namespace

TEST_CASE("config sweep holds every default candidate and each tile axis value", "[configs]") {
  for (int arch : {80, 86, 89, 90}) {
    INFO("sm_" << arch);
    const std::vector<KernelConfig> configs = configs_under_test(arch);
    CHECK(configs.size() <= 88);  // sm_90: the sm80 and sm90 families' first choices at 6 head_dims, 2 dtypes, 2 masks
    std::set<std::string> names;
    std::set<int> stages, block_ns, warps, q_in_regs, dtype_masks;
    for (const KernelConfig& c : configs) {
      INFO(c.name());
      CHECK_FALSE(c.invalid_reason(arch).has_value());
      CHECK(names.insert(c.name()).second);
      dtype_masks.insert(static_cast<int>(c.dtype) * 2 + static_cast<int>(c.mask));
      const flashgen::Sm80Knobs* k = c.sm80();
      if (k == nullptr) continue;  // the axes below are the sm80 family's
      stages.insert(c.stages);
      block_ns.insert(c.block_n);
      warps.insert(k->warps);
      q_in_regs.insert(k->q_in_regs ? 1 : 0);
    }
    for (const KernelConfig& c : flashgen::default_forward_candidates(arch)) CHECK(names.count(c.name()) == 1);
    CHECK(stages == std::set<int>{2, 3, 4});
    CHECK(block_ns == std::set<int>{16, 32, 48, 64, 128});
    CHECK(warps == std::set<int>{4, 8});
    CHECK(q_in_regs == std::set<int>{0, 1});
    CHECK(dtype_masks.size() == 4);
  }
}

TEST_CASE("every default candidate and tile variant matches the float64 reference", "[gpu][configs]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  const int arch = flashgen::device_sm(context.device());
  if (arch < 80) FLASHGEN_SKIP_TEST("the sm80 kernel family needs sm_80 or newer; this is sm_" + std::to_string(arch));
  const std::vector<KernelConfig> configs = configs_under_test(arch);
  INFO("sm_" << arch << ": " << configs.size() << " configs");
  CHECK(configs.size() <= 88);
  // Inputs and references depend on (dtype, head_dim, mask) and the problem, not on the tile.
  std::map<std::string, PreparedProblem> prepared;
  for (const KernelConfig& config : configs) {
    for (uint32_t i = 0; i < sizeof(kProblems) / sizeof(kProblems[0]); ++i) {
      const std::string key = std::string(flashgen::dtype_name(config.dtype)) + "_d" +
                              std::to_string(config.head_dim) + (config.mask == MaskKind::kCausal ? "_causal_" : "_") +
                              std::to_string(i);
      auto found = prepared.find(key);
      if (found == prepared.end()) found = prepared.emplace(key, prepare(kProblems[i], i, config)).first;
      INFO(config.name() << " on " << found->second.description);
      run_config(config, found->second);
    }
  }
}
