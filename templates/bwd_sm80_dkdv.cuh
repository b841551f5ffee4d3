// The sm80 backward's dkdv kernel (bwd_sm80.cuh has the family's notation).
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "bwd_rows.cuh"
#include "bwd_scores.cuh"
#include "bwd_sm80_lanes.cuh"
#include "bwd_traits.cuh"
#include "sm80_attend.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"
#include "tile_copy.cuh"
#include "variant.cuh"

namespace flashgen {

// dK and dV (and, for the atomic strategy, dQ contributions) of one block of kBlockN keys of one
// kv head, over every query block of every query head in the head's group. Each warp owns 16 *
// kKeyTiles keys: it computes Sᵀ and dPᵀ for them against the whole query block, so Pᵀ and dSᵀ stay in
// registers as the A operands of dV += Pᵀ dO and dK += dSᵀ Q. With kDSplit > 1, blockIdx.z also picks
// which slice of dK's and dQ's head_dim columns and of dV's head_dim_v columns this block accumulates; Sᵀ and
// dPᵀ are recomputed per slice.
template <class Cfg>
struct BwdDkdvSm80 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;

  static constexpr bool kAtomicDq = Cfg::kAtomicDq;
  static constexpr BwdDkdvTraits kTraits = bwd_dkdv_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarps,
                                                           Cfg::kStages, Cfg::kDSplit, kAtomicDq,
                                                           ConfigHeadDimV<Cfg>::value);
  static_assert(kTraits.error == nullptr, "invalid backward config: see bwd_dkdv_traits() in bwd_traits.cuh");
  static_assert(Cfg::kPadRows == 1, "the sm80 family indexes LSE and D by seqlen_q: its workspace is unpadded");
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)
  // The sinks' gradient summed over this kernel's scores, which see each (query, key) pair once (bwd_rows.cuh).
  static constexpr bool kSinkGrad = ConfigSinkGrad<Cfg>::value;

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
  static constexpr int kSliceTiles = kTraits.slice_tiles; // 16-column tiles of this block's dK slice
  // The values' (V, dO, dV) columns: head_dim's, or the config's own (MLA's d_v), with their own pitch.
  static constexpr int kHeadDimV = ConfigHeadDimV<Cfg>::value;
  static constexpr int kHeadDimVPad = kTraits.head_dim_v_pad;
  static constexpr int kRowV = kTraits.smem_row_elems_v;
  static constexpr int kKStepsV = kHeadDimVPad / 16;          // k-steps of dPᵀ = V dOᵀ
  static constexpr int kTiles16V = kHeadDimVPad / 16;
  static constexpr int kSliceTilesV = kTraits.slice_tiles_v;  // 16-column tiles of this block's dV slice
  static constexpr int kDqMTiles = kBlockM / 16;
  static constexpr int kDqItems = kTraits.dq_items;
  static constexpr int kDqPartTiles = kTraits.dq_part_tiles;
  static constexpr u32 kKTileBytes = kBlockN * kRow * 2;
  static constexpr u32 kVTileBytes = kBlockN * kRowV * 2;
  static constexpr u32 kQTileBytes = kBlockM * kRow * 2;
  static constexpr u32 kDoTileBytes = kBlockM * kRowV * 2;
  static constexpr u32 kQRowsBytes = kQTileBytes + kDoTileBytes;  // a stage's Q and dO tiles, before its LSE and D
  static constexpr u32 kStageBytes = kTraits.smem_stage_bytes;
  using Copy = sm80::TileCopy<kThreads, kRow, kHeadDimPad / 8, kHeadDim / 8>;
  using CopyV = sm80::TileCopy<kThreads, kRowV, kHeadDimVPad / 8, kHeadDimV / 8>;
  using L = bwd::Lanes<kRow>;
  using LV = bwd::Lanes<kRowV>;

  // Whether 16-column tile `tile` of the head (kValues: of the values) exists: slices round up, so the last one
  // may run short.
  template <bool kValues = false>
  static __device__ __forceinline__ bool tile_exists(int tile) {
    return kDSplit == 1 || tile < (kValues ? kTiles16V : kTiles16);
  }

  // blockIdx: (key block; key/value head; batch entry or packed sequence, times the head_dim slices).
  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z / kDSplit, Cfg::kHeadDim, Cfg::kPadRows);
      if (static_cast<int>(blockIdx.x) * kBlockN >= p.seqlen_k) return;  // past the sequence's keys
      run_block(p, params);
    } else {
      run_block(params, params);
    }
  }

  // One run_block() call's key block and this thread's place in it, with the pieces of a step and the epilogue
  // that need no more: dV and dK's products, the scores' Pᵀ and dSᵀ, the atomic strategy's dQ update, the stores.
  struct KeyBlock {
    const AttnBwdParams& p;
    u32 sk_addr;   // K (kBlockN, kRow)
    u32 sds_addr;  // 2 x dSᵀ (kBlockN, kDsRow), atomic strategy only
    int warp, lane, g, t;
    int n_start, kv_head, batch;
    int slice_tile0;    // first 16-column tile of the slice
    int slice_tile0_v;  // ... of the values' slice
    int warp_key0;      // this warp's first key, relative to n_start
    u32 bt_lane;
    u32 bt_lane_v;      // bt_lane in the values' pitch

    // acc (keys, slice) += frag (keys, queries) · Y (queries, slice), Y = dO (kValues) or Q read transposed.
    template <bool kValues>
    __device__ __forceinline__ void accumulate_slice(
        float (&acc)[kKeyTiles][(kValues ? kSliceTilesV : kSliceTiles) * 2][4],
        const u32 (&frag)[kKeyTiles][kQTiles / 2][4], u32 y_tile) const {
      constexpr int kSlice = kValues ? kSliceTilesV : kSliceTiles;
      constexpr int kPitch = kValues ? kRowV : kRow;
      const int tile0 = kValues ? slice_tile0_v : slice_tile0;
      const u32 y_lane = kValues ? bt_lane_v : bt_lane;
#pragma unroll
      for (int j = 0; j < kQTiles / 2; ++j)
#pragma unroll
        for (int dp = 0; dp < kSlice; ++dp) {
          if (!tile_exists<kValues>(tile0 + dp)) continue;
          u32 b[4];
          sm80::ldmatrix_x4_trans(b, y_tile + y_lane + (j * 16 * kPitch + (tile0 + dp) * 16) * 2);
#pragma unroll
          for (int kt = 0; kt < kKeyTiles; ++kt) {
            sm80::mma_16816<kElem>(acc[kt][2 * dp], frag[kt][j], b[0], b[1]);
            sm80::mma_16816<kElem>(acc[kt][2 * dp + 1], frag[kt][j], b[2], b[3]);
          }
        }
    }

    // dQ (queries, slice) += dS K for step `it`, whose dSᵀ every warp stored before a barrier since,
    // added to the fp32 accumulator with reductions. Runs at the start of step it + 1 (after its
    // barrier) or after the loop: the dSᵀ tiles alternate, so no barrier of its own is needed.
    __device__ __forceinline__ void dq_update(int it, int head, int m_start) const {
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
    }

    // Pᵀ = exp2(s * scale_log2 - lse2) with hidden entries at 0 (s: the variant's score), in place of Sᵀ;
    // dSᵀ = Pᵀ ∘ (dPᵀ - D), with respect to q·k, in place of dPᵀ. s_lse, s_dsum: the stage's LSE and D.
    template <class Masked>
    __device__ __forceinline__ void scores(float (&acc_s)[kKeyTiles][kQTiles][4],
                                           float (&acc_dp)[kKeyTiles][kQTiles][4], const float* s_lse,
                                           const float* s_dsum, int head, int m_start, Masked masked,
                                           float& sink_sum) const {
      constexpr bool kMasked = decltype(masked)::value;
      [[maybe_unused]] float sink_log2 = 0.f;  // the head's sink in base-2 units (kSinkGrad)
      if constexpr (kSinkGrad) sink_log2 = p.variant.sinks[head] * 1.4426950408889634f;
      // Key row (kt, h)'s hidden queries, at offsets from the thread's first column m_start + 2t.
      using Queries = decltype(bwd::key_queries<Variant>(p, batch, head, 0, 0));
      Queries queries[kKeyTiles][2];
      if constexpr (kMasked) {
#pragma unroll
        for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            queries[kt][h] = bwd::key_queries<Variant>(p, batch, head, n_start + warp_key0 + kt * 16 + g + h * 8,
                                                       m_start + 2 * t);
      }
#pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = qt * 8 + 2 * t + e;
          const float lse2 = bwd::lse_to_log2(s_lse[col]);
          const float dsum = s_dsum[col];
          [[maybe_unused]] float row_sum = 0.f;  // Σ P · dP over this thread's keys of query col (kSinkGrad)
#pragma unroll
          for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float qk = acc_s[kt][qt][2 * h + e];
              const float scale_log2 = p.variant.scale_log2;
              const ScoreAt at{batch, head, m_start + col, n_start + warp_key0 + kt * 16 + g + h * 8};
              const float x = bwd::scaled_score<Variant>(p, at, qk, scale_log2);
              const float s = kMasked && queries[kt][h].hidden(qt * 8 + e) ? neg_inf() : x;
              const float pr = bwd::probability(s, lse2);
              acc_s[kt][qt][2 * h + e] = pr;
              const float dp = acc_dp[kt][qt][2 * h + e];
              if constexpr (kSinkGrad) row_sum += pr * dp;
              acc_dp[kt][qt][2 * h + e] = bwd::score_gradient<Variant>(p, at, x, pr, dp, dsum);
            }
          if constexpr (kSinkGrad) sink_sum += bwd::sink_probability(sink_log2, lse2) * row_sum;
        }
    }

    // Epilogue: dK = scale * acc_dk over head_dim's slice, dV over head_dim_v's; keys no query sees get zeros.
    __device__ __forceinline__ void store_dkdv(const float (&acc_dk)[kKeyTiles][kSliceTiles * 2][4],
                                               const float (&acc_dv)[kKeyTiles][kSliceTilesV * 2][4]) const {
      u16* dk = static_cast<u16*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride;
      u16* dv = static_cast<u16*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride;
#pragma unroll
      for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = n_start + warp_key0 + kt * 16 + g + h * 8;
          if (row >= p.seqlen_k) continue;
#pragma unroll
          for (int dt = 0; dt < (kSliceTiles > kSliceTilesV ? kSliceTiles : kSliceTilesV) * 2; ++dt) {
            const int col = (slice_tile0 * 2 + dt) * 8 + 2 * t;
            const int col_v = (slice_tile0_v * 2 + dt) * 8 + 2 * t;
            if (dt < kSliceTiles * 2 && col < kHeadDim) {
              *reinterpret_cast<u32*>(dk + row * p.dk_row_stride + col) = sm80::pack2<kElem>(
                  acc_dk[kt][dt][2 * h] * p.variant.scale, acc_dk[kt][dt][2 * h + 1] * p.variant.scale);
            }
            if (dt < kSliceTilesV * 2 && col_v < kHeadDimV) {
              *reinterpret_cast<u32*>(dv + row * p.dv_row_stride + col_v) =
                  sm80::pack2<kElem>(acc_dv[kt][dt][2 * h], acc_dv[kt][dt][2 * h + 1]);
            }
          }
        }
    }
  };

  // p: the block's sequence's params; unbound: the call's (the same for a dense batch).
  static __device__ void run_block(const AttnBwdParams& p, const AttnBwdParams& unbound) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // K (kBlockN, kRow) | V (kBlockN, kRowV) | kStages x [Q (kBlockM, kRow) | dO (kBlockM, kRowV) | LSE (kBlockM)
    // | D (kBlockM)] | 2 x dSᵀ (kBlockN, kDsRow), keys x queries, atomic strategy only.
    const u32 sk_addr = sm80::smem_addr(smem_raw);
    const u32 sv_addr = sk_addr + kKTileBytes;
    const u32 stage_addr = sv_addr + kVTileBytes;
    const u32 sds_addr = stage_addr + kStages * kStageBytes;
    u16* sds = reinterpret_cast<u16*>(smem_raw + kKTileBytes + kVTileBytes + kStages * kStageBytes);

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int n_start = blockIdx.x * kBlockN;
    const int kv_head = blockIdx.y;
    const int batch = blockIdx.z / kDSplit;
    const int slice_tile0 = (blockIdx.z % kDSplit) * kSliceTiles;     // first 16-column tile of the slice
    const int slice_tile0_v = (blockIdx.z % kDSplit) * kSliceTilesV;  // ... of the values' slice

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
      CopyV::template load<kBlockM>(st + kQTileBytes, dout + m_start * p.do_row_stride, p.do_row_stride, rows_valid,
                                    dout, tid);
      const long long flat = row_base<kVarlen>(p, batch, head, p.seqlen_q);
      for (int i = tid; i < kBlockM; i += kThreads) {
        const bool valid = i < rows_valid;
        const long long row = valid ? flat + m_start + i : flat;
        sm80::cp_async_4(st + kQRowsBytes + i * 4, p.lse + row, valid);
        sm80::cp_async_4(st + kQRowsBytes + (kBlockM + i) * 4, p.dsum + row, valid);
      }
    };

    // Prologue: K, V and the first stage in one group, then kStages - 2 more stages (empty groups keep
    // the count uniform so the wait in the loop is a constant).
    Copy::template load<kBlockN>(sk_addr, k + n_start * p.k_row_stride, p.k_row_stride, rows_k, k, tid);
    CopyV::template load<kBlockN>(sv_addr, v + n_start * p.v_row_stride, p.v_row_stride, rows_k, v, tid);
    load_stage(0);
    sm80::cp_async_commit();
#pragma unroll
    for (int s = 1; s < kStages - 1; ++s) {
      load_stage(s);
      sm80::cp_async_commit();
    }

    float acc_dk[kKeyTiles][kSliceTiles * 2][4];  // (kWarpKeys, slice) fp32 in (16, 8) accumulator tiles
    float acc_dv[kKeyTiles][kSliceTilesV * 2][4];
#pragma unroll
    for (int kt = 0; kt < kKeyTiles; ++kt) {
#pragma unroll
      for (int dt = 0; dt < kSliceTiles * 2; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[kt][dt][e] = 0.f;
#pragma unroll
      for (int dt = 0; dt < kSliceTilesV * 2; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dv[kt][dt][e] = 0.f;
    }

    const int warp_key0 = warp * kWarpKeys;  // relative to n_start
    const u32 k_lane = sk_addr + warp_key0 * kRow * 2 + L::a(lane);
    const u32 v_lane = sv_addr + warp_key0 * kRowV * 2 + LV::a(lane);
    const u32 b_lane = L::b(lane);
    const u32 b_lane_v = LV::b(lane);
    const u32 bt_lane = L::b_trans(lane);
    const u32 bt_lane_v = LV::b_trans(lane);
    const KeyBlock block{p, sk_addr, sds_addr, warp, lane, g, t, n_start, kv_head, batch, slice_tile0,
                         slice_tile0_v, warp_key0, bt_lane, bt_lane_v};

    // Sᵀ-shaped product for this warp's keys: acc = X Yᵀ with X = K or V rows (A), Y = Q or dO (B), of k-steps
    // and pitch those of head_dim or (values) head_dim_v.
    auto product_t = [&](float (&acc)[kKeyTiles][kQTiles][4], u32 x_lane, u32 y_tile, auto values) {
      constexpr bool kValues = decltype(values)::value;
      constexpr int kPitch = kValues ? kRowV : kRow;
      auto load_x = [&](int kt, int kk, u32(&a)[4]) {
        sm80::ldmatrix_x4(a, x_lane + (kt * 16 * kPitch + kk * 16) * 2);
      };
      sm80::qk_product<kElem, kValues ? kKStepsV : kKSteps, kPitch>(acc, load_x, y_tile, kValues ? b_lane_v : b_lane);
    };

    int prev_head = 0;     // head and first query of the previous step, whose dQ update is pending
    float sink_sum = 0.f;  // this thread's Σ P_sink · P · dP over the current head's steps (kSinkGrad)
    int prev_m_start = 0;

    // One query block of one query head.
    auto step = [&](int it, int head, int m_start, auto masked) {
      sm80::cp_async_wait<kStages - 2>();  // this iteration's stage has landed
      __syncthreads();                     // ... for every thread; the previous stage is free and its dSᵀ
                                           // stored
      if constexpr (kAtomicDq) {
        if (it > 0) block.dq_update(it - 1, prev_head, prev_m_start);
        prev_head = head;
        prev_m_start = m_start;
      }

      const u32 st = stage_addr + (it % kStages) * kStageBytes;
      const u32 sq_tile = st;
      const u32 sdo_tile = st + kQTileBytes;
      const float* s_lse = reinterpret_cast<const float*>(smem_raw + (st - sk_addr) + kQRowsBytes);
      const float* s_dsum = s_lse + kBlockM;

      float acc_s[kKeyTiles][kQTiles][4];  // Sᵀ, then Pᵀ
      product_t(acc_s, k_lane, sq_tile, sm80::BoolConstant<false>{});

      load_stage(it + kStages - 1);  // refills the slot the previous iteration read
      sm80::cp_async_commit();

      float acc_dp[kKeyTiles][kQTiles][4];  // dPᵀ, then dSᵀ
      product_t(acc_dp, v_lane, sdo_tile, sm80::BoolConstant<true>{});

      block.scores(acc_s, acc_dp, s_lse, s_dsum, head, m_start, masked, sink_sum);

      u32 p_frag[kKeyTiles][kQTiles / 2][4];
      u32 ds_frag[kKeyTiles][kQTiles / 2][4];
#pragma unroll
      for (int kt = 0; kt < kKeyTiles; ++kt)
#pragma unroll
        for (int j = 0; j < kQTiles / 2; ++j) {
          sm80::pack_a<kElem>(p_frag[kt][j], acc_s[kt][2 * j], acc_s[kt][2 * j + 1]);
          sm80::pack_a<kElem>(ds_frag[kt][j], acc_dp[kt][2 * j], acc_dp[kt][2 * j + 1]);
        }

      block.template accumulate_slice<true>(acc_dv, p_frag, sdo_tile);
      block.template accumulate_slice<false>(acc_dk, ds_frag, sq_tile);

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
      // The warp's partial for this head (0 where it saw no score), written by the first head_dim slice alone: every
      // slice computes the same scores.
      if constexpr (kSinkGrad) {
        static_assert(ConfigSinkGrad<Cfg>::partial_warps == kWarps, "one sinks' gradient partial per warp");
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) sink_sum += __shfl_xor_sync(0xffffffffu, sink_sum, offset);
        if (lane == 0 && blockIdx.z % kDSplit == 0) {
          *bwd::sink_partial<Cfg>(unbound, head, batch, blockIdx.x, warp) = sink_sum;
        }
        sink_sum = 0.f;
      }
    }
    sm80::cp_async_wait<0>();
    if constexpr (kAtomicDq) {
      if (it > 0) {
        __syncthreads();  // the last step's dSᵀ is stored
        block.dq_update(it - 1, prev_head, prev_m_start);
      }
    }

    block.store_dkdv(acc_dk, acc_dv);
  }
};

}  // namespace flashgen
