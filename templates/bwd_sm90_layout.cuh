// The Hopper backward's compile-time shape (bwd_sm90.cuh): the config's sizes, the shared-memory layout of the
// tiles and mbarriers, the hardware barrier ids, the ring's phases and the swizzled offset of a tile element. The
// scheduler, producer, dQ writer, consumer and epilogue derive from it.
#pragma once

#include "attn_params.cuh"
#include "bwd_traits.cuh"
#include "sequence.cuh"
#include "sm90_primitives.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90Layout {
  using u32 = sm90::u32;
  using u64 = sm90::u64;

  static constexpr bool kDeterministic = !Cfg::kAtomicDq;
  // The generator decides lock_step from the config (BwdConfig::sm90_lock_step), as the host's sizes follow it.
  static_assert(Cfg::kLockStep == bwd_sm90_lock_step(Cfg::Variant::kWideScoreWork),
                "the config's kLockStep disagrees with its variant (bwd_sm90_lock_step)");
  static constexpr BwdSm90Traits kTraits =
      bwd_sm90_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Cfg::kLockStep,
                      ConfigHeadDimV<Cfg>::value);
  static_assert(kTraits.error == nullptr, "invalid sm90 backward config: see bwd_sm90_traits() in bwd_traits.cuh");
  static_assert(Cfg::kPadRows == kBwdSm90PadRows, "the sm90 family reads whole query blocks of the workspace");
  static_assert(Cfg::kDqAccum == DqAccum::kTiles, "the sm90 family adds dQ tiles in accumulator order");
  // The deterministic order takes the key blocks that visit a query block, from its last down to its first
  // (KeyBlocks' end - 1 down to begin, a window's first being past block 0), to add its dQ in turn: true while
  // the query blocks a key block visits start no earlier than the previous key block's, as for every policy
  // whose rows see one run of keys whose ends grow with the row (variant.cuh).

  static constexpr ElemType kElem = Cfg::kElem;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;  // packed sequences (sequence.cuh)
  using Variant = typename Cfg::Variant;
  static constexpr int kHeadDim = Cfg::kHeadDim;      // the problem's: columns past it are never stored
  static constexpr int kTileDim = kTraits.tile_dim;  // the tiles' and the dQ accumulator's (whole 64-column chunks)
  static constexpr int kHeadDimV = ConfigHeadDimV<Cfg>::value;  // the values' (v, dO, dV): kHeadDim unless their own
  static constexpr int kTileDimV = kTraits.tile_dim_v;          // the V and dO tiles' and dV's
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kConsumers = kTraits.consumers;
  static constexpr int kThreads = kTraits.threads;
  // Tiles of 192 and 256 columns: both consumers see the block's 64 keys, consumer 0 computes Sᵀ and dK,
  // consumer 1 dPᵀ and dV (Part); without room for the staged tile they add dQ from registers.
  static constexpr bool kDkdvSplit = kTraits.dkdv_split;
  // Tiles of 128 columns on 64-key blocks: both consumers see the block's 64 keys and take turns over the
  // steps (consumer c computes steps c, c + 2, ... whole, into a dQ tile of its own), meeting at no barrier
  // until the end, where consumer 0 sums and stores dK and consumer 1 dV.
  static constexpr bool kQuerySplit = kTraits.query_split;
  static constexpr int kStepConsumers = kQuerySplit ? 2 : 1;  // consumers taking turns over the steps
  static constexpr bool kDqStaged = kTraits.dq_staged;
  // 64-column tiles: each step adds the previous step's dQ (see consume).
  static constexpr bool kDeferDq = kTraits.defer_dq;
  // 128-column tiles on 128-key blocks with 2 stages: the consumers take turns issuing their products (see
  // consume), over kDsTiles dSᵀ tiles.
  static constexpr bool kPingPong = kTraits.ping_pong;
  static constexpr int kDsTiles = kTraits.ds_tiles;
  // Nothing zeroes the dQ accumulator: a query block's first add stores (write_dq).
  static constexpr bool kFirstAddStores = dq_first_add_stores(DqAccum::kTiles, Cfg::kHeadDim, Cfg::kBlockM,
                                                              Cfg::kBlockN, Cfg::kStages, kDeterministic,
                                                              Variant::kHidesKeys, kHeadDimV);

  // Tiles are stored as 64-column chunks of 128-byte rows, chunk after chunk, swizzled in 1024-byte
  // atoms of 8 rows (what TMA writes with 128-byte swizzling and wgmma descriptors read), as in
  // fwd_sm90.cuh. dSᵀ is stored keys x queries: its chunks are 64 queries wide.
  static constexpr u32 kRowBytes = 128;
  static constexpr int kChunks = kTileDim / 64;
  static constexpr int kChunksV = kTileDimV / 64;
  // Layout: K | V | kStages x [Q | dO] | kDsTiles x dSᵀ | dQ | exchange | kStages x [LSE | D] | barriers. Every
  // tile starts on a 1024-byte boundary (all tile sizes are multiples of 1024): TMA, wgmma and the swizzled
  // stores below all derive the swizzle from address bits, relative to the atom.
  static constexpr u32 kKTileBytes = kBlockN * kTileDim * 2;
  static constexpr u32 kVTileBytes = kBlockN * kTileDimV * 2;
  static constexpr u32 kQTileBytes = kBlockM * kTileDim * 2;
  static constexpr u32 kDoTileBytes = kBlockM * kTileDimV * 2;
  static constexpr u32 kStageBytes = kQTileBytes + kDoTileBytes;
  static constexpr u32 kDsTileBytes = kBlockN * kBlockM * 2;
  // fp32, (kBlockM / 64, kChunks) chunks of 64 x 64
  static constexpr u32 kDqTileBytes = kDqStaged ? kBlockM * kTileDim * 4 : 0;  // one query block's
  static constexpr int kDqTiles = kTraits.dq_tiles;  // one per consumer with the query split
  // With the turns (kPingPong) consumer c fills the tile's contiguous half c (its 64 columns) half a step after
  // the other, so the writer adds and hands back each half on its own; in lock step both halves are ready
  // together and one add costs less.
  static constexpr int kDqParts = kPingPong ? 2 : 1;
  static constexpr u32 kDqPartBytes = kDqTileBytes / kDqParts;
  static constexpr u32 kDqChunkBytes = 64 * 64 * 4;
  // The dK/dV split's exchange tile: (64 keys, kBlockM) fp32 values, a thread's accumulator group i at
  // 16 * (128 * i + its index in the warpgroup), so each warp's 16-byte accesses are 512 consecutive bytes.
  static constexpr u32 kExchangeBytes = kTraits.smem_exchange_bytes;
  static constexpr u32 kRowStatsBytes = 2 * kBlockM * 4;      // LSE and D of one stage
  static constexpr u32 kVOffset = kKTileBytes;
  static constexpr u32 kStageOffset = kKTileBytes + kVTileBytes;
  static constexpr u32 kDsOffset = kStageOffset + kStages * kStageBytes;
  static constexpr u32 kDqOffset = kDsOffset + kDsTiles * kDsTileBytes;
  static constexpr u32 kExchangeOffset = kDqOffset + kDqTiles * kDqTileBytes;
  static constexpr u32 kRowStatsOffset = kExchangeOffset + kExchangeBytes;
  static constexpr u32 kBarrierOffset = kRowStatsOffset + kStages * kRowStatsBytes;
  static_assert(kKTileBytes % 1024 == 0 && kVTileBytes % 1024 == 0 && kQTileBytes % 1024 == 0 &&
                    kDoTileBytes % 1024 == 0 && kDsTileBytes % 1024 == 0,
                "tiles must keep 1024-byte alignment");
  static_assert(kDqTiles * kDqTileBytes == kTraits.smem_dq_bytes, "dQ tile and traits disagree");
  static_assert(!kQuerySplit || (kDqStaged && !kDkdvSplit && kStages >= 2), "the query split stages dQ");
  static_assert(!kPingPong || (kDeferDq && kDqStaged && !kDkdvSplit && !kQuerySplit && kTraits.dq_row_tiles == 1 &&
                               kTraits.dq_passes == 1 && kTraits.consumers == 2),
                "the consumers' turns take one dQ pass of 64 rows each, deferred a step");
  static_assert(kPingPong || kDsTiles == 2, "steps alternate between two dSᵀ tiles");
  static_assert(kBarrierOffset + kTraits.mbarriers * 8 + 1024 == kTraits.smem_bytes, "layout and traits disagree");

  static constexpr int kSGroups = kBlockM / 8;   // accumulator groups of Sᵀ, dPᵀ: (16 keys, 8 queries) per warp
  static constexpr int kMSteps = kBlockM / 16;   // k-steps of dV += Pᵀ dO and dK += dSᵀ Q
  static constexpr int kDSteps = kTileDim / 16;   // k-steps of Sᵀ
  static constexpr int kDStepsV = kTileDimV / 16; // k-steps of dPᵀ
  static constexpr int kNSteps = kBlockN / 16;   // k-steps of dQ = dS K
  static constexpr int kDGroups = kTileDim / 8;    // accumulator groups of dK
  static constexpr int kDGroupsV = kTileDimV / 8;  // and of dV
  static constexpr int kDqRowTiles = kTraits.dq_row_tiles;
  static constexpr int kDqCols = kTraits.dq_cols;
  static constexpr int kDqGroups = kDqCols / 8;
  static constexpr int kDqPasses = kTraits.dq_passes;  // a consumer's dQ columns, kDqCols at a time (the most)
  static constexpr int kDqColParts = kDkdvSplit ? 2 : kTileDim / kDqCols;  // consumers sharing a 64-row tile of dQ
  static_assert(kDqParts == 1 || (!kQuerySplit && kTraits.dq_row_tiles == 1 && kDqColParts == kDqParts),
                "a part of the dQ tile is one consumer's 64-column chunk");

  // Hardware barriers: 0 is __syncthreads, 1 all consumers (dSᵀ staged; K and V free), 2 + c consumer c,
  // and per consumer c with the dQ writer warp: 4 + c its share of the dQ tile stored, 6 + c the tile free;
  // with kPingPong, 8 + c consumer c's turn to issue its products (the other consumer arrives).
  // The dK/dV split's consumers also meet at 1 when dPᵀ is in the exchange tile and when Pᵀ's fragments
  // are (both sides wait, which costs little as the other side is there or nearly; with a bar.arrive on
  // one side compute-sanitizer's racecheck reported the exchange tile's accesses as racing).
  static constexpr unsigned kConsumersBarrier = 1;
  // What a consumer computes: everything for 64 keys of its own, or with the dK/dV split Sᵀ, dSᵀ and dK
  // (kScores) or dPᵀ and dV (kGrads) for the block's 64 keys.
  enum class Part { kBoth, kScores, kGrads };
  static constexpr unsigned kDqWriterThreads = 128 + 32;
  static __device__ unsigned dq_full_barrier(int consumer) { return 4 + consumer; }
  static __device__ unsigned dq_empty_barrier(int consumer) { return 6 + consumer; }
  static __device__ unsigned turn_barrier(int consumer) { return 8 + consumer; }
  // Every consumer at barrier 1: from different instructions where the consumers run different code.
  static __device__ void consumers_sync() {
    if constexpr (kDkdvSplit) {
      sm90::named_barrier_sync_unaligned(kConsumersBarrier, kConsumers * 128);
    } else {
      sm90::named_barrier_sync(kConsumersBarrier, kConsumers * 128);
    }
  }
  static constexpr int kDqWriterWarp = 1;  // of the producer warpgroup; thread 0 of warp 0 loads tiles
  static constexpr int kTurnWarp = 2;       // passes the deterministic strategy's turns on (pass_turns)
  static constexpr int kTurnWatchWarp = 3;  // watches for them to come (watch_turns)

  struct Barriers {
    u32 base;  // kv_full, full[kStages], empty[kStages], with kDeferDq ds_full[kDsTiles] and ds_empty[kDsTiles], then
               // turn_ready[2], turn_free[2], turn_seen[2] and turn_taken[2], with the query split partials
    __device__ u32 kv_full() const { return base; }
    __device__ u32 full(int s) const { return base + 8 * (1 + s); }
    __device__ u32 empty(int s) const { return base + 8 * (1 + kStages + s); }
    // dSᵀ tile b holds every consumer's dSᵀ of a step / has been read by every consumer's dQ product.
    __device__ u32 ds_full(int b) const { return base + 8 * (1 + 2 * kStages + b); }
    __device__ u32 ds_empty(int b) const { return base + 8 * (1 + 2 * kStages + kDsTiles + b); }
    // The deterministic strategy's ring from the dQ writer to the turn passer (pass_turns): slot b holds an add
    // whose writes are done / has had its turn passed on.
    __device__ u32 turn_ready(int b) const { return base + 8 * (kTurnBarrier0 + b); }
    __device__ u32 turn_free(int b) const { return base + 8 * (kTurnBarrier0 + 2 + b); }
    // The ring from the turn watcher to the dQ writer (watch_turns): slot b's turn has come / has been taken.
    __device__ u32 turn_seen(int b) const { return base + 8 * (kTurnBarrier0 + 4 + b); }
    __device__ u32 turn_taken(int b) const { return base + 8 * (kTurnBarrier0 + 6 + b); }
    // With the query split: both consumers' partial dK and dV are in the ring's stages (the epilogue).
    __device__ u32 partials() const { return base + 8 * (kTurnBarrier0 + 8); }
    static constexpr int kTurnBarrier0 = 1 + 2 * kStages + (kDeferDq ? 2 * kDsTiles : 0);
  };
  static_assert(kTraits.mbarriers == Barriers::kTurnBarrier0 + 8 + (kQuerySplit ? 1 : 0),
                "the barriers and the traits disagree");

  static __device__ u32 ring_phase(int it) { return static_cast<u32>((it / kStages) & 1); }
  static __device__ u32 turn_ring_phase(int it) { return static_cast<u32>((it / 2) & 1); }  // the two-slot rings

  // Byte offset of 16-bit element (row, col) in a swizzled tile of `rows` rows per 64-column chunk.
  static __device__ __forceinline__ u32 swizzled(int rows, int row, int col) {
    return (col / 64) * rows * kRowBytes + row * kRowBytes + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// The default config of the Hopper backward's files, each of which `nvcc -DFLASHGEN_STANDALONE
// -gencode=arch=compute_90a,code=sm_90a -c` compiles on its own with it.
struct FlashgenDefaultBwdSm90Config {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kBFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  static constexpr bool kAtomicDq = true;
  static constexpr flashgen::DqAccum kDqAccum = flashgen::DqAccum::kTiles;
  static constexpr int kPadRows = flashgen::kBwdSm90PadRows;
  static constexpr bool kLockStep = false;
};
template struct flashgen::BwdSm90Layout<FlashgenDefaultBwdSm90Config>;
#endif
