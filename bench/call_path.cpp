// Host cost of a warm call and of the first call, through the C ABI: the median over many calls of a tiny
// forward problem of the time from entering flashgen_attention_forward to its return (the launch queued),
// with a breakdown: the argument checks, dispatch's look-up of the kept launch of the problem class, the
// pointer checks and re-pointing of that launch, the launch itself, and (for comparison) a launch prepared
// from scratch as a call of a new problem class does. Writes CSV rows (device, date, library version) to stdout or --csv.
//   flashgen_bench_call_path [--calls N] [--csv FILE] [--first-call]
// --first-call times one call in this fresh process instead: context creation, then the first forward
// call (kernel from the disk cache when it holds it), each stage on its own.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/flashgen.h"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
};

Stats stats_of(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) { return samples[static_cast<size_t>(q * double(samples.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// The host time of each of `calls` calls of fn; the stream is drained every 256 calls, outside the timed
// region, so a full launch queue never blocks a timed call.
std::vector<double> time_calls(int calls, CUstream stream, const std::function<void()>& fn) {
  std::vector<double> samples;
  samples.reserve(calls);
  for (int i = 0; i < calls; ++i) {
    if (i % 256 == 0) FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
    const Clock::time_point start = Clock::now();
    fn();
    samples.push_back(us_since(start));
  }
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  return samples;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

std::string device_name(CUdevice device) {
  char name[256] = {};
  FLASHGEN_CU_CHECK(cuDeviceGetName(name, sizeof name, device));
  return name;
}

// A tiny problem: batch 1, 128 queries and keys, 1 head, head_dim 64, fp16, random inputs.
struct TinyProblem {
  static constexpr int64_t kSeq = 128, kHeads = 1, kDim = 64;
  flashgen::DeviceBuffer q, k, v, out, lse;
  flashgen_tensor tq{}, tk{}, tv{}, tout{};
  flashgen_attention_options opts{};

  TinyProblem() {
    const size_t elems = kSeq * kHeads * kDim;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<uint16_t> host(elems);
    for (flashgen::DeviceBuffer* b : {&q, &k, &v, &out}) {
      *b = flashgen::DeviceBuffer(elems * 2);
      for (auto& h : host) h = flashgen::float_to_half_bits(normal(rng));
      b->upload(host);
    }
    lse = flashgen::DeviceBuffer(sizeof(float) * kSeq * kHeads);
    auto bshd = [](void* data) {
      return flashgen_tensor{data, FLASHGEN_FLOAT16, {1, kSeq, kHeads, kDim},
                             {kSeq * kHeads * kDim, kHeads * kDim, kDim, 1}};
    };
    tq = bshd(q.data()), tk = bshd(k.data()), tv = bshd(v.data()), tout = bshd(out.data());
    opts.mask = FLASHGEN_MASK_CAUSAL;
  }

  int call(CUstream stream) {
    return flashgen_attention_forward(&tq, &tk, &tv, &tout, static_cast<float*>(lse.data()), &opts, stream);
  }
};

void require_ok(int rc, const char* what) {
  if (rc != FLASHGEN_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s\n", what, flashgen_last_error());
    std::exit(1);
  }
}

int first_call() {
  Clock::time_point start = Clock::now();
  flashgen::driver();
  const double init_us = us_since(start);
  start = Clock::now();
  flashgen::ScopedContext scope;  // the primary context of device 0, as a first call without one makes
  const double context_us = us_since(start);
  CUstream stream = nullptr;
  FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  TinyProblem problem;
  start = Clock::now();
  require_ok(problem.call(stream), "first flashgen_attention_forward");
  const double first_us = us_since(start);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  start = Clock::now();
  require_ok(problem.call(stream), "second flashgen_attention_forward");
  const double second_us = us_since(start);
  std::printf("stage,ms\ncuInit,%.3f\ncontext,%.3f\nfirst_call,%.3f\nsecond_call,%.3f\n", init_us / 1e3,
              context_us / 1e3, first_us / 1e3, second_us / 1e3);
  FLASHGEN_CU_CHECK(cuStreamSynchronize(stream));
  flashgen::driver().cuStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 10000;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--calls" && i + 1 < argc) {
      calls = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--csv" && i + 1 < argc) {
      csv = argv[++i];
    } else if (arg == "--first-call") {
      return first_call();
    } else {
      std::fprintf(stderr, "usage: %s [--calls N] [--csv FILE] [--first-call]\n", argv[0]);
      return 2;
    }
  }
  std::string why;
  if (!flashgen::driver_available(&why)) {
    std::fprintf(stderr, "no GPU: %s\n", why.c_str());
    return 77;
  }
  flashgen::ScopedContext scope;
  CUstream stream = nullptr;
  FLASHGEN_CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  TinyProblem problem;
  require_ok(problem.call(stream), "flashgen_attention_forward");  // warm: compiled or loaded, chosen

  struct Row {
    const char* stage;
    Stats stats;
  };
  std::vector<Row> rows;
  rows.push_back({"c_abi_forward", stats_of(time_calls(calls, stream, [&] { problem.call(stream); }))});
  const flashgen::ForwardCall checked =
      flashgen::make_forward_call(&problem.tq, &problem.tk, &problem.tv, &problem.tout,
                                     static_cast<float*>(problem.lse.data()), &problem.opts);
  rows.push_back({"check_arguments", stats_of(time_calls(calls, stream, [&] {
                    flashgen::make_forward_call(&problem.tq, &problem.tk, &problem.tv, &problem.tout,
                                                   static_cast<float*>(problem.lse.data()), &problem.opts);
                  }))});
  rows.push_back({"dispatch_plan", stats_of(time_calls(calls, stream, [&] {
                    flashgen::plan_forward(checked, stream);
                  }))});
  const flashgen::KernelConfig config = flashgen::plan_forward(checked, stream).launch.config;
  rows.push_back({"launch_prepare", stats_of(time_calls(calls, stream, [&] {
                    flashgen::prepare_forward(checked, stream, config);
                  }))});
  const flashgen::PreparedForward prepared = flashgen::prepare_forward(checked, stream, config);
  rows.push_back({"rebind_pointers", stats_of(time_calls(calls, stream, [&] {
                    flashgen::PreparedForward copy = prepared;
                    copy.rebind(checked, static_cast<int>(scope.device()));
                  }))});
  rows.push_back({"cuLaunchKernel", stats_of(time_calls(calls, stream, [&] { prepared(stream); }))});

  CUdevice device = 0;
  FLASHGEN_CU_CHECK(cuCtxGetDevice(&device));
  std::ofstream file;
  if (!csv.empty()) file.open(csv);
  std::ostream& os = csv.empty() ? std::cout : file;
  os << "device,date,flashgen,config,calls,stage,median_us,p10_us,p90_us\n";
  for (const Row& row : rows) {
    char line[512];
    std::snprintf(line, sizeof line, "%s,%s,%s,%s,%d,%s,%.3f,%.3f,%.3f\n", device_name(device).c_str(),
                  today().c_str(), flashgen_version(), config.name().c_str(), calls, row.stage,
                  row.stats.median, row.stats.p10, row.stats.p90);
    os << line;
  }
  flashgen::driver().cuStreamDestroy(stream);
  return 0;
}
