// What `flashgen run` shares with `flashgen demo` (which runs the default problem) and `flashgen tune`
// (which checks a problem as run would): the problem's options, its report, and the run itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "problem/attention_problem.hpp"

namespace flashgen::cli {

// One problem of `run` and how it is checked and timed: its flags, each with its default. An FP8 run (--dtype e4m3
// or e5m2) is problem.dtype FP8 with problem.out_dtype its output's type.
struct RunOptions {
  // batch 4, seqlen 4096/4096, heads 16/16, head_dim 128, fp16, no mask, forward
  AttentionProblem problem = forward_problem(DType::kFloat16, AttentionShape{4, 4096, 4096, 16, 16, 128},
                                             Mask::kNone);
  float scale = 0;              // <= 0: 1/sqrt(head_dim)
  std::string layout = "bshd";  // bshd | bhsd
  std::optional<std::string> config_name;
  int iters = 20;
  int warmup = 3;
  int check_rows = 64;
  uint32_t seed = 0;
  // --kv-cache (problem.kv_cache): seqlen_q new tokens per sequence against full caches of seqlen_k keys, read
  // through a shuffled block table of problem.page_size-key pages when problem.paged, split into `splits` key
  // ranges (0: chosen).
  int splits = 0;
  // --varlen --page-size (forward): the packed batch's keys and values read from a paged cache of such pages,
  // shuffled, through a block table (VarlenForwardArgs::block_table); 0: contiguous.
  int prefill_page_size = 0;
  // --sink: every query head's attention-sink logit (options.sinks; no change of kernel, so not part of the
  // problem class); with --backward the dense call also takes the sinks' gradient and checks it.
  std::optional<float> sink;
};

struct CheckResult {
  size_t rows = 0;
  double max_error_out = 0;
  double max_error_lse = 0;
  int64_t mismatches = 0;
  std::vector<std::string> first_mismatches;  // at most kShownMismatches
  // An FP8 forward's bounds by FlashAttention-3's rule (check/output_check.hpp's check_fp8_rows), where the dtype's
  // tolerances do not apply: the P-rounded float64 rows' error, the output's bound (twice that plus 2 ulp) and the
  // largest LSE bound. Empty for 16-bit runs.
  struct Fp8Bounds {
    double p_rounded_error_out = 0;
    double bound_out = 0;
    double bound_lse = 0;
  };
  std::optional<Fp8Bounds> fp8;
  bool pass() const { return mismatches == 0; }
};
constexpr size_t kShownMismatches = 8;

struct RunReport {
  RunOptions options;
  std::string device_name;
  int device_sm = 0;
  double scale = 0;        // the scale in effect
  std::string config_name;  // what ran (the backward module with --backward)
  std::string reason;       // and why
  int arch = 0;
  double first_launch_ms = 0;  // wall clock of the first call: includes compiling or loading the kernel
  CheckResult check;           // forward: sampled rows; backward: whole gradients (see run_backward)
  std::vector<double> times_ms;  // one per timed launch, sorted
  double flops = 0;
  double kv_bytes = 0;  // --kv-cache: bytes of K and V one launch reads (each once)

  double median_ms() const { return times_ms[times_ms.size() / 2]; }
  double tflops() const { return flops / (median_ms() * 1e-3) / 1e12; }
};

// Runs, checks and times one problem. The caller has checked that a GPU is there.
RunReport run_problem(const RunOptions& o);

// One decimal for real throughput, significant digits for tiny problems that would print as 0.0.
std::string tflops_text(double tflops);

void print_run_report(const RunReport& r, std::ostream& os);

// The library's own checks of the problem and the --config name, on placeholder addresses (never read), so a
// bad argument is reported as one (exit 2) before the GPU is looked for. The config is checked against sm_90,
// whose limits are the widest of the GPUs either family runs on (the GPU's own come at launch).
void check_run_problem(const RunOptions& o);

}  // namespace flashgen::cli
