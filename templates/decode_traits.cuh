// The one place that decides whether a KV-cache (decode) config is valid and derives its sizes. Plain
// constexpr C++ read by the host (generator, launcher) and by decode_sm80.cuh's static_asserts.
#pragma once

#include "fwd_traits.cuh"

namespace flashgen {

struct DecodeTraits {
  int threads;              // warps * 32
  int head_dim_pad;         // head_dim rounded up to the mma k-step (16)
  int smem_row_elems;       // shared-memory row pitch of Q, K and V: head_dim_pad + 8 (conflict-free ldmatrix)
  int m_tiles;              // 16-row mma tiles of the block's query rows: rows / 16
  int warp_keys;            // keys of each K/V tile one warp attends to: block_n / warps
  int smem_q_bytes;         // (rows, smem_row_elems) Q tile
  int smem_rows_bytes;      // paged caches: two tiles' K and V row offsets (int64 each), staged one tile ahead
  int kv_row_bytes;         // shared-memory row pitch of K and V in bytes: smem_row_elems' for a 16-bit cache; an FP8
                            // cache's head_dim + 16 (an odd count of 16-byte chunks: conflict-free ldmatrix)
  int smem_kv_stage_bytes;  // (block_n, kv_row_bytes) K tile + V tile
  int reduce_pitch;         // fp32 row pitch of the warps' partial outputs: head_dim_pad + 8 (conflict-free for a
                            // 16-bit cache's float2 stores; an FP8 cache's float4 ones meet 2-way, once per block)
  int smem_reduce_bytes;    // the warps' partial outputs, maxima and sums, over the K/V ring once it is idle
  int smem_bytes;           // whole dynamic shared memory of one block
  int accum_regs;           // registers per thread for O, S and P fragments
  int min_blocks;           // blocks per SM the registers are bounded for (__launch_bounds__): three over an FP8
                            // cache (half-size tiles double the work per byte read, and more warps hide its latency)
                            // where 168 registers a thread hold its accumulators (up to 96) and four warps; else one
  const char* error;        // nullptr when the shape is valid on some GPU
};

// rows: query rows of one block, the query heads of a kv head times the new tokens, packed (16, 32 or 64).
// block_n: keys per K/V tile, split evenly among the warps, each taking whole 16-key mma steps. paged: the cache
// is read through a block table. fp8_cache: it holds FP8 values, widened to the queries' type in registers.
constexpr DecodeTraits decode_traits(int head_dim, int rows, int block_n, int warps, int stages, bool paged,
                                     bool fp8_cache = false) {
  DecodeTraits t{};
  t.threads = warps * 32;
  t.head_dim_pad = (head_dim + 15) / 16 * 16;
  t.smem_row_elems = t.head_dim_pad + 8;
  t.m_tiles = rows / 16;
  t.warp_keys = warps > 0 ? block_n / warps : 0;
  t.smem_q_bytes = rows * t.smem_row_elems * 2;
  t.smem_rows_bytes = paged ? 2 * block_n * 2 * 8 : 0;
  t.kv_row_bytes = fp8_cache ? head_dim + 16 : t.smem_row_elems * 2;
  t.smem_kv_stage_bytes = 2 * block_n * t.kv_row_bytes;
  t.reduce_pitch = t.head_dim_pad + 8;
  t.smem_reduce_bytes = warps * rows * (t.reduce_pitch + 2) * 4;
  const int ring = stages * t.smem_kv_stage_bytes;
  t.smem_bytes = t.smem_q_bytes + t.smem_rows_bytes + (ring > t.smem_reduce_bytes ? ring : t.smem_reduce_bytes);
  t.accum_regs = t.m_tiles * (t.head_dim_pad / 8) * 4     // O, fp32
                 + t.m_tiles * (t.warp_keys / 8) * 4       // S, fp32
                 + t.m_tiles * (t.warp_keys / 16) * 4;     // P, packed 16-bit pairs
  t.min_blocks = fp8_cache && t.accum_regs <= 96 && warps <= 4 ? 3 : 1;
  t.error = nullptr;
  if (head_dim < 8 || head_dim > 256 || head_dim % 8 != 0) {
    t.error = "head_dim must be a multiple of 8 in [8, 256]";
  } else if (fp8_cache && head_dim % 32 != 0) {
    t.error = "an FP8 cache's head_dim must be a multiple of 32 (its fragments are read two 16-column steps at once)";
  } else if (rows != 16 && rows != 32 && rows != 64) {
    t.error = "rows must be 16, 32 or 64";
  } else if (warps < 1 || warps > 8) {
    t.error = "warps must be in [1, 8]";
  } else if (block_n % (16 * warps) != 0 || block_n > 256) {
    t.error = "block_n must be a multiple of 16 * warps up to 256 (each warp takes whole 16-key steps)";
  } else if (stages < 2 || stages > 8) {
    t.error = "stages must be in [2, 8]";
  } else if (t.accum_regs > kMaxAccumRegs) {
    t.error = "accumulators need more registers than a thread has: lower rows or block_n per warp";
  }
  return t;
}

// Cfg::kCacheElem where the generated config header names it (an FP8 cache), else Cfg::kElem.
template <class Cfg, class = void>
struct ConfigCacheElem {
  static constexpr ElemType value = Cfg::kElem;
};
template <class Cfg>
struct ConfigCacheElem<Cfg, decltype(void(Cfg::kCacheElem))> {
  static constexpr ElemType value = Cfg::kCacheElem;
};

// The Hopper latent decode (decode_sm90.cuh): keys of head_dim columns whose first head_dim_v columns are the values
// (MLA's latent cache, read once), 64 packed query rows and 64 keys per tile, in 64-column chunks swizzled as wgmma
// reads them. Three warpgroups: a producer and two consumers, each holding half of O's columns.
inline constexpr int kDecodeSm90Rows = 64;
inline constexpr int kDecodeSm90BlockN = 64;

struct DecodeSm90Traits {
  int threads;         // 3 warpgroups
  int chunks;          // 64-column chunks of a Q row or K row: head_dim / 64
  int chunks_v;        // the chunks holding values: head_dim_v / 64
  int q_bytes;         // (64, head_dim) Q rows, chunk after chunk
  int tile_bytes;      // (64, head_dim) one K tile; V is its first chunks_v chunks, P (64 x 64) the next chunk
  int k_offset;        // the K ring, stages tiles
  int stats_offset;    // per block parity: the rows' running max and correction; per consumer: its row sums
  int barrier_offset;  // each stage's empty mbarrier, a full mbarrier per chunk of each stage, two published ones
  int smem_bytes;      // dynamic shared memory, with 1 KB for aligning the base to a swizzle atom
  int producer_regs;   // setmaxnreg of the producer and of the consumers
  int consumer_regs;
  const char* error;   // nullptr when the shape is valid on some GPU
};

constexpr DecodeSm90Traits decode_sm90_traits(int head_dim, int head_dim_v, int stages) {
  DecodeSm90Traits t{};
  t.threads = 384;
  t.chunks = head_dim / 64;
  t.chunks_v = head_dim_v / 64;
  t.q_bytes = kDecodeSm90Rows * head_dim * 2;
  t.tile_bytes = kDecodeSm90BlockN * head_dim * 2;
  t.k_offset = t.q_bytes;
  t.stats_offset = t.k_offset + stages * t.tile_bytes;
  t.barrier_offset = t.stats_offset + 6 * kDecodeSm90Rows * 4;
  t.smem_bytes = t.barrier_offset + (stages * (1 + t.chunks) + 2) * 8 + 1024;
  t.producer_regs = 40;
  t.consumer_regs = 232;
  t.error = nullptr;
  if (head_dim % 64 != 0 || head_dim < 192 || head_dim > 576) {
    t.error = "head_dim must be a multiple of 64 in [192, 576] (keys in whole 64-column chunks)";
  } else if (head_dim_v % 128 != 0 || head_dim_v < 128 || head_dim_v > 512) {
    t.error = "head_dim_v must be a multiple of 128 up to 512 (each consumer holds half of O's columns in registers)";
  } else if (head_dim_v + 64 > head_dim) {
    t.error = "head_dim must exceed head_dim_v by 64 at least (P takes the place of the keys' first chunk past the "
              "values)";
  } else if (stages < 2 || stages > 8) {
    t.error = "stages must be in [2, 8]";
  }
  return t;
}

// Threads of the combine and append kernels (decode_sm80.cuh): four warps, one row each per step.
constexpr int kDecodeRowKernelThreads = 128;

}  // namespace flashgen
