// Tuning sweeps of the forward and the backward: each pass's inputs, float64 check and launch, fed to the
// pass-independent driver (sweep_driver.hpp's run_sweep). Packed batches have theirs in sweep_varlen.cpp,
// KV-cache calls in sweep_decode.cpp.
#include "tuner/sweep.hpp"

#include <algorithm>
#include <memory>
#include <sstream>
#include <variant>

#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/device_buffer.hpp"
#include "tuner/choice.hpp"
#include "tuner/sweep_driver.hpp"
#include "tuner/tune_modules.hpp"
#include "tuner/user_reference.hpp"

namespace flashgen {

using namespace sweep_driver;

namespace {

// One set of device inputs and outputs, BSHD contiguous.
struct InputSet {
  std::vector<uint16_t> q, k, v;  // host bits, kept for the reference
  DeviceBuffer dq, dk, dv, dout, dlse;
};

// Runs reference with problem's variant (variant_of), a user variant's functions evaluated on the GPU with the
// sweep's arguments of it (with_user_functions).
void with_variant_of(const AttentionProblem& problem, const SweepOptions& options, CUstream stream,
                     const std::function<void(const ReferenceVariant&)>& reference) {
  if (!problem.user) return reference(variant_of(problem));
  with_user_functions(*problem.user, options.user_args, problem.shape, variant_of(problem), stream, reference);
}

}  // namespace

void set_user(TunedConfig& config, const std::shared_ptr<const UserVariant>& user) {
  if (auto* forward = std::get_if<KernelConfig>(&config)) forward->user = user;
  if (auto* backward = std::get_if<BwdConfig>(&config)) backward->user = user;
}

std::string progress_line(const SweepProgress& event) {
  std::ostringstream line;
  line << "[" << event.index + 1 << "/" << event.count << "] " << event.config << ": ";
  if (event.status != CandidateStatus::kOk) {
    line << candidate_status_name(event.status);
    if (!event.detail.empty()) line << " (" << event.detail.substr(0, event.detail.find('\n')) << ")";
  } else if (event.phase == SweepPhase::kCompiled) {
    line << "compiled" << (event.detail.empty() ? "" : " (" + event.detail + ")");
  } else if (event.phase == SweepPhase::kChecked) {
    line << "matches the reference";
  } else {
    line << event.median_ms << " ms" << (event.phase == SweepPhase::kRetimed ? " re-timed" : "");
  }
  return line.str();
}

SweepResult sweep_forward(const AttentionProblem& problem, const std::vector<KernelConfig>& candidates,
                          CUstream stream, const SweepOptions& options) {
  FLASHGEN_REQUIRE(problem.pass == Pass::kForward, "sweep_forward: the problem is not a forward one");
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  const DType dtype = problem.dtype;
  const AttentionShape& shape = problem.shape;

  SweepResult result;
  result.problem = problem_key(problem);
  for (const KernelConfig& c : candidates) {
    FLASHGEN_REQUIRE(c.dtype == problem.dtype && c.head_dim == problem.head_dim() &&
                         c.value_dim() == problem.value_dim() && c.mask == problem.mask_kind(),
                     "candidate " + c.name() + " does not match the sweep's problem");
  }
  if (problem.varlen) return sweep_forward_packed(problem, candidates, stream, options);
  if (is_fp8(dtype)) return sweep_forward_fp8(problem, candidates, stream, options);

  // Inputs: q and k of head_dim, v and out of the values' head dim.
  const int64_t q_elems = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim;
  const int64_t kv_elems = shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim;
  const int64_t v_elems = shape.batch * shape.seqlen_k * shape.heads_kv * shape.value_dim();
  const int64_t out_elems = shape.batch * shape.seqlen_q * shape.heads_q * shape.value_dim();
  const int sets = input_sets(scope.device(), 2 * (q_elems + out_elems + kv_elems + v_elems));
  std::mt19937_64 rng(options.seed);
  std::vector<InputSet> inputs(sets);
  const size_t lse_bytes = sizeof(float) * size_t(shape.batch * shape.heads_q * shape.seqlen_q);
  for (InputSet& set : inputs) {
    set.q = random_bits(size_t(q_elems), dtype, rng);
    set.k = random_bits(size_t(kv_elems), dtype, rng);
    set.v = random_bits(size_t(v_elems), dtype, rng);
    set.dq = DeviceBuffer(set.q.size() * 2);
    set.dk = DeviceBuffer(set.k.size() * 2);
    set.dv = DeviceBuffer(set.v.size() * 2);
    set.dout = DeviceBuffer(size_t(out_elems) * 2);
    set.dlse = DeviceBuffer(lse_bytes);
    set.dq.upload(set.q);
    set.dk.upload(set.k);
    set.dv.upload(set.v);
  }
  DeviceBuffer slopes;
  const CallOptions opts = sweep_options(problem, slopes, &options.user_args);
  auto make_call = [&](const InputSet& set) {
    const TensorView q = bshd_view(set.dq.data(), dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    const TensorView k = bshd_view(set.dk.data(), dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
    const TensorView v =
        bshd_view(set.dv.data(), dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim());
    const TensorView out =
        bshd_view(set.dout.data(), dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.value_dim());
    return make_forward_call(&q, &k, &v, &out, static_cast<float*>(set.dlse.data()), &opts);
  };
  std::vector<ForwardCall> calls;
  for (const InputSet& set : inputs) calls.push_back(make_call(set));

  // Reference rows of set 0, computed once.
  const StridedView q_view = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
  const StridedView kv_view = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
  const StridedView v_view = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim());
  const StridedView out_view = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.value_dim());
  const HostInput hq = HostInput::bits16(inputs[0].q.data(), dtype, q_view);
  const HostInput hk = HostInput::bits16(inputs[0].k.data(), dtype, kv_view);
  const HostInput hv = HostInput::bits16(inputs[0].v.data(), dtype, v_view);
  const double scale = effective_softmax_scale(0.f, shape.head_dim);
  const std::vector<RowSample> rows = sample_rows(shape, options.check_rows);
  std::vector<ReferenceRow> reference;
  with_variant_of(problem, options, stream, [&](const ReferenceVariant& variant) {
    reference = attention_reference_rows(shape, hq, hk, hv, scale, problem.mask, rows, /*threads=*/1, variant);
  });

  PassHooks<KernelConfig> hooks;
  hooks.check = [&](const KernelConfig& c) -> std::string {
    const ForwardOutputs read = checked_forward_run(calls[0], c, inputs[0].dout, inputs[0].dlse, stream);
    const RowsCheck check =
        check_rows(shape, rows, reference, HostInput::bits16(read.out.data(), dtype, out_view), read.lse.data(), dtype);
    return failures({&check.out, &check.lse});
  };
  hooks.prepare = [&](const KernelConfig& c) { return forward_launches(calls, c, stream); };
  run_sweep(with_problem_user(candidates, problem), arch, stream, options, hooks, result);
  without_user(result);
  return result;
}

namespace {

// The float64 check of the backward: a problem of the sweep's class (dtype, head_dim, mask, GQA ratio)
// small enough for the reference, with lengths in the same order as the sweep's (the causal offset
// keeps its sign) and several blocks each way.
AttentionShape backward_check_shape(const AttentionShape& p) {
  AttentionShape small = p;
  small.batch = 1;
  small.heads_kv = 1;
  small.heads_q = p.heads_q / p.heads_kv;
  small.seqlen_q = std::min<int64_t>(p.seqlen_q, 259);
  small.seqlen_k = p.seqlen_k == p.seqlen_q ? small.seqlen_q
                   : p.seqlen_k < p.seqlen_q ? std::min<int64_t>(p.seqlen_k, 193)
                                             : std::min<int64_t>(p.seqlen_k, 321);
  return small;
}

// Device tensors of one backward problem (BSHD contiguous) after a forward by the built-in forward config.
struct BackwardSet {
  AttentionProblem problem;  // the sweep's, or the float64 check's smaller one of its class
  std::vector<uint16_t> q, k, v, dout;  // host bits
  DeviceBuffer dq_in, dk_in, dv_in, out, ddout, lse, dq, dk, dv, slopes;
  BackwardCall call;

  BackwardSet(const AttentionProblem& of, const UserVariantArgs& user_args, std::mt19937_64& rng, CUstream stream,
              int arch)
      : problem(of) {
    const AttentionShape& p = problem.shape;
    const DType dtype = problem.dtype;
    const size_t q_elems = size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim);
    const size_t kv_elems = size_t(p.batch * p.seqlen_k * p.heads_kv * p.head_dim);
    const size_t v_elems = size_t(p.batch * p.seqlen_k * p.heads_kv * p.value_dim());
    const size_t out_elems = size_t(p.batch * p.seqlen_q * p.heads_q * p.value_dim());
    q = random_bits(q_elems, dtype, rng);
    k = random_bits(kv_elems, dtype, rng);
    v = random_bits(v_elems, dtype, rng);
    dout = random_bits(out_elems, dtype, rng);
    auto device_copy = [](const std::vector<uint16_t>& bits) {
      DeviceBuffer buffer(bits.size() * 2);
      buffer.upload(bits);
      return buffer;
    };
    dq_in = device_copy(q), dk_in = device_copy(k), dv_in = device_copy(v), ddout = device_copy(dout);
    out = DeviceBuffer(out_elems * 2);
    lse = DeviceBuffer(sizeof(float) * size_t(p.batch * p.heads_q * p.seqlen_q));
    dq = DeviceBuffer(q_elems * 2), dk = DeviceBuffer(kv_elems * 2), dv = DeviceBuffer(v_elems * 2);
    const CallOptions opts = sweep_options(problem, slopes, &user_args);
    // q, k, dq, dk of head_dim; v, out, dout, dv of the values'.
    auto tensor = [&](DeviceBuffer& b, bool kv, bool values) {
      return bshd_view(b.data(), dtype, p.batch, kv ? p.seqlen_k : p.seqlen_q, kv ? p.heads_kv : p.heads_q,
                       values ? p.value_dim() : p.head_dim);
    };
    const TensorView tq = tensor(dq_in, false, false), tk = tensor(dk_in, true, false);
    const TensorView tv = tensor(dv_in, true, true);
    const TensorView tout = tensor(out, false, true), tdout = tensor(ddout, false, true);
    const TensorView tdq = tensor(dq, false, false), tdk = tensor(dk, true, false), tdv = tensor(dv, true, true);
    float* lse_ptr = static_cast<float*>(lse.data());
    // The forward by its built-in config (not the run-time choice: no tune-on-first-use inside a sweep).
    const ForwardCall forward = make_forward_call(&tq, &tk, &tv, &tout, lse_ptr, &opts);
    launch_forward(forward, stream, backward_sweep_forward(problem, arch));
    call = make_backward_call(&tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &tdk, &tdv, &opts);
  }

  // Runs config with workspace (at least its backward_workspace_bytes) after poisoning the gradients;
  // returns why the result is wrong against ref ("" when right), every element checked.
  std::string run_and_check(const BwdConfig& config, CUstream stream, const AttentionGradients& ref) {
    dq.fill_bytes(0xff, stream), dk.fill_bytes(0xff, stream), dv.fill_bytes(0xff, stream);
    launch_backward(call, stream, config);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    const DType dtype = problem.dtype;
    const AttentionShape& shape = problem.shape;
    const std::vector<int64_t> q_dims = {shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim};
    const std::vector<int64_t> kv_dims = {shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim};
    const std::vector<int64_t> v_dims = {shape.batch, shape.seqlen_k, shape.heads_kv, shape.value_dim()};
    const struct {
      const char* name;
      const DeviceBuffer& got;
      const std::vector<double>& want;
      const std::vector<int64_t>& dims;
    } grads[] = {{"dq", dq, ref.dq, q_dims}, {"dk", dk, ref.dk, kv_dims}, {"dv", dv, ref.dv, v_dims}};
    for (const auto& g : grads) {
      std::vector<uint16_t> bits(g.want.size());
      g.got.download(bits.data(), bits.size() * 2);
      std::vector<double> got(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) got[i] = dtype_bits_to_float(bits[i], dtype);
      const CheckReport check =
          check_elements(g.name, g.dims, got, g.want, gradient_tolerance(dtype, max_magnitude(g.want)));
      if (!check.ok) return check.text;
    }
    return "";
  }
};

}  // namespace

SweepResult sweep_backward(const AttentionProblem& problem, const std::vector<BwdConfig>& candidates,
                           CUstream stream, const SweepOptions& options) {
  FLASHGEN_REQUIRE(problem.pass == Pass::kBackward, "sweep_backward: the problem is not a backward one");
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());

  SweepResult result;
  result.problem = problem_key(problem);
  for (const BwdConfig& c : candidates) {
    FLASHGEN_REQUIRE(c.dtype == problem.dtype && c.head_dim == problem.head_dim() &&
                         c.value_dim() == problem.value_dim() && c.mask == problem.mask_kind() &&
                         c.deterministic == problem.deterministic(),
                     "candidate " + c.name() + " does not match the sweep's problem");
  }
  if (problem.varlen) return sweep_backward_packed(problem, candidates, stream, options);

  // The float64 check on a small problem of the same class, then the timed sets.
  std::mt19937_64 rng(options.seed);
  AttentionProblem small = problem;
  small.shape = backward_check_shape(problem.shape);
  small = with_check_window(small, problem);
  BackwardSet check(small, options.user_args, rng, stream, arch);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  const AttentionShape& cp = small.shape;
  const DType dtype = problem.dtype;
  const StridedView q_view = StridedView::contiguous(cp.batch, cp.seqlen_q, cp.heads_q, cp.head_dim);
  const StridedView kv_view = StridedView::contiguous(cp.batch, cp.seqlen_k, cp.heads_kv, cp.head_dim);
  const StridedView v_view = StridedView::contiguous(cp.batch, cp.seqlen_k, cp.heads_kv, cp.value_dim());
  const StridedView out_view = StridedView::contiguous(cp.batch, cp.seqlen_q, cp.heads_q, cp.value_dim());
  AttentionGradients reference;
  with_variant_of(small, options, stream, [&](const ReferenceVariant& variant) {
    reference = attention_backward_reference_f64(
        cp, HostInput::bits16(check.q.data(), dtype, q_view), HostInput::bits16(check.k.data(), dtype, kv_view),
        HostInput::bits16(check.v.data(), dtype, v_view), HostInput::bits16(check.dout.data(), dtype, out_view),
        effective_softmax_scale(0.f, cp.head_dim), small.mask, variant);
  });

  const AttentionShape& shape = problem.shape;
  const int64_t q_bytes = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim * 2;
  const int64_t kv_bytes = shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim * 2;
  const int64_t v_bytes = shape.batch * shape.seqlen_k * shape.heads_kv * shape.value_dim() * 2;
  const int64_t out_bytes = shape.batch * shape.seqlen_q * shape.heads_q * shape.value_dim() * 2;
  const int sets = input_sets(scope.device(), 2 * (q_bytes + out_bytes + kv_bytes + v_bytes));
  std::vector<std::unique_ptr<BackwardSet>> timed_sets;
  for (int i = 0; i < sets; ++i) {
    timed_sets.push_back(std::make_unique<BackwardSet>(problem, options.user_args, rng, stream, arch));
  }
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));

  PassHooks<BwdConfig> hooks;
  hooks.check = [&](const BwdConfig& c) { return check.run_and_check(c, stream, reference); };
  std::vector<const BackwardCall*> calls;
  for (const auto& set : timed_sets) calls.push_back(&set->call);
  hooks.prepare = [&](const BwdConfig& c) { return backward_launches(calls, c, stream); };
  run_sweep(with_problem_user(candidates, problem), arch, stream, options, hooks, result);
  without_user(result);
  return result;
}

}  // namespace flashgen
