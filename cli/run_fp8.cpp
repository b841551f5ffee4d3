// `flashgen run --dtype e4m3|e5m2`: the dense FP8 forward (sm_90) over random FP8 codes with one descale per tensor,
// its sampled rows judged by FlashAttention-3's rule (check_sampled_rows_fp8), then timed.
#include <optional>
#include <random>

#include "cli/common.hpp"
#include "cli/run_support.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "launch/attention.hpp"

namespace flashgen::cli {

namespace {

// One FP8 tensor as the device holds it: its codes in the layout's memory order, and its descale.
struct HostCodes {
  DType dtype = DType::kFloat8E4M3;
  StridedView view;
  std::vector<uint8_t> codes;
  float descale = 1.f;

  HostInput input() const { return HostInput::fp8_codes(codes.data(), dtype, view, descale); }
};

HostCodes make_host_codes(DType fp8, const StridedView& view, float descale) {
  return HostCodes{fp8, view, std::vector<uint8_t>(static_cast<size_t>(view.elements())), descale};
}

// The tensor's codes drawn as check/number_formats.hpp's random_fp8_codes draws them, in memory order.
void fill_codes(HostCodes& t, std::mt19937_64& rng) { t.codes = random_fp8_codes(t.codes.size(), t.dtype, rng); }

}  // namespace

RunReport run_fp8(const RunOptions& o, RunReport report) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& shape = p.shape;
  std::optional<KernelConfig> config;
  if (o.config_name) config = KernelConfig::from_name(*o.config_name);

  const bool bhsd = o.layout == "bhsd";
  HostCodes q = make_host_codes(p.dtype, host_view(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd),
                                fp8_input_descale(0));
  HostCodes k = make_host_codes(p.dtype, host_view(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd),
                                fp8_input_descale(1));
  HostCodes v = make_host_codes(
      p.dtype, host_view(shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim(), bhsd), fp8_input_descale(2));
  HostTensor out =
      make_host_tensor(p.output_dtype(), shape.batch, shape.seqlen_q, shape.heads_q, shape.value_dim(), bhsd);
  std::vector<float> lse(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q));

  DeviceBuffer q_dev(q.codes.size()), k_dev(k.codes.size()), v_dev(v.codes.size()), out_dev(out.bytes());
  DeviceBuffer lse_dev(lse.size() * sizeof(float)), descales_dev(3 * sizeof(float));
  const TensorView q_view = tensor_view(q.dtype, q.view, q_dev), k_view = tensor_view(k.dtype, k.view, k_dev),
                   v_view = tensor_view(v.dtype, v.view, v_dev), out_view = tensor_view(out, out_dev);
  float* lse_ptr = static_cast<float*>(lse_dev.data());
  CallOptions options = call_options(p, o.scale);
  // One descale per tensor: q's, k's and v's in one array, each read with strides {0, 0}.
  descales_dev.upload(std::vector<float>{q.descale, k.descale, v.descale});
  const float* descales = static_cast<const float*>(descales_dev.data());
  options.q_descale = descales, options.k_descale = descales + 1, options.v_descale = descales + 2;
  DeviceBuffer slopes_dev;
  options.alibi_slopes = upload_alibi_slopes(p, slopes_dev);
  DeviceBuffer sinks_dev;
  options.sinks = upload_sinks(o, sinks_dev);
  // Validate before the slow part (host data): a bad shape fails here with the library's own message.
  const ForwardCall problem = make_forward_call(&q_view, &k_view, &v_view, &out_view, lse_ptr, &options);
  report.scale = problem.params.variant.scale;

  std::mt19937_64 rng(o.seed);
  fill_codes(q, rng);
  fill_codes(k, rng);
  fill_codes(v, rng);
  q_dev.upload(q.codes);
  k_dev.upload(k.codes);
  v_dev.upload(v.codes);
  // 0xFF bytes are NaN in fp16, bf16 and fp32: anything the kernel fails to write shows up in the check.
  out_dev.fill_bytes(0xFF);
  lse_dev.fill_bytes(0xFF);

  Stream stream;
  auto launch = [&] {
    return config ? attention_forward(problem, stream.get(), *config)
                  : attention_forward(q_view, k_view, v_view, out_view, lse_ptr, options, stream.get());
  };
  const ForwardLaunch forward_launch = first_forward_launch(launch, stream.get(), report);

  out_dev.download(out.bits.data(), out.bytes());
  lse_dev.download(lse.data(), lse_dev.bytes());
  report.check = check_sampled_rows_fp8(shape, q.input(), k.input(), v.input(), out.input(), lse.data(),
                                        p.output_dtype(),
                                        sample_rows(shape.batch, shape.heads_q, shape.seqlen_q, o.check_rows),
                                        report.scale, p.mask, run_variant(o));
  report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
  report.flops = forward_flops(shape, p.mask, window_of(p));
  return report;
}

}  // namespace flashgen::cli
