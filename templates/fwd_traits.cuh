// The one place that decides whether a forward config is valid and derives its sizes. Plain constexpr
// C++ read by the host (generator, tuner, launcher) and by the kernel template's static_asserts.
#pragma once

namespace flashgen {

// The 16-bit types attention computes in, and the 8-bit floating-point types a KV cache may hold (e4m3fn: 4
// exponent bits, 3 mantissa, no infinity, ±448 largest; e5m2: 5 and 2, IEEE-like).
enum class ElemType : int { kFloat16 = 0, kBFloat16 = 1, kFloat8E4M3 = 2, kFloat8E5M2 = 3 };

constexpr bool is_fp8(ElemType t) { return t == ElemType::kFloat8E4M3 || t == ElemType::kFloat8E5M2; }
constexpr int elem_bytes(ElemType t) { return is_fp8(t) ? 1 : 2; }
// kWindow: a sliding window about the diagonal (variant.cuh's SlidingWindow); a causal window is one whose
// right side is 0. kChunk: a window whose rows also see only their own chunk of keys (ChunkedWindow; Llama 4's
// chunked attention, chunked causal being the window (seqlen_k, 0) in chunks).
enum class MaskKind : int { kNone = 0, kCausal = 1, kWindow = 2, kChunk = 3 };

struct FwdTraits {
  int threads;             // warps * 32
  int head_dim_pad;        // head_dim rounded up to the mma k-step (16)
  int smem_row_elems;      // shared-memory row pitch: head_dim_pad + 8 elements, so ldmatrix rows hit distinct banks
  int head_dim_v_pad;      // the values' head dim (head_dim unless the config has its own), rounded up likewise
  int smem_row_elems_v;    // the V tile's and the output tile's row pitch: head_dim_v_pad + 8
  int rows_per_warp;       // block_m / warps
  int m_tiles;             // 16-row mma tiles per warp
  int smem_q_bytes;        // (block_m, smem_row_elems) Q tile; its rows, and past them the K/V stages', hold the output
  int smem_kv_stage_bytes; // (block_n, smem_row_elems) K tile + (block_n, smem_row_elems_v) V tile
  int smem_bytes;          // whole dynamic shared memory of one block
  int accum_regs;          // registers per thread for O, S, P (and Q) fragments: the bulk of the budget
  const char* error;       // nullptr when the shape is valid on some GPU
};

// Registers a thread may spend on fragments before the kernel surely spills: 255 minus addresses,
// softmax state and the K/V operands in flight. A necessary condition only (measured: O + S + P of 224
// compiles without spills for d32 x 128 keys and spills 24 bytes for d128 x 64 keys): ptxas's report is
// the final word, and whoever compiles a config drops it when it spills.
constexpr int kMaxAccumRegs = 232;

// head_dim_v: the values' (and the output's) head dim where it differs from the queries' and keys' (MLA's 192 and
// 128); 0: head_dim.
constexpr FwdTraits fwd_traits(int head_dim, int block_m, int block_n, int warps, int stages, bool q_in_regs,
                               int head_dim_v = 0) {
  FwdTraits t{};
  const int dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  t.threads = warps * 32;
  t.head_dim_pad = (head_dim + 15) / 16 * 16;
  t.smem_row_elems = t.head_dim_pad + 8;
  t.head_dim_v_pad = (dim_v + 15) / 16 * 16;
  t.smem_row_elems_v = t.head_dim_v_pad + 8;
  t.rows_per_warp = warps > 0 ? block_m / warps : 0;
  t.m_tiles = t.rows_per_warp / 16;
  t.smem_q_bytes = block_m * t.smem_row_elems * 2;
  t.smem_kv_stage_bytes = block_n * (t.smem_row_elems + t.smem_row_elems_v) * 2;
  t.smem_bytes = t.smem_q_bytes + stages * t.smem_kv_stage_bytes;
  const int smem_o_bytes = block_m * t.smem_row_elems_v * 2;  // the output tile, staged over Q and the stages
  if (smem_o_bytes > t.smem_bytes) t.smem_bytes = smem_o_bytes;
  t.accum_regs = t.m_tiles * (t.head_dim_v_pad / 8) * 4     // O, fp32
                 + t.m_tiles * (block_n / 8) * 4             // S, fp32
                 + t.m_tiles * (block_n / 16) * 4            // P, packed 16-bit pairs
                 + (q_in_regs ? t.m_tiles * (t.head_dim_pad / 16) * 4 : 0);
  t.error = nullptr;
  if (head_dim < 8 || head_dim > 256 || head_dim % 8 != 0) {
    t.error = "head_dim must be a multiple of 8 in [8, 256]";
  } else if (dim_v < 8 || dim_v > 512 || dim_v % 8 != 0) {
    t.error = "head_dim_v must be a multiple of 8 in [8, 512]";
  } else if (warps < 1 || warps > 16) {
    t.error = "warps must be in [1, 16]";
  } else if (block_m % (16 * warps) != 0) {
    t.error = "block_m must be a multiple of 16 * warps (each warp owns whole 16-row mma tiles)";
  } else if (block_n < 16 || block_n % 16 != 0 || block_n > 256) {
    t.error = "block_n must be a multiple of 16 in [16, 256]";
  } else if (stages < 2 || stages > 4) {
    t.error = "stages must be in [2, 4]";
  } else if (t.accum_regs > kMaxAccumRegs) {
    t.error = "accumulators need more registers than a thread has: lower block_m per warp, block_n or q_in_regs";
  }
  return t;
}

// Cfg::kValueSplit where the generated config header names it (a Hopper config whose consumers split O's columns),
// else 1.
template <class Cfg, class = void>
struct ConfigValueSplit {
  static constexpr int value = 1;
};
template <class Cfg>
struct ConfigValueSplit<Cfg, decltype(void(Cfg::kValueSplit))> {
  static constexpr int value = Cfg::kValueSplit;
};

// Cfg::kHeadDimV where the generated config header names it (a config whose values have a head dim of their own),
// else Cfg::kHeadDim.
template <class Cfg, class = void>
struct ConfigHeadDimV {
  static constexpr int value = Cfg::kHeadDim;
};
template <class Cfg>
struct ConfigHeadDimV<Cfg, decltype(void(Cfg::kHeadDimV))> {
  static constexpr int value = Cfg::kHeadDimV;
};

// The threads of an FP8 module's Vᵀ kernel (fwd_sm90_values.cuh).
inline constexpr int kValuesThreads = 256;
// An FP8 config's key block (Vᵀ's rows are whole 128-byte swizzle rows of keys), and so the pad of a packed
// sequence's Vᵀ: each starts at a multiple of it (attn_params.cuh's packed_workspace_first_row), so that its
// 32-key steps are its own and its last key block reads zeros, never another sequence's keys.
inline constexpr int kFp8BlockN = 128;

// Cfg::kOutElem where the generated config header names it (an FP8 config's 16-bit output), else Cfg::kElem.
template <class Cfg, class = void>
struct ConfigOutElem {
  static constexpr ElemType value = Cfg::kElem;
};
template <class Cfg>
struct ConfigOutElem<Cfg, decltype(void(Cfg::kOutElem))> {
  static constexpr ElemType value = Cfg::kOutElem;
};

// Largest dynamic shared memory one block may opt into on an architecture (sm number: 80, 86, 89, 90,
// 100, 120); 0 below sm_80, which the tensor-core path does not support.
constexpr int max_smem_per_block(int sm) {
  if (sm == 80 || sm == 87) return 166912;   // A100, Orin: 163 KB
  if (sm >= 90 && sm < 120) return 232448;   // H100/H200, B200: 227 KB
  if (sm >= 86) return 101376;               // sm_86, sm_89, sm_120: 99 KB
  return 0;
}

// The Hopper families' tiles are chunks of 128-byte rows with 128-byte swizzling (64 columns of 16-bit elements,
// 128 of 8-bit ones): head_dim rounded up to whole chunks. TMA fills the columns past head_dim with zeros when it
// loads a tile and clips them when it stores one, so they add nothing to any product (at 96 a quarter of the
// tensor-core work is spent on them).
constexpr int sm90_chunk_cols(ElemType elem = ElemType::kFloat16) { return 128 / elem_bytes(elem); }
constexpr int sm90_tile_dim(int head_dim, ElemType elem = ElemType::kFloat16) {
  return (head_dim + sm90_chunk_cols(elem) - 1) / sm90_chunk_cols(elem) * sm90_chunk_cols(elem);
}

// The Hopper family (fwd_sm90.cuh): one producer warpgroup issuing TMA loads and block_m / 64 consumer
// warpgroups issuing wgmma, each owning 64 query rows.
struct FwdSm90Traits {
  int tile_dim;             // sm90_tile_dim(head_dim) (or the output's, where the split pads keys above 256): the Q
                            // and K tiles' columns
  int tile_dim_v;           // the V tiles' and the output's columns: the values' head dim in whole 64-column
                            // chunks, value_split parts of them (FP8: Vᵀ's rows, block_n keys of 8 bits each)
  int part_dim_v;           // the output columns one consumer holds: tile_dim_v / value_split
  int out_dim_v;            // the output's staged columns: the values' head dim in whole chunks (the split's
                            // padding chunk past it, zeros, is never staged)
  int consumers;            // consumer warpgroups of a group: block_m / 64 * value_split
  int threads;              // 128 * (groups * consumers + 1)
  int producer_regs;        // setmaxnreg targets: the producer gives registers to the consumers
  int consumer_regs;
  int smem_q_bytes;         // (block_m, tile_dim) Q tile
  int smem_kv_stage_bytes;  // (block_n, tile_dim) K tile + (block_n, tile_dim_v) V tile
  int smem_p_bytes;         // p_smem: P of each consumer, (64, block_n) in 64-column chunks; else 0
  int smem_o_bytes;         // (block_m, out_dim_v) output staging, or 0: the output is staged in the Q rows
  int smem_ones_bytes;      // tensor_sum: a block of ones, whose product with P is the rows' sums; else 0
  int smem_group_bytes;     // one group's tiles, mbarriers and two tile indices
  int smem_group_stride;    // from one group's tiles to the next's: smem_group_bytes rounded up to 1024
  int smem_bytes;           // every group's, and 1024 bytes to align the swizzled tiles
  int accum_regs;           // O, S (fp32) and P (packed pairs; with p_smem its store addressing) per thread
  const char* error;        // nullptr when the shape is valid on sm_90a
};

// pingpong: the two consumers of a block_m = 128 config take turns at issuing their products. (The
// overlap knob needs no rule here: it holds no more registers, P being packed once P V is done.)
// persistent: where shared memory allows, the output gets staging rows of its own, so the next tile's Q
// may load as soon as this tile's last S = Q Kᵀ is done instead of after its output has left.
// groups: 1, or 2 groups of consumers in one persistent block, each walking tiles of its own with a Q
// tile, K/V rings, barriers and a producer thread of its own: two block_m-row blocks in one, sharing the
// SM's registers as one block (two blocks of 384 threads would each leave their consumers 8 fewer).
// tensor_sum: the rows' running sums of P come from the tensor cores (P times a block of ones in shared
// memory, 8 more columns of P V) instead of one add per score; they add P as rounded to fp16 (as P V
// does), which moves the LSE by up to 2^-11 (1.6e-4 measured).
// value_split: 1, or 2 consumers for each 64 query rows, each holding half of O's columns (values wider than
// one consumer's registers, 512): both compute the rows' S and softmax, and P V of their half of V's columns.
// Their output is staged in rows of its own where values are wider than keys, else in the Q rows once both are
// done with them (keys of 512 leave no room for rows of its own).
// p_smem: P goes through shared memory (wgmma reads both operands of P V there), freeing the registers
// of its packed fragments. cluster: 1 or 2 blocks of adjacent query tiles of one head share every K and
// V tile (each loads half and multicasts it to both); under a causal mask the two would see different
// key ranges, so clusters take unmasked problems only.
// Registers of a warp-specialized sm90 block (forward and backward): the producer warpgroup keeps
// producer_regs (kSm90ProducerRegs unless it walks cluster tiles or one of two groups' lists, or copies from a
// paged cache), the consumers share the rest of what the block was launched with (the SM's 65536 split evenly
// over its threads, in steps of 8, at most 255 each) in steps of 8, at most 240 each.
constexpr int kSm90ProducerRegs = 24;
// The pair walk of a cluster, a group's own walk, or the copies of a paged cache's boxes need a few more.
constexpr int kSm90WideProducerRegs = 32;
constexpr int sm90_consumer_regs(int consumers, int producer_regs = kSm90ProducerRegs) {
  if (consumers <= 0) return 0;
  const int threads = 128 * (consumers + 1);
  const int launch_regs = 65536 / threads > 255 ? 248 : 65536 / threads / 8 * 8;
  const int share = (launch_regs * threads - 128 * producer_regs) / (128 * consumers) / 8 * 8;
  return share > 240 ? 240 : share;
}

// elem: q's, k's and v's type. FP8 (e4m3, e5m2) computes both products on 8-bit wgmma, whose operands are both
// K-major: Q and K in 128-column chunks, V as Vᵀ (the values' head dim as rows of block_n keys, keys in the order
// P's fragments hold them: fp8.cuh's pv_key), P rounded to e4m3 in registers; the output is 16-bit, in rows of its
// own (twice Q's bytes).
// head_dim_v: the values' (and the output's) head dim where it differs from the queries' and keys'; 0: head_dim.
constexpr FwdSm90Traits fwd_sm90_traits(int head_dim, int block_m, int block_n, int stages, bool pingpong,
                                        bool persistent, bool p_smem, int cluster, MaskKind mask, int groups = 1,
                                        bool tensor_sum = false, ElemType elem = ElemType::kFloat16,
                                        bool paged = false, int head_dim_v = 0, int value_split = 1) {
  FwdSm90Traits t{};
  const int dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  const bool fp8 = is_fp8(elem);
  const int bytes = elem_bytes(elem);
  t.tile_dim = sm90_tile_dim(head_dim, elem);
  t.part_dim_v = value_split > 0 ? sm90_tile_dim((dim_v + value_split - 1) / value_split) : 0;
  t.tile_dim_v = t.part_dim_v * value_split;
  t.out_dim_v = sm90_tile_dim(dim_v);
  // Keys wider than 256 beside wider values (448 and 512): rows of its own for the output would not fit beside them,
  // so the Q and K tiles take the output's chunks (TMA zero-fills the keys' padding) and the output goes in the Q rows.
  if (value_split > 1 && t.tile_dim > 256 && t.out_dim_v > t.tile_dim) t.tile_dim = t.out_dim_v;
  t.consumers = block_m / 64 * value_split;
  t.threads = 128 * (groups * t.consumers + 1);
  t.producer_regs = cluster > 1 || groups > 1 || paged ? kSm90WideProducerRegs : kSm90ProducerRegs;
  t.consumer_regs = sm90_consumer_regs(groups * t.consumers, t.producer_regs);
  t.smem_q_bytes = block_m * t.tile_dim * bytes;
  t.smem_kv_stage_bytes = block_n * (t.tile_dim + t.tile_dim_v) * bytes;
  t.smem_p_bytes = p_smem ? t.consumers * ((block_n + 63) / 64) * 64 * 128 : 0;
  t.smem_ones_bytes = tensor_sum ? 1024 : 0;
  t.smem_group_bytes =
      t.smem_q_bytes + stages * t.smem_kv_stage_bytes + t.smem_p_bytes + t.smem_ones_bytes + (3 + 4 * stages) * 8;
  const auto total = [&](int group_bytes) {
    return groups > 0 ? (groups - 1) * ((group_bytes + 1023) / 1024 * 1024) + group_bytes + 1024 : 0;
  };
  // Rows of its own where the output is wider than the Q rows it would be staged in, or where a persistent block
  // has room for them.
  const int o_bytes = block_m * t.out_dim_v * 2;
  t.smem_o_bytes =
      o_bytes > t.smem_q_bytes || (persistent && total(t.smem_group_bytes + o_bytes) <= max_smem_per_block(90))
          ? o_bytes
          : 0;
  t.smem_group_bytes += t.smem_o_bytes;
  t.smem_group_stride = (t.smem_group_bytes + 1023) / 1024 * 1024;
  t.smem_bytes = total(t.smem_group_bytes);
  // P's packed pairs, or with p_smem the addressing of its stores: 24 registers of headroom is what
  // ptxas needed to keep three consumers' persistent kernels free of spills.
  // (tensor_sum's four accumulators of the sums take the place of the two running sums and the adds'
  // temporaries.)
  t.accum_regs = t.part_dim_v / 2 + block_n / 2 + (p_smem ? 24 : block_n / (fp8 ? 8 : 4));
  t.error = nullptr;
  if (head_dim < 8 || head_dim > 512 || head_dim % 8 != 0) {
    t.error = "head_dim must be a multiple of 8 in [8, 512] (16-byte rows for TMA)";
  } else if (dim_v < 8 || dim_v > 512 || dim_v % 8 != 0) {
    t.error = "head_dim_v must be a multiple of 8 in [8, 512]";
  } else if (value_split != 1 && value_split != 2) {
    t.error = "value_split must be 1 or 2 (consumers sharing 64 query rows, each with part of O's columns)";
  } else if (t.part_dim_v > 256) {
    t.error = "head_dim_v above 256 takes value_split 2: O's columns in one consumer's registers are at most 256";
  } else if (block_m != 64 && block_m != 128 && block_m != 192 && block_m != 256) {
    t.error = "block_m must be 64, 128, 192 or 256 (64 rows per consumer warpgroup)";
  } else if (t.consumers > 4) {
    t.error = "block_m / 64 * value_split must be at most 4 consumer warpgroups";
  } else if (block_n < (t.tile_dim > 256 || t.tile_dim_v > 256 ? 32 : 64) || block_n > 192 || block_n % 16 != 0) {
    t.error = "block_n must be a multiple of 16 in [64, 192] ([32, 192] beside K or V tiles wider than 256, which "
              "leave room for fewer keys) (wgmma N of S; k-steps of P V)";
  } else if (stages < 2 || stages > 4) {
    t.error = "stages must be in [2, 4]";
  } else if (pingpong && t.consumers != 2) {
    t.error = "pingpong takes turns between exactly two consumer warpgroups (block_m 128, or 64 with value_split 2)";
  } else if (groups != 1 && groups != 2) {
    t.error = "groups must be 1 or 2 (groups of consumers walking tiles of their own)";
  } else if (groups * t.consumers > 4) {
    t.error = "groups * block_m / 64 must be at most 4 consumer warpgroups";
  } else if (groups > 1 && value_split > 1) {
    t.error = "groups 2 takes no value_split (the consumers of a group's rows meet at barriers of their own)";
  } else if (groups > 1 && (!persistent || cluster != 1)) {
    t.error = "groups 2 takes persistent blocks without clusters (each group walks the tile list)";
  } else if (tensor_sum && elem != ElemType::kFloat16) {
    t.error = "tensor_sum takes fp16: the sums of P rounded to bf16 (8 bits) would put the LSE off by up to 2e-3";
  } else if (cluster != 1 && cluster != 2) {
    t.error = "cluster must be 1 or 2 (blocks sharing each K and V tile)";
  } else if (cluster == 2 && mask != MaskKind::kNone) {
    t.error = "cluster 2 takes unmasked problems only: under a causal mask the two query blocks of a cluster "
              "would see different key ranges";
  } else if (fp8 && (head_dim > 256 || dim_v != head_dim)) {
    t.error = "FP8 takes head_dim up to 256, the values' the same";
  } else if (fp8 && block_n != kFp8BlockN) {
    t.error = "FP8 takes block_n 128 (Vᵀ's rows are whole 128-byte swizzle rows of keys)";
  } else if (fp8 && (p_smem || tensor_sum || value_split != 1)) {
    t.error = "FP8 takes P in registers, the rows' sums by adds and no value_split";
  } else if (t.accum_regs + (fp8 ? 24 : 32) > t.consumer_regs) {  // FP8 d256 paged without overlap: 232, no spill
    t.error = "accumulators need more registers than a consumer thread has: lower block_n or block_m";
  }
  return t;
}


}  // namespace flashgen
