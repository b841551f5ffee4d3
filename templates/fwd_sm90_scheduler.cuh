// The Hopper forward's tile scheduler (fwd_sm90.cuh): which query tile, of which head, each block (or
// each group of consumers) computes next, how many key blocks of it are visible and which need a mask
// (block_range.cuh), and the two walks over a block's tiles, the producer's and the consumers'.
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "sequence.cuh"
#include "fwd_sm90_layout.cuh"
#include "sm90_primitives.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90Scheduler : FwdSm90Layout<Cfg> {
  using L = FwdSm90Layout<Cfg>;
  using typename L::Barriers;
  using typename L::Variant;
  using L::kBlockM;
  using L::kBlockN;
  using L::kCluster;
  using L::kGroups;
  using L::kPersistent;

  // One tile: which query rows, which head, and the key blocks any of its rows sees: n_blocks of them from
  // block n_begin, walked last first, the first n_masked of that walk and the n_interior after them
  // needing no mask (block_range.cuh; blocks after those are masked again where the variant hides early
  // keys); index is its place in the tile list. q_row, k_row and tma_batch place it in the TMA maps: its first query row and its
  // sequence's first key row, and the batch coordinate (a packed sequence's rows lie in batch entry 0 from
  // its offsets on).
  struct Tile {
    int index, m_start, head, batch, kv_head, n_begin, n_blocks, n_masked, n_interior;
    int q_row, k_row, tma_batch;
  };

  static __device__ Tile tile_of(const AttnFwdParams& p, int m_block, int head, int batch) {
    Tile tile;
    tile.index = 0;
    tile.m_start = m_block * kBlockM;
    tile.head = head;
    tile.batch = batch;
    tile.kv_head = tile.head / p.group_size;
    const int rows_q = min(kBlockM, p.seqlen_q - tile.m_start);
    const KeyBlocks<Variant, kBlockN> blocks(p, batch, tile.m_start, rows_q, head);  // block_range.cuh
    tile.n_begin = blocks.begin;
    tile.n_blocks = blocks.count();
    const int full_end = blocks.full_end(p, batch, tile.m_start);
    tile.n_masked = blocks.end - full_end;
    tile.n_interior = full_end - blocks.full_begin(p, batch, tile.m_start + rows_q - 1, full_end);
    tile.q_row = tile.m_start;
    tile.k_row = 0;
    tile.tma_batch = batch;
    return tile;
  }

  // The tile of a block that is not persistent: query block gridDim.x - 1 - blockIdx.x (the highest first) of
  // head blockIdx.y of batch entry (or packed sequence, whose rows start at rows) blockIdx.z. p is the
  // sequence's own params with a packed batch (sequence.cuh's bind_sequence).
  static __device__ Tile block_tile(const AttnFwdParams& p, const SequenceRows& rows) {
    Tile tile = tile_of(p, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z);
    if constexpr (L::kVarlen) {
      tile.q_row += rows.q_begin;
      tile.k_row = rows.k_begin;
      tile.tma_batch = 0;
    }
    return tile;
  }

  // The tile schedule. Without kPersistent the grid is (m-blocks, heads, batch) and each block has one
  // tile, highest query block first (under a causal mask it sees the most keys). With it, gridDim.x
  // blocks (one per SM) walk a list of tiles. Where every row sees every key (the variant hides none) the
  // list runs by (batch, head), then query block: the blocks running at once share a head's K and V in
  // L2. Where the variant hides keys (tiles of unequal length: a causal mask) it runs in sections of
  // params.l2_section (batch, head) pairs, whose K and V stay in L2 while the section runs, each section
  // by query block from the highest, then (batch, head): longest tiles first.
  // Then block b takes tile b first, then whichever tile is next in the list when its producer starts
  // issuing the loads of its current one (params.tile_counter counts the claims): a dynamic longest-first
  // schedule, which evens out the blocks' shares of tiles of unequal length where a fixed round-robin
  // would not. The producer passes each tile's index to the consumers in tile slot k % 2, written before
  // it arms the tile's Q load on q_full; -1 ends the walk. Otherwise, tiles being of one length, block b
  // takes tiles b, b + gridDim.x, ...
  // With kGroups == 2 each group walks the list as a block of its own: group g of block b is walker
  // g * gridDim.x + b of kGroups * gridDim.x, so that with fewer tiles than walkers each SM gets one
  // before any gets two.
  // With kCluster == 2 (variants that hide no key) the list holds pairs of adjacent query blocks,
  // cluster c takes pairs c, c + gridDim.x / 2, ... and its block of rank r the pair's r-th block; the
  // grid's x is even, and where the query blocks are odd in number the last pair's second block lies past
  // the end (zero-filled loads, no store).
  static constexpr bool kDynamic = kPersistent && Variant::kHidesKeys;

  static __device__ int tile_count(const AttnFwdParams& p) {
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    return (kCluster == 2 ? (m_blocks + 1) / 2 : m_blocks) * p.heads_q * p.batch;
  }

  // Tile i of the persistent list (pair i with kCluster == 2, this block's half of it).
  static __device__ Tile tile_at(const AttnFwdSm90Params& params, int i) {
    const AttnFwdParams& p = params.base;
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    Tile tile;
    if constexpr (kCluster == 2) {
      const int m_pairs = (m_blocks + 1) / 2;
      const int head_batch = i / m_pairs;
      const int m_block = m_blocks - 1 - (2 * (i % m_pairs) + static_cast<int>(sm90::cluster_rank()));
      tile = tile_of(p, m_block < 0 ? m_blocks : m_block, head_batch % p.heads_q, head_batch / p.heads_q);
    } else if constexpr (Variant::kHidesKeys) {
      const int first = i / (params.l2_section * m_blocks) * params.l2_section;  // the section's first pair
      const int width = min(params.l2_section, p.heads_q * p.batch - first);   // the last may be narrower
      const int j = i - first * m_blocks;                                        // i's place in its section
      const int head_batch = first + j % width;
      tile = tile_of(p, m_blocks - 1 - j / width, head_batch % p.heads_q, head_batch / p.heads_q);
    } else {
      const int head_batch = i / m_blocks;
      tile = tile_of(p, m_blocks - 1 - i % m_blocks, head_batch % p.heads_q, head_batch / p.heads_q);
    }
    tile.index = i;
    return tile;
  }

  // This group's place among the walkers of the persistent tile list, and how many there are.
  static_assert(kCluster == 1 || kGroups == 1, "walker() numbers the walkers of clusters or of groups, not both");
  static __device__ int walker(int group) { return group * gridDim.x + blockIdx.x / kCluster; }
  static __device__ int walkers() { return gridDim.x / kCluster * kGroups; }

  // The producer's walk: calls fn(tile, k, first_block) for each tile of this group in order, k counting
  // the group's tiles and first_block its key blocks before this tile (the K/V rings run on across tiles).
  // Without kPersistent p and rows are block_tile's.
  template <class Fn>
  static __device__ void produce_tiles(const AttnFwdSm90Params& params, const AttnFwdParams& p,
                                       const SequenceRows& rows, int group, const Barriers& bars, Fn&& fn) {
    if constexpr (!kPersistent) {
      fn(block_tile(p, rows), 0, 0);
      return;
    }
    const int tiles = tile_count(p);
    const int stride = walkers();
    int first_block = 0;
    int k = 0;
    int i = walker(group);
    for (; i < tiles; ++k) {
      // Claimed before this tile's loads are issued, so the atomic's latency hides behind them. Every
      // block claims until it draws past the end, tiles claims in all: the one that draws tiles - 1 is
      // the last and leaves the counter at 0 for the next launch.
      const int claim = kDynamic ? atomicAdd(params.tile_counter, 1) : 0;
      const Tile tile = tile_at(params, i);
      fn(tile, k, first_block);
      first_block += tile.n_blocks;
      if constexpr (kDynamic) {
        if (claim == tiles - 1) atomicExch(params.tile_counter, 0);
        i = stride + claim;
      } else {
        i += stride;
      }
    }
    if constexpr (kDynamic) {
      // The end mark takes the Q rows' turn like a tile: the consumers are done waiting for tile k - 1's
      // Q before q_full moves on (its parity could not tell phase k + 1 from k - 1).
      if (k > 0) sm90::mbarrier_wait(bars.q_empty(), (k - 1) & 1);
      sm90::st_shared_u32(bars.tile_slot(k & 1), ~0u);
      sm90::mbarrier_arrive(bars.q_full());
    }
  }

  // The consumers' walk: like produce_tiles, but each tile's Q rows have arrived (q_full) when fn runs.
  template <class Fn>
  static __device__ void consume_tiles(const AttnFwdSm90Params& params, const AttnFwdParams& p,
                                       const SequenceRows& rows, int group, const Barriers& bars, Fn&& fn) {
    if constexpr (!kPersistent) {
      sm90::mbarrier_wait(bars.q_full(), 0);
      fn(block_tile(p, rows), 0, 0);
      return;
    }
    const int tiles = tile_count(p);
    int first_block = 0;
    for (int k = 0, i = walker(group);; ++k) {
      if constexpr (kDynamic) {
        sm90::mbarrier_wait(bars.q_full(), k & 1);
        i = static_cast<int>(sm90::ld_shared_u32(bars.tile_slot(k & 1)));
        if (i < 0) break;
      } else {
        if (k > 0) i += walkers();
        if (i >= tiles) break;
      }
      const Tile tile = tile_at(params, i);
      if constexpr (!kDynamic) sm90::mbarrier_wait(bars.q_full(), k & 1);
      fn(tile, k, first_block);
      first_block += tile.n_blocks;
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::FwdSm90Scheduler<FlashgenDefaultFwdSm90Config>;
#endif
