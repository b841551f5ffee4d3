// Forward tuning sweep: parallel compile, reference check, serial timing, interleaved re-timing.
#include "sweep.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>

#include "attention.hpp"
#include "cuda_driver.hpp"
#include "device_buffer.hpp"
#include "flashgen/error.hpp"
#include "kernel_registry.hpp"
#include "reference.hpp"

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
std::vector<std::array<int64_t, 3>> sample_rows(const ForwardSweepProblem& p, int count) {
  std::vector<std::array<int64_t, 3>> rows;
  for (int i = 0; i < count; ++i) {
    rows.push_back({i % p.batch, (i * 7) % p.heads_q, (static_cast<int64_t>(i) * 2654435761u) % p.seqlen_q});
  }
  rows.push_back({p.batch - 1, p.heads_q - 1, p.seqlen_q - 1});
  return rows;
}

}  // namespace

SweepResult sweep_forward(const ForwardSweepProblem& problem, const std::vector<KernelConfig>& candidates,
                          CUstream stream, const SweepOptions& options) {
  auto progress = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  ScopedContext scope(stream);
  const int arch = device_sm(scope.device());
  const flashgen_dtype dtype = to_c_dtype(problem.dtype);
  const MaskKind mask_kind = problem.mask == FLASHGEN_MASK_NONE ? MaskKind::kNone : MaskKind::kCausal;

  SweepResult result;
  result.problem =
      forward_problem_key(problem.dtype, problem.head_dim, mask_kind, problem.heads_q / problem.heads_kv,
                          problem.seqlen_q, problem.seqlen_k, static_cast<int64_t>(problem.batch) * problem.heads_q);
  result.candidates.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    result.candidates[i].config = candidates[i];
    FLASHGEN_REQUIRE(candidates[i].dtype == problem.dtype && candidates[i].head_dim == problem.head_dim &&
                         candidates[i].mask == mask_kind,
                     "candidate " + candidates[i].name() + " does not match the sweep's problem");
  }

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
        if (auto why = c.config.invalid_reason(arch)) {
          c.status = "skipped";
          c.detail = *why;
          continue;
        }
        try {
          const ResourceUsage usage = KernelRegistry::instance().compiled(c.config, arch)->usage;
          const int spilled = usage.spill_store_bytes + usage.spill_load_bytes;
          if (spilled > 0) c.detail = "spills " + std::to_string(spilled) + " bytes";
        } catch (const Error& e) {
          c.status = "compile_error";
          c.detail = e.what();
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  progress("compiled " + std::to_string(candidates.size()) + " candidates for sm_" + std::to_string(arch));

  // 2. Inputs: several sets when one fits in L2, so timed launches do not reuse cached inputs.
  int l2_bytes = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, scope.device()));
  const int64_t q_elems = int64_t(problem.batch) * problem.seqlen_q * problem.heads_q * problem.head_dim;
  const int64_t kv_elems = int64_t(problem.batch) * problem.seqlen_k * problem.heads_kv * problem.head_dim;
  const int64_t set_bytes = 2 * (2 * q_elems + 2 * kv_elems);
  const int sets = set_bytes >= 2 * int64_t(l2_bytes)
                       ? 1
                       : static_cast<int>(std::min<int64_t>(8, (4 * int64_t(l2_bytes) + set_bytes - 1) / set_bytes));
  std::mt19937_64 rng(options.seed);
  std::vector<InputSet> inputs(sets);
  const size_t lse_bytes = sizeof(float) * size_t(problem.batch) * problem.heads_q * problem.seqlen_q;
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
  auto make_problem = [&](const InputSet& set) {
    const flashgen_tensor q =
        bshd_tensor(set.dq.data(), dtype, problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim);
    const flashgen_tensor k =
        bshd_tensor(set.dk.data(), dtype, problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim);
    const flashgen_tensor v =
        bshd_tensor(set.dv.data(), dtype, problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim);
    const flashgen_tensor out =
        bshd_tensor(set.dout.data(), dtype, problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim);
    return make_forward_problem(&q, &k, &v, &out, static_cast<float*>(set.dlse.data()), &opts);
  };
  std::vector<ForwardProblem> problems;
  for (const InputSet& set : inputs) problems.push_back(make_problem(set));

  // 3. Reference rows of set 0, computed once.
  const AttentionShape shape{problem.batch,   problem.seqlen_q, problem.seqlen_k,
                             problem.heads_q, problem.heads_kv, problem.head_dim};
  const StridedView q_view =
      StridedView::contiguous(problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim);
  const StridedView kv_view =
      StridedView::contiguous(problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim);
  const HostInput hq = HostInput::bits16(inputs[0].q.data(), dtype, q_view);
  const HostInput hk = HostInput::bits16(inputs[0].k.data(), dtype, kv_view);
  const HostInput hv = HostInput::bits16(inputs[0].v.data(), dtype, kv_view);
  const double scale = effective_softmax_scale(0.f, problem.head_dim);
  const auto rows = sample_rows(problem, options.check_rows);
  std::vector<ReferenceRow> reference;
  for (const auto& r : rows)
    reference.push_back(attention_reference_row(shape, hq, hk, hv, scale, problem.mask, r[0], r[1], r[2]));
  const double abs_tol = problem.dtype == DType::kBFloat16 ? 8e-3 : 1e-3;
  const double rel_tol = problem.dtype == DType::kBFloat16 ? 3e-2 : 4e-3;

  // 4. Check every compiled candidate once, then time it.
  Timer timer(stream);
  std::vector<size_t> timed;
  for (size_t i = 0; i < candidates.size(); ++i) {
    CandidateResult& c = result.candidates[i];
    if (c.status != "ok") continue;
    if (auto crashed = options.known_crashes.find(c.config.name()); crashed != options.known_crashes.end()) {
      c.status = "crashed";
      c.detail = crashed->second;
      continue;
    }
    if (options.on_launch) options.on_launch(c.config.name());
    // Testing hook for crash isolation: end the process as a kernel fault would, at this candidate.
    if (const char* crash = std::getenv("FLASHGEN_TEST_CRASH_CONFIG"); crash != nullptr && c.config.name() == crash) {
      std::abort();
    }
    try {
      inputs[0].dout.fill_bytes(0xff, stream);  // NaN: an unwritten element fails the check
      inputs[0].dlse.fill_bytes(0xff, stream);
      launch_forward(problems[0], stream, &c.config);
      FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
      std::vector<uint16_t> out(static_cast<size_t>(q_elems));
      std::vector<float> lse(lse_bytes / sizeof(float));
      inputs[0].dout.download(out.data(), out.size() * 2);
      inputs[0].dlse.download(lse.data(), lse_bytes);
      double worst = 0;
      bool ok = true;
      for (size_t r = 0; r < rows.size() && ok; ++r) {
        const auto [b, h, s] = rows[r];
        for (int d = 0; d < problem.head_dim; ++d) {
          const size_t at = size_t(((b * problem.seqlen_q + s) * problem.heads_q + h) * problem.head_dim + d);
          const double got = dtype_bits_to_float(out[at], dtype);
          const double want = reference[r].out[size_t(d)];
          const double err = std::fabs(got - want);
          worst = std::max(worst, std::isnan(got) ? INFINITY : err);
          if (!(err <= abs_tol + rel_tol * std::fabs(want))) ok = false;
        }
        const double got_lse = lse[size_t((b * problem.heads_q + h) * problem.seqlen_q + s)];
        const double want_lse = reference[r].lse;
        if (std::isinf(want_lse) ? got_lse != want_lse
                                 : !(std::fabs(got_lse - want_lse) <= 1e-3 * std::max(1.0, std::fabs(want_lse))))
          ok = false;
      }
      if (!ok) {
        c.status = "wrong_result";
        c.detail = "max abs error " + std::to_string(worst) + " on sampled rows";
        if (options.on_launch) options.on_launch("");
        continue;
      }
      std::vector<PreparedForward> prepared;
      for (const ForwardProblem& fp : problems) prepared.push_back(prepare_forward(fp, stream, &c.config));
      const TimingResult t =
          timer.time([&](int sample) { prepared[size_t(sample) % prepared.size()](stream); }, options.timing);
      c.median_ms = t.median_ms;
      c.spread = t.spread();
      c.samples = t.samples;
      timed.push_back(i);
      std::ostringstream line;
      line << "[" << i + 1 << "/" << candidates.size() << "] " << c.config.name() << ": " << t.median_ms << " ms";
      progress(line.str());
    } catch (const Error& e) {
      c.status = "launch_error";
      c.detail = e.what();
      // A sticky CUDA error (an illegal address, say) leaves the context unusable for every later
      // candidate: end the sweep, with the candidate still journaled for a supervising process.
      if (e.status() == Status::kCuda && driver().cuCtxSynchronize() != CUDA_SUCCESS) throw;
    }
    if (options.on_launch) options.on_launch("");
  }
  FLASHGEN_REQUIRE(!timed.empty(), "no candidate compiled, ran and matched the reference");

  // 5. Re-time the fastest few interleaved, then name the winner: the fastest, or among those within
  //    tie_tolerance of it the first by name, so repeated sweeps agree.
  std::sort(timed.begin(), timed.end(),
            [&](size_t a, size_t b) { return result.candidates[a].median_ms < result.candidates[b].median_ms; });
  const size_t top = std::min<size_t>(timed.size(), size_t(std::max(1, options.retime_top)));
  std::vector<std::vector<PreparedForward>> prepared(top);
  std::vector<std::function<void(int)>> launches;
  for (size_t j = 0; j < top; ++j) {
    for (const ForwardProblem& fp : problems) {
      prepared[j].push_back(prepare_forward(fp, stream, &result.candidates[timed[j]].config));
    }
    launches.push_back([&, j](int sample) { prepared[j][size_t(sample) % prepared[j].size()](stream); });
  }
  const std::vector<TimingResult> retimed = timer.time_interleaved(launches, options.retime_rounds);
  double best = INFINITY;
  for (size_t j = 0; j < top; ++j) {
    CandidateResult& c = result.candidates[timed[j]];
    c.median_ms = retimed[j].median_ms;
    c.spread = retimed[j].spread();
    c.samples += retimed[j].samples;
    best = std::min(best, c.median_ms);
  }
  const CandidateResult* winner = nullptr;
  int ties = 0;
  for (size_t j = 0; j < top; ++j) {
    const CandidateResult& c = result.candidates[timed[j]];
    if (c.median_ms > best * (1 + options.tie_tolerance)) continue;
    ++ties;
    if (winner == nullptr || c.config.name() < winner->config.name()) winner = &c;
  }
  result.winner = winner->config;
  result.winner_ms = winner->median_ms;
  result.decision = ties > 1 ? std::to_string(ties) + " candidates within " +
                                   std::to_string(options.tie_tolerance * 100) + "% of the fastest; first by name"
                             : "fastest after interleaved re-timing of the top " + std::to_string(top);
  progress("winner " + result.winner.name() + ": " + std::to_string(result.winner_ms) + " ms (" + result.decision +
           ")");
  return result;
}

}  // namespace flashgen
