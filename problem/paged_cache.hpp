// A paged KV cache as the tuner's sweeps and `flashgen run` build one from contiguous rows: every sequence's
// pages in one shuffled block table, each key moved to its page's row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "problem/attention_problem.hpp"

namespace flashgen {

// A paged cache of `rows` (row-major, `row` elements each): sequence b's rows [first[b], first[b] + count[b]) as
// its keys, key j in row j % page_size of page table[b * max_pages + j / page_size] of table.size() * page_size
// rows; every row no sequence owns holds `fill`. T: 16-bit elements, or an FP8 cache's bytes.
template <class T>
std::vector<T> into_pages(const std::vector<T>& rows, int64_t row, const std::vector<int64_t>& first,
                          const std::vector<int64_t>& count, const std::vector<int32_t>& table, int64_t max_pages,
                          int64_t page_size, T fill) {
  std::vector<T> cache(table.size() * static_cast<size_t>(page_size * row), fill);
  for (size_t b = 0; b < first.size(); ++b)
    for (int64_t j = 0; j < count[b]; ++j) {
      const int64_t at = table[b * size_t(max_pages) + size_t(j / page_size)] * page_size + j % page_size;
      std::copy_n(rows.begin() + (first[b] + j) * row, row, cache.begin() + at * row);
    }
  return cache;
}

// A block table of `pages` page indices in an order shuffled by `seed`.
std::vector<int32_t> shuffled_pages(int64_t pages, uint64_t seed);

// A packed batch's keys in pages of page_size: max_pages per sequence, enough for its longest (shape.seqlen_k,
// the calls' max_seqlen_k), every sequence's pages in one table shuffled by `seed`.
struct PagedBatch {
  int64_t page_size = 0, max_pages = 0;
  std::vector<int32_t> table;  // [sequences, max_pages]

  PagedBatch(const PackedBatch& batch, int64_t page_size, uint64_t seed);
  int64_t num_pages() const { return static_cast<int64_t>(table.size()); }
  // The batch's packed key rows (`row` elements each) moved into the pages; every row no sequence owns holds NaN,
  // which no result may read.
  std::vector<uint16_t> cache_of(const std::vector<uint16_t>& rows, int64_t row, const PackedBatch& batch) const;
};

}  // namespace flashgen
