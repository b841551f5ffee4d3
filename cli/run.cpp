// `flashgen run`: one attention problem on the GPU, forward or backward (or the FP8 forward): random normal inputs, a
// check against the float64 reference (sampled rows, or whole gradients), then timing with CUDA events.
#include "cli/run.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>

#include <unistd.h>

#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/run_support.hpp"
#include "cli/table.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "generator/bwd_config.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/attention_kvcache.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/tuned_config.hpp"

namespace flashgen::cli {

Command run_command() {
  return Command("run",
                 "Runs one attention problem on the GPU: random normal inputs, a check of sampled rows\n"
                 "against a float64 CPU reference, then timing with CUDA events.",
                 "[options]")
      .option("batch", "B", "batch size (default 4)")
      .option("seqlen-q", "N", "query length (default 4096)")
      .option("seqlen-k", "N", "key/value length (default 4096)")
      .option("heads-q", "H", "query heads (default 16)")
      .option("heads-kv", "H", "key/value heads; heads-q must be a multiple (default 16)")
      .option("head-dim", "D", "head dimension (default 128)")
      .option("head-dim-v", "D", "the values' (and the output's) head dimension where it is not --head-dim, as MLA's "
                                 "prefill (--head-dim 192 --head-dim-v 128); dense or --varlen, forward or --backward; "
                                 "with --kv-cache a latent cache, the values being the keys' first D columns (MLA's "
                                 "decode: --head-dim 576 --head-dim-v 512; sm_90)")
      .option("dtype", "T", "fp16 or bf16 (default fp16); or e4m3 or e5m2, the FP8 forward (sm_90, dense batches, "
                            "forward only): q, k and v random codes (normal values of standard deviation 150 rounded "
                            "to the format; e4m3's reach its largest, +-448), each tensor with one fp32 descale of "
                            "about 1.2/150, the output of --out-dtype; checked by FlashAttention-3's rule (out within "
                            "twice the error of a float64 computation that rounds P to e4m3, plus 2 ulp)")
      .option("out-dtype", "T", "with --dtype e4m3 or e5m2: the output's type, bf16 or fp16 (default bf16)")
      .option("causal", "MODE", "none, bottom-right or top-left (default none)")
      .option("scale", "S", "softmax scale; <= 0 means 1/sqrt(head_dim) (default 0)")
      .option("softcap", "C", "soft cap: scores s become C * tanh(s / C) before the softmax (default 0: none)")
      .flag("alibi", "ALiBi with the standard slopes 2^(-8 (h + 1) / heads-q): query i's score of key j gains "
                     "-slope * |i + seqlen_k - seqlen_q - j| (|i - j| with --causal top-left)")
      .option("window", "L,R", "sliding window: query i sees keys i + seqlen_k - seqlen_q - L to ... + R (-1: no "
                               "bound on that side; FlashAttention's window_size, so with --causal bottom-right R "
                               "is 0)")
      .option("chunk", "C", "chunked attention (Llama 4's attention_chunk): query i sees only keys j with j / C == "
                            "(i + seqlen_k - seqlen_q) / C, with --causal bottom-right (chunked causal) or none or "
                            "a window")
      .option("sink", "S", "attention sinks (gpt-oss): every query head's softmax gains a logit S with no value, "
                           "in the units of the scaled scores (with --backward, the sinks' gradient is checked too)")
      .option("layout", "L", "memory order of q/k/v/out: bshd or bhsd (default bshd)")
      .option("config", "NAME", "run this config (a fwd_... name, or bwd_... with --backward; FP8 takes an "
                                "fwd_sm90_e4m3_..._obf16 one) instead of the choice")
      .flag("backward", "time the backward pass (dq, dk, dv for a random dout) after one forward")
      .flag("varlen", "a packed batch of --batch sequences (flashgen_attention_varlen_forward, and _backward with "
                      "--backward): lengths spread evenly from --seqlen-q (--seqlen-k) down to what makes --total-q "
                      "(--total-k) tokens, in a fixed shuffled order; --config takes a ..._varlen config")
      .option("total-q", "N", "with --varlen: query tokens in all (default: lengths down to 1/64 of the longest)")
      .option("total-k", "N", "with --varlen: key tokens in all (default as --total-q)")
      .flag("kv-cache", "decoding: seqlen-q new tokens (default 1) per sequence against full KV caches of seqlen-k "
                        "keys (flashgen_attention_kvcache); --config takes a dec_... module")
      .option("page-size", "N",
              "with --kv-cache, or --varlen without --backward (prefill against a paged cache): the keys and values in "
              "a paged cache of N-key pages in a shuffled order, read through a block table (default 0: contiguous)")
      .option("splits", "N", "with --kv-cache: key ranges per sequence (default 0: chosen for the GPU)")
      .option("cache-dtype", "T", kCacheDtypeHelp)
      .flag("deterministic", "with --backward: the deterministic dQ strategy (bitwise repeatable)")
      .option("iters", "N", "timed launches (default 20)")
      .option("warmup", "N", "untimed launches before timing (default 3)")
      .option("check-rows", "N", "query rows checked against the reference, plus the last one (default 64)")
      .option("seed", "S", "random seed of the inputs (default 0)")
      .flag("json", "print one JSON object");
}

namespace {

// --dtype and --out-dtype onto problem: fp16 or bf16, or e4m3 or e5m2 with --out-dtype the output's type. FP8 is the
// dense forward's: with --backward, --varlen or --kv-cache (whose queries are 16-bit; an FP8 cache is --cache-dtype)
// it is refused, naming the flag.
void dtypes_from_flags(const Args& args, AttentionProblem& p) {
  const std::string dtype = args.choice_or("dtype", "fp16", {"fp16", "bf16", "e4m3", "e5m2"});
  p.dtype = dtype == "fp16"   ? DType::kFloat16
            : dtype == "bf16" ? DType::kBFloat16
            : dtype == "e4m3" ? DType::kFloat8E4M3
                              : DType::kFloat8E5M2;
  if (!is_fp8(p.dtype)) {
    if (args.has("out-dtype")) {
      fail(Status::kInvalidArgument, "--out-dtype needs --dtype e4m3 or e5m2 (a 16-bit run's output is of --dtype)");
    }
    return;
  }
  const std::string fp8 = "--dtype " + dtype;
  if (args.has("backward")) {
    fail(Status::kInvalidArgument, fp8 + " runs the FP8 forward only: no --backward (the FP8 backward is the C "
                                         "ABI's flashgen_attention_backward)");
  }
  if (args.has("varlen")) {
    fail(Status::kInvalidArgument, fp8 + " runs the FP8 forward of dense batches: no --varlen (packed batches take "
                                         "fp16 or bf16)");
  }
  if (args.has("kv-cache")) {
    fail(Status::kInvalidArgument, fp8 + " with --kv-cache: a KV-cache call's queries are fp16 or bf16 (--dtype); an "
                                         "FP8 cache is --cache-dtype " + dtype);
  }
  p.out_dtype = args.choice_or("out-dtype", "bf16", {"bf16", "fp16"}) == "bf16" ? DType::kBFloat16 : DType::kFloat16;
}

RunOptions parse_run_options(const Args& args) {
  constexpr long long kSizeMax = 1ll << 30;  // the library's limit on every size
  RunOptions o;
  AttentionProblem& p = o.problem;
  AttentionShape& s = p.shape;
  s.batch = args.int_or("batch", s.batch, 1, kSizeMax);
  p.kv_cache = args.has("kv-cache");
  s.seqlen_q = args.int_or("seqlen-q", p.kv_cache ? 1 : s.seqlen_q, 1, kSizeMax);
  s.seqlen_k = args.int_or("seqlen-k", s.seqlen_k, 1, kSizeMax);
  s.heads_q = args.int_or("heads-q", s.heads_q, 1, kSizeMax);
  s.heads_kv = args.int_or("heads-kv", s.heads_kv, 1, kSizeMax);
  s.head_dim = args.int_or("head-dim", s.head_dim, 1, 4096);
  s.head_dim_v = args.int_or("head-dim-v", s.head_dim, 1, 4096);
  if (s.head_dim_v == s.head_dim) s.head_dim_v = 0;
  dtypes_from_flags(args, p);
  if (is_fp8(p.dtype) && s.head_dim_v != 0) {
    fail(Status::kInvalidArgument, "--head-dim-v: the FP8 forward takes values of the queries' head dim (--head-dim)");
  }
  mask_from_flags(args, p);
  o.scale = static_cast<float>(args.double_or("scale", o.scale));
  p.softcap = static_cast<float>(args.double_or("softcap", 0.0));
  p.alibi = args.has("alibi");
  if (args.has("sink")) {
    o.sink = static_cast<float>(args.double_or("sink", 0.0));
    // -inf is no sink at all; NaN and +inf would make every output NaN or zero.
    if (std::isnan(*o.sink) || *o.sink == std::numeric_limits<float>::infinity())
      throw UsageError("--sink must be a finite logit or -inf, got " + args.string_or("sink", ""), args.usage());
  }
  o.layout = args.choice_or("layout", o.layout, {"bshd", "bhsd"});
  if (args.has("config")) o.config_name = args.string_or("config", "");
  p.pass = args.has("backward") ? Pass::kBackward : Pass::kForward;
  p.dq = args.has("deterministic") ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
  if (p.dq == DqStrategy::kDeterministic && !p.backward())
    fail(Status::kInvalidArgument, "--deterministic needs --backward");
  o.iters = static_cast<int>(args.int_or("iters", o.iters, 1, 1000000));
  o.warmup = static_cast<int>(args.int_or("warmup", o.warmup, 0, 1000000));
  o.check_rows = static_cast<int>(args.int_or("check-rows", o.check_rows, 0, 1000000));
  o.seed = static_cast<uint32_t>(args.int_or("seed", o.seed, 0, std::numeric_limits<uint32_t>::max()));
  if (args.has("splits") && !p.kv_cache) fail(Status::kInvalidArgument, "--splits needs --kv-cache");
  cache_dtype_from_flags(args, p);
  if (p.kv_cache && (p.backward() || o.layout != "bshd"))
    fail(Status::kInvalidArgument, "--kv-cache runs the forward on bshd tensors: no --backward or --layout bhsd");
  packed_from_flags(args, p);
  if (args.has("page-size") && !p.kv_cache && !(p.varlen && !p.backward()))
    fail(Status::kInvalidArgument, "--page-size needs --kv-cache, or --varlen without --backward");
  if (p.varlen && o.layout != "bshd") fail(Status::kInvalidArgument, "--varlen packs bshd rows: no --layout bhsd");
  const int page_size = static_cast<int>(args.int_or("page-size", 0, 0, kSizeMax));
  o.splits = static_cast<int>(args.int_or("splits", 0, 0, 1 << 20));
  if (p.kv_cache) {
    p.page_size = page_size;
    p.paged = page_size > 0;
  } else {
    o.prefill_page_size = page_size;  // the packed call's block table (the problem itself is the packed one)
  }
  return o;
}

// "128", or "192/128" where the values have a head dim of their own.
std::string head_dims_text(const AttentionShape& s) {
  return std::to_string(s.head_dim) + (s.value_dim() != s.head_dim ? "/" + std::to_string(s.value_dim()) : "");
}

std::string problem_text(const RunOptions& o, double scale) {
  const AttentionShape& s = o.problem.shape;
  const std::string packed =
      o.problem.varlen ? format("packed: %lld/%lld query/key tokens in all, ", static_cast<long long>(o.problem.total_q),
                                static_cast<long long>(o.problem.total_k))
                       : std::string();
  const std::string cap = (o.problem.softcapped() ? format(", softcap %.6g", o.problem.softcap) : std::string()) +
                          (o.problem.alibi ? ", ALiBi" : "") +
                          (o.sink ? format(", sink %.6g", *o.sink) : std::string()) +
                          (o.problem.cache_dtype ? format(", %s cache", dtype_name(*o.problem.cache_dtype))
                                                 : std::string());
  // An FP8 run: its codes' spread, descales and output type beside the format.
  const std::string dtype =
      is_fp8(o.problem.dtype)
          ? format("%s (normal codes of std %.0f, descales q %.4g k %.4g v %.4g) to %s", dtype_name(o.problem.dtype),
                   kFp8CodeSpread, fp8_input_descale(0), fp8_input_descale(1), fp8_input_descale(2),
                   dtype_name(o.problem.output_dtype()))
          : std::string(dtype_name(o.problem.dtype));
  return packed + format("batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %s, %s, mask %s, scale %.6g%s, "
                "layout %s",
                static_cast<long long>(s.batch), static_cast<long long>(s.seqlen_q), static_cast<long long>(s.seqlen_k),
                static_cast<long long>(s.heads_q), static_cast<long long>(s.heads_kv),
                head_dims_text(s).c_str(), dtype.c_str(), mask_description(o.problem).c_str(),
                scale, cap.c_str(), o.layout.c_str());
}

// The backward half of `run --backward`: random dout, one checked backward (against the whole float64
// reference when the problem is small enough), then timing with a workspace allocated once.
void run_backward(const RunOptions& o, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                  const TensorView& q_view, const TensorView& k_view, const TensorView& v_view,
                  const TensorView& out_view, const float* lse, const CallOptions& options,
                  CUstream stream, std::mt19937& rng, RunReport& report) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& shape = p.shape;
  const bool bhsd = o.layout == "bhsd";
  HostTensor dout = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.value_dim(), bhsd);
  HostTensor dq = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd);
  HostTensor dk = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd);
  HostTensor dv = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim(), bhsd);
  fill_normal(dout, rng);
  DeviceBuffer dout_dev(dout.bytes()), dq_dev(dq.bytes()), dk_dev(dk.bytes()), dv_dev(dv.bytes());
  dout_dev.upload(dout.bits);
  for (DeviceBuffer* b : {&dq_dev, &dk_dev, &dv_dev}) b->fill_bytes(0xFF, stream);
  CallOptions backward_options = options;
  DeviceBuffer dsinks_dev;
  if (backward_options.sinks != nullptr) {  // the sinks' gradient, poisoned as the others
    dsinks_dev = DeviceBuffer(static_cast<size_t>(shape.heads_q) * sizeof(float));
    dsinks_dev.fill_bytes(0xFF, stream);
    backward_options.dsinks = static_cast<float*>(dsinks_dev.data());
  }
  const TensorView dout_view = tensor_view(dout, dout_dev), dq_view = tensor_view(dq, dq_dev),
                        dk_view = tensor_view(dk, dk_dev), dv_view = tensor_view(dv, dv_dev);
  const BackwardCall problem =
      make_backward_call(&q_view, &k_view, &v_view, &out_view, &dout_view, lse, &dq_view, &dk_view, &dv_view,
                            &backward_options);
  BwdConfig config;
  if (o.config_name) {
    config = BwdConfig::from_name(*o.config_name);
    FLASHGEN_REQUIRE(config.deterministic == p.deterministic(),
                     "config " + config.name() + (config.deterministic ? " is" : " is not") +
                         " deterministic; pass --deterministic to match");
    report.reason = "requested with --config";
  } else {
    // The launch's own choice: tuning data first (as the library call makes it), then the built-in one.
    const BackwardLaunch chosen = plan_backward(problem, stream).launch;
    config = chosen.config;
    report.reason = chosen.reason;
  }
  report.config_name = config.name();
  DeviceBuffer workspace(backward_workspace_bytes(problem, config));
  auto launch = [&] { launch_backward(problem, stream, config, workspace.ptr(), workspace.bytes()); };

  const Clock::time_point first = Clock::now();
  launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  report.first_launch_ms = ms_since(first);

  // The forward's sampled rows were checked before: its mismatches stay in the report, the backward's join them.
  const CheckResult forward = report.check;
  report.check = CheckResult{};
  report.check.mismatches = forward.mismatches;
  for (const std::string& line : forward.first_mismatches) report.check.first_mismatches.push_back("forward: " + line);
  if (shape.reference_cost() <= kMaxBackwardCheckCost) {
    dq_dev.download(dq.bits.data(), dq.bytes());
    dk_dev.download(dk.bits.data(), dk.bytes());
    dv_dev.download(dv.bits.data(), dv.bytes());
    const AttentionGradients ref = attention_backward_reference_f64(shape, q.input(), k.input(), v.input(),
                                                                    dout.input(), report.scale, p.mask,
                                                                    run_variant(o));
    for (const auto& [name, got, want] : {std::tuple{"dq", &dq, &ref.dq}, std::tuple{"dk", &dk, &ref.dk},
                                           std::tuple{"dv", &dv, &ref.dv}}) {
      check_gradient(name, got->input(), *want, p.dtype, report.check);
    }
    if (backward_options.dsinks != nullptr) {  // fp32 [heads_q], as a [1, 1, heads_q, 1] tensor of floats
      const std::vector<float> got_f = dsinks_dev.download_all<float>();
      const std::vector<double> got(got_f.begin(), got_f.end());
      check_gradient("dsinks", HostInput::float64(got.data(), StridedView::contiguous(1, 1, shape.heads_q, 1)),
                     ref.dsinks, p.dtype, report.check);
    }
    report.check.rows = static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
  }
  report.times_ms = time_launches(launch, o.warmup, o.iters, stream);
  report.flops = backward_flops(shape, p.mask, window_of(p));
}

}  // namespace

RunReport run_problem(const RunOptions& o) {
  RunReport report;
  report.options = o;
  ScopedContext context;  // the current context, else device 0's primary context
  char name[256] = {};
  FLASHGEN_CU_CHECK(cuDeviceGetName(name, sizeof name, context.device()));
  report.device_name = name;
  report.device_sm = device_sm(context.device());
  if (o.problem.kv_cache) return run_kvcache(o, context, report);
  if (o.problem.varlen) return run_varlen(o, context, report);
  if (is_fp8(o.problem.dtype)) return run_fp8(o, report);

  const AttentionProblem& p = o.problem;
  const AttentionShape& shape = p.shape;
  std::optional<KernelConfig> config;
  if (o.config_name && !p.backward()) config = KernelConfig::from_name(*o.config_name);

  const bool bhsd = o.layout == "bhsd";
  HostTensor q = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd);
  HostTensor k = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd);
  HostTensor v = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim(), bhsd);
  HostTensor out = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.value_dim(), bhsd);
  std::vector<float> lse(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q));

  DeviceBuffer q_dev(q.bytes()), k_dev(k.bytes()), v_dev(v.bytes()), out_dev(out.bytes());
  DeviceBuffer lse_dev(lse.size() * sizeof(float));
  const TensorView q_view = tensor_view(q, q_dev), k_view = tensor_view(k, k_dev), v_view = tensor_view(v, v_dev),
                        out_view = tensor_view(out, out_dev);
  float* lse_ptr = static_cast<float*>(lse_dev.data());
  CallOptions options = call_options(p, o.scale);
  options.deterministic = false;  // the backward's, set for it below
  DeviceBuffer slopes_dev;
  options.alibi_slopes = upload_alibi_slopes(p, slopes_dev);
  DeviceBuffer sinks_dev;
  options.sinks = upload_sinks(o, sinks_dev);
  // Validate before the slow part (host data): a bad shape fails here with the library's own message.
  const ForwardCall problem = make_forward_call(&q_view, &k_view, &v_view, &out_view, lse_ptr, &options);
  report.scale = problem.params.variant.scale;

  std::mt19937 rng(o.seed);
  fill_normal(q, rng);
  fill_normal(k, rng);
  fill_normal(v, rng);
  q_dev.upload(q.bits);
  k_dev.upload(k.bits);
  v_dev.upload(v.bits);
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
  report.check = check_sampled_rows(shape, q.input(), k.input(), v.input(), out.input(), lse.data(), p.dtype,
                                    sample_rows(shape.batch, shape.heads_q, shape.seqlen_q, o.check_rows),
                                    report.scale, p.mask, run_variant(o));
  if (p.backward()) {
    options.deterministic = p.deterministic();
    run_backward(o, q, k, v, q_view, k_view, v_view, out_view, lse_ptr, options, stream.get(), rng, report);
    return report;
  }

  report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
  report.flops = forward_flops(shape, p.mask, window_of(p));
  return report;
}

std::string tflops_text(double tflops) { return format(tflops >= 1 ? "%.1f TFLOP/s" : "%.3g TFLOP/s", tflops); }

void print_run_report(const RunReport& r, std::ostream& os) {
  const AttentionProblem& p = r.options.problem;
  const DtypeTolerances& tol = tolerances(p.dtype);
  os << "device:   " << r.device_name << " (sm_" << r.device_sm << ")\n"
     << "problem:  " << problem_text(r.options, r.scale) << '\n'
     << "pass:     " << pass_text(p) << '\n'
     << "config:   " << r.config_name << " for " << arch_label(r.arch) << '\n'
     << "why:      " << r.reason << '\n'
     << format("first:    %.1f ms (first launch, includes compiling or loading the kernel)\n", r.first_launch_ms);
  if (r.check.fp8) {
    const CheckResult::Fp8Bounds& fp8 = *r.check.fp8;
    os << format("check:    %zu rows by FlashAttention-3's FP8 rule, max abs error out %.3g (bound %.3g = 2 x %.3g, "
                 "float64 with P rounded to e4m3, + 2 ulp), lse %.3g (bound 1e-3 + 2^-11 sum|q k|, at most %.3g): %s\n",
                 r.check.rows, r.check.max_error_out, fp8.bound_out, fp8.p_rounded_error_out, r.check.max_error_lse,
                 fp8.bound_lse, r.check.pass() ? "PASS" : "FAIL");
  } else if (!p.backward()) {
    os << format("check:    %zu rows, max abs error out %.3g (tol %.0e + %.0e*|ref|), lse %.3g (tol %.0e): %s\n",
                 r.check.rows, r.check.max_error_out, tol.out.abs, tol.out.rel, r.check.max_error_lse, tol.lse.abs,
                 r.check.pass() ? "PASS" : "FAIL");
  } else if (r.check.rows == 0) {
    os << "check:    skipped: the float64 reference of this problem is too large (shrink it to check)\n";
  } else {
    os << format("check:    %s against the float64 reference, max |got - ref| / max |ref| %.3g (tol %.0e): %s\n",
                 r.options.sink && !p.varlen ? "dq, dk, dv, dsinks" : "dq, dk, dv", r.check.max_error_out, tol.gradient,
                 r.check.pass() ? "PASS" : "FAIL");
  }
  for (const std::string& line : r.check.first_mismatches) os << "          mismatch: " << line << '\n';
  if (r.check.mismatches > static_cast<int64_t>(r.check.first_mismatches.size()))
    os << "          ... " << r.check.mismatches << " mismatches in all\n";
  os << format("time:     median %.4f ms (min %.4f, max %.4f) over %zu launches after %d warm-up\n", r.median_ms(),
               r.times_ms.front(), r.times_ms.back(), r.times_ms.size(), r.options.warmup)
     << "speed:    " << tflops_text(r.tflops()) << format(" (%.4g GFLOP per launch)\n", r.flops / 1e9);
  if (r.kv_bytes > 0) {
    os << format("reads:    %.0f GB/s of K and V (%.4g MB per launch)\n", r.kv_bytes / (r.median_ms() * 1e-3) / 1e9,
                 r.kv_bytes / 1e6);
  }
}

namespace {

Json run_report_json(const RunReport& r) {
  const RunOptions& o = r.options;
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  Json varlen = nullptr;
  if (p.varlen) {
    const PackedBatch batch = packed_batch(p);
    varlen = {{"total_q", p.total_q}, {"total_k", p.total_k}, {"seqlens_q", batch.len_q}, {"seqlens_k", batch.len_k}};
  }
  return {
      {"device", {{"name", r.device_name}, {"sm", r.device_sm}}},
      {"problem",
       {{"batch", s.batch}, {"seqlen_q", s.seqlen_q}, {"seqlen_k", s.seqlen_k}, {"heads_q", s.heads_q},
        {"heads_kv", s.heads_kv}, {"head_dim", s.head_dim}, {"head_dim_v", s.value_dim()},
        {"dtype", dtype_name(p.dtype)}, {"out_dtype", dtype_name(p.output_dtype())},
        // An FP8 run's descales of q, k and v (one per tensor); null for 16-bit runs.
        {"descales", is_fp8(p.dtype) ? Json::array({fp8_input_descale(0), fp8_input_descale(1), fp8_input_descale(2)})
                                     : Json(nullptr)},
        {"causal", causal_text(p.mask)},
        {"window", p.windowed() ? Json::array({p.window_left, p.window_right}) : Json(nullptr)},
        {"scale", r.scale}, {"softcap", p.softcap}, {"alibi", p.alibi},
        {"sink", o.sink ? Json(*o.sink) : Json(nullptr)}, {"layout", o.layout}, {"seed", o.seed}}},
      {"pass", p.backward() ? "backward" : "forward"},
      {"kv_cache", p.kv_cache ? Json{{"page_size", p.page_size}, {"splits", o.splits}, {"kv_bytes", r.kv_bytes},
                                     {"cache_dtype", dtype_name(p.kv_dtype())}}
                              : Json(nullptr)},
      {"varlen", varlen},
      {"deterministic", p.deterministic()},
      {"config", r.config_name},
      {"arch", r.arch},
      {"reason", r.reason},
      {"first_launch_ms", r.first_launch_ms},
      {"check",
       {{"rows", r.check.rows}, {"max_abs_error_out", r.check.max_error_out},
        {"max_abs_error_lse", r.check.max_error_lse}, {"mismatches", r.check.mismatches},
        {"first_mismatches", r.check.first_mismatches},
        // FlashAttention-3's rule for an FP8 run (null otherwise): the bounds max_abs_error_out and _lse were held to.
        {"fp8", r.check.fp8 ? Json{{"p_rounded_error_out", r.check.fp8->p_rounded_error_out},
                                   {"bound_out", r.check.fp8->bound_out},
                                   {"bound_lse", r.check.fp8->bound_lse}}
                            : Json(nullptr)},
        // A backward too large for the float64 reference is not checked: pass is null unless the forward failed.
        {"skipped", p.backward() && r.check.rows == 0},
        {"pass", p.backward() && r.check.rows == 0 && r.check.pass() ? Json(nullptr) : Json(r.check.pass())}}},
      {"timing",
       {{"iters", r.times_ms.size()}, {"warmup", o.warmup}, {"median_ms", r.median_ms()},
        {"min_ms", r.times_ms.front()}, {"max_ms", r.times_ms.back()}, {"flops", r.flops}, {"tflops", r.tflops()}}},
  };
}

// The host copies of `run` (inputs, output, LSE; with --backward dout and the three gradients) are
// allocated before the library sees the problem: refuse what this machine cannot hold instead of being
// killed for it.
void check_host_memory(const RunOptions& o) {
  const AttentionShape& s = o.problem.shape;
  // Each pair of q and out, k and v: one of each head dim.
  const double dims = (s.head_dim + s.value_dim()) / 2.0;
  const double q_elements = double(s.batch) * s.seqlen_q * s.heads_q * dims;
  const double kv_elements = double(s.batch) * s.seqlen_k * s.heads_kv * dims;
  const double host_bytes =
      2 * (o.problem.backward() ? 4 : 2) * (q_elements + kv_elements) + 4.0 * s.batch * s.heads_q * s.seqlen_q;
  const double memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (memory_bytes > 0 && host_bytes > 0.8 * memory_bytes) {
    char text[160];
    std::snprintf(text, sizeof text, "this problem's host tensors need %.1f GiB; this machine has %.1f GiB",
                  host_bytes / double(1 << 30), memory_bytes / double(1 << 30));
    fail(Status::kInvalidArgument, text);
  }
}

}  // namespace

namespace {

// A --config for a dense run: one of the problem's, not a packed-batch kernel.
template <class Config>
void check_dense_config(const Config& config, const AttentionProblem& problem) {
  check_requested_config(config, problem, 90);
  FLASHGEN_REQUIRE(!config.varlen, "config " + config.name() + " runs packed batches: pass --varlen");
}

}  // namespace

void check_run_problem(const RunOptions& o) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  auto placeholder = [&](int n, int64_t seqlen, int64_t heads, int64_t head_dim, DType dtype) {
    return bshd_view(reinterpret_cast<void*>(uintptr_t{1} << (20 + n)), dtype, s.batch, seqlen, heads, head_dim);
  };
  const TensorView q = placeholder(0, s.seqlen_q, s.heads_q, s.head_dim, p.dtype),
                   k = placeholder(1, s.seqlen_k, s.heads_kv, s.head_dim, p.dtype),
                   v = placeholder(2, s.seqlen_k, s.heads_kv, s.value_dim(), p.dtype),
                   out = placeholder(3, s.seqlen_q, s.heads_q, s.value_dim(), p.output_dtype());
  CallOptions options = call_options(p, o.scale);
  options.alibi_slopes = placeholder_alibi_slopes(p);
  if (o.sink) options.sinks = reinterpret_cast<const float*>(uintptr_t{1} << 33);  // a stand-in: nothing launches
  if (is_fp8(p.dtype)) {  // the descales' stand-ins, as run_fp8 passes one array of three
    const float* descales = reinterpret_cast<const float*>(uintptr_t{1} << 34);
    options.q_descale = descales, options.k_descale = descales + 1, options.v_descale = descales + 2;
  }
  if (p.kv_cache) return check_kvcache_problem(o);
  if (p.varlen) return check_varlen_problem(o);
  if (p.backward()) {
    const TensorView dout = placeholder(4, s.seqlen_q, s.heads_q, s.value_dim(), p.dtype),
                     dq = placeholder(5, s.seqlen_q, s.heads_q, s.head_dim, p.dtype),
                     dk = placeholder(6, s.seqlen_k, s.heads_kv, s.head_dim, p.dtype),
                     dv = placeholder(7, s.seqlen_k, s.heads_kv, s.value_dim(), p.dtype);
    const float* lse = reinterpret_cast<const float*>(uintptr_t{1} << 28);
    const BackwardCall call = make_backward_call(&q, &k, &v, &out, &dout, lse, &dq, &dk, &dv, &options);
    if (o.config_name) check_dense_config(BwdConfig::from_name(*o.config_name), call.problem);
  } else {
    const ForwardCall call = make_forward_call(&q, &k, &v, &out, nullptr, &options);
    if (o.config_name) check_dense_config(KernelConfig::from_name(*o.config_name), call.problem);
  }
}

namespace {

// A refusal of the library's checks, which name the C ABI's arguments, led by the flag that set the first one it
// names: "--head-dim: q.shape[3] (head_dim) = 100 is unsupported ...".
std::string with_flag(const std::string& message) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"q.shape[0]", "--batch"},          {"q.shape[1]", "--seqlen-q"},       {"k.shape[1] (page_size)", "--page-size"},
      {"k.shape[1]", "--seqlen-k"},
      {"q.shape[2]", "--heads-q"},        {"k.shape[2]", "--heads-kv"},       {"q.shape[3]", "--head-dim"},
      {"v.shape[3]", "--head-dim-v"},     {"head_dim_v", "--head-dim-v"},
      {"k_cache.shape[3]", "--head-dim"}, {"v_cache.shape[3]", "--head-dim-v"},
      {"k_cache.shape[1]", "--page-size"}, {"opts.softmax_scale", "--scale"}, {"opts.softcap", "--softcap"},
      {"opts.window_", "--window"},       {"opts.attention_chunk", "--chunk"}, {"num_splits", "--splits"},
      {"total_q", "--total-q"},           {"total_k", "--total-k"}};
  size_t first = std::string::npos;
  const char* flag = nullptr;
  for (const auto& [argument, name] : kFlags) {
    const size_t at = message.find(argument);
    if (at < first) first = at, flag = name;
  }
  return flag != nullptr ? std::string(flag) + ": " + message : message;
}

}  // namespace

int command_run(const Args& args) {
  const RunOptions options = parse_run_options(args);
  try {
    check_run_problem(options);
  } catch (const Error& error) {
    throw Error(error.status(), with_flag(error.what()));
  }
  check_host_memory(options);
  std::string why;
  if (!driver_available(&why)) fail(Status::kNoDevice, "run needs a GPU: " + why);
  const RunReport report = run_problem(options);
  if (args.has("json")) print_json(run_report_json(report));
  else print_run_report(report, std::cout);
  return report.check.pass() ? 0 : 1;
}

}  // namespace flashgen::cli
