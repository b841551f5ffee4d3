// The tuning sweep of the FP8 forward (dense, sm_90), behind sweep_forward: random FP8 codes with one descale per
// tensor (check/number_formats.hpp's random_fp8_codes and fp8_input_descale, as `flashgen run --dtype e4m3` makes
// them), every candidate writing the same 16-bit output type, sampled rows judged by FlashAttention-3's rule
// (check/output_check.hpp's check_fp8_rows).

#include "launch/attention.hpp"
#include "runtime/device_buffer.hpp"
#include "tuner/sweep_driver.hpp"

namespace flashgen {

using namespace sweep_driver;

namespace {

// One set of device inputs and outputs, BSHD contiguous.
struct Fp8InputSet {
  std::vector<uint8_t> q, k, v;  // codes, kept for the reference
  DeviceBuffer dq, dk, dv, dout, dlse;
};

}  // namespace

SweepResult sweep_driver::sweep_forward_fp8(const AttentionProblem& problem,
                                            const std::vector<KernelConfig>& candidates, CUstream stream,
                                            const SweepOptions& options) {
  FLASHGEN_REQUIRE(!candidates.empty(), "sweep_forward: no candidate");
  FLASHGEN_REQUIRE(!problem.user, "an FP8 forward's sweep takes no user variant");
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  const DType dtype = problem.dtype;
  const AttentionShape& shape = problem.shape;
  // The tiles are timed with one output type and serve both (the planner gives a call's config its own).
  const DType out_dtype = candidates.front().output_dtype();
  for (const KernelConfig& c : candidates) {
    FLASHGEN_REQUIRE(c.output_dtype() == out_dtype,
                     "candidate " + c.name() + " writes " + dtype_name(c.output_dtype()) + ", the sweep's others " +
                         dtype_name(out_dtype));
  }

  SweepResult result;
  result.problem = problem_key(problem);
  const int64_t q_elems = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim;
  const int64_t kv_elems = shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim;
  const int64_t out_elems = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim;
  const size_t lse_bytes = sizeof(float) * size_t(shape.batch * shape.heads_q * shape.seqlen_q);
  const int sets = input_sets(scope.device(), q_elems + 2 * kv_elems + 2 * out_elems);
  std::mt19937_64 rng(options.seed);
  std::vector<Fp8InputSet> inputs(sets);
  for (Fp8InputSet& set : inputs) {
    set.q = random_fp8_codes(size_t(q_elems), dtype, rng);
    set.k = random_fp8_codes(size_t(kv_elems), dtype, rng);
    set.v = random_fp8_codes(size_t(kv_elems), dtype, rng);
    set.dq = DeviceBuffer(set.q.size());
    set.dk = DeviceBuffer(set.k.size());
    set.dv = DeviceBuffer(set.v.size());
    set.dout = DeviceBuffer(size_t(out_elems) * 2);
    set.dlse = DeviceBuffer(lse_bytes);
    set.dq.upload(set.q);
    set.dk.upload(set.k);
    set.dv.upload(set.v);
  }
  // q's, k's and v's descales, one value each (strides {0, 0}).
  const float descale[3] = {fp8_input_descale(0), fp8_input_descale(1), fp8_input_descale(2)};
  DeviceBuffer descales(sizeof descale);
  descales.upload(std::vector<float>(descale, descale + 3));
  DeviceBuffer slopes;
  CallOptions opts = sweep_options(problem, slopes);
  const float* device_descales = static_cast<const float*>(descales.data());
  opts.q_descale = device_descales;
  opts.k_descale = device_descales + 1;
  opts.v_descale = device_descales + 2;
  auto make_call = [&](const Fp8InputSet& set) {
    const TensorView q = bshd_view(set.dq.data(), dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    const TensorView k = bshd_view(set.dk.data(), dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
    const TensorView v = bshd_view(set.dv.data(), dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
    const TensorView out =
        bshd_view(set.dout.data(), out_dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    return make_forward_call(&q, &k, &v, &out, static_cast<float*>(set.dlse.data()), &opts);
  };
  std::vector<ForwardCall> calls;
  for (const Fp8InputSet& set : inputs) calls.push_back(make_call(set));

  // Reference rows of set 0, computed once.
  const StridedView q_view = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
  const StridedView kv_view = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
  const HostInput hq = HostInput::fp8_codes(inputs[0].q.data(), dtype, q_view, descale[0]);
  const HostInput hk = HostInput::fp8_codes(inputs[0].k.data(), dtype, kv_view, descale[1]);
  const HostInput hv = HostInput::fp8_codes(inputs[0].v.data(), dtype, kv_view, descale[2]);
  const std::vector<RowSample> rows = sample_rows(shape, options.check_rows);
  const std::vector<Fp8ReferenceRow> reference =
      attention_reference_rows_fp8(shape, hq, hk, hv, effective_softmax_scale(0.f, shape.head_dim), problem.mask,
                                   rows, /*threads=*/1, variant_of(problem));

  PassHooks<KernelConfig> hooks;
  hooks.check = [&](const KernelConfig& c) -> std::string {
    const ForwardOutputs read = checked_forward_run(calls[0], c, inputs[0].dout, inputs[0].dlse, stream);
    const Fp8RowsCheck check = check_fp8_rows(
        shape, rows, reference, HostInput::bits16(read.out.data(), out_dtype, q_view), read.lse.data(), out_dtype);
    return failures({&check.rows.out, &check.rows.lse});
  };
  hooks.prepare = [&](const KernelConfig& c) { return forward_launches(calls, c, stream); };
  run_sweep(candidates, arch, stream, options, hooks, result);
  return result;
}

}  // namespace flashgen
