// [gpu] numerics of flashgen_attention_forward through the C ABI: masking edge cases, a deterministic
// randomized matrix (seqlens, head_dims, dtypes, masks, GQA/MQA, layouts, scales), the smallest and
// largest odd head_dims, strided layouts, lse NULL, user streams, back-to-back seqlens and logits shaped to
// drive the kernel's lazy rescaling, each checked against the float64 reference. The [sm90] cases run the
// same problems on every built-in config of the Hopper family explicitly. The CPU cases check that the
// matrix and the logit shapes are what the [gpu] cases claim. One [sm90] case checks that inputs TMA cannot
// describe (a batch stride of 0) run on the sm80 family instead.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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
#include "support/parallel.hpp"
#include "tuner/heuristic.hpp"

namespace {

using flashgen::AttentionShape;
using flashgen::DeviceBuffer;
using flashgen::StridedView;
using flashgen::test::ForwardCheck;
using flashgen::test::check_reports;
using flashgen::test::Rng;

// Memory layouts of q, k, v and out; the shape handed to flashgen is always [b, s, h, d].
enum class Layout {
  kBSHD,       // contiguous [b, s, h, d]
  kBHSD,       // memory [b, h, s, d]
  kPadded,     // [b, s, h, d] with gaps after every head, row and batch, filled with NaN
  kPackedQKV,  // q, k, v slices of one [b, s, heads_q + 2 * heads_kv, d] buffer (seqlen_q == seqlen_k);
               // out padded as kPadded
};

const char* layout_label(Layout layout) {
  switch (layout) {
    case Layout::kBHSD:
      return "BHSD";
    case Layout::kPadded:
      return "padded";
    case Layout::kPackedQKV:
      return "packed-qkv";
    default:
      return "BSHD";
  }
}

// What the inputs hold. The kernel keeps a running row max m in log2 units that moves only when a key
// block's max exceeds it by more than 8, rescaling O by exp2(m_old - m_new) (templates/fwd_sm80.cuh);
// with random normal inputs m never moves after the first block. The shaped kinds set each key's logit
// (in log2 units, before noise of ~0.14) so that it does; running_max_stats replays m on the data to
// check that.
enum class Logits {
  kNormal,   // q, k, v standard normal
  kRising,   // logits climb from 0 to 48 along the keys: m moves every few blocks, over a live history
  kPlateau,  // key 5 peaks at 16, keys in the middle third sit at 22.5, the rest at 0: m never moves
             // after the first block, and later blocks have P = exp2(s - m) up to ~2^6.5, not <= 1
  kJump,     // 0 for the first half of the keys, 20 for the second: m moves once, by ~20, mid-sequence
};

const char* logits_label(Logits logits) {
  switch (logits) {
    case Logits::kRising:
      return "rising";
    case Logits::kPlateau:
      return "plateau";
    case Logits::kJump:
      return "jump";
    default:
      return "normal";
  }
}

struct Problem {
  AttentionShape shape;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  float softmax_scale = 0.0f;  // <= 0: the library's default 1/sqrt(head_dim)
  Layout layout = Layout::kBSHD;
  bool with_lse = true;
  Logits logits = Logits::kNormal;
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
    s << "b=" << shape.batch << " sq=" << shape.seqlen_q << " sk=" << shape.seqlen_k << " hq=" << shape.heads_q
      << " hkv=" << shape.heads_kv << " d=" << shape.head_dim << " " << flashgen::test::dtype_label(dtype)
      << " mask=" << flashgen::test::mask_label(mask) << " scale=";
    if (softmax_scale > 0.0f) {
      s << softmax_scale;
    } else {
      s << "default(" << softmax_scale << ")";
    }
    s << " layout=" << layout_label(layout) << " lse=" << (with_lse ? "yes" : "NULL");
    if (logits != Logits::kNormal) s << " logits=" << logits_label(logits);
    s << " seed=" << seed;
    return s.str();
  }
};

// Elements of NaN after every buffer: writes past the end show up as overwritten guard.
constexpr int64_t kGuardElements = 64;

// Where one tensor lives: its buffer, its first element and its strides.
struct Placement {
  int buffer = 0;
  int64_t base = 0;  // elements from the buffer start; keeps 16-byte alignment (a multiple of 8)
  StridedView view;
};

struct ProblemLayout {
  Placement q, k, v;
  StridedView out;                     // in its own buffer, base 0
  std::vector<int64_t> input_elements; // size of each input buffer, guard included
  int64_t out_elements = 0;            // guard included
};

StridedView bhsd_view(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  StridedView view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  view.stride[0] = heads * seqlen * head_dim;
  view.stride[1] = head_dim;
  view.stride[2] = seqlen * head_dim;
  return view;
}

// Gaps of 8 elements after each head, 16 after each row and 32 after each batch: strides stay multiples
// of 8 as flashgen.h requires, and a kernel that reads past head_dim (e.g. to the 16-column mma step for
// d = 40, 72, 136) picks up NaN instead of a neighbour's finite values.
StridedView padded_view(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  StridedView view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  view.stride[2] = head_dim + 8;
  view.stride[1] = heads * view.stride[2] + 16;
  view.stride[0] = seqlen * view.stride[1] + 32;
  return view;
}

ProblemLayout make_layout(const Problem& p) {
  const AttentionShape& s = p.shape;
  ProblemLayout layout;
  auto separate = [&](StridedView (*make)(int64_t, int64_t, int64_t, int64_t)) {
    layout.q = Placement{0, 0, make(s.batch, s.seqlen_q, s.heads_q, s.head_dim)};
    layout.k = Placement{1, 0, make(s.batch, s.seqlen_k, s.heads_kv, s.head_dim)};
    layout.v = Placement{2, 0, make(s.batch, s.seqlen_k, s.heads_kv, s.head_dim)};
    layout.out = make(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    layout.input_elements = {layout.q.view.span() + kGuardElements, layout.k.view.span() + kGuardElements,
                             layout.v.view.span() + kGuardElements};
  };
  switch (p.layout) {
    case Layout::kBSHD:
      separate(&StridedView::contiguous);
      break;
    case Layout::kBHSD:
      separate(&bhsd_view);
      break;
    case Layout::kPadded:
      separate(&padded_view);
      break;
    case Layout::kPackedQKV: {
      REQUIRE(s.seqlen_q == s.seqlen_k);
      const int64_t width = (s.heads_q + 2 * s.heads_kv) * s.head_dim;  // one packed row
      auto slice = [&](int64_t heads) {
        StridedView view = StridedView::contiguous(s.batch, s.seqlen_q, heads, s.head_dim);
        view.stride[1] = width;
        view.stride[0] = s.seqlen_q * width;
        return view;
      };
      layout.q = Placement{0, 0, slice(s.heads_q)};
      layout.k = Placement{0, s.heads_q * s.head_dim, slice(s.heads_kv)};
      layout.v = Placement{0, (s.heads_q + s.heads_kv) * s.head_dim, slice(s.heads_kv)};
      layout.out = padded_view(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
      layout.input_elements = {s.batch * s.seqlen_q * width + kGuardElements};
      break;
    }
  }
  layout.out_elements = layout.out.span() + kGuardElements;
  return layout;
}

// Host side of one problem: 16-bit images of the input buffers (NaN outside the tensors) and the same
// values as contiguous [b, s, h, d] doubles for the references.
struct HostProblem {
  ProblemLayout layout;
  std::vector<std::vector<uint16_t>> buffers;
  std::vector<double> q, k, v;
};

// Target logit of key j of a shaped problem, in log2 units with the softmax scale applied (see Logits).
double target_logit_log2(Logits logits, int64_t j, int64_t seqlen_k) {
  switch (logits) {
    case Logits::kRising:
      return 48.0 * static_cast<double>(j) / static_cast<double>(seqlen_k);
    case Logits::kPlateau:
      if (j == 5) return 16.0;  // in the first block for every block_n >= 16
      return 3 * j >= seqlen_k && 3 * j < 2 * seqlen_k ? 22.5 : 0.0;
    case Logits::kJump:
      return 2 * j >= seqlen_k ? 20.0 : 0.0;
    default:
      return 0.0;
  }
}

// Inputs of a shaped problem as contiguous [b, s, h, d] values rounded to dtype. Each (batch, kv head) has
// a sign vector u in {-1, +1}^d; its query rows are u + N(0, 0.05^2) noise per element and its key j is
// beta_j u + N(0, nu^2), so q . k_j ~ d beta_j: beta_j = target * ln 2 / (scale * d) puts the logit
// scale * q . k_j at the target, and nu = 0.1 / (scale * sqrt(d)) adds N(0, 0.1^2) to it. Values stay
// below ~5 in magnitude (at d 64 and default scale), far inside fp16's range. v is standard normal.
void make_shaped_inputs(const Problem& p, Rng& rng, std::vector<double>& q, std::vector<double>& k,
                        std::vector<double>& v) {
  const AttentionShape& s = p.shape;
  const int64_t d_count = s.head_dim;
  const double scale = flashgen::effective_softmax_scale(p.softmax_scale, d_count);
  std::vector<double> u(static_cast<size_t>(s.batch * s.heads_kv * d_count));
  for (double& sign : u) sign = rng.below(2) == 0 ? -1.0 : 1.0;
  auto sign = [&](int64_t b, int64_t hk, int64_t d) {
    return u[static_cast<size_t>((b * s.heads_kv + hk) * d_count + d)];
  };
  auto rounded = [&](double value) {
    return static_cast<double>(flashgen::round_to_dtype(static_cast<float>(value), p.dtype));
  };

  q.clear();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.seqlen_q; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t d = 0; d < d_count; ++d) q.push_back(rounded(sign(b, s.kv_head(h), d) + 0.05 * rng.normal()));
  const double nu = 0.1 / (scale * std::sqrt(static_cast<double>(d_count)));
  k.clear();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seqlen_k; ++j) {
      const double beta =
          target_logit_log2(p.logits, j, s.seqlen_k) * std::log(2.0) / (scale * static_cast<double>(d_count));
      for (int64_t hk = 0; hk < s.heads_kv; ++hk)
        for (int64_t d = 0; d < d_count; ++d) k.push_back(rounded(beta * sign(b, hk, d) + nu * rng.normal()));
    }
  v = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * d_count, p.dtype);
}

HostProblem make_host_problem(const Problem& p) {
  HostProblem host;
  host.layout = make_layout(p);
  for (int64_t elements : host.layout.input_elements)
    host.buffers.emplace_back(static_cast<size_t>(elements), flashgen::test::kPoison16);
  const AttentionShape& s = p.shape;
  Rng rng(p.seed);
  if (p.logits == Logits::kNormal) {
    host.q = flashgen::test::normal_values(rng, s.batch * s.seqlen_q * s.heads_q * s.head_dim, p.dtype);
    host.k = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * s.head_dim, p.dtype);
    host.v = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * s.head_dim, p.dtype);
  } else {
    make_shaped_inputs(p, rng, host.q, host.k, host.v);
  }
  auto store = [&](const Placement& placement, const std::vector<double>& values) {
    flashgen::test::store_values(values, placement.view, placement.base, p.dtype,
                                 host.buffers[static_cast<size_t>(placement.buffer)]);
  };
  store(host.layout.q, host.q);
  store(host.layout.k, host.k);
  store(host.layout.v, host.v);
  return host;
}

flashgen_tensor make_tensor(const DeviceBuffer& buffer, int64_t base, const StridedView& view, flashgen_dtype dtype) {
  flashgen_tensor tensor{};
  tensor.data = buffer.data(static_cast<size_t>(base) * sizeof(uint16_t));
  tensor.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    tensor.shape[i] = view.shape[i];
    tensor.stride[i] = view.stride[i];
  }
  return tensor;
}

// The problem's input buffers, uploaded.
std::vector<DeviceBuffer> upload_inputs(const HostProblem& host) {
  std::vector<DeviceBuffer> inputs;
  for (const std::vector<uint16_t>& image : host.buffers) {
    inputs.emplace_back(image.size() * sizeof(uint16_t));
    inputs.back().upload(image);
  }
  return inputs;
}

// q, k and v over the uploaded inputs.
struct InputTensors {
  flashgen_tensor q, k, v;
};
InputTensors input_tensors(const std::vector<DeviceBuffer>& in, const ProblemLayout& layout, flashgen_dtype dtype) {
  auto tensor = [&](const Placement& at) {
    return make_tensor(in[static_cast<size_t>(at.buffer)], at.base, at.view, dtype);
  };
  return {tensor(layout.q), tensor(layout.k), tensor(layout.v)};
}

// Runs one problem on stream (NULL: the legacy default stream) and checks out and lse against the float64
// reference with the naive-dtype error budget: through the C ABI when configs is empty, else once per
// config through launch_forward, outputs poisoned before each run. The caller holds a ScopedContext.
void run_and_check(const Problem& p, CUstream stream = nullptr,
                   const std::vector<flashgen::KernelConfig>& configs = {}) {
  const HostProblem host = make_host_problem(p);
  const ProblemLayout& layout = host.layout;
  const AttentionShape& s = p.shape;

  const std::vector<DeviceBuffer> inputs = upload_inputs(host);
  DeviceBuffer out(static_cast<size_t>(layout.out_elements) * sizeof(uint16_t));
  const int64_t lse_count = s.batch * s.heads_q * s.seqlen_q;
  DeviceBuffer lse;
  if (p.with_lse) lse = DeviceBuffer(static_cast<size_t>(lse_count + kGuardElements) * sizeof(float));

  const auto [q, k, v] = input_tensors(inputs, layout, p.dtype);
  const flashgen_tensor o = make_tensor(out, 0, layout.out, p.dtype);
  flashgen_attention_options options{};
  options.softmax_scale = p.softmax_scale;
  options.mask = p.mask;
  options.deterministic = 0;
  float* lse_ptr = p.with_lse ? static_cast<float*>(lse.data()) : nullptr;

  const double scale = flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim);
  const flashgen::test::ForwardReference reference =
      flashgen::test::forward_reference(s, host.q, host.k, host.v, scale, p.mask, p.dtype);

  // One run: poison, launch (config null: the C ABI's own choice), check.
  auto run_once = [&](const flashgen::KernelConfig* config) {
    out.fill_bytes(0xFF);
    if (p.with_lse) lse.fill_bytes(0xFF);
    // Copies and memsets ran on the legacy stream; a non-blocking user stream does not wait for them.
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    if (config == nullptr) {
      const int status = flashgen_attention_forward(&q, &k, &v, &o, lse_ptr, &options, stream);
      if (status != FLASHGEN_SUCCESS) {
        FAIL_CHECK("flashgen_attention_forward returned " << status << ": " << flashgen_last_error());
        return;
      }
    } else {
      INFO("config " << config->name());
      flashgen::launch_forward(flashgen::make_forward_call(&q, &k, &v, &o, lse_ptr, &options), stream, *config);
    }
    if (stream != nullptr) FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    FLASHGEN_CU_CHECK(cuCtxSynchronize());  // also surfaces a kernel fault as an exception naming it

    const std::vector<uint16_t> out_storage = out.download_all<uint16_t>();
    std::vector<float> lse_values;
    if (p.with_lse) lse_values = lse.download_all<float>();
    INFO((config != nullptr ? "config " + config->name() : std::string("the C ABI's choice")));
    check_reports(
        flashgen::test::check_forward(reference, out_storage, layout.out, p.with_lse ? &lse_values : nullptr));
  };
  if (configs.empty()) {
    run_once(nullptr);
  } else {
    for (const flashgen::KernelConfig& config : configs) run_once(&config);
  }
}

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

// Skips the current case unless the context's device runs sm_90a kernels.
#define FLASHGEN_REQUIRE_SM90(context)                                                             \
  do {                                                                                             \
    if (flashgen::device_sm((context).device()) != 90) FLASHGEN_SKIP_TEST("the sm90 family needs sm_90"); \
  } while (0)

// Keeps each problem's CPU references (two passes of b * hq * sq * sk * d multiply-adds each, float64
// and float32) to a fraction of a second.
constexpr double kMaxReferenceCost = 6e7;
constexpr int kMqa = 0;  // group code for heads_kv = 1 with several query heads

// The randomized matrix: every head_dim (the standard ones three times, 40/72/136 once), both dtypes,
// the three masks, GQA groups 1/2/4 and MQA, both plain layouts and custom or default scales, each list
// balanced then shuffled so the combinations vary; seqlens drawn independently for q and k. Batch, heads
// and finally the seqlens give way when the reference would cost too much.
std::vector<Problem> randomized_matrix(uint32_t seed) {
  Rng rng(seed);
  std::vector<int64_t> head_dims;
  for (int64_t d : {32, 64, 96, 128, 192, 256})
    for (int repeat = 0; repeat < 3; ++repeat) head_dims.push_back(d);
  for (int64_t d : {40, 72, 136}) head_dims.push_back(d);
  const size_t count = head_dims.size();
  auto balanced = [&](auto values) {
    decltype(values) list;
    for (size_t i = 0; i < count; ++i) list.push_back(values[i % values.size()]);
    rng.shuffle(list);
    return list;
  };
  rng.shuffle(head_dims);
  const auto dtypes = balanced(std::vector<flashgen_dtype>{FLASHGEN_FLOAT16, FLASHGEN_BFLOAT16});
  const auto masks = balanced(
      std::vector<flashgen_mask>{FLASHGEN_MASK_NONE, FLASHGEN_MASK_CAUSAL, FLASHGEN_MASK_CAUSAL_TOP_LEFT});
  const auto groups = balanced(std::vector<int>{1, 2, 4, kMqa});
  const auto layouts = balanced(std::vector<Layout>{Layout::kBSHD, Layout::kBHSD});
  const auto scales = balanced(std::vector<float>{0.0f, -1.0f, 0.05f, 0.3f});  // <= 0: default
  const std::vector<int64_t> seqlens = {1, 7, 64, 113, 128, 203, 256, 1023, 2049};

  std::vector<Problem> problems;
  for (size_t i = 0; i < count; ++i) {
    Problem p;
    p.shape.head_dim = head_dims[i];
    p.dtype = dtypes[i];
    p.mask = masks[i];
    p.layout = layouts[i];
    p.softmax_scale = scales[i];
    p.seed = seed + 1u + static_cast<uint32_t>(i);
    for (;;) {
      p.shape.seqlen_q = seqlens[rng.below(static_cast<uint32_t>(seqlens.size()))];
      p.shape.seqlen_k = seqlens[rng.below(static_cast<uint32_t>(seqlens.size()))];
      p.shape.batch = 1 + rng.below(3);
      if (groups[i] == kMqa) {
        p.shape.heads_kv = 1;
        p.shape.heads_q = std::vector<int64_t>{2, 3, 5, 8}[rng.below(4)];
      } else {
        p.shape.heads_kv = 1 + rng.below(static_cast<uint32_t>(8 / groups[i]));
        p.shape.heads_q = groups[i] * p.shape.heads_kv;
      }
      while (p.shape.reference_cost() > kMaxReferenceCost) {
        if (p.shape.batch > 1) {
          --p.shape.batch;
        } else if (groups[i] == kMqa && p.shape.heads_q > 2) {
          --p.shape.heads_q;
        } else if (groups[i] != kMqa && p.shape.heads_kv > 1) {
          --p.shape.heads_kv;
          p.shape.heads_q = groups[i] * p.shape.heads_kv;
        } else {
          break;
        }
      }
      if (p.shape.reference_cost() <= kMaxReferenceCost) break;  // else draw other seqlens
    }
    problems.push_back(p);
  }
  return problems;
}

constexpr uint32_t kMatrixSeed = 20250611u;

Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                     int64_t head_dim, flashgen_dtype dtype, flashgen_mask mask, uint32_t seed) {
  Problem p;
  p.shape = AttentionShape{batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim};
  p.dtype = dtype;
  p.mask = mask;
  p.seed = seed;
  return p;
}

// The shaped problems of the rescaling test: each logit shape at head_dim 64 and 128, both dtypes, with
// no mask and with bottom-right causal (query row i then sees the first i + 871 of the 1000 keys), GQA
// 2:1. 1000 keys leave a partial last block for every block_n.
std::vector<Problem> rescale_problems() {
  struct Variant {
    int64_t head_dim;
    flashgen_dtype dtype;
    flashgen_mask mask;
  };
  const Variant variants[] = {{64, FLASHGEN_FLOAT16, FLASHGEN_MASK_NONE},
                              {64, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL},
                              {128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_NONE},
                              {128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL}};
  std::vector<Problem> problems;
  uint32_t seed = 700;
  for (Logits logits : {Logits::kRising, Logits::kPlateau, Logits::kJump}) {
    for (const Variant& variant : variants) {
      Problem p = make_problem(1, 130, 1000, 2, 1, variant.head_dim, variant.dtype, variant.mask, ++seed);
      p.logits = logits;
      problems.push_back(p);
    }
  }
  return problems;
}

// templates/fwd_sm80.cuh's kRescaleSlack: the running max moves only when a block's max exceeds it by more.
constexpr double kRescaleSlack = 8.0;

// The kernel's running max replayed on the host over every row that sees a key, for key blocks of one
// block_n, on float64 logits of the stored inputs (log2 units, scale applied).
struct RunningMaxStats {
  int64_t min_moves = std::numeric_limits<int64_t>::max();  // moves after a row's first block
  int64_t max_moves = 0;
  double largest_move = 0.0;  // m_new - m_old of one of those moves
  double largest_p_log2 = -std::numeric_limits<double>::infinity();  // largest s - m: P = exp2(s - m)

  std::string describe() const {
    std::ostringstream s;
    s << "moves after the first block: " << min_moves << ".." << max_moves << " per row, largest move "
      << largest_move << ", largest P 2^" << largest_p_log2;
    return s.str();
  }
};

std::vector<RunningMaxStats> running_max_stats(const Problem& p, const HostProblem& host,
                                               const std::vector<int>& block_ns) {
  const AttentionShape& s = p.shape;
  const double scale_log2 = flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim) / std::log(2.0);
  std::vector<RunningMaxStats> stats(block_ns.size());
  std::vector<double> logits(static_cast<size_t>(s.seqlen_k));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t visible = flashgen::visible_key_count(p.mask, i, s.seqlen_q, s.seqlen_k);
        if (visible == 0) continue;
        const double* q_row = host.q.data() + ((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim;
        for (int64_t j = 0; j < visible; ++j) {
          const double* k_row = host.k.data() + ((b * s.seqlen_k + j) * s.heads_kv + s.kv_head(h)) * s.head_dim;
          double dot = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d) dot += q_row[d] * k_row[d];
          logits[static_cast<size_t>(j)] = dot * scale_log2;
        }
        for (size_t n = 0; n < block_ns.size(); ++n) {
          RunningMaxStats& row_stats = stats[n];
          double m = -std::numeric_limits<double>::infinity();
          int64_t moves = -1;  // the first block always moves m off -inf; that one is not counted
          for (int64_t start = 0; start < visible; start += block_ns[n]) {
            const auto first = logits.begin() + start;
            const auto last = first + std::min<int64_t>(block_ns[n], visible - start);
            const double block_max = *std::max_element(first, last);
            if (block_max > m + kRescaleSlack) {
              if (moves >= 0) row_stats.largest_move = std::max(row_stats.largest_move, block_max - m);
              m = block_max;
              ++moves;
            }
            row_stats.largest_p_log2 = std::max(row_stats.largest_p_log2, block_max - m);
          }
          row_stats.min_moves = std::min(row_stats.min_moves, moves);
          row_stats.max_moves = std::max(row_stats.max_moves, moves);
        }
      }
  return stats;
}

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

}  // namespace

// Masking edge cases: fully masked rows, both alignments, extreme seqlen ratios, a sharp softmax.
std::vector<Problem> masking_edge_problems() {
  const flashgen_dtype f16 = FLASHGEN_FLOAT16;
  const flashgen_dtype bf16 = FLASHGEN_BFLOAT16;
  const flashgen_mask br = FLASHGEN_MASK_CAUSAL;
  const flashgen_mask tl = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  std::vector<Problem> problems = {
      // seqlen_q > seqlen_k bottom-right: query rows 0..195 see no key (out 0, lse -inf).
      make_problem(2, 203, 7, 4, 2, 64, f16, br, 101),
      make_problem(1, 203, 7, 2, 1, 128, bf16, tl, 102),
      // seqlen_q < seqlen_k: bottom-right row 0 sees 197 keys, top-left row 0 sees one.
      make_problem(2, 7, 203, 2, 2, 64, bf16, br, 103),
      make_problem(1, 7, 203, 4, 1, 128, f16, tl, 104),
      // One query against a long key sequence; a long query sequence against one key.
      make_problem(3, 1, 2049, 8, 2, 128, f16, br, 105),
      make_problem(1, 2049, 1, 2, 1, 64, bf16, br, 106),  // only the last row sees a key
      make_problem(1, 2049, 1, 2, 1, 64, f16, tl, 107),   // every row sees key 0: out = v[0]
      // The longest sequences (one pass of the reference ~ 6.7e7 multiply-adds after masking).
      make_problem(1, 2049, 2049, 1, 1, 32, f16, br, 108),
      make_problem(1, 2049, 1023, 2, 1, 32, bf16, FLASHGEN_MASK_NONE, 109),
      // MQA with an odd group, and seqlen_q > seqlen_k with most rows masked at d = 192.
      make_problem(2, 113, 1023, 3, 1, 96, f16, br, 110),
      make_problem(1, 1023, 113, 2, 2, 256, bf16, tl, 111),
      make_problem(1, 1023, 113, 2, 1, 192, f16, br, 112),
  };
  Problem scaled = make_problem(2, 64, 64, 2, 1, 256, f16, FLASHGEN_MASK_NONE, 113);
  scaled.softmax_scale = 0.5f;  // logits with std ~8: a sharp softmax
  problems.push_back(scaled);
  return problems;
}

// Strided layouts: BHSD, padded rows/heads/batches, q/k/v slices of one packed buffer.
std::vector<Problem> layout_problems() {
  std::vector<Problem> problems = {
      make_problem(2, 256, 203, 4, 2, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 201),
      make_problem(2, 113, 1023, 4, 1, 72, FLASHGEN_BFLOAT16, FLASHGEN_MASK_NONE, 202),
      make_problem(1, 203, 64, 2, 2, 40, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 203),
      make_problem(2, 256, 256, 4, 4, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 204),
      make_problem(1, 113, 113, 4, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_NONE, 205),
  };
  problems[0].layout = Layout::kBHSD;
  problems[1].layout = Layout::kPadded;
  problems[2].layout = Layout::kPadded;
  problems[3].layout = Layout::kPackedQKV;  // q slice of a [b, s, 3 * heads * d] qkv buffer
  problems[4].layout = Layout::kPackedQKV;  // with GQA: [b, s, (4 + 2 + 2) * d]
  problems[4].softmax_scale = 0.1f;
  return problems;
}

TEST_CASE("randomized attention matrix covers every parameter", "[attention]") {
  const std::vector<Problem> problems = randomized_matrix(kMatrixSeed);
  std::set<int64_t> head_dims;
  std::set<int> dtypes, masks, layouts;
  std::set<int64_t> groups;
  bool mqa = false, custom_scale = false, default_scale = false;
  for (const Problem& p : problems) {
    INFO(p.describe());
    CHECK(p.shape.reference_cost() <= kMaxReferenceCost);
    CHECK(p.shape.heads_q % p.shape.heads_kv == 0);
    CHECK(p.shape.heads_q <= 8);
    CHECK(p.shape.batch >= 1);
    CHECK(p.shape.batch <= 3);
    head_dims.insert(p.shape.head_dim);
    dtypes.insert(p.dtype);
    masks.insert(p.mask);
    layouts.insert(static_cast<int>(p.layout));
    groups.insert(p.shape.heads_q / p.shape.heads_kv);
    mqa = mqa || (p.shape.heads_kv == 1 && p.shape.heads_q > 1);
    (p.softmax_scale > 0.0f ? custom_scale : default_scale) = true;
  }
  CHECK(head_dims == std::set<int64_t>{32, 40, 64, 72, 96, 128, 136, 192, 256});
  CHECK(dtypes.size() == 2);
  CHECK(masks.size() == 3);
  CHECK(layouts.size() == 2);
  CHECK(groups.count(1) == 1);
  CHECK(groups.count(2) == 1);
  CHECK(groups.count(4) == 1);
  CHECK(mqa);
  CHECK(custom_scale);
  CHECK(default_scale);
  // The same seed gives the same matrix: a failure names a problem that can be rerun.
  const std::vector<Problem> again = randomized_matrix(kMatrixSeed);
  REQUIRE(again.size() == problems.size());
  for (size_t i = 0; i < problems.size(); ++i) CHECK(again[i].describe() == problems[i].describe());
}

TEST_CASE("attention forward: causal alignment and fully masked rows", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (const Problem& p : masking_edge_problems()) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: randomized matrix against the float64 reference", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (const Problem& p : randomized_matrix(kMatrixSeed)) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: BHSD, padded and packed-qkv strides", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (const Problem& p : layout_problems()) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: lse may be NULL", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // The second has fully masked rows: without lse their out must still be 0.
  std::vector<Problem> problems = {
      make_problem(2, 128, 256, 4, 2, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 301),
      make_problem(1, 203, 7, 2, 1, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 302),
  };
  for (Problem& p : problems) {
    p.with_lse = false;
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: runs on a stream from cuStreamCreate", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (unsigned flags : {static_cast<unsigned>(CU_STREAM_DEFAULT), static_cast<unsigned>(CU_STREAM_NON_BLOCKING)}) {
    Stream stream(flags);
    Problem p = make_problem(2, 256, 1023, 4, 1, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 401 + flags);
    INFO("stream flags " << flags << ": " << p.describe());
    run_and_check(p, stream.get());
  }
}

TEST_CASE("attention forward: back-to-back calls with different seqlens", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // One kernel config (bf16, d 128, causal) with batch and seqlens changing between calls, then the first
  // problem again: sequence lengths are runtime arguments, nothing may be stale.
  const std::vector<Problem> problems = {
      make_problem(1, 128, 128, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 501),
      make_problem(3, 1023, 203, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 502),
      make_problem(2, 7, 2049, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 503),
      make_problem(1, 113, 64, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 504),
      make_problem(1, 128, 128, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 501),
  };
  for (const Problem& p : problems) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("shaped logits move the kernel's running max as the rescaling test claims", "[attention]") {
  const std::vector<int> block_ns = {16, 32, 48, 64, 128};  // every block_n a config may use here
  for (const Problem& p : rescale_problems()) {
    INFO(p.describe());
    const HostProblem host = make_host_problem(p);
    double largest = 0.0;
    for (const std::vector<double>* values : {&host.q, &host.k, &host.v})
      for (double value : *values) largest = std::max(largest, std::fabs(value));
    CHECK(largest < 16.0);  // inputs far inside fp16's range (65504)
    const std::vector<RunningMaxStats> stats = running_max_stats(p, host, block_ns);
    for (size_t n = 0; n < block_ns.size(); ++n) {
      INFO("block_n " << block_ns[n] << ": " << stats[n].describe());
      switch (p.logits) {
        case Logits::kRising:
          CHECK(stats[n].min_moves >= 3);
          break;
        case Logits::kPlateau:
          CHECK(stats[n].max_moves == 0);
          CHECK(stats[n].largest_p_log2 >= 5.0);
          break;
        case Logits::kJump:
          CHECK(stats[n].min_moves == 1);
          CHECK(stats[n].max_moves == 1);
          CHECK(stats[n].largest_move >= 16.0);
          break;
        default:
          FAIL_CHECK("not a shaped problem");
      }
    }
  }
}

TEST_CASE("check_forward passes an exact output and flags each kind of damage", "[attention]") {
  for (Layout layout : {Layout::kBSHD, Layout::kPadded, Layout::kPackedQKV}) {
    Problem p = make_problem(2, 64, 64, 4, 2, 40, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 901);
    p.layout = layout;
    INFO(p.describe());
    const HostProblem host = make_host_problem(p);
    const AttentionShape& s = p.shape;
    const flashgen::test::ForwardReference reference = flashgen::test::forward_reference(
        s, host.q, host.k, host.v, flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim), p.mask, p.dtype);

    // What an exact kernel leaves in poisoned buffers: the float64 result rounded to the dtype, lse as float.
    std::vector<uint16_t> out_storage(static_cast<size_t>(host.layout.out_elements), flashgen::test::kPoison16);
    std::vector<double> exact_out = reference.ref64.out;
    for (double& value : exact_out) value = flashgen::round_to_dtype(static_cast<float>(value), p.dtype);
    flashgen::test::store_values(exact_out, host.layout.out, 0, p.dtype, out_storage);
    float poison = 0.0f;
    std::memcpy(&poison, &flashgen::test::kPoison32, sizeof(poison));
    std::vector<float> lse(reference.ref64.lse.size() + kGuardElements, poison);
    for (size_t i = 0; i < reference.ref64.lse.size(); ++i) lse[i] = static_cast<float>(reference.ref64.lse[i]);

    const ForwardCheck exact = flashgen::test::check_forward(reference, out_storage, host.layout.out, &lse);
    INFO(exact.out.text << "\n" << exact.out_touched_text << "\n" << exact.lse.text << "\n" << exact.lse_touched_text);
    CHECK(exact.ok());
    CHECK(exact.out.checked == static_cast<int64_t>(reference.ref64.out.size()));
    CHECK_FALSE(flashgen::test::check_forward(reference, out_storage, host.layout.out, nullptr).has_lse);

    std::vector<uint16_t> damaged = out_storage;
    damaged[static_cast<size_t>(host.layout.out.offset(1, 63, 3, 39))] = flashgen::test::kPoison16;
    const ForwardCheck unwritten = flashgen::test::check_forward(reference, damaged, host.layout.out, &lse);
    CHECK(unwritten.out.not_written == 1);
    CHECK_FALSE(unwritten.ok());

    damaged = out_storage;
    damaged.back() = 0;  // the last guard element
    const ForwardCheck outside = flashgen::test::check_forward(reference, damaged, host.layout.out, &lse);
    CHECK(outside.out_touched == 1);
    CHECK(outside.out.ok);
    CHECK_FALSE(outside.ok());

    std::vector<float> bad_lse = lse;
    bad_lse[5] += 0.5f;
    bad_lse.back() = 0.0f;
    const ForwardCheck lse_damage = flashgen::test::check_forward(reference, out_storage, host.layout.out, &bad_lse);
    CHECK(lse_damage.lse.mismatches == 1);
    CHECK(lse_damage.lse_touched == 1);
    CHECK_FALSE(lse_damage.ok());
  }
}

TEST_CASE("attention forward: head_dim 8 and 248", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  const flashgen_dtype f16 = FLASHGEN_FLOAT16;
  const flashgen_dtype bf16 = FLASHGEN_BFLOAT16;
  const flashgen_mask none = FLASHGEN_MASK_NONE;
  const flashgen_mask br = FLASHGEN_MASK_CAUSAL;
  const flashgen_mask tl = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  // The smallest head_dim (padded to one 16-column mma step) and the largest non-standard one (padded to
  // 256). The padded layout puts NaN in the 8 columns after each head that the kernel pads to.
  std::vector<Problem> problems = {
      make_problem(2, 203, 64, 4, 2, 8, f16, br, 601),
      make_problem(1, 130, 1023, 2, 1, 8, bf16, none, 602),
      make_problem(1, 77, 77, 3, 1, 8, bf16, tl, 603),
      make_problem(1, 128, 128, 2, 1, 8, f16, br, 604),
      make_problem(1, 203, 7, 2, 1, 248, bf16, br, 605),  // rows 0..195 see no key
      make_problem(1, 130, 1023, 1, 1, 248, f16, tl, 606),
      make_problem(2, 113, 256, 2, 2, 248, f16, none, 607),
      make_problem(1, 64, 64, 2, 1, 248, bf16, br, 608),
  };
  problems[0].layout = Layout::kPadded;
  problems[2].layout = Layout::kBHSD;
  problems[2].softmax_scale = 0.3f;
  problems[3].layout = Layout::kPackedQKV;
  problems[4].layout = Layout::kPadded;
  problems[6].layout = Layout::kBHSD;
  problems[7].layout = Layout::kPackedQKV;
  for (const Problem& p : problems) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: running max moves over a history (lazy rescaling)", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // Logits that climb, plateau inside the rescale slack, or jump by ~20 in log2 units along the keys
  // (checked on the CPU by "shaped logits move the kernel's running max ..."): out and lse must still
  // match the float64 reference.
  for (const Problem& p : rescale_problems()) {
    INFO(p.describe());
    run_and_check(p);
  }
}

// Every sm90 built-in config over the problems above whose head_dim the family takes (64, 128, 192, 256).
// The configs are compiled first, on every core at once.
void run_sm90_family(const std::vector<Problem>& problems) {
  std::vector<flashgen::KernelConfig> all;
  std::set<std::string> names;
  for (const Problem& p : problems)
    for (const flashgen::KernelConfig& c : sm90_configs(p))
      if (names.insert(c.name()).second) all.push_back(c);
  flashgen::testing::parallel_for(all.size(), [&](size_t i) { flashgen::KernelRegistry::instance().compiled(all[i], 90); });
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
  flashgen_attention_options options{};
  options.mask = FLASHGEN_MASK_CAUSAL;
  const flashgen::ForwardLaunch launch = flashgen::attention_forward(
      make_tensor(q_buffer, 0, q_view, dtype), make_tensor(k_buffer, 0, kv_view, dtype),
      make_tensor(v_buffer, 0, kv_view, dtype), make_tensor(out, 0, out_view, dtype), static_cast<float*>(lse.data()),
      options, nullptr);
  INFO(launch.config.name() << ": " << launch.reason);
  CHECK(launch.config.family() == flashgen::KernelFamily::kSm80);
  CHECK(launch.reason.find("TMA cannot describe q") != std::string::npos);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());

  const double scale = flashgen::effective_softmax_scale(0.0f, shape.head_dim);
  const flashgen::test::ForwardReference reference =
      flashgen::test::forward_reference(shape, q, k, v, scale, options.mask, dtype);
  const std::vector<float> lse_values = lse.download_all<float>();
  check_reports(flashgen::test::check_forward(reference, out.download_all<uint16_t>(), out_view, &lse_values));
}
