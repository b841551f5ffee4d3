// Attention variants against cuDNN's fused attention, in one process on the same random inputs: flashgen
// through its C ABI, cuDNN through its graph API (the cudnn_frontend headers, given to CMake as
// FLASHGEN_CUDNN_FRONTEND_DIR). SDPA reaches cuDNN without any of these variants, so this is the only way to
// put the two side by side. Variants, each on top of the causal mask (sq == sk, so both alignments agree; cuDNN
// takes the top-left one, the one it serves with ALiBi and skips blocks under), bf16 by default:
//   causal        the plain call the variants are measured against (none: the plain call without a mask);
//   window<W>     a sliding window of W keys before the diagonal (flashgen window_size (W, 0), W + 1 keys a
//                 row; cuDNN's left bound is exclusive, so W + 1);
//   softcap<C>    C · tanh(s / C) on the scaled scores (cuDNN: its Softcap score modifier, forward and bprop;
//                 a score modifier turns cuDNN's own masks off, so the causal mask joins the modifier);
//   alibi         the standard slopes 2^(-8 (h + 1) / heads) (cuDNN computes the same ones itself);
//   <variant>-nomask  softcap<C> or alibi without the causal mask;
//   sinks         one learnable logit per head in each row's softmax denominator (cuDNN's sink token).
// Forward and backward are timed apart (the backward from each library's own forward outputs), each sample
// after a 256 MB write that flushes the L2, the two libraries interleaved sample by sample; the median
// counts. Each library's backward runs on a workspace allocated once, as cuDNN's graph takes its own (--workspace
// pool times flashgen_attention_backward taking it from flashgen's memory pool on every call instead, the C ABI's
// default). TFLOP/s are over the unmasked score pairs (check/reference.hpp's forward_flops and backward_flops). Each
// case also compares the two libraries' outputs (O; dQ, dK, dV) as the largest difference relative to the
// largest magnitude, so that a row says both computed the same function. CSV rows (device, date, versions)
// go to stdout or --csv.
//   flashgen_bench_cudnn_variants [--variants causal,none,window1024,window4096,softcap50,alibi,sinks]
//       [--head-dims 64,128] [--seqlens 4096,16384] [--tokens 16384] [--width 2048] [--dtype bf16|fp16]
//       [--samples 20] [--passes fwd,bwd] [--workspace own|pool] [--csv FILE]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/from_c.hpp"
#include "bench/cudnn_graphs.hpp"
#include "bench/harness.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"

const char cudnn_variants::kProgramName[] = "cudnn_variants";

namespace {

using namespace cudnn_variants;

Variant parse_variant(const std::string& full_name) {
  Variant v;
  v.name = full_name;
  std::string name = full_name;
  const std::string nomask = "-nomask";
  if (name.size() > nomask.size() && name.compare(name.size() - nomask.size(), nomask.size(), nomask) == 0) {
    name.resize(name.size() - nomask.size());
    v.causal = false;
    if (name.rfind("softcap", 0) != 0 && name != "alibi") fail("--variants: only softcap<C> and alibi take -nomask");
  }
  auto number_after = [&](const char* prefix) {
    const std::string rest = name.substr(std::strlen(prefix));
    char* end = nullptr;
    const double value = std::strtod(rest.c_str(), &end);
    if (rest.empty() || *end != '\0' || !(value > 0)) {
      fail("--variants: " + name + " needs a positive number after " + prefix);
    }
    return value;
  };
  if (name == "causal") {
  } else if (name == "none") {
    v.causal = false;
  } else if (name.rfind("window", 0) == 0) {
    v.window = static_cast<int>(number_after("window"));
  } else if (name.rfind("softcap", 0) == 0) {
    v.softcap = static_cast<float>(number_after("softcap"));
  } else if (name == "alibi") {
    v.alibi = true;
  } else if (name == "sinks") {
    v.sinks = true;
  } else {
    fail("--variants: unknown variant " + full_name + " (causal, none, window<W>, softcap<C>, alibi, sinks)");
  }
  return v;
}

// Random normal values rounded to the dtype, as its bit patterns.
std::vector<uint16_t> random_normal(int64_t count, uint64_t seed, flashgen_dtype dtype) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> out(static_cast<size_t>(count));
  for (uint16_t& value : out) value = flashgen::float_to_dtype_bits(normal(rng), flashgen::from_c(dtype));
  return out;
}

// The largest |a - b| over the largest |b| of two 16-bit device tensors (b: cuDNN's).
double relative_difference(const void* a, const void* b, int64_t count, flashgen_dtype dtype) {
  const flashgen::DType elem = flashgen::from_c(dtype);
  return largest_difference(half_values(a, count, elem), half_values(b, count, elem), true);
}

// The tensors of one problem, [batch, seqlen, heads, head_dim] in memory for both libraries, and every
// output poisoned (NaN) before the libraries write it.
struct Problem {
  Shape shape;
  bool bf16;
  DeviceBuffer q, k, v, dout, out_fg, out_cd, dq_fg, dk_fg, dv_fg, dq_cd, dk_cd, dv_cd, lse_fg, lse_cd, slopes,
      sinks, dsinks_fg, dsinks_cd;

  Problem(const Shape& s, bool is_bf16, const std::vector<const std::vector<uint16_t>*>& inputs)
      : shape(s), bf16(is_bf16), q(bytes()), k(bytes()), v(bytes()), dout(bytes()), out_fg(bytes()), out_cd(bytes()),
        dq_fg(bytes()), dk_fg(bytes()), dv_fg(bytes()), dq_cd(bytes()), dk_cd(bytes()), dv_cd(bytes()),
        lse_fg(s.rows() * 4), lse_cd(s.rows() * 4), slopes(s.heads * 4), sinks(s.heads * 4), dsinks_fg(s.heads * 4),
        dsinks_cd(s.heads * 4) {
    const DeviceBuffer* targets[] = {&q, &k, &v, &dout};
    for (int i = 0; i < 4; ++i) {
      cuda_check(cudaMemcpy(targets[i]->ptr, inputs[i]->data(), bytes(), cudaMemcpyHostToDevice), "upload");
    }
    for (const DeviceBuffer* output : {&out_fg, &out_cd, &dq_fg, &dk_fg, &dv_fg, &dq_cd, &dk_cd, &dv_cd}) {
      cuda_check(cudaMemset(output->ptr, 0xff, bytes()), "poison");  // 0xffff: NaN in fp16 and bf16
    }
    std::vector<float> host_slopes(static_cast<size_t>(s.heads)), host_sinks(static_cast<size_t>(s.heads));
    for (int64_t h = 0; h < s.heads; ++h) {
      host_slopes[h] = std::exp2(-8.f * float(h + 1) / float(s.heads));
      host_sinks[h] = 2.f + 0.25f * float(h % 8);  // about the rows' log-sum-exp of random scores
    }
    cuda_check(cudaMemcpy(slopes.ptr, host_slopes.data(), s.heads * 4, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(sinks.ptr, host_sinks.data(), s.heads * 4, cudaMemcpyHostToDevice), "upload");
  }
  size_t bytes() const { return static_cast<size_t>(shape.elements()) * 2; }
};

flashgen_tensor tensor_of(const Problem& p, const DeviceBuffer& buffer) {
  return cudnn_variants::tensor_of(p.shape, buffer, p.bf16 ? FLASHGEN_BFLOAT16 : FLASHGEN_FLOAT16);
}

flashgen_attention_options options_of(const Problem& p, const Variant& v, bool backward) {
  flashgen_attention_options o{};
  o.softmax_scale = 1.f / std::sqrt(float(p.shape.head_dim));
  o.mask = v.causal ? FLASHGEN_MASK_CAUSAL : FLASHGEN_MASK_NONE;
  if (v.window >= 0) {
    o.mask = FLASHGEN_MASK_SLIDING_WINDOW;
    o.window_left = v.window;
    o.window_right = 0;
  }
  o.softcap = v.softcap;
  if (v.alibi) o.alibi_slopes = p.slopes.as<float>();
  if (v.sinks) {
    o.sinks = p.sinks.as<float>();
    if (backward) o.dsinks = p.dsinks_fg.as<float>();
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> variant_names = {"causal",    "none",  "window1024",        "window4096",
                                            "softcap50", "alibi", "softcap50-nomask", "alibi-nomask", "sinks"};
  std::vector<int> head_dims = {64, 128}, seqlens = {4096, 16384};
  int tokens = 16384, width = 2048, samples = 20;
  bool bf16 = true, forward = true, backward = true, own_workspace = true;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--variants") {
      variant_names = split(value());
    } else if (arg == "--head-dims") {
      head_dims = split_ints(value(), "--head-dims");
    } else if (arg == "--seqlens") {
      seqlens = split_ints(value(), "--seqlens");
    } else if (arg == "--tokens") {
      tokens = split_ints(value(), "--tokens").at(0);
    } else if (arg == "--width") {
      width = split_ints(value(), "--width").at(0);
    } else if (arg == "--samples") {
      samples = split_ints(value(), "--samples").at(0);
    } else if (arg == "--dtype") {
      const std::string d = value();
      if (d != "bf16" && d != "fp16") fail("--dtype: bf16 or fp16, not " + d);
      bf16 = d == "bf16";
    } else if (arg == "--passes") {
      const std::vector<std::string> passes = split(value());
      forward = std::find(passes.begin(), passes.end(), "fwd") != passes.end();
      backward = std::find(passes.begin(), passes.end(), "bwd") != passes.end();
      if (!forward && !backward) fail("--passes: fwd, bwd or both");
    } else if (arg == "--workspace") {
      const std::string w = value();
      if (w != "own" && w != "pool") fail("--workspace: own or pool, not " + w);
      own_workspace = w == "own";
    } else if (arg == "--csv") {
      csv = value();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--variants causal,none,window1024,window4096,softcap50,alibi,sinks,\n"
                   "                   softcap50-nomask,alibi-nomask]\n"
                   "       [--head-dims 64,128]\n"
                   "       [--seqlens 4096,16384] [--tokens 16384] [--width 2048] [--dtype bf16|fp16] [--samples 20]\n"
                   "       [--passes fwd,bwd] [--workspace own|pool] [--csv FILE]\n",
                   argv[0]);
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }
  std::vector<Variant> variants;
  for (const std::string& name : variant_names) variants.push_back(parse_variant(name));

  const CudnnDevice gpu = open_device();
  cudaStream_t stream = gpu.stream;
  cudnnHandle_t handle = gpu.handle;
  Timer timer(stream);

  // Every problem of the grid has tokens · width elements per tensor: one set of random inputs serves all.
  const int64_t elements = int64_t(tokens) * width;
  const flashgen_dtype dtype = bf16 ? FLASHGEN_BFLOAT16 : FLASHGEN_FLOAT16;
  const std::vector<uint16_t> hq = random_normal(elements, 1, dtype), hk = random_normal(elements, 2, dtype),
                              hv = random_normal(elements, 3, dtype), hdo = random_normal(elements, 4, dtype);

  CsvWriter out(csv,
                "device,date,flashgen,cudnn,dtype,head_dim,seqlen,batch,heads,variant,pass,flashgen_ms,cudnn_ms,"
                "flashgen_tflops,cudnn_tflops,flashgen_over_cudnn,relative_difference,note\n");
  const std::string device = gpu.prop.name, date = today(), cudnn_release = cudnn_version();

  for (int head_dim : head_dims) {
    for (int seqlen : seqlens) {
      if (tokens % seqlen != 0 || width % head_dim != 0) fail("--tokens / --width must divide by seqlen / head_dim");
      const Shape shape{tokens / seqlen, seqlen, width / head_dim, head_dim};
      Problem p(shape, bf16, {&hq, &hk, &hv, &hdo});
      for (const Variant& v : variants) {
        const flashgen_attention_options fwd_opts = options_of(p, v, false), bwd_opts = options_of(p, v, true);
        const flashgen::AttentionShape counted = counted_shape(shape);  // for the FLOPs over the unmasked pairs
        const flashgen::ReferenceWindow window{fwd_opts.window_left, fwd_opts.window_right, 0};
        const double fwd_flops = flashgen::forward_flops(counted, flashgen::from_c(fwd_opts.mask), window);
        const double bwd_flops = flashgen::backward_flops(counted, flashgen::from_c(bwd_opts.mask), window);
        const flashgen_tensor q = tensor_of(p, p.q), k = tensor_of(p, p.k), vv = tensor_of(p, p.v),
                              o_fg = tensor_of(p, p.out_fg), dout = tensor_of(p, p.dout), dq = tensor_of(p, p.dq_fg),
                              dk = tensor_of(p, p.dk_fg), dv = tensor_of(p, p.dv_fg);
        auto flashgen_forward = [&] {
          flashgen_check(flashgen_attention_forward(&q, &k, &vv, &o_fg, p.lse_fg.as<float>(), &fwd_opts, stream),
                         "flashgen_attention_forward");
        };
        std::unique_ptr<DeviceBuffer> fg_ws;  // the backward's own workspace, sized on first use
        size_t fg_ws_bytes = 0;
        auto flashgen_backward = [&] {
          if (!own_workspace) {
            flashgen_check(flashgen_attention_backward(&q, &k, &vv, &o_fg, &dout, p.lse_fg.as<float>(), &dq, &dk,
                                                       &dv, &bwd_opts, stream),
                           "flashgen_attention_backward");
            return;
          }
          if (!fg_ws) {
            flashgen_check(flashgen_attention_backward_workspace_size(&q, &k, &vv, &o_fg, &dout, p.lse_fg.as<float>(),
                                                                      &dq, &dk, &dv, &bwd_opts, stream, &fg_ws_bytes),
                           "flashgen_attention_backward_workspace_size");
            fg_ws = std::make_unique<DeviceBuffer>(fg_ws_bytes);
          }
          flashgen_check(flashgen_attention_backward_with_workspace(&q, &k, &vv, &o_fg, &dout, p.lse_fg.as<float>(),
                                                                    &dq, &dk, &dv, &bwd_opts, fg_ws->ptr,
                                                                    fg_ws_bytes, stream),
                         "flashgen_attention_backward_with_workspace");
        };
        CudnnGraph cf = cudnn_forward(handle, shape, bf16, v);
        std::unique_ptr<DeviceBuffer> cf_ws = cf.error.empty() ? std::make_unique<DeviceBuffer>(cf.workspace) : nullptr;
        std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> fwd_pack = {
            {kQ, p.q.ptr}, {kK, p.k.ptr}, {kV, p.v.ptr}, {kO, p.out_cd.ptr}, {kStats, p.lse_cd.ptr}};
        if (v.sinks) fwd_pack[kSink] = p.sinks.ptr;
        auto cudnn_fwd = [&] {
          if (!cf.graph->execute(handle, fwd_pack, cf_ws->ptr).is_good()) fail("cuDNN forward failed");
        };

        auto row = [&](const char* pass, double flops, const std::vector<double>& ms, double difference,
                       const std::string& note) {
          char line[512];
          std::snprintf(line, sizeof line, "%s,%s,%s,%s,%s,%d,%d,%lld,%lld,%s,%s,%.4f,%.4f,%.1f,%.1f,%.3f,%.2e,%s\n",
                        device.c_str(), date.c_str(), flashgen_version(), cudnn_release.c_str(), bf16 ? "bf16" : "fp16",
                        head_dim, seqlen, static_cast<long long>(shape.batch), static_cast<long long>(shape.heads),
                        v.name.c_str(), pass, ms[0], ms[1], flops / ms[0] * 1e-9, flops / ms[1] * 1e-9, ms[1] / ms[0],
                        difference, note.c_str());
          out.row(line);
        };

        flashgen_forward();  // each library's outputs for the backward, and the first comparison
        if (cf.error.empty()) cudnn_fwd();
        cuda_check(cudaStreamSynchronize(stream), "forward");
        const double fwd_difference =
            cf.error.empty() ? relative_difference(p.out_fg.ptr, p.out_cd.ptr, shape.elements(), dtype) : NAN;
        if (forward) {
          const auto ms = timer.medians(samples, {flashgen_forward, cf.error.empty() ? std::function<void()>(cudnn_fwd)
                                                                                     : std::function<void()>()});
          row("fwd", fwd_flops, ms, fwd_difference, cf.error.empty() ? "" : "cudnn: " + csv_field(cf.error));
        }
        if (!backward) continue;
        CudnnGraph cb = cf.error.empty() ? cudnn_backward(handle, shape, bf16, v) : CudnnGraph{};
        if (!cf.error.empty()) cb.error = "no forward";
        std::unique_ptr<DeviceBuffer> cb_ws = cb.error.empty() ? std::make_unique<DeviceBuffer>(cb.workspace) : nullptr;
        std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> bwd_pack = {
            {kQ, p.q.ptr},     {kK, p.k.ptr},   {kV, p.v.ptr},   {kO, p.out_cd.ptr}, {kStats, p.lse_cd.ptr},
            {kDo, p.dout.ptr}, {kDq, p.dq_cd.ptr}, {kDk, p.dk_cd.ptr}, {kDv, p.dv_cd.ptr}};
        if (v.sinks) {
          bwd_pack[kSink] = p.sinks.ptr;
          bwd_pack[kDsink] = p.dsinks_cd.ptr;
        }
        auto cudnn_bwd = [&] {
          if (!cb.graph->execute(handle, bwd_pack, cb_ws->ptr).is_good()) fail("cuDNN backward failed");
        };
        flashgen_backward();
        if (cb.error.empty()) cudnn_bwd();
        cuda_check(cudaStreamSynchronize(stream), "backward");
        double bwd_difference = NAN;
        if (cb.error.empty()) {
          bwd_difference = std::max({relative_difference(p.dq_fg.ptr, p.dq_cd.ptr, shape.elements(), dtype),
                                     relative_difference(p.dk_fg.ptr, p.dk_cd.ptr, shape.elements(), dtype),
                                     relative_difference(p.dv_fg.ptr, p.dv_cd.ptr, shape.elements(), dtype)});
        }
        const auto ms = timer.medians(samples, {flashgen_backward, cb.error.empty() ? std::function<void()>(cudnn_bwd)
                                                                                    : std::function<void()>()});
        std::string note = own_workspace ? "" : "flashgen workspace from the pool";
        if (!cb.error.empty()) note += (note.empty() ? "" : "; ") + ("cudnn: " + csv_field(cb.error));
        row("bwd", bwd_flops, ms, bwd_difference, note);
      }
    }
  }
  cudnnDestroy(handle);
  cudaStreamDestroy(stream);
  return 0;
}
