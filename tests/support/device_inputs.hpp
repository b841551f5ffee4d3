// Inputs of the [gpu] tests of packed batches and KV caches: random normal values rounded to a 16-bit type,
// and host vectors copied to device buffers.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "api/from_c.hpp"
#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "runtime/device_buffer.hpp"

namespace flashgen::test {

// count random normal values of dtype, as raw 16-bit patterns.
inline std::vector<uint16_t> random_bits(size_t count, flashgen_dtype dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> bits(count);
  for (uint16_t& b : bits) b = float_to_dtype_bits(normal(rng), from_c(dtype));
  return bits;
}

// A device buffer holding a copy of values.
template <class T>
DeviceBuffer upload(const std::vector<T>& values) {
  DeviceBuffer buffer(values.size() * sizeof(T));
  buffer.upload(values);
  return buffer;
}

}  // namespace flashgen::test
