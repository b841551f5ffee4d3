// Backward attention for Hopper (sm_90a): the dkdv kernel as a warp-specialized block on TMA and wgmma.
// The row kernels (bwd_rows.cuh) run around it: the preprocess before, the conversion of the fp32 dQ
// accumulator after. Both dQ strategies run this kernel; the deterministic one orders its dQ adds.
// Notation as in bwd_sm80.cuh: S = Q Kᵀ, P recomputed from the saved LSE, dP = dO Vᵀ, dS = P ∘ (dP − D),
// dV = Pᵀ dO, dK = scale · dSᵀ Q, dQ = scale · dS K.
//
// One block per (key block, kv head, batch). Warpgroup 0 is the producer: one thread loads the block's
// K and V once, then streams the Q and dO tiles of every query block of every query head of the group
// through a kStages-deep ring, with the LSE (base 2) and D of their rows (bulk copies from the padded
// workspace); one warp of it, the dQ writer, adds each query block's dQ to the fp32 accumulator.
// Warpgroups 1..kConsumers own 64 keys each. Per query block a consumer computes Sᵀ = K Qᵀ and
// dPᵀ = V dOᵀ with both operands in shared memory, turns them into Pᵀ and dSᵀ in registers, adds
// dV += Pᵀ dO and dK += dSᵀ Q with those as register A operands, and stages dSᵀ in shared memory; once
// every consumer has, each computes its share of dQ = dS K (dSᵀ and K read MN-major) and stores it to the
// dQ tile in shared memory, in the accumulator's own order (DqAccum::kTiles, bwd_traits.cuh). The writer
// adds the tile with one bulk reduce-add (where the consumers take turns, one per consumer's half: kDqParts;
// a query block's first add is a bulk store where nothing zeroes the accumulator: dq_first_add_stores) and
// hands the buffer back; the consumers never wait on a global
// reduction. The deterministic strategy makes those adds take turns in a fixed order of key blocks (a
// semaphore per query block), so repeated runs sum in the same order; the atomic one counts them there, so
// the convert kernel can run beside this one's last blocks. dK and dV leave through the K and V tiles and
// TMA stores. On 64-column tiles a step adds the previous step's dQ, so the consumers meet at no barrier of
// a step (defer_dq); on 128-column tiles with two stages the consumers also take turns issuing their
// products, one computing its softmax while the other's products run (ping_pong). Tiles hold
// head_dim rounded up to whole 64-column chunks (sm90_tile_dim, fwd_traits.cuh): TMA zero-fills the columns
// past it on load and clips them on store, and the dQ accumulator's rows are as wide as the tiles'. Tiles of
// 192 and 256 columns keep 64 keys per block and give its dK to consumer 0 and its dV to consumer 1 instead
// (dK and dV of 256 columns would take 256 registers per thread): consumer 1 computes dPᵀ and passes it to
// consumer 0 through an exchange tile; consumer 0 computes Sᵀ, Pᵀ and dSᵀ, adds dK += dSᵀ Q and passes Pᵀ's
// fragments back for dV += Pᵀ dO; dQ's chunks are shared (at 192: two for consumer 0, one for consumer 1;
// the other way round ptxas spills). Where the staged dQ tile does not fit (256 with two stages, 192 with
// three) each consumer adds its dQ columns with vector reductions in the accumulator's order (in turns, for
// the deterministic strategy). Tiles of 128 columns on 64-key blocks split the steps instead (the query
// split): both consumers see the block's 64 keys, consumer c computes steps c, c + 2, ... whole into a dQ tile
// of its own, with no barrier between the consumers, and at the end consumer 0 sums and stores dK and
// consumer 1 dV.
// Validity rules in bwd_sm90_traits() (bwd_traits.cuh). Masking and scores go through the config's
// Variant (variant.cuh, block_range.cuh).
// The kernel's parts, one file each:
//   bwd_sm90_layout.cuh     sizes, shared-memory layout, barriers
//   bwd_sm90_scheduler.cuh  which key block a block computes, and its walk over the query blocks
//   bwd_sm90_producer.cuh   the TMA loads of K, V and every step's Q, dO, LSE and D
//   bwd_sm90_dq_writer.cuh  the adds of the staged dQ tiles, and the deterministic strategy's turns
//   bwd_sm90_consumer.cuh   one consumer warpgroup: its place, dK and dV, the scores' Pᵀ and dSᵀ
//   bwd_sm90_mainloops.cuh  its walk over the query blocks: the consumers' turns, or lock step
//   bwd_sm90_epilogue.cuh   its dK and dV: the query split's sum, the TMA stores
// This file ties them: barrier setup and the split into producer warps and consumers.
#pragma once

#include "attn_params.cuh"
#include "bwd_rows.cuh"
#include "bwd_sm90_consumer.cuh"
#include "bwd_sm90_dq_writer.cuh"
#include "bwd_sm90_layout.cuh"
#include "bwd_sm90_producer.cuh"
#include "bwd_sm90_scheduler.cuh"
#include "sequence.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"

namespace flashgen {

template <class Cfg>
struct BwdDkdvSm90 : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using Scheduler = BwdSm90Scheduler<Cfg>;
  using Producer = BwdSm90Producer<Cfg>;
  using DqWriter = BwdSm90DqWriter<Cfg>;
  using Consumer = BwdSm90Consumer<Cfg>;
  using Place = typename Scheduler::Place;
  using Work = typename Scheduler::Work;
  using typename L::Barriers;
  using typename L::Part;
  using typename L::u32;
  using L::kBarrierOffset;
  using L::kBlockN;
  using L::kConsumers;
  using L::kDeferDq;
  using L::kDeterministic;
  using L::kDkdvSplit;
  using L::kDqPasses;
  using L::kDqStaged;
  using L::kDqWriterWarp;
  using L::kDsTiles;
  using L::kQuerySplit;
  using L::kStages;
  using L::kTileDim;
  using L::kTraits;
  using L::kTurnWarp;
  using L::kTurnWatchWarp;
  using L::kVarlen;

  // A packed batch's block first binds its sequence (sequence.cuh): lengths, causal offset, the tensors'
  // and the workspace's rows; a block past the sequence's last key has nothing to do.
  static __device__ void run(const AttnBwdSm90Params& params) {
    // The convert kernel may start once every block has (bwd_rows.cuh): it waits for each query block's adds.
    if constexpr (kDqStaged) sm80::launch_dependents();
    if constexpr (kVarlen) {
      AttnBwdParams p = params.base;
      const Place place = Scheduler::place_of_this_block();
      const SequenceRows rows = sequence_rows(p, place.batch);
      bind_sequence(p, place.batch, rows, kTileDim, Cfg::kPadRows);
      if (place.n_block * kBlockN >= p.seqlen_k) return;
      run_block(params, p, rows);
    } else {
      run_block(params, params.base, SequenceRows{});
    }
  }

  static __device__ void run_block(const AttnBwdSm90Params& params, const AttnBwdParams& p, const SequenceRows& rows) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = (sm90::smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    const Barriers bars{smem + kBarrierOffset};
    const Work w = Scheduler::work_of(p, rows);

    if (threadIdx.x == 0) {
      sm90::mbarrier_init(bars.kv_full(), 1);
      for (int s = 0; s < kStages; ++s) {
        sm90::mbarrier_init(bars.full(s), 1);
        // One arrival per thread of the consumers that read the stage (with the query split, one consumer).
        sm90::mbarrier_init(bars.empty(s), (kQuerySplit ? 1 : kConsumers) * 128);
      }
      if constexpr (kDeferDq) {
        for (int b = 0; b < kDsTiles; ++b) {
          sm90::mbarrier_init(bars.ds_full(b), kConsumers * 128);
          sm90::mbarrier_init(bars.ds_empty(b), kConsumers * 128);
        }
      }
      if constexpr (kQuerySplit) sm90::mbarrier_init(bars.partials(), kConsumers * 128);
      if constexpr (kDeterministic && kDqStaged) {
        for (int b = 0; b < 2; ++b) {
          sm90::mbarrier_init(bars.turn_ready(b), 1);
          sm90::mbarrier_init(bars.turn_free(b), 1);
          sm90::mbarrier_init(bars.turn_seen(b), 1);
          sm90::mbarrier_init(bars.turn_taken(b), 1);
        }
      }
      sm90::fence_mbarrier_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {
      sm90::setmaxnreg_dec<kTraits.producer_regs>();
      if (threadIdx.x == 0) {
        Producer::produce(params, p, w, smem, bars);
      } else if (kDqStaged && threadIdx.x / 32 == kDqWriterWarp) {
        DqWriter::write_dq(p, w, smem, bars);
      } else if (kDqStaged && kDeterministic && threadIdx.x == 32 * kTurnWarp) {
        DqWriter::pass_turns(p, w, bars);
      } else if (kDqStaged && kDeterministic && threadIdx.x == 32 * kTurnWatchWarp) {
        DqWriter::watch_turns(p, w, bars);
      }
    } else {
      sm90::setmaxnreg_inc<kTraits.consumer_regs>();
      // With the dK/dV split each consumer runs its own part's code (wgmma chosen per consumer inside one
      // loop would be serialized by ptxas).
      if constexpr (kDkdvSplit) {
        if (threadIdx.x < 256) {
          Consumer::template consume<kDqPasses, Part::kScores>(params, p, w, smem, bars);
        } else {
          Consumer::template consume<kTraits.dq_passes_last, Part::kGrads>(params, p, w, smem, bars);
        }
      } else {
        Consumer::template consume<kDqPasses, Part::kBoth>(params, p, w, smem, bars);
      }
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this template on its own
// (FlashgenDefaultBwdSm90Config: bwd_sm90_layout.cuh).
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm90_standalone_preprocess(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdPreprocess<FlashgenDefaultBwdSm90Config>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::BwdDkdvSm90<FlashgenDefaultBwdSm90Config>::kThreads, 1)
    bwd_sm90_standalone_dkdv(const __grid_constant__ flashgen::AttnBwdSm90Params params) {
  flashgen::BwdDkdvSm90<FlashgenDefaultBwdSm90Config>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm90_standalone_convert(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdConvertDq<FlashgenDefaultBwdSm90Config>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm90_standalone_sink_grad(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdSinkGrad<FlashgenDefaultBwdSm90Config>::run(params);
}
#endif
