// What the run command's problems share (dense, packed, KV-cache, FP8): host tensors and their views, random inputs,
// sampled rows and whole gradients checked against float64, CUDA-event timing; and the runs and argument checks
// of the packed, KV-cache and FP8 problems (run_varlen.cpp, run_kvcache.cpp, run_fp8.cpp), which run.cpp dispatches
// to.
#pragma once

#include <cuda.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "cli/run.hpp"
#include "dispatch/dispatch.hpp"
#include "problem/paged_cache.hpp"
#include "problem/tensor_view.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"

namespace flashgen::cli {

// Host copy of one 16-bit tensor: the raw elements in memory order plus the view the library is given
// (shape [batch, seqlen, heads, head_dim], strides in elements).
struct HostTensor {
  DType dtype = DType::kFloat16;
  StridedView view;
  std::vector<uint16_t> bits;

  HostInput input() const { return HostInput::bits16(bits.data(), dtype, view); }
  size_t bytes() const { return bits.size() * sizeof(uint16_t); }
};

// The view of a tensor of shape [batch, seqlen, heads, head_dim] laid out as bshd, or as [batch, heads, seqlen,
// head_dim] in memory for bhsd (the strides say so; the shape stays bshd). It spans elements() elements.
StridedView host_view(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim, bool bhsd);

// A host tensor of host_view's layout.
HostTensor make_host_tensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim, bool bhsd);

// Random normal values rounded to the tensor's type, in memory order.
void fill_normal(HostTensor& t, std::mt19937& rng);

// The library's view of host's layout over device's memory.
TensorView tensor_view(const HostTensor& host, const DeviceBuffer& device);
TensorView tensor_view(DType dtype, const StridedView& view, const DeviceBuffer& device);

// `count` rows spread evenly over all (batch, head, query) rows, plus the very last query row.
std::vector<RowSample> sample_rows(int64_t batch, int64_t heads, int64_t seqlen_q, int64_t count);

// Adds a check's mismatches to result, which lists the first kShownMismatches of all its checks.
void add_mismatches(const CheckReport& report, CheckResult& result);

// The kernel's out and lse ([batch, heads_q, seqlen_q] floats) at rows against the float64 reference.
CheckResult check_sampled_rows(const AttentionShape& shape, const HostInput& q, const HostInput& k, const HostInput& v,
                               const HostInput& out, const float* lse, DType dtype,
                               const std::vector<RowSample>& rows, double scale, Mask mask,
                               const ReferenceVariant& variant = {});

// Where a run's ALiBi slopes live: p's standard slopes (variant_of) uploaded into slopes; null without ALiBi.
const float* upload_alibi_slopes(const AttentionProblem& p, DeviceBuffer& slopes);
// A stand-in address for the slopes of a check that launches nothing; null without ALiBi.
const float* placeholder_alibi_slopes(const AttentionProblem& p);

// The float64 references' variant of a run: its problem's (variant_of) and --sink's logit for every query head.
ReferenceVariant run_variant(const RunOptions& o);
// Where a run's sinks live: --sink's logit for every query head uploaded into sinks; null without --sink.
const float* upload_sinks(const RunOptions& o, DeviceBuffer& sinks);

// The FP8 forward's out (out_dtype) and lse at rows against float64 attention over the dequantized inputs
// (HostInput::fp8_codes), by FlashAttention-3's rule (check/output_check.hpp's check_fp8_rows).
CheckResult check_sampled_rows_fp8(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                   const HostInput& v, const HostInput& out, const float* lse, DType out_dtype,
                                   const std::vector<RowSample>& rows, double scale, Mask mask,
                                   const ReferenceVariant& variant = {});

// Adds part (a sequence's, say) to result: rows, the larger errors, mismatches.
void add_check(const CheckResult& part, CheckResult& result);

// One gradient, every element, against its float64 reference (contiguous [b, s, h, d]); the error relative to
// the reference's magnitude goes to result.max_error_out.
void check_gradient(const char* name, const HostInput& got, const std::vector<double>& want, DType dtype,
                    CheckResult& result);

// Largest problem whose backward `run --backward` checks against the whole float64 reference
// (batch * heads * seqlen_q * seqlen_k * head_dim multiply-adds, about a minute on one core).
constexpr double kMaxBackwardCheckCost = 4e9;

// Events around every launch of fn on stream; sorted milliseconds.
std::vector<double> time_launches(const std::function<void()>& fn, int warmup, int iters, CUstream stream);

// A run's first launch (compiling or loading its kernel): launched and waited for, its time, config, reason and arch
// written to report.
ForwardLaunch first_forward_launch(const std::function<ForwardLaunch()>& launch, CUstream stream, RunReport& report);

// `run --kv-cache` (run_kvcache.cpp): random q and full caches (scattered into shuffled pages when paged), one
// checked call, then timing. report holds the device fields.
RunReport run_kvcache(const RunOptions& o, const ScopedContext& context, RunReport report);
// check_run_problem's part for --kv-cache: the library's own checks on placeholder addresses.
void check_kvcache_problem(const RunOptions& o);

// `run --varlen` (run_varlen.cpp): a packed batch of packed_batch(problem)'s sequences, its forward (and with
// --backward its backward) checked sequence by sequence, then timing.
RunReport run_varlen(const RunOptions& o, const ScopedContext& context, RunReport report);
void check_varlen_problem(const RunOptions& o);

// `run --dtype e4m3|e5m2` (run_fp8.cpp): the dense FP8 forward over random codes and descales, its sampled rows
// checked by check_sampled_rows_fp8, then timing. report holds the device fields.
RunReport run_fp8(const RunOptions& o, RunReport report);

}  // namespace flashgen::cli
