// GPU timing for the tuner: events around one launch, an L2 flush before it, robust statistics.
#include "tuner/timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/cuda_driver.hpp"

namespace flashgen {

TimingResult summarize(std::vector<double> samples_ms) {
  TimingResult result;
  result.samples = static_cast<int>(samples_ms.size());
  if (samples_ms.empty()) return result;
  std::sort(samples_ms.begin(), samples_ms.end());
  auto quantile = [&](double q) {
    const double position = q * static_cast<double>(samples_ms.size() - 1);
    const size_t below = static_cast<size_t>(std::floor(position));
    const size_t above = std::min(below + 1, samples_ms.size() - 1);
    const double weight = position - static_cast<double>(below);
    return samples_ms[below] * (1 - weight) + samples_ms[above] * weight;
  };
  result.median_ms = quantile(0.5);
  result.p10_ms = quantile(0.1);
  result.p90_ms = quantile(0.9);
  return result;
}

Timer::Timer(CUstream stream) : stream_(stream) {
  CUcontext context = nullptr;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&context));
  CUdevice device = 0;
  FLASHGEN_CU_CHECK(cuCtxGetDevice(&device));
  int l2_bytes = 0;
  FLASHGEN_CU_CHECK(cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device));
  flush_bytes_ = std::max<size_t>(2 * static_cast<size_t>(l2_bytes), size_t(1) << 20);
  try {
    FLASHGEN_CU_CHECK(cuMemAlloc(&flush_, flush_bytes_));
    FLASHGEN_CU_CHECK(cuEventCreate(&start_, CU_EVENT_DEFAULT));
    FLASHGEN_CU_CHECK(cuEventCreate(&stop_, CU_EVENT_DEFAULT));
  } catch (...) {
    release();  // no destructor runs for an object whose constructor threw
    throw;
  }
}

Timer::~Timer() { release(); }

void Timer::release() {
  const DriverApi& api = driver();
  if (start_ != nullptr) api.cuEventDestroy(start_);
  if (stop_ != nullptr) api.cuEventDestroy(stop_);
  if (flush_ != 0) api.cuMemFree(flush_);
  start_ = stop_ = nullptr;
  flush_ = 0;
}

float Timer::timed_sample(const std::function<void(int sample)>& launch, int sample) {
  // Alternate the fill byte so the writes cannot be elided.
  FLASHGEN_CU_CHECK(cuMemsetD8Async(flush_, static_cast<unsigned char>(sample & 0xff), flush_bytes_, stream_));
  FLASHGEN_CU_CHECK(cuEventRecord(start_, stream_));
  launch(sample);
  FLASHGEN_CU_CHECK(cuEventRecord(stop_, stream_));
  FLASHGEN_CU_CHECK(cuEventSynchronize(stop_));
  float ms = 0;
  FLASHGEN_CU_CHECK(cuEventElapsedTime(&ms, start_, stop_));
  return ms;
}

TimingResult Timer::time(const std::function<void(int sample)>& launch, const TimingOptions& options) {
  const auto begin = std::chrono::steady_clock::now();
  auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  };
  for (int i = 0; i < options.warmup; ++i) launch(i);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream_));

  std::vector<double> samples;
  for (int i = 0; i < options.max_samples; ++i) {
    samples.push_back(timed_sample(launch, i));
    if (static_cast<int>(samples.size()) >= options.min_samples &&
        (summarize(samples).spread() < options.target_spread || elapsed_ms() > options.budget_ms)) {
      break;
    }
  }
  return summarize(samples);
}

std::vector<TimingResult> Timer::time_interleaved(const std::vector<std::function<void(int sample)>>& launches,
                                                  int rounds) {
  std::vector<std::vector<double>> samples(launches.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < launches.size(); ++i) samples[i].push_back(timed_sample(launches[i], round));
  }
  std::vector<TimingResult> results;
  for (auto& s : samples) results.push_back(summarize(std::move(s)));
  return results;
}

}  // namespace flashgen
