// The block classes of a user's mask for a dense forward call (variant.cuh's UserVariant; the generator adds these
// two kernels to a forward module whose config has a user mask), launched before the attention kernel:
//   UserBlockTiles   one block per (key block, query block, head or batch entry) tile of the config's kBlockM rows
//                    and kBlockN keys inside the base mask's walk: asks the whole variant about every (row, key) and
//                    writes the tile's class (0 no visible key, 1 partial, 2 full: every key inside seqlen_k and
//                    visible to every row) to p.user_block_tiles.
//   UserBlockRanges  one warp per query block: from its row of classes, the blocks [first, end) that hold a visible
//                    key and the longest run of full blocks, into p.user_blocks, which block_range.cuh's KeyBlocks
//                    reads in the attention kernel: blocks outside [first, end) are skipped, those in the run need no
//                    per-element mask.
// Classes are per query head, or once per batch entry (head 0) when every head shares the mask
// (p.user_block_heads 1).
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "variant.cuh"

namespace flashgen {

// Tile (m, n) of classes group g (batch * user_block_heads + head): its class's byte.
__device__ __forceinline__ unsigned char* user_block_tile(const AttnFwdParams& p, int group, int m, int n) {
  return p.user_block_tiles + (static_cast<long long>(group) * p.user_block_rows + m) * p.user_block_cols + n;
}

template <class Cfg>
struct UserBlockTiles {
  using Variant = typename Cfg::Variant;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;

  // Grid (key blocks, query blocks, user_block_heads * batch), kUserBlockThreads threads.
  static __device__ void run(const AttnFwdParams& p) {
    const int n = blockIdx.x, m = blockIdx.y, group = blockIdx.z;
    const int batch = group / p.user_block_heads, head = group % p.user_block_heads;
    const int m_start = m * kBlockM;
    const int rows = min(kBlockM, p.seqlen_q - m_start);
    const KeyBlocks<typename Variant::BaseVariant, kBlockN> walk(p, batch, m_start, rows);  // the base mask's blocks
    if (n < walk.begin || n >= walk.end) {  // outside the base walk: never visited
      if (threadIdx.x == 0) *user_block_tile(p, group, m, n) = 0;
      return;
    }
    bool any = false, hidden = false;
    for (int i = threadIdx.x; i < rows * kBlockN; i += kUserBlockThreads) {
      const int key = n * kBlockN + i % kBlockN;
      const bool visible = key < p.seqlen_k && Variant::visible(p, ScoreAt{batch, head, m_start + i / kBlockN, key});
      any |= visible;
      hidden |= !visible;
    }
    const bool tile_any = __syncthreads_or(any);
    const bool tile_full = !__syncthreads_or(hidden);
    if (threadIdx.x == 0) *user_block_tile(p, group, m, n) = tile_full ? 2 : tile_any ? 1 : 0;
  }
};

struct UserBlockRanges {
  // Grid (query blocks, user_block_heads, batch), one warp: lane 0 walks the row of classes.
  static __device__ void run(const AttnFwdParams& p) {
    if (threadIdx.x != 0) return;
    const int m = blockIdx.x, group = blockIdx.z * p.user_block_heads + blockIdx.y;
    const unsigned char* tiles = user_block_tile(p, group, m, 0);
    int first = -1, last = -1, run_begin = 0, best_begin = 0, best_end = 0;
    for (int n = 0; n < p.user_block_cols; ++n) {
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
    int* out = p.user_blocks + (static_cast<long long>(group) * p.user_block_rows + m) * 4;
    out[0] = first < 0 ? 0 : first;
    out[1] = first < 0 ? 0 : last + 1;
    out[2] = best_begin;
    out[3] = best_end;
  }
};

}  // namespace flashgen
