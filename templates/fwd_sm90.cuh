// Forward attention for Hopper (sm_90a): TMA tile loads completing on mbarriers and wgmma on the tensor
// cores, in a warp-specialized block. Warpgroup 0 is the producer: one thread loads the Q tile once and
// streams K and V tiles through kStages-deep rings (separate full/empty barriers for K and V), keeping
// only a few registers. Warpgroups 1..kConsumers each own 64 query rows: S = Q Kᵀ with both operands in
// shared memory, an online softmax in base 2 on the accumulators, then O += P V with P in registers;
// with kOverlap the softmax of one block runs while the tensor cores compute P V of the previous one,
// and with kPingPong the two consumers take turns at issuing their products. Under a causal mask a
// consumer computes of each key block only what its rows see: all of it, the first half (kHalfN) or
// nothing. With kPersistent one block per SM walks a list of tiles, the next tile's first K/V loads
// overlapping this tile's output store; where shared memory allows, the output has staging rows of its
// own and the next tile's Q loads as soon as this tile's last S is done. Otherwise the output is staged
// in the consumer's Q rows. A TMA store writes it. With kPSmem P V reads P from shared memory (both
// wgmma operands there) instead of registers. With kCluster == 2 two blocks of adjacent query tiles of
// one head form a cluster: one loads each K tile, the other each V tile, and TMA multicast writes it
// into both. With kGroups == 2 (persistent only) the block holds two groups of consumers, each with a Q
// tile, K/V rings, barriers and a producer thread of its own, walking the tile list as two blocks would.
// Generic over a config type like fwd_sm80.cuh; validity rules in fwd_sm90_traits() (fwd_traits.cuh).
#pragma once

#include "attn_params.cuh"
#include "fwd_traits.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "sm90_wgmma.cuh"
#include "tile_copy.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90 {
  using u32 = sm90::u32;
  using u64 = sm90::u64;

  static constexpr FwdSm90Traits kTraits =
      fwd_sm90_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Cfg::kPingPong, Cfg::kPersistent,
                      Cfg::kPSmem, Cfg::kCluster, Cfg::kMask, Cfg::kGroups, Cfg::kTensorSum, Cfg::kElem);
  static_assert(kTraits.error == nullptr, "invalid sm90 forward config: see fwd_sm90_traits() in fwd_traits.cuh");

  static constexpr ElemType kElem = Cfg::kElem;
  static constexpr bool kCausal = Cfg::kMask == MaskKind::kCausal;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  static constexpr bool kPersistent = Cfg::kPersistent;
  static constexpr bool kPSmem = Cfg::kPSmem;
  static constexpr int kCluster = Cfg::kCluster;
  static constexpr int kGroups = Cfg::kGroups;
  static constexpr bool kTensorSum = Cfg::kTensorSum;
  static constexpr int kConsumers = kTraits.consumers;  // per group
  static constexpr int kThreads = kTraits.threads;

  // Every tile is stored as kChunks column chunks of 64 elements (128-byte rows), chunk after chunk,
  // each swizzled in 1024-byte atoms of 8 rows: the layout TMA writes with 128-byte swizzling and the
  // one wgmma descriptors read.
  static constexpr int kChunks = kHeadDim / 64;
  static constexpr u32 kRowBytes = 128;
  static constexpr u32 kQBytes = kBlockM * kHeadDim * 2;     // (kChunks, kBlockM, 64)
  static constexpr u32 kTileBytes = kBlockN * kHeadDim * 2;  // one K or V tile: (kChunks, kBlockN, 64)
  static constexpr u32 kKOffset = kQBytes;
  static constexpr u32 kVOffset = kKOffset + kStages * kTileBytes;
  // kPSmem: consumer c's P, (kPChunks, 64, 64), at kPOffset + c * kPBytes.
  static constexpr int kPChunks = (kBlockN + 63) / 64;
  static constexpr u32 kPBytes = kPChunks * 64 * kRowBytes;
  static constexpr u32 kPOffset = kVOffset + kStages * kTileBytes;
  static constexpr bool kOwnO = kTraits.smem_o_bytes > 0;  // output staging rows apart from Q's
  static constexpr u32 kOOffset = kPOffset + kTraits.smem_p_bytes;  // (kChunks, kBlockM, 64) when kOwnO
  // kTensorSum: 1024 bytes of ones (16-bit), B of the rows' sums P (64, kBlockN) x ones (kBlockN, 8).
  static constexpr u32 kOnesOffset = kOOffset + kTraits.smem_o_bytes;
  static constexpr u32 kBarrierOffset = kOnesOffset + kTraits.smem_ones_bytes;
  static_assert(kTraits.smem_p_bytes == (kPSmem ? kConsumers * kPBytes : 0), "layout and traits disagree");
  static_assert(kBarrierOffset + (3 + 4 * kStages) * 8 == kTraits.smem_group_bytes, "layout and traits disagree");
  // With kGroups == 2 the block holds two such layouts, kGroupStride bytes apart, each with its own barriers.
  static constexpr u32 kGroupStride = kTraits.smem_group_stride;
  static_assert(kGroupStride % 1024 == 0 &&
                    kTraits.smem_bytes == (kGroups - 1) * kGroupStride + kTraits.smem_group_bytes + 1024,
                "layout and traits disagree");

  static constexpr int kSGroups = kBlockN / 8;   // accumulator groups of S: (16 rows, 8 keys) per warp
  static constexpr int kOGroups = kHeadDim / 8;  // accumulator groups of O
  static constexpr int kPSteps = kBlockN / 16;   // k-steps of O += P V
  static constexpr int kQkSteps = kHeadDim / 16; // k-steps of S = Q Kᵀ
  static constexpr float kRescaleSlack = 8.f;    // as in fwd_sm80.cuh: P stays below 2^8
  // Under a causal mask a key block may show one consumer's 64 rows no key from kHalfN on (the upper half
  // of a diagonal block, to the first consumer) or no key at all. That consumer then computes S, softmax
  // and P V of the first kHalfN keys only, or nothing of the block. kHalfN keeps whole 16-key steps of
  // P V; 0 where kBlockN cannot be halved so. Without a mask only a ragged last block could be narrowed,
  // and the kernel keeps a single path.
  static constexpr int kHalfN = kCausal && kBlockN % 32 == 0 ? kBlockN / 2 : 0;

  // Hardware barriers: 0 is __syncthreads, 1 + w consumer warpgroup w's own (P staging, epilogue; w counts
  // the block's consumers), kTurnBarrier + 2 * g + c the ping-pong turn of consumer c of group g.
  static constexpr unsigned kTurnBarrier = 5;
  static_assert(kGroups * kConsumers < kTurnBarrier && kTurnBarrier + 2 * kGroups <= 16, "hardware barrier ids");

  // The ping-pong turn of consumer c of group g: synced by c, arrived at by the other consumer.
  static __device__ unsigned turn_barrier(int group, int consumer) {
    return kTurnBarrier + 2 * static_cast<unsigned>(group) + static_cast<unsigned>(consumer);
  }

  static __device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

  struct Barriers {
    // q_full, q_empty, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages], then two
    // 32-bit tile slots
    u32 base;
    __device__ u32 q_full() const { return base; }
    // The consumers are done with the Q rows: their last S is complete (kOwnO), or their output has left.
    __device__ u32 q_empty() const { return base + 8; }
    __device__ u32 k_full(int s) const { return base + 8 * (2 + s); }
    __device__ u32 v_full(int s) const { return base + 8 * (2 + kStages + s); }
    __device__ u32 k_empty(int s) const { return base + 8 * (2 + 2 * kStages + s); }
    __device__ u32 v_empty(int s) const { return base + 8 * (2 + 3 * kStages + s); }
    __device__ u32 tile_slot(int j) const { return base + 8 * (2 + 4 * kStages) + 4 * j; }
  };

  // One tile: which query rows, which head, and how many key blocks any of its rows sees; index is its
  // place in the tile list.
  struct Tile {
    int index, m_start, head, batch, kv_head, n_blocks, n_interior;
  };

  static __device__ Tile tile_of(const AttnFwdParams& p, int m_block, int head, int batch) {
    Tile tile;
    tile.index = 0;
    tile.m_start = m_block * kBlockM;
    tile.head = head;
    tile.batch = batch;
    tile.kv_head = tile.head / p.group_size;
    const int rows_q = min(kBlockM, p.seqlen_q - tile.m_start);
    int n_end = p.seqlen_k;
    if constexpr (kCausal) n_end = min(n_end, tile.m_start + rows_q + p.causal_offset);
    tile.n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;
    // Blocks below n_interior need no mask for any row of the tile.
    int n_interior = p.seqlen_k / kBlockN;
    if constexpr (kCausal) n_interior = min(n_interior, max(0, (tile.m_start + p.causal_offset + 1) / kBlockN));
    tile.n_interior = min(n_interior, tile.n_blocks);
    return tile;
  }

  // The tile schedule. Without kPersistent the grid is (m-blocks, heads, batch) and each block has one
  // tile, highest query block first (under a causal mask it sees the most keys). With it, gridDim.x
  // blocks (one per SM) walk a list of tiles. Without a mask the list runs by (batch, head), then query
  // block: the blocks running at once share a head's K and V in L2. Under a causal mask it runs in
  // sections of params.l2_section (batch, head) pairs, whose K and V stay in L2 while the section runs,
  // each section by query block from the highest, then (batch, head): longest tiles first.
  // Under a causal mask block b takes tile b first, then whichever tile is next in the list when its
  // producer starts issuing the loads of its current one (params.tile_counter counts the claims): a
  // dynamic longest-first schedule, which evens out the blocks' shares of tiles of unequal length where
  // a fixed round-robin would not. The producer passes each tile's index to the consumers in tile slot
  // k % 2, written before it arms the tile's Q load on q_full; -1 ends the walk. Without a mask, tiles
  // being of one length, block b takes tiles b, b + gridDim.x, ...
  // With kGroups == 2 each group walks the list as a block of its own: group g of block b is walker
  // g * gridDim.x + b of kGroups * gridDim.x, so that with fewer tiles than walkers each SM gets one
  // before any gets two.
  // With kCluster == 2 (no mask) the list holds pairs of adjacent query blocks, cluster c takes pairs c,
  // c + gridDim.x / 2, ... and its block of rank r the pair's r-th block; the grid's x is even, and where
  // the query blocks are odd in number the last pair's second block lies past the end (zero-filled
  // loads, no store).
  static constexpr bool kDynamic = kPersistent && kCausal;

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
    } else if constexpr (kCausal) {
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
  template <class Fn>
  static __device__ void produce_tiles(const AttnFwdSm90Params& params, int group, const Barriers& bars, Fn&& fn) {
    const AttnFwdParams& p = params.base;
    if constexpr (!kPersistent) {
      fn(tile_of(p, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z), 0, 0);
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
  static __device__ void consume_tiles(const AttnFwdSm90Params& params, int group, const Barriers& bars, Fn&& fn) {
    const AttnFwdParams& p = params.base;
    if constexpr (!kPersistent) {
      sm90::mbarrier_wait(bars.q_full(), 0);
      fn(tile_of(p, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z), 0, 0);
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

  static __device__ void run(const AttnFwdSm90Params& params) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem_base = (sm90::smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment

    for (int g = 0; g < kGroups && threadIdx.x == 0; ++g) {
      const Barriers bars{smem_base + g * kGroupStride + kBarrierOffset};
      sm90::mbarrier_init(bars.q_full(), 1);
      // One arrival per consumer warp after its last S (kOwnO), else per consumer after its output store.
      sm90::mbarrier_init(bars.q_empty(), kOwnO ? kConsumers * 4 : kConsumers);
      for (int s = 0; s < kStages; ++s) {
        sm90::mbarrier_init(bars.k_full(s), 1);
        sm90::mbarrier_init(bars.v_full(s), 1);
        // One arrival per consumer warp of every block of the cluster: each block's copies fill both.
        sm90::mbarrier_init(bars.k_empty(s), kConsumers * 4 * kCluster);
        sm90::mbarrier_init(bars.v_empty(s), kConsumers * 4 * kCluster);
      }
      sm90::fence_mbarrier_init();
    }
    if constexpr (kTensorSum) {  // each group's ones, written by the generic proxy, read by wgmma
      const u32 one_pair = kElem == ElemType::kFloat16 ? 0x3C003C00u : 0x3F803F80u;
      for (u32 i = threadIdx.x; i < kGroups * kTraits.smem_ones_bytes / 4; i += kThreads) {
        const u32 group = i / (kTraits.smem_ones_bytes / 4);
        sm90::st_shared_u32(smem_base + group * kGroupStride + kOnesOffset + 4 * (i % (kTraits.smem_ones_bytes / 4)),
                            one_pair);
      }
      sm90::fence_proxy_async_smem();
    }
    if constexpr (kCluster > 1) {
      sm90::cluster_sync();  // the peer's barriers are initialised before anything arrives on them
    } else {
      __syncthreads();
    }

    if (threadIdx.x < 128) {
      sm90::setmaxnreg_dec<kTraits.producer_regs>();
      // Lane 0 of warp g produces group g's tiles.
      const int group = kGroups == 1 ? 0 : static_cast<int>(threadIdx.x) / 32;
      if (threadIdx.x % 32 == 0 && (kGroups == 1 ? threadIdx.x == 0 : group < kGroups)) {
        const u32 smem = smem_base + group * kGroupStride;
        const Barriers bars{smem + kBarrierOffset};
        int blocks = 0;
        produce_tiles(params, group, bars, [&](const Tile& tile, int k, int first_block) {
          produce(params, tile, k, first_block, smem, bars);
          blocks = first_block + tile.n_blocks;
        });
        // In a cluster the peer's consumers arrive on this block's barriers: it leaves only once every
        // slot has been released by both blocks (as before filling each slot once more).
        if constexpr (kCluster > 1) {
          for (int b = blocks; b < blocks + kStages; ++b) {
            sm90::mbarrier_wait(bars.k_empty(ring_slot(b)), ring_phase(b) ^ 1);
            sm90::mbarrier_wait(bars.v_empty(ring_slot(b)), ring_phase(b) ^ 1);
          }
        }
      }
    } else {
      sm90::setmaxnreg_inc<kTraits.consumer_regs>();
      const int group = kGroups == 1 ? 0 : (sm90::warpgroup_index() - 1) / kConsumers;
      const u32 smem = smem_base + group * kGroupStride;
      const Barriers bars{smem + kBarrierOffset};
      // Ping-pong turns run on across tiles: consumer 0 takes the first turn of the walk, and its first
      // turn of a tile follows consumer 1's last turn of the tile before, so it issues its next S while
      // consumer 1 still finishes the last block and stores its output.
      const int consumer = (sm90::warpgroup_index() - 1) % kConsumers;  // within its group
      if constexpr (Cfg::kPingPong) {
        if (consumer == 1) sm90::named_barrier_arrive(turn_barrier(group, 0), 256);
      }
      consume_tiles(params, group, bars, [&](const Tile& tile, int k, int first_block) {
        consume(params, tile, k, first_block, smem, bars);
      });
      // Balance the turn barriers: consumer 1's last hand-over (its opening one, when the walk saw no key
      // block) is taken here.
      if constexpr (Cfg::kPingPong) {
        if (consumer == 0) sm90::named_barrier_sync(turn_barrier(group, 0), 256);
      }
      if (threadIdx.x % 128 == 0) sm90::tma_store_wait_all();  // the last output is in global memory
    }
  }

  // Stores one warpgroup's (64, 8 * kColumnGroups) fp32 accumulator as 16-bit pairs into rows laid out
  // like the tiles (64-column chunks chunk_bytes apart, 128-byte rows swizzled in 8-row atoms): column
  // 8i + 2t of row r lies in chunk i / 8, 16-byte unit i % 8 ^ r % 8.
  template <int kColumnGroups>
  static __device__ __forceinline__ void store_swizzled(u32 rows, u32 chunk_bytes,
                                                       const float (&acc)[kColumnGroups][4]) {
    const int warp = (threadIdx.x / 32) % 4;
    const int g = threadIdx.x % 32 / 4;
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < kColumnGroups; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + g + 8 * h;  // within the warpgroup's 64 rows
        const u32 addr = rows + (i / 8) * chunk_bytes + static_cast<u32>(row) * kRowBytes +
                         static_cast<u32>(((i % 8) ^ (row % 8)) * 16) + 4 * t;
        sm90::st_shared_u32(addr, sm80::pack2<kElem>(acc[i][2 * h], acc[i][2 * h + 1]));
      }
  }

  // Key block it of a tile (0 = its last block) is block first_block + it of the block's K/V rings: ring
  // slot (first_block + it) % kStages, filled in phase ((first_block + it) / kStages) & 1.
  static __device__ int ring_slot(int block) { return block % kStages; }
  static __device__ u32 ring_phase(int block) { return static_cast<u32>((block / kStages) & 1); }

  // Copies the K or V tile of keys key0.. into dst, chunk by chunk; in a cluster, into both blocks.
  static __device__ void load_tile(u32 dst, const void* map, u32 full_barrier, int key0, const Tile& tile) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const u32 chunk = dst + c * kBlockN * kRowBytes;
      if constexpr (kCluster > 1) {
        sm90::tma_load_4d_multicast(chunk, map, full_barrier, c * 64, key0, tile.kv_head, tile.batch,
                                    static_cast<sm90::u16>((1u << kCluster) - 1));
      } else {
        sm90::tma_load_4d(chunk, map, full_barrier, c * 64, key0, tile.kv_head, tile.batch);
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
        sm90::tma_load_4d(smem + c * kBlockM * kRowBytes, &params.q_map, bars.q_full(), c * 64, tile.m_start,
                          tile.head, tile.batch);
      }
    };
    if (tile.n_blocks == 0) load_q();  // a tile that sees no key still takes its turn at the Q rows
    const u32 rank = kCluster > 1 ? sm90::cluster_rank() : 0;
    for (int it = 0; it < tile.n_blocks; ++it) {
      const int key0 = (tile.n_blocks - 1 - it) * kBlockN;
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

  static __device__ void consume(const AttnFwdSm90Params& params, const Tile& tile, int k, int first_block, u32 smem,
                                 const Barriers& bars) {
    const AttnFwdParams& p = params.base;
    const int warpgroup = sm90::warpgroup_index() - 1;  // among the block's consumers
    const int consumer = kGroups == 1 ? warpgroup : warpgroup % kConsumers;  // within this group
    const int group = kGroups == 1 ? 0 : warpgroup / kConsumers;
    const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup: rows 16 * warp .. + 15 of its 64
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // accumulator row within an 8-row group
    const int t = lane % 4;  // accumulator column pair
    const u32 sq_rows = smem + consumer * 64 * kRowBytes;  // this consumer's 64 Q rows in chunk 0
    const u64 desc_q0 = sm90::smem_desc_sw128(sq_rows, 16, 1024);
    const int row0 = tile.m_start + consumer * 64 + warp * 16 + g;  // query rows row0 and row0 + 8

    float acc_o[kOGroups][4];  // (64, kHeadDim) fp32 per warpgroup: this thread's (2 rows, 2 cols) groups
    float row_max[2] = {neg_inf(), neg_inf()};  // running max (log2 units) of rows row0, row0 + 8
    float row_sum[2] = {0.f, 0.f};              // running sum of exp2, this thread's columns only
    // kTensorSum: (64, 8) fp32 per warpgroup, P times ones: every column holds its row's running sum.
    float acc_l[1][4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int i = 0; i < kOGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[i][e] = 0.f;

    // One warp's arrival on the Q rows' empty barrier (it counts kConsumers * 4 arrivals, or kConsumers).
    auto release = [&](u32 empty_barrier) {
      if (lane == 0) sm90::mbarrier_arrive(empty_barrier);
    };
    // One warp's arrival on a K or V slot's empty barrier in every block of the cluster.
    auto release_kv = [&](u32 empty_barrier) {
      if constexpr (kCluster > 1) {
        if (lane == 0) {
#pragma unroll
          for (u32 r = 0; r < kCluster; ++r) sm90::mbarrier_arrive_cluster(empty_barrier, r);
        }
      } else {
        release(empty_barrier);
      }
    };
    // With kOwnO the Q rows are free once S of the tile's last block is done: K of block it is released.
    auto release_k = [&](int it) {
      release_kv(bars.k_empty(ring_slot(first_block + it)));
      if constexpr (kOwnO) {
        if (it == tile.n_blocks - 1) release(bars.q_empty());
      }
    };
    if constexpr (kOwnO) {
      if (tile.n_blocks == 0) release(bars.q_empty());
    }

    auto slot = [&](int it) { return ring_slot(first_block + it); };
    auto phase = [&](int it) { return ring_phase(first_block + it); };

    // Key blocks arrive last first: the masked ones (it < n_masked), then the interior ones, whose
    // softmax carries no masking code.
    const int n_masked = tile.n_blocks - tile.n_interior;
    // How much of each key block this consumer computes (causal mask only). Blocks it < first hold only
    // keys past the last one its rows see; it computes nothing of them. Block first may show its rows no
    // key from kHalfN on (half_first); every later block is computed whole. Widths count S groups of 8
    // keys.
    int first = 0;
    bool half_first = false;
    if constexpr (kCausal) {
      const int last_key = min(p.seqlen_k - 1, tile.m_start + consumer * 64 + 63 + p.causal_offset);
      first = last_key < 0 ? tile.n_blocks : max(0, tile.n_blocks - 1 - last_key / kBlockN);
      half_first =
          kHalfN > 0 && first < tile.n_blocks && last_key + 1 - (tile.n_blocks - 1 - first) * kBlockN <= kHalfN;
    }
    using Whole = sm80::IntConstant<kSGroups>;
    using Half = sm80::IntConstant<(kHalfN > 0 ? kHalfN / 8 : kSGroups)>;  // never used when kHalfN == 0

    // Issues S = Q Kᵀ of block it: (64, 8 * width) per warpgroup into the first width groups of acc_s,
    // k-steps of 16 along head_dim.
    auto issue_qk = [&](int it, float (&acc_s)[kSGroups][4], auto width) {
      const u64 desc_k0 = sm90::smem_desc_sw128(smem + kKOffset + slot(it) * kTileBytes, 16, 1024);
      sm90::mbarrier_wait(bars.k_full(slot(it)), phase(it));
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQkSteps; ++kk) {
        const u32 offset = (kk % 4) * 32;  // k-step within its 64-column chunk
        const u64 desc_q = sm90::smem_desc_advance(desc_q0, (kk / 4) * kBlockM * kRowBytes + offset);
        const u64 desc_k = sm90::smem_desc_advance(desc_k0, (kk / 4) * kBlockN * kRowBytes + offset);
        sm90::WgmmaSS<8 * decltype(width)::value>::template run<kElem>(acc_s, desc_q, desc_k, kk > 0 ? 1 : 0);
      }
      sm90::wgmma_commit();
    };

    // Issues O += P V of block it over its first 8 * width keys: keys are the k dimension; V is read
    // MN-major (head_dim contiguous), its 64-column chunks kBlockN rows apart. P comes from p_frag, or
    // with kPSmem from this consumer's P rows, read K-major like Q.
    const u32 sp_rows = smem + kPOffset + consumer * kPBytes;
    const u64 desc_p0 = sm90::smem_desc_sw128(sp_rows, 16, 1024);
    const u64 desc_ones = sm90::smem_desc_plain(smem + kOnesOffset, 128, 256);
    auto issue_pv = [&](int it, const u32 (&p_frag)[kPSteps][4], auto width) {
      constexpr int kSteps = decltype(width)::value / 2;
      const u64 desc_v0 = sm90::smem_desc_sw128(smem + kVOffset + slot(it) * kTileBytes, kBlockN * kRowBytes, 1024);
      sm90::mbarrier_wait(bars.v_full(slot(it)), phase(it));
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        const u64 desc_v = sm90::smem_desc_advance(desc_v0, j * 16 * kRowBytes);
        if constexpr (kPSmem) {
          const u64 desc_p = sm90::smem_desc_advance(desc_p0, (j / 4) * 64 * kRowBytes + (j % 4) * 32);
          sm90::WgmmaSSKMN<kHeadDim>::template run<kElem>(acc_o, desc_p, desc_v, 1);
        } else {
          sm90::WgmmaRS<kHeadDim>::template run<kElem>(acc_o, p_frag[j], desc_v, 1);
        }
      }
      if constexpr (kTensorSum) {
#pragma unroll
        for (int j = 0; j < kSteps; ++j) {
          if constexpr (kPSmem) {
            const u64 desc_p = sm90::smem_desc_advance(desc_p0, (j / 4) * 64 * kRowBytes + (j % 4) * 32);
            sm90::WgmmaSSKMN<8>::template run<kElem>(acc_l, desc_p, desc_ones, 1);
          } else {
            sm90::WgmmaRS<8>::template run<kElem>(acc_l, p_frag[j], desc_ones, 1);
          }
        }
      }
      sm90::wgmma_commit();
    };

    // Masks block it's S (when masked), moves the running max and sums, and turns S into
    // P = exp2(s * scale_log2 - m) in place (fp32), over the first width groups of acc_s. correction[h]
    // is the factor O's rows must be scaled by before P V of this block is added (1 when the max did not
    // move); rescale says whether any row of the warp moved.
    auto softmax = [&](int it, float (&acc_s)[kSGroups][4], float (&correction)[2], bool& rescale, auto masked,
                       auto width) {
      constexpr int kWidth = decltype(width)::value;
      if constexpr (decltype(masked)::value) {
        const int key0 = (tile.n_blocks - 1 - it) * kBlockN;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Last visible key of this row, relative to this thread's first column in the block.
          int last = p.seqlen_k - 1;
          if constexpr (kCausal) last = min(last, row0 + 8 * h + p.causal_offset);
          last -= key0 + 2 * t;
#pragma unroll
          for (int i = 0; i < kWidth; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (i * 8 + e > last) acc_s[i][2 * h + e] = neg_inf();
        }
      }
      // Lazy rescaling as in fwd_sm80.cuh: the max moves only when a block's exceeds it by kRescaleSlack.
      float block_max[2];
      bool moves[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = neg_inf();
#pragma unroll
        for (int i = 0; i < kWidth; ++i) mx = fmaxf(mx, fmaxf(acc_s[i][2 * h], acc_s[i][2 * h + 1]));
        block_max[h] = sm80::quad_max(mx) * p.scale_log2;
        moves[h] = block_max[h] > row_max[h] + kRescaleSlack;
      }
      rescale = __any_sync(0xffffffffu, moves[0] || moves[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        correction[h] = 1.f;
        if (rescale) {
          correction[h] = moves[h] ? sm80::exp2_approx(row_max[h] - block_max[h]) : 1.f;
          row_max[h] = moves[h] ? block_max[h] : row_max[h];
          if constexpr (!kTensorSum) row_sum[h] *= correction[h];
        }
        const float m = row_max[h] == neg_inf() ? 0.f : row_max[h];  // a row that saw no key yet
        [[maybe_unused]] float sum = 0.f;  // with kTensorSum the tensor cores add P up (issue_pv)
#pragma unroll
        for (int i = 0; i < kWidth; ++i)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            acc_s[i][e] = sm80::exp2_approx(acc_s[i][e] * p.scale_log2 - m);
            if constexpr (!kTensorSum) sum += acc_s[i][e];
          }
        if constexpr (!kTensorSum) row_sum[h] += sum;
      }
    };

    auto softmax_of = [&](int it, float (&acc_s)[kSGroups][4], float (&correction)[2], bool& rescale, auto width) {
      constexpr bool kWhole = decltype(width)::value == kSGroups;  // a part block is always masked
      if constexpr (kWhole) {
        if (it >= n_masked) {
          softmax(it, acc_s, correction, rescale, sm80::BoolConstant<false>{}, width);
          return;
        }
      }
      softmax(it, acc_s, correction, rescale, sm80::BoolConstant<true>{}, width);
    };

    // P of block it as 16-bit A fragments: accumulator groups 2j and 2j+1 hold the m16n8k16 A fragment
    // of keys 16j .. 16j + 15 (the block's width only). Written only while no wgmma reads p_frag: ptxas
    // serializes every wgmma of a kernel whose in-flight operand registers may be redefined.
    // With kPSmem P goes to this consumer's P rows instead (store_swizzled, as the output below; the
    // whole block, P V reads the width), once every warp's P V of the previous block is done reading
    // them; the second barrier makes every warp's P visible to the tensor cores.
    auto pack_p = [&](const float (&acc_s)[kSGroups][4], u32 (&p_frag)[kPSteps][4], auto width) {
      if constexpr (kPSmem) {
        sm90::named_barrier_sync(1 + warpgroup, 128);
        store_swizzled(sp_rows, 64 * kRowBytes, acc_s);
        sm90::fence_proxy_async_smem();
        sm90::named_barrier_sync(1 + warpgroup, 128);
      } else {
#pragma unroll
        for (int j = 0; j < decltype(width)::value / 2; ++j) {
          p_frag[j][0] = sm80::pack2<kElem>(acc_s[2 * j][0], acc_s[2 * j][1]);
          p_frag[j][1] = sm80::pack2<kElem>(acc_s[2 * j][2], acc_s[2 * j][3]);
          p_frag[j][2] = sm80::pack2<kElem>(acc_s[2 * j + 1][0], acc_s[2 * j + 1][1]);
          p_frag[j][3] = sm80::pack2<kElem>(acc_s[2 * j + 1][2], acc_s[2 * j + 1][3]);
        }
      }
    };

    auto rescale_o = [&](const float (&correction)[2], bool rescale) {
      if (!rescale) return;
#pragma unroll
      for (int i = 0; i < kOGroups; ++i) {
        acc_o[i][0] *= correction[0], acc_o[i][1] *= correction[0];
        acc_o[i][2] *= correction[1], acc_o[i][3] *= correction[1];
      }
      if constexpr (kTensorSum) {
        acc_l[0][0] *= correction[0], acc_l[0][1] *= correction[0];
        acc_l[0][2] *= correction[1], acc_l[0][3] *= correction[1];
      }
    };

    // Ping-pong (two consumers): each warpgroup issues its products only in its turn and hands the turn
    // over right after, so one warpgroup's softmax runs while the other's products keep the tensor cores
    // busy. Consumer 0 takes the first turn of the walk (run()).
    auto wait_turn = [&] {
      if constexpr (Cfg::kPingPong) sm90::named_barrier_sync(turn_barrier(group, consumer), 256);
    };
    auto pass_turn = [&] {
      if constexpr (Cfg::kPingPong) sm90::named_barrier_arrive(turn_barrier(group, 1 - consumer), 256);
    };

    // A block this consumer computes nothing of: it takes its turn and frees the block's slots, each once
    // its load has landed (an arrival on an empty barrier must not run ahead of the slot's phase).
    auto pass_block = [&](int it) {
      wait_turn();
      pass_turn();
      sm90::mbarrier_wait(bars.k_full(slot(it)), phase(it));
      release_k(it);
      sm90::mbarrier_wait(bars.v_full(slot(it)), phase(it));
      release_kv(bars.v_empty(slot(it)));
    };
    for (int it = 0; it < first; ++it) pass_block(it);

    // The width of a block is a template argument: ptxas serializes every wgmma of the kernel when a
    // wgmma is issued under a branch inside a pipeline stage (from its issue to the wait for it), so
    // each branch on half_first below holds whole stages.
    float acc_s[kSGroups][4];
    u32 p_frag[kPSteps][4];
    float correction[2];
    bool rescale = false;
    // S of block it on its own, then its softmax and P.
    auto s_alone = [&](int it, auto width) {
      wait_turn();
      issue_qk(it, acc_s, width);
      pass_turn();
      sm90::wgmma_wait<0>();
      sm90::pin_registers(acc_s);
      release_k(it);
      softmax_of(it, acc_s, correction, rescale, width);
      pack_p(acc_s, p_frag, width);
    };
    // P V of block it on its own, after O's correction.
    auto pv_alone = [&](int it, auto width) {
      rescale_o(correction, rescale);
      issue_pv(it, p_frag, width);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(acc_o);
      if constexpr (kTensorSum) sm90::pin_registers(acc_l);
      release_kv(bars.v_empty(slot(it)));
    };
    if constexpr (!Cfg::kOverlap) {
      // Each block in turn: S, softmax, P V; the tensor cores idle during the softmax unless the other
      // consumer warpgroup fills them.
      auto step = [&](int it, auto width) {
        s_alone(it, width);
        pv_alone(it, width);
      };
      int it = first;
      if (half_first) step(it++, Half{});
      for (; it < tile.n_blocks; ++it) step(it, Whole{});
    } else if (first < tile.n_blocks) {
      // S of block it and P V of block it - 1 go to the tensor cores back to back; the softmax of block
      // it runs while P V does. Its correction reaches O just before P V of block it is issued, and its
      // P is packed once P V of block it - 1 no longer reads p_frag.
      auto step = [&](int it, auto pv_width) {  // pv_width: block it - 1's
        wait_turn();
        issue_qk(it, acc_s, Whole{});
        rescale_o(correction, rescale);
        issue_pv(it - 1, p_frag, pv_width);
        pass_turn();
        sm90::wgmma_wait<1>();  // groups complete in order: S of block it is done, P V may still run
        sm90::pin_registers(acc_s);
        release_k(it);
        softmax_of(it, acc_s, correction, rescale, Whole{});
        sm90::wgmma_wait<0>();
        sm90::pin_registers(acc_o);
        if constexpr (kTensorSum) sm90::pin_registers(acc_l);
        release_kv(bars.v_empty(slot(it - 1)));
        pack_p(acc_s, p_frag, Whole{});
      };
      if (half_first) {
        s_alone(first, Half{});
      } else {
        s_alone(first, Whole{});
      }
      int it = first + 1;
      if (half_first && it < tile.n_blocks) step(it++, Half{});
      for (; it < tile.n_blocks; ++it) step(it, Whole{});
      if (half_first && first + 1 == tile.n_blocks) {
        pv_alone(tile.n_blocks - 1, Half{});
      } else {
        pv_alone(tile.n_blocks - 1, Whole{});
      }
    }
    // Epilogue: normalise, write LSE, stage O in this consumer's output rows (its Q rows unless kOwnO; same
    // swizzled layout), TMA store.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = kTensorSum ? acc_l[0][2 * h] : sm80::quad_sum(row_sum[h]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a fully masked row has sum 0: output 0
#pragma unroll
      for (int i = 0; i < kOGroups; ++i) {
        acc_o[i][2 * h] *= inv;
        acc_o[i][2 * h + 1] *= inv;
      }
      const int row = row0 + 8 * h;
      if (p.lse != nullptr && t == 0 && row < p.seqlen_q) {
        constexpr float kLn2 = 0.6931471805599453f;
        const float lse = sum > 0.f ? (row_max[h] + sm80::log2_approx(sum)) * kLn2 : neg_inf();
        p.lse[(static_cast<long long>(tile.batch) * p.heads_q + tile.head) * p.seqlen_q + row] = lse;
      }
    }

    // Every warp of this warpgroup is done reading its Q rows (kOwnO: the previous tile's store is done
    // reading the output rows) before any overwrites them.
    const u32 so_rows = kOwnO ? smem + kOOffset + consumer * 64 * kRowBytes : sq_rows;
    const u32 barrier_id = 1 + warpgroup;
    if constexpr (kOwnO) {
      if (threadIdx.x % 128 == 0) sm90::tma_store_wait_read();
    }
    sm90::named_barrier_sync(barrier_id, 128);
    store_swizzled(so_rows, kBlockM * kRowBytes, acc_o);
    sm90::fence_proxy_async_smem();
    sm90::named_barrier_sync(barrier_id, 128);
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        sm90::tma_store_4d(&params.o_map, so_rows + c * kBlockM * kRowBytes, c * 64, tile.m_start + consumer * 64,
                           tile.head, tile.batch);
      }
      sm90::tma_store_commit();
      if constexpr (!kOwnO) {
        sm90::tma_store_wait_read();  // the Q rows may take the next tile's Q
        sm90::mbarrier_arrive(bars.q_empty());
      }
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this template on its own.
struct FlashgenDefaultFwdSm90Config {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  static constexpr bool kOverlap = true;
  static constexpr bool kPingPong = true;
  static constexpr bool kPersistent = true;
  static constexpr bool kPSmem = false;
  static constexpr int kCluster = 1;
  static constexpr int kGroups = 1;
  static constexpr bool kTensorSum = false;
};

extern "C" __global__ void __launch_bounds__(flashgen::FwdSm90<FlashgenDefaultFwdSm90Config>::kThreads, 1)
    fwd_sm90_standalone_default(const __grid_constant__ flashgen::AttnFwdSm90Params params) {
  flashgen::FwdSm90<FlashgenDefaultFwdSm90Config>::run(params);
}
#endif
