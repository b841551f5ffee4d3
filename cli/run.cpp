// `flashgen run`: one attention problem on the GPU, forward or backward: random normal inputs, a check
// against the float64 reference (sampled rows, or whole gradients), then timing with CUDA events.
#include "cli/run.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <numeric>
#include <random>
#include <set>

#include <unistd.h>

#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/table.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "flashgen/flashgen.h"
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
      .option("dtype", "T", "fp16 or bf16 (default fp16)")
      .option("causal", "MODE", "none, bottom-right or top-left (default none)")
      .option("scale", "S", "softmax scale; <= 0 means 1/sqrt(head_dim) (default 0)")
      .option("layout", "L", "memory order of q/k/v/out: bshd or bhsd (default bshd)")
      .option("config", "NAME", "run this config (a fwd_... name, or bwd_... with --backward) instead of the choice")
      .flag("backward", "time the backward pass (dq, dk, dv for a random dout) after one forward")
      .flag("kv-cache", "decoding: seqlen-q new tokens (default 1) per sequence against full KV caches of seqlen-k "
                        "keys (flashgen_attention_kvcache); --config takes a dec_... module")
      .option("page-size", "N", "with --kv-cache: a paged cache of N-key pages in a shuffled order (default 0: contiguous)")
      .option("splits", "N", "with --kv-cache: key ranges per sequence (default 0: chosen for the GPU)")
      .flag("deterministic", "with --backward: the deterministic dQ strategy (bitwise repeatable)")
      .option("iters", "N", "timed launches (default 20)")
      .option("warmup", "N", "untimed launches before timing (default 3)")
      .option("check-rows", "N", "query rows checked against the reference, plus the last one (default 64)")
      .option("seed", "S", "random seed of the inputs (default 0)")
      .flag("json", "print one JSON object");
}

namespace {

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
  p.dtype = args.choice_or("dtype", "fp16", {"fp16", "bf16"}) == "fp16" ? DType::kFloat16 : DType::kBFloat16;
  p.mask = mask_from_text(args.choice_or("causal", causal_text(p.mask), {"none", "bottom-right", "top-left"}));
  o.scale = static_cast<float>(args.double_or("scale", o.scale));
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
  for (const char* name : {"page-size", "splits"}) {
    if (args.has(name) && !p.kv_cache) fail(Status::kInvalidArgument, std::string("--") + name + " needs --kv-cache");
  }
  if (p.kv_cache && (p.backward() || o.layout != "bshd"))
    fail(Status::kInvalidArgument, "--kv-cache runs the forward on bshd tensors: no --backward or --layout bhsd");
  p.page_size = static_cast<int>(args.int_or("page-size", 0, 0, kSizeMax));
  o.splits = static_cast<int>(args.int_or("splits", 0, 0, 1 << 20));
  p.paged = p.page_size > 0;
  return o;
}

flashgen_dtype abi_dtype(DType dtype) { return dtype == DType::kFloat16 ? FLASHGEN_FLOAT16 : FLASHGEN_BFLOAT16; }

// Host copy of one 16-bit tensor: the raw elements in memory order plus the view the library is given
// (shape [batch, seqlen, heads, head_dim], strides in elements).
struct HostTensor {
  DType dtype = DType::kFloat16;
  StridedView view;
  std::vector<uint16_t> bits;

  HostInput input() const { return HostInput::bits16(bits.data(), abi_dtype(dtype), view); }
  size_t bytes() const { return bits.size() * sizeof(uint16_t); }
};

// A host tensor of shape [batch, seqlen, heads, head_dim] laid out as bshd, or as [batch, heads, seqlen,
// head_dim] in memory for bhsd (the view's strides say so; its shape stays bshd).
HostTensor make_host_tensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                            bool bhsd) {
  HostTensor t;
  t.dtype = dtype;
  t.view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  if (bhsd) {
    t.view.stride[0] = heads * seqlen * head_dim;
    t.view.stride[1] = head_dim;
    t.view.stride[2] = seqlen * head_dim;
  }
  t.bits.resize(static_cast<size_t>(batch * seqlen * heads * head_dim));
  return t;
}

// Random normal values rounded to the tensor's type, in memory order.
void fill_normal(HostTensor& t, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& bits : t.bits) bits = float_to_dtype_bits(normal(rng), abi_dtype(t.dtype));
}

class Event {
 public:
  Event() { FLASHGEN_CU_CHECK(cuEventCreate(&event_, CU_EVENT_DEFAULT)); }
  ~Event() { driver().cuEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

flashgen_tensor tensor_view(const HostTensor& host, const DeviceBuffer& device) {
  flashgen_tensor view{};
  view.data = device.data();
  view.dtype = abi_dtype(host.dtype);
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = host.view.shape[i];
    view.stride[i] = host.view.stride[i];
  }
  return view;
}

// `count` rows spread evenly over all (batch, head, query) rows, plus the very last query row.
std::vector<RowSample> sample_rows(int64_t batch, int64_t heads, int64_t seqlen_q, int64_t count) {
  std::set<int64_t> flat;  // (batch * heads + head) * seqlen_q + row: sorted and without repeats
  const int64_t total = batch * heads * seqlen_q;
  for (int64_t r = 0; r < count; ++r) flat.insert(count == 1 ? 0 : r * (total - 1) / (count - 1));
  flat.insert(total - 1);
  std::vector<RowSample> rows;
  for (int64_t t : flat) rows.push_back({t / (heads * seqlen_q), t / seqlen_q % heads, t % seqlen_q});
  return rows;
}

// Adds a check's mismatches to result, which lists the first kShownMismatches of all its checks.
void add_mismatches(const CheckReport& report, CheckResult& result) {
  result.mismatches += report.mismatches;
  for (const std::string& line : report.first_mismatches) {
    if (result.first_mismatches.size() < kShownMismatches) result.first_mismatches.push_back(line);
  }
}

CheckResult check_sampled_rows(const AttentionShape& shape, const HostTensor& q, const HostTensor& k,
                               const HostTensor& v, const HostTensor& out, const std::vector<float>& lse,
                               const std::vector<RowSample>& rows, double scale, flashgen_mask mask) {
  // The float64 reference is the slow part for long sequences: rows are independent, so use every core.
  const std::vector<ReferenceRow> reference =
      attention_reference_rows(shape, q.input(), k.input(), v.input(), scale, mask, rows, default_jobs());
  const RowsCheck check = check_rows(shape, rows, reference, out.input(), lse.data(), abi_dtype(q.dtype));
  CheckResult result;
  result.rows = rows.size();
  result.max_error_out = check.out.max_error;
  result.max_error_lse = check.lse.max_error;
  add_mismatches(check.out, result);
  add_mismatches(check.lse, result);
  return result;
}

std::string problem_text(const RunOptions& o, double scale) {
  const AttentionShape& s = o.problem.shape;
  return format("batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld, %s, mask %s, scale %.6g, "
                "layout %s",
                static_cast<long long>(s.batch), static_cast<long long>(s.seqlen_q), static_cast<long long>(s.seqlen_k),
                static_cast<long long>(s.heads_q), static_cast<long long>(s.heads_kv),
                static_cast<long long>(s.head_dim), dtype_name(o.problem.dtype), causal_text(o.problem.mask).c_str(),
                scale, o.layout.c_str());
}

// Largest problem whose backward `run --backward` checks against the whole float64 reference
// (batch * heads * seqlen_q * seqlen_k * head_dim multiply-adds, about a minute on one core).
constexpr double kMaxBackwardCheckCost = 4e9;

// Events around every launch of fn on stream; sorted milliseconds.
std::vector<double> time_launches(const std::function<void()>& fn, int warmup, int iters, CUstream stream) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<Event> starts(static_cast<size_t>(iters)), stops(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    FLASHGEN_CU_CHECK(cuEventRecord(starts[i].get(), stream));
    fn();
    FLASHGEN_CU_CHECK(cuEventRecord(stops[i].get(), stream));
  }
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    FLASHGEN_CU_CHECK(cuEventElapsedTime(&ms, starts[i].get(), stops[i].get()));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times;
}

// The backward half of `run --backward`: random dout, one checked backward (against the whole float64
// reference when the problem is small enough), then timing with a workspace allocated once.
void run_backward(const RunOptions& o, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                  const flashgen_tensor& q_view, const flashgen_tensor& k_view, const flashgen_tensor& v_view,
                  const flashgen_tensor& out_view, const float* lse, const flashgen_attention_options& options,
                  CUstream stream, std::mt19937& rng, RunReport& report) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& shape = p.shape;
  const bool bhsd = o.layout == "bhsd";
  HostTensor dout = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd);
  HostTensor dq = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd);
  HostTensor dk = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd);
  HostTensor dv = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd);
  fill_normal(dout, rng);
  DeviceBuffer dout_dev(dout.bytes()), dq_dev(dq.bytes()), dk_dev(dk.bytes()), dv_dev(dv.bytes());
  dout_dev.upload(dout.bits);
  for (DeviceBuffer* b : {&dq_dev, &dk_dev, &dv_dev}) b->fill_bytes(0xFF, stream);
  const flashgen_tensor dout_view = tensor_view(dout, dout_dev), dq_view = tensor_view(dq, dq_dev),
                        dk_view = tensor_view(dk, dk_dev), dv_view = tensor_view(dv, dv_dev);
  const BackwardCall problem =
      make_backward_call(&q_view, &k_view, &v_view, &out_view, &dout_view, lse, &dq_view, &dk_view, &dv_view,
                            &options);
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
                                                                    dout.input(), report.scale, options.mask);
    const struct {
      const char* name;
      const HostTensor& got;
      const std::vector<double>& want;
    } grads[] = {{"dq", dq, ref.dq}, {"dk", dk, ref.dk}, {"dv", dv, ref.dv}};
    for (const auto& g : grads) {
      const HostInput got = g.got.input();
      const StridedView& view = g.got.view;
      std::vector<double> values;  // contiguous [b, s, h, d], as the reference
      values.reserve(g.want.size());
      for (int64_t b = 0; b < view.shape[0]; ++b)
        for (int64_t s = 0; s < view.shape[1]; ++s)
          for (int64_t h = 0; h < view.shape[2]; ++h)
            for (int64_t d = 0; d < view.shape[3]; ++d) values.push_back(got.at(b, s, h, d));
      const double magnitude = max_magnitude(g.want);
      const CheckReport check =
          check_elements(g.name, {view.shape[0], view.shape[1], view.shape[2], view.shape[3]}, values, g.want,
                         gradient_tolerance(abi_dtype(p.dtype), magnitude));
      report.check.max_error_out =
          std::max(report.check.max_error_out, check.max_error / std::max(magnitude, kGradientMagnitudeFloor));
      add_mismatches(check, report.check);
    }
    report.check.rows = static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
  }
  report.times_ms = time_launches(launch, o.warmup, o.iters, stream);
  report.flops = backward_flops(shape, options.mask);
}

// A --kv-cache run's cache: pages of page_size keys per sequence (ceil(seqlen_k / page_size) of them) in a
// shuffled order, or 0 for a contiguous cache.
int64_t pages_per_sequence(const RunOptions& o) {
  const int64_t page_size = o.problem.page_size;
  return o.problem.paged ? (o.problem.shape.seqlen_k + page_size - 1) / page_size : 0;
}

// flashgen_kvcache_args of a --kv-cache run: q and out, the caches (paged through table, else contiguous), every
// sequence's cache holding lens[b] = seqlen_k keys.
flashgen_kvcache_args kvcache_args(const RunOptions& o, const flashgen_tensor& q, const flashgen_tensor& k_cache,
                                   const flashgen_tensor& v_cache, const flashgen_tensor& out, float* lse,
                                   const int32_t* lens, const int32_t* table) {
  flashgen_kvcache_args args{};
  args.size = sizeof(args);
  args.q = q, args.k_cache = k_cache, args.v_cache = v_cache, args.out = out;
  args.lse = lse;
  args.cache_seqlens = lens;
  args.block_table = o.problem.paged ? table : nullptr;
  args.max_pages = pages_per_sequence(o);
  args.num_splits = o.splits;
  args.options.softmax_scale = o.scale;
  args.options.mask = o.problem.mask;
  return args;
}

// The shape of a --kv-cache run's k_cache or v_cache: [batch * pages, page_size, ...] paged, else [batch, seqlen_k, ...].
flashgen_tensor cache_tensor(const RunOptions& o, void* data) {
  const AttentionShape& s = o.problem.shape;
  const int64_t pages = pages_per_sequence(o);
  return o.problem.paged ? bshd_tensor(data, abi_dtype(o.problem.dtype), s.batch * pages, o.problem.page_size, s.heads_kv,
                                       s.head_dim)
                         : bshd_tensor(data, abi_dtype(o.problem.dtype), s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
}

// `run --kv-cache`: random q and caches (k and v as the reference sees them, scattered into shuffled pages
// when paged), one checked call, then timing.
RunReport run_kvcache(const RunOptions& o, const ScopedContext& context, RunReport report) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  HostTensor q = make_host_tensor(p.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim, false);
  HostTensor k = make_host_tensor(p.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, false);
  HostTensor v = make_host_tensor(p.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, false);
  HostTensor out = make_host_tensor(p.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim, false);
  std::vector<float> lse(static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q));
  std::mt19937 rng(o.seed);
  fill_normal(q, rng);
  fill_normal(k, rng);
  fill_normal(v, rng);

  // The caches as the kernels read them: sequence b's key j in row j % page_size of page table[b][j / page_size].
  const int64_t pages = pages_per_sequence(o), row = s.heads_kv * s.head_dim;
  std::vector<int32_t> table(static_cast<size_t>(std::max<int64_t>(1, s.batch * pages)));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const int64_t page_size = p.page_size;
  const int64_t cache_rows = p.paged ? s.batch * pages * page_size : s.batch * s.seqlen_k;
  std::vector<uint16_t> k_cache(static_cast<size_t>(cache_rows * row)), v_cache(k_cache.size());
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seqlen_k; ++j) {
      const int64_t at =
          p.paged ? table[size_t(b * pages + j / page_size)] * page_size + j % page_size : b * s.seqlen_k + j;
      std::copy_n(k.bits.begin() + (b * s.seqlen_k + j) * row, row, k_cache.begin() + at * row);
      std::copy_n(v.bits.begin() + (b * s.seqlen_k + j) * row, row, v_cache.begin() + at * row);
    }

  DeviceBuffer q_dev(q.bytes()), out_dev(out.bytes()), lse_dev(lse.size() * sizeof(float));
  DeviceBuffer k_dev(k_cache.size() * 2), v_dev(v_cache.size() * 2), table_dev(table.size() * 4);
  DeviceBuffer lens_dev(static_cast<size_t>(s.batch) * 4);
  q_dev.upload(q.bits), k_dev.upload(k_cache), v_dev.upload(v_cache), table_dev.upload(table);
  lens_dev.upload(std::vector<int32_t>(static_cast<size_t>(s.batch), static_cast<int32_t>(s.seqlen_k)));
  out_dev.fill_bytes(0xFF);
  lse_dev.fill_bytes(0xFF);
  const flashgen_kvcache_args args =
      kvcache_args(o, tensor_view(q, q_dev), cache_tensor(o, k_dev.data()), cache_tensor(o, v_dev.data()),
                   tensor_view(out, out_dev), static_cast<float*>(lse_dev.data()),
                   static_cast<const int32_t*>(lens_dev.data()), static_cast<const int32_t*>(table_dev.data()));
  const KvCacheCall call = make_kvcache_call(args);

  Stream stream;
  std::optional<PreparedKvCache> requested;
  if (o.config_name) {
    const DecodeConfig config = DecodeConfig::from_name(*o.config_name);
    const int splits = o.splits > 0 ? o.splits
                                    : heuristic_decode_splits(p, config, report.device_sm,
                                                              device_traits(context.device()).multiprocessors);
    requested = prepare_kvcache(call, stream.get(), config, splits);
    report.config_name = config.name() + ", " + std::to_string(requested->splits) + " key ranges";
    report.reason = "requested with --config";
    report.arch = requested->arch;
  }
  const int device = static_cast<int>(context.device());
  auto launch = [&] {
    if (requested) {
      launch_prepared_kvcache(*requested, call, stream.get(), device);
      return KvCacheLaunch{};
    }
    return attention_kvcache(args, stream.get());
  };
  const Clock::time_point first = Clock::now();
  const KvCacheLaunch chosen = launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream.get()));
  report.first_launch_ms = ms_since(first);
  if (!requested) {
    report.config_name = chosen.config.name() + ", " + std::to_string(chosen.splits) + " key ranges";
    report.reason = chosen.reason;
    report.arch = chosen.arch;
  }
  report.scale = call.params.scale;
  out_dev.download(out.bits.data(), out.bytes());
  lse_dev.download(lse.data(), lse_dev.bytes());
  report.check = check_sampled_rows(s, q, k, v, out, lse, sample_rows(s.batch, s.heads_q, s.seqlen_q, o.check_rows),
                                    report.scale, p.mask);
  report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
  report.flops = forward_flops(s, p.mask);
  report.kv_bytes = 2.0 * s.batch * s.seqlen_k * s.heads_kv * s.head_dim * 2;
  return report;
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

  const AttentionProblem& p = o.problem;
  const AttentionShape& shape = p.shape;
  std::optional<KernelConfig> config;
  if (o.config_name && !p.backward()) config = KernelConfig::from_name(*o.config_name);

  const bool bhsd = o.layout == "bhsd";
  HostTensor q = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd);
  HostTensor k = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd);
  HostTensor v = make_host_tensor(p.dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim, bhsd);
  HostTensor out = make_host_tensor(p.dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim, bhsd);
  std::vector<float> lse(static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q));

  DeviceBuffer q_dev(q.bytes()), k_dev(k.bytes()), v_dev(v.bytes()), out_dev(out.bytes());
  DeviceBuffer lse_dev(lse.size() * sizeof(float));
  const flashgen_tensor q_view = tensor_view(q, q_dev), k_view = tensor_view(k, k_dev), v_view = tensor_view(v, v_dev),
                        out_view = tensor_view(out, out_dev);
  float* lse_ptr = static_cast<float*>(lse_dev.data());
  flashgen_attention_options options{};
  options.softmax_scale = o.scale;
  options.mask = p.mask;
  options.deterministic = 0;
  // Validate before the slow part (host data): a bad shape fails here with the library's own message.
  const ForwardCall problem = make_forward_call(&q_view, &k_view, &v_view, &out_view, lse_ptr, &options);
  report.scale = problem.params.scale;

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

  const Clock::time_point first = Clock::now();
  const ForwardLaunch forward_launch = launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream.get()));
  report.first_launch_ms = ms_since(first);
  report.config_name = flashgen::config_name(forward_launch.config);
  report.reason = forward_launch.reason;
  report.arch = forward_launch.arch;

  out_dev.download(out.bits.data(), out.bytes());
  lse_dev.download(lse.data(), lse_dev.bytes());
  report.check = check_sampled_rows(shape, q, k, v, out, lse,
                                    sample_rows(shape.batch, shape.heads_q, shape.seqlen_q, o.check_rows),
                                    report.scale, options.mask);
  if (p.backward()) {
    options.deterministic = p.deterministic() ? 1 : 0;
    run_backward(o, q, k, v, q_view, k_view, v_view, out_view, lse_ptr, options, stream.get(), rng, report);
    return report;
  }

  report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
  report.flops = forward_flops(shape, options.mask);
  return report;
}

std::string tflops_text(double tflops) { return format(tflops >= 1 ? "%.1f TFLOP/s" : "%.3g TFLOP/s", tflops); }

void print_run_report(const RunReport& r, std::ostream& os) {
  const AttentionProblem& p = r.options.problem;
  const DtypeTolerances& tol = tolerances(abi_dtype(p.dtype));
  os << "device:   " << r.device_name << " (sm_" << r.device_sm << ")\n"
     << "problem:  " << problem_text(r.options, r.scale) << '\n'
     << "pass:     " << pass_text(p) << '\n'
     << "config:   " << r.config_name << " for " << arch_label(r.arch) << '\n'
     << "why:      " << r.reason << '\n'
     << format("first:    %.1f ms (first launch, includes compiling or loading the kernel)\n", r.first_launch_ms);
  if (!p.backward()) {
    os << format("check:    %zu rows, max abs error out %.3g (tol %.0e + %.0e*|ref|), lse %.3g (tol %.0e): %s\n",
                 r.check.rows, r.check.max_error_out, tol.out.abs, tol.out.rel, r.check.max_error_lse, tol.lse.abs,
                 r.check.pass() ? "PASS" : "FAIL");
  } else if (r.check.rows == 0) {
    os << "check:    skipped: the float64 reference of this problem is too large (shrink it to check)\n";
  } else {
    os << format("check:    dq, dk, dv against the float64 reference, max |got - ref| / max |ref| %.3g (tol %.0e): "
                 "%s\n",
                 r.check.max_error_out, tol.gradient, r.check.pass() ? "PASS" : "FAIL");
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
  return {
      {"device", {{"name", r.device_name}, {"sm", r.device_sm}}},
      {"problem",
       {{"batch", s.batch}, {"seqlen_q", s.seqlen_q}, {"seqlen_k", s.seqlen_k}, {"heads_q", s.heads_q},
        {"heads_kv", s.heads_kv}, {"head_dim", s.head_dim}, {"dtype", dtype_name(p.dtype)},
        {"causal", causal_text(p.mask)}, {"scale", r.scale}, {"layout", o.layout}, {"seed", o.seed}}},
      {"pass", p.backward() ? "backward" : "forward"},
      {"kv_cache", p.kv_cache ? Json{{"page_size", p.page_size}, {"splits", o.splits}, {"kv_bytes", r.kv_bytes}}
                              : Json(nullptr)},
      {"deterministic", p.deterministic()},
      {"config", r.config_name},
      {"arch", r.arch},
      {"reason", r.reason},
      {"first_launch_ms", r.first_launch_ms},
      {"check",
       {{"rows", r.check.rows}, {"max_abs_error_out", r.check.max_error_out},
        {"max_abs_error_lse", r.check.max_error_lse}, {"mismatches", r.check.mismatches},
        {"first_mismatches", r.check.first_mismatches},
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
  const double q_elements = double(s.batch) * s.seqlen_q * s.heads_q * s.head_dim;
  const double kv_elements = double(s.batch) * s.seqlen_k * s.heads_kv * s.head_dim;
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

void check_run_problem(const RunOptions& o) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  const flashgen_dtype dtype = abi_dtype(p.dtype);
  auto placeholder = [&](int n, int64_t seqlen, int64_t heads) {
    return bshd_tensor(reinterpret_cast<void*>(uintptr_t{1} << (20 + n)), dtype, s.batch, seqlen, heads, s.head_dim);
  };
  const flashgen_tensor q = placeholder(0, s.seqlen_q, s.heads_q), k = placeholder(1, s.seqlen_k, s.heads_kv),
                        v = placeholder(2, s.seqlen_k, s.heads_kv), out = placeholder(3, s.seqlen_q, s.heads_q);
  flashgen_attention_options options{o.scale, p.mask, p.deterministic() ? 1 : 0};
  if (p.kv_cache) {
    auto address = [](int n) { return reinterpret_cast<void*>(uintptr_t{1} << (20 + n)); };
    const flashgen_kvcache_args args =
        kvcache_args(o, q, cache_tensor(o, address(1)), cache_tensor(o, address(2)), out, nullptr,
                     static_cast<const int32_t*>(address(4)), static_cast<const int32_t*>(address(5)));
    const KvCacheCall call = make_kvcache_call(args);
    if (o.config_name) {
      const DecodeConfig config = DecodeConfig::from_name(*o.config_name);
      check_requested_config(config, call.problem, 90);
      FLASHGEN_REQUIRE(config.paged == call.problem.paged,
                       "config " + config.name() + (config.paged ? " reads a paged cache: pass --page-size"
                                                                 : " reads a contiguous cache: drop --page-size"));
    }
    return;
  }
  if (p.backward()) {
    const flashgen_tensor dout = placeholder(4, s.seqlen_q, s.heads_q), dq = placeholder(5, s.seqlen_q, s.heads_q),
                          dk = placeholder(6, s.seqlen_k, s.heads_kv), dv = placeholder(7, s.seqlen_k, s.heads_kv);
    const float* lse = reinterpret_cast<const float*>(uintptr_t{1} << 28);
    const BackwardCall call = make_backward_call(&q, &k, &v, &out, &dout, lse, &dq, &dk, &dv, &options);
    if (o.config_name) check_requested_config(BwdConfig::from_name(*o.config_name), call.problem, 90);
  } else {
    const ForwardCall call = make_forward_call(&q, &k, &v, &out, nullptr, &options);
    if (o.config_name) check_requested_config(KernelConfig::from_name(*o.config_name), call.problem, 90);
  }
}

int command_run(const Args& args) {
  const RunOptions options = parse_run_options(args);
  check_run_problem(options);
  check_host_memory(options);
  std::string why;
  if (!driver_available(&why)) fail(Status::kNoDevice, "run needs a GPU: " + why);
  const RunReport report = run_problem(options);
  if (args.has("json")) print_json(run_report_json(report));
  else print_run_report(report, std::cout);
  return report.check.pass() ? 0 : 1;
}

}  // namespace flashgen::cli
