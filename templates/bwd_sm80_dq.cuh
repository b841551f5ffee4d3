// The sm80 backward's dq kernel, the deterministic strategy's (bwd_sm80.cuh has the family's notation).
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

// dQ of one block of kBlockM queries of one head, deterministic: the block walks the visible key
// blocks through a K/V ring (as the forward does), recomputes P and dP, and accumulates dQ = dS K in
// registers; nothing is added atomically, so repeated runs give identical bits. Heads too wide for dQ's
// accumulators split its columns over blocks (kSlices, blockIdx.z), each recomputing S and dP.
template <class Cfg>
struct BwdDqSm80 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;

  static constexpr BwdDqTraits kTraits =
      bwd_dq_traits(Cfg::kHeadDim, Cfg::kDqBlockM, Cfg::kDqBlockN, Cfg::kDqWarps, Cfg::kDqStages,
                    ConfigHeadDimV<Cfg>::value);
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
  static constexpr int kSlices = kTraits.slices;
  static constexpr int kSliceTiles = kTraits.slice_tiles;  // 16-column tiles of this block's dQ slice
  static constexpr int kTiles16 = kHeadDimPad / 16;
  static constexpr int kKSteps = kHeadDimPad / 16;
  // The values' (V, dO) columns: head_dim's, or the config's own (MLA's d_v), with their own pitch.
  static constexpr int kHeadDimV = ConfigHeadDimV<Cfg>::value;
  static constexpr int kHeadDimVPad = kTraits.head_dim_v_pad;
  static constexpr int kRowV = kTraits.smem_row_elems_v;
  static constexpr int kKStepsV = kHeadDimVPad / 16;  // k-steps of dP = dO Vᵀ
  static constexpr u32 kQTileBytes = kBlockM * kRow * 2;
  static constexpr u32 kDoTileBytes = kBlockM * kRowV * 2;
  static constexpr u32 kKTileBytes = kBlockN * kRow * 2;
  static constexpr u32 kKvStageBytes = kTraits.smem_kv_stage_bytes;  // K tile, then V tile (kBlockN, kRowV)
  using Copy = sm80::TileCopy<kThreads, kRow, kHeadDimPad / 8, kHeadDim / 8>;
  using CopyV = sm80::TileCopy<kThreads, kRowV, kHeadDimVPad / 8, kHeadDimV / 8>;
  using L = bwd::Lanes<kRow>;
  using LV = bwd::Lanes<kRowV>;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)

  // blockIdx: (query block, highest first; query head; batch entry or packed sequence, times the dQ slices).
  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z / kSlices, kHeadDim, Cfg::kPadRows);
      if (static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlockM >= p.seqlen_q) return;  // past its queries
      run_block(p);
    } else {
      run_block(params);
    }
  }

  static __device__ void run_block(const AttnBwdParams& p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // Q (kBlockM, kRow) | dO (kBlockM, kRowV) | LSE (kBlockM) | D (kBlockM)
    // | kStages x [K (kBlockN, kRow) | V (kBlockN, kRowV)]
    const u32 sq_addr = sm80::smem_addr(smem_raw);
    const u32 sdo_addr = sq_addr + kQTileBytes;
    const u32 lse_addr = sdo_addr + kDoTileBytes;
    const u32 skv_addr = lse_addr + 2 * kBlockM * 4;
    const float* s_lse = reinterpret_cast<const float*>(smem_raw + (kQTileBytes + kDoTileBytes));
    const float* s_dsum = s_lse + kBlockM;

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int m_start = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // longest causal blocks first
    const int head = blockIdx.y;
    const int batch = blockIdx.z / kSlices;
    const int slice_tile0 = (blockIdx.z % kSlices) * kSliceTiles;  // first 16-column tile of the slice
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
      const u32 sk = skv_addr + (n_block % kStages) * kKvStageBytes;
      const int n_start = n_block * kBlockN;
      const int rows_valid = min(kBlockN, n_end - n_start);
      Copy::template load<kBlockN>(sk, k + n_start * p.k_row_stride, p.k_row_stride, rows_valid, k, tid);
      CopyV::template load<kBlockN>(sk + kKTileBytes, v + n_start * p.v_row_stride, p.v_row_stride, rows_valid, v,
                                    tid);
    };

    Copy::template load<kBlockM>(sq_addr, q + m_start * p.q_row_stride, p.q_row_stride, rows_q, q, tid);
    CopyV::template load<kBlockM>(sdo_addr, dout + m_start * p.do_row_stride, p.do_row_stride, rows_q, dout, tid);
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

    float acc_dq[kMTiles][kSliceTiles * 2][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kSliceTiles * 2; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[mt][dt][e] = 0.f;

    const int warp_row0 = warp * kWarpRows;  // relative to m_start
    const u32 q_lane = sq_addr + warp_row0 * kRow * 2 + L::a(lane);
    const u32 do_lane = sdo_addr + warp_row0 * kRowV * 2 + LV::a(lane);
    const u32 b_lane = L::b(lane);
    const u32 b_lane_v = LV::b(lane);
    const u32 bt_lane = L::b_trans(lane);
    float lse2[kMTiles][2];  // loaded once the first wait has landed Q's group
    float dsum[kMTiles][2];
    bool row_state_loaded = false;

    // acc (rows, keys) = X Yᵀ: X = Q or dO (A, this warp's rows), Y = K or V (B), of k-steps and pitch those of
    // head_dim or (values) head_dim_v.
    auto product = [&](float (&acc)[kMTiles][kNTiles][4], u32 x_lane, u32 y_tile, auto values) {
      constexpr bool kValues = decltype(values)::value;
      constexpr int kPitch = kValues ? kRowV : kRow;
      auto load_x = [&](int mt, int kk, u32(&a)[4]) {
        sm80::ldmatrix_x4(a, x_lane + (mt * 16 * kPitch + kk * 16) * 2);
      };
      sm80::qk_product<kElem, kValues ? kKStepsV : kKSteps, kPitch>(acc, load_x, y_tile, kValues ? b_lane_v : b_lane);
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

      const u32 sk = skv_addr + (n_block % kStages) * kKvStageBytes;
      const u32 sv = sk + kKTileBytes;
      float acc_s[kMTiles][kNTiles][4];
      product(acc_s, q_lane, sk, sm80::BoolConstant<false>{});

      load_kv(n_block + kStages - 1);
      sm80::cp_async_commit();

      float acc_dp[kMTiles][kNTiles][4];
      product(acc_dp, do_lane, sv, sm80::BoolConstant<true>{});

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

      // dQ += dS K over the slice: keys are the k dimension; K tiles are read transposed.
#pragma unroll
      for (int j = 0; j < kNTiles / 2; ++j)
#pragma unroll
        for (int dp = 0; dp < kSliceTiles; ++dp) {
          if (kSlices > 1 && slice_tile0 + dp >= kTiles16) continue;  // the last slice may run short
          u32 b[4];
          sm80::ldmatrix_x4_trans(b, sk + bt_lane + (j * 16 * kRow + (slice_tile0 + dp) * 16) * 2);
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
        for (int dt = 0; dt < kSliceTiles * 2; ++dt) {
          const int col = (slice_tile0 * 2 + dt) * 8 + 2 * t;
          if (col >= kHeadDim) continue;
          *reinterpret_cast<u32*>(dq + row * p.dq_row_stride + col) =
              sm80::pack2<kElem>(acc_dq[mt][dt][2 * h] * p.variant.scale, acc_dq[mt][dt][2 * h + 1] * p.variant.scale);
        }
      }
  }
};

}  // namespace flashgen
