// [gpu] numerics of flashgen_attention_forward through the C ABI: masking edge cases, a deterministic
// randomized matrix (seqlens, head_dims, dtypes, masks, GQA/MQA, layouts, scales), strided layouts, lse
// NULL, user streams and back-to-back seqlens, each checked against the float64 reference.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "cuda_driver.hpp"
#include "device_buffer.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "reference.hpp"
#include "support/attention_reference.hpp"

namespace {

using flashgen::AttentionResult;
using flashgen::AttentionShape;
using flashgen::DeviceBuffer;
using flashgen::HostInput;
using flashgen::StridedView;
using flashgen::test::CheckReport;

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

struct Problem {
  AttentionShape shape;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  float softmax_scale = 0.0f;  // <= 0: the library's default 1/sqrt(head_dim)
  Layout layout = Layout::kBSHD;
  bool with_lse = true;
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
    s << " layout=" << layout_label(layout) << " lse=" << (with_lse ? "yes" : "NULL") << " seed=" << seed;
    return s.str();
  }
};

// mt19937's output is fixed by the standard, unlike std's distributions and std::shuffle: with these
// mappings the matrix and the data are the same on every machine, so a failure reproduces anywhere.
class Rng {
 public:
  explicit Rng(uint32_t seed) : engine_(seed) {}
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(engine_() % n); }
  // Standard normal by Box-Muller.
  double normal() {
    const double u1 = (static_cast<double>(engine_()) + 1.0) / 4294967297.0;  // (0, 1]
    const double u2 = static_cast<double>(engine_()) / 4294967296.0;          // [0, 1)
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  template <typename T>
  void shuffle(std::vector<T>& values) {
    for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[below(static_cast<uint32_t>(i))]);
  }

 private:
  std::mt19937 engine_;
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

HostProblem make_host_problem(const Problem& p) {
  HostProblem host;
  host.layout = make_layout(p);
  for (int64_t elements : host.layout.input_elements)
    host.buffers.emplace_back(static_cast<size_t>(elements), flashgen::test::kPoison16);
  Rng rng(p.seed);
  auto fill = [&](const Placement& placement, std::vector<double>& values) {
    const StridedView& view = placement.view;
    values.resize(static_cast<size_t>(view.elements()));
    std::vector<uint16_t>& storage = host.buffers[static_cast<size_t>(placement.buffer)];
    size_t index = 0;
    for (int64_t b = 0; b < view.shape[0]; ++b)
      for (int64_t s = 0; s < view.shape[1]; ++s)
        for (int64_t h = 0; h < view.shape[2]; ++h)
          for (int64_t d = 0; d < view.shape[3]; ++d) {
            const uint16_t bits = flashgen::float_to_dtype_bits(static_cast<float>(rng.normal()), p.dtype);
            storage[static_cast<size_t>(placement.base + view.offset(b, s, h, d))] = bits;
            values[index++] = flashgen::dtype_bits_to_float(bits, p.dtype);
          }
  };
  fill(host.layout.q, host.q);
  fill(host.layout.k, host.k);
  fill(host.layout.v, host.v);
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

// Runs one problem through the C ABI on stream (NULL: the legacy default stream) and checks out and lse
// against the float64 reference with the naive-dtype error budget. The caller holds a ScopedContext.
void run_and_check(const Problem& p, CUstream stream = nullptr) {
  const HostProblem host = make_host_problem(p);
  const ProblemLayout& layout = host.layout;
  const AttentionShape& s = p.shape;

  std::vector<DeviceBuffer> inputs;
  for (const std::vector<uint16_t>& image : host.buffers) {
    inputs.emplace_back(image.size() * sizeof(uint16_t));
    inputs.back().upload(image);
  }
  DeviceBuffer out(static_cast<size_t>(layout.out_elements) * sizeof(uint16_t));
  out.fill_bytes(0xFF);
  const int64_t lse_count = s.batch * s.heads_q * s.seqlen_q;
  DeviceBuffer lse;
  if (p.with_lse) {
    lse = DeviceBuffer(static_cast<size_t>(lse_count + kGuardElements) * sizeof(float));
    lse.fill_bytes(0xFF);
  }
  // Copies and memsets ran on the legacy stream; a non-blocking user stream does not wait for them.
  FLASHGEN_CU_CHECK(cuCtxSynchronize());

  const flashgen_tensor q = make_tensor(inputs[static_cast<size_t>(layout.q.buffer)], layout.q.base, layout.q.view, p.dtype);
  const flashgen_tensor k = make_tensor(inputs[static_cast<size_t>(layout.k.buffer)], layout.k.base, layout.k.view, p.dtype);
  const flashgen_tensor v = make_tensor(inputs[static_cast<size_t>(layout.v.buffer)], layout.v.base, layout.v.view, p.dtype);
  const flashgen_tensor o = make_tensor(out, 0, layout.out, p.dtype);
  flashgen_attention_options options{};
  options.softmax_scale = p.softmax_scale;
  options.mask = p.mask;
  options.deterministic = 0;

  float* lse_ptr = p.with_lse ? static_cast<float*>(lse.data()) : nullptr;
  const int status = flashgen_attention_forward(&q, &k, &v, &o, lse_ptr, &options, stream);
  if (status != FLASHGEN_SUCCESS) {
    FAIL_CHECK("flashgen_attention_forward returned " << status << ": " << flashgen_last_error());
    return;
  }
  if (stream != nullptr) FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  FLASHGEN_CU_CHECK(cuCtxSynchronize());  // also surfaces a kernel fault as an exception naming it

  const std::vector<uint16_t> out_storage = out.download_all<uint16_t>();
  std::vector<float> lse_values;
  if (p.with_lse) lse_values = lse.download_all<float>();

  const HostInput q_in =
      HostInput::float64(host.q.data(), StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim));
  const HostInput k_in =
      HostInput::float64(host.k.data(), StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim));
  const HostInput v_in =
      HostInput::float64(host.v.data(), StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim));
  const double scale = flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim);
  const AttentionResult ref64 = flashgen::attention_reference_f64(s, q_in, k_in, v_in, scale, p.mask);
  const AttentionResult naive =
      flashgen::test::attention_reference_naive(s, q_in, k_in, v_in, scale, p.mask, p.dtype);

  const CheckReport out_report = flashgen::test::check_output(
      s, flashgen::test::gather_output(out_storage, layout.out, p.dtype), ref64, naive, p.dtype);
  {
    INFO(out_report.text);
    CHECK(out_report.not_written == 0);
    CHECK(out_report.ok);
  }
  std::string outside_text;
  const int64_t touched = flashgen::test::count_touched_outside(out_storage, {layout.out},
                                                                flashgen::test::kPoison16, &outside_text);
  {
    INFO("out buffer: " << outside_text);
    CHECK(touched == 0);
  }

  if (p.with_lse) {
    const CheckReport lse_report = flashgen::test::check_lse(s, lse_values, ref64);
    int64_t guard_touched = 0;
    for (size_t i = static_cast<size_t>(lse_count); i < lse_values.size(); ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &lse_values[i], sizeof(bits));
      if (bits != flashgen::test::kPoison32) ++guard_touched;
    }
    {
      INFO(lse_report.text);
      CHECK(lse_report.not_written == 0);
      CHECK(lse_report.ok);
    }
    INFO("lse buffer: " << guard_touched << " of the " << kGuardElements << " floats after the "
                        << lse_count << " [batch, heads_q, seqlen_q] entries were overwritten");
    CHECK(guard_touched == 0);
  }
}

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
  for (const Problem& p : problems) {
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
  for (const Problem& p : problems) {
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
