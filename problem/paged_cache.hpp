// A paged KV cache as the tuner's sweeps and `flashgen run` build one from contiguous rows: every sequence's
// pages in one shuffled block table, each key moved to its page's row.
#pragma once

#include <cstdint>
#include <vector>

namespace flashgen {

// A paged cache of `rows` (row-major, `row` elements each): sequence b's rows [first[b], first[b] + count[b]) as
// its keys, key j in row j % page_size of page table[b * max_pages + j / page_size] of table.size() * page_size
// rows; every row no sequence owns holds `fill`.
std::vector<uint16_t> into_pages(const std::vector<uint16_t>& rows, int64_t row, const std::vector<int64_t>& first,
                                 const std::vector<int64_t>& count, const std::vector<int32_t>& table,
                                 int64_t max_pages, int64_t page_size, uint16_t fill);

// A block table of `pages` page indices in an order shuffled by `seed`.
std::vector<int32_t> shuffled_pages(int64_t pages, uint64_t seed);

}  // namespace flashgen
