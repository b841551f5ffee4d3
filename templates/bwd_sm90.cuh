// Backward attention for Hopper (sm_90a): the dkdv kernel as a warp-specialized block on TMA and wgmma.
// The row kernels (bwd_rows.cuh) run around it: the preprocess before, the conversion of the fp32 dQ
// accumulator after. Both dQ strategies run this kernel; the deterministic one orders its dQ adds.
// Notation as in bwd_sm80.cuh: S = Q Kᵀ, P recomputed from the saved LSE, dP = dO Vᵀ, dS = P ∘ (dP − D),
// dV = Pᵀ dO, dK = scale · dSᵀ Q, dQ = scale · dS K.
//
// One block per (key block, kv head, batch). Warpgroup 0 is the producer: one thread loads the block's
// K and V once, then streams the Q and dO tiles of every query block of every query head of the group
// through a kStages-deep ring, with the LSE (base 2) and D of their rows (bulk copies from the padded
// workspace); one warp of it, the dQ writer, adds each query block's dQ to the fp32 accumulator.
// Warpgroups 1..kConsumers own 64 keys each. Per query block a consumer computes Sᵀ = K Qᵀ and
// dPᵀ = V dOᵀ with both operands in shared memory, turns them into Pᵀ and dSᵀ in registers, adds
// dV += Pᵀ dO and dK += dSᵀ Q with those as register A operands, and stages dSᵀ in shared memory; once
// every consumer has, each computes its share of dQ = dS K (dSᵀ and K read MN-major) and stores it to the
// dQ tile in shared memory, in the accumulator's own order (DqAccum::kTiles, bwd_traits.cuh). The writer
// adds the tile with one bulk reduce-add (where the consumers take turns, one per consumer's half: kDqParts;
// a query block's first add is a bulk store where nothing zeroes the accumulator: dq_first_add_stores) and
// hands the buffer back; the consumers never wait on a global
// reduction. The deterministic strategy makes those adds take turns in a fixed order of key blocks (a
// semaphore per query block), so repeated runs sum in the same order; the atomic one counts them there, so
// the convert kernel can run beside this one's last blocks. dK and dV leave through the K and V tiles and
// TMA stores. On 64-column tiles a step adds the previous step's dQ, so the consumers meet at no barrier of
// a step (defer_dq); on 128-column tiles with two stages the consumers also take turns issuing their
// products, one computing its softmax while the other's products run (ping_pong). Tiles hold
// head_dim rounded up to whole 64-column chunks (sm90_tile_dim, fwd_traits.cuh): TMA zero-fills the columns
// past it on load and clips them on store, and the dQ accumulator's rows are as wide as the tiles'. Tiles of
// 192 and 256 columns keep 64 keys per block and give its dK to consumer 0 and its dV to consumer 1 instead
// (dK and dV of 256 columns would take 256 registers per thread): consumer 1 computes dPᵀ and passes it to
// consumer 0 through an exchange tile; consumer 0 computes Sᵀ, Pᵀ and dSᵀ, adds dK += dSᵀ Q and passes Pᵀ's
// fragments back for dV += Pᵀ dO; dQ's chunks are shared (at 192: two for consumer 0, one for consumer 1;
// the other way round ptxas spills). Where the staged dQ tile does not fit (256 with two stages, 192 with
// three) each consumer adds its dQ columns with vector reductions in the accumulator's order (in turns, for
// the deterministic strategy). Tiles of 128 columns on 64-key blocks split the steps instead (the query
// split): both consumers see the block's 64 keys, consumer c computes steps c, c + 2, ... whole into a dQ tile
// of its own, with no barrier between the consumers, and at the end consumer 0 sums and stores dK and
// consumer 1 dV.
// Validity rules in bwd_sm90_traits() (bwd_traits.cuh). Masking and scores go through the config's
// Variant (variant.cuh, block_range.cuh).
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "bwd_rows.cuh"
#include "bwd_scores.cuh"
#include "bwd_traits.cuh"
#include "sm80_primitives.cuh"
#include "sequence.cuh"
#include "sm90_primitives.cuh"
#include "sm90_wgmma.cuh"
#include "softmax.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct BwdDkdvSm90 {
  using u32 = sm90::u32;
  using u64 = sm90::u64;

  static constexpr bool kDeterministic = !Cfg::kAtomicDq;
  // The generator decides lock_step from the config (BwdConfig::sm90_lock_step), as the host's sizes follow it.
  static_assert(Cfg::kLockStep == bwd_sm90_lock_step(Cfg::Variant::kWideScoreWork),
                "the config's kLockStep disagrees with its variant (bwd_sm90_lock_step)");
  static constexpr BwdSm90Traits kTraits =
      bwd_sm90_traits(Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Cfg::kLockStep);
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
                                                              Variant::kHidesKeys);

  // Tiles are stored as 64-column chunks of 128-byte rows, chunk after chunk, swizzled in 1024-byte
  // atoms of 8 rows (what TMA writes with 128-byte swizzling and wgmma descriptors read), as in
  // fwd_sm90.cuh. dSᵀ is stored keys x queries: its chunks are 64 queries wide.
  static constexpr u32 kRowBytes = 128;
  static constexpr int kChunks = kTileDim / 64;
  // Layout: K | V | kStages x [Q | dO] | kDsTiles x dSᵀ | dQ | exchange | kStages x [LSE | D] | barriers. Every
  // tile starts on a 1024-byte boundary (all tile sizes are multiples of 1024): TMA, wgmma and the swizzled
  // stores below all derive the swizzle from address bits, relative to the atom.
  static constexpr u32 kKvTileBytes = kBlockN * kTileDim * 2;  // K or V
  static constexpr u32 kQTileBytes = kBlockM * kTileDim * 2;   // Q or dO
  static constexpr u32 kStageBytes = 2 * kQTileBytes;
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
  static constexpr u32 kVOffset = kKvTileBytes;
  static constexpr u32 kStageOffset = 2 * kKvTileBytes;
  static constexpr u32 kDsOffset = kStageOffset + kStages * kStageBytes;
  static constexpr u32 kDqOffset = kDsOffset + kDsTiles * kDsTileBytes;
  static constexpr u32 kExchangeOffset = kDqOffset + kDqTiles * kDqTileBytes;
  static constexpr u32 kRowStatsOffset = kExchangeOffset + kExchangeBytes;
  static constexpr u32 kBarrierOffset = kRowStatsOffset + kStages * kRowStatsBytes;
  static_assert(kKvTileBytes % 1024 == 0 && kQTileBytes % 1024 == 0 && kDsTileBytes % 1024 == 0,
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
  static constexpr int kDSteps = kTileDim / 16;  // k-steps of Sᵀ and dPᵀ
  static constexpr int kNSteps = kBlockN / 16;   // k-steps of dQ = dS K
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

  // This block's key block n_block of batch entry (or packed sequence) `batch` and kv head; where the TMA
  // maps hold its rows (a packed batch is one entry of total rows: its sequence starts at q_row0, k_row0);
  // the query blocks that see some key of it, per query head: m_first .. m_blocks - 1, those in
  // [m_interior, m_interior_end) seeing every key (no mask code; block_range.cuh), walked from
  // m_first + rotation, wrapping.
  struct Work {
    int n_block, n_start, kv_head, batch;
    int q_row0, k_row0, tma_batch;
    int m_blocks, m_first, m_interior, m_interior_end, per_head, iterations, rotation;
  };

  // Which key block of which kv head and batch entry (or packed sequence) this block is: the grid is
  // (key blocks, kv heads, batch), and blocks launch in the order of x, then y, then z. The deterministic
  // strategy takes key blocks last first (see write_dq), so a block waits only on blocks launched before
  // it, or without a mask on blocks of its own launch group (dq_turn). On 128-key blocks it launches them
  // launch_group() key blocks of every (kv head, batch) at a time: a query block's turns then chain the few
  // key blocks of its head that run together rather than all of them, so a late step holds back fewer
  // blocks (bench/notes_bwd_sm90.md, Versions: launch groups).
  // The 64-key blocks of the dK/dV split keep whole heads together: their single stage waits for each Q
  // tile, which a whole head's blocks find in L2 (grouped, they ran slower).
  struct Place {
    int n_block, kv_head, batch;
  };
  // Key blocks per launch group: 8, or on 64-column tiles without a mask, whose steps are short, 2 where a head has
  // fewer than 8 key blocks: its walk is then too short for a group of 8 to rotate (dq_turn), and an unrotated
  // group's blocks all reach query block 0 in the same step (bench/notes_bwd_sm90.md, Versions: launch groups,
  // rotated walks).
  static __device__ int launch_group(int n_blocks) {
    if constexpr (kTileDim == 64 && !Variant::kHidesKeys) {
      return n_blocks < 8 ? 2 : 8;
    } else {
      return 8;
    }
  }
  static __device__ Place place_of_this_block() {
    const int n_blocks = gridDim.x;
    if constexpr (!kDeterministic) {
      return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    } else if constexpr (kDkdvSplit) {
      return {n_blocks - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    } else {
      const int launch = launch_group(n_blocks);
      const int heads = gridDim.y, pairs = gridDim.y * gridDim.z;
      const int linear = blockIdx.x + n_blocks * (blockIdx.y + heads * blockIdx.z);
      const int whole_groups = n_blocks / launch;
      const int group = min(linear / (launch * pairs), whole_groups);  // the last takes what remains
      const int size = group < whole_groups ? launch : n_blocks - whole_groups * launch;
      const int within = linear - group * launch * pairs;
      const int pair = within / size;
      return {n_blocks - 1 - (group * launch + within % size), pair % heads, pair / heads};
    }
  }

  // The deterministic strategy's turns without a mask (dq_turn): key block n_block's launch group (launch_group key
  // blocks, the last group what remains) and its place in the group's launch order; whether the walks rotate. They
  // do where every head's walk is as long as a group (no two blocks of a group start at the same query block) and
  // one launch group of every (batch, kv head) pair fills the SMs (counted by sm_count_bound) with a group to spare:
  // a group then starts once the group before it of its pair has finished, instead of waiting on that group's last
  // adds, which a rotated walk makes at its end (bench/notes_bwd_sm90.md, Versions: rotated walks).
  static constexpr bool kRotatedTurns = kDeterministic && !Variant::kHidesKeys && !kDkdvSplit && !kVarlen;
  struct RotatedTurns {
    int launch, groups_before, index, size;
    bool rotate;
  };
  static __device__ RotatedTurns rotated_turns(const Work& w) {
    RotatedTurns t;
    const int n_blocks = gridDim.x;
    t.launch = launch_group(n_blocks);
    const int order = n_blocks - 1 - w.n_block;  // launch order in the head
    t.groups_before = order / t.launch;
    t.index = order % t.launch;
    const int whole_groups = n_blocks / t.launch;
    t.size = t.groups_before < whole_groups ? t.launch : n_blocks - whole_groups * t.launch;
    t.rotate = w.per_head >= t.launch &&
               static_cast<long long>(gridDim.y) * gridDim.z * t.launch >= sm90::sm_count_bound() + t.launch;
    return t;
  }

  // p: params.base, or with a packed batch the sequence's own (bind_sequence), whose rows are `rows`.
  static __device__ Work work_of(const AttnBwdParams& p, const SequenceRows& rows) {
    const Place place = place_of_this_block();
    Work w;
    w.n_block = place.n_block;
    w.n_start = w.n_block * kBlockN;
    w.kv_head = place.kv_head;
    w.batch = place.batch;
    w.q_row0 = kVarlen ? rows.q_begin : 0;
    w.k_row0 = kVarlen ? rows.k_begin : 0;
    w.tma_batch = kVarlen ? 0 : w.batch;
    const QueryBlocks<Variant, kBlockM, kBlockN> queries(p, w.batch, w.n_start, [&] { return p.seqlen_k - w.n_start; },
                                                         w.kv_head);
    w.m_blocks = queries.end;
    w.m_first = queries.begin;
    w.m_interior = queries.full_begin;
    w.m_interior_end = queries.full_end;
    w.per_head = w.m_blocks - w.m_first;
    w.iterations = w.per_head * p.group_size;
    // Key blocks that see every query block would reach each at the same step, where the atomic
    // strategy's first add stores and the others wait for it (write_dq): each starts at a query block of
    // its own instead. Causal key blocks reach a query block one or two steps apart from the diagonal on,
    // and the deterministic turns follow that order.
    w.rotation = !kDeterministic && kFirstAddStores && w.m_first == 0 && w.per_head > 0 ? w.n_block % w.per_head : 0;
    if constexpr (kRotatedTurns) {
      // The block's launch group and place in it (place_of_this_block): the group's blocks start their walks one
      // query block apart, the first launched furthest on (dq_turn).
      const RotatedTurns t = rotated_turns(w);
      if (t.rotate) w.rotation = t.size - 1 - t.index;
    }
    return w;
  }

  static __device__ int head_of(const AttnBwdParams& p, const Work& w, int it) {
    return w.kv_head * p.group_size + it / w.per_head;
  }
  static __device__ int m_block_of(const Work& w, int it) { return w.m_first + (it + w.rotation) % w.per_head; }
  static __device__ u32 ring_phase(int it) { return static_cast<u32>((it / kStages) & 1); }
  static __device__ u32 turn_ring_phase(int it) { return static_cast<u32>((it / 2) & 1); }  // the two-slot rings

  // The first row of a query block of `head` in the workspace arrays (padded: whole blocks are read and added).
  static __device__ long long workspace_row(const AttnBwdParams& p, const Work& w, int head, int m_start) {
    return bwd::workspace_row0<Cfg>(p, w.batch, head) + m_start;
  }

  // The semaphore of the query block whose first workspace row is row0 (bwd::dq_semaphore), and the count
  // it holds when this key block may add to it under the deterministic strategy (write_dq says in which
  // order).
  static __device__ int* dq_semaphore(const AttnBwdParams& p, long long row0) { return bwd::dq_semaphore(p, row0); }
  static __device__ int dq_turn(const AttnBwdParams& p, const Work& w, int m_start) {
    if constexpr (kRotatedTurns) {
      // Without a mask every key block reaches every query block. The blocks of a launch group start their walks at
      // query blocks size - 1 - index (index: the place in the group's launch order), so at query block m those that
      // started at or before it arrive in launch order, one step apart, and those that wrap around to it arrive
      // last, at the end of their walks, again in launch order. The turns follow, group by group in launch order:
      // a group's blocks that arrive without wrapping, then those that wrap. A block waits on blocks launched before
      // it, or on blocks of its own group, which are resident together once the groups launched before it have
      // finished, provided the process may use as many SMs as a group has blocks (at most 8): fewer, as under an MPS
      // thread percentage or a green context of fewer SMs, which %nsmid does not show, could hang here.
      const RotatedTurns t = rotated_turns(w);
      const int first = t.groups_before * t.launch;
      return t.rotate ? rotated_dq_turn(first, t.index, t.size, m_start / kBlockM) : first + t.index;
    } else {
      // (A user mask's classes are per kv head: any query head of the group reads them.)
      return KeyBlocks<Variant, kBlockN>(p, w.batch, m_start, kBlockM, w.kv_head * p.group_size).end - 1 - w.n_block;
    }
  }
  // Step it's query block as the dQ writer and the turn warps see it: its first workspace row, its semaphore and,
  // under the deterministic strategy, this block's turn there.
  struct DqSite {
    long long row0;
    int* semaphore;
    int turn;
  };
  static __device__ DqSite dq_site(const AttnBwdParams& p, const Work& w, int it) {
    const int m_start = m_block_of(w, it) * kBlockM;
    const long long row0 = workspace_row(p, w, head_of(p, w, it), m_start);
    return {row0, dq_semaphore(p, row0), kDeterministic ? dq_turn(p, w, m_start) : 0};
  }

  // A packed batch's block first binds its sequence (sequence.cuh): lengths, causal offset, the tensors'
  // and the workspace's rows; a block past the sequence's last key has nothing to do.
  static __device__ void run(const AttnBwdSm90Params& params) {
    // The convert kernel may start once every block has (bwd_rows.cuh): it waits for each query block's adds.
    if constexpr (kDqStaged) sm80::launch_dependents();
    if constexpr (kVarlen) {
      AttnBwdParams p = params.base;
      const Place place = place_of_this_block();
      const SequenceRows rows = sequence_rows(p, place.batch);
      bind_sequence(p, place.batch, rows, kTileDim, Cfg::kPadRows);
      if (place.n_block * kBlockN >= p.seqlen_k) return;
      run_block(params, p, rows);
    } else {
      run_block(params, params.base, SequenceRows{});
    }
  }

  static __device__ void run_block(const AttnBwdSm90Params& params, const AttnBwdParams& p, const SequenceRows& rows) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = (sm90::smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    const Barriers bars{smem + kBarrierOffset};
    const Work w = work_of(p, rows);

    if (threadIdx.x == 0) {
      sm90::mbarrier_init(bars.kv_full(), 1);
      for (int s = 0; s < kStages; ++s) {
        sm90::mbarrier_init(bars.full(s), 1);
        // One arrival per thread of the consumers that read the stage (with the query split, one consumer).
        sm90::mbarrier_init(bars.empty(s), (kQuerySplit ? 1 : kConsumers) * 128);
      }
      if constexpr (kDeferDq) {
        for (int b = 0; b < kDsTiles; ++b) {
          sm90::mbarrier_init(bars.ds_full(b), kConsumers * 128);
          sm90::mbarrier_init(bars.ds_empty(b), kConsumers * 128);
        }
      }
      if constexpr (kQuerySplit) sm90::mbarrier_init(bars.partials(), kConsumers * 128);
      if constexpr (kDeterministic && kDqStaged) {
        for (int b = 0; b < 2; ++b) {
          sm90::mbarrier_init(bars.turn_ready(b), 1);
          sm90::mbarrier_init(bars.turn_free(b), 1);
          sm90::mbarrier_init(bars.turn_seen(b), 1);
          sm90::mbarrier_init(bars.turn_taken(b), 1);
        }
      }
      sm90::fence_mbarrier_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {
      sm90::setmaxnreg_dec<kTraits.producer_regs>();
      if (threadIdx.x == 0) {
        produce(params, p, w, smem, bars);
      } else if (kDqStaged && threadIdx.x / 32 == kDqWriterWarp) {
        write_dq(p, w, smem, bars);
      } else if (kDqStaged && kDeterministic && threadIdx.x == 32 * kTurnWarp) {
        pass_turns(p, w, bars);
      } else if (kDqStaged && kDeterministic && threadIdx.x == 32 * kTurnWatchWarp) {
        watch_turns(p, w, bars);
      }
    } else {
      sm90::setmaxnreg_inc<kTraits.consumer_regs>();
      // With the dK/dV split each consumer runs its own part's code (wgmma chosen per consumer inside one
      // loop would be serialized by ptxas).
      if constexpr (kDkdvSplit) {
        if (threadIdx.x < 256) {
          consume<kDqPasses, Part::kScores>(params, p, w, smem, bars);
        } else {
          consume<kTraits.dq_passes_last, Part::kGrads>(params, p, w, smem, bars);
        }
      } else {
        consume<kDqPasses, Part::kBoth>(params, p, w, smem, bars);
      }
    }
  }

  // A packed sequence's tiles run on into the next sequence's rows (or past the tensor, zero-filled): its
  // keys past seqlen_k are masked, and its queries past seqlen_q have LSE2 = +inf in the padded workspace.
  static __device__ void produce(const AttnBwdSm90Params& params, const AttnBwdParams& p, const Work& w, u32 smem,
                                 const Barriers& bars) {
    sm90::mbarrier_arrive_expect_tx(bars.kv_full(), 2 * kKvTileBytes);
    const int k_row = w.k_row0 + w.n_start;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      sm90::tma_load_4d(smem + c * kBlockN * kRowBytes, &params.k_map, bars.kv_full(), c * 64, k_row, w.kv_head,
                        w.tma_batch);
      sm90::tma_load_4d(smem + kVOffset + c * kBlockN * kRowBytes, &params.v_map, bars.kv_full(), c * 64, k_row,
                        w.kv_head, w.tma_batch);
    }
    for (int it = 0; it < w.iterations; ++it) {
      const int head = head_of(p, w, it);
      const int m_start = m_block_of(w, it) * kBlockM;
      const int s = it % kStages;
      const u32 st = smem + kStageOffset + s * kStageBytes;
      sm90::mbarrier_wait(bars.empty(s), ring_phase(it) ^ 1);
      sm90::mbarrier_arrive_expect_tx(bars.full(s), kStageBytes + kRowStatsBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        sm90::tma_load_4d(st + c * kBlockM * kRowBytes, &params.q_map, bars.full(s), c * 64, w.q_row0 + m_start, head,
                          w.tma_batch);
        sm90::tma_load_4d(st + kQTileBytes + c * kBlockM * kRowBytes, &params.do_map, bars.full(s), c * 64,
                          w.q_row0 + m_start, head, w.tma_batch);
      }
      const long long flat = workspace_row(p, w, head, m_start);
      const u32 stats = smem + kRowStatsOffset + s * kRowStatsBytes;
      // Consumers read LSE and D with ordinary loads; each consumer thread's own arrival on empty(s) orders
      // its loads of the stage's previous use before these copies (see the arrivals in consume()).
      sm90::bulk_load(stats, p.lse_log2 + flat, kBlockM * 4, bars.full(s));
      sm90::bulk_load(stats + kBlockM * 4, p.dsum + flat, kBlockM * 4, bars.full(s));
    }
  }

  // Adds each query block's dQ tile, once its consumers have stored their shares, to the accumulator
  // with one bulk reduce-add (with the turns, one per consumer's half: kDqParts): the tile in shared memory is
  // laid out as its rows of the accumulator are (DqAccum::kTiles), so it is one contiguous range. Where nothing
  // zeroes the accumulator (kFirstAddStores), a query block's first add is a bulk store, which the others wait for.
  // The deterministic strategy adds once the query block's semaphore counts this block's turn (the first
  // turn stores), which watch_turns sees, and once the add's writes are done pass_turns passes the turn on.
  // Turns go from the query block's last key block down to key block 0: the order in which the key blocks
  // reach a query block when each walks its query blocks upward from its diagonal (causal), and for blocks
  // that all start at query block 0, an order that costs one add per block of lag; without a mask the
  // blocks of a launch group start their walks one query block apart instead and take their turns in the
  // order they arrive (dq_turn). A key block visits a query block exactly when the query block's key range
  // (KeyBlocks over its kBlockM rows, as QueryBlocks counts them) holds it.
  // Under a mask, the atomic strategy takes a ticket from the semaphore's first counter: the first stores
  // and adds kBwdSm90DqStored to it once the store is done; the others add once they see that (key blocks
  // reach a query block at different steps: work_of). Without one it adds into the zeroed accumulator.
  // Either way a block counts its adds done in the second counter, for the convert kernel (bwd_rows.cuh),
  // once all of them are (waiting on each would hold the next).
  static __device__ void write_dq(const AttnBwdParams& p, const Work& w, u32 smem, const Barriers& bars) {
    // One part of a staged tile to the accumulator: a query block's first add stores. The fillers may write
    // the part again once this returns (its reads are done).
    auto add_dq = [](float* accum, u32 sdq_part, bool first) {
      if (first) {
        sm90::bulk_store(accum, sdq_part, kDqPartBytes);
      } else {
        // The adds below follow the store and the previous turns' adds (into a zeroed accumulator, nothing).
        if constexpr (kDeterministic || kFirstAddStores) sm90::fence_proxy_async_global();
        sm90::bulk_reduce_add_f32(accum, sdq_part, kDqPartBytes);
      }
      sm90::tma_store_commit();
      sm90::tma_store_wait_read();
    };
    const bool leader = threadIdx.x % 32 == 0;
    for (int it = 0; it < w.iterations; ++it) {
      const auto [row0, semaphore, turn] = dq_site(p, w, it);
      // The tile and the consumers that fill it: every consumer, or with the query split the step's own.
      const int tile = kQuerySplit ? it % 2 : 0;
      const int fillers_end = tile + kConsumers / kStepConsumers;
      const u32 sdq = smem + kDqOffset + tile * kDqTileBytes;
      // The ticket, or a first look at the turn, before the tile is ready: the round trip runs while the
      // consumers finish the step.
      bool first = false, ready = false;
      if (leader) {
        if constexpr (kDeterministic) {
          first = turn == 0;
          ready = true;  // watch_turns says when
        } else if constexpr (kFirstAddStores) {
          const int ticket = sm90::atom_add_acquire_gpu(semaphore, 1);
          first = (ticket & ~kBwdSm90DqStored) == 0;
          ready = first || (ticket & kBwdSm90DqStored) != 0;
        } else {
          ready = true;
        }
      }
      // The leader's wait before the tile's first part: for this block's turn, or for the first store (the ticket).
      auto wait_turn = [&, semaphore = semaphore] {  // (C++17 lambdas capture no structured binding)
        if constexpr (kDeterministic) {
          sm90::mbarrier_wait(bars.turn_seen(it % 2), turn_ring_phase(it));  // acquire (CTA scope)
          sm90::mbarrier_arrive(bars.turn_taken(it % 2));
        }
        while (!ready) {
          const int count = sm90::ld_acquire_gpu(semaphore);
          ready = (count & kBwdSm90DqStored) != 0;
        }
      };
      // Two branches, not one loop over the parts: in the producer warps' 24 registers the loop (or a lambda for a
      // part) spilled in some tiles of either kind (bench/notes_bwd_sm90.md, Versions: dQ halves).
      if constexpr (kDqParts == 1) {
#pragma unroll
        for (int c = tile; c < fillers_end; ++c) sm90::named_barrier_sync(dq_full_barrier(c), kDqWriterThreads);
        if (leader) {
          wait_turn();
          add_dq(p.dq_accum + row0 * kTileDim, sdq, first);
        }
        __syncwarp();
        if (it + kStepConsumers < w.iterations) {  // the tile's consumers have another step
#pragma unroll
          for (int c = tile; c < fillers_end; ++c) sm90::named_barrier_arrive(dq_empty_barrier(c), kDqWriterThreads);
        }
      } else {
#pragma unroll
        for (int part = 0; part < kDqParts; ++part) {  // consumer `part`'s half
          sm90::named_barrier_sync(dq_full_barrier(part), kDqWriterThreads);
          if (leader) {
            if (part == 0) wait_turn();
            add_dq(p.dq_accum + row0 * kTileDim + part * (kDqPartBytes / 4), sdq + part * kDqPartBytes, first);
          }
          __syncwarp();
          if (it + kStepConsumers < w.iterations) sm90::named_barrier_arrive(dq_empty_barrier(part), kDqWriterThreads);
        }
      }
      // The turn passes on, or the store is announced, once the writes are done, while the consumers go on.
      if (leader && (kDeterministic || first)) {
        sm90::tma_store_wait_all();
        sm90::fence_proxy_async_global();
        if constexpr (kDeterministic) {
          const int slot = it % 2;
          sm90::mbarrier_wait(bars.turn_free(slot), turn_ring_phase(it) ^ 1);
          sm90::mbarrier_arrive(bars.turn_ready(slot));  // release (CTA scope): the writes above are done
        } else {
          sm90::red_add_release_gpu(semaphore, kBwdSm90DqStored);
        }
      }
    }
    if (!kDeterministic && leader) {  // one fence releases every add to the counts that follow it
      sm90::tma_store_wait_all();
      sm90::fence_proxy_async_global();
      sm90::fence_acq_rel_gpu();
      for (int it = 0; it < w.iterations; ++it) {
        const long long row0 = workspace_row(p, w, head_of(p, w, it), m_block_of(w, it) * kBlockM);
        sm90::red_add_relaxed_gpu(dq_semaphore(p, row0) + 1, 1);
      }
    }
  }

  // The deterministic strategy's turns, in write_dq's order of adds, watched for and passed on by one thread each of
  // two other producer warps: watch_turns polls the query block's semaphore until it counts this block's turn and
  // tells the writer through the turn_seen ring; pass_turns, told through the turn_ready ring that an add's writes
  // are done, releases the next turn. The writer's loop, on which the consumers' turns wait for the staged dQ tile,
  // then holds neither the polls' round trips nor the release's fence (MEMBAR.GPU): with both in it, the consumers'
  // turns ran slower than lock step (bench/notes_bwd_sm90.md, Versions: turn warps). The ordering
  // carries from the semaphore's GPU-scope acquire and release through the rings' CTA-scope arrivals and waits.
  static __device__ void watch_turns(const AttnBwdParams& p, const Work& w, const Barriers& bars) {
    for (int it = 0; it < w.iterations; ++it) {
      const DqSite site = dq_site(p, w, it);
      if (site.turn > 0) {
        while (sm90::ld_acquire_gpu(site.semaphore) != site.turn) {
        }
      }
      sm90::mbarrier_wait(bars.turn_taken(it % 2), turn_ring_phase(it) ^ 1);
      sm90::mbarrier_arrive(bars.turn_seen(it % 2));  // release (CTA scope): what the turn's release made visible
    }
  }
  static __device__ void pass_turns(const AttnBwdParams& p, const Work& w, const Barriers& bars) {
    for (int it = 0; it < w.iterations; ++it) {
      const DqSite site = dq_site(p, w, it);
      sm90::mbarrier_wait(bars.turn_ready(it % 2), turn_ring_phase(it));  // acquire (CTA scope)
      sm90::st_release_gpu(site.semaphore, site.turn + 1);  // cumulative: the writer's adds come first
      sm90::mbarrier_arrive(bars.turn_free(it % 2));
    }
  }

  // Byte offset of 16-bit element (row, col) in a swizzled tile of `rows` rows per 64-column chunk.
  static __device__ __forceinline__ u32 swizzled(int rows, int row, int col) {
    return (col / 64) * rows * kRowBytes + row * kRowBytes + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
  }

  // Pᵀ's and dSᵀ's 16-bit A fragments (of dV += Pᵀ dO and dK += dSᵀ Q) from their fp32 accumulators.
  template <int kFrags>
  static __device__ __forceinline__ void pack_fragments(u32 (&p_frag)[kMSteps][4], u32 (&ds_frag)[kFrags][4],
                                                        const float (&acc_s)[kSGroups][4],
                                                        const float (&acc_dp)[kSGroups][4]) {
#pragma unroll
    for (int j = 0; j < kMSteps; ++j) {
      sm80::pack_a<kElem>(p_frag[j], acc_s[2 * j], acc_s[2 * j + 1]);
      sm80::pack_a<kElem>(ds_frag[j], acc_dp[2 * j], acc_dp[2 * j + 1]);
    }
  }

  // A consumer's dSᵀ fragments into the swizzled dSᵀ tile at sds (its keys from key_row0), for the dQ product.
  template <int kFrags>
  static __device__ __forceinline__ void store_ds(u32 sds, const u32 (&ds_frag)[kFrags][4], int key_row0, int t) {
#pragma unroll
    for (int i = 0; i < kSGroups; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 word = ds_frag[i / 2][2 * (i % 2) + h];
        sm90::st_shared_u32(sds + swizzled(kBlockN, key_row0 + 8 * h, 8 * i + 2 * t), word);
      }
  }

  // acc = A Bᵀ over head_dim as one wgmma group (Sᵀ = K Qᵀ or dPᵀ = V dOᵀ): A the consumer's 64 rows of K or V, B the
  // stage's Q or dO, both K-major.
  static __device__ __forceinline__ void transposed_product(float (&acc)[kSGroups][4], u64 desc_a, u64 desc_b) {
#pragma unroll
    for (int kk = 0; kk < kDSteps; ++kk) {
      const u32 offset = (kk / 4) * kBlockN * kRowBytes + (kk % 4) * 32;
      const u32 q_offset = (kk / 4) * kBlockM * kRowBytes + (kk % 4) * 32;
      sm90::WgmmaSS<kBlockM>::template run<kElem>(acc, sm90::smem_desc_advance(desc_a, offset),
                                                  sm90::smem_desc_advance(desc_b, q_offset), kk > 0 ? 1 : 0);
    }
    sm90::wgmma_commit();
  }

  // kPasses: this consumer's dQ passes (kDqCols columns each); kPart: what else it computes.
  template <int kPasses, Part kPart>
  static __device__ void consume(const AttnBwdSm90Params& params, const AttnBwdParams& p, const Work& w, u32 smem,
                                 const Barriers& bars) {
    const int consumer = threadIdx.x / 128 - 1;
    const int warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // accumulator row within an 8-row group
    const int t = lane % 4;  // accumulator column pair
    const int key_consumer = kTraits.key_consumers == 1 ? 0 : consumer;  // which 64 keys of the block are its
    const int key_row0 = key_consumer * 64 + warp * 16 + g;  // this thread's keys: key_row0 and + 8, block-relative
    constexpr bool kHasDk = kPart != Part::kGrads;
    constexpr bool kHasDv = kPart != Part::kScores;
    constexpr int kDGroups = kTileDim / 8;  // accumulator groups of dK and dV
    const u32 sk = smem;
    const u32 sv = smem + kVOffset;
    const u32 sk_rows = sk + key_consumer * 64 * kRowBytes;  // this consumer's 64 keys in chunk 0
    const u32 sv_rows = sv + key_consumer * 64 * kRowBytes;
    const u32 sdq = smem + kDqOffset + (kQuerySplit ? consumer : 0) * kDqTileBytes;

    // This consumer's share of dQ: 64-row tiles of the query block and a range of columns (the dK/dV split:
    // consumer 0 takes the first two chunks).
    // With the query split, all of its own query block's dQ.
    constexpr bool kSplitRows = kDqColParts == 1;
    const int dq_tile0 = kQuerySplit ? 0 : kSplitRows ? consumer * kDqRowTiles : consumer / kDqColParts;
    const int dq_col0 = kQuerySplit || kSplitRows ? 0
                        : kDkdvSplit              ? (consumer % kDqColParts) * kDqPasses * kDqCols
                                                  : (consumer % kDqColParts) * kDqCols;

    float acc_dk[kDGroups][4];
    float acc_dv[kDGroups][4];
#pragma unroll
    for (int i = 0; i < kDGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

    sm90::mbarrier_wait(bars.kv_full(), 0);

    // Where entry (i, 2h + e) of this thread's Sᵀ lies: key key_row0 + 8h, query 8i + 2t + e.
    auto score_at = [&](int head, int m_start, int i, int h, int e) {
      return ScoreAt{w.batch, head, m_start + 8 * i + 2 * t + e, w.n_start + key_row0 + 8 * h};
    };
    // Pᵀ = exp2(x - lse2) with x = s * scale_log2 (s: the variant's score) and hidden entries at 0; queries past
    // seqlen_q have lse2 = +inf in the padded workspace, so only keys need masking. A variant whose gradient
    // reads its score (kGradReadsScore) keeps x here (-inf where hidden) and takes Pᵀ from it with dSᵀ
    // (gradients below), once dPᵀ is in: then x needs no register of its own, nor a log2 to rebuild it from P.
    auto probabilities = [&](float (&acc_s)[kSGroups][4], u32 s_lse, int head, int m_start, auto masked) {
#pragma unroll
      for (int i = 0; i < kSGroups; ++i) {
        float lse2[2];
        if constexpr (!Variant::kGradReadsScore) sm90::ld_shared_f32x2(s_lse + (8 * i + 2 * t) * 4, lse2[0], lse2[1]);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const ScoreAt at = score_at(head, m_start, i, h, e);
            float s = bwd::scaled_score<Variant>(p, at, acc_s[i][2 * h + e]);
            if constexpr (decltype(masked)::value) bwd::hide_score<Variant>(p, at, s);
            if constexpr (Variant::kGradReadsScore) {
              acc_s[i][2 * h + e] = s;
            } else {
              acc_s[i][2 * h + e] = bwd::probability(s, lse2[e]);
            }
          }
      }
    };
    // Group i's dSᵀ = Pᵀ ∘ (dPᵀ - D) into acc_dp, with respect to q·k (the variant's score_grad), and, where
    // acc_s still holds the score x (kGradReadsScore), Pᵀ into acc_s. A hidden entry (x = -inf, P = 0) gets
    // dS = 0 by a select; its gradient is evaluated at x = 0 meanwhile (the soft cap's at -inf is NaN). With
    // either select alone ptxas spills more at the d64 and d256 tiles' register bound.
    auto gradients = [&](float (&acc_s)[kSGroups][4], float (&acc_dp)[kSGroups][4], int i, u32 s_lse, u32 s_dsum,
                         int head, int m_start) {
      float dsum[2];
      sm90::ld_shared_f32x2(s_dsum + (8 * i + 2 * t) * 4, dsum[0], dsum[1]);
      float lse2[2];
      if constexpr (Variant::kGradReadsScore) sm90::ld_shared_f32x2(s_lse + (8 * i + 2 * t) * 4, lse2[0], lse2[1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const ScoreAt at = score_at(head, m_start, i, e / 2, e % 2);
        if constexpr (Variant::kGradReadsScore) {
          const float x = acc_s[i][e];
          const bool hidden = x == neg_inf();
          acc_s[i][e] = bwd::probability(x, lse2[e % 2]);
          const float grad =
              bwd::score_gradient<Variant>(p, at, hidden ? 0.f : x, acc_s[i][e], acc_dp[i][e], dsum[e % 2]);
          acc_dp[i][e] = hidden ? 0.f : grad;
        } else {
          acc_dp[i][e] = bwd::score_gradient<Variant>(p, at, 0.f, acc_s[i][e], acc_dp[i][e], dsum[e % 2]);
        }
      }
    };

    if constexpr (kPingPong) {
      // The consumers take turns issuing their products, so that one computes Pᵀ and dSᵀ while the other's
      // products run (the lock-step loop below runs both consumers' softmax at once, with the tensor cores idle).
      // A step's work: Sᵀ and dPᵀ (scores), Pᵀ and dSᵀ (softmax), dV and dK (grads), and one step later its dQ
      // (defer_dq: the other consumer's dSᵀ of the step before is staged by then). Consumer c's turn at step it
      // issues step it's grads, step it - 1's dQ and step it + 1's scores back to back, hands the turn over
      // (barrier turn_barrier(1 - c)) and computes step it + 1's softmax. Consumer 0 takes the first turn.
      // Within a turn the grads are waited for before Sᵀ is issued and dQ is staged before dPᵀ is, so at most
      // two accumulators besides dK and dV are in flight (three spill at the 240-register budget); issuing Sᵀ
      // behind dQ keeps the tensor cores fed (issued only after the grads and dQ were done, it lost time:
      // bench/notes_bwd_sm90.md, Versions: ping-pong).
      // The first and last turns are compile-time instances (run-time conditions inside one turn kept the
      // scores' accumulators live across iterations: 300-650 bytes of spills). Three dSᵀ tiles: a consumer
      // stores step it's while the other's dQ product of step it - 2 may still read its tile.
      // dK += dSᵀ Q reads dSᵀ from its shared tile where the gradient reads the score (the soft cap): its
      // fragments then live only within the softmax, whose longer work would otherwise spill 16-24 bytes.
      constexpr bool kDkFromTile = Variant::kGradReadsScore;
      u32 p_frag[kMSteps][4];                     // Pᵀ of the step whose grads are next, as 16-bit A fragments
      u32 ds_kept[kDkFromTile ? 1 : kMSteps][4];  // its dSᵀ
      const u64 desc_k_rows = sm90::smem_desc_sw128(sk_rows, 16, 1024);
      const u64 desc_v_rows = sm90::smem_desc_sw128(sv_rows, 16, 1024);
      const u64 desc_k_mn = sm90::smem_desc_sw128(sk, kBlockN * kRowBytes, 1024);
      const u32 thread_in_group = threadIdx.x % 128;
      auto stage_q = [&](int it) { return smem + kStageOffset + (it % kStages) * kStageBytes; };
      auto ds_tile = [&](int it) { return smem + kDsOffset + (it % kDsTiles) * kDsTileBytes; };
      auto ds_phase = [&](int it) { return static_cast<u32>((it / kDsTiles) & 1); };
      // Sᵀ = K Qᵀ or dPᵀ = V dOᵀ of this consumer's keys, (64, kBlockM), k-steps along head_dim.
      auto issue_scores = [&](float(&acc)[kSGroups][4], u64 desc_a, u32 tile) {
        const u64 desc_b = sm90::smem_desc_sw128(tile, 16, 1024);
        sm90::wgmma_fence();
        transposed_product(acc, desc_a, desc_b);
      };
      // Step it's Pᵀ and dSᵀ from its Sᵀ and dPᵀ (the two newest wgmma groups), into p_frag and ds_kept, and
      // dSᵀ into its tile once both consumers' dQ products of kDsTiles steps ago have read it.
      auto softmax = [&](int it, float(&acc_s)[kSGroups][4], float(&acc_dp)[kSGroups][4]) {
        const int head = head_of(p, w, it);
        const int m_block = m_block_of(w, it);
        const int m_start = m_block * kBlockM;
        const u32 s_lse = smem + kRowStatsOffset + (it % kStages) * kRowStatsBytes;
        const u32 s_dsum = s_lse + kBlockM * 4;
        sm90::wgmma_wait<1>();
        sm90::pin_registers(acc_s);
        if (m_block < w.m_interior || m_block >= w.m_interior_end) {
          probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<true>{});
        } else {
          probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<false>{});
        }
        sm90::wgmma_wait<0>();
        sm90::pin_registers(acc_dp);
#pragma unroll
        for (int i = 0; i < kSGroups; ++i) gradients(acc_s, acc_dp, i, s_lse, s_dsum, head, m_start);
        // dSᵀ's fragments: kept for the next turn's dK, or (kDkFromTile) only until they are stored in the tile.
        u32 ds_local[kDkFromTile ? kMSteps : 1][4];
        auto& ds_frag = *[&] {
          if constexpr (kDkFromTile) {
            return &ds_local;
          } else {
            return &ds_kept;
          }
        }();
        pack_fragments(p_frag, ds_frag, acc_s, acc_dp);
        if (it >= kDsTiles) sm90::mbarrier_wait(bars.ds_empty(it % kDsTiles), ds_phase(it) ^ 1);
        store_ds(ds_tile(it), ds_frag, key_row0, t);
        sm90::fence_proxy_async_smem();
        sm90::mbarrier_arrive(bars.ds_full(it % kDsTiles));
      };
      // dQ = dS K of step it (this consumer's 64 columns), once both consumers' dSᵀ of it are staged.
      auto issue_dq = [&](int it, float(&acc_dq)[kDqGroups][4]) {
        sm90::mbarrier_wait(bars.ds_full(it % kDsTiles), ds_phase(it));
        sm90::wgmma_fence();
        const u64 desc_ds_mn = sm90::smem_desc_sw128(ds_tile(it), kBlockN * kRowBytes, 1024);
#pragma unroll
        for (int j = 0; j < kNSteps; ++j) {
          const u32 step = j * 16 * kRowBytes;
          const u64 desc_k = sm90::smem_desc_advance(desc_k_mn, (dq_col0 / 64) * kBlockN * kRowBytes + step);
          sm90::WgmmaSSMN<kDqCols>::template run<kElem>(acc_dq, sm90::smem_desc_advance(desc_ds_mn, step), desc_k,
                                                        j > 0 ? 1 : 0);
        }
        sm90::wgmma_commit();
      };
      // Step it's dQ, complete, into the shared tile for the writer (in accumulator order, as below).
      auto stage_dq = [&](int it, float(&acc_dq)[kDqGroups][4]) {
        sm90::pin_registers(acc_dq);
        sm90::mbarrier_arrive(bars.ds_empty(it % kDsTiles));
        if (it >= 1) sm90::named_barrier_sync(dq_empty_barrier(consumer), kDqWriterThreads);
#pragma unroll
        for (int i = 0; i < kDqGroups; ++i) {
          const int chunk = dq_col0 / 64 + i / 8;
          const int offset = chunk * (kDqChunkBytes / 4) + ((i % 8) * 128 + static_cast<int>(thread_in_group)) * 4;
          sm90::st_shared_f32x4(sdq + offset * 4, acc_dq[i][0], acc_dq[i][1], acc_dq[i][2], acc_dq[i][3]);
        }
        sm90::fence_proxy_async_smem();
        sm90::named_barrier_arrive(dq_full_barrier(consumer), kDqWriterThreads);
      };
      // Consumer c's turn at step it (kPrev: it > 0, kNext: it + 1 < iterations).
      auto turn = [&](int it, auto prev, auto next) {
        constexpr bool kPrev = decltype(prev)::value;
        constexpr bool kNext = decltype(next)::value;
        const u32 sq = stage_q(it);
        const u32 sdo = sq + kQTileBytes;
        // dV and dK settle in their registers first: the first turn's zeros would otherwise be moved in after
        // the wgmma fence, where ptxas must fence again (and serializes every wgmma when that is under a branch).
        sm90::pin_registers(acc_dv);
        sm90::pin_registers(acc_dk);
        sm90::named_barrier_sync(turn_barrier(consumer), 256);
        // dV += Pᵀ dO and dK += dSᵀ Q: queries are the k dimension; dO and Q are read MN-major.
        const u64 desc_do_mn = sm90::smem_desc_sw128(sdo, kBlockM * kRowBytes, 1024);
        const u64 desc_q_mn = sm90::smem_desc_sw128(sq, kBlockM * kRowBytes, 1024);
        sm90::wgmma_fence();
#pragma unroll
        for (int j = 0; j < kMSteps; ++j) {
          sm90::WgmmaRS<kTileDim>::template run<kElem>(acc_dv, p_frag[j],
                                                       sm90::smem_desc_advance(desc_do_mn, j * 16 * kRowBytes), 1);
        }
        if constexpr (kDkFromTile) {
          // This consumer's keys of step it's dSᵀ tile, stored by its own threads before the turn's barrier.
          const u64 desc_ds_rows = sm90::smem_desc_sw128(ds_tile(it) + key_consumer * 64 * kRowBytes, 16, 1024);
#pragma unroll
          for (int j = 0; j < kMSteps; ++j) {
            const u32 offset = (j / 4) * kBlockN * kRowBytes + (j % 4) * 32;
            sm90::WgmmaSSKMN<kTileDim>::template run<kElem>(acc_dk, sm90::smem_desc_advance(desc_ds_rows, offset),
                                                           sm90::smem_desc_advance(desc_q_mn, j * 16 * kRowBytes), 1);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kMSteps; ++j) {
            sm90::WgmmaRS<kTileDim>::template run<kElem>(acc_dk, ds_kept[j],
                                                         sm90::smem_desc_advance(desc_q_mn, j * 16 * kRowBytes), 1);
          }
        }
        sm90::wgmma_commit();
        float acc_dq[kDqGroups][4];  // (64, kDqCols) of step it - 1's query block
        if constexpr (kPrev) {
          issue_dq(it - 1, acc_dq);
          sm90::wgmma_wait<1>();
        } else {
          sm90::wgmma_wait<0>();
        }
        sm90::pin_registers(acc_dv);
        sm90::pin_registers(acc_dk);
        // Done with the stage: its Q and dO read by step it's products, its LSE and D by its softmax (every
        // consumer thread arrives, as in the loop below).
        sm90::mbarrier_arrive(bars.empty(it % kStages));
        float acc_s[kSGroups][4];   // (64 keys, kBlockM queries) of step it + 1
        float acc_dp[kSGroups][4];
        if constexpr (kNext) {
          sm90::mbarrier_wait(bars.full((it + 1) % kStages), ring_phase(it + 1));
          issue_scores(acc_s, desc_k_rows, stage_q(it + 1));
        }
        if constexpr (kPrev) {
          sm90::wgmma_wait<kNext ? 1 : 0>();
          stage_dq(it - 1, acc_dq);
        }
        if constexpr (kNext) issue_scores(acc_dp, desc_v_rows, stage_q(it + 1) + kQTileBytes);
        if (consumer == 0 || kNext) sm90::named_barrier_arrive(turn_barrier(1 - consumer), 256);
        if constexpr (kNext) softmax(it + 1, acc_s, acc_dp);
      };

      if (w.iterations > 0) {
        if (consumer == 1) sm90::named_barrier_arrive(turn_barrier(0), 256);
        {
          float acc_s[kSGroups][4];
          float acc_dp[kSGroups][4];
          sm90::mbarrier_wait(bars.full(0), ring_phase(0));
          issue_scores(acc_s, desc_k_rows, stage_q(0));
          issue_scores(acc_dp, desc_v_rows, stage_q(0) + kQTileBytes);
          softmax(0, acc_s, acc_dp);
        }
        const int last = w.iterations - 1;
        if (last == 0) {
          turn(0, sm80::BoolConstant<false>{}, sm80::BoolConstant<false>{});
        } else {
          turn(0, sm80::BoolConstant<false>{}, sm80::BoolConstant<true>{});
          for (int it = 1; it < last; ++it) turn(it, sm80::BoolConstant<true>{}, sm80::BoolConstant<true>{});
          turn(last, sm80::BoolConstant<true>{}, sm80::BoolConstant<false>{});
        }
        float acc_dq[kDqGroups][4];
        issue_dq(last, acc_dq);
        sm90::wgmma_wait<0>();
        stage_dq(last, acc_dq);
      }
    } else {
      // With kDeferDq a step adds the previous step's dQ (after issuing its own dV and dK), and one more
      // iteration adds the last step's: the consumers meet at no barrier of a step, each waiting only for the
      // other's dSᵀ of the step before (staged a step ago) and, before storing dSᵀ into a tile, for the other's
      // dQ product that read it two steps ago.
      for (int it = kQuerySplit ? consumer : 0; it < w.iterations + (kDeferDq ? 1 : 0); it += kStepConsumers) {
        const int head = head_of(p, w, it);
        const int m_block = m_block_of(w, it);
        const int m_start = m_block * kBlockM;
        const int s = it % kStages;
        const u32 sq = smem + kStageOffset + s * kStageBytes;
        const u32 sdo = sq + kQTileBytes;
        const u32 s_lse = smem + kRowStatsOffset + s * kRowStatsBytes;
        const u32 s_dsum = s_lse + kBlockM * 4;
        const u32 sds = smem + kDsOffset + (it % 2) * kDsTileBytes;
        if (!kDeferDq || it < w.iterations) {  // with kDeferDq the last iteration only adds dQ
          sm90::mbarrier_wait(bars.full(s), ring_phase(it));
          const u64 desc_k_rows = sm90::smem_desc_sw128(sk_rows, 16, 1024);
          const u64 desc_v_rows = sm90::smem_desc_sw128(sv_rows, 16, 1024);
          const u64 desc_q = sm90::smem_desc_sw128(sq, 16, 1024);
          const u64 desc_do = sm90::smem_desc_sw128(sdo, 16, 1024);

          // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for this consumer's keys: (64, kBlockM), k-steps along head_dim. With the
          // dK/dV split consumer 0 computes Sᵀ and consumer 1 dPᵀ.
          float acc_s[kSGroups][4];
          float acc_dp[kSGroups][4];
          sm90::wgmma_fence();
          if constexpr (kPart != Part::kGrads) transposed_product(acc_s, desc_k_rows, desc_q);
          if constexpr (kPart != Part::kScores) transposed_product(acc_dp, desc_v_rows, desc_do);

          // Pᵀ and dSᵀ as 16-bit A fragments (groups 2j, 2j+1 are k-step j's A fragment).
          u32 p_frag[kMSteps][4];
          u32 ds_frag[kMSteps][4];
          // The exchange tile's slot of this thread's accumulator group (or fragment) i.
          const u32 exchange = smem + kExchangeOffset + (threadIdx.x % 128) * 16;
          auto exchange_slot = [&](int i) { return exchange + static_cast<u32>(i) * 128 * 16; };
          if constexpr (kPart == Part::kGrads) {
            // dPᵀ to consumer 0; back come Pᵀ's fragments (written over this thread's own slots, whose dPᵀ
            // consumer 0's same thread has read).
            sm90::wgmma_wait<0>();
            sm90::pin_registers(acc_dp);
#pragma unroll
            for (int i = 0; i < kSGroups; ++i) {
              sm90::st_shared_f32x4(exchange_slot(i), acc_dp[i][0], acc_dp[i][1], acc_dp[i][2], acc_dp[i][3]);
            }
            consumers_sync();  // dPᵀ stored
            consumers_sync();  // Pᵀ's fragments stored
#pragma unroll
            for (int j = 0; j < kMSteps; ++j) sm90::ld_shared_u32x4(exchange_slot(j), p_frag[j]);
          } else {
            sm90::wgmma_wait<kPart == Part::kBoth ? 1 : 0>();
            sm90::pin_registers(acc_s);
            if (m_block < w.m_interior || m_block >= w.m_interior_end) {
              probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<true>{});
            } else {
              probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<false>{});
            }
            if constexpr (kPart == Part::kBoth) {
              sm90::wgmma_wait<0>();
              sm90::pin_registers(acc_dp);
            } else {
              consumers_sync();  // dPᵀ stored
            }
            // dSᵀ = Pᵀ ∘ (dPᵀ - D), with respect to q·k (the dK/dV split's consumer 0 reads dPᵀ group by group).
#pragma unroll
            for (int i = 0; i < kSGroups; ++i) {
              if constexpr (kPart == Part::kScores) {
                sm90::ld_shared_f32x4(exchange_slot(i), acc_dp[i][0], acc_dp[i][1], acc_dp[i][2], acc_dp[i][3]);
              }
              gradients(acc_s, acc_dp, i, s_lse, s_dsum, head, m_start);
            }
            pack_fragments(p_frag, ds_frag, acc_s, acc_dp);
            // dSᵀ into shared memory for the dQ product (kDeferDq: once every consumer's dQ product of two steps
            // ago has read the tile); Pᵀ's fragments to consumer 1.
            if constexpr (kDeferDq) {
              if (it >= 2) sm90::mbarrier_wait(bars.ds_empty(it % 2), ((it / 2) & 1) ^ 1);
            }
            store_ds(sds, ds_frag, key_row0, t);
            sm90::fence_proxy_async_smem();
            if constexpr (kDeferDq) sm90::mbarrier_arrive(bars.ds_full(it % 2));
            if constexpr (kPart == Part::kScores) {
#pragma unroll
              for (int j = 0; j < kMSteps; ++j) sm90::st_shared_u32x4(exchange_slot(j), p_frag[j]);
              consumers_sync();  // Pᵀ's fragments stored
            }
          }

          // dV += Pᵀ dO and dK += dSᵀ Q (the dK/dV split: the consumer's one of them): queries are the k
          // dimension; dO and Q are read MN-major.
          const u64 desc_do_mn = sm90::smem_desc_sw128(sdo, kBlockM * kRowBytes, 1024);
          const u64 desc_q_mn = sm90::smem_desc_sw128(sq, kBlockM * kRowBytes, 1024);
          sm90::wgmma_fence();
          if constexpr (kHasDv) {
#pragma unroll
            for (int j = 0; j < kMSteps; ++j) {
              const u64 desc_do_j = sm90::smem_desc_advance(desc_do_mn, j * 16 * kRowBytes);
              sm90::WgmmaRS<kTileDim>::template run<kElem>(acc_dv, p_frag[j], desc_do_j, 1);
            }
          }
          if constexpr (kHasDk) {
#pragma unroll
            for (int j = 0; j < kMSteps; ++j) {
              const u64 desc_q_j = sm90::smem_desc_advance(desc_q_mn, j * 16 * kRowBytes);
              sm90::WgmmaRS<kTileDim>::template run<kElem>(acc_dk, ds_frag[j], desc_q_j, 1);
            }
          }
          sm90::wgmma_commit();
        }

        // dQ = dS K of step dq_it (this step's, or with kDeferDq the previous one's) once every consumer's dSᵀ
        // of it is staged: A = dSᵀ and B = K, both read MN-major; keys are the k dimension. The dSᵀ tiles
        // alternate, so without kDeferDq the next step's stores need no barrier of their own.
        const int dq_it = kDeferDq ? it - 1 : it;
        if (kDeferDq && dq_it < 0) {  // no dQ yet: done with the stage once dV and dK are
          sm90::wgmma_wait<0>();
          sm90::pin_registers(acc_dv);
          sm90::pin_registers(acc_dk);
          sm90::mbarrier_arrive(bars.empty(s));
          continue;
        }
        if constexpr (kDeferDq) {
          sm90::mbarrier_wait(bars.ds_full(dq_it % 2), (dq_it / 2) & 1);
        } else if constexpr (kQuerySplit) {
          sm90::named_barrier_sync(2 + consumer, 128);  // its own dSᵀ, in its own tile (it % 2 == consumer)
        } else {
          consumers_sync();
        }
        const int dq_head = kDeferDq ? head_of(p, w, dq_it) : head;
        const int dq_m_start = kDeferDq ? m_block_of(w, dq_it) * kBlockM : m_start;
        const u32 dq_sds = kDeferDq ? smem + kDsOffset + (dq_it % 2) * kDsTileBytes : sds;
        const u64 desc_ds_mn = sm90::smem_desc_sw128(dq_sds, kBlockN * kRowBytes, 1024);
        const u64 desc_k_mn = sm90::smem_desc_sw128(sk, kBlockN * kRowBytes, 1024);
        const u32 thread_in_group = threadIdx.x % 128;
        const long long dq_row0 = workspace_row(p, w, dq_head, dq_m_start);  // the query block's first accumulator row
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
          const int col0 = dq_col0 + pass * kDqCols;
          float acc_dq[kDqRowTiles][kDqGroups][4];  // (kDqRowTiles x 64, kDqCols) of the query block
          if (pass > 0) sm90::wgmma_fence();  // the previous pass's reductions read these registers
#pragma unroll
          for (int r = 0; r < kDqRowTiles; ++r) {
#pragma unroll
            for (int j = 0; j < kNSteps; ++j) {
              const u32 step = j * 16 * kRowBytes;
              const u64 desc_ds = sm90::smem_desc_advance(desc_ds_mn, (dq_tile0 + r) * kBlockN * kRowBytes + step);
              const u64 desc_k = sm90::smem_desc_advance(desc_k_mn, (col0 / 64) * kBlockN * kRowBytes + step);
              sm90::WgmmaSSMN<kDqCols>::template run<kElem>(acc_dq[r], desc_ds, desc_k, j > 0 ? 1 : 0);
            }
          }
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          if (pass == 0) {
            if constexpr (kHasDv) sm90::pin_registers(acc_dv);
            if constexpr (kHasDk) sm90::pin_registers(acc_dk);
          }
#pragma unroll
          for (int r = 0; r < kDqRowTiles; ++r) sm90::pin_registers(acc_dq[r]);
          // This thread is done with the stage (its wgmma have read Q and dO). Every consumer thread arrives,
          // for its own loads of LSE and D where it has any (one lane arriving for its warp after the bar.sync
          // is as correct, but compute-sanitizer's racecheck follows an mbarrier's order only from the threads
          // that arrive, and reports the producer's bulk copies of the stage's next use against the other
          // lanes' loads).
          if (pass == 0 && (!kDeferDq || it < w.iterations)) sm90::mbarrier_arrive(bars.empty(s));
          if constexpr (kDeferDq) {
            if (pass + 1 == kPasses) sm90::mbarrier_arrive(bars.ds_empty(dq_it % 2));  // this dSᵀ tile read
          }

          // This consumer's share of the query block's dQ in accumulator order: each 64 x 64 chunk holds this
          // thread's four values of 8-column group i at 16 * (128 * i + its index in the warpgroup), so a
          // warp's 16-byte accesses are 512 consecutive bytes. Rows past seqlen_q exist in the padded
          // accumulator and receive zeros.
          auto chunk_offset = [&](int r, int i) {  // in floats
            const int chunk = (dq_tile0 + r) * kChunks + col0 / 64 + i / 8;
            return chunk * (kDqChunkBytes / 4) + ((i % 8) * 128 + static_cast<int>(thread_in_group)) * 4;
          };
          if constexpr (kDqStaged) {
            // Into the shared dQ tile, once the writer has added the previous step's and handed it back.
            if (dq_it >= kStepConsumers && pass == 0) {
              sm90::named_barrier_sync(dq_empty_barrier(consumer), kDqWriterThreads);
            }
#pragma unroll
            for (int r = 0; r < kDqRowTiles; ++r)
#pragma unroll
              for (int i = 0; i < kDqGroups; ++i) {
                sm90::st_shared_f32x4(sdq + chunk_offset(r, i) * 4, acc_dq[r][i][0], acc_dq[r][i][1], acc_dq[r][i][2],
                                      acc_dq[r][i][3]);
              }
            if (pass + 1 == kPasses) {
              sm90::fence_proxy_async_smem();  // the writer's bulk reduce-add reads through the async proxy
              sm90::named_barrier_arrive(dq_full_barrier(consumer), kDqWriterThreads);
            }
          } else {
            // Straight into the accumulator with vector reductions; the deterministic strategy first waits for
            // this block's turn (write_dq says which), which passes on after the last pass.
            if (kDeterministic && pass == 0) {
              if (consumer == 0 && thread_in_group == 0) {
                const int turn = dq_turn(p, w, dq_m_start);
                while (sm90::ld_acquire_gpu(dq_semaphore(p, dq_row0)) != turn) {
                }
              }
              consumers_sync();
            }
            float* dq_tile = p.dq_accum + dq_row0 * kTileDim;
#pragma unroll
            for (int r = 0; r < kDqRowTiles; ++r)
#pragma unroll
              for (int i = 0; i < kDqGroups; ++i) {
                sm90::red_add_f32x4(dq_tile + chunk_offset(r, i), acc_dq[r][i][0], acc_dq[r][i][1], acc_dq[r][i][2],
                                    acc_dq[r][i][3]);
              }
          }
        }
        if constexpr (!kDqStaged && kDeterministic) {
          __threadfence();  // every thread's adds done before the turn passes on
          consumers_sync();
          if (consumer == 0 && thread_in_group == 0) {
            sm90::st_release_gpu(dq_semaphore(p, dq_row0), dq_turn(p, w, dq_m_start) + 1);
          }
        }
      }
    }

    // Epilogue: every consumer is done with K and V (dQ read all keys); stage dK = scale · acc_dk and dV
    // in this consumer's rows of the K and V tiles (the dK/dV split: its one of them, all 64 rows), then
    // TMA-store them (rows past seqlen_k are clipped). With the query split, consumer 0 first adds consumer
    // 1's dK to its own and stores dK, consumer 1 dV, the partial sums passing through the ring's stages
    // (both consumers are done with them, and the producer loads nothing more), in accumulator order, handed
    // over by an mbarrier rather than barrier 1: compute-sanitizer's racecheck follows this hand-off only through
    // the mbarrier (bench/notes_bwd_sm90.md, Versions: the query split's hand-off).
    consumers_sync();
    const bool stores_dk = kHasDk && (!kQuerySplit || consumer == 0);
    const bool stores_dv = kHasDv && (!kQuerySplit || consumer == 1);
    if constexpr (kQuerySplit) {
      static_assert(2 * kDGroups * 128 * 16 <= kStages * kStageBytes, "the partial dK and dV fit the stages");
      const u32 partial = smem + kStageOffset + (threadIdx.x % 128) * 16;
      auto slot = [&](int tensor, int i) {  // tensor 0: dK, 1: dV
        return partial + static_cast<u32>(tensor * kDGroups + i) * 128 * 16;
      };
      // (Branches rather than a reference chosen at run time, which would put the accumulators in local memory.)
      auto give = [&](int tensor, const float(&acc)[kDGroups][4]) {
#pragma unroll
        for (int i = 0; i < kDGroups; ++i) {
          sm90::st_shared_f32x4(slot(tensor, i), acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        }
      };
      auto take = [&](int tensor, float(&acc)[kDGroups][4]) {
#pragma unroll
        for (int i = 0; i < kDGroups; ++i) {
          float other[4];
          sm90::ld_shared_f32x4(slot(tensor, i), other[0], other[1], other[2], other[3]);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][e] += other[e];
        }
      };
      if (consumer == 0) {
        give(1, acc_dv);
      } else {
        give(0, acc_dk);
      }
      sm90::mbarrier_arrive(bars.partials());
      sm90::mbarrier_wait(bars.partials(), 0);
      if (consumer == 0) {
        take(0, acc_dk);
      } else {
        take(1, acc_dv);
      }
    }
    if constexpr (kVarlen) {
      // A packed sequence's last keys: a 64-row box would run into the next sequence's rows, so this
      // consumer writes the keys of its sequence from registers (rows key_row0 and + 8, columns 8i + 2t, + 1;
      // the groups past head_dim are the tiles' zero padding).
      if (w.n_start + key_consumer * 64 + 64 > p.seqlen_k) {
        using u16 = sm80::u16;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = w.n_start + key_row0 + 8 * h;
          if (key >= p.seqlen_k) continue;
          u16* dk = static_cast<u16*>(p.dk) + key * p.dk_row_stride + w.kv_head * p.dk_head_stride + 2 * t;
          u16* dv = static_cast<u16*>(p.dv) + key * p.dv_row_stride + w.kv_head * p.dv_head_stride + 2 * t;
#pragma unroll
          for (int i = 0; i < kHeadDim / 8; ++i) {
            if (stores_dk) {
              *reinterpret_cast<u32*>(dk + 8 * i) =
                  sm80::pack2<kElem>(acc_dk[i][2 * h] * p.scale, acc_dk[i][2 * h + 1] * p.scale);
            }
            if (stores_dv) {
              *reinterpret_cast<u32*>(dv + 8 * i) = sm80::pack2<kElem>(acc_dv[i][2 * h], acc_dv[i][2 * h + 1]);
            }
          }
        }
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < kDGroups; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 offset = swizzled(kBlockN, key_row0 + 8 * h, 8 * i + 2 * t);
        if (stores_dk) {
          sm90::st_shared_u32(sk + offset,
                              sm80::pack2<kElem>(acc_dk[i][2 * h] * p.scale, acc_dk[i][2 * h + 1] * p.scale));
        }
        if (stores_dv) {
          sm90::st_shared_u32(sv + offset, sm80::pack2<kElem>(acc_dv[i][2 * h], acc_dv[i][2 * h + 1]));
        }
      }
    sm90::fence_proxy_async_smem();
    sm90::named_barrier_sync(2 + consumer, 128);
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const u32 rows = c * kBlockN * kRowBytes + key_consumer * 64 * kRowBytes;
        const int k_row = w.k_row0 + w.n_start + key_consumer * 64;
        if (stores_dk) sm90::tma_store_4d(&params.dk_map, sk + rows, c * 64, k_row, w.kv_head, w.tma_batch);
        if (stores_dv) sm90::tma_store_4d(&params.dv_map, sv + rows, c * 64, k_row, w.kv_head, w.tma_batch);
      }
      sm90::tma_store_commit();
      sm90::tma_store_wait_all();
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this template on its own.
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

extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm90_standalone_preprocess(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdPreprocess<FlashgenDefaultBwdSm90Config>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::BwdDkdvSm90<FlashgenDefaultBwdSm90Config>::kThreads, 1)
    bwd_sm90_standalone_dkdv(const __grid_constant__ flashgen::AttnBwdSm90Params params) {
  flashgen::BwdDkdvSm90<FlashgenDefaultBwdSm90Config>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm90_standalone_convert(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdConvertDq<FlashgenDefaultBwdSm90Config>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm90_standalone_sink_grad(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdSinkGrad<FlashgenDefaultBwdSm90Config>::run(params);
}
#endif
