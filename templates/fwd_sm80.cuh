// Forward attention on tensor cores for sm_80 and newer (mma.sync m16n8k16, ldmatrix, cp.async).
// Generic over a config type (see the generated Config in generator/generator.cpp): one thread block
// computes kBlockM query rows of one (batch, head); each warp owns kBlockM / kWarps of those rows and
// streams K/V tiles of kBlockN keys through a kStages-deep cp.async ring, with an online softmax in
// base 2 (softmax.cuh) and the output normalised once at the end. Masking and scores go through the
// config's Variant (variant.cuh, block_range.cuh).
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "sequence.cuh"
#include "fwd_traits.cuh"
#include "sm80_attend.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"
#include "tile_copy.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm80 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;

  static constexpr FwdTraits kTraits =
      fwd_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarps, Cfg::kStages, Cfg::kQInRegs,
                 ConfigHeadDimV<Cfg>::value);
  static_assert(kTraits.error == nullptr, "invalid forward config: see fwd_traits() in fwd_traits.cuh");

  static constexpr ElemType kElem = Cfg::kElem;
  using Variant = typename Cfg::Variant;
  static constexpr bool kQInRegs = Cfg::kQInRegs;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)
  static constexpr bool kPaged = ConfigPaged<Cfg>::value;    // ... whose keys and values are in a paged cache
  static_assert(!kPaged || kVarlen, "paged keys come with packed sequences");
  static constexpr int kThreads = kTraits.threads;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kHeadDim = Cfg::kHeadDim;       // real head_dim, a multiple of 8
  static constexpr int kHeadDimPad = kTraits.head_dim_pad;  // multiple of 16: the QKᵀ k-steps
  static constexpr int kRow = kTraits.smem_row_elems;  // smem pitch; (kRow / 2) % 8 == 4 words keeps
                                                       // ldmatrix and the output stores conflict-free
  static constexpr int kWarpRows = kTraits.rows_per_warp;
  static constexpr int kMTiles = kTraits.m_tiles;      // 16-row tiles per warp
  static constexpr int kNTiles = kBlockN / 8;          // 8-key column tiles of S
  static constexpr int kKSteps = kHeadDimPad / 16;     // k-steps of S = Q Kᵀ
  static constexpr int kChunks = kHeadDimPad / 8;      // 16-byte chunks per smem row
  static constexpr int kValidChunks = kHeadDim / 8;    // chunks that hold data; the rest are zero-filled
  // The values' and the output's columns: head_dim's, or the config's own (MLA's d_v), with their own pitch.
  static constexpr int kHeadDimV = ConfigHeadDimV<Cfg>::value;
  static constexpr int kRowV = kTraits.smem_row_elems_v;
  static constexpr int kDTiles = kTraits.head_dim_v_pad / 8;  // 8-wide column tiles of O
  static constexpr int kChunksV = kTraits.head_dim_v_pad / 8;
  static constexpr int kValidChunksV = kHeadDimV / 8;
  static constexpr u32 kKTileBytes = kBlockN * kRow * 2;      // one K tile in smem
  static constexpr u32 kStageBytes = kTraits.smem_kv_stage_bytes;  // K tile, then V tile (kBlockN, kRowV)

  template <int kRows>
  static __device__ __forceinline__ void load_tile(u32 smem_tile, const u16* gmem, long long row_stride,
                                                   int rows_valid, const u16* inside, int tid) {
    sm80::TileCopy<kThreads, kRow, kChunks, kValidChunks>::template load<kRows>(smem_tile, gmem, row_stride,
                                                                              rows_valid, inside, tid);
  }
  static __device__ __forceinline__ void load_v_tile(u32 smem_tile, const u16* gmem, long long row_stride,
                                                     int rows_valid, const u16* inside, int tid) {
    sm80::TileCopy<kThreads, kRowV, kChunksV, kValidChunksV>::template load<kBlockN>(smem_tile, gmem, row_stride,
                                                                                   rows_valid, inside, tid);
  }

  // A fragments (16 rows x 16 k) of this warp's Q tile mt for k-step kk; q_lane is the lane's address.
  static __device__ __forceinline__ void load_q_frag(u32 (&a)[4], u32 q_lane, int mt, int kk) {
    sm80::ldmatrix_x4(a, q_lane + (mt * 16 * kRow + kk * 16) * 2);
  }

  // blockIdx: (query block, highest first; query head; batch entry, or sequence of a packed batch).
  static __device__ void run(const AttnFwdParams& params) {
    if constexpr (kVarlen) {
      AttnFwdParams p = params;
      if (!bind_sequence(p, blockIdx.z, (gridDim.x - 1 - blockIdx.x) * kBlockM)) return;
      run_block(p);
    } else {
      run_block(params);
    }
  }

  static __device__ void run_block(const AttnFwdParams& p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // Shared memory is addressed with 32-bit byte offsets so ptxas folds the constant parts of every
    // ldmatrix address into the instruction.
    u16* sq = reinterpret_cast<u16*>(smem_raw);           // (kBlockM, kRow); reused for the (kBlockM, kRowV) output
    const u32 sq_addr = sm80::smem_addr(smem_raw);
    const u32 skv_addr = sq_addr + kBlockM * kRow * 2;    // kStages x [K (kBlockN, kRow), V (kBlockN, kRowV)]

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    // Highest query blocks first: under a causal mask they see the most keys, so the longest blocks
    // start first and the short ones fill the tail.
    const int m_start = (gridDim.x - 1 - blockIdx.x) * kBlockM;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.group_size;

    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                   m_start * p.q_row_stride;
    const u16* k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const u16* v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
             m_start * p.o_row_stride;

    const int rows_q = min(kBlockM, p.seqlen_q - m_start);
    const KeyBlocks<Variant, kBlockN> blocks(p, batch, m_start, rows_q, head);
    const int n_end = blocks.key_end;
    const int n_begin = blocks.begin;
    const int n_blocks = blocks.end;

    // Keys at or past n_end are hidden from every row, so they are zero-filled rather than read.
    auto load_kv = [&](int n_block) {
      const u32 sk = skv_addr + (n_block % kStages) * kStageBytes;
      const int n_start = n_block * kBlockN;
      const int rows_valid = min(kBlockN, n_end - n_start);
      if constexpr (kPaged) {
        using CopyK = sm80::TileCopy<kThreads, kRow, kChunks, kValidChunks>;
        using CopyV = sm80::TileCopy<kThreads, kRowV, kChunksV, kValidChunksV>;
        CopyK::template load_paged<kBlockN>(sk, k, p.k_page_stride, p.k_row_stride, p.block_table, p.page_size,
                                            p.num_pages, n_start, rows_valid, tid);
        CopyV::template load_paged<kBlockN>(sk + kKTileBytes, v, p.v_page_stride, p.v_row_stride, p.block_table,
                                            p.page_size, p.num_pages, n_start, rows_valid, tid);
      } else {
        load_tile<kBlockN>(sk, k + n_start * p.k_row_stride, p.k_row_stride, rows_valid, k, tid);
        load_v_tile(sk + kKTileBytes, v + n_start * p.v_row_stride, p.v_row_stride, rows_valid, v, tid);
      }
    };

    // Prologue: Q, then the first kStages - 1 K/V tiles, one commit group each (empty groups keep the
    // count uniform so the wait below is a constant).
    load_tile<kBlockM>(sq_addr, q, p.q_row_stride, rows_q, q, tid);
    sm80::cp_async_commit();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      load_kv(n_begin + s);  // blocks past n_blocks are zero-filled and never read
      sm80::cp_async_commit();
    }

    // Per-lane ldmatrix byte offsets; the tile, k-step and n-tile parts are compile-time constants.
    // Q (A operand): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
    const u32 q_lane = sq_addr + ((warp * kWarpRows + (lane & 15)) * kRow + (lane >> 4) * 8) * 2;
    // K (B operand of S): (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
    const u32 k_lane = ((lane & 7) + ((lane >> 4) << 3)) * kRow * 2 + ((lane >> 3) & 1) * 16;
    // V (B operand of O, transposed): (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
    const u32 v_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowV * 2 + (lane >> 4) * 16;
    u32 q_frag[kQInRegs ? kMTiles : 1][kQInRegs ? kKSteps : 1][4];  // (kMTiles, kKSteps) A fragments, 16x16 each
    if constexpr (kQInRegs) {
      sm80::cp_async_wait<kStages - 1>();
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) load_q_frag(q_frag[mt][kk], q_lane, mt, kk);
    }

    float acc_o[kMTiles][kDTiles][4];  // (kWarpRows, head_dim_v_pad) fp32 output, (16, 8) accumulator tiles
    float row_max[kMTiles][2];         // running max (log2 units) of rows g and g + 8 of each tile
    float row_sum[kMTiles][2];         // running sum of exp2, this thread's columns only
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
      row_max[mt][0] = row_max[mt][1] = neg_inf();
      row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    const int g = lane / 4;  // fragment row within an 8-row group
    const int t = lane % 4;  // fragment column pair
    // First query row of this warp's tile mt is warp_row0 + mt * 16 (relative to the sequence).
    const int warp_row0 = m_start + warp * kWarpRows;

    // The softmax's scale for the variant's row scores (block_range.cuh).
    float folded_scale;
    const float& scale_log2 = row_scale_log2<Variant>(p.variant.scale_log2, p, folded_scale);

    // One key block: S = Q Kᵀ, (masking,) online softmax, O += P V. Instantiated twice so the loop over
    // interior blocks carries no masking code and no branch for it.
    auto attend = [&](int n_block, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      sm80::cp_async_wait<kStages - 2>();  // Q and tile n_block have landed
      __syncthreads();                     // ... for every thread, and tile n_block - 1 is no longer read

      const u32 sk = skv_addr + (n_block % kStages) * kStageBytes;  // (kBlockN, kRow) K tile
      const u32 sv = sk + kKTileBytes;                               // (kBlockN, kRowV) V tile

      // S = Q Kᵀ for this warp, with Q's fragments from registers or shared memory.
      float acc_s[kMTiles][kNTiles][4];  // (kWarpRows, kBlockN) in (16, 8) accumulator tiles
      auto load_a = [&](int mt, int kk, u32(&a)[4]) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = q_frag[mt][kk][e];
        } else {
          load_q_frag(a, q_lane, mt, kk);
        }
      };
      sm80::qk_product<kElem, kKSteps, kRow>(acc_s, load_a, sk, k_lane);

      // Refill the slot tile n_block - 1 used. Issued after the S product, not right after the barrier,
      // so the first ldmatrix goes sooner; past the last block every copy is a zero-fill, which spares a
      // branch (bench/notes_fwd_sm80.md, "Choices in the kernel").
      load_kv(n_block + kStages - 1);
      sm80::cp_async_commit();

      // The variant's scores: its transform, and in partial blocks its mask and seqlen_k's (block_range.cuh).
      const int n_start = n_block * kBlockN;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        variant_scores<Variant, kNTiles, kMasked>(p, acc_s[mt], batch, head, warp_row0 + mt * 16 + g, n_start, t);

      // Online softmax (sm80_attend.cuh), then O += P V with the V tile read transposed.
      u32 p_frag[kMTiles][kNTiles / 2][4];  // (kMTiles, kBlockN / 16) A fragments of P, 16x16 each
      sm80::softmax_update<kElem>(acc_s, row_max, row_sum, acc_o, p_frag, scale_log2);
      sm80::pv_product<kElem, kRowV>(acc_o, p_frag, sv, v_lane);
    };

    // Blocks [full_begin, full_end) need no mask for any row of this block (block_range.cuh).
    const int full_end = blocks.full_end(p, batch, m_start);
    visit_key_blocks(n_begin, blocks.full_begin(p, batch, m_start + rows_q - 1, full_end), full_end, n_blocks,
                     attend);

    // The output tile reuses the Q rows: every thread's Q copies must have landed, including when no
    // key block was visible (n_begin == n_blocks) and the loop's barriers never ran.
    sm80::cp_async_wait<0>();
    __syncthreads();

    // Epilogue: normalise once (with the head's sink), write LSE, stage this warp's rows in its own Q rows,
    // store 16-byte chunks.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = sm80::quad_sum(row_sum[mt][h]);
        softmax::scale_row(acc_o[mt], h, softmax::row_end_factor(p.variant.sinks, head, row_max[mt][h], sum));
        const int row = warp_row0 + mt * 16 + g + h * 8;
        if (p.lse != nullptr && t == 0 && row < p.seqlen_q) {
          p.lse[lse_index<kVarlen>(p, batch, head, row)] =
              softmax::lse(row_max[mt][h], sum);
        }
      }
    }

    // (kWarpRows, kRowV): past the barrier above no thread reads Q or K/V again, so a warp's output rows may cover
    // another warp's Q rows (and, with values wider than the keys, the first stages).
    u16* so_warp = sq + warp * kWarpRows * kRowV;
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = mt * 16 + g + h * 8;
          const int col = dt * 8 + 2 * t;
          *reinterpret_cast<u32*>(so_warp + row * kRowV + col) =
              sm80::pack2<kElem>(acc_o[mt][dt][2 * h], acc_o[mt][dt][2 * h + 1]);
        }
    __syncwarp();
    const int warp_first_row = warp * kWarpRows;  // relative to m_start
    constexpr int kOutChunks = kWarpRows * kValidChunksV;
#pragma unroll
    for (int i0 = 0; i0 < kOutChunks; i0 += 32) {
      const int i = i0 + lane;
      if (kOutChunks % 32 == 0 || i < kOutChunks) {
        const int row = i / kValidChunksV;
        const int chunk = i % kValidChunksV;
        if (m_start + warp_first_row + row < p.seqlen_q) {
          const uint4 value = *reinterpret_cast<const uint4*>(so_warp + row * kRowV + chunk * 8);
          *reinterpret_cast<uint4*>(o + (warp_first_row + row) * p.o_row_stride + chunk * 8) = value;
        }
      }
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` compile this template on its own for a default config.
struct FlashgenDefaultFwdConfig {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 32;
  static constexpr int kWarps = 4;
  static constexpr int kStages = 3;
  static constexpr bool kQInRegs = false;
};

extern "C" __global__ void __launch_bounds__(flashgen::FwdSm80<FlashgenDefaultFwdConfig>::kThreads, 1)
    fwd_sm80_standalone_default(const __grid_constant__ flashgen::AttnFwdParams params) {
  flashgen::FwdSm80<FlashgenDefaultFwdConfig>::run(params);
}
#endif
