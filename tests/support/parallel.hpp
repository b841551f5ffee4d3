// Runs fn(0) .. fn(count - 1) on every core of the machine: the tests' way of compiling many kernels at
// once (the kernel registry is thread-safe) before checking them one by one.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/kernel_registry.hpp"

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

// Compiles the distinct configs that configs_of(item) lists for every item, on every core at once, through
// the process-wide registry (so the checks that follow find them compiled).
template <class Items, class ConfigsOf>
void compile_all(const Items& items, ConfigsOf&& configs_of, int arch) {
  using Config = typename decltype(configs_of(*items.begin()))::value_type;
  std::vector<Config> all;
  std::set<std::string> names;
  for (const auto& item : items)
    for (const Config& c : configs_of(item))
      if (names.insert(c.name()).second) all.push_back(c);
  parallel_for(all.size(), [&](size_t i) { KernelRegistry::instance().compiled(all[i], arch); });
}

}  // namespace flashgen::testing
