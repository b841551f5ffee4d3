// The one place that decides whether a backward config is valid and derives its sizes: plain constexpr
// C++ read by the host (generator, tuner, launcher) and by the kernel templates' static_asserts.
//
// The backward runs as three kernels of one generated module:
//   preprocess  D = rowsum(dO ∘ O) in fp32 (and zeroes the fp32 dQ accumulator, see DqAccum);
//   dkdv        one block per (key block, kv head, batch[, head_dim slice]): recomputes P from Q, K and
//               the saved LSE for every query block of every query head of its group and accumulates
//               dK, dV in registers; it also adds dQ = dS K into the fp32 accumulator, except in the sm80
//               family's deterministic strategy;
//   dq          that strategy only: one block per (query block, head, batch[, dQ column slice]) recomputes P and
//               dP and accumulates dQ in registers, so no two blocks write the same element;
//   convert     otherwise: dQ = scale * accumulator, rounded to the 16-bit type.
#pragma once

#include "fwd_traits.cuh"

namespace flashgen {

struct BwdDkdvTraits {
  int threads;             // warps * 32
  int head_dim_pad;        // head_dim rounded up to 16
  int smem_row_elems;      // Q/K tile pitch: head_dim_pad + 8
  int head_dim_v_pad;      // the values' head dim (head_dim unless the config has its own) rounded up to 16
  int smem_row_elems_v;    // V/dO tile pitch: head_dim_v_pad + 8
  int key_tiles;           // 16-key mma tiles per warp: block_n / (16 * warps)
  int slice_tiles;         // 16-column tiles of dK each block owns: ceil(head_dim_pad / 16 / d_split)
  int slice_tiles_v;       // ... of dV: ceil(head_dim_v_pad / 16 / d_split); a block takes slice z of both
  int ds_row_elems;        // dS tile pitch (keys x queries): block_m + 8
  int dq_items;            // (16-row, column part) dQ work items per warp in the atomic strategy
  int dq_part_tiles;       // 16-column tiles per dQ column part
  int smem_kv_bytes;       // K and V tiles, resident for the whole block
  int smem_stage_bytes;    // one ring stage: Q and dO tiles, LSE and D (block_m floats each)
  int smem_ds_bytes;       // two dS tiles for the dQ product (atomic strategy): step i writes one while
                           // step i + 1 reads the other, so one barrier serves both
  int smem_bytes;
  int accum_regs;          // dK, dV, S and dP fragments per thread
  const char* error;
};

// Registers the dkdv kernel may hold in fragments before it surely spills (measured with ptxas: the
// final word is its report, and configs that spill are dropped by whoever compiles them).
inline constexpr int kMaxBwdAccumRegs = 200;

// head_dim_v: the values' (v, dout, dv) head dim where it differs from the queries' and keys'; 0: head_dim.
constexpr BwdDkdvTraits bwd_dkdv_traits(int head_dim, int block_m, int block_n, int warps, int stages, int d_split,
                                        bool atomic_dq, int head_dim_v = 0) {
  BwdDkdvTraits t{};
  const int dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  t.threads = warps * 32;
  t.head_dim_pad = (head_dim + 15) / 16 * 16;
  t.smem_row_elems = t.head_dim_pad + 8;
  t.head_dim_v_pad = (dim_v + 15) / 16 * 16;
  t.smem_row_elems_v = t.head_dim_v_pad + 8;
  t.key_tiles = warps > 0 ? block_n / (16 * warps) : 0;
  const int tiles16 = t.head_dim_pad / 16;
  const int tiles16_v = t.head_dim_v_pad / 16;
  t.slice_tiles = d_split > 0 ? (tiles16 + d_split - 1) / d_split : 0;
  t.slice_tiles_v = d_split > 0 ? (tiles16_v + d_split - 1) / d_split : 0;
  t.ds_row_elems = block_m + 8;
  const int m_tiles = block_m / 16;
  const int parts = (warps > m_tiles && m_tiles > 0) ? warps / m_tiles : 1;
  t.dq_items = warps > 0 ? m_tiles * parts / warps : 0;
  t.dq_part_tiles = (t.slice_tiles + parts - 1) / parts;
  t.smem_kv_bytes = block_n * (t.smem_row_elems + t.smem_row_elems_v) * 2;
  t.smem_stage_bytes = block_m * (t.smem_row_elems + t.smem_row_elems_v) * 2 + 2 * block_m * 4;
  t.smem_ds_bytes = atomic_dq ? 2 * block_n * t.ds_row_elems * 2 : 0;
  t.smem_bytes = t.smem_kv_bytes + stages * t.smem_stage_bytes + t.smem_ds_bytes;
  t.accum_regs = t.key_tiles * (t.slice_tiles + t.slice_tiles_v) * 2 * 4  // dK, dV: (16 keys, 16 columns), 2 tiles of 4
                 + t.key_tiles * (block_m / 8) * 4 * 2;                   // S and dP: (16 keys, 8 queries) tiles
  t.error = nullptr;
  if (head_dim < 8 || head_dim > 512 || head_dim % 8 != 0) {
    t.error = "head_dim must be a multiple of 8 in [8, 512]";
  } else if (dim_v < 8 || dim_v > 512 || dim_v % 8 != 0) {
    t.error = "head_dim_v must be a multiple of 8 in [8, 512]";
  } else if (warps < 1 || warps > 16) {
    t.error = "warps must be in [1, 16]";
  } else if (block_n % (16 * warps) != 0 || block_n > 256) {
    t.error = "block_n must be a multiple of 16 * warps (each warp owns whole 16-key mma tiles), at most 256";
  } else if (block_m < 16 || block_m % 16 != 0 || block_m > 256) {
    t.error = "block_m must be a multiple of 16 in [16, 256]";
  } else if (stages < 2 || stages > 3) {
    t.error = "stages must be 2 or 3";
  } else if (d_split < 1 || d_split > tiles16) {
    t.error = "d_split must be in [1, head_dim_pad / 16]";
  } else if (d_split > tiles16_v) {
    t.error = "d_split must be at most head_dim_v_pad / 16 (dV's slices are of its 16-column tiles)";
  } else if ((d_split - 1) * t.slice_tiles >= tiles16 && (d_split - 1) * t.slice_tiles_v >= tiles16_v) {
    t.error = "d_split leaves its last slice without columns of dK or dV (it would recompute the scores for nothing)";
  } else if (atomic_dq && m_tiles % warps != 0 && warps % m_tiles != 0) {
    t.error = "block_m / 16 and warps must divide one another (dQ work is split evenly across warps)";
  } else if (t.accum_regs > kMaxBwdAccumRegs) {
    t.error = "accumulators need more registers than a thread has: raise d_split or lower block_m or block_n";
  }
  return t;
}

struct BwdDqTraits {
  int threads;
  int head_dim_pad;
  int smem_row_elems;      // Q/K tile pitch
  int head_dim_v_pad;      // the values' head dim rounded up to 16: dP's k-steps
  int smem_row_elems_v;    // dO/V tile pitch: head_dim_v_pad + 8
  int m_tiles;             // 16-row tiles per warp
  int slices;              // column slices of dQ, a block each (blockIdx.z): 256 columns at most
  int slice_tiles;         // 16-column tiles of dQ a block owns: ceil(head_dim_pad / 16 / slices)
  int smem_q_bytes;        // Q and dO tiles, LSE and D
  int smem_kv_stage_bytes; // one K tile + one V tile
  int smem_bytes;
  int accum_regs;          // dQ, S, dP fragments per thread
  const char* error;
};

inline constexpr int kMaxBwdDqAccumRegs = 200;

// head_dim_v as in bwd_dkdv_traits.
constexpr BwdDqTraits bwd_dq_traits(int head_dim, int block_m, int block_n, int warps, int stages, int head_dim_v = 0) {
  BwdDqTraits t{};
  const int dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  t.threads = warps * 32;
  t.head_dim_pad = (head_dim + 15) / 16 * 16;
  t.smem_row_elems = t.head_dim_pad + 8;
  t.head_dim_v_pad = (dim_v + 15) / 16 * 16;
  t.smem_row_elems_v = t.head_dim_v_pad + 8;
  t.m_tiles = warps > 0 ? block_m / (16 * warps) : 0;
  t.smem_q_bytes = block_m * (t.smem_row_elems + t.smem_row_elems_v) * 2 + 2 * block_m * 4;
  t.smem_kv_stage_bytes = block_n * (t.smem_row_elems + t.smem_row_elems_v) * 2;
  t.smem_bytes = t.smem_q_bytes + stages * t.smem_kv_stage_bytes;
  // dQ (16 rows, 16 columns) tiles, 2 of 4 registers, next to S and dP (16 rows, 8 keys) tiles. Heads wider than
  // 256 (the widest dQ row measured free of spills) take column slices of at most 256, each recomputing S and dP.
  const int tiles16 = t.head_dim_pad / 16;
  t.slices = (tiles16 + 15) / 16;
  t.slice_tiles = t.slices > 0 ? (tiles16 + t.slices - 1) / t.slices : 0;
  t.accum_regs = t.m_tiles * t.slice_tiles * 8 + 2 * t.m_tiles * (block_n / 8) * 4;
  t.error = nullptr;
  if (head_dim < 8 || head_dim > 512 || head_dim % 8 != 0) {
    t.error = "head_dim must be a multiple of 8 in [8, 512]";
  } else if (dim_v < 8 || dim_v > 512 || dim_v % 8 != 0) {
    t.error = "head_dim_v must be a multiple of 8 in [8, 512]";
  } else if (warps < 1 || warps > 16) {
    t.error = "dq warps must be in [1, 16]";
  } else if (block_m % (16 * warps) != 0 || block_m > 256) {
    t.error = "dq block_m must be a multiple of 16 * warps, at most 256";
  } else if (block_n < 16 || block_n % 16 != 0 || block_n > 256) {
    t.error = "dq block_n must be a multiple of 16 in [16, 256]";
  } else if (stages < 2 || stages > 3) {
    t.error = "dq stages must be 2 or 3";
  } else if (t.accum_regs > kMaxBwdDqAccumRegs) {
    t.error = "dq accumulators need more registers than a thread has: lower dq block_m per warp or block_n";
  }
  return t;
}

// Cfg::kSinkGrad and kSinkPartialWarps where the generated config header names them (only configs that take the
// sinks' gradient through their main kernels do: bwd_rows.cuh's BwdSinkGrad), else false and 0.
template <class Cfg, class = void>
struct ConfigSinkGrad {
  static constexpr bool value = false;
  static constexpr int partial_warps = 0;
};
template <class Cfg>
struct ConfigSinkGrad<Cfg, decltype(void(Cfg::kSinkGrad))> {
  static constexpr bool value = Cfg::kSinkGrad;
  static constexpr int partial_warps = Cfg::kSinkPartialWarps;
};

// Rows of (batch, head, query) the preprocess and convert kernels give one block.
inline constexpr int kBwdRowKernelThreads = 256;

// The preprocess gives each row of O and dO (value_dim columns) a group of lanes, one per 16-byte chunk of it,
// rounded up to a power of two (so a row's sum stays within its lanes' shuffles), at most a warp: value_dim 64 takes
// 8 lanes and 4 rows per warp, 128 two rows per warp, 256 one, 512 one with two chunks a lane.
constexpr int bwd_preprocess_row_lanes(int value_dim) {
  int lanes = 1;
  while (lanes < value_dim / 8 && lanes < 32) lanes *= 2;
  return lanes;
}
constexpr int bwd_preprocess_rows_per_block(int value_dim) {
  return kBwdRowKernelThreads / bwd_preprocess_row_lanes(value_dim);
}

// Where dQ is accumulated in fp32 before the convert kernel rounds it (or none: the sm80 family's
// deterministic strategy, whose dq kernel writes dQ itself).
//   kRows   row-major (batch, head, row, head_dim), red.global adds by the sm80 family's dkdv kernel;
//   kTiles  the sm90 family: per (batch, head), 64-row tiles of head_dim / 64 chunks of 64 x 64 values
//           each, a chunk in the order a wgmma accumulator holds it (value e of 8-column group i of the
//           thread at index x of its warpgroup at float 4 * (128 * i + x) + e, see bwd_sm90.cuh), so the
//           dkdv kernel stages a tile in shared memory without bank conflicts and adds it with one bulk
//           reduce-add, and the convert kernel reads 64 contiguous bytes per two rows.
enum class DqAccum { kNone, kRows, kTiles };

// Columns of one accumulator row: head_dim, or with kTiles whole 64-column chunks (sm90_tile_dim; the
// columns past head_dim take the zeros of the padded tiles and are never converted).
constexpr int dq_accum_cols(DqAccum accum, int head_dim) {
  return accum == DqAccum::kTiles ? sm90_tile_dim(head_dim) : head_dim;
}

// The Hopper family (bwd_sm90.cuh) replaces the dkdv kernel with a warp-specialized one: a producer
// warpgroup loads K and V once and streams Q, dO, LSE and D through a ring with TMA; block_n / 64
// consumer warpgroups own 64 keys each and run every product on wgmma (Sᵀ and dPᵀ from shared memory,
// dV and dK with Pᵀ and dSᵀ from registers, dQ = dS K from dSᵀ staged in shared memory). The consumers
// stage dQ in shared memory and a warp of the producer warpgroup adds it to the fp32 accumulator (kTiles)
// with a bulk reduce-add; the deterministic strategy orders those adds by key block with a semaphore per
// query block. Its workspace rows (LSE in base 2, D, the dQ accumulator) are padded to a multiple of
// kBwdSm90PadRows per head so every query block's LSE and D are one aligned bulk copy and no dQ row
// needs a bounds check.
inline constexpr int kBwdSm90PadRows = 128;

struct BwdSm90Traits {
  int tile_dim;         // sm90_tile_dim(head_dim): the Q, K and dQ tiles' columns (fwd_traits.cuh)
  int tile_dim_v;       // sm90_tile_dim of the values' head dim: the V and dO tiles' columns, dV's
  int consumers;        // consumer warpgroups: block_n / 64, or 2 splitting dK and dV above tile_dim 128
  bool dkdv_split;      // tile_dim 192 and 256: both consumers see the block's 64 keys; consumer 0 computes Sᵀ,
                        // Pᵀ, dSᵀ and holds dK, consumer 1 computes dPᵀ and holds dV (dK and dV together would
                        // take tile_dim fp32 registers per thread); they trade dPᵀ and Pᵀ through an
                        // exchange tile
  bool query_split;     // tile_dim 128 with 64-key blocks: both consumers see the block's 64 keys and take
                        // turns over its steps (consumer c the steps c, c + 2, ...), each computing whole
                        // steps with no barrier between them and its own query block's dQ tile (a staged tile
                        // each); their dK and dV are summed once at the end
  int key_consumers;    // consumers that split the keys: consumers, or 1 with the dK/dV or query split
  int dkv_regs;         // fp32 registers of a consumer's dK and dV: (tile_dim + tile_dim_v) / 2, or with the split
                        // the wider of its one
  int threads;          // 128 * (consumers + 1)
  int producer_regs;
  int consumer_regs;
  int dq_row_tiles;     // 64-row query tiles of dQ per consumer
  int dq_cols;          // dQ columns per consumer and pass (wgmma N)
  int dq_tiles;         // staged dQ tiles: one per consumer with the query split, else one
  int dq_passes;        // most dQ column passes of a consumer: its columns dq_cols at a time
  int dq_passes_last;   // the last consumer's: dq_passes, or with the split tile_dim / 64 - 2 (consumer 0 adds
                        // the first two chunks of dQ, consumer 1 the rest)
  bool dq_staged;       // dQ stored to a shared fp32 tile and added by the writer warp; else each consumer
                        // thread adds its values with vector reductions (the dK/dV split where the tile
                        // does not fit: tile_dim 256 with 2 stages, 192 with 3)
  int smem_kv_bytes;    // K and V: (tile_dim / 64 and tile_dim_v / 64 chunks, block_n, 64)
  int smem_stage_bytes; // one ring stage: Q, dO (tile_dim / 64 and tile_dim_v / 64 chunks, block_m, 64), LSE and D
  int ds_tiles;         // dSᵀ tiles, one per step in turn: 2, or 3 with ping_pong (the other consumer's dQ product
                        // of two steps ago may still read one while a consumer stores its next)
  int smem_ds_bytes;    // ds_tiles dSᵀ tiles (block_m / 64 chunks, block_n, 64)
  int smem_exchange_bytes;  // the dK/dV split: dPᵀ in fp32 from consumer 1, then Pᵀ's fragments from consumer 0
  bool defer_dq;        // a step adds the previous step's dQ, so the consumers meet at no barrier of a step
                        // (bwd_sm90.cuh): 64-column tiles (bench/notes_bwd_sm90.md, Versions: deferred dQ), and
                        // ping_pong; alone on 128 columns it measured no gain, and the dK/dV split trades within a
                        // step
  bool ping_pong;       // 128-column tiles on 128-key blocks with 2 stages, unless lock_step (below): the consumers
                        // take turns issuing their products (one turn: dV and dK of a step, dQ of the step before,
                        // Sᵀ and dPᵀ of the next), each computing its next step's Pᵀ and dSᵀ while the other's
                        // products run (bench/notes_bwd_sm90.md, Versions: ping-pong)
  int mbarriers;        // K/V full, the ring's full and empty, with defer_dq dSᵀ's full and empty (one each per
                        // dSᵀ tile), and the deterministic strategy's two-slot rings between the dQ writer and the
                        // warps that watch for its turns and pass them on (reserved for the atomic strategy too:
                        // 64 bytes); with the query split, one more for the epilogue's partial dK and dV
  int smem_dq_bytes;    // the query block's dQ in fp32, laid out as its tiles of the accumulator (kTiles)
                        // (bwd_sm90.cuh lays the stages' LSE and D out after the tiles: 1024-byte alignment)
  int smem_bytes;
  int accum_regs;       // most fp32 fragments a consumer thread holds at once
  const char* error;
};

// Whether a config's consumers step together rather than take turns (ping_pong): variants whose per-score work needs
// more registers than the turns leave (variant.cuh's kWideScoreWork: a user's mask or score_mod, or the soft cap under
// ALiBi; with them the turns' tile spills 4-60 bytes, in lock step it does not). Both dQ strategies take turns
// otherwise (the deterministic one since its turns are watched for and passed on by warps of their own: bwd_sm90.cuh,
// write_dq).
constexpr bool bwd_sm90_lock_step(bool wide_score_work) { return wide_score_work; }

// head_dim_v: the values' (v, dout, dv) head dim where it differs from the queries' and keys'; 0: head_dim.
constexpr BwdSm90Traits bwd_sm90_traits(int head_dim, int block_m, int block_n, int stages, bool lock_step,
                                        int head_dim_v = 0) {
  BwdSm90Traits t{};
  const int dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  t.tile_dim = sm90_tile_dim(head_dim);
  t.tile_dim_v = sm90_tile_dim(dim_v);
  t.dkdv_split = t.tile_dim > 128;
  t.query_split = t.tile_dim == 128 && block_n == 64;
  const bool shared_keys = t.dkdv_split || t.query_split;
  t.consumers = shared_keys ? 2 : block_n / 64;
  t.key_consumers = shared_keys ? 1 : t.consumers;
  t.dkv_regs = t.dkdv_split ? (t.tile_dim > t.tile_dim_v ? t.tile_dim : t.tile_dim_v) / 2
                             : (t.tile_dim + t.tile_dim_v) / 2;
  t.threads = 128 * (t.consumers + 1);
  t.producer_regs = kSm90ProducerRegs;
  t.consumer_regs = sm90_consumer_regs(t.consumers);
  const int row_tiles = block_m / 64;
  t.dq_row_tiles = t.consumers > 0 && row_tiles > t.consumers ? row_tiles / t.consumers : 1;
  const int col_parts = row_tiles > 0 && t.consumers > row_tiles ? t.consumers / row_tiles : 1;
  t.dq_passes = shared_keys ? 2 : 1;
  t.dq_passes_last = t.dkdv_split ? t.tile_dim / 64 - 2 : t.dq_passes;
  t.dq_cols = shared_keys ? 64 : t.tile_dim / col_parts;
  t.dq_tiles = t.query_split ? 2 : 1;
  t.smem_kv_bytes = block_n * (t.tile_dim + t.tile_dim_v) * 2;
  t.smem_stage_bytes = block_m * (t.tile_dim + t.tile_dim_v) * 2 + 2 * block_m * 4;
  t.ping_pong = !lock_step && t.tile_dim == 128 && block_m == 64 && block_n == 128 && stages == 2;
  t.defer_dq = t.tile_dim == 64 || t.ping_pong;
  t.ds_tiles = t.ping_pong ? 3 : 2;
  t.smem_ds_bytes = t.ds_tiles * block_n * block_m * 2;
  t.smem_exchange_bytes = t.dkdv_split ? block_n * block_m * 4 : 0;
  t.mbarriers = 1 + 2 * stages + (t.defer_dq ? 2 * t.ds_tiles : 0) + 8 + (t.query_split ? 1 : 0);
  const int smem_rest = t.smem_kv_bytes + stages * t.smem_stage_bytes + t.smem_ds_bytes + t.smem_exchange_bytes +
                        t.mbarriers * 8 + 1024;
  t.dq_staged = !t.dkdv_split || smem_rest + block_m * t.tile_dim * 4 <= max_smem_per_block(90);
  t.smem_dq_bytes = t.dq_staged ? t.dq_tiles * block_m * t.tile_dim * 4 : 0;
  t.smem_bytes = smem_rest + t.smem_dq_bytes;
  // dK and dV, then either Sᵀ and dPᵀ (block_m / 2 each) or their 16-bit fragments (block_m / 4 each,
  // counted once: an estimate; the tests check the compiled choices for spills) with one pass of the dQ tile.
  const int with_s = t.dkv_regs + block_m;
  const int with_dq = t.dkv_regs + block_m / 4 + t.dq_row_tiles * t.dq_cols / 2;
  t.accum_regs = with_s > with_dq ? with_s : with_dq;
  t.error = nullptr;
  if (head_dim < 8 || head_dim > 256 || head_dim % 8 != 0) {
    t.error = "head_dim must be a multiple of 8 in [8, 256] (16-byte rows for TMA; dK and dV stay in registers)";
  } else if (dim_v < 8 || dim_v % 8 != 0 || dim_v > (t.dkdv_split ? 256 : 128)) {
    t.error = "head_dim_v must be a multiple of 8, at most 128 beside a head_dim up to 128 and at most 256 beside a "
              "wider one (dV in registers: one consumer's with the dK/dV split)";
  } else if (block_n != 64 && block_n != 128) {
    t.error = "block_n must be 64 or 128 (64 keys per consumer warpgroup, at most 2)";
  } else if (t.dkdv_split && (block_n != 64 || block_m != 64)) {
    t.error = "head_dim above 128 takes 64 x 64 blocks (two consumers split 64 keys' dK and dV)";
  } else if (t.query_split && block_m != 64) {
    t.error = "head_dim 128 with 64-key blocks takes 64-query blocks (two consumers take turns over them)";
  } else if (block_m != 64 && block_m != 128) {
    t.error = "block_m must be 64 or 128 (wgmma N of Sᵀ; 64-row tiles of dQ)";
  } else if (stages < (t.dkdv_split ? 1 : 2) || stages > 3) {
    t.error = "stages must be 2 or 3 (1 too at head_dim above 128)";
  } else if (t.dq_cols % 64 != 0) {
    t.error = "dQ columns per consumer must be whole 64-column chunks: raise block_m or lower block_n";
  } else if (t.accum_regs + 40 > t.consumer_regs) {
    // 40: addresses, LSE and D, loop state; at 32 ptxas serializes the wgmma of head_dim 128, block_n 64.
    t.error = "accumulators need more registers than a consumer thread has: lower block_m or block_n";
  }
  return t;
}

// Whether the Hopper family's dkdv kernel counts each query block's dQ adds on its semaphore (staged dQ,
// added by the writer warp), so that the convert kernel can start while the dkdv kernel's last blocks run
// and wait for each query block's adds instead (bwd_rows.cuh, bwd_sm90.cuh's write_dq). head_dim_v as in
// bwd_sm90_traits (the values' tiles take shared memory the dQ tile might have had).
constexpr bool dq_adds_counted(DqAccum accum, int head_dim, int block_m, int block_n, int stages, int head_dim_v = 0) {
  // (Whether dQ is staged does not depend on lock_step.)
  return accum == DqAccum::kTiles &&
         bwd_sm90_traits(head_dim, block_m, block_n, stages, false, head_dim_v).dq_staged;
}

// Whether the dkdv kernel writes the dQ accumulator before adding to it, so that nothing need zero it: a
// query block's first add (the deterministic strategy's first turn, or under a mask that hides keys the
// atomic strategy's first ticket) stores the tile instead. The atomic strategy without a mask zeroes and
// adds: its tickets cost more than the zeroing saved (bench/notes_bwd_sm90.md, Versions: first add stores).
// Where the first add stores, a query block whose semaphore counts no add has an unwritten accumulator, and the
// convert kernel writes zeros for it.
constexpr bool dq_first_add_stores(DqAccum accum, int head_dim, int block_m, int block_n, int stages,
                                   bool deterministic, bool hides_keys, int head_dim_v = 0) {
  return dq_adds_counted(accum, head_dim, block_m, block_n, stages, head_dim_v) && (deterministic || hides_keys);
}

}  // namespace flashgen
