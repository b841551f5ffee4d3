// The Hopper forward's producer (fwd_sm90.cuh): one thread of warpgroup 0 per group issues the TMA loads
// of each tile, its Q once and K and V of every visible key block through the kStages-deep rings, each
// copy completing on its slot's full mbarrier once the consumers have freed the slot.
#pragma once

#include "attn_params.cuh"
#include "fwd_sm90_layout.cuh"
#include "fwd_sm90_scheduler.cuh"
#include "sm80_primitives.cuh"
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
  using L::kChunksV;
  using L::kCluster;
  using L::kKOffset;
  using L::kQBytes;
  using L::kRowBytes;
  using L::kTileBytes;
  using L::kTileBytesV;
  using L::kVOffset;
  using L::ring_phase;
  using L::ring_slot;
  static constexpr bool kDynamic = Scheduler::kDynamic;

  // Copies the K or V tile of keys key0.. (kTileChunks column chunks) into dst, chunk by chunk; in a cluster, into
  // both blocks. kValuesT: FP8's Vᵀ tile, chunks of 128 keys whose rows are the values' head dim, from the
  // sequence's origin values_t0 (fwd_sm90_values.cuh).
  template <int kTileChunks, bool kValuesT = false>
  static __device__ void load_tile(u32 dst, const void* map, u32 full_barrier, int key0, const Tile& tile,
                                   int values_t0 = 0) {
#pragma unroll
    for (int c = 0; c < kTileChunks; ++c) {
      const u32 chunk = dst + c * (kValuesT ? L::kTileDimV : kBlockN) * kRowBytes;
      const int x = kValuesT ? values_t0 + key0 + c * 128 : c * L::kChunkCols;
      const int y = kValuesT ? 0 : tile.k_row + key0;
      if constexpr (kCluster > 1) {
        sm90::tma_load_4d_multicast(chunk, map, full_barrier, x, y, tile.kv_head, tile.tma_batch,
                                    static_cast<sm90::u16>((1u << kCluster) - 1));
      } else {
        sm90::tma_load_4d(chunk, map, full_barrier, x, y, tile.kv_head, tile.tma_batch);
      }
    }
  }

  // kPaged: sequence b's key j lies in row j % page_size of page block_table[b, j / page_size] (attn_params.cuh).
  // Each copy takes box = paged_box_rows(page_size, kBlockN) rows, which lie in one page, and one 64-column chunk:
  // a tile is (kBlockN / box) · kChunks copies (a V tile's chunks: kChunksV). The producer warpgroup's four warps
  // share them, since a warp issues its lanes' copies one after another: thread t issues copy paged_copy() = 4 · lane
  // + warp (box paged_copy() / kPageChunks, chunk paged_copy() % kPageChunks; a chunk past the tile's is no copy), so
  // its box is the same in K and V. Each thread holds its box's page and row in it (PageBox), looked up a key block
  // ahead, so that the table's read runs while the warps wait for the ring's slots.
  struct PageBox {
    int page, row;  // a page past the cache for a box past the sequence's last key: TMA fills it with zeros
  };

  static __device__ int paged_copy() { return static_cast<int>(threadIdx.x % 32 * 4 + threadIdx.x / 32 % 4); }

  // A sequence's pages: its row of the block table and its key count. The rest (page size and count, V's
  // strides) the producer reads from the kernel's params, which hold no registers.
  struct Pages {
    const int* table;
    int keys;
  };

  // Where tile row `row` of the tile of keys key0.. lies (the row of a box's first key: the whole box).
  static __device__ PageBox page_of(const AttnFwdParams& base, const Pages& pages, int key0, int row) {
    const int key = key0 + row;
    if (key >= pages.keys || row >= kBlockN) return {base.num_pages, 0};
    return {min(max(pages.table[key / base.page_size], 0), base.num_pages - 1), key % base.page_size};
  }

  static constexpr int kPageChunks = kChunks > kChunksV ? kChunks : kChunksV;

  static __device__ PageBox page_box(const AttnFwdParams& base, const Pages& pages, int key0) {
    return page_of(base, pages, key0, paged_copy() / kPageChunks * paged_box_rows(base.page_size, kBlockN));
  }

  // One K or V tile of keys key0.. from the boxes of `at`. Rows past the last key in the box that holds it are
  // read from its page: K's are masked by the consumers, but V's must be zero, since a hidden key's P of 0 times
  // a NaN left in a page is NaN. So with zero_past_end warp 0 copies that box instead, in 16-row boxes of the fine
  // map, and its lanes the 16-row group holding the last key, by cp.async, rows past the end as zeros. Thread 0
  // raises the bytes the full barrier awaits first and arrives last, after warp 0's copies; the other warps'
  // copies may land before or after.
  // kTileChunks, kBytes, kDim: the tile's column chunks and bytes and its tensor's head dim (K's or V's).
  template <int kTileChunks, u32 kBytes, int kDim>
  static __device__ void load_paged_tile(u32 dst, const void* map, const void* fine_map, u32 full_barrier, int key0,
                                         const Tile& tile, const AttnFwdParams& base, const Pages& pages,
                                         const PageBox& at, bool zero_past_end) {
    const int box = paged_box_rows(base.page_size, kBlockN);
    const int end = pages.keys - key0;  // rows of the tile inside the sequence (at least 1)
    const int split = zero_past_end && end < kBlockN && end % box != 0 ? end / box : -1;
    const int by_hand = split >= 0 && end % 16 != 0 ? end / 16 : -1;  // the 16-row group warp 0 copies by hand
    const bool warp0 = threadIdx.x < 32;
    if (threadIdx.x == 0) {
      sm90::mbarrier_expect_tx(full_barrier, kBytes - (by_hand >= 0 ? kTileChunks * 16 * kRowBytes : 0));
    }
    const int copy = paged_copy(), b = copy / kPageChunks, c = copy % kPageChunks;
    if (b < kBlockN / box && b != split && c < kTileChunks) {
      sm90::tma_load_4d(dst + c * kBlockN * kRowBytes + b * box * kRowBytes, map, full_barrier, c * L::kChunkCols,
                        at.row, tile.kv_head, at.page);
    }
    if (split >= 0 && warp0) {
      const int lane = static_cast<int>(threadIdx.x), group = split * box / 16 + lane;
      const PageBox head = page_of(base, pages, key0, split * box);  // the split box's page, its groups' too
      if (lane < box / 16 && group != by_hand) {
        const bool inside = group * 16 < end;
#pragma unroll
        for (int chunk = 0; chunk < kTileChunks; ++chunk) {
          sm90::tma_load_4d(dst + chunk * kBlockN * kRowBytes + group * 16 * kRowBytes, fine_map, full_barrier,
                            chunk * 64, inside ? head.row + lane * 16 : 0, tile.kv_head,
                            inside ? head.page : base.num_pages);
        }
      }
      if (by_hand >= 0) {
        const auto* v = static_cast<const unsigned short*>(base.v) + head.page * base.v_page_stride +
                        (head.row + by_hand * 16 - split * box) * base.v_row_stride + tile.kv_head * base.v_head_stride;
        // 16-byte unit u of row r of chunk c, swizzled in 8-row atoms as TMA writes it (fwd_sm90_layout.cuh), by
        // cp.async (zeros past the end or past head_dim): one round trip for all of them, and no registers held.
#pragma unroll 1
        for (int i = lane; i < kTileChunks * 16 * 8; i += 32) {
          const int u = i % 8, r = i / 8 % 16, chunk = i / 128;
          const int row = by_hand * 16 + r, col = chunk * 64 + u * 8;
          sm80::cp_async_16(dst + chunk * kBlockN * kRowBytes + row * kRowBytes + ((u ^ (row % 8)) * 16),
                            v + r * base.v_row_stride + col, row < end && col < kDim);
        }
        sm80::cp_async_commit();
        sm80::cp_async_wait<0>();
        sm90::fence_proxy_async_smem();  // the copies, made by the generic proxy, are read by wgmma
      }
    }
    if (warp0) __syncwarp();
    if (threadIdx.x == 0) sm90::mbarrier_arrive(full_barrier);
  }

  // One thread (with kPaged, the warpgroup): the tile's Q, and K and V of every visible key block, last block
  // first (the masked ones). Q goes after the first K/V pair: a persistent block waits for the consumers to be
  // done with the Q rows (q_empty), and the first key block loads meanwhile. In a cluster of two, each block's
  // empty barriers count both blocks' consumers and each block expects every tile on its own full barriers;
  // rank 0 copies K tiles and rank 1 V tiles into both.
  // With kPaged the producer warpgroup's 128 threads run the walk, thread 0 alone loading Q.
  static __device__ void produce(const AttnFwdSm90Params& params, const AttnFwdParams& p, const Tile& tile, int k,
                                 int first_block, u32 smem, const Barriers& bars) {
    const bool leader = !L::kPaged || threadIdx.x == 0;
    auto load_q = [&] {
      if (k > 0) sm90::mbarrier_wait(bars.q_empty(), (k - 1) & 1);
      if constexpr (kDynamic) sm90::st_shared_u32(bars.tile_slot(k & 1), static_cast<u32>(tile.index));
      sm90::mbarrier_arrive_expect_tx(bars.q_full(), kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        sm90::tma_load_4d(smem + c * kBlockM * kRowBytes, &params.q_map, bars.q_full(), c * L::kChunkCols,
                          tile.q_row, tile.head, tile.tma_batch);
      }
    };
    if (tile.n_blocks == 0 && leader) load_q();  // a tile that sees no key still takes its turn at the Q rows
    const u32 rank = kCluster > 1 ? sm90::cluster_rank() : 0;
    auto key0_of = [&](int it) { return (tile.n_begin + tile.n_blocks - 1 - it) * kBlockN; };
    // Paged: base.v is the cache's first page (a sequence's keys start at its key 0), p.block_table its row.
    const AttnFwdParams& base = params.base;
    const Pages pages{p.block_table, p.seqlen_k};
    // FP8: the sequence's first key in Vᵀ (a dense batch's entries are the map's own).
    const int values_t0 =
        L::kFp8 && L::kVarlen
            ? static_cast<int>(fp8_values_t_origin(L::kPaged, tile.k_row, tile.batch, base.seqlen_k, kFp8BlockN))
            : 0;
    PageBox next{};
    if constexpr (L::kPaged) {
      if (tile.n_blocks > 0) next = page_box(base, pages, key0_of(0));
    }
    for (int it = 0; it < tile.n_blocks; ++it) {
      const int key0 = key0_of(it);
      const int s = ring_slot(first_block + it);
      const u32 phase = ring_phase(first_block + it);
      const u32 sk = smem + kKOffset + s * kTileBytes;
      const u32 sv = smem + kVOffset + s * kTileBytesV;
      if constexpr (L::kPaged) {
        const PageBox at = next;
        if (it + 1 < tile.n_blocks) next = page_box(base, pages, key0_of(it + 1));  // read while slots are awaited
        sm90::mbarrier_wait(bars.k_empty(s), phase ^ 1);
        load_paged_tile<kChunks, kTileBytes, L::kHeadDim>(sk, &params.k_map, nullptr, bars.k_full(s), key0, tile,
                                                           base, pages, at, false);
        sm90::mbarrier_wait(bars.v_empty(s), phase ^ 1);
        if constexpr (L::kFp8) {  // Vᵀ, gathered from the pages by the module's first kernel
          if (threadIdx.x == 0) {
            sm90::mbarrier_arrive_expect_tx(bars.v_full(s), kTileBytesV);
            load_tile<kChunksV, true>(sv, &params.v_map, bars.v_full(s), key0, tile, values_t0);
          }
        } else {
          load_paged_tile<kChunksV, kTileBytesV, L::kHeadDimV>(sv, &params.v_map, &params.v_fine_map,
                                                                bars.v_full(s), key0, tile, base, pages, at, true);
        }
      } else {
        sm90::mbarrier_wait(bars.k_empty(s), phase ^ 1);
        sm90::mbarrier_arrive_expect_tx(bars.k_full(s), kTileBytes);
        if (kCluster == 1 || rank == 0) load_tile<kChunks>(sk, &params.k_map, bars.k_full(s), key0, tile);
        sm90::mbarrier_wait(bars.v_empty(s), phase ^ 1);
        sm90::mbarrier_arrive_expect_tx(bars.v_full(s), kTileBytesV);
        if (kCluster == 1 || rank == 1) {
          load_tile<kChunksV, L::kFp8>(sv, &params.v_map, bars.v_full(s), key0, tile, values_t0);
        }
      }
      if (it == 0 && leader) load_q();
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::FwdSm90Producer<FlashgenDefaultFwdSm90Config>;
#endif
