// The run command's shared parts: host tensors, random inputs, sampled and whole checks against float64, timing.
#include "cli/run_support.hpp"

#include <algorithm>
#include <set>

#include "cli/common.hpp"

namespace flashgen::cli {

namespace {

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

// host's values in buffer (reallocated to their size), as the device array a call reads.
const float* upload_floats(const std::vector<float>& host, DeviceBuffer& buffer) {
  buffer = DeviceBuffer(host.size() * sizeof(float));
  buffer.upload(host);
  return static_cast<const float*>(buffer.data());
}

}  // namespace

StridedView host_view(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim, bool bhsd) {
  StridedView view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  if (bhsd) {
    view.stride[0] = heads * seqlen * head_dim;
    view.stride[1] = head_dim;
    view.stride[2] = seqlen * head_dim;
  }
  return view;
}

HostTensor make_host_tensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                            bool bhsd) {
  HostTensor t;
  t.dtype = dtype;
  t.view = host_view(batch, seqlen, heads, head_dim, bhsd);
  t.bits.resize(static_cast<size_t>(t.view.elements()));
  return t;
}

// Random normal values rounded to the tensor's type, in memory order.
void fill_normal(HostTensor& t, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& bits : t.bits) bits = float_to_dtype_bits(normal(rng), t.dtype);
}

TensorView tensor_view(const HostTensor& host, const DeviceBuffer& device) {
  return tensor_view(host.dtype, host.view, device);
}

TensorView tensor_view(DType dtype, const StridedView& host, const DeviceBuffer& device) {
  TensorView view;
  view.data = device.data();
  view.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = host.shape[i];
    view.stride[i] = host.stride[i];
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

const float* upload_alibi_slopes(const AttentionProblem& p, DeviceBuffer& slopes) {
  return p.alibi ? upload_floats(variant_of(p).alibi_slopes, slopes) : nullptr;
}

const float* placeholder_alibi_slopes(const AttentionProblem& p) {
  return p.alibi ? reinterpret_cast<const float*>(uintptr_t{1} << 32) : nullptr;
}

ReferenceVariant run_variant(const RunOptions& o) {
  ReferenceVariant variant = variant_of(o.problem);
  if (o.sink) variant.sinks.assign(static_cast<size_t>(o.problem.shape.heads_q), *o.sink);
  return variant;
}

const float* upload_sinks(const RunOptions& o, DeviceBuffer& sinks) {
  return o.sink ? upload_floats(run_variant(o).sinks, sinks) : nullptr;
}

// Adds a check's mismatches to result, which lists the first kShownMismatches of all its checks.
void add_mismatches(const CheckReport& report, CheckResult& result) {
  result.mismatches += report.mismatches;
  for (const std::string& line : report.first_mismatches) {
    if (result.first_mismatches.size() < kShownMismatches) result.first_mismatches.push_back(line);
  }
}

namespace {

// A run's check of `count` sampled rows: both reports' largest errors and their mismatches.
CheckResult rows_result(const RowsCheck& check, size_t count) {
  CheckResult result;
  result.rows = count;
  result.max_error_out = check.out.max_error;
  result.max_error_lse = check.lse.max_error;
  add_mismatches(check.out, result);
  add_mismatches(check.lse, result);
  return result;
}

}  // namespace

CheckResult check_sampled_rows(const AttentionShape& shape, const HostInput& q, const HostInput& k, const HostInput& v,
                               const HostInput& out, const float* lse, DType dtype,
                               const std::vector<RowSample>& rows, double scale, Mask mask,
                               const ReferenceVariant& variant) {
  // The float64 reference is the slow part for long sequences: rows are independent, so use every core.
  const std::vector<ReferenceRow> reference =
      attention_reference_rows(shape, q, k, v, scale, mask, rows, default_jobs(), variant);
  return rows_result(check_rows(shape, rows, reference, out, lse, dtype), rows.size());
}

CheckResult check_sampled_rows_fp8(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                   const HostInput& v, const HostInput& out, const float* lse, DType out_dtype,
                                   const std::vector<RowSample>& rows, double scale, Mask mask,
                                   const ReferenceVariant& variant) {
  const std::vector<Fp8ReferenceRow> reference =
      attention_reference_rows_fp8(shape, q, k, v, scale, mask, rows, default_jobs(), variant);
  const Fp8RowsCheck check = check_fp8_rows(shape, rows, reference, out, lse, out_dtype);
  CheckResult result = rows_result(check.rows, rows.size());
  result.fp8 = CheckResult::Fp8Bounds{check.p_rounded_error, check.bound_out, check.bound_lse};
  return result;
}

void add_check(const CheckResult& part, CheckResult& result) {
  result.rows += part.rows;
  result.max_error_out = std::max(result.max_error_out, part.max_error_out);
  result.max_error_lse = std::max(result.max_error_lse, part.max_error_lse);
  result.mismatches += part.mismatches - static_cast<int64_t>(part.first_mismatches.size());
  for (const std::string& line : part.first_mismatches) {
    ++result.mismatches;
    if (result.first_mismatches.size() < kShownMismatches) result.first_mismatches.push_back(line);
  }
}

void check_gradient(const char* name, const HostInput& got, const std::vector<double>& want, DType dtype,
                    CheckResult& result) {
  const StridedView& view = got.view;
  std::vector<double> values;  // contiguous [b, s, h, d], as the reference
  values.reserve(want.size());
  for (int64_t b = 0; b < view.shape[0]; ++b)
    for (int64_t s = 0; s < view.shape[1]; ++s)
      for (int64_t h = 0; h < view.shape[2]; ++h)
        for (int64_t d = 0; d < view.shape[3]; ++d) values.push_back(got.at(b, s, h, d));
  const double magnitude = max_magnitude(want);
  const CheckReport check = check_elements(name, {view.shape[0], view.shape[1], view.shape[2], view.shape[3]}, values,
                                           want, gradient_tolerance(dtype, magnitude));
  result.max_error_out = std::max(result.max_error_out, check.max_error / std::max(magnitude, kGradientMagnitudeFloor));
  add_mismatches(check, result);
}

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

ForwardLaunch first_forward_launch(const std::function<ForwardLaunch()>& launch, CUstream stream, RunReport& report) {
  const Clock::time_point first = Clock::now();
  ForwardLaunch forward_launch = launch();
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  report.first_launch_ms = ms_since(first);
  report.config_name = flashgen::config_name(forward_launch.config);
  report.reason = forward_launch.reason;
  report.arch = forward_launch.arch;
  return forward_launch;
}

}  // namespace flashgen::cli
