// Paged caches built from contiguous rows (paged_cache.hpp).
#include "problem/paged_cache.hpp"

#include <algorithm>
#include <numeric>
#include <random>

namespace flashgen {

PagedBatch::PagedBatch(const PackedBatch& batch, int64_t page_size, uint64_t seed)
    : page_size(page_size), max_pages(std::max<int64_t>(1, (batch.shape.seqlen_k + page_size - 1) / page_size)) {
  table = shuffled_pages(static_cast<int64_t>(batch.len_k.size()) * max_pages, seed);
}

std::vector<uint16_t> PagedBatch::cache_of(const std::vector<uint16_t>& rows, int64_t row,
                                           const PackedBatch& batch) const {
  const std::vector<int64_t> first(batch.cu_k.begin(), batch.cu_k.end() - 1);
  constexpr uint16_t kNaN = 0x7fff;  // in fp16 and bf16 alike
  return into_pages(rows, row, first, batch.len_k, table, max_pages, page_size, kNaN);
}

std::vector<int32_t> shuffled_pages(int64_t pages, uint64_t seed) {
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(seed));
  return table;
}

}  // namespace flashgen
