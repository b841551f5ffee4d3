// Tuning sweeps of the forward, the backward and KV-cache calls: parallel compile, reference check, serial
// timing, interleaved re-timing. The pass-independent part is one driver (run_sweep); each pass supplies its
// inputs, its check and its launch.
#include "tuner/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "flashgen/error.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/attention_kvcache.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/kernel_registry.hpp"
#include "tuner/choice.hpp"

namespace flashgen {

namespace {

flashgen_dtype to_c_dtype(DType dtype) { return dtype == DType::kBFloat16 ? FLASHGEN_BFLOAT16 : FLASHGEN_FLOAT16; }

// One set of device inputs and outputs, BSHD contiguous.
struct InputSet {
  std::vector<uint16_t> q, k, v;  // host bits, kept for the reference
  DeviceBuffer dq, dk, dv, dout, dlse;
};

std::vector<uint16_t> random_bits(size_t count, flashgen_dtype dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = float_to_dtype_bits(normal(rng), dtype);
  return bits;
}

// Rows checked against the reference: spread over (batch, head, position), always the last row.
std::vector<RowSample> sample_rows(const AttentionShape& p, int count) {
  std::vector<RowSample> rows;
  for (int i = 0; i < count; ++i) {
    rows.push_back({i % p.batch, (i * 7) % p.heads_q, (static_cast<int64_t>(i) * 2654435761u) % p.seqlen_q});
  }
  rows.push_back({p.batch - 1, p.heads_q - 1, p.seqlen_q - 1});
  return rows;
}

// "" when every report is ok, else the texts of those that are not (summary first, then the first mismatches).
std::string failures(const std::vector<const CheckReport*>& reports) {
  std::string text;
  for (const CheckReport* report : reports) {
    if (!report->ok) text += (text.empty() ? "" : "\n") + report->text;
  }
  return text;
}

// Bytes a candidate's kernels spill, compiling them first (through the registry's caches).
template <class Config>
int spilled_bytes_of(const Config& config, int arch) {
  return KernelRegistry::instance().spilled_bytes(config, arch);
}
int spilled_bytes_of(const DecodeSplitConfig& tuned, int arch) {
  return KernelRegistry::instance().spilled_bytes(tuned.config, arch);
}

// What a pass gives the driver for one candidate: why its output is wrong ("" when right), and the
// call that runs it once on input set `sample % sets`, prepared ahead so host work stays out of the
// timed region.
template <class Config>
struct PassHooks {
  std::function<std::string(const Config&)> check;
  std::function<std::function<void(int)>(const Config&)> prepare;
};

// Compiles every candidate in parallel, checks and times the compiled ones one by one (crash isolation
// hooks included), re-times the fastest few interleaved and names the winner: the fastest, or among
// those within tie_tolerance of it the first by name, so repeated sweeps agree.
template <class Config>
void run_sweep(const std::vector<Config>& candidates, int arch, CUstream stream, const SweepOptions& options,
               const PassHooks<Config>& hooks, SweepResult& result) {
  // Candidate i's row as it stands after phase, to the progress callback.
  auto report = [&](SweepPhase phase, size_t i) {
    if (!options.progress) return;
    const CandidateResult& c = result.candidates[i];
    options.progress({phase, i, candidates.size(), candidates[i].name(), c.status, c.median_ms, c.detail});
  };
  result.candidates.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) result.candidates[i].config = candidates[i];

  // 1. Compile in parallel on CPU threads; the registry's caches make repeated sweeps cheap.
  std::atomic<size_t> next{0};
  const int threads =
      std::max(1, std::min<int>(static_cast<int>(candidates.size()),
                                options.compile_threads > 0 ? options.compile_threads
                                                            : static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < candidates.size(); i = next++) {
        CandidateResult& c = result.candidates[i];
        if (auto why = candidates[i].invalid_reason(arch)) {
          c.status = CandidateStatus::kSkipped;
          c.detail = *why;
          continue;
        }
        try {
          const int spilled = spilled_bytes_of(candidates[i], arch);
          if (spilled > 0) c.detail = "spills " + std::to_string(spilled) + " bytes";
        } catch (const Error& e) {
          c.status = CandidateStatus::kCompileError;
          c.detail = e.what();
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < candidates.size(); ++i) report(SweepPhase::kCompiled, i);

  // 2. Check every compiled candidate once, then time it.
  Timer timer(stream);
  std::vector<size_t> timed;
  for (size_t i = 0; i < candidates.size(); ++i) {
    CandidateResult& c = result.candidates[i];
    const Config& config = candidates[i];
    const std::string name = config.name();
    if (c.status != CandidateStatus::kOk) continue;
    if (auto crashed = options.known_crashes.find(name); crashed != options.known_crashes.end()) {
      c.status = CandidateStatus::kCrashed;
      c.detail = crashed->second;
      report(SweepPhase::kChecked, i);
      continue;
    }
    if (options.on_launch) options.on_launch(name);
    SweepPhase phase = SweepPhase::kChecked;
    try {
      const std::string wrong = hooks.check(config);
      if (!wrong.empty()) {
        c.status = CandidateStatus::kWrongResult;
        c.detail = wrong;
        report(phase, i);
        if (options.on_launch) options.on_launch("");
        continue;
      }
      report(phase, i);
      phase = SweepPhase::kTimed;
      const std::function<void(int)> launch = hooks.prepare(config);
      const TimingResult t = timer.time(launch, options.timing);
      c.median_ms = t.median_ms;
      c.spread = t.spread();
      c.samples = t.samples;
      timed.push_back(i);
      report(phase, i);
    } catch (const Error& e) {
      c.status = CandidateStatus::kLaunchError;
      c.detail = e.what();
      report(phase, i);
      // A sticky CUDA error (an illegal address, say) leaves the context unusable for every later
      // candidate: end the sweep, with the candidate still journaled for a supervising process.
      if (e.status() == Status::kCuda && driver().cuCtxSynchronize() != CUDA_SUCCESS) throw;
    }
    if (options.on_launch) options.on_launch("");
  }
  FLASHGEN_REQUIRE(!timed.empty(), "no candidate compiled, ran and matched the reference");

  // 3. Re-time the fastest few (and those always re-timed) interleaved, then name the winner.
  std::sort(timed.begin(), timed.end(),
            [&](size_t a, size_t b) { return result.candidates[a].median_ms < result.candidates[b].median_ms; });
  const size_t fastest = std::min<size_t>(timed.size(), size_t(std::max(1, options.retime_top)));
  auto always = [&](size_t i) {
    const std::string name = candidates[i].name();
    return std::find(options.always_retime.begin(), options.always_retime.end(), name) != options.always_retime.end();
  };
  const auto rest = std::stable_partition(timed.begin() + static_cast<std::ptrdiff_t>(fastest), timed.end(), always);
  const size_t top = static_cast<size_t>(rest - timed.begin());
  std::vector<std::function<void(int)>> launches;
  for (size_t j = 0; j < top; ++j) launches.push_back(hooks.prepare(candidates[timed[j]]));
  const std::vector<TimingResult> retimed = timer.time_interleaved(launches, options.retime_rounds);
  double best = INFINITY;
  for (size_t j = 0; j < top; ++j) {
    CandidateResult& c = result.candidates[timed[j]];
    c.median_ms = retimed[j].median_ms;
    c.spread = retimed[j].spread();
    c.samples += retimed[j].samples;
    best = std::min(best, c.median_ms);
    report(SweepPhase::kRetimed, timed[j]);
  }
  const CandidateResult* winner = nullptr;
  int ties = 0;
  for (size_t j = 0; j < top; ++j) {
    const CandidateResult& c = result.candidates[timed[j]];
    if (c.median_ms > best * (1 + options.tie_tolerance)) continue;
    ++ties;
    if (winner == nullptr || config_name(c.config) < config_name(winner->config)) winner = &c;
  }
  result.winner = winner->config;
  result.winner_ms = winner->median_ms;
  result.decision = ties > 1 ? std::to_string(ties) + " candidates within " +
                                   std::to_string(options.tie_tolerance * 100) + "% of the fastest; first by name"
                             : "fastest after interleaved re-timing of the top " + std::to_string(fastest) +
                                   (top > fastest ? " and " + std::to_string(top - fastest) + " always re-timed" : "");
}

// Input sets for timing: several when one fits in L2, so timed launches do not reuse cached inputs.
int input_sets(CUdevice device, int64_t set_bytes) {
  int l2_bytes = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device));
  return set_bytes >= 2 * int64_t(l2_bytes)
             ? 1
             : static_cast<int>(std::min<int64_t>(8, (4 * int64_t(l2_bytes) + set_bytes - 1) / set_bytes));
}

}  // namespace

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
  const flashgen_dtype dtype = to_c_dtype(problem.dtype);
  const AttentionShape& shape = problem.shape;

  SweepResult result;
  result.problem = problem_key(problem);
  for (const KernelConfig& c : candidates) {
    FLASHGEN_REQUIRE(c.dtype == problem.dtype && c.head_dim == problem.head_dim() && c.mask == problem.mask_kind(),
                     "candidate " + c.name() + " does not match the sweep's problem");
  }

  // Inputs.
  const int64_t q_elems = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim;
  const int64_t kv_elems = shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim;
  const int sets = input_sets(scope.device(), 2 * (2 * q_elems + 2 * kv_elems));
  std::mt19937_64 rng(options.seed);
  std::vector<InputSet> inputs(sets);
  const size_t lse_bytes = sizeof(float) * size_t(shape.batch * shape.heads_q * shape.seqlen_q);
  for (InputSet& set : inputs) {
    set.q = random_bits(size_t(q_elems), dtype, rng);
    set.k = random_bits(size_t(kv_elems), dtype, rng);
    set.v = random_bits(size_t(kv_elems), dtype, rng);
    set.dq = DeviceBuffer(set.q.size() * 2);
    set.dk = DeviceBuffer(set.k.size() * 2);
    set.dv = DeviceBuffer(set.v.size() * 2);
    set.dout = DeviceBuffer(size_t(q_elems) * 2);
    set.dlse = DeviceBuffer(lse_bytes);
    set.dq.upload(set.q);
    set.dk.upload(set.k);
    set.dv.upload(set.v);
  }
  flashgen_attention_options opts{};
  opts.mask = problem.mask;
  auto make_call = [&](const InputSet& set) {
    const flashgen_tensor q =
        bshd_tensor(set.dq.data(), dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    const flashgen_tensor k =
        bshd_tensor(set.dk.data(), dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
    const flashgen_tensor v =
        bshd_tensor(set.dv.data(), dtype, shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
    const flashgen_tensor out =
        bshd_tensor(set.dout.data(), dtype, shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    return make_forward_call(&q, &k, &v, &out, static_cast<float*>(set.dlse.data()), &opts);
  };
  std::vector<ForwardCall> calls;
  for (const InputSet& set : inputs) calls.push_back(make_call(set));

  // Reference rows of set 0, computed once.
  const StridedView q_view = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
  const StridedView kv_view = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim);
  const HostInput hq = HostInput::bits16(inputs[0].q.data(), dtype, q_view);
  const HostInput hk = HostInput::bits16(inputs[0].k.data(), dtype, kv_view);
  const HostInput hv = HostInput::bits16(inputs[0].v.data(), dtype, kv_view);
  const double scale = effective_softmax_scale(0.f, shape.head_dim);
  const std::vector<RowSample> rows = sample_rows(shape, options.check_rows);
  const std::vector<ReferenceRow> reference =
      attention_reference_rows(shape, hq, hk, hv, scale, problem.mask, rows, /*threads=*/1);

  PassHooks<KernelConfig> hooks;
  hooks.check = [&](const KernelConfig& c) -> std::string {
    inputs[0].dout.fill_bytes(0xff, stream);  // NaN: an unwritten element fails the check
    inputs[0].dlse.fill_bytes(0xff, stream);
    launch_forward(calls[0], stream, c);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    std::vector<uint16_t> out(static_cast<size_t>(q_elems));
    std::vector<float> lse(lse_bytes / sizeof(float));
    inputs[0].dout.download(out.data(), out.size() * 2);
    inputs[0].dlse.download(lse.data(), lse_bytes);
    const RowsCheck check =
        check_rows(shape, rows, reference, HostInput::bits16(out.data(), dtype, q_view), lse.data(), dtype);
    return failures({&check.out, &check.lse});
  };
  hooks.prepare = [&](const KernelConfig& c) -> std::function<void(int)> {
    auto prepared = std::make_shared<std::vector<PreparedForward>>();
    for (const ForwardCall& call : calls) prepared->push_back(prepare_forward(call, stream, c));
    return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()](stream); };
  };
  run_sweep(candidates, arch, stream, options, hooks, result);
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
  DeviceBuffer dq_in, dk_in, dv_in, out, ddout, lse, dq, dk, dv;
  BackwardCall call;

  BackwardSet(const AttentionProblem& of, std::mt19937_64& rng, CUstream stream, int arch) : problem(of) {
    const AttentionShape& p = problem.shape;
    const flashgen_dtype dtype = to_c_dtype(problem.dtype);
    const size_t q_elems = size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim);
    const size_t kv_elems = size_t(p.batch * p.seqlen_k * p.heads_kv * p.head_dim);
    q = random_bits(q_elems, dtype, rng);
    k = random_bits(kv_elems, dtype, rng);
    v = random_bits(kv_elems, dtype, rng);
    dout = random_bits(q_elems, dtype, rng);
    auto device_copy = [](const std::vector<uint16_t>& bits) {
      DeviceBuffer buffer(bits.size() * 2);
      buffer.upload(bits);
      return buffer;
    };
    dq_in = device_copy(q), dk_in = device_copy(k), dv_in = device_copy(v), ddout = device_copy(dout);
    out = DeviceBuffer(q_elems * 2);
    lse = DeviceBuffer(sizeof(float) * size_t(p.batch * p.heads_q * p.seqlen_q));
    dq = DeviceBuffer(q_elems * 2), dk = DeviceBuffer(kv_elems * 2), dv = DeviceBuffer(kv_elems * 2);
    flashgen_attention_options opts{};
    opts.mask = problem.mask;
    opts.deterministic = problem.deterministic() ? 1 : 0;
    auto tensor = [&](DeviceBuffer& b, bool kv) {
      return bshd_tensor(b.data(), dtype, p.batch, kv ? p.seqlen_k : p.seqlen_q, kv ? p.heads_kv : p.heads_q,
                         p.head_dim);
    };
    const flashgen_tensor tq = tensor(dq_in, false), tk = tensor(dk_in, true), tv = tensor(dv_in, true);
    const flashgen_tensor tout = tensor(out, false), tdout = tensor(ddout, false);
    const flashgen_tensor tdq = tensor(dq, false), tdk = tensor(dk, true), tdv = tensor(dv, true);
    float* lse_ptr = static_cast<float*>(lse.data());
    // The forward by its built-in config (not the run-time choice: no tune-on-first-use inside a sweep).
    const ForwardCall forward = make_forward_call(&tq, &tk, &tv, &tout, lse_ptr, &opts);
    const KernelConfig fwd = heuristic_choice(problem.dtype, problem.head_dim(), problem.mask_kind(), arch).config;
    launch_forward(forward, stream, fwd);
    call = make_backward_call(&tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &tdk, &tdv, &opts);
  }

  // Runs config with workspace (at least its backward_workspace_bytes) after poisoning the gradients;
  // returns why the result is wrong against ref ("" when right), every element checked.
  std::string run_and_check(const BwdConfig& config, CUstream stream, const AttentionGradients& ref) {
    dq.fill_bytes(0xff, stream), dk.fill_bytes(0xff, stream), dv.fill_bytes(0xff, stream);
    launch_backward(call, stream, config);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    const flashgen_dtype dtype = to_c_dtype(problem.dtype);
    const AttentionShape& shape = problem.shape;
    const std::vector<int64_t> q_dims = {shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim};
    const std::vector<int64_t> kv_dims = {shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim};
    const struct {
      const char* name;
      const DeviceBuffer& got;
      const std::vector<double>& want;
      const std::vector<int64_t>& dims;
    } grads[] = {{"dq", dq, ref.dq, q_dims}, {"dk", dk, ref.dk, kv_dims}, {"dv", dv, ref.dv, kv_dims}};
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
    FLASHGEN_REQUIRE(c.dtype == problem.dtype && c.head_dim == problem.head_dim() && c.mask == problem.mask_kind() &&
                         c.deterministic == problem.deterministic(),
                     "candidate " + c.name() + " does not match the sweep's problem");
  }

  // The float64 check on a small problem of the same class, then the timed sets.
  std::mt19937_64 rng(options.seed);
  AttentionProblem small = problem;
  small.shape = backward_check_shape(problem.shape);
  BackwardSet check(small, rng, stream, arch);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  const AttentionShape& cp = small.shape;
  const flashgen_dtype dtype = to_c_dtype(problem.dtype);
  const StridedView q_view = StridedView::contiguous(cp.batch, cp.seqlen_q, cp.heads_q, cp.head_dim);
  const StridedView kv_view = StridedView::contiguous(cp.batch, cp.seqlen_k, cp.heads_kv, cp.head_dim);
  const AttentionGradients reference = attention_backward_reference_f64(
      cp, HostInput::bits16(check.q.data(), dtype, q_view), HostInput::bits16(check.k.data(), dtype, kv_view),
      HostInput::bits16(check.v.data(), dtype, kv_view), HostInput::bits16(check.dout.data(), dtype, q_view),
      effective_softmax_scale(0.f, cp.head_dim), problem.mask);

  const AttentionShape& shape = problem.shape;
  const int64_t q_bytes = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim * 2;
  const int64_t kv_bytes = shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim * 2;
  const int sets = input_sets(scope.device(), 4 * q_bytes + 4 * kv_bytes);
  std::vector<std::unique_ptr<BackwardSet>> timed_sets;
  for (int i = 0; i < sets; ++i) {
    timed_sets.push_back(std::make_unique<BackwardSet>(problem, rng, stream, arch));
  }
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));

  PassHooks<BwdConfig> hooks;
  hooks.check = [&](const BwdConfig& c) { return check.run_and_check(c, stream, reference); };
  hooks.prepare = [&](const BwdConfig& c) -> std::function<void(int)> {
    struct Prepared {
      PreparedBackward launch;
      DeviceBuffer workspace;
    };
    auto prepared = std::make_shared<std::vector<Prepared>>();
    for (const auto& set : timed_sets) {
      Prepared p{prepare_backward(set->call, stream, c), DeviceBuffer()};
      p.workspace = DeviceBuffer(p.launch.workspace_bytes);
      p.launch.bind_workspace(reinterpret_cast<CUdeviceptr>(p.workspace.data()));
      prepared->push_back(std::move(p));
    }
    return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()].launch(stream); };
  };
  run_sweep(candidates, arch, stream, options, hooks, result);
  return result;
}

namespace {

// One KV-cache problem's device tensors (q, out, lse and contiguous or paged caches, every sequence's cache full)
// and its checked call. fill_from: null to fill q and the caches with random values kept on the host (the
// float64 check's set), else a set whose values are repeated over this one's sequences (timed sets: random
// data, without generating gigabytes on the host).
struct DecodeSet {
  AttentionShape shape;
  int page_size = 0;                 // 0: contiguous
  int64_t pages = 0;                 // pages per sequence
  std::vector<uint16_t> q, k, v;     // host bits of a random set, k and v as [batch, seqlen_k, heads_kv, head_dim]
  DeviceBuffer dq, dk, dv, dout, dlse, dlens, dtable;
  KvCacheCall call;

  DecodeSet(const AttentionProblem& problem, int64_t batch, std::mt19937_64& rng, const DecodeSet* fill_from)
      : shape(problem.shape), page_size(problem.paged ? problem.page_size : 0) {
    shape.batch = batch;
    const AttentionShape& s = shape;
    const flashgen_dtype dtype = to_c_dtype(problem.dtype);
    const int64_t row = s.heads_kv * s.head_dim, q_elems = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    pages = page_size > 0 ? (s.seqlen_k + page_size - 1) / page_size : 0;
    const int64_t cache_rows = page_size > 0 ? s.batch * pages * page_size : s.batch * s.seqlen_k;
    // Sequence b's key j in row j % page_size of page table[b * pages + j / page_size]: a shuffled table.
    std::vector<int32_t> table(static_cast<size_t>(std::max<int64_t>(1, s.batch * pages)));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    auto cache_row = [&](int64_t b, int64_t j) {
      return page_size > 0 ? table[size_t(b * pages + j / page_size)] * int64_t(page_size) + j % page_size
                           : b * s.seqlen_k + j;
    };
    dq = DeviceBuffer(size_t(q_elems) * 2);
    dk = DeviceBuffer(size_t(cache_rows * row) * 2), dv = DeviceBuffer(size_t(cache_rows * row) * 2);
    if (fill_from == nullptr) {
      q = random_bits(size_t(q_elems), dtype, rng);
      k = random_bits(size_t(s.batch * s.seqlen_k * row), dtype, rng);
      v = random_bits(k.size(), dtype, rng);
      dq.upload(q);
      std::vector<uint16_t> k_cache(size_t(cache_rows * row)), v_cache(k_cache.size());
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          std::copy_n(k.begin() + (b * s.seqlen_k + j) * row, row, k_cache.begin() + cache_row(b, j) * row);
          std::copy_n(v.begin() + (b * s.seqlen_k + j) * row, row, v_cache.begin() + cache_row(b, j) * row);
        }
      dk.upload(k_cache), dv.upload(v_cache);
    } else {
      // Sequence b's keys are fill_from's sequence b % its batch, copied on the device one (page of) rows at a time.
      const DecodeSet& from = *fill_from;
      const int64_t run = page_size > 0 ? page_size : s.seqlen_k;
      for (int64_t b = 0; b < s.batch; ++b) {
        const int64_t source = b % from.shape.batch;
        for (int64_t j = 0; j < s.seqlen_k; j += run) {
          const size_t bytes = size_t(std::min(run, s.seqlen_k - j) * row) * 2;
          const size_t to = size_t(cache_row(b, j) * row) * 2, at = size_t(from.cache_row_of(source, j) * row) * 2;
          dk.copy_from(from.dk, bytes, to, at);
          dv.copy_from(from.dv, bytes, to, at);
        }
      }
      const size_t q_bytes = size_t(q_elems) * 2;
      for (size_t at = 0; at < q_bytes; at += from.dq.bytes()) {
        dq.copy_from(from.dq, std::min(from.dq.bytes(), q_bytes - at), at);
      }
    }
    table_ = table;
    dout = DeviceBuffer(size_t(q_elems) * 2);
    dlse = DeviceBuffer(sizeof(float) * size_t(s.batch * s.heads_q * s.seqlen_q));
    dlens = DeviceBuffer(size_t(s.batch) * 4);
    dlens.upload(std::vector<int32_t>(size_t(s.batch), static_cast<int32_t>(s.seqlen_k)));
    dtable = DeviceBuffer(table.size() * 4);
    dtable.upload(table);

    flashgen_kvcache_args args{};
    args.size = sizeof(args);
    args.q = bshd_tensor(dq.data(), dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    args.out = bshd_tensor(dout.data(), dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    const int64_t cache_batch = page_size > 0 ? s.batch * pages : s.batch;
    const int64_t cache_len = page_size > 0 ? page_size : s.seqlen_k;
    args.k_cache = bshd_tensor(dk.data(), dtype, cache_batch, cache_len, s.heads_kv, s.head_dim);
    args.v_cache = bshd_tensor(dv.data(), dtype, cache_batch, cache_len, s.heads_kv, s.head_dim);
    args.lse = static_cast<float*>(dlse.data());
    args.cache_seqlens = static_cast<const int32_t*>(dlens.data());
    args.block_table = page_size > 0 ? static_cast<const int32_t*>(dtable.data()) : nullptr;
    args.max_pages = pages;
    args.options.mask = problem.mask;
    call = make_kvcache_call(args);
  }

  // The cache row holding sequence b's key j.
  int64_t cache_row_of(int64_t b, int64_t j) const {
    return page_size > 0 ? table_[size_t(b * pages + j / page_size)] * int64_t(page_size) + j % page_size
                         : b * shape.seqlen_k + j;
  }

 private:
  std::vector<int32_t> table_;
};

}  // namespace

SweepResult sweep_decode(const AttentionProblem& problem, const std::vector<DecodeSplitConfig>& candidates,
                         CUstream stream, const SweepOptions& options) {
  FLASHGEN_REQUIRE(problem.kv_cache, "sweep_decode: the problem is not a KV-cache one");
  FLASHGEN_REQUIRE(!problem.paged || (problem.page_size > 0 && problem.page_size % 16 == 0),
                   "sweep_decode: a paged problem needs a page_size that is a multiple of 16, got " +
                       std::to_string(problem.page_size));
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  const flashgen_dtype dtype = to_c_dtype(problem.dtype);

  SweepResult result;
  result.problem = problem_key(problem);
  for (const DecodeSplitConfig& c : candidates) {
    FLASHGEN_REQUIRE(of_problem(c, result.problem), "candidate " + c.name() + " does not match the sweep's problem");
  }

  // The float64 check runs the problem's sizes on at most two sequences (a split count means the same per
  // sequence); the timed sets repeat its values over the whole batch.
  std::mt19937_64 rng(options.seed);
  DecodeSet check(problem, std::min<int64_t>(problem.shape.batch, 2), rng, nullptr);
  const AttentionShape& cs = check.shape;
  const StridedView q_view = StridedView::contiguous(cs.batch, cs.seqlen_q, cs.heads_q, cs.head_dim);
  const StridedView kv_view = StridedView::contiguous(cs.batch, cs.seqlen_k, cs.heads_kv, cs.head_dim);
  const std::vector<RowSample> rows = sample_rows(cs, options.check_rows);
  const std::vector<ReferenceRow> reference = attention_reference_rows(
      cs, HostInput::bits16(check.q.data(), dtype, q_view), HostInput::bits16(check.k.data(), dtype, kv_view),
      HostInput::bits16(check.v.data(), dtype, kv_view), check.call.params.scale, problem.mask, rows, /*threads=*/1);
  const AttentionShape& shape = problem.shape;
  const int64_t kv_bytes = 2 * shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim * 2;
  const int sets = input_sets(scope.device(), kv_bytes);
  std::vector<std::unique_ptr<DecodeSet>> timed_sets;
  for (int i = 0; i < sets; ++i) timed_sets.push_back(std::make_unique<DecodeSet>(problem, shape.batch, rng, &check));

  // A launch of config on set with a workspace of its own.
  struct Prepared {
    PreparedKvCache launch;
    DeviceBuffer workspace;
    void operator()(CUstream on) const { launch(on, workspace.ptr()); }
  };
  auto prepare = [&](const DecodeSplitConfig& c, const DecodeSet& set) {
    Prepared p{prepare_kvcache(set.call, stream, c.config, c.splits), DeviceBuffer()};
    p.workspace = DeviceBuffer(std::max<size_t>(p.launch.workspace_bytes, 1));
    return p;
  };

  PassHooks<DecodeSplitConfig> hooks;
  hooks.check = [&](const DecodeSplitConfig& c) -> std::string {
    check.dout.fill_bytes(0xff, stream);  // NaN: an unwritten element fails the check
    check.dlse.fill_bytes(0xff, stream);
    const Prepared launch = prepare(c, check);  // its workspace lives until the kernels are done
    launch(stream);
    FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    std::vector<uint16_t> out(check.dout.bytes() / 2);
    std::vector<float> lse(check.dlse.bytes() / sizeof(float));
    check.dout.download(out.data(), check.dout.bytes());
    check.dlse.download(lse.data(), check.dlse.bytes());
    const RowsCheck checked =
        check_rows(cs, rows, reference, HostInput::bits16(out.data(), dtype, q_view), lse.data(), dtype);
    return failures({&checked.out, &checked.lse});
  };
  hooks.prepare = [&](const DecodeSplitConfig& c) -> std::function<void(int)> {
    auto prepared = std::make_shared<std::vector<Prepared>>();
    for (const auto& set : timed_sets) prepared->push_back(prepare(c, *set));
    return [prepared, stream](int sample) { (*prepared)[size_t(sample) % prepared->size()](stream); };
  };
  run_sweep(candidates, arch, stream, options, hooks, result);
  return result;
}

}  // namespace flashgen
