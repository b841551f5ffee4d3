// Attention against a latent KV cache (MLA decoding) on Hopper: one kv head whose keys are head_dim columns and
// whose values are the keys' first head_dim_v columns (the latent; one copy in memory, read once), 64 packed query
// rows (query heads x new tokens) per block over a range of a sequence's keys, contiguous or paged
// (AttnDecodeParams; the append and combine kernels are decode_sm80.cuh's).
//
// Warpgroup 0 copies K tiles of 64 keys into a ring (cp.async, one looked-up row per thread pair, rows past the
// sequence zero-filled, each 64-column chunk on a barrier of its own). Warpgroups 1 and 2 each hold half of O's columns (64 x head_dim_v / 2 fp32) and take turns
// at the key blocks: the block's owner computes S = Q Kᵀ over every column on wgmma, the variant's scores and the
// online softmax from the running max the other left, writes P into the tile's first chunk past the values (S no
// longer reads it) and the rows' max and correction beside it, and adds P V of its half from registers; the other
// rescales its half by the correction and adds P V from shared memory, then issues S of the next block, its own.
// S is computed once per block (bench/notes_decode.md, "The latent kernel").
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "decode_sm80.cuh"
#include "decode_traits.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "sm90_wgmma_rs.cuh"
#include "sm90_wgmma_ss.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct DecodeSm90 {
  using u16 = sm80::u16;
  using u32 = sm80::u32;
  using u64 = unsigned long long;

  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kHeadDimV = ConfigHeadDimV<Cfg>::value;
  static constexpr int kStages = Cfg::kStages;
  static constexpr DecodeSm90Traits kTraits = decode_sm90_traits(kHeadDim, kHeadDimV, kStages);
  static_assert(kTraits.error == nullptr, "invalid latent decode config: see decode_sm90_traits() in decode_traits.cuh");

  static constexpr ElemType kElem = Cfg::kElem;
  using Variant = typename Cfg::Variant;
  static constexpr bool kPaged = Cfg::kPaged;
  static constexpr int kThreads = kTraits.threads;
  static constexpr int kRows = kDecodeSm90Rows;
  static constexpr int kBlockN = kDecodeSm90BlockN;
  static constexpr int kRowBytes = 128;                      // one swizzled 64-column row of a chunk
  static constexpr int kChunkBytes = kBlockN * kRowBytes;    // one 64-column chunk of a K tile (and of Q: 64 rows)
  static constexpr int kUnits = kHeadDim / 8;                // 16-byte units of a row
  static constexpr int kQkSteps = kHeadDim / 16;
  static constexpr int kPvSteps = kBlockN / 16;
  static constexpr int kSGroups = kBlockN / 8;
  static constexpr int kHalfV = kHeadDimV / 2;               // each consumer's columns of O
  static constexpr int kOGroups = kHalfV / 8;
  static constexpr u32 kPChunk = kTraits.chunks_v;           // P's place in a K tile: the first chunk past the values
  static constexpr u32 kQReady = 1, kSumsReady = 2;           // named barriers of the two consumers

  // Byte offsets into the aligned shared memory.
  static __device__ __forceinline__ u32 tile(int slot) { return kTraits.k_offset + slot * kTraits.tile_bytes; }
  static __device__ __forceinline__ u32 empty(int slot) { return kTraits.barrier_offset + slot * 8; }
  // Chunk `chunk` of the tile in `slot` has landed: S over it may start before the rest of the tile is there.
  static __device__ __forceinline__ u32 full(int slot, int chunk) {
    return kTraits.barrier_offset + (kStages + slot * kTraits.chunks + chunk) * 8;
  }
  // The owner of the blocks of this parity has published a block's P and its rows' statistics (max, correction).
  static __device__ __forceinline__ u32 published(int parity) {
    return kTraits.barrier_offset + (kStages * (1 + kTraits.chunks) + parity) * 8;
  }
  // (2 parities, 64 rows) running max after the block; (2, 64) its correction of O; (2 consumers, 64) row sums.
  static constexpr u32 kMaxOffset = kTraits.stats_offset;
  static constexpr u32 kCorrectionOffset = kMaxOffset + 2 * kRows * 4;
  static constexpr u32 kSumOffset = kCorrectionOffset + 2 * kRows * 4;

  // Byte offset of 16-byte unit `unit` (of 8) of row `row` in a 128-byte-swizzled chunk.
  static __device__ __forceinline__ u32 swizzled(int row, int unit) {
    return row * kRowBytes + ((unit ^ (row % 8)) * 16);
  }

  // blockIdx: (key range, kv head * row_blocks + block of its packed rows, sequence).
  static __device__ void run(const AttnDecodeParams& p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 smem = (sm90::smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    const int split = blockIdx.x;
    const int kv_head = blockIdx.y / p.row_blocks;
    const int row0 = blockIdx.y % p.row_blocks * kRows;
    const int batch = blockIdx.z;

    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        sm90::mbarrier_init(smem + empty(s), 256);  // every consumer thread, once its P V is done
        for (int c = 0; c < kTraits.chunks; ++c) {
          sm90::mbarrier_init(smem + full(s, c), 128);  // every producer thread, once its copies of the chunk landed
        }
      }
      // Every thread of the owning consumer, once its P and statistics are written. An owner is never a phase ahead
      // of the other's wait: it publishes block it + 2 only after the other has published it + 1, which follows
      // the other's wait for block it.
      for (int parity = 0; parity < 2; ++parity) sm90::mbarrier_init(smem + published(parity), 128);
      sm90::fence_mbarrier_init();
    }
    __syncthreads();

    // The combine kernel may be scheduled now; the cache is read only once the append kernel before is done.
    sm80::launch_dependents();
    sm80::wait_for_primary();
    const int n_keys = decode_cache_len(p, batch) + p.seqlen_new;
    const DecodeSequence seq{p.seqlen_q, n_keys,
                             sequence_variant(p.variant, p.causal_bottom_right ? n_keys - p.seqlen_q : 0)};
    const DecodeRange<Variant, kBlockN> range(p, seq, batch, row0, kRows, split);
    const u16* k = static_cast<const u16*>(p.k_cache) + kv_head * p.k_head_stride;

    if (threadIdx.x < 128) {
      sm90::setmaxnreg_dec<kTraits.producer_regs>();
      produce(p, smem, k, batch, range.key_end, range.n_begin, range.n_end);
    } else {
      sm90::setmaxnreg_inc<kTraits.consumer_regs>();
      consume(p, smem, seq, batch, kv_head, row0, split, range);
    }
  }

  // A tile chunk by chunk: eight threads a row's 128 bytes of the chunk, each thread the same four rows (16 apart) of
  // every chunk, located once per tile; keys from key_end on are zero-filled. Each thread's copies of a chunk arrive
  // on the chunk's full barrier as they land (cp.async's mbarrier arrival), so the producer never waits for a load,
  // only for a slot, and S starts on a tile's first chunks while the rest land.
  static __device__ void produce(const AttnDecodeParams& p, u32 smem, const u16* k, int batch, int key_end,
                                 int n_begin, int n_end) {
    constexpr int kRowsPerThread = kBlockN * 8 / 128;
    const int unit = threadIdx.x % 8;
    const int* pages = kPaged ? p.block_table + batch * p.block_table_stride : nullptr;
    for (int it = 0; it < n_end - n_begin; ++it) {
      const int slot = it % kStages;
      sm90::mbarrier_wait(smem + empty(slot), ((it / kStages) & 1) ^ 1);
      const u16* src[kRowsPerThread];
      bool valid[kRowsPerThread];
#pragma unroll
      for (int n = 0; n < kRowsPerThread; ++n) {
        const int key = (n_begin + it) * kBlockN + threadIdx.x / 8 + 16 * n;
        valid[n] = key < key_end;
        src[n] = k + unit * 8;
        if (valid[n]) {
          const CacheRow at = cache_row<kPaged>(p, pages, batch, key);
          src[n] += at.page * p.k_batch_stride + at.row * p.k_row_stride;
        }
      }
      const u32 dst = smem + tile(slot);
#pragma unroll
      for (int c = 0; c < kTraits.chunks; ++c) {
#pragma unroll
        for (int n = 0; n < kRowsPerThread; ++n) {
          const int row = threadIdx.x / 8 + 16 * n;
          sm80::cp_async_16_stream(dst + c * kChunkBytes + swizzled(row, unit), src[n] + c * 64, valid[n]);
        }
        sm90::cp_async_mbarrier_arrive(smem + full(slot, c));
      }
    }
    sm80::cp_async_commit();
    sm80::cp_async_wait<0>();  // no copy outlives its thread
  }

  static __device__ void consume(const AttnDecodeParams& p, u32 smem, const DecodeSequence& seq, int batch,
                                 int kv_head, int row0, int split, const DecodeRange<Variant, kBlockN>& range) {
    const int n_begin = range.n_begin, n_end = range.n_end, full_begin = range.full_begin, full_end = range.full_end;
    const int packed_rows = p.group_size * p.seqlen_q;
    const int consumer = sm90::warpgroup_index() - 1;  // its half of O's columns; it owns the blocks of its parity
    const int ctid = threadIdx.x - 128;
    const int warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;

    // Q: packed row r is token (row0 + r) / group of query head kv_head * group + (row0 + r) % group.
    const u16* q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride;
    for (int i = ctid; i < kRows * kUnits; i += 256) {
      const int r = i / kUnits;
      const int unit = i % kUnits;
      const int packed = row0 + r;
      const bool valid = packed < packed_rows;
      const u16* src = q;
      if (valid) {
        const int head = kv_head * p.group_size + packed % p.group_size;
        src = q + (packed / p.group_size) * p.q_row_stride + head * p.q_head_stride + unit * 8;
      }
      sm80::cp_async_16(smem + (unit / 8) * kChunkBytes + swizzled(r, unit % 8), src, valid);
    }
    sm80::cp_async_commit();
    sm80::cp_async_wait<0>();
    sm90::fence_proxy_async_smem();
    sm90::named_barrier_sync(kQReady, 256);

    // This thread's rows r[h] = 16 * warp + g + 8h of the block's 64, their token and query head.
    int r[2], token[2], head[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r[h] = warp * 16 + g + 8 * h;
      const int packed = row0 + r[h];
      token[h] = packed / p.group_size;
      head[h] = kv_head * p.group_size + packed % p.group_size;
    }
    float folded_scale;
    const float& scale_log2 = row_scale_log2<Variant>(p.variant.scale_log2, seq, folded_scale);

    float acc_o[kOGroups][4];  // (64, kHalfV) fp32: this consumer's columns of O
#pragma unroll
    for (int i = 0; i < kOGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[i][e] = 0.f;
    float row_max[2] = {neg_inf(), neg_inf()};  // running max (log2 units), the same in both consumers
    float row_sum[2] = {0.f, 0.f};              // this thread's columns of the blocks this consumer owns
    float acc_s[kSGroups][4];
    u32 p_frag[kPvSteps][4];

    const u64 desc_q0 = sm90::smem_desc_sw128(smem, 16, 1024);
    const u32 v_columns = consumer * (kHalfV / 64) * kChunkBytes;
    auto slot_of = [](int it) { return it % kStages; };
    auto phase_of = [](int it) { return static_cast<u32>((it / kStages) & 1); };
    // Chunk c of tile it has landed: its copies, generic-proxy writes, are then ordered before this thread's wgmma
    // reads.
    auto wait_chunk = [&](int it, int c) {
      sm90::mbarrier_wait(smem + full(slot_of(it), c), phase_of(it));
      sm90::fence_proxy_async_smem();
    };
    auto issue_qk = [&](int it) {
      const u64 desc_k0 = sm90::smem_desc_sw128(smem + tile(slot_of(it)), 16, 1024);
#pragma unroll
      for (int kk = 0; kk < kQkSteps; ++kk) {
        if (kk % 4 == 0) {  // each chunk's k-steps once it has landed, behind a fence of the wait's registers
          wait_chunk(it, kk / 4);
          sm90::wgmma_fence();
        }
        const u32 offset = (kk / 4) * kChunkBytes + (kk % 4) * 32;
        sm90::WgmmaSS<kBlockN>::template run<kElem>(acc_s, sm90::smem_desc_advance(desc_q0, offset),
                                                     sm90::smem_desc_advance(desc_k0, offset), kk > 0 ? 1 : 0);
      }
      sm90::wgmma_commit();
    };
    auto v_desc = [&](int it, int j) {
      return sm90::smem_desc_advance(sm90::smem_desc_sw128(smem + tile(slot_of(it)) + v_columns, kChunkBytes, 1024),
                                     j * 16 * kRowBytes);
    };
    // This thread's arrival on the tile's empty barrier, after its P V (and, in the owner, its writes of P): the
    // producer's refill comes after every consumer thread's.
    auto release = [&](int it) { sm90::mbarrier_arrive(smem + empty(slot_of(it))); };
    auto rescale = [&](const float (&correction)[2]) {
      if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
        softmax::scale_rows(acc_o, correction);
      }
    };

    // A block the other consumer owns: once the owner has published P and the rows' statistics, O's rescaling and
    // P V of this consumer's half, P read from shared memory; with_next then issues S of the next block (this
    // consumer's) behind it, and the tile is released as soon as P V is done, so that the producer refills it while
    // S runs. Each branch holds whole wgmma stages (ptxas serializes every wgmma of a kernel that issues one under a
    // branch inside a stage).
    auto other_block = [&](int it, auto with_next) {
      const u32 stats = (it % 2) * kRows * 4;
      sm90::mbarrier_wait(smem + published(it % 2), static_cast<u32>((it / 2) & 1));
      float correction[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[h] = __uint_as_float(sm90::ld_shared_u32(smem + kMaxOffset + stats + 4 * r[h]));
        correction[h] = __uint_as_float(sm90::ld_shared_u32(smem + kCorrectionOffset + stats + 4 * r[h]));
        row_sum[h] *= correction[h];
      }
      for (int c = 0; c < kTraits.chunks_v; ++c) wait_chunk(it, c);
      rescale(correction);
      const u64 desc_p0 = sm90::smem_desc_sw128(smem + tile(slot_of(it)) + kPChunk * kChunkBytes, 16, 1024);
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kPvSteps; ++j) {
        sm90::WgmmaSSKMN<kHalfV>::template run<kElem>(acc_o, sm90::smem_desc_advance(desc_p0, j * 32), v_desc(it, j),
                                                      1);
      }
      sm90::wgmma_commit();
      if constexpr (decltype(with_next)::value) {
        issue_qk(it + 1);
        sm90::wgmma_wait<1>();  // P V is done, the next S may still run
      } else {
        sm90::wgmma_wait<0>();
      }
      sm90::pin_registers(acc_o);
      release(it);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(acc_s);
    };

    const int n_blocks = n_end - n_begin;
    bool s_done = false;  // S of the block about to be owned was issued and is complete
    for (int it = 0; it < n_blocks; ++it) {
      const int n = n_begin + it;
      const u32 stats = (it % 2) * kRows * 4;
      if (it % 2 == consumer) {
        if (!s_done) {
          issue_qk(it);
          sm90::wgmma_wait<0>();
        }
        sm90::pin_registers(acc_s);
        const auto row_at = [&](int h) { return TileRow{head[h], token[h]}; };
        if (n < full_begin || n >= full_end) {
          variant_scores_at<Variant, kSGroups, true>(seq, acc_s, batch, row_at, n * kBlockN, t);
        } else {
          variant_scores_at<Variant, kSGroups, false>(seq, acc_s, batch, row_at, n * kBlockN, t);
        }
        float correction[2];
        bool moves[2];
        float block_max[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          block_max[h] = softmax::block_max<kSGroups>(acc_s, h, scale_log2);
          moves[h] = softmax::max_moves(block_max[h], row_max[h]);
        }
        const bool any_moves = __any_sync(0xffffffffu, moves[0] || moves[1]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          correction[h] = any_moves ? softmax::move_max(moves[h], block_max[h], row_max[h]) : 1.f;
          row_sum[h] = row_sum[h] * correction[h] + softmax::exponentiate<kSGroups, true>(acc_s, h, row_max[h], scale_log2);
        }
        // P into the tile's chunk past the values, 16-bit, swizzled as Q; the rows' max and correction beside.
        const u32 sp = smem + tile(slot_of(it)) + kPChunk * kChunkBytes;
#pragma unroll
        for (int i = 0; i < kSGroups; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            sm90::st_shared_u32(sp + swizzled(r[h], i) + 4 * t, sm80::pack2<kElem>(acc_s[i][2 * h], acc_s[i][2 * h + 1]));
          }
        if (t == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            sm90::st_shared_u32(smem + kMaxOffset + stats + 4 * r[h], __float_as_uint(row_max[h]));
            sm90::st_shared_u32(smem + kCorrectionOffset + stats + 4 * r[h], __float_as_uint(correction[h]));
          }
        }
        sm90::fence_proxy_async_smem();
        sm90::mbarrier_arrive(smem + published(it % 2));
        sm80::pack_a_steps<kElem, kPvSteps>(p_frag, acc_s);
        rescale(correction);
        sm90::wgmma_fence();
#pragma unroll
        for (int j = 0; j < kPvSteps; ++j) sm90::WgmmaRS<kHalfV>::template run<kElem>(acc_o, p_frag[j], v_desc(it, j), 1);
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::pin_registers(acc_o);
        release(it);
        s_done = false;
      } else if (it + 1 < n_blocks) {
        other_block(it, sm80::BoolConstant<true>{});  // the next block is this consumer's: its S runs meanwhile
        s_done = true;
      } else {
        other_block(it, sm80::BoolConstant<false>{});
      }
    }

    // Each consumer summed P over the blocks it owned: the rows' sums are the two consumers' parts, added in one
    // order by both.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float part = sm80::quad_sum(row_sum[h]);
      if (t == 0) sm90::st_shared_u32(smem + kSumOffset + (consumer * kRows + r[h]) * 4, __float_as_uint(part));
    }
    sm90::named_barrier_sync(kSumsReady, 256);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = __uint_as_float(sm90::ld_shared_u32(smem + kSumOffset + r[h] * 4)) +
                  __uint_as_float(sm90::ld_shared_u32(smem + kSumOffset + (kRows + r[h]) * 4));
      const int packed = row0 + r[h];
      if (packed >= packed_rows) continue;
      float m = row_max[h];
      // The sink joins the row once: here with one range, else where the combine kernel merges the ranges.
      const float inv = softmax::row_end_factor(p.splits > 1 ? nullptr : p.variant.sinks, head[h], m, sum);
      const float lse = softmax::lse(m, sum);
      const long long row = (static_cast<long long>(batch) * p.heads_q + head[h]) * p.seqlen_q + token[h];
      const int col0 = consumer * kHalfV + 2 * t;
      if (p.splits > 1) {
        const long long part = static_cast<long long>(split) * p.batch * p.heads_q * p.seqlen_q + row;
        float* o = p.o_partial + part * kHeadDimV + col0;
#pragma unroll
        for (int i = 0; i < kOGroups; ++i) {
          *reinterpret_cast<float2*>(o + 8 * i) = make_float2(acc_o[i][2 * h] * inv, acc_o[i][2 * h + 1] * inv);
        }
        if (consumer == 0 && t == 0) p.lse_partial[part] = lse;
      } else {
        u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + token[h] * p.o_row_stride +
                 head[h] * p.o_head_stride + col0;
#pragma unroll
        for (int i = 0; i < kOGroups; ++i) {
          *reinterpret_cast<u32*>(o + 8 * i) = sm80::pack2<kElem>(acc_o[i][2 * h] * inv, acc_o[i][2 * h + 1] * inv);
        }
        if (consumer == 0 && t == 0 && p.lse != nullptr) p.lse[row] = lse;
      }
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this template on its own.
struct FlashgenDefaultDecodeSm90Config {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kBFloat16;
  static constexpr int kHeadDim = 576;
  static constexpr int kHeadDimV = 512;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kStages = 2;
  static constexpr bool kPaged = true;
};

extern "C" __global__ void __launch_bounds__(flashgen::DecodeSm90<FlashgenDefaultDecodeSm90Config>::kThreads, 1)
    decode_sm90_standalone_attend(const __grid_constant__ flashgen::AttnDecodeParams params) {
  flashgen::DecodeSm90<FlashgenDefaultDecodeSm90Config>::run(params);
}
#endif
