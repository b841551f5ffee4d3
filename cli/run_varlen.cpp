// `flashgen run --varlen`: a packed batch of sequences of different lengths (packed_batch of the problem's sizes)
// through flashgen_attention_varlen_forward and, with --backward, flashgen_attention_varlen_backward; each checked
// sequence against its own float64 reference, then timed.
#include <algorithm>
#include <random>
#include <optional>
#include <tuple>

#include "cli/common.hpp"
#include "cli/run_support.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/error.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/tensor_checks.hpp"

namespace flashgen::cli {

namespace {

// The device side of a packed run: offsets, and the tensors as the library sees them ([1, total, heads, head_dim]).
struct PackedTensors {
  TensorView q, k, v, out, dout, dq, dk, dv;
  float* lse = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  const float* alibi_slopes = nullptr;
  const float* sinks = nullptr;
  // --page-size: k and v as paged caches [num_pages, page_size, heads_kv, head_dim] read through table
  // [batch, max_pages] (null: contiguous).
  TensorView k_cache, v_cache;
  const int32_t* table = nullptr;
  int64_t max_pages = 0;
};

VarlenForwardArgs forward_args(const RunOptions& o, const PackedTensors& t) {
  const AttentionShape& s = o.problem.shape;
  VarlenForwardArgs args;
  args.q = t.q, args.k = t.k, args.v = t.v, args.out = t.out;
  args.lse = t.lse;
  args.cu_seqlens_q = t.cu_q, args.cu_seqlens_k = t.cu_k;
  args.batch = s.batch;
  args.max_seqlen_q = s.seqlen_q, args.max_seqlen_k = s.seqlen_k;
  args.options = call_options(o.problem, o.scale);
  args.options.alibi_slopes = t.alibi_slopes;
  args.options.sinks = t.sinks;
  if (o.prefill_page_size > 0) {
    args.k = t.k_cache, args.v = t.v_cache;
    args.block_table = t.table;
    args.max_pages = t.max_pages;
  }
  return args;
}

VarlenBackwardArgs backward_args(const RunOptions& o, const PackedTensors& t) {
  const VarlenForwardArgs f = forward_args(o, t);
  VarlenBackwardArgs args;
  args.q = t.q, args.k = t.k, args.v = t.v, args.out = t.out, args.dout = t.dout;
  args.dq = t.dq, args.dk = t.dk, args.dv = t.dv;
  args.lse = t.lse;
  args.cu_seqlens_q = t.cu_q, args.cu_seqlens_k = t.cu_k;
  args.batch = f.batch, args.max_seqlen_q = f.max_seqlen_q, args.max_seqlen_k = f.max_seqlen_k;
  args.options = f.options;
  return args;
}

// Sequence b's rows of a packed host tensor ([1, total, heads, head_dim]) as a batch-1 input.
HostInput sequence_rows(const HostTensor& t, const std::vector<int32_t>& cu, size_t b) {
  const int64_t heads = t.view.shape[2], head_dim = t.view.shape[3];
  return HostInput::bits16(t.bits.data() + int64_t(cu[b]) * heads * head_dim, t.dtype,
                           StridedView::contiguous(1, cu[b + 1] - cu[b], heads, head_dim));
}

}  // namespace

RunReport run_varlen(const RunOptions& o, const ScopedContext& context, RunReport report) {
  (void)context;
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  const PackedBatch batch = packed_batch(p);
  const DType dtype = p.dtype;
  HostTensor q = make_host_tensor(p.dtype, 1, batch.total_q(), s.heads_q, s.head_dim, false);
  HostTensor k = make_host_tensor(p.dtype, 1, batch.total_k(), s.heads_kv, s.head_dim, false);
  HostTensor v = make_host_tensor(p.dtype, 1, batch.total_k(), s.heads_kv, s.value_dim(), false);
  HostTensor out = make_host_tensor(p.dtype, 1, batch.total_q(), s.heads_q, s.value_dim(), false);
  std::vector<float> lse(static_cast<size_t>(s.heads_q * batch.total_q()));
  auto buffer = [](size_t bytes) { return DeviceBuffer(std::max<size_t>(bytes, 1)); };
  DeviceBuffer q_dev = buffer(q.bytes()), k_dev = buffer(k.bytes()), v_dev = buffer(v.bytes()),
               out_dev = buffer(out.bytes()), lse_dev = buffer(lse.size() * sizeof(float));
  DeviceBuffer cu_q_dev = buffer(batch.cu_q.size() * 4), cu_k_dev = buffer(batch.cu_k.size() * 4);
  PackedTensors t{};
  t.q = tensor_view(q, q_dev), t.k = tensor_view(k, k_dev), t.v = tensor_view(v, v_dev), t.out = tensor_view(out, out_dev);
  t.lse = static_cast<float*>(lse_dev.data());
  t.cu_q = static_cast<const int32_t*>(cu_q_dev.data()), t.cu_k = static_cast<const int32_t*>(cu_k_dev.data());
  DeviceBuffer slopes_dev;
  t.alibi_slopes = upload_alibi_slopes(p, slopes_dev);
  DeviceBuffer sinks_dev;
  t.sinks = upload_sinks(o, sinks_dev);
  std::mt19937 rng(o.seed);
  std::optional<PagedBatch> pages;
  DeviceBuffer k_cache_dev, v_cache_dev, table_dev;
  if (o.prefill_page_size > 0) {
    pages.emplace(batch, o.prefill_page_size, rng());
    const size_t page_rows = size_t(pages->num_pages() * o.prefill_page_size * s.heads_kv);
    k_cache_dev = buffer(page_rows * s.head_dim * 2), v_cache_dev = buffer(page_rows * s.value_dim() * 2);
    table_dev = buffer(pages->table.size() * 4);
    t.k_cache = bshd_view(k_cache_dev.data(), dtype, pages->num_pages(), o.prefill_page_size, s.heads_kv, s.head_dim);
    t.v_cache =
        bshd_view(v_cache_dev.data(), dtype, pages->num_pages(), o.prefill_page_size, s.heads_kv, s.value_dim());
    t.table = static_cast<const int32_t*>(table_dev.data());
    t.max_pages = pages->max_pages;
  }
  const VarlenForwardArgs args = forward_args(o, t);
  // Validate before the slow part (host data): a bad shape fails here with the library's own message.
  const ForwardCall call = make_varlen_forward_call(args);
  report.scale = call.params.variant.scale;

  fill_normal(q, rng);
  fill_normal(k, rng);
  fill_normal(v, rng);
  q_dev.upload(q.bits), k_dev.upload(k.bits), v_dev.upload(v.bits);
  if (pages) {
    k_cache_dev.upload(pages->cache_of(k.bits, s.heads_kv * s.head_dim, batch));
    v_cache_dev.upload(pages->cache_of(v.bits, s.heads_kv * s.value_dim(), batch));
    table_dev.upload(pages->table);
  }
  cu_q_dev.upload(batch.cu_q), cu_k_dev.upload(batch.cu_k);
  out_dev.fill_bytes(0xFF);  // NaN: anything the kernel fails to write shows up in the check
  lse_dev.fill_bytes(0xFF);

  Stream stream;
  std::optional<KernelConfig> config;
  if (o.config_name && !p.backward()) config = KernelConfig::from_name(*o.config_name);
  auto launch = [&] {
    return config ? attention_forward(call, stream.get(), *config) : attention_forward(args, stream.get());
  };
  const Clock::time_point first = Clock::now();
  const ForwardLaunch forward_launch = launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream.get()));
  report.first_launch_ms = ms_since(first);
  report.config_name = forward_launch.config.name();
  report.reason = forward_launch.reason;
  report.arch = forward_launch.arch;

  // Sampled rows of a few sequences (the longest, the shortest, the first and the last), each against its own
  // float64 reference; its lse rows gathered from the packed [heads_q, total_q] into [1, heads_q, seqlen].
  out_dev.download(out.bits.data(), out.bytes());
  lse_dev.download(lse.data(), lse.size() * sizeof(float));
  const std::vector<size_t> sequences = batch.sampled_sequences();
  for (size_t b : sequences) {
    const AttentionShape one = batch.sequence(b);
    std::vector<float> one_lse(static_cast<size_t>(one.heads_q * one.seqlen_q));
    for (int64_t h = 0; h < one.heads_q; ++h)
      for (int64_t r = 0; r < one.seqlen_q; ++r)
        one_lse[size_t(h * one.seqlen_q + r)] = lse[size_t(h * batch.total_q() + batch.cu_q[b] + r)];
    const int64_t rows = std::max<int64_t>(1, o.check_rows / static_cast<int64_t>(sequences.size()));
    add_check(check_sampled_rows(one, sequence_rows(q, batch.cu_q, b), sequence_rows(k, batch.cu_k, b),
                                 sequence_rows(v, batch.cu_k, b), sequence_rows(out, batch.cu_q, b), one_lse.data(),
                                 dtype, sample_rows(1, one.heads_q, one.seqlen_q, rows), report.scale, p.mask,
                                 run_variant(o)),
              report.check);
  }

  double forward_flops_total = 0, backward_flops_total = 0, reference_cost = 0;
  for (size_t b = 0; b < batch.len_q.size(); ++b) {
    forward_flops_total += forward_flops(batch.sequence(b), p.mask, window_of(p));
    backward_flops_total += backward_flops(batch.sequence(b), p.mask, window_of(p));
    reference_cost += batch.sequence(b).reference_cost();
  }
  if (!p.backward()) {
    report.times_ms = time_launches([&] { launch(); }, o.warmup, o.iters, stream.get());
    report.flops = forward_flops_total;
    return report;
  }

  // The backward: random dout, poisoned gradients, the choice a library call makes (or --config), one checked
  // call (the whole gradients of every sequence when the float64 reference is small enough), then timing.
  HostTensor dout = make_host_tensor(p.dtype, 1, batch.total_q(), s.heads_q, s.value_dim(), false);
  HostTensor dq = make_host_tensor(p.dtype, 1, batch.total_q(), s.heads_q, s.head_dim, false);
  HostTensor dk = make_host_tensor(p.dtype, 1, batch.total_k(), s.heads_kv, s.head_dim, false);
  HostTensor dv = make_host_tensor(p.dtype, 1, batch.total_k(), s.heads_kv, s.value_dim(), false);
  fill_normal(dout, rng);
  DeviceBuffer dout_dev = buffer(dout.bytes()), dq_dev = buffer(dq.bytes()), dk_dev = buffer(dk.bytes()),
               dv_dev = buffer(dv.bytes());
  dout_dev.upload(dout.bits);
  for (DeviceBuffer* b : {&dq_dev, &dk_dev, &dv_dev}) b->fill_bytes(0xFF, stream.get());
  t.dout = tensor_view(dout, dout_dev), t.dq = tensor_view(dq, dq_dev), t.dk = tensor_view(dk, dk_dev),
  t.dv = tensor_view(dv, dv_dev);
  const BackwardCall backward = make_varlen_backward_call(backward_args(o, t));
  BwdConfig bwd;
  if (o.config_name) {
    bwd = BwdConfig::from_name(*o.config_name);
    report.reason = "requested with --config";
  } else {
    const BackwardLaunch chosen = plan_backward(backward, stream.get()).launch;
    bwd = chosen.config;
    report.reason = chosen.reason;
  }
  report.config_name = bwd.name();
  DeviceBuffer workspace = buffer(backward_workspace_bytes(backward, bwd));
  auto launch_backward_once = [&] { launch_backward(backward, stream.get(), bwd, workspace.ptr(), workspace.bytes()); };
  const Clock::time_point first_backward = Clock::now();
  launch_backward_once();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream.get()));
  report.first_launch_ms = ms_since(first_backward);

  // The forward's sampled rows were checked before: its mismatches stay in the report, the backward's join them.
  const CheckResult forward = report.check;
  report.check = CheckResult{};
  report.check.mismatches = forward.mismatches;
  for (const std::string& line : forward.first_mismatches) report.check.first_mismatches.push_back("forward: " + line);
  if (reference_cost <= kMaxBackwardCheckCost) {
    dq_dev.download(dq.bits.data(), dq.bytes());
    dk_dev.download(dk.bits.data(), dk.bytes());
    dv_dev.download(dv.bits.data(), dv.bytes());
    for (size_t b = 0; b < batch.len_q.size(); ++b) {
      if (batch.len_q[b] == 0 && batch.len_k[b] == 0) continue;
      const AttentionGradients ref = attention_backward_reference_f64(
          batch.sequence(b), sequence_rows(q, batch.cu_q, b), sequence_rows(k, batch.cu_k, b),
          sequence_rows(v, batch.cu_k, b), sequence_rows(dout, batch.cu_q, b), report.scale, p.mask, run_variant(o));
      for (const auto& [name, got, cu, want] :
           {std::tuple{"dq", &dq, &batch.cu_q, &ref.dq}, std::tuple{"dk", &dk, &batch.cu_k, &ref.dk},
            std::tuple{"dv", &dv, &batch.cu_k, &ref.dv}}) {
        check_gradient(name, sequence_rows(*got, *cu, b), *want, dtype, report.check);
      }
    }
    report.check.rows = static_cast<size_t>(s.heads_q * batch.total_q());
  }
  report.times_ms = time_launches(launch_backward_once, o.warmup, o.iters, stream.get());
  report.flops = backward_flops_total;
  return report;
}

void check_varlen_problem(const RunOptions& o) {
  const AttentionProblem& p = o.problem;
  const AttentionShape& s = p.shape;
  const DType dtype = p.dtype;
  auto address = [](int n) { return reinterpret_cast<void*>(uintptr_t{1} << (20 + n)); };
  PackedTensors t{};
  t.q = bshd_view(address(0), dtype, 1, p.total_q, s.heads_q, s.head_dim);
  t.k = bshd_view(address(1), dtype, 1, p.total_k, s.heads_kv, s.head_dim);
  t.v = bshd_view(address(2), dtype, 1, p.total_k, s.heads_kv, s.value_dim());
  t.out = bshd_view(address(3), dtype, 1, p.total_q, s.heads_q, s.value_dim());
  t.dout = bshd_view(address(4), dtype, 1, p.total_q, s.heads_q, s.value_dim());
  t.dq = bshd_view(address(5), dtype, 1, p.total_q, s.heads_q, s.head_dim);
  t.dk = bshd_view(address(6), dtype, 1, p.total_k, s.heads_kv, s.head_dim);
  t.dv = bshd_view(address(7), dtype, 1, p.total_k, s.heads_kv, s.value_dim());
  t.lse = static_cast<float*>(address(8));
  t.cu_q = static_cast<const int32_t*>(address(9)), t.cu_k = static_cast<const int32_t*>(address(10));
  t.alibi_slopes = placeholder_alibi_slopes(p);
  if (o.prefill_page_size > 0) {  // a cache of as many pages as the packed keys fill, one sequence's worth per entry
    const int64_t pages_per_sequence = (s.seqlen_k + o.prefill_page_size - 1) / o.prefill_page_size;
    const int64_t pages = s.batch * pages_per_sequence;
    t.k_cache = bshd_view(address(11), dtype, pages, o.prefill_page_size, s.heads_kv, s.head_dim);
    t.v_cache = bshd_view(address(12), dtype, pages, o.prefill_page_size, s.heads_kv, s.value_dim());
    t.table = static_cast<const int32_t*>(address(13));
    t.max_pages = pages_per_sequence;
  }
  auto check_config = [&](const auto& config, const AttentionProblem& problem) {
    check_requested_config(config, problem, 90);
    FLASHGEN_REQUIRE(config.varlen, "config " + config.name() + " runs dense batches; a packed batch takes a ..._varlen one");
  };
  if (p.backward()) {
    const BackwardCall call = make_varlen_backward_call(backward_args(o, t));
    if (o.config_name) check_config(BwdConfig::from_name(*o.config_name), call.problem);
  } else {
    const ForwardCall call = make_varlen_forward_call(forward_args(o, t));
    if (o.config_name) {
      const KernelConfig config = KernelConfig::from_name(*o.config_name);
      check_config(config, call.problem);
      FLASHGEN_REQUIRE(config.paged == call.problem.paged,
                       "config " + config.name() + (config.paged ? " reads a paged cache; without --page-size"
                                                                  : " reads contiguous keys; with --page-size") +
                           " the packed batch takes a ..._varlen" + (config.paged ? "" : "_paged") + " one");
    }
  }
}

}  // namespace flashgen::cli
