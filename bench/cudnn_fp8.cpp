// The FP8 forward against cuDNN's, in one process on the same random inputs: flashgen's e4m3 forward (C ABI, bf16
// out), cuDNN's FP8 fused attention (the cudnn_frontend graph API's sdpa_fp8, given to CMake as
// FLASHGEN_CUDNN_FRONTEND_DIR) and flashgen's bf16 forward on the same values, the baseline FP8 is read against.
//   Inputs: e4m3 codes of randn · 32, one power-of-two descale per tensor (q and k 1/32, v 1/2), so that the bf16
//   copies (code · descale) hold the very same values and each library computes the same function.
//   cuDNN: descale_q/k/v as flashgen's, P rounded to e4m3 as P · scale_s (2^7) and read back with descale_s; its O is
//   e4m3 with scale_o = 1 (a 16-bit O from FP8 inputs is Blackwell-only in cuDNN), so its output carries e4m3's
//   rounding, up to 2^-4 of a value. Causal: cuDNN's top-left diagonal (the only one its FP8 forward takes on
//   Hopper), flashgen's bottom-right; sq == sk, so they agree.
// Each sample follows a 256 MB write that flushes the L2, the three calls interleaved sample by sample; the median
// counts. TFLOP/s over the unmasked score pairs (check/reference.hpp's forward_flops). Each row also compares
// flashgen's FP8 output with its bf16 one and with cuDNN's (the largest difference over the peer's largest
// magnitude) and the LSEs (the largest difference, natural log), so that a row says all computed the same function.
// CSV rows (device, date, versions) go to stdout or --csv.
//   flashgen_bench_cudnn_fp8 [--head-dims 128,256] [--seqlens 2048,4096,8192,16384] [--tokens 16384]
//       [--width 2048] [--masks none,causal] [--samples 20] [--csv FILE]
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/from_c.hpp"
#include "bench/cudnn_graphs.hpp"
#include "bench/harness.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"

const char cudnn_variants::kProgramName[] = "cudnn_fp8";

namespace {

using namespace cudnn_variants;

// The inputs' codes are randn · kCodeScale in e4m3 (at most about 6 · 32, inside e4m3's ±448). q and k read as
// N(0, 1), so the scores q·k / sqrt(d) are about N(0, 1); v as N(0, 16²), so that a typical entry of O, a weighted
// mean of up to 16k values (about 0.2 there), lies well above 2^-6, e4m3's smallest normal, where cuDNN rounds O.
// No descale is 1: one a library dropped would show in the differences.
constexpr float kCodeScale = 32.f;
constexpr float kQDescale = 1.f / 32, kKDescale = 1.f / 32, kVDescale = 0.5f;
// cuDNN rounds P to e4m3 as P · scale_s. 2^7 keeps that below 448 even where its kernels rescale lazily (its own
// test reference lets P reach e^4 against scale_s · 2^-4); flashgen's kernel rounds P · 2^8 (fwd_sm90_layout.cuh).
constexpr float kPScale = 128.f;

constexpr flashgen::DType kE4m3 = flashgen::DType::kFloat8E4M3, kBf16 = flashgen::DType::kBFloat16;

// One input tensor: its e4m3 codes, and code · descale in bf16 (exact: a power-of-two multiple of an e4m3 value).
struct QuantizedInput {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> bf16;
};

QuantizedInput random_input(int64_t count, uint64_t seed, float descale) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.f, 1.f);
  QuantizedInput in;
  in.codes.resize(static_cast<size_t>(count));
  in.bf16.resize(static_cast<size_t>(count));
  for (size_t i = 0; i < in.codes.size(); ++i) {
    in.codes[i] = flashgen::float_to_fp8_bits(normal(rng) * kCodeScale, kE4m3);
    const double value = flashgen::fp8_bits_to_double(in.codes[i], kE4m3) * descale;
    in.bf16[i] = flashgen::float_to_bf16_bits(static_cast<float>(value));
  }
  return in;
}

// cuDNN's fp32 scalars (descales, scales and amaxes: uids kDescaleQ to kAmaxO), one per 64 bytes in their uids'
// order; flashgen's FP8 call reads the same descales.
constexpr int kScalars = kAmaxO - kDescaleQ + 1;

// The tensors of one problem, [batch, seqlen, heads, head_dim] in memory for every call, and every output
// poisoned (NaN) before the calls write it.
struct Problem {
  Shape shape;
  DeviceBuffer q8, k8, v8, q16, k16, v16, out_fp8, out_cudnn, out_bf16, lse_fp8, lse_cudnn, lse_bf16, scalars;

  Problem(const Shape& s, const QuantizedInput& q, const QuantizedInput& k, const QuantizedInput& v)
      : shape(s), q8(codes()), k8(codes()), v8(codes()), q16(2 * codes()), k16(2 * codes()), v16(2 * codes()),
        out_fp8(2 * codes()), out_cudnn(codes()), out_bf16(2 * codes()), lse_fp8(s.rows() * 4),
        lse_cudnn(s.rows() * 4), lse_bf16(s.rows() * 4), scalars(kScalars * 64) {
    const std::pair<const DeviceBuffer*, const QuantizedInput*> inputs[] = {{&q8, &q}, {&k8, &k}, {&v8, &v}};
    for (const auto& [target, in] : inputs) {
      cuda_check(cudaMemcpy(target->ptr, in->codes.data(), codes(), cudaMemcpyHostToDevice), "upload");
    }
    const std::pair<const DeviceBuffer*, const QuantizedInput*> copies[] = {{&q16, &q}, {&k16, &k}, {&v16, &v}};
    for (const auto& [target, in] : copies) {
      cuda_check(cudaMemcpy(target->ptr, in->bf16.data(), 2 * codes(), cudaMemcpyHostToDevice), "upload");
    }
    // 0xff: NaN in bf16 (0xffff), e4m3fn (0xff) and fp32.
    cuda_check(cudaMemset(out_fp8.ptr, 0xff, 2 * codes()), "poison");
    cuda_check(cudaMemset(out_cudnn.ptr, 0xff, codes()), "poison");
    cuda_check(cudaMemset(out_bf16.ptr, 0xff, 2 * codes()), "poison");
    for (const DeviceBuffer* lse : {&lse_fp8, &lse_cudnn, &lse_bf16}) {
      cuda_check(cudaMemset(lse->ptr, 0xff, s.rows() * 4), "poison");
    }
    std::array<float, 16 * kScalars> host_scalars{};  // the amaxes 0 until cuDNN writes them
    const std::pair<Uid, float> values[] = {{kDescaleQ, kQDescale}, {kDescaleK, kKDescale}, {kDescaleV, kVDescale},
                                            {kDescaleS, 1.f / kPScale}, {kScaleS, kPScale}, {kScaleO, 1.f}};
    for (const auto& [uid, value] : values) host_scalars[16 * (uid - kDescaleQ)] = value;
    cuda_check(cudaMemcpy(scalars.ptr, host_scalars.data(), sizeof host_scalars, cudaMemcpyHostToDevice), "upload");
  }
  size_t codes() const { return static_cast<size_t>(shape.elements()); }  // bytes of an e4m3 tensor
  float* scalar(Uid uid) const { return scalars.as<float>() + 16 * (uid - kDescaleQ); }
};

// The options of either flashgen call; the FP8 one's descales are cuDNN's (one value each: strides {0, 0}).
flashgen_attention_options options_of(const Problem& p, bool causal, bool fp8) {
  flashgen_attention_options o{};
  o.softmax_scale = 1.f / std::sqrt(float(p.shape.head_dim));
  o.mask = causal ? FLASHGEN_MASK_CAUSAL : FLASHGEN_MASK_NONE;
  if (fp8) {
    o.q_descale = p.scalar(kDescaleQ);
    o.k_descale = p.scalar(kDescaleK);
    o.v_descale = p.scalar(kDescaleV);
  }
  return o;
}

// A device tensor's e4m3 codes on the host, as floats (harness.hpp reads bf16 and fp32 ones).
std::vector<float> e4m3_values(const void* device, int64_t count) {
  std::array<float, 256> value_of;
  for (int c = 0; c < 256; ++c) value_of[c] = static_cast<float>(flashgen::fp8_bits_to_double(uint8_t(c), kE4m3));
  std::vector<uint8_t> codes(static_cast<size_t>(count));
  cuda_check(cudaMemcpy(codes.data(), device, count, cudaMemcpyDeviceToHost), "copy back");
  std::vector<float> values(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) values[i] = value_of[codes[i]];
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> head_dims = {128, 256}, seqlens = {2048, 4096, 8192, 16384};
  std::vector<std::string> masks = {"none", "causal"};
  int tokens = 16384, width = 2048, samples = 20;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--head-dims") {
      head_dims = split_ints(value(), "--head-dims");
    } else if (arg == "--seqlens") {
      seqlens = split_ints(value(), "--seqlens");
    } else if (arg == "--tokens") {
      tokens = split_ints(value(), "--tokens").at(0);
    } else if (arg == "--width") {
      width = split_ints(value(), "--width").at(0);
    } else if (arg == "--masks") {
      masks = split(value());
      for (const std::string& m : masks) {
        if (m != "none" && m != "causal") fail("--masks: none or causal, not " + m);
      }
    } else if (arg == "--samples") {
      samples = split_ints(value(), "--samples").at(0);
    } else if (arg == "--csv") {
      csv = value();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--head-dims 128,256] [--seqlens 2048,4096,8192,16384] [--tokens 16384]\n"
                   "       [--width 2048] [--masks none,causal] [--samples 20] [--csv FILE]\n",
                   argv[0]);
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }

  const CudnnDevice gpu = open_device();
  cudaStream_t stream = gpu.stream;
  cudnnHandle_t handle = gpu.handle;
  Timer timer(stream);

  // Every problem of the grid has tokens · width elements per tensor: one set of random inputs serves all.
  const int64_t elements = int64_t(tokens) * width;
  const QuantizedInput hq = random_input(elements, 1, kQDescale), hk = random_input(elements, 2, kKDescale),
                       hv = random_input(elements, 3, kVDescale);

  CsvWriter out(csv,
                "device,date,flashgen,cudnn,format,out,cudnn_out,head_dim,seqlen,batch,heads,mask,flashgen_fp8_ms,"
                "cudnn_fp8_ms,flashgen_bf16_ms,flashgen_fp8_tflops,cudnn_fp8_tflops,flashgen_bf16_tflops,"
                "flashgen_fp8_over_cudnn,flashgen_fp8_over_bf16,out_difference_bf16,out_difference_cudnn,"
                "lse_difference_bf16,lse_difference_cudnn,note\n");
  const std::string device = gpu.prop.name, date = today(), cudnn_release = cudnn_version();

  for (int head_dim : head_dims) {
    for (int seqlen : seqlens) {
      if (tokens % seqlen != 0 || width % head_dim != 0) fail("--tokens / --width must divide by seqlen / head_dim");
      const Shape shape{tokens / seqlen, seqlen, width / head_dim, head_dim};
      Problem p(shape, hq, hk, hv);
      for (const std::string& mask : masks) {
        const bool causal = mask == "causal";
        const flashgen_attention_options fp8_opts = options_of(p, causal, true),
                                         bf16_opts = options_of(p, causal, false);
        const double flops =  // over the unmasked pairs
            flashgen::forward_flops(counted_shape(shape), flashgen::from_c(fp8_opts.mask));

        const flashgen_tensor q8 = tensor_of(shape, p.q8, FLASHGEN_FLOAT8_E4M3),
                              k8 = tensor_of(shape, p.k8, FLASHGEN_FLOAT8_E4M3),
                              v8 = tensor_of(shape, p.v8, FLASHGEN_FLOAT8_E4M3),
                              o_fp8 = tensor_of(shape, p.out_fp8, FLASHGEN_BFLOAT16),
                              q16 = tensor_of(shape, p.q16, FLASHGEN_BFLOAT16),
                              k16 = tensor_of(shape, p.k16, FLASHGEN_BFLOAT16),
                              v16 = tensor_of(shape, p.v16, FLASHGEN_BFLOAT16),
                              o_bf16 = tensor_of(shape, p.out_bf16, FLASHGEN_BFLOAT16);
        auto flashgen_fp8 = [&] {
          flashgen_check(flashgen_attention_forward(&q8, &k8, &v8, &o_fp8, p.lse_fp8.as<float>(), &fp8_opts, stream),
                         "flashgen_attention_forward (e4m3)");
        };
        auto flashgen_bf16 = [&] {
          flashgen_check(
              flashgen_attention_forward(&q16, &k16, &v16, &o_bf16, p.lse_bf16.as<float>(), &bf16_opts, stream),
              "flashgen_attention_forward (bf16)");
        };
        CudnnGraph cf = cudnn_fp8_forward(handle, shape, causal);
        const bool cudnn_ok = cf.error.empty();
        std::unique_ptr<DeviceBuffer> cf_ws = cudnn_ok ? std::make_unique<DeviceBuffer>(cf.workspace) : nullptr;
        std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
            {kQ, p.q8.ptr}, {kK, p.k8.ptr}, {kV, p.v8.ptr}, {kO, p.out_cudnn.ptr}, {kStats, p.lse_cudnn.ptr}};
        for (Uid uid : {kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO}) {
          pack[uid] = p.scalar(uid);
        }
        auto cudnn_fp8 = [&] {
          if (!cf.graph->execute(handle, pack, cf_ws->ptr).is_good()) fail("cuDNN FP8 forward failed");
        };

        // Each call once (compiling flashgen's kernels), then the comparisons.
        flashgen_fp8();
        flashgen_bf16();
        if (cudnn_ok) cudnn_fp8();
        cuda_check(cudaStreamSynchronize(stream), "forward");
        const std::vector<float> out_fp8 = half_values(p.out_fp8.ptr, shape.elements(), kBf16),
                                 lse_fp8 = fp32_values(p.lse_fp8.ptr, shape.rows());
        const double out_bf16_difference =
            largest_difference(out_fp8, half_values(p.out_bf16.ptr, shape.elements(), kBf16), true);
        const double lse_bf16_difference =
            largest_difference(lse_fp8, fp32_values(p.lse_bf16.ptr, shape.rows()), false);
        double out_cudnn_difference = NAN, lse_cudnn_difference = NAN;
        if (cudnn_ok) {
          out_cudnn_difference = largest_difference(out_fp8, e4m3_values(p.out_cudnn.ptr, shape.elements()), true);
          lse_cudnn_difference = largest_difference(lse_fp8, fp32_values(p.lse_cudnn.ptr, shape.rows()), false);
        }

        const std::function<void()> cudnn_call = cudnn_ok ? std::function<void()>(cudnn_fp8) : nullptr;
        const std::vector<double> ms = timer.medians(samples, {flashgen_fp8, cudnn_call, flashgen_bf16});
        const std::string note = cudnn_ok ? "" : csv_field("cudnn: " + cf.error);
        char line[1024];
        std::snprintf(line, sizeof line,
                      "%s,%s,%s,%s,e4m3,bf16,e4m3 scale_o=1,%d,%d,%lld,%lld,%s,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.3f,%.3f,"
                      "%.2e,%.2e,%.2e,%.2e,%s\n",
                      device.c_str(), date.c_str(), flashgen_version(), cudnn_release.c_str(), head_dim, seqlen,
                      static_cast<long long>(shape.batch), static_cast<long long>(shape.heads), mask.c_str(), ms[0],
                      ms[1], ms[2], flops / ms[0] * 1e-9, flops / ms[1] * 1e-9, flops / ms[2] * 1e-9, ms[1] / ms[0],
                      ms[2] / ms[0], out_bf16_difference, out_cudnn_difference, lse_bf16_difference,
                      lse_cudnn_difference, note.c_str());
        out.row(line);
      }
    }
  }
  cudnnDestroy(handle);
  cudaStreamDestroy(stream);
  return 0;
}
