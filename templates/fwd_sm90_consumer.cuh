// The Hopper forward's consumer main loop (fwd_sm90.cuh): one warpgroup of 64 query rows walks a tile's
// key blocks, last first: S = Q Kᵀ on wgmma from shared memory, the variant's transform and mask
// (block_range.cuh), the online softmax (softmax.cuh) on the accumulators, then O += P V with P from
// registers (or, kPSmem, shared memory); with kValueSplit 2 two consumers walk the same rows, each computing
// P V of its half of V's columns. With kOverlap the softmax of one block runs while the tensor
// cores compute P V of the one before; with kPingPong the two consumers take turns at issuing products.
// Where the variant hides keys, a consumer computes of each block only what its rows see: all of it, the
// first kHalfN keys, or nothing. The epilogue (fwd_sm90_epilogue.cuh) stores the tile's O and LSE.
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "fp8.cuh"
#include "fwd_sm90_epilogue.cuh"
#include "fwd_sm90_layout.cuh"
#include "fwd_sm90_scheduler.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "sm90_wgmma_fp8.cuh"
#include "sm90_wgmma_rs.cuh"
#include "sm90_wgmma_ss.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90Consumer : FwdSm90Layout<Cfg> {
  using L = FwdSm90Layout<Cfg>;
  using Tile = typename FwdSm90Scheduler<Cfg>::Tile;
  using Epilogue = FwdSm90Epilogue<Cfg>;
  using typename L::Barriers;
  using typename L::u32;
  using typename L::u64;
  using typename L::Variant;
  using L::kBlockM;
  using L::kBlockN;
  using L::kChunksPart;
  using L::kCluster;
  using L::kConsumers;
  using L::kElem;
  using L::kFp8;
  using L::kGroups;
  using L::kKOffset;
  using L::kOGroups;
  using L::kOnesOffset;
  using L::kOverlap;
  using L::kPBias;
  using L::kOwnO;
  using L::kPartDimV;
  using L::kPBytes;
  using L::kPingPong;
  using L::kPOffset;
  using L::kPSmem;
  using L::kPSteps;
  using L::kQkSteps;
  using L::kRowBytes;
  using L::kSGroups;
  using L::kTensorSum;
  using L::kTileDimV;
  using L::kTileBytes;
  using L::kTileBytesV;
  using L::kVOffset;
  using L::ring_phase;
  using L::ring_slot;
  using L::row_slice;
  using L::store_swizzled;
  using L::turn_barrier;

  // Where the variant hides keys, a key block may show one consumer's 64 rows no key from kHalfN on (the
  // upper half of a diagonal block, to the first consumer under a causal mask) or no key at all. That
  // consumer then computes S, softmax and P V of the first kHalfN keys only, or nothing of the block.
  // kHalfN keeps whole 16-key steps of P V and S of at least 32 keys (the narrowest wgmma of S); 0 where kBlockN
  // cannot be halved so. Where every row sees every key only a ragged last block could be narrowed, and the kernel
  // keeps a single path.
  static constexpr int kHalfN = Variant::kHidesKeys && kBlockN % 32 == 0 && kBlockN >= 64 ? kBlockN / 2 : 0;

  // One warp's arrival on the Q rows' empty barrier (it counts kConsumers * 4 arrivals, or kConsumers).
  static __device__ __forceinline__ void release(int lane, u32 empty_barrier) {
    if (lane == 0) sm90::mbarrier_arrive(empty_barrier);
  }
  // One warp's arrival on a K or V slot's empty barrier in every block of the cluster.
  static __device__ __forceinline__ void release_kv(int lane, u32 empty_barrier) {
    if constexpr (kCluster > 1) {
      if (lane == 0) {
#pragma unroll
        for (u32 r = 0; r < kCluster; ++r) sm90::mbarrier_arrive_cluster(empty_barrier, r);
      }
    } else {
      release(lane, empty_barrier);
    }
  }

  // One consume() call's walk over its tile's key blocks (block it: the walk's it-th, the walk runs last block
  // first): the thread's place, references to its O accumulators and running row statistics, and the pieces of
  // a step (the products, the softmax, P's fragments, the consumers' turns, the slots' releases).
  struct Walk {
    const AttnFwdParams& p;
    const Tile& tile;
    const Barriers& bars;
    u32 smem;
    int first_block;  // the ring index of block 0
    int warpgroup, consumer, group, lane, t, row0;
    u32 v_columns;           // the byte offset of this consumer's part of V's columns (kValueSplit) in a V tile
    u64 desc_q0;             // this consumer's 64 Q rows
    u32 sp_rows;             // this consumer's P rows (kPSmem)
    u64 desc_p0, desc_ones;  // issue_pv's P rows (kPSmem) and ones (kTensorSum)
    const float& scale_log2;  // the softmax's scale for the variant's row scores (block_range.cuh)
    float qk_descale;         // FP8 whose variant transforms scores: q's and k's descales, multiplied into S first
    int n_masked, interior_end;
    float (&acc_o)[kOGroups][4];  // (64, kPartDimV) fp32 per warpgroup
    float (&acc_l)[1][4];         // kTensorSum: (64, 8) fp32 per warpgroup, every column its row's running sum
    float (&row_max)[2];          // running max (log2 units) of rows row0, row0 + 8
    float (&row_sum)[2];          // running sum of exp2, this thread's columns only

    // Block it's slot in the K and V rings, and the phase its loads complete.
    __device__ __forceinline__ int slot(int it) const { return ring_slot(first_block + it); }
    __device__ __forceinline__ u32 phase(int it) const { return ring_phase(first_block + it); }

    // With kOwnO the Q rows are free once S of the tile's last block is done: K of block it is released.
    __device__ __forceinline__ void release_k(int it) const {
      release_kv(lane, bars.k_empty(slot(it)));
      if constexpr (kOwnO) {
        if (it == tile.n_blocks - 1) release(lane, bars.q_empty());
      }
    }

    // Issues S = Q Kᵀ of block it: (64, 8 * width) per warpgroup into the first width groups of acc_s,
    // k-steps of 16 along head_dim.
    template <class Width>
    __device__ __forceinline__ void issue_qk(int it, float (&acc_s)[kSGroups][4], Width width) const {
      const u64 desc_k0 = sm90::smem_desc_sw128(smem + kKOffset + slot(it) * kTileBytes, 16, 1024);
      sm90::mbarrier_wait(bars.k_full(slot(it)), phase(it));
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQkSteps; ++kk) {
        const u32 offset = (kk % 4) * 32;  // k-step within its 64-column chunk
        const u64 desc_q = sm90::smem_desc_advance(desc_q0, (kk / 4) * kBlockM * kRowBytes + offset);
        const u64 desc_k = sm90::smem_desc_advance(desc_k0, (kk / 4) * kBlockN * kRowBytes + offset);
        if constexpr (kFp8) {
          sm90::WgmmaSS8<8 * decltype(width)::value>::template run<kElem, kElem>(acc_s, desc_q, desc_k, kk > 0 ? 1 : 0);
        } else {
          sm90::WgmmaSS<8 * decltype(width)::value>::template run<kElem>(acc_s, desc_q, desc_k, kk > 0 ? 1 : 0);
        }
      }
      sm90::wgmma_commit();
    }

    // Issues O += P V of block it over its first 8 * width keys: keys are the k dimension; V is read
    // MN-major (the values' head dim contiguous), its 64-column chunks kBlockN rows apart, from this consumer's
    // first chunk on. P comes from p_frag, or
    // with kPSmem from this consumer's P rows, read K-major like Q.
    // FP8: Vᵀ is read K-major like K, its 128-key chunks kTileDimV rows apart, k-steps of 32 keys.
    template <class Width>
    __device__ __forceinline__ void issue_pv(int it, const u32 (&p_frag)[kPSteps][4], Width width) const {
      constexpr int kSteps = decltype(width)::value * 8 / L::kKStep;
      if constexpr (kFp8) {
        const u64 desc_v0 = sm90::smem_desc_sw128(smem + kVOffset + slot(it) * kTileBytesV, 16, 1024);
        sm90::mbarrier_wait(bars.v_full(slot(it)), phase(it));
        sm90::wgmma_fence();
#pragma unroll
        for (int j = 0; j < kSteps; ++j) {
          const u64 desc_v = sm90::smem_desc_advance(desc_v0, (j / 4) * kTileDimV * kRowBytes + (j % 4) * 32);
          sm90::WgmmaRS8<kPartDimV>::template run<ElemType::kFloat8E4M3, kElem>(acc_o, p_frag[j], desc_v, 1);
        }
        sm90::wgmma_commit();
        return;
      }
      const u64 desc_v0 =
          sm90::smem_desc_sw128(smem + kVOffset + slot(it) * kTileBytesV + v_columns, kBlockN * kRowBytes, 1024);
      sm90::mbarrier_wait(bars.v_full(slot(it)), phase(it));
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        const u64 desc_v = sm90::smem_desc_advance(desc_v0, j * 16 * kRowBytes);
        if constexpr (kPSmem) {
          const u64 desc_p = sm90::smem_desc_advance(desc_p0, (j / 4) * 64 * kRowBytes + (j % 4) * 32);
          sm90::WgmmaSSKMN<kPartDimV>::template run<kElem>(acc_o, desc_p, desc_v, 1);
        } else {
          sm90::WgmmaRS<kPartDimV>::template run<kElem>(acc_o, p_frag[j], desc_v, 1);
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
    }

    // The variant's scores of block it (its transform, and when masked its mask), then the online softmax over
    // the first width groups of acc_s (softmax.cuh): moves the running max and sums, and turns S into
    // P = exp2(s * scale_log2 - m) in place (fp32). correction[h] is the factor O's rows must be scaled by
    // before P V of this block is added (1 when the max did not move); rescale says whether any row of the
    // warp moved.
    template <class Masked, class Width>
    __device__ __forceinline__ void online_softmax(int it, float (&acc_s)[kSGroups][4], float (&correction)[2],
                                                   bool& rescale, Masked masked, Width width) const {
      constexpr int kWidth = decltype(width)::value;
      const int key0 = (tile.n_begin + tile.n_blocks - 1 - it) * kBlockN;  // the block's first key
      if constexpr (kFp8 && !Variant::kPlainScores) {
        const float descale[2] = {qk_descale, qk_descale};
        softmax::scale_rows(acc_s, descale);
      }
      variant_scores<Variant, kWidth, decltype(masked)::value>(p, acc_s, tile.batch, tile.head, row0, key0, t);
      float block_max[2];
      bool moves[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        block_max[h] = softmax::block_max<kWidth>(acc_s, h, scale_log2);
        moves[h] = softmax::max_moves<L::kRescaleSlack>(block_max[h], row_max[h]);
      }
      rescale = __any_sync(0xffffffffu, moves[0] || moves[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        correction[h] = 1.f;
        if (rescale) {
          correction[h] = softmax::move_max(moves[h], block_max[h], row_max[h]);
          if constexpr (!kTensorSum) row_sum[h] *= correction[h];
        }
        // With kTensorSum the tensor cores add P up (issue_pv).
        const float sum = softmax::exponentiate<kWidth, !kTensorSum>(acc_s, h, row_max[h] - kPBias, scale_log2);
        if constexpr (!kTensorSum) row_sum[h] += sum;
      }
    }

    // online_softmax of block it, masked unless the block is interior.
    template <class Width>
    __device__ __forceinline__ void softmax_of(int it, float (&acc_s)[kSGroups][4], float (&correction)[2],
                                               bool& rescale, Width width) const {
      constexpr bool kWhole = decltype(width)::value == kSGroups;  // a part block is always masked
      if constexpr (kWhole) {
        if (it >= n_masked && (!Variant::kHidesEarlyKeys || it < interior_end)) {
          online_softmax(it, acc_s, correction, rescale, sm80::BoolConstant<false>{}, width);
          return;
        }
      }
      online_softmax(it, acc_s, correction, rescale, sm80::BoolConstant<true>{}, width);
    }

    // P of block it as 16-bit A fragments (sm80::pack_a_steps: the block's width only). Written only while
    // no wgmma reads p_frag: ptxas serializes every wgmma of a kernel whose in-flight operand registers may
    // be redefined.
    // With kPSmem P goes to this consumer's P rows instead (store_swizzled, as the output; the whole block,
    // P V reads the width), once every warp's P V of the previous block is done reading them; the second
    // barrier makes every warp's P visible to the tensor cores.
    template <class Width>
    __device__ __forceinline__ void pack_p(const float (&acc_s)[kSGroups][4], u32 (&p_frag)[kPSteps][4],
                                           Width width) const {
      if constexpr (kPSmem) {
        sm90::named_barrier_sync(1 + warpgroup, 128);
        store_swizzled(sp_rows, 64 * kRowBytes, acc_s);
        sm90::fence_proxy_async_smem();
        sm90::named_barrier_sync(1 + warpgroup, 128);
      } else if constexpr (kFp8) {
        fp8::pack_p_steps<decltype(width)::value / 4>(p_frag, acc_s);
      } else {
        sm80::pack_a_steps<kElem, decltype(width)::value / 2>(p_frag, acc_s);
      }
    }

    // O's rows (and with kTensorSum their sums) scaled by the softmax's correction, where any row moved.
    __device__ __forceinline__ void rescale_o(const float (&correction)[2], bool rescale) const {
      if (!rescale) return;
      softmax::scale_rows(acc_o, correction);
      if constexpr (kTensorSum) softmax::scale_rows(acc_l, correction);
    }

    // Ping-pong (two consumers): each warpgroup issues its products only in its turn and hands the turn
    // over right after, so one warpgroup's softmax runs while the other's products keep the tensor cores
    // busy. Consumer 0 takes the first turn of the walk (FwdSm90::run).
    __device__ __forceinline__ void wait_turn() const {
      if constexpr (kPingPong) sm90::named_barrier_sync(turn_barrier(group, consumer), 256);
    }
    __device__ __forceinline__ void pass_turn() const {
      if constexpr (kPingPong) sm90::named_barrier_arrive(turn_barrier(group, 1 - consumer), 256);
    }

    // A block this consumer computes nothing of: it takes its turn and frees the block's slots, each once
    // its load has landed (an arrival on an empty barrier must not run ahead of the slot's phase).
    __device__ __forceinline__ void pass_block(int it) const {
      wait_turn();
      pass_turn();
      sm90::mbarrier_wait(bars.k_full(slot(it)), phase(it));
      release_k(it);
      sm90::mbarrier_wait(bars.v_full(slot(it)), phase(it));
      release_kv(lane, bars.v_empty(slot(it)));
    }
  };

  // p: params.base, or with a packed batch the tile's sequence's own (sequence.cuh's bind_sequence).
  static __device__ void consume(const AttnFwdSm90Params& params, const AttnFwdParams& p, const Tile& tile, int k,
                                 int first_block, u32 smem, const Barriers& bars) {
    const int warpgroup = sm90::warpgroup_index() - 1;  // among the block's consumers
    const int consumer = kGroups == 1 ? warpgroup : warpgroup % kConsumers;  // within this group
    const int group = kGroups == 1 ? 0 : warpgroup / kConsumers;
    const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup: rows 16 * warp .. + 15 of its 64
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // accumulator row within an 8-row group
    const int t = lane % 4;  // accumulator column pair
    const int slice = row_slice(consumer);  // this consumer's 64 query rows of the tile
    const u32 v_columns = L::value_part(consumer) * kChunksPart * kBlockN * kRowBytes;
    const u32 sq_rows = smem + slice * 64 * kRowBytes;  // this consumer's 64 Q rows in chunk 0
    const u64 desc_q0 = sm90::smem_desc_sw128(sq_rows, 16, 1024);
    const int row0 = tile.m_start + slice * 64 + warp * 16 + g;  // query rows row0 and row0 + 8

    float acc_o[kOGroups][4];  // (64, kPartDimV) fp32 per warpgroup: this thread's (2 rows, 2 cols) groups
    float row_max[2] = {neg_inf(), neg_inf()};  // running max (log2 units) of rows row0, row0 + 8
    float row_sum[2] = {0.f, 0.f};              // running sum of exp2, this thread's columns only
    // kTensorSum: (64, 8) fp32 per warpgroup, P times ones: every column holds its row's running sum.
    float acc_l[1][4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int i = 0; i < kOGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[i][e] = 0.f;

    if constexpr (kOwnO) {
      if (tile.n_blocks == 0) release(lane, bars.q_empty());
    }

    // Key blocks arrive last first: the masked ones (it < n_masked), then the interior ones, whose
    // softmax carries no masking code, then (a window's) masked ones again.
    const int n_masked = tile.n_masked;
    const int interior_end = n_masked + tile.n_interior;
    // How much of each key block this consumer computes (variants that hide keys only). Blocks it < first
    // hold only keys past the last one its rows see; it computes nothing of them. Block first may show its
    // rows no key from kHalfN on (half_first); every later block is computed whole. Widths count S groups
    // of 8 keys.
    int first = 0;
    bool half_first = false;
    if constexpr (Variant::kHidesKeys) {
      // The last key any of its 64 rows sees: its last row's.
      const int last_key = min(p.seqlen_k - 1, Variant::last_key(p, tile.batch, tile.m_start + slice * 64 + 63));
      const int n_last = tile.n_begin + tile.n_blocks - 1;  // the walk's first block
      first = last_key < 0 ? tile.n_blocks : min(tile.n_blocks, max(0, n_last - last_key / kBlockN));
      half_first = kHalfN > 0 && first < tile.n_blocks && last_key + 1 - (n_last - first) * kBlockN <= kHalfN;
    }
    using Whole = sm80::IntConstant<kSGroups>;
    using Half = sm80::IntConstant<(kHalfN > 0 ? kHalfN / 8 : kSGroups)>;  // never used when kHalfN == 0

    // P V's operands besides V: this consumer's P rows (kPSmem) and the ones that sum P's rows (kTensorSum).
    const u32 sp_rows = smem + kPOffset + consumer * kPBytes;
    const u64 desc_p0 = sm90::smem_desc_sw128(sp_rows, 16, 1024);
    const u64 desc_ones = sm90::smem_desc_plain(smem + kOnesOffset, 128, 256);
    // The softmax's scale for the variant's row scores (block_range.cuh); FP8's descales of q and k go into it where
    // the scores are q·k itself.
    float folded_scale;
    const float& scale_log2 = row_scale_log2<Variant>(p.variant.scale_log2, p, folded_scale);
    float qk_descale = 1.f;
    if constexpr (kFp8) {
      const int kv_head = tile.head / p.group_size;
      qk_descale = fp8::descale(p.q_descale, p.q_descale_strides, tile.batch, kv_head) *
                   fp8::descale(p.k_descale, p.k_descale_strides, tile.batch, kv_head);
      if constexpr (Variant::kPlainScores) folded_scale = scale_log2 * qk_descale;
    }
    const float& walk_scale = kFp8 && Variant::kPlainScores ? folded_scale : scale_log2;
    const Walk walk{p, tile, bars, smem, first_block, warpgroup, consumer, group, lane, t, row0, v_columns, desc_q0, sp_rows,
                    desc_p0, desc_ones, walk_scale, qk_descale, n_masked, interior_end, acc_o, acc_l, row_max, row_sum};

    for (int it = 0; it < first; ++it) walk.pass_block(it);

    // The width of a block is a template argument: ptxas serializes every wgmma of the kernel when a
    // wgmma is issued under a branch inside a pipeline stage (from its issue to the wait for it), so
    // each branch on half_first below holds whole stages.
    float acc_s[kSGroups][4];
    u32 p_frag[kPSteps][4];
    float correction[2];
    bool rescale = false;
    // S of block it on its own, then its softmax and P.
    auto s_alone = [&](int it, auto width) {
      walk.wait_turn();
      walk.issue_qk(it, acc_s, width);
      walk.pass_turn();
      sm90::wgmma_wait<0>();
      sm90::pin_registers(acc_s);
      walk.release_k(it);
      walk.softmax_of(it, acc_s, correction, rescale, width);
      walk.pack_p(acc_s, p_frag, width);
    };
    // P V of block it on its own, after O's correction.
    auto pv_alone = [&](int it, auto width) {
      walk.rescale_o(correction, rescale);
      walk.issue_pv(it, p_frag, width);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(acc_o);
      if constexpr (kTensorSum) sm90::pin_registers(acc_l);
      release_kv(lane, bars.v_empty(walk.slot(it)));
    };
    if constexpr (!kOverlap) {
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
        walk.wait_turn();
        walk.issue_qk(it, acc_s, Whole{});
        walk.rescale_o(correction, rescale);
        walk.issue_pv(it - 1, p_frag, pv_width);
        walk.pass_turn();
        sm90::wgmma_wait<1>();  // groups complete in order: S of block it is done, P V may still run
        sm90::pin_registers(acc_s);
        walk.release_k(it);
        walk.softmax_of(it, acc_s, correction, rescale, Whole{});
        sm90::wgmma_wait<0>();
        sm90::pin_registers(acc_o);
        if constexpr (kTensorSum) sm90::pin_registers(acc_l);
        release_kv(lane, bars.v_empty(walk.slot(it - 1)));
        walk.pack_p(acc_s, p_frag, Whole{});
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
    Epilogue::store(params, p, tile, smem, bars, warpgroup, consumer, row0, acc_o, row_max, row_sum, acc_l);
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::FwdSm90Consumer<FlashgenDefaultFwdSm90Config>;
#endif
