// The Hopper backward's epilogue (bwd_sm90.cuh): once every consumer is done with K and V, a consumer stages
// dK = scale · dSᵀ Q and dV = Pᵀ dO of its keys as 16-bit pairs in their rows of the K and V tiles and stores
// them with TMA; with the query split the two consumers first sum their partial dK and dV, and a packed
// sequence's last keys are written from registers.
#pragma once

#include "attn_params.cuh"
#include "bwd_sm90_layout.cuh"
#include "bwd_sm90_scheduler.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90Epilogue : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using Work = typename BwdSm90Scheduler<Cfg>::Work;
  using typename L::Barriers;
  using typename L::Part;
  using typename L::u32;
  using L::kBlockN;
  using L::kChunks;
  using L::kChunksV;
  using L::kDGroups;
  using L::kDGroupsV;
  using L::kElem;
  using L::kHeadDim;
  using L::kHeadDimV;
  using L::kQuerySplit;
  using L::kRowBytes;
  using L::kStageBytes;
  using L::kStageOffset;
  using L::kStages;
  using L::kVOffset;
  using L::kVarlen;
  using L::consumers_sync;
  using L::swizzled;

  // Consumer `consumer` (its keys: the block's 64 from key_consumer * 64; this thread's rows key_row0 and + 8,
  // column pair t) holds acc_dk (64, kTileDim) and acc_dv (64, kTileDimV) fp32, dK unscaled; kPart: which of them it
  // has.
  // Every consumer being done with K and V (dQ read all keys), it stages dK = scale · acc_dk and dV in its
  // rows of the K and V tiles (the dK/dV split: its one of them, all 64 rows), then TMA-stores them (rows
  // past seqlen_k are clipped). With the query split, consumer 0 first adds consumer 1's dK to its own and
  // stores dK, consumer 1 dV, the partial sums passing through the ring's stages (both consumers are done
  // with them, and the producer loads nothing more), in accumulator order, handed over by an mbarrier rather
  // than barrier 1: compute-sanitizer's racecheck follows this hand-off only through the mbarrier
  // (bench/notes_bwd_sm90.md, Versions: the query split's hand-off).
  template <Part kPart>
  static __device__ void store(const AttnBwdSm90Params& params, const AttnBwdParams& p, const Work& w, u32 smem,
                               const Barriers& bars, int consumer, int key_consumer, int key_row0, int t,
                               float (&acc_dk)[kDGroups][4], float (&acc_dv)[kDGroupsV][4]) {
    constexpr bool kHasDk = kPart != Part::kGrads;
    constexpr bool kHasDv = kPart != Part::kScores;
    const u32 sk = smem;
    const u32 sv = smem + kVOffset;
    consumers_sync();
    const bool stores_dk = kHasDk && (!kQuerySplit || consumer == 0);
    const bool stores_dv = kHasDv && (!kQuerySplit || consumer == 1);
    if constexpr (kQuerySplit) {
      static_assert((kDGroups + kDGroupsV) * 128 * 16 <= kStages * kStageBytes, "the partial dK and dV fit the stages");
      const u32 partial = smem + kStageOffset + (threadIdx.x % 128) * 16;
      auto slot = [&](int tensor, int i) {  // tensor 0: dK, 1: dV (after dK's groups)
        return partial + static_cast<u32>(tensor * kDGroups + i) * 128 * 16;
      };
      // (Branches rather than a reference chosen at run time, which would put the accumulators in local memory.)
      auto give = [&](int tensor, const auto& acc) {
        constexpr int kGroups = sizeof(acc) / sizeof(acc[0]);
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
          sm90::st_shared_f32x4(slot(tensor, i), acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        }
      };
      auto take = [&](int tensor, auto& acc) {
        constexpr int kGroups = sizeof(acc) / sizeof(acc[0]);
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
          float other[4];
          sm90::ld_shared_f32x4(slot(tensor, i), other[0], other[1], other[2], other[3]);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][e] += other[e];
        }
      };
      if (consumer == 0) {
        give(1, acc_dv);
      } else {
        give(0, acc_dk);
      }
      sm90::mbarrier_arrive(bars.partials());
      sm90::mbarrier_wait(bars.partials(), 0);
      if (consumer == 0) {
        take(0, acc_dk);
      } else {
        take(1, acc_dv);
      }
    }
    if constexpr (kVarlen) {
      // A packed sequence's last keys: a 64-row box would run into the next sequence's rows, so this
      // consumer writes the keys of its sequence from registers (rows key_row0 and + 8, columns 8i + 2t, + 1;
      // the groups past head_dim are the tiles' zero padding).
      if (w.n_start + key_consumer * 64 + 64 > p.seqlen_k) {
        using u16 = sm80::u16;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = w.n_start + key_row0 + 8 * h;
          if (key >= p.seqlen_k) continue;
          u16* dk = static_cast<u16*>(p.dk) + key * p.dk_row_stride + w.kv_head * p.dk_head_stride + 2 * t;
          u16* dv = static_cast<u16*>(p.dv) + key * p.dv_row_stride + w.kv_head * p.dv_head_stride + 2 * t;
#pragma unroll
          for (int i = 0; i < (kHeadDim > kHeadDimV ? kHeadDim : kHeadDimV) / 8; ++i) {
            if (stores_dk && i < kHeadDim / 8) {
              *reinterpret_cast<u32*>(dk + 8 * i) =
                  sm80::pack2<kElem>(acc_dk[i][2 * h] * p.variant.scale, acc_dk[i][2 * h + 1] * p.variant.scale);
            }
            if (stores_dv && i < kHeadDimV / 8) {
              *reinterpret_cast<u32*>(dv + 8 * i) = sm80::pack2<kElem>(acc_dv[i][2 * h], acc_dv[i][2 * h + 1]);
            }
          }
        }
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < (kDGroups > kDGroupsV ? kDGroups : kDGroupsV); ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 offset = swizzled(kBlockN, key_row0 + 8 * h, 8 * i + 2 * t);
        if (stores_dk && i < kDGroups) {
          sm90::st_shared_u32(sk + offset, sm80::pack2<kElem>(acc_dk[i][2 * h] * p.variant.scale,
                                                             acc_dk[i][2 * h + 1] * p.variant.scale));
        }
        if (stores_dv && i < kDGroupsV) {
          sm90::st_shared_u32(sv + offset, sm80::pack2<kElem>(acc_dv[i][2 * h], acc_dv[i][2 * h + 1]));
        }
      }
    sm90::fence_proxy_async_smem();
    sm90::named_barrier_sync(2 + consumer, 128);
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int c = 0; c < (kChunks > kChunksV ? kChunks : kChunksV); ++c) {
        const u32 rows = c * kBlockN * kRowBytes + key_consumer * 64 * kRowBytes;
        const int k_row = w.k_row0 + w.n_start + key_consumer * 64;
        if (stores_dk && c < kChunks) {
          sm90::tma_store_4d(&params.dk_map, sk + rows, c * 64, k_row, w.kv_head, w.tma_batch);
        }
        if (stores_dv && c < kChunksV) {
          sm90::tma_store_4d(&params.dv_map, sv + rows, c * 64, k_row, w.kv_head, w.tma_batch);
        }
      }
      sm90::tma_store_commit();
      sm90::tma_store_wait_all();
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::BwdSm90Epilogue<FlashgenDefaultBwdSm90Config>;
#endif
