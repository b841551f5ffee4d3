// The Hopper forward's producer (fwd_sm90.cuh): one thread of warpgroup 0 per group issues the TMA loads
// of each tile, its Q once and K and V of every visible key block through the kStages-deep rings, each
// copy completing on its slot's full mbarrier once the consumers have freed the slot.
#pragma once

#include "attn_params.cuh"
#include "fwd_sm90_layout.cuh"
#include "fwd_sm90_scheduler.cuh"
#include "sm90_primitives.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90Producer : FwdSm90Layout<Cfg> {
  using L = FwdSm90Layout<Cfg>;
  using Scheduler = FwdSm90Scheduler<Cfg>;
  using Tile = typename Scheduler::Tile;
  using typename L::Barriers;
  using typename L::u32;
  using L::kBlockM;
  using L::kBlockN;
  using L::kChunks;
  using L::kCluster;
  using L::kKOffset;
  using L::kQBytes;
  using L::kRowBytes;
  using L::kTileBytes;
  using L::kVOffset;
  using L::ring_phase;
  using L::ring_slot;
  static constexpr bool kDynamic = Scheduler::kDynamic;

  // Copies the K or V tile of keys key0.. into dst, chunk by chunk; in a cluster, into both blocks.
  static __device__ void load_tile(u32 dst, const void* map, u32 full_barrier, int key0, const Tile& tile) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const u32 chunk = dst + c * kBlockN * kRowBytes;
      if constexpr (kCluster > 1) {
        sm90::tma_load_4d_multicast(chunk, map, full_barrier, c * 64, tile.k_row + key0, tile.kv_head,
                                    tile.tma_batch, static_cast<sm90::u16>((1u << kCluster) - 1));
      } else {
        sm90::tma_load_4d(chunk, map, full_barrier, c * 64, tile.k_row + key0, tile.kv_head, tile.tma_batch);
      }
    }
  }

  // One thread: the tile's Q, and K and V of every visible key block, last block first (the masked ones).
  // Q goes after the first K/V pair: a persistent block waits for the consumers to be done with the Q rows
  // (q_empty), and the first key block loads meanwhile. In a cluster of two, each block's empty barriers
  // count both blocks' consumers and each block expects every tile on its own full barriers; rank 0
  // copies K tiles and rank 1 V tiles into both.
  static __device__ void produce(const AttnFwdSm90Params& params, const Tile& tile, int k, int first_block, u32 smem,
                                 const Barriers& bars) {
    auto load_q = [&] {
      if (k > 0) sm90::mbarrier_wait(bars.q_empty(), (k - 1) & 1);
      if constexpr (kDynamic) sm90::st_shared_u32(bars.tile_slot(k & 1), static_cast<u32>(tile.index));
      sm90::mbarrier_arrive_expect_tx(bars.q_full(), kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        sm90::tma_load_4d(smem + c * kBlockM * kRowBytes, &params.q_map, bars.q_full(), c * 64, tile.q_row,
                          tile.head, tile.tma_batch);
      }
    };
    if (tile.n_blocks == 0) load_q();  // a tile that sees no key still takes its turn at the Q rows
    const u32 rank = kCluster > 1 ? sm90::cluster_rank() : 0;
    for (int it = 0; it < tile.n_blocks; ++it) {
      const int key0 = (tile.n_begin + tile.n_blocks - 1 - it) * kBlockN;
      const int s = ring_slot(first_block + it);
      const u32 phase = ring_phase(first_block + it);
      const u32 sk = smem + kKOffset + s * kTileBytes;
      const u32 sv = smem + kVOffset + s * kTileBytes;
      sm90::mbarrier_wait(bars.k_empty(s), phase ^ 1);
      sm90::mbarrier_arrive_expect_tx(bars.k_full(s), kTileBytes);
      if (kCluster == 1 || rank == 0) load_tile(sk, &params.k_map, bars.k_full(s), key0, tile);
      sm90::mbarrier_wait(bars.v_empty(s), phase ^ 1);
      sm90::mbarrier_arrive_expect_tx(bars.v_full(s), kTileBytes);
      if (kCluster == 1 || rank == 1) load_tile(sv, &params.v_map, bars.v_full(s), key0, tile);
      if (it == 0) load_q();
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::FwdSm90Producer<FlashgenDefaultFwdSm90Config>;
#endif
