// The [gpu] forward tests' problems (support/forward_problem.hpp): layouts, inputs drawn from a seed,
// upload, run_and_check, and the problem sets the C ABI and sm90 family cases run.
#include "support/forward_problem.hpp"

#include <cmath>
#include <sstream>

#include "catch.hpp"
#include "api/from_c.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/attention_reference.hpp"
#include "support/check_reports.hpp"
#include "support/strided_tensors.hpp"

namespace flashgen::test {

namespace {

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

ProblemLayout make_layout(const Problem& p) {
  const AttentionShape& s = p.shape;
  ProblemLayout layout;
  auto separate = [&](StridedView (*make)(int64_t, int64_t, int64_t, int64_t)) {
    layout.q = Placement{0, 0, make(s.batch, s.seqlen_q, s.heads_q, s.head_dim)};
    layout.k = Placement{1, 0, make(s.batch, s.seqlen_k, s.heads_kv, s.head_dim)};
    layout.v = Placement{2, 0, make(s.batch, s.seqlen_k, s.heads_kv, s.value_dim())};
    layout.out = make(s.batch, s.seqlen_q, s.heads_q, s.value_dim());
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
      REQUIRE(s.value_dim() == s.head_dim);
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
    return static_cast<double>(flashgen::round_to_dtype(static_cast<float>(value), flashgen::from_c(p.dtype)));
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
  v = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * s.value_dim(), p.dtype);
}

constexpr int kMqa = 0;  // group code for heads_kv = 1 with several query heads

}  // namespace

std::string Problem::describe() const {
  std::ostringstream s;
  s << "b=" << shape.batch << " sq=" << shape.seqlen_q << " sk=" << shape.seqlen_k << " hq=" << shape.heads_q
    << " hkv=" << shape.heads_kv << " d=" << shape.head_dim;
  if (shape.value_dim() != shape.head_dim) s << " dv=" << shape.value_dim();
  s << " " << flashgen::test::dtype_label(dtype)
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
    host.v = flashgen::test::normal_values(rng, s.batch * s.seqlen_k * s.heads_kv * s.value_dim(), p.dtype);
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

std::vector<DeviceBuffer> upload_inputs(const HostProblem& host) {
  std::vector<DeviceBuffer> inputs;
  for (const std::vector<uint16_t>& image : host.buffers) {
    inputs.emplace_back(image.size() * sizeof(uint16_t));
    inputs.back().upload(image);
  }
  return inputs;
}

InputTensors input_tensors(const std::vector<DeviceBuffer>& in, const ProblemLayout& layout, flashgen_dtype dtype) {
  auto tensor = [&](const Placement& at) {
    return make_tensor(in[static_cast<size_t>(at.buffer)], at.base, at.view, dtype);
  };
  return {tensor(layout.q), tensor(layout.k), tensor(layout.v)};
}

void run_and_check(const Problem& p, CUstream stream, const std::vector<flashgen::KernelConfig>& configs) {
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

Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                     int64_t head_dim, flashgen_dtype dtype, flashgen_mask mask, uint32_t seed) {
  Problem p;
  p.shape = AttentionShape{batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim};
  p.dtype = dtype;
  p.mask = mask;
  p.seed = seed;
  return p;
}

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

}  // namespace flashgen::test
