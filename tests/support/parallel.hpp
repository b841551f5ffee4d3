// Runs fn(0) .. fn(count - 1) on every core of the machine: the tests' way of compiling many kernels at
// once (the kernel registry is thread-safe) before checking them one by one.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace flashgen::testing {

template <class Fn>
void parallel_for(size_t count, Fn&& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::max(1u, std::thread::hardware_concurrency()); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
}

}  // namespace flashgen::testing
