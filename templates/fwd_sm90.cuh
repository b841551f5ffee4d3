// Forward attention for Hopper (sm_90a): TMA tile loads completing on mbarriers and wgmma on the tensor
// cores, in a warp-specialized block. Warpgroup 0 is the producer: one thread loads the Q tile once and
// streams K and V tiles through kStages-deep rings (separate full/empty barriers for K and V), keeping
// only a few registers. Warpgroups 1..kConsumers each own 64 query rows: S = Q Kᵀ with both operands in
// shared memory, an online softmax in base 2 on the accumulators, then O += P V with P in registers;
// with kOverlap the softmax of one block runs while the tensor cores compute P V of the previous one,
// and with kPingPong the two consumers take turns at issuing their products. Where the config's variant
// hides keys (a causal mask) a consumer computes of each key block only what its rows see: all of it,
// the first half (kHalfN) or nothing. With kPersistent one block per SM walks a list of tiles, the next
// tile's first K/V loads overlapping this tile's output store; where shared memory allows, the output has
// staging rows of its own and the next tile's Q loads as soon as this tile's last S is done. Otherwise
// the output is staged in the consumer's Q rows. A TMA store writes it. With kPSmem P V reads P from
// shared memory (both wgmma operands there) instead of registers. With kCluster == 2 two blocks of
// adjacent query tiles of one head form a cluster: one loads each K tile, the other each V tile, and TMA
// multicast writes it into both. With kGroups == 2 (persistent only) the block holds two groups of
// consumers, each with a Q tile, K/V rings, barriers and a producer thread of its own, walking the tile
// list as two blocks would. An FP8 config (e4m3 or e5m2 q, k and v, a 16-bit output) runs both products on 8-bit
// wgmma (sm90_wgmma_fp8.cuh): V is read as Vᵀ, which the module's first kernel writes (fwd_sm90_values.cuh), and P
// is rounded to e4m3 in registers (fp8.cuh).
// Generic over a config type like fwd_sm80.cuh; validity rules in fwd_sm90_traits() (fwd_traits.cuh).
// The kernel's parts, one file each:
//   fwd_sm90_layout.cuh     sizes, shared-memory layout, barriers, the K/V rings' slots
//   fwd_sm90_scheduler.cuh  which tiles a block (or group) computes, and the producer's and consumers' walks
//   fwd_sm90_producer.cuh   the TMA loads of one tile
//   fwd_sm90_consumer.cuh   one consumer warpgroup's main loop over a tile's key blocks
//   fwd_sm90_epilogue.cuh   normalisation, LSE and the TMA store of O
// This file ties them: barrier setup, the split into producer and consumers, and their walks.
#pragma once

#include "attn_params.cuh"
#include "fwd_sm90_consumer.cuh"
#include "fwd_sm90_layout.cuh"
#include "fwd_sm90_producer.cuh"
#include "fwd_sm90_scheduler.cuh"
#include "sm90_primitives.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90 : FwdSm90Layout<Cfg> {
  using L = FwdSm90Layout<Cfg>;
  using Scheduler = FwdSm90Scheduler<Cfg>;
  using Producer = FwdSm90Producer<Cfg>;
  using Consumer = FwdSm90Consumer<Cfg>;
  using Tile = typename Scheduler::Tile;
  using typename L::Barriers;
  using typename L::u32;
  using L::kBarrierOffset;
  using L::kCluster;
  using L::kConsumers;
  using L::kElem;
  using L::kGroups;
  using L::kGroupStride;
  using L::kOnesOffset;
  using L::kOwnO;
  using L::kPingPong;
  using L::kStages;
  using L::kTensorSum;
  using L::kThreads;
  using L::kTraits;
  using L::ring_phase;
  using L::ring_slot;
  using L::turn_barrier;

  // A packed batch's block first binds its sequence (sequence.cuh): its own lengths, causal offset, o and lse,
  // and the rows where the TMA maps hold it; a block past its sequence's last query row has nothing to do.
  static __device__ void run(const AttnFwdSm90Params& params) {
    if constexpr (L::kVarlen) {
      AttnFwdParams p = params.base;
      const SequenceRows rows = fp8_sequence_rows<L::kFp8>(p, blockIdx.z, L::kPaged);
      if (!bind_sequence(p, blockIdx.z, rows, (gridDim.x - 1 - blockIdx.x) * L::kBlockM)) return;
      run_tiles(params, p, rows);
    } else {
      run_tiles(params, params.base, SequenceRows{});
    }
  }

  static __device__ void run_tiles(const AttnFwdSm90Params& params, const AttnFwdParams& p, const SequenceRows& rows) {
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
      // Lane 0 of warp g produces group g's tiles (with kPaged, the whole warpgroup takes part).
      const int group = kGroups == 1 ? 0 : static_cast<int>(threadIdx.x) / 32;
      if (L::kPaged || (threadIdx.x % 32 == 0 && (kGroups == 1 ? threadIdx.x == 0 : group < kGroups))) {
        const u32 smem = smem_base + group * kGroupStride;
        const Barriers bars{smem + kBarrierOffset};
        int blocks = 0;
        Scheduler::produce_tiles(params, p, rows, group, bars, [&](const Tile& tile, int k, int first_block) {
          Producer::produce(params, p, tile, k, first_block, smem, bars);
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
      if constexpr (kPingPong) {
        if (consumer == 1) sm90::named_barrier_arrive(turn_barrier(group, 0), 256);
      }
      Scheduler::consume_tiles(params, p, rows, group, bars, [&](const Tile& tile, int k, int first_block) {
        Consumer::consume(params, p, tile, k, first_block, smem, bars);
      });
      // Balance the turn barriers: consumer 1's last hand-over (its opening one, when the walk saw no key
      // block) is taken here.
      if constexpr (kPingPong) {
        if (consumer == 0) sm90::named_barrier_sync(turn_barrier(group, 0), 256);
      }
      if (threadIdx.x % 128 == 0) sm90::tma_store_wait_all();  // the last output is in global memory
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this template on its own
// (FlashgenDefaultFwdSm90Config: fwd_sm90_layout.cuh).
extern "C" __global__ void __launch_bounds__(flashgen::FwdSm90<FlashgenDefaultFwdSm90Config>::kThreads, 1)
    fwd_sm90_standalone_default(const __grid_constant__ flashgen::AttnFwdSm90Params params) {
  flashgen::FwdSm90<FlashgenDefaultFwdSm90Config>::run(params);
}
// And the FP8 form of it: e4m3 q, k and v, a bf16 output.
struct FlashgenFp8FwdSm90Config : FlashgenDefaultFwdSm90Config {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kFloat8E4M3;
  static constexpr flashgen::ElemType kOutElem = flashgen::ElemType::kBFloat16;
};
extern "C" __global__ void __launch_bounds__(flashgen::FwdSm90<FlashgenFp8FwdSm90Config>::kThreads, 1)
    fwd_sm90_standalone_fp8(const __grid_constant__ flashgen::AttnFwdSm90Params params) {
  flashgen::FwdSm90<FlashgenFp8FwdSm90Config>::run(params);
}
#endif
