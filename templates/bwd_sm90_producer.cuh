// The Hopper backward's producer (bwd_sm90.cuh): one thread of warpgroup 0 loads the block's K and V once,
// then the Q and dO tiles of every step through the kStages-deep ring, with the LSE (base 2) and D of their
// rows (bulk copies from the padded workspace), each stage completing on its full mbarrier once the consumers
// have freed it.
#pragma once

#include "attn_params.cuh"
#include "bwd_sm90_layout.cuh"
#include "bwd_sm90_scheduler.cuh"
#include "sm90_primitives.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90Producer : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using Scheduler = BwdSm90Scheduler<Cfg>;
  using Work = typename Scheduler::Work;
  using typename L::Barriers;
  using typename L::u32;
  using L::kBlockM;
  using L::kBlockN;
  using L::kChunks;
  using L::kChunksV;
  using L::kKTileBytes;
  using L::kVTileBytes;
  using L::kQTileBytes;
  using L::kRowBytes;
  using L::kRowStatsBytes;
  using L::kRowStatsOffset;
  using L::kStageBytes;
  using L::kStageOffset;
  using L::kStages;
  using L::kVOffset;
  using L::ring_phase;

  // A packed sequence's tiles run on into the next sequence's rows (or past the tensor, zero-filled): its
  // keys past seqlen_k are masked, and its queries past seqlen_q have LSE2 = +inf in the padded workspace.
  static __device__ void produce(const AttnBwdSm90Params& params, const AttnBwdParams& p, const Work& w, u32 smem,
                                 const Barriers& bars) {
    sm90::mbarrier_arrive_expect_tx(bars.kv_full(), kKTileBytes + kVTileBytes);
    const int k_row = w.k_row0 + w.n_start;
    // K's and V's chunks in turn (the values' own head dim may give them fewer or more).
#pragma unroll
    for (int c = 0; c < (kChunks > kChunksV ? kChunks : kChunksV); ++c) {
      if (c < kChunks) {
        sm90::tma_load_4d(smem + c * kBlockN * kRowBytes, &params.k_map, bars.kv_full(), c * 64, k_row, w.kv_head,
                          w.tma_batch);
      }
      if (c < kChunksV) {
        sm90::tma_load_4d(smem + kVOffset + c * kBlockN * kRowBytes, &params.v_map, bars.kv_full(), c * 64, k_row,
                          w.kv_head, w.tma_batch);
      }
    }
    for (int it = 0; it < w.iterations; ++it) {
      const int head = Scheduler::head_of(p, w, it);
      const int m_start = Scheduler::m_block_of(w, it) * kBlockM;
      const int s = it % kStages;
      const u32 st = smem + kStageOffset + s * kStageBytes;
      sm90::mbarrier_wait(bars.empty(s), ring_phase(it) ^ 1);
      sm90::mbarrier_arrive_expect_tx(bars.full(s), kStageBytes + kRowStatsBytes);
#pragma unroll
      for (int c = 0; c < (kChunks > kChunksV ? kChunks : kChunksV); ++c) {
        if (c < kChunks) {
          sm90::tma_load_4d(st + c * kBlockM * kRowBytes, &params.q_map, bars.full(s), c * 64, w.q_row0 + m_start,
                            head, w.tma_batch);
        }
        if (c < kChunksV) {
          sm90::tma_load_4d(st + kQTileBytes + c * kBlockM * kRowBytes, &params.do_map, bars.full(s), c * 64,
                            w.q_row0 + m_start, head, w.tma_batch);
        }
      }
      const long long flat = Scheduler::workspace_row(p, w, head, m_start);
      const u32 stats = smem + kRowStatsOffset + s * kRowStatsBytes;
      // Consumers read LSE and D with ordinary loads; each consumer thread's own arrival on empty(s) orders
      // its loads of the stage's previous use before these copies (see the arrivals in consume()).
      sm90::bulk_load(stats, p.lse_log2 + flat, kBlockM * 4, bars.full(s));
      sm90::bulk_load(stats + kBlockM * 4, p.dsum + flat, kBlockM * 4, bars.full(s));
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::BwdSm90Producer<FlashgenDefaultBwdSm90Config>;
#endif
