// GPU timing for the tuner: CUDA events on the launch stream, warm-up, an L2 flush before every
// sample, median and spread, stopping when the spread is small or a time budget runs out.
#pragma once

#include <cuda.h>

#include <functional>
#include <vector>

namespace flashgen {

struct TimingOptions {
  int warmup = 3;  // untimed launches first
  int min_samples = 10;
  int max_samples = 100;
  double target_spread = 0.02;  // stop once (p90 - p10) / median is below this (after min_samples)
  double budget_ms = 2000;      // wall budget of device time for one timing, warm-up included
};

struct TimingResult {
  double median_ms = 0;
  double p10_ms = 0;
  double p90_ms = 0;
  int samples = 0;
  double spread() const { return median_ms > 0 ? (p90_ms - p10_ms) / median_ms : 0; }
};

// Times launch(sample) on stream, one launch per sample. Before each sample a buffer twice the device's
// L2 size is overwritten on the stream, so no sample starts with warm caches. Must be called with the
// stream's context current.
class Timer {
 public:
  explicit Timer(CUstream stream);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  TimingResult time(const std::function<void(int sample)>& launch, const TimingOptions& options);

  // One flushed, timed sample of each launch in turn, rounds times over: interleaving puts clock and
  // thermal drift on every candidate alike. Returns one result per launch.
  std::vector<TimingResult> time_interleaved(const std::vector<std::function<void(int sample)>>& launches, int rounds);

 private:
  float timed_sample(const std::function<void(int sample)>& launch, int sample);
  void release();

  CUstream stream_;
  CUdeviceptr flush_ = 0;
  size_t flush_bytes_ = 0;
  CUevent start_ = nullptr;
  CUevent stop_ = nullptr;
};

// Median and 10th/90th percentiles of samples (milliseconds).
TimingResult summarize(std::vector<double> samples_ms);

}  // namespace flashgen
