// What the four kernel families derive from the variant policy (variant.cuh) and the sequence bounds:
// the key blocks a query block visits (forward, and the backward's dq kernel), the query blocks a key
// block visits (the backward's dkdv kernels), each split into blocks that need a per-element mask and
// blocks that need none; and the variant's scores (its transform, and its mask in partial blocks) on one
// 16-row tile of S in the forward accumulator layout (softmax.cuh). The ranges take each row to see one
// run of consecutive keys, a prefix or a sliding window (tests/templates/variant_check.cu checks them
// against visible()).
#pragma once

#include "attn_params.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {

// The blocks of kBlockN keys that query rows [row_begin, row_begin + rows) of one (batch, head) visit:
// blocks [begin, end) hold a key some row sees (keys at or past key_end are hidden from every row, so the
// kernels zero-fill them rather than read them; keys before block begin are hidden from every row where
// the variant hides early keys, else begin is 0). Blocks [full_begin(), full_end()) need no per-element
// mask: every key is inside seqlen_k and visible to every row; the rest are partial (with a window, runs
// at both ends; where the window is narrower than a block, every one).
// A user mask's block classes (attn_params.cuh's UserBlockClasses) where the call has them: forward and backward calls
// of a config with a user mask, dense or packed, not over a paged cache. Null for every other params type and call.
template <class Params>
__host__ __device__ __forceinline__ const UserBlockClasses* user_classes_of(const Params&) {
  return nullptr;
}
__host__ __device__ __forceinline__ const UserBlockClasses* user_classes_of(const AttnFwdParams& p) {
  return p.user_classes.rows != nullptr ? &p.user_classes : nullptr;
}
__host__ __device__ __forceinline__ const UserBlockClasses* user_classes_of(const AttnBwdParams& p) {
  return p.user_classes.rows != nullptr ? &p.user_classes : nullptr;
}

// The classes' four ints (first, end, full_first, full_end) of the query block holding rows [row_begin, row_begin +
// rows) of query head `head`, or null where there are none, or they were taken at other tiles (another kernel of the
// module: the sm80 backward's dq kernel), or the rows span two of their blocks.
template <int kBlockN, class Params>
__host__ __device__ __forceinline__ const int* query_block_classes(const Params& p, int batch, int head, int row_begin,
                                                                   int rows) {
  const UserBlockClasses* c = user_classes_of(p);
  if (c == nullptr || c->block_n != kBlockN) return nullptr;
  const int m = row_begin / c->block_m;
  if ((row_begin + rows - 1) / c->block_m != m) return nullptr;
  const int group = batch * c->heads + (c->heads == 1 ? 0 : head / c->head_group);
  return c->rows + (static_cast<long long>(group) * c->row_blocks + m) * 4;
}

// The same of the key block starting at key_begin of kv head kv_head (the backward's: first, end, full_first and
// full_end of the query blocks that visit it).
template <int kBlockM, int kBlockN, class Params>
__host__ __device__ __forceinline__ const int* key_block_classes(const Params& p, int batch, int kv_head,
                                                                 int key_begin) {
  const UserBlockClasses* c = user_classes_of(p);
  if (c == nullptr || c->cols == nullptr || c->block_m != kBlockM || c->block_n != kBlockN) return nullptr;
  const int group = batch * c->heads + (c->heads == 1 ? 0 : kv_head);
  return c->cols + (static_cast<long long>(group) * c->col_blocks + key_begin / kBlockN) * 4;
}

template <class Variant, int kBlockN>
struct KeyBlocks {
  int key_end;
  int begin;
  int end;
  // A user mask's classes of these rows (query_block_classes), or null: read again by full_end and full_begin.
  const int* classes = nullptr;

  // head: the query head, read only for a user mask's block classes.
  template <class Params>
  __host__ __device__ __forceinline__ KeyBlocks(const Params& p, int batch, int row_begin, int rows, int head = 0) {
    key_end = p.seqlen_k;
    if constexpr (Variant::kHidesKeys) key_end = min(key_end, Variant::key_end(p, batch, row_begin + rows));
    end = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
    begin = 0;
    // The first row sees the earliest keys.
    if constexpr (Variant::kHidesEarlyKeys) begin = min(max(0, Variant::first_key(p, batch, row_begin)) / kBlockN, end);
    if constexpr (Variant::kEveryBlockPartial) {
      // A user mask's classes narrow the walk to the blocks that hold a visible key (user_blocks.cuh).
      classes = query_block_classes<kBlockN>(p, batch, head, row_begin, rows);
      if (classes != nullptr) {
        begin = max(begin, classes[0]);
        end = max(min(end, classes[1]), begin);
      }
    }
  }

  // How many blocks the rows visit.
  __host__ __device__ __forceinline__ int count() const { return end - begin; }

  // Computed where a kernel first needs it (row_begin as above).
  template <class Params>
  __host__ __device__ __forceinline__ int full_end(const Params& p, int batch, int row_begin) const {
    int full = p.seqlen_k / kBlockN;
    // The first row sees the fewest keys: the blocks before its last key + 1.
    if constexpr (Variant::kHidesKeys) {
      full = min(full, max(0, (Variant::last_key(p, batch, row_begin) + 1) / kBlockN));
    }
    if constexpr (Variant::kEveryBlockPartial) {  // full where the user's classes say so too, else nowhere
      if (classes == nullptr) return begin;
      full = min(full, classes[3]);
    }
    return max(min(full, end), begin);
  }
  // The same for the start of the run, the last row being row_last (at most full_end: full_begin ==
  // full_end where no block is full).
  template <class Params>
  __host__ __device__ __forceinline__ int full_begin(const Params& p, int batch, int row_last, int full_end) const {
    int first_full = begin;
    if constexpr (Variant::kHidesEarlyKeys) {
      // The last row sees the fewest early keys: the blocks from its first key on.
      const int first = Variant::first_key(p, batch, row_last);
      first_full = first <= 0 ? 0 : (first + kBlockN - 1) / kBlockN;
    }
    if constexpr (Variant::kEveryBlockPartial) {
      if (classes != nullptr) first_full = max(first_full, classes[2]);
    }
    return min(max(first_full, begin), full_end);
  }
};

// Visits key blocks [begin, end) in order, as the sm80 families walk them through their cp.async rings:
// [full_begin, full_end) with no per-element mask, visit(n, BoolConstant<false>), the rest with one
// (begin <= full_begin <= full_end <= end).
template <class Visit>
__device__ __forceinline__ void visit_key_blocks(int begin, int full_begin, int full_end, int end, Visit&& visit) {
  for (int n = begin; n < full_begin; ++n) visit(n, sm80::BoolConstant<true>{});
  for (int n = full_begin; n < full_end; ++n) visit(n, sm80::BoolConstant<false>{});
  for (int n = full_end; n < end; ++n) visit(n, sm80::BoolConstant<true>{});
}

// The blocks of kBlockM query rows that see keys [key_begin, key_begin + kBlockN) of one (batch, kv
// head), the same for each query head of its group: blocks [begin, end) hold a row that sees one of the
// keys (block m is among them exactly when KeyBlocks over its kBlockM rows holds this key block: the
// backward's dQ turns count on it); of those, [full_begin, full_end) see every key (no per-element mask)
// and the rest are partial. keys() is how many of the block's keys lie inside seqlen_k (kBlockN or more
// when all do): a block with fewer is partial for every query block. It is asked once, after the
// variant's range.
template <class Variant, int kBlockM, int kBlockN>
struct QueryBlocks {
  int end;
  int begin;
  int full_begin;
  int full_end;

  // kv_head: read only for a user mask's block classes.
  template <class Params, class KeyCount>
  __host__ __device__ __forceinline__ QueryBlocks(const Params& p, int batch, int key_begin, KeyCount keys,
                                                  int kv_head = 0) {
    end = (p.seqlen_q + kBlockM - 1) / kBlockM;
    begin = 0;
    full_begin = 0;
    full_end = end;
    if constexpr (Variant::kHidesKeys) {
      const int first_row = Variant::first_query(p, batch, key_begin);               // first query seeing key_begin
      const int full_row = Variant::first_query(p, batch, key_begin + kBlockN - 1);  // first query seeing all keys
      begin = min(first_row <= 0 ? 0 : first_row / kBlockM, end);
      full_begin = full_row <= 0 ? 0 : (full_row + kBlockM - 1) / kBlockM;
    }
    if constexpr (Variant::kHidesEarlyKeys) {
      // The last query seeing the block's last key (past seqlen_k too, as KeyBlocks counts), and the last
      // one seeing its first key, hence all of them.
      const int last_row = Variant::last_query(p, batch, key_begin + kBlockN - 1);
      const int full_last_row = Variant::last_query(p, batch, key_begin);
      end = last_row < 0 ? 0 : min(end, last_row / kBlockM + 1);
      begin = min(begin, end);
      full_end = full_last_row < 0 ? 0 : (full_last_row + 1) / kBlockM;
    }
    if constexpr (Variant::kEveryBlockPartial) {
      // A user mask's classes (the backward's) narrow the walk to the query blocks whose band holds this key block,
      // and name its full ones; without them every block is partial.
      const int* classes = key_block_classes<kBlockM, kBlockN>(p, batch, kv_head, key_begin);
      full_begin = end;
      if (classes != nullptr) {
        begin = max(begin, classes[0]);
        end = max(min(end, classes[1]), begin);
        full_begin = classes[2];
        full_end = classes[3];
      }
    }
    if (keys() < kBlockN) full_begin = end;  // keys past seqlen_k are masked in every block
    full_begin = min(max(full_begin, begin), end);
    full_end = min(max(full_end, full_begin), end);
  }
};

// Where the two rows of a thread's 16-row tile lie: query head and query row of rows g (h 0) and g + 8 (h 1).
struct TileRow {
  int head;
  int row;
};

// The variant's scores on the first kWidth 8-key groups of a 16-row tile of S = Q Kᵀ (forward layout):
// this thread holds rows at(0) (h 0) and at(1) (h 1), keys key0 + 8i + 2t + e of group i (key0: the block's
// first key; t: lane % 4). In a partial block (kMasked) the scores the variant hides, or whose key lies past
// seqlen_k, become -inf; every other score becomes the variant's row score of it, in units of score_unit (which
// the caller's softmax scale takes: row_scale_log2 below). Nothing is left of it in a full block of a variant that
// transforms no score.
template <class Variant, int kWidth, bool kMasked, class Params, int kGroups, class RowAt>
__device__ __forceinline__ void variant_scores_at(const Params& p, float (&acc)[kGroups][4], int batch, RowAt&& at_row,
                                                  int key0, int t) {
  if constexpr (kMasked) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Key key0 + 2t + o of this row is hidden iff keys.hidden(o).
      const TileRow r = at_row(h);
      const auto keys = Variant::row_keys(p, batch, r.head, r.row, p.seqlen_k - 1, key0 + 2 * t);
#pragma unroll
      for (int i = 0; i < kWidth; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (keys.hidden(i * 8 + e)) acc[i][2 * h + e] = neg_inf();
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Key key0 + 2t + o of this row scores .score(s, o).
    const TileRow tr = at_row(h);
    const auto row = Variant::row_scores(p, ScoreAt{batch, tr.head, tr.row, key0 + 2 * t});
#pragma unroll
    for (int i = 0; i < kWidth; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float s = acc[i][2 * h + e];
        acc[i][2 * h + e] = kMasked && s == neg_inf() ? s : row.score(s, 8 * i + e);  // q·k itself is finite
      }
  }
}

// The softmax scale (log2 units) of the scores variant_scores_at leaves: scale_log2 itself when the variant's row
// scores are in q·k units, else scale_log2 · score_unit(p), written to folded (the soft cap's multiply per score,
// folded into the scale once).
template <class Variant, class Params>
__device__ __forceinline__ const float& row_scale_log2(const float& scale_log2, const Params& p, float& folded) {
  if constexpr (Variant::kScaledRows) {
    folded = scale_log2 * Variant::score_unit(p);
    return folded;
  } else {
    return scale_log2;
  }
}

// The same for a tile of one query head whose rows are consecutive queries: row (h 0) and row + 8 (h 1).
template <class Variant, int kWidth, bool kMasked, class Params, int kGroups>
__device__ __forceinline__ void variant_scores(const Params& p, float (&acc)[kGroups][4], int batch, int head,
                                               int row, int key0, int t) {
  variant_scores_at<Variant, kWidth, kMasked>(p, acc, batch, [&](int h) { return TileRow{head, row + 8 * h}; }, key0,
                                              t);
}

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own: a causal tile's ranges and mask.
struct FlashgenBlockRangeCheckParams {
  int seqlen_q, seqlen_k;
  flashgen::VariantArgs variant;
};
__global__ void flashgen_block_range_check(const FlashgenBlockRangeCheckParams p, float* out) {
  using Variant = flashgen::CausalMask;
  const flashgen::KeyBlocks<Variant, 64> keys(p, 0, 128, 64);
  const flashgen::QueryBlocks<Variant, 64, 64> queries(p, 0, 64, [&] { return p.seqlen_k - 64; });
  float acc[8][4] = {};
  flashgen::variant_scores<Variant, 8, true>(p, acc, 0, 0, threadIdx.x / 4, 64, threadIdx.x % 4);
  out[threadIdx.x] = acc[0][0] + keys.full_end(p, 0, 128) + queries.full_begin;
}
#endif
