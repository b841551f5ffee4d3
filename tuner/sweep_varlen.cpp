// Tuning sweeps of packed variable-length batches, forward and backward: a batch of the problem's sizes
// (packed_lengths: its sequence count, longest lengths and total tokens), each checked sequence against its own
// float64 reference, fed to the pass-independent driver (sweep_driver.hpp's run_sweep).
#include <algorithm>
#include <memory>

#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "problem/paged_cache.hpp"
#include "runtime/device_buffer.hpp"
#include "tuner/choice.hpp"
#include "tuner/sweep_driver.hpp"
#include "tuner/tune_modules.hpp"

namespace flashgen {

using namespace sweep_driver;

namespace {

// One packed batch's device tensors, bound to a forward call (and, for a backward problem, to the backward
// call after the varlen forward's built-in config has filled out and lse). q, k, v and dout are random; their
// host bits are kept for the float64 reference. Over a paged cache (a paged forward problem) k and v lie in
// shuffled pages of problem.page_size keys, every row no sequence owns NaN, which no result may read.
struct PackedSet {
  AttentionProblem problem;
  PackedBatch batch;  // its sequences
  std::vector<uint16_t> q, k, v, dout;
  DeviceBuffer dq_in, dk_in, dv_in, ddout, out, lse, dcu_q, dcu_k, dq, dk, dv, slopes, dtable;
  ForwardCall forward;
  BackwardCall backward;

  PackedSet(const AttentionProblem& of, std::mt19937_64& rng, CUstream stream, int arch)
      : problem(of), batch(packed_batch(of)) {
    const AttentionShape& s = problem.shape;
    const DType dtype = problem.dtype;
    const size_t q_elems = size_t(problem.total_q * s.heads_q * s.head_dim);
    const size_t kv_elems = size_t(problem.total_k * s.heads_kv * s.head_dim);
    const size_t v_elems = size_t(problem.total_k * s.heads_kv * s.value_dim());
    const size_t out_elems = size_t(problem.total_q * s.heads_q * s.value_dim());
    q = random_bits(q_elems, dtype, rng);
    k = random_bits(kv_elems, dtype, rng);
    v = random_bits(v_elems, dtype, rng);
    auto device_copy = [](const auto& host) {
      DeviceBuffer buffer(std::max<size_t>(1, host.size() * sizeof(host[0])));
      buffer.upload(host);
      return buffer;
    };
    dq_in = device_copy(q);
    dcu_q = device_copy(batch.cu_q), dcu_k = device_copy(batch.cu_k);
    out = DeviceBuffer(std::max<size_t>(1, out_elems * 2));
    lse = DeviceBuffer(sizeof(float) * std::max<size_t>(1, size_t(s.heads_q * problem.total_q)));
    auto tensor = [&](const DeviceBuffer& b, bool kv, int64_t dim) {
      return bshd_view(b.data(), dtype, 1, kv ? problem.total_k : problem.total_q, kv ? s.heads_kv : s.heads_q, dim);
    };
    VarlenForwardArgs args;
    args.q = tensor(dq_in, false, s.head_dim);
    if (problem.paged) {
      const PagedBatch pages(batch, problem.page_size, rng());
      auto cache = [&](const std::vector<uint16_t>& rows, DeviceBuffer& into, int64_t dim) {
        into = device_copy(pages.cache_of(rows, s.heads_kv * dim, batch));
        return bshd_view(into.data(), dtype, pages.num_pages(), pages.page_size, s.heads_kv, dim);
      };
      args.k = cache(k, dk_in, s.head_dim), args.v = cache(v, dv_in, s.value_dim());
      args.max_pages = pages.max_pages;
      dtable = device_copy(pages.table);
      args.block_table = static_cast<const int32_t*>(dtable.data());
    } else {
      dk_in = device_copy(k), dv_in = device_copy(v);
      args.k = tensor(dk_in, true, s.head_dim), args.v = tensor(dv_in, true, s.value_dim());
    }
    args.out = tensor(out, false, s.value_dim());
    args.lse = static_cast<float*>(lse.data());
    args.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.data());
    args.cu_seqlens_k = static_cast<const int32_t*>(dcu_k.data());
    args.batch = s.batch;
    args.max_seqlen_q = s.seqlen_q, args.max_seqlen_k = s.seqlen_k;
    args.options = sweep_options(problem, slopes);
    forward = make_varlen_forward_call(args);
    if (!problem.backward()) return;
    FLASHGEN_REQUIRE(!problem.paged, "a packed backward has no paged kernels: its keys and values are contiguous");

    dout = random_bits(out_elems, dtype, rng);
    ddout = device_copy(dout);
    dq = DeviceBuffer(std::max<size_t>(1, q_elems * 2));
    dk = DeviceBuffer(std::max<size_t>(1, kv_elems * 2)), dv = DeviceBuffer(std::max<size_t>(1, v_elems * 2));
    // The forward by its built-in config (not the run-time choice: no tune-on-first-use inside a sweep).
    launch_forward(forward, stream, backward_sweep_forward(problem, arch));
    VarlenBackwardArgs b;
    b.q = args.q, b.k = args.k, b.v = args.v, b.out = args.out;
    b.dout = tensor(ddout, false, s.value_dim()), b.dq = tensor(dq, false, s.head_dim);
    b.dk = tensor(dk, true, s.head_dim), b.dv = tensor(dv, true, s.value_dim());
    b.lse = args.lse;
    b.cu_seqlens_q = args.cu_seqlens_q, b.cu_seqlens_k = args.cu_seqlens_k;
    b.batch = args.batch, b.max_seqlen_q = args.max_seqlen_q, b.max_seqlen_k = args.max_seqlen_k;
    b.options = args.options;
    backward = make_varlen_backward_call(b);
  }

  // Sequence b's rows of a packed [total, heads, head_dim] tensor's host bits: q and k of head_dim, v and out of the
  // values' (values).
  HostInput rows_of(const std::vector<uint16_t>& bits, size_t b, bool kv, bool values = false) const {
    const AttentionShape one = batch.sequence(b);
    const int64_t heads = kv ? one.heads_kv : one.heads_q;
    const int64_t first = kv ? batch.cu_k[b] : batch.cu_q[b];
    const int64_t dim = values ? one.value_dim() : one.head_dim;
    return HostInput::bits16(bits.data() + first * heads * dim, problem.dtype,
                             StridedView::contiguous(1, kv ? one.seqlen_k : one.seqlen_q, heads, dim));
  }
};

// A packed problem of the backward sweep's class small enough for the full float64 gradients: at most three
// sequences, lengths capped as the dense check caps them, about as full as the sweep's batch.
AttentionProblem packed_check_problem(const AttentionProblem& p) {
  AttentionProblem small = p;
  AttentionShape& s = small.shape;
  s.batch = std::min<int64_t>(p.shape.batch, 3);
  s.heads_kv = 1;
  s.heads_q = p.shape.group_size();
  s.seqlen_q = std::min<int64_t>(p.shape.seqlen_q, 259);
  s.seqlen_k = p.shape.seqlen_k == p.shape.seqlen_q ? s.seqlen_q
               : p.shape.seqlen_k < p.shape.seqlen_q ? std::min<int64_t>(p.shape.seqlen_k, 193)
                                                     : std::min<int64_t>(p.shape.seqlen_k, 321);
  auto total_of = [&](int64_t longest, int64_t total, int64_t full_longest) {
    const double fill = static_cast<double>(total) / static_cast<double>(p.shape.batch * full_longest);
    return std::clamp<int64_t>(std::llround(fill * static_cast<double>(s.batch * longest)), longest, s.batch * longest);
  };
  small.total_q = total_of(s.seqlen_q, p.total_q, p.shape.seqlen_q);
  small.total_k = s.seqlen_k == s.seqlen_q && p.total_k == p.total_q ? small.total_q
                                                                    : total_of(s.seqlen_k, p.total_k, p.shape.seqlen_k);
  return small;
}

template <class Config>
void require_packed_candidates(const AttentionProblem& problem, const std::vector<Config>& candidates) {
  const ProblemKey key = problem_key(problem);
  for (const Config& c : candidates) {
    FLASHGEN_REQUIRE(of_problem(TunedConfig(c), key), "candidate " + c.name() + " does not match the sweep's problem " +
                                                          key.id() + " (a packed batch runs its varlen kernels)");
  }
}

}  // namespace

SweepResult sweep_driver::sweep_forward_packed(const AttentionProblem& problem,
                                               const std::vector<KernelConfig>& candidates, CUstream stream,
                                               const SweepOptions& options) {
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  SweepResult result;
  result.problem = problem_key(problem);
  require_packed_candidates(problem, candidates);

  std::mt19937_64 rng(options.seed);
  const AttentionShape& s = problem.shape;
  // Key rows per set: the packed ones, or over pages every sequence's whole pages.
  const int64_t key_rows =
      problem.paged ? s.batch * ((s.seqlen_k + problem.page_size - 1) / problem.page_size) * problem.page_size
                    : problem.total_k;
  const int64_t set_bytes =
      2 * (problem.total_q * s.heads_q + key_rows * s.heads_kv) * (s.head_dim + s.value_dim());
  const int sets = input_sets(scope.device(), set_bytes);
  std::vector<std::unique_ptr<PackedSet>> inputs;
  for (int i = 0; i < sets; ++i) inputs.push_back(std::make_unique<PackedSet>(problem, rng, stream, arch));
  const PackedSet& checked = *inputs[0];

  // Reference rows of a few sequences of set 0, computed once.
  struct SequenceCheck {
    size_t b;
    std::vector<RowSample> rows;
    std::vector<ReferenceRow> reference;
  };
  std::vector<SequenceCheck> sequences;
  const double scale = effective_softmax_scale(0.f, s.head_dim);
  const std::vector<size_t> picked = checked.batch.sampled_sequences();
  for (size_t b : picked) {
    const AttentionShape one = checked.batch.sequence(b);
    const int per_sequence = std::max(2, options.check_rows / static_cast<int>(picked.size()));
    std::vector<RowSample> rows = sample_rows(one, per_sequence);
    std::vector<ReferenceRow> reference =
        attention_reference_rows(one, checked.rows_of(checked.q, b, false), checked.rows_of(checked.k, b, true),
                                 checked.rows_of(checked.v, b, true, true), scale, problem.mask, rows, /*threads=*/1,
                                 variant_of(problem));
    sequences.push_back({b, std::move(rows), std::move(reference)});
  }

  const DType dtype = problem.dtype;
  PassHooks<KernelConfig> hooks;
  hooks.check = [&](const KernelConfig& c) -> std::string {
    PackedSet& set = *inputs[0];
    set.out.fill_bytes(0xff, stream);  // NaN: an unwritten element fails the check
    set.lse.fill_bytes(0xff, stream);
    launch_forward(set.forward, stream, c);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    std::vector<uint16_t> out(size_t(problem.total_q * s.heads_q * s.value_dim()));
    std::vector<float> lse(size_t(s.heads_q * problem.total_q));
    set.out.download(out.data(), out.size() * 2);
    set.lse.download(lse.data(), lse.size() * sizeof(float));
    std::string wrong;
    for (const SequenceCheck& sequence : sequences) {
      const size_t b = sequence.b;
      const AttentionShape one = set.batch.sequence(b);
      // Its lse rows, [heads_q, total_q] in the packed output, as the [1, heads_q, seqlen_q] check_rows reads.
      std::vector<float> one_lse(size_t(one.heads_q * one.seqlen_q));
      for (int64_t h = 0; h < one.heads_q; ++h)
        for (int64_t r = 0; r < one.seqlen_q; ++r)
          one_lse[size_t(h * one.seqlen_q + r)] = lse[size_t(h * problem.total_q + set.batch.cu_q[b] + r)];
      const RowsCheck check = check_rows(one, sequence.rows, sequence.reference, set.rows_of(out, b, false, true),
                                         one_lse.data(), dtype);
      const std::string text = failures({&check.out, &check.lse});
      if (!text.empty()) wrong += (wrong.empty() ? "" : "\n") + ("sequence " + std::to_string(b) + ": " + text);
    }
    return wrong;
  };
  hooks.prepare = [&](const KernelConfig& c) -> std::function<void(int)> {
    auto prepared = std::make_shared<std::vector<PreparedForward>>();
    for (const auto& set : inputs) prepared->push_back(prepare_forward(set->forward, stream, c));
    return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()](stream); };
  };
  run_sweep(candidates, arch, stream, options, hooks, result);
  return result;
}

SweepResult sweep_driver::sweep_backward_packed(const AttentionProblem& problem,
                                                const std::vector<BwdConfig>& candidates, CUstream stream,
                                                const SweepOptions& options) {
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  SweepResult result;
  result.problem = problem_key(problem);
  require_packed_candidates(problem, candidates);

  // The full float64 gradients of a small packed batch of the class, sequence by sequence.
  std::mt19937_64 rng(options.seed);
  const AttentionProblem small = with_check_window(packed_check_problem(problem), problem);
  PackedSet check(small, rng, stream, arch);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  const double scale = effective_softmax_scale(0.f, problem.shape.head_dim);
  std::vector<AttentionGradients> reference;
  for (size_t b = 0; b < check.batch.len_q.size(); ++b) {
    reference.push_back(attention_backward_reference_f64(
        check.batch.sequence(b), check.rows_of(check.q, b, false), check.rows_of(check.k, b, true),
        check.rows_of(check.v, b, true, true), check.rows_of(check.dout, b, false, true), scale, small.mask,
        variant_of(small)));
  }

  const AttentionShape& s = problem.shape;
  const int64_t set_bytes =
      4 * (problem.total_q * s.heads_q + problem.total_k * s.heads_kv) * (s.head_dim + s.value_dim());
  const int sets = input_sets(scope.device(), set_bytes);
  std::vector<std::unique_ptr<PackedSet>> timed_sets;
  for (int i = 0; i < sets; ++i) timed_sets.push_back(std::make_unique<PackedSet>(problem, rng, stream, arch));
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));

  const DType dtype = problem.dtype;
  PassHooks<BwdConfig> hooks;
  hooks.check = [&](const BwdConfig& c) -> std::string {
    check.dq.fill_bytes(0xff, stream), check.dk.fill_bytes(0xff, stream), check.dv.fill_bytes(0xff, stream);
    launch_backward(check.backward, stream, c);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    const struct {
      const char* name;
      const DeviceBuffer& got;
      const std::vector<int32_t>& cu;
      int64_t heads, dim;
      std::vector<double> AttentionGradients::*want;
    } grads[] = {{"dq", check.dq, check.batch.cu_q, check.problem.shape.heads_q, s.head_dim, &AttentionGradients::dq},
                 {"dk", check.dk, check.batch.cu_k, check.problem.shape.heads_kv, s.head_dim, &AttentionGradients::dk},
                 {"dv", check.dv, check.batch.cu_k, check.problem.shape.heads_kv, s.value_dim(),
                  &AttentionGradients::dv}};
    for (const auto& g : grads) {
      std::vector<uint16_t> bits(g.got.bytes() / 2);
      g.got.download(bits.data(), bits.size() * 2);
      for (size_t b = 0; b < reference.size(); ++b) {
        const std::vector<double>& want = reference[b].*g.want;
        const int64_t first = g.cu[b] * g.heads * g.dim;
        std::vector<double> got(want.size());
        for (size_t i = 0; i < got.size(); ++i) got[i] = dtype_bits_to_float(bits[size_t(first) + i], dtype);
        const int64_t rows = static_cast<int64_t>(want.size()) / (g.heads * g.dim);
        const CheckReport report = check_elements("sequence " + std::to_string(b) + " " + g.name,
                                                  {1, rows, g.heads, g.dim}, got, want,
                                                  gradient_tolerance(dtype, max_magnitude(want)));
        if (!report.ok) return report.text;
      }
    }
    return "";
  };
  std::vector<const BackwardCall*> calls;
  for (const auto& set : timed_sets) calls.push_back(&set->backward);
  hooks.prepare = [&](const BwdConfig& c) { return backward_launches(calls, c, stream); };
  run_sweep(candidates, arch, stream, options, hooks, result);
  return result;
}

}  // namespace flashgen
