// The Hopper forward's epilogue (fwd_sm90.cuh): one consumer warpgroup normalises its 64 rows of O (with
// the head's sink, when the call has sinks), writes their LSE (softmax.cuh; with kValueSplit the rows' first
// consumer), stages O (its part of the columns) as 16-bit pairs in its output rows (its Q rows unless kOwnO;
// the tiles' swizzled layout) and stores them with TMA; without kOwnO it then frees the Q rows.
#pragma once

#include "attn_params.cuh"
#include "fp8.cuh"
#include "fwd_sm90_layout.cuh"
#include "fwd_sm90_scheduler.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "softmax.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90Epilogue : FwdSm90Layout<Cfg> {
  using L = FwdSm90Layout<Cfg>;
  using Tile = typename FwdSm90Scheduler<Cfg>::Tile;
  using typename L::Barriers;
  using typename L::u32;
  using L::kBlockM;
  using L::kChunksPart;
  using L::kFp8;
  using L::kHeadDimV;
  using L::kOGroups;
  using L::kOOffset;
  using L::kOwnO;
  using L::kPartDimV;
  using L::kRowBytes;
  using L::kTensorSum;
  using L::store_swizzled;

  // Consumer `consumer` of the group (warpgroup among the block's consumers) holds, per thread, rows row0
  // and row0 + 8 of the tile: acc_o (64, kPartDimV) fp32 unnormalised, its part of O's columns, row_max (log2 units) and row_sum
  // (this thread's columns), or with kTensorSum the rows' sums in every column of acc_l (64, 8).
  // p: params.base, or with a packed batch the tile's sequence's own (its o and lse at the sequence's rows).
  static __device__ void store(const AttnFwdSm90Params& params, const AttnFwdParams& p, const Tile& tile, u32 smem,
                               const Barriers& bars, int warpgroup, int consumer, int row0,
                               float (&acc_o)[kOGroups][4], const float (&row_max)[2], const float (&row_sum)[2],
                               const float (&acc_l)[1][4]) {
    const int t = threadIdx.x % 32 % 4;  // accumulator column pair
    const int slice = L::row_slice(consumer);  // the consumer's 64 rows of the tile
    const int part = L::value_part(consumer);  // its part of O's columns
    // FP8: the values' descale, and the 2^kPBias P was rounded with, which its sums carry too.
    float v_descale = 1.f;
    if constexpr (kFp8) v_descale = fp8::descale(p.v_descale, p.v_descale_strides, tile.batch, tile.head / p.group_size);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = kTensorSum ? acc_l[0][2 * h] : sm80::quad_sum(row_sum[h]);
      float m = row_max[h] - L::kPBias;
      softmax::scale_row(acc_o, h, softmax::row_end_factor(p.variant.sinks, tile.head, m, sum) * v_descale);
      const int row = row0 + 8 * h;
      if (p.lse != nullptr && part == 0 && t == 0 && row < p.seqlen_q) {
        p.lse[lse_index<L::kVarlen>(p, tile.batch, tile.head, row)] = softmax::lse(m, sum);
      }
    }

    // A packed sequence's last rows: TMA would store the whole 64-row box, into the next sequence's rows, so
    // this consumer writes the rows of its sequence from registers instead (the accumulator layout: rows row0
    // and row0 + 8, columns 8i + 2t and + 1 of group i of its part; the groups past the values' head dim are the
    // tiles' zero padding).
    if constexpr (L::kVarlen) {
      if (tile.m_start + slice * 64 + 64 > p.seqlen_q) {
        using u16 = sm80::u16;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 8 * h;
          if (row >= p.seqlen_q) continue;
          u16* o = static_cast<u16*>(p.o) + row * p.o_row_stride + tile.head * p.o_head_stride + part * kPartDimV +
                   2 * t;
#pragma unroll
          for (int i = 0; i < kOGroups; ++i) {
            if (part * kPartDimV + 8 * i >= kHeadDimV) break;
            *reinterpret_cast<u32*>(o + 8 * i) = sm80::pack2<L::kOutElem>(acc_o[i][2 * h], acc_o[i][2 * h + 1]);
          }
        }
        if constexpr (!kOwnO) {  // the Q rows may take the next tile's Q (there is none: one tile per block)
          sm90::named_barrier_sync(1 + warpgroup, 128);
          if (threadIdx.x % 128 == 0) sm90::mbarrier_arrive(bars.q_empty());
        }
        return;
      }
    }

    // Every warp of this warpgroup is done reading its Q rows (kOwnO: the previous tile's store is done
    // reading the output rows) before any overwrites them; with kValueSplit staged in the Q rows, every warp of
    // the rows' consumers is.
    const u32 sq_rows = smem + slice * 64 * kRowBytes;  // this consumer's 64 Q rows in chunk 0
    // Its output rows, from its first chunk on.
    const u32 so_rows = (kOwnO ? smem + kOOffset + slice * 64 * kRowBytes : sq_rows) +
                        part * kChunksPart * kBlockM * kRowBytes;
    const u32 barrier_id = 1 + warpgroup;
    if constexpr (kOwnO) {
      if (threadIdx.x % 128 == 0) sm90::tma_store_wait_read();
    }
    if constexpr (!kOwnO && L::kValueSplit > 1) {
      sm90::named_barrier_sync(L::kSliceBarrier + slice, 128 * L::kValueSplit);
    } else {
      sm90::named_barrier_sync(barrier_id, 128);
    }
    // The part's chunks that hold values: a split's last part may end in a chunk of padding, never staged.
    const int chunks = min(kChunksPart, L::kChunksOut - part * kChunksPart);
    store_swizzled<(L::kValueSplit > 1)>(so_rows, kBlockM * kRowBytes, acc_o, chunks);
    sm90::fence_proxy_async_smem();
    sm90::named_barrier_sync(barrier_id, 128);
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int c = 0; c < kChunksPart; ++c) {
        if constexpr (L::kValueSplit > 1) {
          if (c >= chunks) break;
        }
        sm90::tma_store_4d(&params.o_map, so_rows + c * kBlockM * kRowBytes, (part * kChunksPart + c) * 64,
                           tile.q_row + slice * 64, tile.head, tile.tma_batch);
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
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::FwdSm90Epilogue<FlashgenDefaultFwdSm90Config>;
#endif
