// Backward attention on tensor cores for sm_80 and newer (mma.sync m16n8k16, ldmatrix, cp.async).
// Generic over a config type (see the generated BwdConfig in generator/generator.cpp). The kernels and
// the order they run in are described in bwd_traits.cuh. Notation: S = Q Kᵀ (unscaled), P = softmax
// of scale·S recomputed from the forward's LSE, dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP − D);
// then dV = Pᵀ dO, dK = scale · dSᵀ Q, dQ = scale · dS K. Masking and scores go through the config's
// Variant (variant.cuh, block_range.cuh); dS is taken with respect to q·k (its score_grad).
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "bwd_rows.cuh"
#include "bwd_scores.cuh"
#include "bwd_traits.cuh"
#include "sm80_attend.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"
#include "tile_copy.cuh"
#include "variant.cuh"

namespace flashgen {
namespace bwd {

using sm80::u16;
using sm80::u32;

// Per-lane ldmatrix byte offsets within a tile of pitch kPitch elements (16-bit).
template <int kPitch>
struct Lanes {
  // A operand from a row-major (rows, k) tile: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
  // (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  static __device__ __forceinline__ u32 a(int lane) { return ((lane & 15) * kPitch + (lane >> 4) * 8) * 2; }
  // B operand of two n-tiles from an (n, k) row-major tile: (n 0-7, k 0-7), (n 0-7, k 8-15),
  // (n 8-15, k 0-7), (n 8-15, k 8-15).
  static __device__ __forceinline__ u32 b(int lane) {
    return ((lane & 7) + ((lane >> 4) << 3)) * kPitch * 2 + ((lane >> 3) & 1) * 16;
  }
  // B operand of two n-tiles from a (k, n) row-major tile, read transposed: (k 0-7, n 0-7),
  // (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  static __device__ __forceinline__ u32 b_trans(int lane) {
    return ((lane & 7) + ((lane >> 3) & 1) * 8) * kPitch * 2 + (lane >> 4) * 16;
  }
  // A operand from a (k, rows) row-major tile, read transposed: the same four matrices as a().
  static __device__ __forceinline__ u32 a_trans(int lane) {
    return ((lane & 7) + (lane >> 4) * 8) * kPitch * 2 + ((lane >> 3) & 1) * 16;
  }
};

}  // namespace bwd

// dK and dV (and, for the atomic strategy, dQ contributions) of one block of kBlockN keys of one
// kv head, over every query block of every query head in the head's group. Each warp owns 16 *
// kKeyTiles keys: it computes Sᵀ and dPᵀ for them against the whole query block, so Pᵀ and dSᵀ stay in
// registers as the A operands of dV += Pᵀ dO and dK += dSᵀ Q. With kDSplit > 1, blockIdx.z also picks
// which head_dim slice of dK, dV (and dQ) this block accumulates; Sᵀ and dPᵀ are recomputed per slice.
template <class Cfg>
struct BwdDkdvSm80 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;

  static constexpr bool kAtomicDq = Cfg::kAtomicDq;
  static constexpr BwdDkdvTraits kTraits = bwd_dkdv_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarps,
                                                           Cfg::kStages, Cfg::kDSplit, kAtomicDq);
  static_assert(kTraits.error == nullptr, "invalid backward config: see bwd_dkdv_traits() in bwd_traits.cuh");
  static_assert(Cfg::kPadRows == 1, "the sm80 family indexes LSE and D by seqlen_q: its workspace is unpadded");
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)

  static constexpr ElemType kElem = Cfg::kElem;
  using Variant = typename Cfg::Variant;
  static constexpr int kThreads = kTraits.threads;
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kDSplit = Cfg::kDSplit;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kHeadDimPad = kTraits.head_dim_pad;
  static constexpr int kRow = kTraits.smem_row_elems;
  static constexpr int kDsRow = kTraits.ds_row_elems;
  static constexpr int kKeyTiles = kTraits.key_tiles;     // 16-key tiles per warp
  static constexpr int kWarpKeys = 16 * kKeyTiles;
  static constexpr int kQTiles = kBlockM / 8;             // 8-query column tiles of Sᵀ
  static constexpr int kKSteps = kHeadDimPad / 16;        // k-steps of Sᵀ = K Qᵀ
  static constexpr int kTiles16 = kHeadDimPad / 16;       // 16-column tiles of a head
  static constexpr int kSliceTiles = kTraits.slice_tiles; // 16-column tiles of this block's dK/dV slice
  static constexpr int kDqMTiles = kBlockM / 16;
  static constexpr int kDqItems = kTraits.dq_items;
  static constexpr int kDqPartTiles = kTraits.dq_part_tiles;
  static constexpr u32 kKvTileBytes = kBlockN * kRow * 2;
  static constexpr u32 kQTileBytes = kBlockM * kRow * 2;
  static constexpr u32 kStageBytes = kTraits.smem_stage_bytes;
  using Copy = sm80::TileCopy<kThreads, kRow, kHeadDimPad / 8, kHeadDim / 8>;
  using L = bwd::Lanes<kRow>;

  // Whether 16-column tile `tile` of the head exists: slices round up, so the last one may run short.
  static __device__ __forceinline__ bool tile_exists(int tile) { return kDSplit == 1 || tile < kTiles16; }

  // blockIdx: (key block; key/value head; batch entry or packed sequence, times the head_dim slices).
  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z / kDSplit, Cfg::kHeadDim, Cfg::kPadRows);
      if (static_cast<int>(blockIdx.x) * kBlockN >= p.seqlen_k) return;  // past the sequence's keys
      run_block(p);
    } else {
      run_block(params);
    }
  }

  static __device__ void run_block(const AttnBwdParams& p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // K (kBlockN, kRow) | V (kBlockN, kRow) | kStages x [Q (kBlockM, kRow) | dO | LSE (kBlockM) | D (kBlockM)]
    // | 2 x dSᵀ (kBlockN, kDsRow), keys x queries, atomic strategy only.
    const u32 sk_addr = sm80::smem_addr(smem_raw);
    const u32 sv_addr = sk_addr + kKvTileBytes;
    const u32 stage_addr = sv_addr + kKvTileBytes;
    const u32 sds_addr = stage_addr + kStages * kStageBytes;
    u16* sds = reinterpret_cast<u16*>(smem_raw + 2 * kKvTileBytes + kStages * kStageBytes);

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int n_start = blockIdx.x * kBlockN;
    const int kv_head = blockIdx.y;
    const int batch = blockIdx.z / kDSplit;
    const int slice_tile0 = (blockIdx.z % kDSplit) * kSliceTiles;  // first 16-column tile of the slice

    const u16* k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const u16* v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    const u16* q_batch = static_cast<const u16*>(p.q) + batch * p.q_batch_stride;
    const u16* do_batch = static_cast<const u16*>(p.dout) + batch * p.do_batch_stride;
    const int rows_k = min(kBlockN, p.seqlen_k - n_start);

    // Query blocks that see some key of this block: [m_first, m_blocks). Blocks [m_interior, m_interior_end)
    // see every key of it, so their loop carries no mask code (block_range.cuh).
    const QueryBlocks<Variant, kBlockM, kBlockN> queries(p, batch, n_start, [&] { return rows_k; }, kv_head);
    const int m_blocks = queries.end;
    const int m_first = queries.begin;
    const int m_interior = queries.full_begin;
    const int m_interior_end = queries.full_end;
    const int per_head = m_blocks - m_first;
    const int iterations = per_head * p.group_size;

    // Ring stage of iteration `it`: Q and dO tiles of its query block plus LSE and D of its rows.
    auto load_stage = [&](int it) {
      if (it >= iterations) return;
      const int head = kv_head * p.group_size + it / per_head;
      const int m_start = (m_first + it % per_head) * kBlockM;
      const int rows_valid = min(kBlockM, p.seqlen_q - m_start);
      const u32 st = stage_addr + (it % kStages) * kStageBytes;
      const u16* q = q_batch + head * p.q_head_stride;
      const u16* dout = do_batch + head * p.do_head_stride;
      Copy::template load<kBlockM>(st, q + m_start * p.q_row_stride, p.q_row_stride, rows_valid, q, tid);
      Copy::template load<kBlockM>(st + kQTileBytes, dout + m_start * p.do_row_stride, p.do_row_stride, rows_valid,
                                   dout, tid);
      const long long flat = row_base<kVarlen>(p, batch, head, p.seqlen_q);
      for (int i = tid; i < kBlockM; i += kThreads) {
        const bool valid = i < rows_valid;
        const long long row = valid ? flat + m_start + i : flat;
        sm80::cp_async_4(st + 2 * kQTileBytes + i * 4, p.lse + row, valid);
        sm80::cp_async_4(st + 2 * kQTileBytes + (kBlockM + i) * 4, p.dsum + row, valid);
      }
    };

    // Prologue: K, V and the first stage in one group, then kStages - 2 more stages (empty groups keep
    // the count uniform so the wait in the loop is a constant).
    Copy::template load<kBlockN>(sk_addr, k + n_start * p.k_row_stride, p.k_row_stride, rows_k, k, tid);
    Copy::template load<kBlockN>(sv_addr, v + n_start * p.v_row_stride, p.v_row_stride, rows_k, v, tid);
    load_stage(0);
    sm80::cp_async_commit();
#pragma unroll
    for (int s = 1; s < kStages - 1; ++s) {
      load_stage(s);
      sm80::cp_async_commit();
    }

    float acc_dk[kKeyTiles][kSliceTiles * 2][4];  // (kWarpKeys, slice) fp32 in (16, 8) accumulator tiles
    float acc_dv[kKeyTiles][kSliceTiles * 2][4];
#pragma unroll
    for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
      for (int dt = 0; dt < kSliceTiles * 2; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[kt][dt][e] = acc_dv[kt][dt][e] = 0.f;

    const int warp_key0 = warp * kWarpKeys;  // relative to n_start
    const u32 k_lane = sk_addr + warp_key0 * kRow * 2 + L::a(lane);
    const u32 v_lane = sv_addr + warp_key0 * kRow * 2 + L::a(lane);
    const u32 b_lane = L::b(lane);
    const u32 bt_lane = L::b_trans(lane);

    // Sᵀ-shaped product for this warp's keys: acc = X Yᵀ with X = K or V rows (A), Y = Q or dO (B).
    auto product_t = [&](float (&acc)[kKeyTiles][kQTiles][4], u32 x_lane, u32 y_tile) {
      auto load_x = [&](int kt, int kk, u32(&a)[4]) { sm80::ldmatrix_x4(a, x_lane + (kt * 16 * kRow + kk * 16) * 2); };
      sm80::qk_product<kElem, kKSteps, kRow>(acc, load_x, y_tile, b_lane);
    };

    // acc (keys, slice) += frag (keys, queries) · Y (queries, slice), Y = dO or Q read transposed.
    auto accumulate_slice = [&](float (&acc)[kKeyTiles][kSliceTiles * 2][4],
                                const u32 (&frag)[kKeyTiles][kQTiles / 2][4], u32 y_tile) {
#pragma unroll
      for (int j = 0; j < kQTiles / 2; ++j)
#pragma unroll
        for (int dp = 0; dp < kSliceTiles; ++dp) {
          if (!tile_exists(slice_tile0 + dp)) continue;
          u32 b[4];
          sm80::ldmatrix_x4_trans(b, y_tile + bt_lane + (j * 16 * kRow + (slice_tile0 + dp) * 16) * 2);
#pragma unroll
          for (int kt = 0; kt < kKeyTiles; ++kt) {
            sm80::mma_16816<kElem>(acc[kt][2 * dp], frag[kt][j], b[0], b[1]);
            sm80::mma_16816<kElem>(acc[kt][2 * dp + 1], frag[kt][j], b[2], b[3]);
          }
        }
    };

    // dQ (queries, slice) += dS K for step `it`, whose dSᵀ every warp stored before a barrier since,
    // added to the fp32 accumulator with reductions. Runs at the start of step it + 1 (after its
    // barrier) or after the loop: the dSᵀ tiles alternate, so no barrier of its own is needed.
    auto dq_update = [&](int it, int head, int m_start) {
      const u32 sds_step = sds_addr + (it % 2) * kBlockN * kDsRow * 2;
      const long long flat = row_base<kVarlen>(p, batch, head, p.seqlen_q);
#pragma unroll
      for (int item_i = 0; item_i < kDqItems; ++item_i) {
        const int item = warp + item_i * kWarps;
        const int mi = item % kDqMTiles;
        const int part_tile0 = slice_tile0 + (item / kDqMTiles) * kDqPartTiles;
        const int part_end = min(slice_tile0 + kSliceTiles, kTiles16);
        float acc_dq[kDqPartTiles * 2][4];
#pragma unroll
        for (int c = 0; c < kDqPartTiles * 2; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_dq[c][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks) {
          u32 a[4];
          sm80::ldmatrix_x4_trans(a, sds_step + bwd::Lanes<kDsRow>::a_trans(lane) + (ks * 16 * kDsRow + mi * 16) * 2);
#pragma unroll
          for (int c = 0; c < kDqPartTiles; ++c) {
            if (part_tile0 + c >= part_end) continue;
            u32 b[4];
            sm80::ldmatrix_x4_trans(b, sk_addr + bt_lane + (ks * 16 * kRow + (part_tile0 + c) * 16) * 2);
            sm80::mma_16816<kElem>(acc_dq[2 * c], a, b[0], b[1]);
            sm80::mma_16816<kElem>(acc_dq[2 * c + 1], a, b[2], b[3]);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m_start + mi * 16 + g + h * 8;
          if (row >= p.seqlen_q) continue;
          float* dst = p.dq_accum + (flat + row) * kHeadDim;
#pragma unroll
          for (int c = 0; c < kDqPartTiles * 2; ++c) {
            const int col = (part_tile0 * 2 + c) * 8 + 2 * t;
            if (part_tile0 + c / 2 >= part_end || col >= kHeadDim) continue;
            sm80::atomic_add_f32x2(dst + col, acc_dq[c][2 * h], acc_dq[c][2 * h + 1]);
          }
        }
      }
    };
    int prev_head = 0;     // head and first query of the previous step, whose dQ update is pending
    int prev_m_start = 0;

    // One query block of one query head.
    auto step = [&](int it, int head, int m_start, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      sm80::cp_async_wait<kStages - 2>();  // this iteration's stage has landed
      __syncthreads();                     // ... for every thread; the previous stage is free and its dSᵀ
                                           // stored
      if constexpr (kAtomicDq) {
        if (it > 0) dq_update(it - 1, prev_head, prev_m_start);
        prev_head = head;
        prev_m_start = m_start;
      }

      const u32 st = stage_addr + (it % kStages) * kStageBytes;
      const u32 sq_tile = st;
      const u32 sdo_tile = st + kQTileBytes;
      const float* s_lse = reinterpret_cast<const float*>(smem_raw + (st - sk_addr) + 2 * kQTileBytes);
      const float* s_dsum = s_lse + kBlockM;

      float acc_s[kKeyTiles][kQTiles][4];  // Sᵀ, then Pᵀ
      product_t(acc_s, k_lane, sq_tile);

      load_stage(it + kStages - 1);  // refills the slot the previous iteration read
      sm80::cp_async_commit();

      float acc_dp[kKeyTiles][kQTiles][4];  // dPᵀ, then dSᵀ
      product_t(acc_dp, v_lane, sdo_tile);

      // Pᵀ = exp2(s * scale_log2 - lse2) with hidden entries at 0 (s: the variant's score);
      // dSᵀ = Pᵀ ∘ (dPᵀ - D), with respect to q·k.
#pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = qt * 8 + 2 * t + e;
          const float lse2 = bwd::lse_to_log2(s_lse[col]);
          const float dsum = s_dsum[col];
#pragma unroll
          for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float qk = acc_s[kt][qt][2 * h + e];
              const float scale_log2 = p.scale_log2;
              const ScoreAt at{batch, head, m_start + col, n_start + warp_key0 + kt * 16 + g + h * 8};
              const float x = bwd::scaled_score<Variant>(p, at, qk, scale_log2);
              float s = x;
              if constexpr (kMasked) bwd::hide_score<Variant>(p, at, s);
              const float pr = bwd::probability(s, lse2);
              acc_s[kt][qt][2 * h + e] = pr;
              acc_dp[kt][qt][2 * h + e] = bwd::score_gradient<Variant>(p, at, x, pr, acc_dp[kt][qt][2 * h + e], dsum);
            }
        }

      u32 p_frag[kKeyTiles][kQTiles / 2][4];
      u32 ds_frag[kKeyTiles][kQTiles / 2][4];
#pragma unroll
      for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
        for (int j = 0; j < kQTiles / 2; ++j) {
          sm80::pack_a<kElem>(p_frag[kt][j], acc_s[kt][2 * j], acc_s[kt][2 * j + 1]);
          sm80::pack_a<kElem>(ds_frag[kt][j], acc_dp[kt][2 * j], acc_dp[kt][2 * j + 1]);
        }

      accumulate_slice(acc_dv, p_frag, sdo_tile);
      accumulate_slice(acc_dk, ds_frag, sq_tile);

      if constexpr (kAtomicDq) {
        // dSᵀ to shared memory (keys x queries) for the next step's dQ update (dq_update).
        u16* sds_step = sds + (it % 2) * kBlockN * kDsRow;
#pragma unroll
        for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
          for (int j = 0; j < kQTiles / 2; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int row = warp_key0 + kt * 16 + g + (r & 1) * 8;
              const int col = j * 16 + (r >> 1) * 8 + 2 * t;
              *reinterpret_cast<u32*>(sds_step + row * kDsRow + col) = ds_frag[kt][j][r];
            }
      }
    };

    int it = 0;
    for (int head = kv_head * p.group_size; head < (kv_head + 1) * p.group_size; ++head) {
      for (int mb = m_first; mb < m_interior; ++mb, ++it) step(it, head, mb * kBlockM, sm80::BoolConstant<true>{});
      for (int mb = m_interior; mb < m_interior_end; ++mb, ++it) {
        step(it, head, mb * kBlockM, sm80::BoolConstant<false>{});
      }
      for (int mb = m_interior_end; mb < m_blocks; ++mb, ++it) step(it, head, mb * kBlockM, sm80::BoolConstant<true>{});
    }
    sm80::cp_async_wait<0>();
    if constexpr (kAtomicDq) {
      if (it > 0) {
        __syncthreads();  // the last step's dSᵀ is stored
        dq_update(it - 1, prev_head, prev_m_start);
      }
    }

    // Epilogue: dK = scale * acc_dk; keys no query sees get zeros.
    u16* dk = static_cast<u16*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride;
    u16* dv = static_cast<u16*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride;
#pragma unroll
    for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = n_start + warp_key0 + kt * 16 + g + h * 8;
        if (row >= p.seqlen_k) continue;
#pragma unroll
        for (int dt = 0; dt < kSliceTiles * 2; ++dt) {
          const int col = (slice_tile0 * 2 + dt) * 8 + 2 * t;
          if (col >= kHeadDim) continue;
          *reinterpret_cast<u32*>(dk + row * p.dk_row_stride + col) =
              sm80::pack2<kElem>(acc_dk[kt][dt][2 * h] * p.scale, acc_dk[kt][dt][2 * h + 1] * p.scale);
          *reinterpret_cast<u32*>(dv + row * p.dv_row_stride + col) =
              sm80::pack2<kElem>(acc_dv[kt][dt][2 * h], acc_dv[kt][dt][2 * h + 1]);
        }
      }
  }
};

// dQ of one block of kBlockM queries of one head, deterministic: the block walks the visible key
// blocks through a K/V ring (as the forward does), recomputes P and dP, and accumulates dQ = dS K in
// registers; nothing is added atomically, so repeated runs give identical bits. Also the dq kernel of
// the sm90 family's deterministic strategy, whose workspace rows are padded (bwd_rows.cuh).
template <class Cfg>
struct BwdDqSm80 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;

  static constexpr BwdDqTraits kTraits =
      bwd_dq_traits(Cfg::kHeadDim, Cfg::kDqBlockM, Cfg::kDqBlockN, Cfg::kDqWarps, Cfg::kDqStages);
  static_assert(kTraits.error == nullptr, "invalid backward dq config: see bwd_dq_traits() in bwd_traits.cuh");

  static constexpr ElemType kElem = Cfg::kElem;
  using Variant = typename Cfg::Variant;
  static constexpr int kThreads = kTraits.threads;
  static constexpr int kBlockM = Cfg::kDqBlockM;
  static constexpr int kBlockN = Cfg::kDqBlockN;
  static constexpr int kStages = Cfg::kDqStages;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kHeadDimPad = kTraits.head_dim_pad;
  static constexpr int kRow = kTraits.smem_row_elems;
  static constexpr int kMTiles = kTraits.m_tiles;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDimPad / 8;
  static constexpr int kKSteps = kHeadDimPad / 16;
  static constexpr u32 kQTileBytes = kBlockM * kRow * 2;
  static constexpr u32 kKvTileBytes = kBlockN * kRow * 2;
  using Copy = sm80::TileCopy<kThreads, kRow, kHeadDimPad / 8, kHeadDim / 8>;
  using L = bwd::Lanes<kRow>;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)

  // blockIdx: (query block, highest first; query head; batch entry or packed sequence).
  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z, kHeadDim, Cfg::kPadRows);
      if (static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlockM >= p.seqlen_q) return;  // past its queries
      run_block(p);
    } else {
      run_block(params);
    }
  }

  static __device__ void run_block(const AttnBwdParams& p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // Q (kBlockM, kRow) | dO (kBlockM, kRow) | LSE (kBlockM) | D (kBlockM) | kStages x [K | V (kBlockN, kRow)]
    const u32 sq_addr = sm80::smem_addr(smem_raw);
    const u32 sdo_addr = sq_addr + kQTileBytes;
    const u32 lse_addr = sdo_addr + kQTileBytes;
    const u32 skv_addr = lse_addr + 2 * kBlockM * 4;
    const float* s_lse = reinterpret_cast<const float*>(smem_raw + 2 * kQTileBytes);
    const float* s_dsum = s_lse + kBlockM;

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int m_start = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // longest causal blocks first
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.group_size;

    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
    const u16* dout = static_cast<const u16*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
    const u16* k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const u16* v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    const long long flat = row_base<kVarlen>(p, batch, head, p.seqlen_q);                      // the forward's LSE
    const long long dsum_flat = row_base<kVarlen>(p, batch, head, bwd::padded_rows<Cfg>(p));  // the workspace's D

    const int rows_q = min(kBlockM, p.seqlen_q - m_start);
    const KeyBlocks<Variant, kBlockN> blocks(p, batch, m_start, rows_q, head);  // block_range.cuh
    const int n_end = blocks.key_end;
    const int n_begin = blocks.begin;
    const int n_blocks = blocks.end;

    auto load_kv = [&](int n_block) {
      const u32 sk = skv_addr + (n_block % kStages) * 2 * kKvTileBytes;
      const int n_start = n_block * kBlockN;
      const int rows_valid = min(kBlockN, n_end - n_start);
      Copy::template load<kBlockN>(sk, k + n_start * p.k_row_stride, p.k_row_stride, rows_valid, k, tid);
      Copy::template load<kBlockN>(sk + kKvTileBytes, v + n_start * p.v_row_stride, p.v_row_stride, rows_valid, v,
                                   tid);
    };

    Copy::template load<kBlockM>(sq_addr, q + m_start * p.q_row_stride, p.q_row_stride, rows_q, q, tid);
    Copy::template load<kBlockM>(sdo_addr, dout + m_start * p.do_row_stride, p.do_row_stride, rows_q, dout, tid);
    for (int i = tid; i < kBlockM; i += kThreads) {
      const bool valid = i < rows_q;
      const int row = valid ? m_start + i : 0;
      sm80::cp_async_4(lse_addr + i * 4, p.lse + flat + row, valid);
      sm80::cp_async_4(lse_addr + (kBlockM + i) * 4, p.dsum + dsum_flat + row, valid);
    }
    sm80::cp_async_commit();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      load_kv(n_begin + s);
      sm80::cp_async_commit();
    }

    float acc_dq[kMTiles][kDTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[mt][dt][e] = 0.f;

    const int warp_row0 = warp * kWarpRows;  // relative to m_start
    const u32 q_lane = sq_addr + warp_row0 * kRow * 2 + L::a(lane);
    const u32 do_lane = sdo_addr + warp_row0 * kRow * 2 + L::a(lane);
    const u32 b_lane = L::b(lane);
    const u32 bt_lane = L::b_trans(lane);
    float lse2[kMTiles][2];  // loaded once the first wait has landed Q's group
    float dsum[kMTiles][2];
    bool row_state_loaded = false;

    // acc (rows, keys) = X Yᵀ: X = Q or dO (A, this warp's rows), Y = K or V (B).
    auto product = [&](float (&acc)[kMTiles][kNTiles][4], u32 x_lane, u32 y_tile) {
      auto load_x = [&](int mt, int kk, u32(&a)[4]) { sm80::ldmatrix_x4(a, x_lane + (mt * 16 * kRow + kk * 16) * 2); };
      sm80::qk_product<kElem, kKSteps, kRow>(acc, load_x, y_tile, b_lane);
    };

    auto step = [&](int n_block, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      sm80::cp_async_wait<kStages - 2>();
      __syncthreads();
      if (!row_state_loaded) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = warp_row0 + mt * 16 + g + h * 8;
            lse2[mt][h] = bwd::lse_to_log2(s_lse[r]);
            dsum[mt][h] = s_dsum[r];
          }
        row_state_loaded = true;
      }

      const u32 sk = skv_addr + (n_block % kStages) * 2 * kKvTileBytes;
      const u32 sv = sk + kKvTileBytes;
      float acc_s[kMTiles][kNTiles][4];
      product(acc_s, q_lane, sk);

      load_kv(n_block + kStages - 1);
      sm80::cp_async_commit();

      float acc_dp[kMTiles][kNTiles][4];
      product(acc_dp, do_lane, sv);

      const int n_start = n_block * kBlockN;
      u32 ds_frag[kMTiles][kNTiles / 2][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m_start + warp_row0 + mt * 16 + g + h * 8;
          const auto keys = Variant::row_keys(p, batch, head, row, p.seqlen_k - 1, n_start + 2 * t);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const ScoreAt at{batch, head, row, n_start + 2 * t + nt * 8 + e};
              const float x = bwd::scaled_score<Variant>(p, at, acc_s[mt][nt][2 * h + e]);
              float s = x;
              if (kMasked && keys.hidden(nt * 8 + e)) s = neg_inf();
              const float pr = bwd::probability(s, lse2[mt][h]);
              acc_dp[mt][nt][2 * h + e] =
                  bwd::score_gradient<Variant>(p, at, x, pr, acc_dp[mt][nt][2 * h + e], dsum[mt][h]);
            }
        }
        sm80::pack_a_steps<kElem, kNTiles / 2>(ds_frag[mt], acc_dp[mt]);
      }

      // dQ += dS K: keys are the k dimension; K tiles are read transposed.
#pragma unroll
      for (int j = 0; j < kNTiles / 2; ++j)
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          u32 b[4];
          sm80::ldmatrix_x4_trans(b, sk + bt_lane + (j * 16 * kRow + dp * 16) * 2);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            sm80::mma_16816<kElem>(acc_dq[mt][2 * dp], ds_frag[mt][j], b[0], b[1]);
            sm80::mma_16816<kElem>(acc_dq[mt][2 * dp + 1], ds_frag[mt][j], b[2], b[3]);
          }
        }
    };

    const int full_end = blocks.full_end(p, batch, m_start);
    visit_key_blocks(n_begin, blocks.full_begin(p, batch, m_start + rows_q - 1, full_end), full_end, n_blocks, step);
    sm80::cp_async_wait<0>();

    u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m_start + warp_row0 + mt * 16 + g + h * 8;
        if (row >= p.seqlen_q) continue;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          const int col = dt * 8 + 2 * t;
          if (col >= kHeadDim) continue;
          *reinterpret_cast<u32*>(dq + row * p.dq_row_stride + col) =
              sm80::pack2<kElem>(acc_dq[mt][dt][2 * h] * p.scale, acc_dq[mt][dt][2 * h + 1] * p.scale);
        }
      }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` compile this template on its own for a default config.
struct FlashgenDefaultBwdConfig {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kBFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = 4;
  static constexpr int kStages = 2;
  static constexpr int kDSplit = 1;
  static constexpr bool kAtomicDq = true;
  static constexpr flashgen::DqAccum kDqAccum = flashgen::DqAccum::kRows;
  static constexpr int kDqBlockM = 64;
  static constexpr int kDqBlockN = 64;
  static constexpr int kDqWarps = 4;
  static constexpr int kDqStages = 2;
  static constexpr int kPadRows = 1;
};

extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm80_standalone_preprocess(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdPreprocess<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::BwdDkdvSm80<FlashgenDefaultBwdConfig>::kThreads, 1)
    bwd_sm80_standalone_dkdv(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdDkdvSm80<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::BwdDqSm80<FlashgenDefaultBwdConfig>::kThreads, 1)
    bwd_sm80_standalone_dq(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdDqSm80<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm80_standalone_convert(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdConvertDq<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm80_standalone_sink_grad(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdSinkGrad<FlashgenDefaultBwdConfig>::run(params);
}
#endif
