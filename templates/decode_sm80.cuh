// Attention against a KV cache (decoding) on tensor cores for sm_80 and newer (mma.sync m16n8k16, ldmatrix,
// cp.async): a few new query tokens per sequence over a long cache, contiguous or paged (AttnDecodeParams).
// Generic over a config type (the generated DecodeConfig, generator/decode_config.cpp). Three kernels:
//   DecodeAppend   writes the new tokens' keys and values into the cache (before the attention, in stream order;
//                  decode_rows.cuh);
//   DecodeSm80     one block per (key range, kv head, sequence): its query rows are every query head of the kv
//                  head times every new token, packed into 16-row mma tiles, so each K/V tile is read once for
//                  the whole group. The warps split each tile's keys, each with its own online softmax
//                  (softmax.cuh), and merge their rows through shared memory at the end. A sequence's keys are
//                  split evenly into gridDim.x ranges, so a short batch still fills the GPU. An FP8 cache
//                  (Cfg::kCacheElem) is copied as it is and widened in registers (fp8.cuh), its scales applied to
//                  the scores and the output;
//   DecodeCombine  with more than one range, merges the ranges' normalised outputs by their LSE (decode_rows.cuh).
// Masking and scores go through the config's Variant (variant.cuh, block_range.cuh).
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "decode_rows.cuh"
#include "decode_traits.cuh"
#include "fp8.cuh"
#include "sm80_attend.cuh"
#include "sm80_primitives.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {

// One sequence as the variant policies see it (variant.cuh): its new queries, its keys (the cache's and the
// new tokens'), and the variant's arguments with the causal offset of the sequence's alignment.
struct DecodeSequence {
  int seqlen_q;
  int seqlen_k;
  VariantArgs variant;
};

// The kernel's variant arguments v at a sequence's causal offset. A copy of v alone would have the compiler read
// each field from the parameters again wherever a hook uses it; the scalars the hooks read in every tile are read
// into registers here, once, and a user variant's buffers and scalars where its functions use them.
__device__ __forceinline__ VariantArgs sequence_variant(const VariantArgs& v, int causal_offset) {
  VariantArgs s = v;
  s.causal_offset = causal_offset;
  s.window_left = v.window_left, s.window_right = v.window_right, s.attention_chunk = v.attention_chunk;
  s.scale = v.scale, s.softcap_in = v.softcap_in, s.softcap_out = v.softcap_out;
  s.alibi_slopes = v.alibi_slopes, s.alibi_batch_stride = v.alibi_batch_stride, s.inv_scale = v.inv_scale;
  return s;
}

// One block's share of a sequence's keys: key blocks [n_begin, n_end), an even share of those the packed rows
// row0 .. row0 + rows - 1 visit split into p.splits ranges; [full_begin, full_end) among them need no mask; keys
// from key_end on lie past the sequence.
template <class Variant, int kBlockN>
struct DecodeRange {
  int n_begin, n_end, full_begin, full_end, key_end;

  __device__ __forceinline__ DecodeRange(const AttnDecodeParams& p, const DecodeSequence& seq, int batch, int row0,
                                         int rows, int split) {
    const int q_first = row0 / p.group_size;
    const int q_last = (min(row0 + rows, p.group_size * p.seqlen_q) - 1) / p.group_size;
    const KeyBlocks<Variant, kBlockN> blocks(seq, batch, q_first, q_last - q_first + 1);
    const int per_split = (blocks.count() + p.splits - 1) / p.splits;
    n_begin = min(blocks.begin + split * per_split, blocks.end);
    n_end = min(n_begin + per_split, blocks.end);
    const int all_full_end = blocks.full_end(seq, batch, q_first);
    full_end = min(max(all_full_end, n_begin), n_end);
    full_begin = min(max(blocks.full_begin(seq, batch, q_last, all_full_end), n_begin), full_end);
    key_end = blocks.key_end;
  }
};

template <class Cfg>
struct DecodeSm80 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;

  static constexpr ElemType kElem = Cfg::kElem;
  static constexpr ElemType kCacheElem = ConfigCacheElem<Cfg>::value;
  static constexpr bool kFp8 = is_fp8(kCacheElem);
  static constexpr float kRestore = fp8::restore_factor(kCacheElem, kElem);  // of the widened FP8 tiles
  static constexpr DecodeTraits kTraits =
      decode_traits(Cfg::kHeadDim, Cfg::kRows, Cfg::kBlockN, Cfg::kWarps, Cfg::kStages, Cfg::kPaged, kFp8);
  static_assert(kTraits.error == nullptr, "invalid decode config: see decode_traits() in decode_traits.cuh");
  static_assert(kCacheElem == kElem || kFp8, "a 16-bit cache holds the queries' type");

  using Variant = typename Cfg::Variant;
  static constexpr bool kPaged = Cfg::kPaged;
  static constexpr int kThreads = kTraits.threads;
  static constexpr int kMinBlocks = kTraits.min_blocks;  // of __launch_bounds__
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kRows = Cfg::kRows;              // packed query rows of the block
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kHeadDimPad = kTraits.head_dim_pad;
  static constexpr int kRow = kTraits.smem_row_elems;
  static constexpr int kMTiles = kTraits.m_tiles;
  static constexpr int kWarpKeys = kTraits.warp_keys;  // each warp's keys of a tile
  static constexpr int kNTiles = kWarpKeys / 8;         // 8-key column tiles of a warp's S
  static constexpr int kDTiles = kHeadDimPad / 8;
  static constexpr int kKSteps = kHeadDimPad / 16;
  static constexpr int kChunks = kHeadDimPad / 8;       // 16-byte chunks per smem row of Q
  static constexpr int kValidChunks = kHeadDim / 8;
  using CacheT = typename fp8::Storage<kCacheElem>::type;
  static constexpr int kCacheChunk = 16 / elem_bytes(kCacheElem);  // cache elements per 16-byte chunk
  static constexpr int kCacheChunks = kHeadDimPad / kCacheChunk;   // 16-byte chunks per smem row of K or V
  static constexpr int kCacheValidChunks = kHeadDim / kCacheChunk;
  static constexpr int kKvRowBytes = kTraits.kv_row_bytes;
  static constexpr int kTileBytes = kBlockN * kKvRowBytes;
  static constexpr int kPitch = kTraits.reduce_pitch;

  // blockIdx: (key range, kv head * row_blocks + block of its packed rows, sequence).
  static __device__ void run(const AttnDecodeParams& p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 sq_addr = sm80::smem_addr(smem_raw);                     // (kRows, kRow) Q tile
    // (2, 2, kBlockN) element offsets of the K and V rows of the next tiles to copy (paged caches)
    long long* s_rows = reinterpret_cast<long long*>(smem_raw + kTraits.smem_q_bytes);
    constexpr int kRingOffset = kTraits.smem_q_bytes + kTraits.smem_rows_bytes;
    const u32 skv_addr = sq_addr + kRingOffset;                              // kStages x [K, V (kBlockN, kRow)]
    float* red = reinterpret_cast<float*>(smem_raw + kRingOffset);          // the warps' rows, over the idle ring

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int split = blockIdx.x;
    const int kv_head = blockIdx.y / p.row_blocks;
    const int row0 = blockIdx.y % p.row_blocks * kRows;  // first packed row: token row / group, head row % group
    const int batch = blockIdx.z;
    const int packed_rows = p.group_size * p.seqlen_q;

    // The combine kernel may be scheduled now (it waits for this grid's memory); the cache is read only once the
    // append kernel before this one is done.
    sm80::launch_dependents();
    sm80::wait_for_primary();
    const int n_keys = decode_cache_len(p, batch) + p.seqlen_new;
    const DecodeSequence seq{p.seqlen_q, n_keys,
                             sequence_variant(p.variant, p.causal_bottom_right ? n_keys - p.seqlen_q : 0)};
    // The softmax's scale for the variant's row scores (block_range.cuh).
    float folded_scale;
    const float& scale_log2 = row_scale_log2<Variant>(p.variant.scale_log2, seq, folded_scale);
    const DecodeRange<Variant, kBlockN> range(p, seq, batch, row0, kRows, split);
    const int n_begin = range.n_begin, n_end = range.n_end, full_begin = range.full_begin, full_end = range.full_end;

    // Q: packed row r is token (row0 + r) / group of query head kv_head * group + (row0 + r) % group. Over an FP8
    // cache each k-step's columns are stored in the order its K fragments read them (fp8::permute_k_step).
    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride;
    if constexpr (kFp8) {
      constexpr int kSteps = kHeadDim / 16;
      for (int i = tid; i < kRows * kSteps; i += kThreads) {
        const int r = i / kSteps;
        const int step = i % kSteps;
        const int packed = row0 + r;
        uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
        if (packed < packed_rows) {
          const int head = kv_head * p.group_size + packed % p.group_size;
          const uint4* src = reinterpret_cast<const uint4*>(q + (packed / p.group_size) * p.q_row_stride +
                                                            head * p.q_head_stride + step * 16);
          lo = src[0], hi = src[1];
        }
        fp8::permute_k_step(lo, hi);
        uint4* dst = reinterpret_cast<uint4*>(smem_raw + (r * kRow + step * 16) * 2);
        dst[0] = lo, dst[1] = hi;
      }
    }
    constexpr int kQTotal = kFp8 ? 0 : kRows * kChunks;
#pragma unroll
    for (int i0 = 0; i0 < kQTotal; i0 += kThreads) {
      const int i = i0 + tid;
      if (kQTotal % kThreads == 0 || i < kQTotal) {
        const int r = i / kChunks;
        const int chunk = i % kChunks;
        const int packed = row0 + r;
        const bool valid = packed < packed_rows && chunk < kValidChunks;
        const u16* src = q;
        if (valid) {
          const int head = kv_head * p.group_size + packed % p.group_size;
          src = q + (packed / p.group_size) * p.q_row_stride + head * p.q_head_stride + chunk * 8;
        }
        sm80::cp_async_16(sq_addr + (r * kRow + chunk * 8) * 2, src, valid);
      }
    }
    sm80::cp_async_commit();

    // K and V tiles: every thread copies whole 16-byte chunks of rows; keys past key_end, and blocks outside
    // this range, are zero-filled rather than read. In a paged cache each row lies in a page of its own: the
    // rows of a tile are located one tile early (stage_rows: one thread per row reads the block table and
    // stores the row's K and V offsets in s_rows), so neither the table's latency nor the division by
    // page_size is paid per copy. The prologue's tiles locate their rows directly.
    const int* pages = kPaged ? p.block_table + batch * p.block_table_stride : nullptr;
    const CacheT* k = static_cast<const CacheT*>(p.k_cache) + kv_head * p.k_head_stride;
    const CacheT* v = static_cast<const CacheT*>(p.v_cache) + kv_head * p.v_head_stride;
    auto stage_rows = [&](int n_block) {
      if constexpr (kPaged) {
        long long* rows = s_rows + (n_block % 2) * 2 * kBlockN;
        for (int r = tid; r < kBlockN; r += kThreads) {
          const int key = n_block * kBlockN + r;
          if (key < range.key_end) {
            const CacheRow at = cache_row<true>(p, pages, batch, key);
            rows[r] = at.page * p.k_batch_stride + at.row * p.k_row_stride;
            rows[kBlockN + r] = at.page * p.v_batch_stride + at.row * p.v_row_stride;
          }
        }
      }
    };
    auto load_kv = [&](int n_block, bool staged) {
      const u32 sk = skv_addr + (n_block % kStages) * 2 * kTileBytes;
      const int n_start = n_block * kBlockN;
      const int rows_valid = n_block < n_end ? min(kBlockN, range.key_end - n_start) : 0;
      const long long* rows = s_rows + (n_block % 2) * 2 * kBlockN;
      constexpr int kTotal = kBlockN * kCacheChunks;
      // Partly unrolled: every copy of a pass holds two 64-bit addresses, and head_dim 256 fully unrolled
      // (16 passes) spills.
#pragma unroll 8
      for (int i0 = 0; i0 < kTotal; i0 += kThreads) {
        const int i = i0 + tid;
        if (kTotal % kThreads == 0 || i < kTotal) {
          const int row = i / kCacheChunks;
          const int chunk = i % kCacheChunks;
          const bool valid = row < rows_valid && chunk < kCacheValidChunks;
          const CacheT* k_src = k;
          const CacheT* v_src = v;
          if (valid) {
            if (kPaged && staged) {
              k_src = k + rows[row] + chunk * kCacheChunk;
              v_src = v + rows[kBlockN + row] + chunk * kCacheChunk;
            } else {
              const CacheRow at = cache_row<kPaged>(p, pages, batch, n_start + row);
              k_src = k + at.page * p.k_batch_stride + at.row * p.k_row_stride + chunk * kCacheChunk;
              v_src = v + at.page * p.v_batch_stride + at.row * p.v_row_stride + chunk * kCacheChunk;
            }
          }
          const u32 dst = sk + row * kKvRowBytes + chunk * 16;
          sm80::cp_async_16_stream(dst, k_src, valid);
          sm80::cp_async_16_stream(dst + kTileBytes, v_src, valid);
        }
      }
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      load_kv(n_begin + s, false);
      sm80::cp_async_commit();
    }
    stage_rows(n_begin + kStages - 1);  // read by every thread after the loop's first barrier

    // ldmatrix lane offsets as in fwd_sm80.cuh (an FP8 cache's as fp8.cuh reads it); every warp reads all Q rows and
    // its own kWarpKeys keys.
    const u32 q_lane = sq_addr + ((lane & 15) * kRow + (lane >> 4) * 8) * 2;
    const u32 k_lane = kFp8 ? (warp * kWarpKeys + (lane & 7) + ((lane >> 3) & 1) * 8) * kKvRowBytes + (lane >> 4) * 16
                            : ((warp * kWarpKeys + (lane & 7) + ((lane >> 4) << 3)) * kRow) * 2 + ((lane >> 3) & 1) * 16;
    const u32 v_lane = (warp * kWarpKeys + (lane & 7) + ((lane >> 3) & 1) * 8) * kKvRowBytes + (lane >> 4) * 16;
    // An FP8 cache's scales for this (sequence, kv head): the keys' multiplies the scores, the values' the output,
    // each after kRestore (the 2^kRebias the widened tiles leave out; their product could pass fp32's range).
    const float k_scale = kFp8 ? cache_scale(p.k_scale, p.k_scale_batch_stride, p.k_scale_head_stride, batch, kv_head)
                               : 1.f;
    const float v_scale = kFp8 ? cache_scale(p.v_scale, p.v_scale_batch_stride, p.v_scale_head_stride, batch, kv_head)
                               : 1.f;

    float acc_o[kMTiles][kDTiles][4];  // (kRows, kHeadDimPad) fp32 partial output of this warp's keys
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

    const int g = lane / 4;
    const int t = lane % 4;
    // The token and query head of rows g + 8h of each tile, as the variant asks about them.
    int token[kMTiles][2];
    int head[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int packed = row0 + mt * 16 + g + 8 * h;
        token[mt][h] = packed / p.group_size;
        head[mt][h] = kv_head * p.group_size + packed % p.group_size;
      }

    auto attend = [&](int n_block, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      sm80::cp_async_wait<kStages - 2>();  // Q and tile n_block have landed
      __syncthreads();                     // ... for every thread, and tile n_block - 1 is no longer read
      const u32 sk = skv_addr + (n_block % kStages) * 2 * kTileBytes;
      const u32 sv = sk + kTileBytes;

      float acc_s[kMTiles][kNTiles][4];  // (kRows, kWarpKeys): S of this warp's keys
      auto load_a = [&](int mt, int kk, u32(&a)[4]) { sm80::ldmatrix_x4(a, q_lane + (mt * 16 * kRow + kk * 16) * 2); };
      if constexpr (kFp8) {
        fp8::qk_product<kElem, kCacheElem, kKSteps, kKvRowBytes>(acc_s, load_a, sk, k_lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = acc_s[mt][nt][e] * kRestore * k_scale;
      } else {
        sm80::qk_product<kElem, kKSteps, kRow>(acc_s, load_a, sk, k_lane);
      }

      // Refill the slot tile n_block - 1 used (every warp passed the barrier above after reading it), with the
      // rows staged before that barrier; stage the next tile's over the ones read an iteration ago.
      load_kv(n_block + kStages - 1, true);
      sm80::cp_async_commit();
      stage_rows(n_block + kStages);

      const int key0 = n_block * kBlockN + warp * kWarpKeys;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        variant_scores_at<Variant, kNTiles, kMasked>(
            seq, acc_s[mt], batch, [&](int h) { return TileRow{head[mt][h], token[mt][h]}; }, key0, t);

      u32 p_frag[kMTiles][kNTiles / 2][4];  // A fragments of P, 16x16 each
      sm80::softmax_update<kElem>(acc_s, row_max, row_sum, acc_o, p_frag, scale_log2);
      if constexpr (kFp8) {
        fp8::pv_product<kElem, kCacheElem, kKvRowBytes>(acc_o, p_frag, sv, v_lane);
      } else {
        sm80::pv_product<kElem, kRow>(acc_o, p_frag, sv, v_lane);
      }
    };
    for (int n = n_begin; n < full_begin; ++n) attend(n, sm80::BoolConstant<true>{});
    for (int n = full_begin; n < full_end; ++n) attend(n, sm80::BoolConstant<false>{});
    for (int n = full_end; n < n_end; ++n) attend(n, sm80::BoolConstant<true>{});

    // The ring is idle once every copy has landed and every warp is past its last tile.
    sm80::cp_async_wait<0>();
    __syncthreads();

    float* red_o = red;                                  // (kWarps, kRows, kPitch) each warp's unnormalised O
    float* red_max = red + kWarps * kRows * kPitch;      // (kWarps, kRows) its rows' maxima (log2 units)
    float* red_sum = red_max + kWarps * kRows;           // (kWarps, kRows) its rows' sums
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + g + 8 * h;
        const float sum = sm80::quad_sum(row_sum[mt][h]);
        if (t == 0) {
          red_max[warp * kRows + r] = row_max[mt][h];
          red_sum[warp * kRows + r] = sum;
        }
        if constexpr (kFp8) {
#pragma unroll
          for (int c = 0; c < kDTiles / 2; ++c) {
            *reinterpret_cast<float4*>(red_o + (warp * kRows + r) * kPitch + c * 16 + 4 * t) =
                fp8::o_group_columns(acc_o[mt][2 * c], acc_o[mt][2 * c + 1], h);
          }
        } else {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            *reinterpret_cast<float2*>(red_o + (warp * kRows + r) * kPitch + dt * 8 + 2 * t) =
                make_float2(acc_o[mt][dt][2 * h], acc_o[mt][dt][2 * h + 1]);
          }
        }
      }
    __syncthreads();

    // Merge the warps' rows, four columns per thread and step; write this range's output and LSE: the final
    // ones with one range, else fp32 parts for the combine kernel.
    constexpr int kQuads = kHeadDim / 4;
    for (int i = tid; i < kRows * kQuads; i += kThreads) {
      const int r = i / kQuads;
      const int c = i % kQuads * 4;
      const int packed = row0 + r;
      if (packed >= packed_rows) break;  // i grows with r: every later row is padding too
      float m = neg_inf();
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red_max[w * kRows + r]);
      float sum = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = softmax::part_weight(red_max[w * kRows + r], m);
        sum += f * red_sum[w * kRows + r];
        const float4 o_w = *reinterpret_cast<const float4*>(red_o + (w * kRows + r) * kPitch + c);
        acc.x += f * o_w.x, acc.y += f * o_w.y, acc.z += f * o_w.z, acc.w += f * o_w.w;
      }
      const int tok = packed / p.group_size;
      const int hq = kv_head * p.group_size + packed % p.group_size;
      // The sink joins the row once: here with one range, else where the combine kernel merges the ranges.
      const float inv = softmax::row_end_factor(p.splits > 1 ? nullptr : p.variant.sinks, hq, m, sum) * kRestore;
      acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
      if constexpr (kFp8) acc.x *= v_scale, acc.y *= v_scale, acc.z *= v_scale, acc.w *= v_scale;
      const float lse = softmax::lse(m, sum);
      const long long row = (static_cast<long long>(batch) * p.heads_q + hq) * p.seqlen_q + tok;
      if (p.splits > 1) {
        const long long part = static_cast<long long>(split) * p.batch * p.heads_q * p.seqlen_q + row;
        *reinterpret_cast<float4*>(p.o_partial + part * kHeadDim + c) = acc;
        if (c == 0) p.lse_partial[part] = lse;
      } else {
        u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + tok * p.o_row_stride + hq * p.o_head_stride + c;
        *reinterpret_cast<uint2*>(o) = make_uint2(sm80::pack2<kElem>(acc.x, acc.y), sm80::pack2<kElem>(acc.z, acc.w));
        if (c == 0 && p.lse != nullptr) p.lse[row] = lse;
      }
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` compile this template on its own for a default config.
struct FlashgenDefaultDecodeConfig {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kBFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kRows = 16;
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = 4;
  static constexpr int kStages = 4;
  static constexpr bool kPaged = true;
};

extern "C" __global__ void __launch_bounds__(flashgen::DecodeSm80<FlashgenDefaultDecodeConfig>::kThreads, 1)
    decode_sm80_standalone_attend(const __grid_constant__ flashgen::AttnDecodeParams params) {
  flashgen::DecodeSm80<FlashgenDefaultDecodeConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kDecodeRowKernelThreads, 1)
    decode_sm80_standalone_combine(const __grid_constant__ flashgen::AttnDecodeParams params) {
  flashgen::DecodeCombine<FlashgenDefaultDecodeConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kDecodeRowKernelThreads, 1)
    decode_sm80_standalone_append(const __grid_constant__ flashgen::AttnDecodeParams params) {
  flashgen::DecodeAppend<FlashgenDefaultDecodeConfig>::run(params);
}
#endif
