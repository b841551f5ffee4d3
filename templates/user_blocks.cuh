// The block classes of a user's mask (variant.cuh's UserVariant; the generator adds these kernels to the forward or
// backward module of a config with a user mask, packed batches' too, not a paged cache's), launched before the
// attention kernels into p.user_classes (attn_params.cuh's UserBlockClasses), at the config's tiles, per batch entry
// or packed sequence:
//   UserBlockTiles   one block per (key block, query block, class group) tile inside the base mask's walk: asks the
//                    whole variant about every (row, key) of each query head the class head serves and writes the
//                    tile's class (0 no visible key, 1 partial, 2 full: every key inside seqlen_k and visible to every
//                    row).
//   UserBlockRanges  one warp per query block: from its row of classes, the blocks [first, end) that hold a visible
//                    key and the longest run of full blocks, which block_range.cuh's KeyBlocks reads: blocks outside
//                    [first, end) are skipped, those in the run need no per-element mask.
//   UserBlockBands   the backward's, one block per class group: widens each query block's [first, end) to a band
//                    whose ends never decrease from one query block to the next, and writes each key block's query
//                    blocks and its longest run of full tiles, which QueryBlocks reads. Both dQ strategies count a
//                    query block's adds from KeyBlocks while the dkdv kernels walk QueryBlocks, so the two must name
//                    the same tiles: with bands, query block m visits key block n exactly when n's query blocks hold
//                    m, and each key block's query blocks start no earlier than the previous one's, as the
//                    deterministic turns need (bwd_sm90.cuh). A mask whose runs of visible blocks already grow with
//                    the row (documents, prefixes, windows under causal) loses nothing to the widening.
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "sequence.cuh"
#include "variant.cuh"

namespace flashgen {

// Tile (m, n) of class group g (batch * heads + class head): its class's byte.
__host__ __device__ inline unsigned char* user_block_tile(const UserBlockClasses& c, long long group, int m, int n) {
  return c.tiles + (group * c.row_blocks + m) * c.col_blocks + n;
}

template <class Cfg>
struct UserBlockTiles {
  using Variant = typename Cfg::Variant;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  // A thread keeps one key (kKeyLanes of them side by side in a pass) and walks the rows in steps of kRowLanes, so
  // the mask's reads of the key's side leave the loop and its reads of the row's side are the same address across
  // the warp; threads past kKeyLanes * kRowLanes have nothing to do (a kBlockN that does not divide the block).
  static constexpr int kKeyLanes = kBlockN < kUserBlockThreads ? kBlockN : kUserBlockThreads;
  static constexpr int kRowLanes = kUserBlockThreads / kKeyLanes;

  // Grid (key blocks, query blocks, heads * batch), kUserBlockThreads threads; batch counts a packed batch's
  // sequences, whose blocks read their own lengths and causal offset, as the attention kernels bind them.
  template <class Params>
  static __device__ void run(const Params& params) {
    if constexpr (ConfigVarlen<Cfg>::value) {
      Params p = params;
      const SequenceRows s = sequence_rows(p, static_cast<int>(blockIdx.z) / p.user_classes.heads);
      p.seqlen_q = s.seqlen_q, p.seqlen_k = s.seqlen_k;
      p.variant.causal_offset = p.causal_bottom_right ? p.seqlen_k - p.seqlen_q : 0;
      classify(p);
    } else {
      classify(params);
    }
  }

  template <class Params>
  static __device__ void classify(const Params& p) {
    const UserBlockClasses& c = p.user_classes;
    const int n = blockIdx.x, m = blockIdx.y, group = blockIdx.z;
    const int batch = group / c.heads;
    // The query heads the class head serves (head 0 for all of them when the mask is the same for every head).
    const int head0 = group % c.heads * c.head_group;
    const int heads = c.head_group;
    const int m_start = m * kBlockM;
    const int rows = min(kBlockM, p.seqlen_q - m_start);
    const KeyBlocks<typename Variant::BaseVariant, kBlockN> walk(p, batch, m_start, rows);  // the base mask's blocks
    if (rows <= 0 || n < walk.begin || n >= walk.end) {  // past a packed sequence, or outside the base walk
      if (threadIdx.x == 0) *user_block_tile(c, group, m, n) = 0;
      return;
    }
    bool any = false, hidden = false;
    const int lane_key = static_cast<int>(threadIdx.x) % kKeyLanes, lane_row = static_cast<int>(threadIdx.x) / kKeyLanes;
    if (lane_row < kRowLanes) {
      for (int key = n * kBlockN + lane_key; key < (n + 1) * kBlockN; key += kKeyLanes) {
        if (key >= p.seqlen_k) {  // past the keys: hidden from every row
          hidden = true;
          continue;
        }
        for (int head = head0; head < head0 + heads; ++head) {
#pragma unroll 4
          for (int row = m_start + lane_row; row < m_start + rows; row += kRowLanes) {
            const bool visible = Variant::visible(p, ScoreAt{batch, head, row, key});
            any |= visible;
            hidden |= !visible;
          }
        }
      }
    }
    const bool tile_any = __syncthreads_or(any);
    const bool tile_full = !__syncthreads_or(hidden);
    if (threadIdx.x == 0) *user_block_tile(c, group, m, n) = tile_full ? 2 : tile_any ? 1 : 0;
  }
};

// The walks, one query or key block at a time (the kernels below run them; host code may too).
// Query block m's row of classes: the key blocks [first, end) that hold a visible key (0, 0 for none) and the longest
// run of full ones.
__host__ __device__ inline void user_query_block_walk(const UserBlockClasses& c, long long group, int m) {
  const unsigned char* tiles = user_block_tile(c, group, m, 0);
  int first = -1, last = -1, run_begin = 0, best_begin = 0, best_end = 0;
  for (int n = 0; n < c.col_blocks; ++n) {
    const int tile = tiles[n];
    if (tile != 0) {
      if (first < 0) first = n;
      last = n;
    }
    if (tile != 2) {
      run_begin = n + 1;
    } else if (n + 1 - run_begin > best_end - best_begin) {
      best_begin = run_begin, best_end = n + 1;
    }
  }
  int* out = c.rows + (group * c.row_blocks + m) * 4;
  out[0] = first < 0 ? 0 : first;
  out[1] = first < 0 ? 0 : last + 1;
  out[2] = best_begin;
  out[3] = best_end;
}

// Key block n's query blocks (the backward's), from the query blocks' walks: n lies in the band of the query blocks
// from the first that visits a later key block (its end passes n) to the last that visits an earlier or equal one
// (its first reaches n), counting only blocks that visit any (first < end); and its longest run of full tiles. Both
// ends ascend with n.
__host__ __device__ inline void user_key_block_walk(const UserBlockClasses& c, long long group, int n) {
  const int* rows = c.rows + group * c.row_blocks * 4;
  int begin = c.row_blocks, last = -1;
  int run_begin = 0, best_begin = 0, best_end = 0;
  for (int m = 0; m < c.row_blocks; ++m) {
    const int first = rows[4 * m], end = rows[4 * m + 1];
    if (first < end) {
      if (end > n) begin = begin < m ? begin : m;
      if (first <= n) last = m;
    }
    if (*user_block_tile(c, group, m, n) != 2) {
      run_begin = m + 1;
    } else if (m + 1 - run_begin > best_end - best_begin) {
      best_begin = run_begin, best_end = m + 1;
    }
  }
  int* out = c.cols + (group * c.col_blocks + n) * 4;
  out[0] = begin;
  out[1] = last + 1 > begin ? last + 1 : begin;
  out[2] = best_begin;
  out[3] = best_end;
}

// The first of count ascending values values[4 * i] greater than bound (count if none).
__host__ __device__ inline int user_first_above(const int* values, int count, int bound) {
  int low = 0, high = count;
  while (low < high) {
    const int mid = (low + high) / 2;
    if (values[4 * mid] > bound) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return low;
}

// Query block m's band (the backward's), read back from every key block's query blocks: the key blocks whose query
// blocks end past m and begin at or before it, so that m visits n exactly when n's query blocks hold m.
__host__ __device__ inline void user_query_block_band(const UserBlockClasses& c, long long group, int m) {
  const int* cols = c.cols + group * c.col_blocks * 4;
  int* row = c.rows + (group * c.row_blocks + m) * 4;
  row[0] = user_first_above(cols + 1, c.col_blocks, m);
  row[1] = user_first_above(cols, c.col_blocks, m);
}

struct UserBlockRanges {
  // Grid (query blocks, heads, batch), one warp: lane 0 walks the row of classes.
  template <class Params>
  static __device__ void run(const Params& p) {
    if (threadIdx.x != 0) return;
    user_query_block_walk(p.user_classes, static_cast<long long>(blockIdx.z) * p.user_classes.heads + blockIdx.y,
                          blockIdx.x);
  }
};

struct UserBlockBands {
  // Grid (heads, batch), kUserBlockThreads threads; after UserBlockRanges. The band of query block m runs from the
  // least first of m and the later blocks that visit any key block to the greatest end of m and the earlier ones.
  static __device__ void run(const AttnBwdParams& p) {
    const UserBlockClasses& c = p.user_classes;
    const long long group = static_cast<long long>(blockIdx.y) * c.heads + blockIdx.x;
    for (int n = threadIdx.x; n < c.col_blocks; n += kUserBlockThreads) user_key_block_walk(c, group, n);
    __syncthreads();  // every key block's query blocks written (and the rows read) before the rows change
    for (int m = threadIdx.x; m < c.row_blocks; m += kUserBlockThreads) user_query_block_band(c, group, m);
  }
};

}  // namespace flashgen
