// The Hopper backward's dQ writer (bwd_sm90.cuh): one warp of warpgroup 0 adds each query block's dQ tile,
// staged by the consumers in shared memory, to the fp32 accumulator with bulk reduce-adds and hands the tile
// back; under the deterministic strategy two more producer threads watch for this block's turns and pass them on.
#pragma once

#include "attn_params.cuh"
#include "bwd_sm90_layout.cuh"
#include "bwd_sm90_scheduler.cuh"
#include "sm90_primitives.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90DqWriter : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using Scheduler = BwdSm90Scheduler<Cfg>;
  using Work = typename Scheduler::Work;
  using DqSite = typename Scheduler::DqSite;
  using typename L::Barriers;
  using typename L::u32;
  using L::kBlockM;
  using L::kConsumers;
  using L::kDeterministic;
  using L::kDqOffset;
  using L::kDqPartBytes;
  using L::kDqParts;
  using L::kDqTileBytes;
  using L::kDqWriterThreads;
  using L::kFirstAddStores;
  using L::kQuerySplit;
  using L::kStepConsumers;
  using L::kTileDim;
  using L::dq_empty_barrier;
  using L::dq_full_barrier;
  using L::turn_ring_phase;

  // Adds each query block's dQ tile, once its consumers have stored their shares, to the accumulator
  // with one bulk reduce-add (with the turns, one per consumer's half: kDqParts): the tile in shared memory is
  // laid out as its rows of the accumulator are (DqAccum::kTiles), so it is one contiguous range. Where nothing
  // zeroes the accumulator (kFirstAddStores), a query block's first add is a bulk store, which the others wait for.
  // The deterministic strategy adds once the query block's semaphore counts this block's turn (the first
  // turn stores), which watch_turns sees, and once the add's writes are done pass_turns passes the turn on.
  // Turns go from the query block's last key block down to key block 0: the order in which the key blocks
  // reach a query block when each walks its query blocks upward from its diagonal (causal), and for blocks
  // that all start at query block 0, an order that costs one add per block of lag; without a mask the
  // blocks of a launch group start their walks one query block apart instead and take their turns in the
  // order they arrive (dq_turn). A key block visits a query block exactly when the query block's key range
  // (KeyBlocks over its kBlockM rows, as QueryBlocks counts them) holds it.
  // Under a mask, the atomic strategy takes a ticket from the semaphore's first counter: the first stores
  // and adds kBwdSm90DqStored to it once the store is done; the others add once they see that (key blocks
  // reach a query block at different steps: work_of). Without one it adds into the zeroed accumulator.
  // Either way a block counts its adds done in the second counter, for the convert kernel (bwd_rows.cuh),
  // once all of them are (waiting on each would hold the next).
  static __device__ void write_dq(const AttnBwdParams& p, const Work& w, u32 smem, const Barriers& bars) {
    // One part of a staged tile to the accumulator: a query block's first add stores. The fillers may write
    // the part again once this returns (its reads are done).
    auto add_dq = [](float* accum, u32 sdq_part, bool first) {
      if (first) {
        sm90::bulk_store(accum, sdq_part, kDqPartBytes);
      } else {
        // The adds below follow the store and the previous turns' adds (into a zeroed accumulator, nothing).
        if constexpr (kDeterministic || kFirstAddStores) sm90::fence_proxy_async_global();
        sm90::bulk_reduce_add_f32(accum, sdq_part, kDqPartBytes);
      }
      sm90::tma_store_commit();
      sm90::tma_store_wait_read();
    };
    const bool leader = threadIdx.x % 32 == 0;
    for (int it = 0; it < w.iterations; ++it) {
      const auto [row0, semaphore, turn] = Scheduler::dq_site(p, w, it);
      // The tile and the consumers that fill it: every consumer, or with the query split the step's own.
      const int tile = kQuerySplit ? it % 2 : 0;
      const int fillers_end = tile + kConsumers / kStepConsumers;
      const u32 sdq = smem + kDqOffset + tile * kDqTileBytes;
      // The ticket, or a first look at the turn, before the tile is ready: the round trip runs while the
      // consumers finish the step.
      bool first = false, ready = false;
      if (leader) {
        if constexpr (kDeterministic) {
          first = turn == 0;
          ready = true;  // watch_turns says when
        } else if constexpr (kFirstAddStores) {
          const int ticket = sm90::atom_add_acquire_gpu(semaphore, 1);
          first = (ticket & ~kBwdSm90DqStored) == 0;
          ready = first || (ticket & kBwdSm90DqStored) != 0;
        } else {
          ready = true;
        }
      }
      // The leader's wait before the tile's first part: for this block's turn, or for the first store (the ticket).
      auto wait_turn = [&, semaphore = semaphore] {  // (C++17 lambdas capture no structured binding)
        if constexpr (kDeterministic) {
          sm90::mbarrier_wait(bars.turn_seen(it % 2), turn_ring_phase(it));  // acquire (CTA scope)
          sm90::mbarrier_arrive(bars.turn_taken(it % 2));
        }
        while (!ready) {
          const int count = sm90::ld_acquire_gpu(semaphore);
          ready = (count & kBwdSm90DqStored) != 0;
        }
      };
      // Two branches, not one loop over the parts: in the producer warps' 24 registers the loop (or a lambda for a
      // part) spilled in some tiles of either kind (bench/notes_bwd_sm90.md, Versions: dQ halves).
      if constexpr (kDqParts == 1) {
#pragma unroll
        for (int c = tile; c < fillers_end; ++c) sm90::named_barrier_sync(dq_full_barrier(c), kDqWriterThreads);
        if (leader) {
          wait_turn();
          add_dq(p.dq_accum + row0 * kTileDim, sdq, first);
        }
        __syncwarp();
        if (it + kStepConsumers < w.iterations) {  // the tile's consumers have another step
#pragma unroll
          for (int c = tile; c < fillers_end; ++c) sm90::named_barrier_arrive(dq_empty_barrier(c), kDqWriterThreads);
        }
      } else {
#pragma unroll
        for (int part = 0; part < kDqParts; ++part) {  // consumer `part`'s half
          sm90::named_barrier_sync(dq_full_barrier(part), kDqWriterThreads);
          if (leader) {
            if (part == 0) wait_turn();
            add_dq(p.dq_accum + row0 * kTileDim + part * (kDqPartBytes / 4), sdq + part * kDqPartBytes, first);
          }
          __syncwarp();
          if (it + kStepConsumers < w.iterations) sm90::named_barrier_arrive(dq_empty_barrier(part), kDqWriterThreads);
        }
      }
      // The turn passes on, or the store is announced, once the writes are done, while the consumers go on.
      if (leader && (kDeterministic || first)) {
        sm90::tma_store_wait_all();
        sm90::fence_proxy_async_global();
        if constexpr (kDeterministic) {
          const int slot = it % 2;
          sm90::mbarrier_wait(bars.turn_free(slot), turn_ring_phase(it) ^ 1);
          sm90::mbarrier_arrive(bars.turn_ready(slot));  // release (CTA scope): the writes above are done
        } else {
          sm90::red_add_release_gpu(semaphore, kBwdSm90DqStored);
        }
      }
    }
    if (!kDeterministic && leader) {  // one fence releases every add to the counts that follow it
      sm90::tma_store_wait_all();
      sm90::fence_proxy_async_global();
      sm90::fence_acq_rel_gpu();
      for (int it = 0; it < w.iterations; ++it) {
        const long long row0 =
            Scheduler::workspace_row(p, w, Scheduler::head_of(p, w, it), Scheduler::m_block_of(w, it) * kBlockM);
        sm90::red_add_relaxed_gpu(Scheduler::dq_semaphore(p, row0) + 1, 1);
      }
    }
  }

  // The deterministic strategy's turns, in write_dq's order of adds, watched for and passed on by one thread each of
  // two other producer warps: watch_turns polls the query block's semaphore until it counts this block's turn and
  // tells the writer through the turn_seen ring; pass_turns, told through the turn_ready ring that an add's writes
  // are done, releases the next turn. The writer's loop, on which the consumers' turns wait for the staged dQ tile,
  // then holds neither the polls' round trips nor the release's fence (MEMBAR.GPU): with both in it, the consumers'
  // turns ran slower than lock step (bench/notes_bwd_sm90.md, Versions: turn warps). The ordering
  // carries from the semaphore's GPU-scope acquire and release through the rings' CTA-scope arrivals and waits.
  static __device__ void watch_turns(const AttnBwdParams& p, const Work& w, const Barriers& bars) {
    for (int it = 0; it < w.iterations; ++it) {
      const DqSite site = Scheduler::dq_site(p, w, it);
      if (site.turn > 0) {
        while (sm90::ld_acquire_gpu(site.semaphore) != site.turn) {
        }
      }
      sm90::mbarrier_wait(bars.turn_taken(it % 2), turn_ring_phase(it) ^ 1);
      sm90::mbarrier_arrive(bars.turn_seen(it % 2));  // release (CTA scope): what the turn's release made visible
    }
  }
  static __device__ void pass_turns(const AttnBwdParams& p, const Work& w, const Barriers& bars) {
    for (int it = 0; it < w.iterations; ++it) {
      const DqSite site = Scheduler::dq_site(p, w, it);
      sm90::mbarrier_wait(bars.turn_ready(it % 2), turn_ring_phase(it));  // acquire (CTA scope)
      sm90::st_release_gpu(site.semaphore, site.turn + 1);  // cumulative: the writer's adds come first
      sm90::mbarrier_arrive(bars.turn_free(it % 2));
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::BwdSm90DqWriter<FlashgenDefaultBwdSm90Config>;
#endif
