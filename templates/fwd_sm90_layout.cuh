// The Hopper forward's compile-time shape (fwd_sm90.cuh): the config's sizes, the shared-memory layout of
// one group's tiles and mbarriers, the hardware barrier ids, the K/V ring's slots and phases, and the
// swizzled store of an accumulator. The scheduler, producer, consumer and epilogue derive from it.
#pragma once

#include "attn_params.cuh"
#include "sequence.cuh"
#include "fwd_traits.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90Layout {
  using u32 = sm90::u32;
  using u64 = sm90::u64;

  static constexpr FwdSm90Traits kTraits =
      fwd_sm90_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Cfg::kPingPong, Cfg::kPersistent,
                      Cfg::kPSmem, Cfg::kCluster, Cfg::kMask, Cfg::kGroups, Cfg::kTensorSum, Cfg::kElem,
                      ConfigPaged<Cfg>::value, ConfigHeadDimV<Cfg>::value, ConfigValueSplit<Cfg>::value);
  static_assert(kTraits.error == nullptr, "invalid sm90 forward config: see fwd_sm90_traits() in fwd_traits.cuh");
  // The two blocks of a cluster load each K and V tile once for both: they must visit the same key blocks.
  static_assert(Cfg::kCluster == 1 || !Cfg::Variant::kHidesKeys, "clusters take variants that hide no key");

  using Variant = typename Cfg::Variant;
  static constexpr ElemType kElem = Cfg::kElem;            // q's, k's and v's
  static constexpr ElemType kOutElem = ConfigOutElem<Cfg>::value;  // the output's: kElem, or 16-bit beside FP8
  // FP8: both products on 8-bit wgmma (k-steps of 32), V read as Vᵀ, P rounded to e4m3 (fwd_traits.cuh).
  static constexpr bool kFp8 = is_fp8(kElem);
  static_assert(!is_fp8(kOutElem), "the output is 16-bit");
  // FP8: P is rounded to e4m3 as P · 2^kPBias (the exponent taken off the running max, no multiply), so values down
  // to 2^-(6 + kPBias) keep their mantissa (e4m3's subnormals start at 2^-6); the rows' sums carry the same factor,
  // and the epilogue takes kPBias back off the max for the LSE and the sink. The max moves with every rise (no lazy
  // slack, softmax.cuh): a row's largest P is then 2^8 exactly, where a lazy max would round the key that dominates a
  // peaked row by up to 2^-4 (bench/notes_fwd_sm90.md, "FP8").
  static constexpr int kRescaleSlack = kFp8 ? 0 : softmax::kRescaleSlack;
  static constexpr float kPBias = kFp8 ? 8.f : 0.f;
  static constexpr int kHeadDim = Cfg::kHeadDim;      // the problem's: columns past it are never stored
  static constexpr int kTileDim = kTraits.tile_dim;  // the tiles': whole 64-column chunks (fwd_traits.cuh)
  static constexpr int kHeadDimV = ConfigHeadDimV<Cfg>::value;  // the values' and the output's
  static constexpr int kTileDimV = kTraits.tile_dim_v;          // the V tiles' and the output's columns
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  static constexpr bool kOverlap = Cfg::kOverlap;
  static constexpr bool kPingPong = Cfg::kPingPong;
  static constexpr bool kPersistent = Cfg::kPersistent;
  static constexpr bool kPSmem = Cfg::kPSmem;
  static constexpr int kCluster = Cfg::kCluster;
  static constexpr int kGroups = Cfg::kGroups;
  static constexpr bool kTensorSum = Cfg::kTensorSum;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)
  static_assert(!kVarlen || (!kPersistent && kCluster == 1 && kGroups == 1),
                "packed batches run one block per tile: no persistent walk, cluster or groups");
  static constexpr bool kPaged = ConfigPaged<Cfg>::value;  // their keys and values in a paged cache
  static_assert(!kPaged || kVarlen, "a paged cache holds the keys of packed batches");
  static constexpr int kConsumers = kTraits.consumers;  // per group
  // Consumers per 64 query rows: consumer c computes rows 64 * (c / kValueSplit) on, and O's columns
  // kPartDimV * (c % kValueSplit) on.
  static constexpr int kValueSplit = ConfigValueSplit<Cfg>::value;
  static constexpr int kPartDimV = kTraits.part_dim_v;
  static constexpr int kThreads = kTraits.threads;

  // Every tile is stored as kChunks (V and the output: kChunksV) column chunks of 128-byte rows (kChunkCols
  // elements: 64 of 16 bits, 128 of 8), chunk after chunk, each swizzled in 1024-byte atoms of 8 rows: the layout
  // TMA writes with 128-byte swizzling and the one wgmma descriptors read. FP8's Vᵀ tile is kChunksV chunks of 128
  // keys, each of kTileDimV rows.
  static constexpr int kChunkCols = sm90_chunk_cols(kElem);
  static constexpr int kChunks = kTileDim / kChunkCols;
  static constexpr int kChunksV = kFp8 ? kBlockN / 128 : kTileDimV / 64;
  static constexpr int kChunksPart = kPartDimV / 64;  // of one consumer's O columns
  static constexpr int kChunksOut = kTraits.out_dim_v / 64;  // of the output's staged columns (kChunksV or one less)
  static constexpr u32 kRowBytes = 128;
  static constexpr u32 kElemBytes = elem_bytes(kElem);
  static constexpr u32 kQBytes = kBlockM * kTileDim * kElemBytes;     // (kChunks, kBlockM, kChunkCols)
  static constexpr u32 kTileBytes = kBlockN * kTileDim * kElemBytes;  // one K tile: (kChunks, kBlockN, kChunkCols)
  // One V tile: (kChunksV, kBlockN, 64), or FP8's Vᵀ (kChunksV, kTileDimV, 128)
  static constexpr u32 kTileBytesV = kBlockN * kTileDimV * kElemBytes;
  static constexpr u32 kKOffset = kQBytes;
  static constexpr u32 kVOffset = kKOffset + kStages * kTileBytes;
  // kPSmem: consumer c's P, (kPChunks, 64, 64), at kPOffset + c * kPBytes.
  static constexpr int kPChunks = (kBlockN + 63) / 64;
  static constexpr u32 kPBytes = kPChunks * 64 * kRowBytes;
  static constexpr u32 kPOffset = kVOffset + kStages * kTileBytesV;
  // Output staging rows apart from Q's: where there is room, and always where the output is wider than Q.
  static constexpr bool kOwnO = kTraits.smem_o_bytes > 0;
  static constexpr u32 kOOffset = kPOffset + kTraits.smem_p_bytes;  // (kChunksOut, kBlockM, 64) when kOwnO
  // kTensorSum: 1024 bytes of ones (16-bit), B of the rows' sums P (64, kBlockN) x ones (kBlockN, 8).
  static constexpr u32 kOnesOffset = kOOffset + kTraits.smem_o_bytes;
  static constexpr u32 kBarrierOffset = kOnesOffset + kTraits.smem_ones_bytes;
  static_assert(kTraits.smem_p_bytes == (kPSmem ? kConsumers * kPBytes : 0), "layout and traits disagree");
  static_assert(kBarrierOffset + (3 + 4 * kStages) * 8 == kTraits.smem_group_bytes, "layout and traits disagree");
  // With kGroups == 2 the block holds two such layouts, kGroupStride bytes apart, each with its own barriers.
  static constexpr u32 kGroupStride = kTraits.smem_group_stride;
  static_assert(kGroupStride % 1024 == 0 &&
                    kTraits.smem_bytes == (kGroups - 1) * kGroupStride + kTraits.smem_group_bytes + 1024,
                "layout and traits disagree");

  static constexpr int kSGroups = kBlockN / 8;   // accumulator groups of S: (16 rows, 8 keys) per warp
  static constexpr int kOGroups = kPartDimV / 8;  // accumulator groups of a consumer's O columns
  // k-steps of 32 bytes: 16 elements of 16 bits, 32 of 8
  static constexpr int kKStep = 32 / kElemBytes;
  static constexpr int kPSteps = kBlockN / kKStep;   // k-steps of O += P V
  static constexpr int kQkSteps = kTileDim / kKStep;  // k-steps of S = Q Kᵀ

  // Hardware barriers: 0 is __syncthreads, 1 + w consumer warpgroup w's own (P staging, epilogue; w counts
  // the block's consumers), kTurnBarrier + 2 * g + c the ping-pong turn of consumer c of group g, then with
  // kValueSplit kSliceBarrier + s the consumers of 64-row slice s (of group 0: the split takes no groups).
  static constexpr unsigned kTurnBarrier = 5;
  static constexpr unsigned kSliceBarrier = kTurnBarrier + 2 * kGroups;
  static_assert(kGroups * kConsumers < kTurnBarrier && kSliceBarrier + kConsumers / kValueSplit <= 16,
                "hardware barrier ids");

  // A consumer's 64 query rows (as 64-row slices of the tile) and its part of O's columns.
  static __device__ __forceinline__ int row_slice(int consumer) { return consumer / kValueSplit; }
  static __device__ __forceinline__ int value_part(int consumer) { return consumer % kValueSplit; }

  // The ping-pong turn of consumer c of group g: synced by c, arrived at by the other consumer.
  static __device__ unsigned turn_barrier(int group, int consumer) {
    return kTurnBarrier + 2 * static_cast<unsigned>(group) + static_cast<unsigned>(consumer);
  }

  struct Barriers {
    // q_full, q_empty, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages], then two
    // 32-bit tile slots
    u32 base;
    __device__ u32 q_full() const { return base; }
    // The consumers are done with the Q rows: their last S is complete (kOwnO), or their output has left.
    __device__ u32 q_empty() const { return base + 8; }
    __device__ u32 k_full(int s) const { return base + 8 * (2 + s); }
    __device__ u32 v_full(int s) const { return base + 8 * (2 + kStages + s); }
    __device__ u32 k_empty(int s) const { return base + 8 * (2 + 2 * kStages + s); }
    __device__ u32 v_empty(int s) const { return base + 8 * (2 + 3 * kStages + s); }
    __device__ u32 tile_slot(int j) const { return base + 8 * (2 + 4 * kStages) + 4 * j; }
  };

  // Key block it of a tile (0 = its last block) is block first_block + it of the block's K/V rings: ring
  // slot (first_block + it) % kStages, filled in phase ((first_block + it) / kStages) & 1.
  static __device__ int ring_slot(int block) { return block % kStages; }
  static __device__ u32 ring_phase(int block) { return static_cast<u32>((block / kStages) & 1); }

  // Stores one warpgroup's (64, 8 * kColumnGroups) fp32 accumulator as 16-bit pairs (kOutElem) into rows laid out
  // like the tiles (64-column chunks chunk_bytes apart, 128-byte rows swizzled in 8-row atoms): column
  // 8i + 2t of row r lies in chunk i / 8, 16-byte unit i % 8 ^ r % 8. With kLimited only its first `chunks` chunks.
  template <bool kLimited = false, int kColumnGroups>
  static __device__ __forceinline__ void store_swizzled(u32 rows, u32 chunk_bytes,
                                                       const float (&acc)[kColumnGroups][4], int chunks = 0) {
    const int warp = (threadIdx.x / 32) % 4;
    const int g = threadIdx.x % 32 / 4;
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < kColumnGroups; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kLimited) {
          if (i / 8 >= chunks) break;
        }
        const int row = warp * 16 + g + 8 * h;  // within the warpgroup's 64 rows
        const u32 addr = rows + (i / 8) * chunk_bytes + static_cast<u32>(row) * kRowBytes +
                         static_cast<u32>(((i % 8) ^ (row % 8)) * 16) + 4 * t;
        sm90::st_shared_u32(addr, sm80::pack2<kOutElem>(acc[i][2 * h], acc[i][2 * h + 1]));
      }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// The default config of the Hopper forward's files, each of which `nvcc -DFLASHGEN_STANDALONE
// -gencode=arch=compute_90a,code=sm_90a -c` compiles on its own with it.
struct FlashgenDefaultFwdSm90Config {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  static constexpr bool kOverlap = true;
  static constexpr bool kPingPong = true;
  static constexpr bool kPersistent = true;
  static constexpr bool kPSmem = false;
  static constexpr int kCluster = 1;
  static constexpr int kGroups = 1;
  static constexpr bool kTensorSum = false;
};
template struct flashgen::FwdSm90Layout<FlashgenDefaultFwdSm90Config>;
#endif
