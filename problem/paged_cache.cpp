// Paged caches built from contiguous rows (paged_cache.hpp).
#include "problem/paged_cache.hpp"

#include <algorithm>
#include <numeric>
#include <random>

namespace flashgen {

std::vector<uint16_t> into_pages(const std::vector<uint16_t>& rows, int64_t row, const std::vector<int64_t>& first,
                                 const std::vector<int64_t>& count, const std::vector<int32_t>& table,
                                 int64_t max_pages, int64_t page_size, uint16_t fill) {
  std::vector<uint16_t> cache(table.size() * static_cast<size_t>(page_size * row), fill);
  for (size_t b = 0; b < first.size(); ++b)
    for (int64_t j = 0; j < count[b]; ++j) {
      const int64_t at = table[b * size_t(max_pages) + size_t(j / page_size)] * page_size + j % page_size;
      std::copy_n(rows.begin() + (first[b] + j) * row, row, cache.begin() + at * row);
    }
  return cache;
}

std::vector<int32_t> shuffled_pages(int64_t pages, uint64_t seed) {
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(seed));
  return table;
}

}  // namespace flashgen
