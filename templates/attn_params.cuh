// Runtime arguments of the attention kernels: one plain struct shared by the host compiler and NVRTC,
// passed by value as a `const __grid_constant__` kernel parameter. Nothing here forces a recompile.
#pragma once

// Functions the host and the kernels both call (the workspace layout of packed batches, below).
#if defined(__CUDACC__)
#define FLASHGEN_HOST_DEVICE __host__ __device__
#else
#define FLASHGEN_HOST_DEVICE
#endif

namespace flashgen {

// The buffers and scalars a user-defined variant's functions may read (flashgen_variant_desc).
inline constexpr int kMaxUserBuffers = 8;
inline constexpr int kMaxUserScalars = 8;
// Threads of the kernels that classify a user mask's blocks (user_blocks.cuh): the tiles' (and the bands'), and the
// query blocks' walks (one warp, whose lane 0 walks).
inline constexpr int kUserBlockThreads = 128;
inline constexpr int kUserBlockRangesThreads = 32;

// A user mask's block classes (user_blocks.cuh writes them; block_range.cuh's KeyBlocks and QueryBlocks read them)
// for tiles of block_m query rows and block_n keys, in groups of one batch entry and `heads` class heads: class head
// h' serves the query heads [h' * head_group, (h' + 1) * head_group), and where the mask is the same for every head,
// head 0 stands for all of them (heads 1, head_group 1). Per group:
//   rows   four ints per query block: the key blocks [first, end) it visits (the backward's widened to a band:
//          UserBlockBands) and a run [full_first, full_end) of blocks every key of which every row sees;
//   cols   the backward's only (null in the forward): four ints per key block, the query blocks [first, end) that
//          visit it (exactly those whose rows' range holds it) and a run of full ones; heads is 1 or heads_kv;
//   tiles  a byte per (query block, key block) tile on the way (0 no visible key, 1 partial, 2 full).
// A packed batch has classes per sequence, over its longest one's blocks (row_blocks of max_seqlen_q rows). Calls
// over a paged cache, and calls whose grids would not fit, have none: rows is null.
struct UserBlockClasses {
  int* rows;
  int* cols;
  unsigned char* tiles;
  int block_m;
  int block_n;
  int row_blocks;
  int col_blocks;
  int heads;
  int head_group;
};

// A variant's run-time arguments: what variant.cuh's hooks read besides a sequence's lengths, for every params
// struct alike; the launchers fill it in one call (launch/tensor_checks.hpp's variant_args).
// causal_offset belongs here (every mask, window and ALiBi reads it); causal_bottom_right stays with the packing.
struct VariantArgs {
  // Causal configs: key j is visible to query i iff j <= i + causal_offset. Bottom-right alignment (every
  // mask but the top-left causal one, whose diagonal ALiBi's bias also follows) uses seqlen_k - seqlen_q,
  // top-left uses 0. The kernels of a packed batch or a KV cache set each sequence's from causal_bottom_right.
  int causal_offset;
  float scale;        // softmax scale applied to q·k
  float scale_log2;   // scale * log2(e): the kernels exponentiate in base 2
  // Soft-capped configs (variant.cuh's SoftCap): a score becomes cap · tanh(q·k · scale / cap); softcap_in is
  // scale / cap, softcap_out cap / scale (the score in q·k units, as the kernels scale it), softcap_grad
  // 1 / (cap · log2(e)) (the backward's tanh from a score in log2 units). 0 otherwise.
  float softcap_in;
  float softcap_out;
  float softcap_grad;
  // Windowed configs (variant.cuh's SlidingWindow): key j is visible to query i iff
  // i + causal_offset - window_left <= j <= i + causal_offset + window_right, causal_offset being
  // seqlen_k - seqlen_q (bottom-right, as FlashAttention's window_size). Both are >= 0: the launcher gives
  // an unbounded side (-1) the least bound that reaches every key from every row (seqlen_k on the left,
  // seqlen_q on the right), so no sum of a row, its offset and a side passes seqlen_q + seqlen_k plus a block.
  // attention_chunk > 0 (Llama 4's chunked attention) also hides every key outside the row's chunk of that many
  // positions: j / attention_chunk == (i + causal_offset) / attention_chunk, floor division; the launcher
  // bounds it by seqlen_k (one chunk then holds every key). 0 otherwise, and without a chunk.
  int window_left;
  int window_right;
  int attention_chunk;
  // ALiBi configs (variant.cuh's Alibi): the score of query i and key j gains -slope · |i + causal_offset - j|
  // (in the softmax's units, q·k · scale), slope = alibi_slopes[b * alibi_batch_stride + head] for sequence b
  // and query head head (fp32; stride 0: one slope per head for every sequence); inv_scale is 1 / scale, the
  // bias in q·k units as the hooks speak. Null and 0 otherwise.
  const float* alibi_slopes;
  long long alibi_batch_stride;
  float inv_scale;
  // Attention sinks (gpt-oss), any config: one fp32 logit per query head, in the softmax's units (compared with
  // q·k · scale), that joins each row's softmax denominator with no value; the LSE includes it. Null: none.
  const float* sinks;
  // User-defined variants (variant.cuh's UserVariant): the device buffers and the scalars' 32-bit patterns its
  // functions read, in the order the variant declares them (the generated flashgen_user::Functions::of reads
  // them); inv_scale is set with them. Null and 0 otherwise.
  const void* user_buffers[kMaxUserBuffers];
  unsigned user_scalars[kMaxUserScalars];
};

// All strides are in elements; head_dim has unit stride. A row is one (batch, seq, head) vector.
struct AttnFwdParams {
  const void* q;   // (batch, seqlen_q, heads_q, head_dim)
  const void* k;   // (batch, seqlen_k, heads_kv, head_dim)
  const void* v;   // (batch, seqlen_k, heads_kv, head_dim)
  void* o;         // (batch, seqlen_q, heads_q, head_dim)
  float* lse;      // (batch, heads_q, seqlen_q) contiguous, natural log; may be null

  long long q_batch_stride, q_row_stride, q_head_stride;
  long long k_batch_stride, k_row_stride, k_head_stride;
  long long v_batch_stride, v_row_stride, v_head_stride;
  long long o_batch_stride, o_row_stride, o_head_stride;

  int batch;
  int heads_q;
  int heads_kv;
  int group_size;     // heads_q / heads_kv: query heads sharing one key/value head
  int seqlen_q;
  int seqlen_k;

  VariantArgs variant;
  // A user mask's block classes at the config's tiles (rows null without them).
  UserBlockClasses user_classes;

  // Packed variable-length batches (configs with kVarlen; null and 0 otherwise). q, k, v and o hold one
  // batch entry of total_q (q, o) and total_k (k, v) rows; sequence b of the batch owns query rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]), or the first
  // seqused_k[b] of those key rows when seqused_k is not null. batch counts sequences, seqlen_q and
  // seqlen_k are the longest ones' (max_seqlen_q, max_seqlen_k: the grid's reach), lse is (heads_q,
  // total_q). The kernels clamp every offset into [0, total_q] and [0, total_k]: garbage offsets give
  // garbage rows, never an access outside the tensors.
  const int* cu_seqlens_q;  // (batch + 1)
  const int* cu_seqlens_k;  // (batch + 1)
  const int* seqused_k;     // (batch) or null
  int total_q;
  int total_k;
  int causal_bottom_right;  // per sequence, causal_offset = seqlen_k - seqlen_q (1) or 0 (0: top-left causal)

  // A packed batch whose keys and values live in a paged cache (configs with kPaged; null otherwise): k and v
  // are (num_pages, page_size, heads_kv, head_dim) with pages k_page_stride and v_page_stride elements apart;
  // sequence b's key j lies in row j % page_size of page block_table[b * block_table_stride + j / page_size]
  // (clamped into [0, num_pages)). Its key count is seqused_k[b], or cu_seqlens_k[b + 1] - cu_seqlens_k[b],
  // clamped into [0, total_k], total_k being a sequence's capacity (block_table_stride * page_size).
  const int* block_table;
  long long block_table_stride;
  long long k_page_stride, v_page_stride;
  int page_size;
  int num_pages;

  // An FP8 call's descales (fp32; FP8 configs only): q, k and v of batch entry b and kv head h stand for their
  // values times descale[b * strides[0] + h * strides[1]] (strides 0 share one). Null: 1.
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  long long q_descale_strides[2], k_descale_strides[2], v_descale_strides[2];
  // An FP8 call's Vᵀ (batch, heads_kv, head_dim, v_t_keys), keys in the order P's fragments hold them
  // (fwd_sm90_values.cuh), written by the module's first kernel into a buffer of the launch's; null otherwise.
  // A packed batch's is one entry whose sequences start at multiples of kFp8BlockN (fp8_values_t_origin).
  void* v_t;
  long long v_t_keys;  // seqlen_k rounded up to whole 32-key steps; packed or paged, past every sequence's origin
};

// The rows of each TMA copy of a paged cache's K or V tile (the Hopper forward): the largest count dividing both
// page_size and the tile's block_n (multiples of 16), so that each copy lies in one page.
FLASHGEN_HOST_DEVICE constexpr int paged_box_rows(int page_size, int block_n) {
  while (block_n != 0) {
    const int rest = page_size % block_n;
    page_size = block_n;
    block_n = rest;
  }
  return page_size;
}

// Attention against a KV cache (decode_sm80.cuh): a few new query tokens per sequence over the keys of its
// cache, contiguous or paged, optionally after appending the new tokens' keys and values to it. Sequence b
// holds n_keys = cache_seqlens[b] + seqlen_new keys (cache_seqlens clamped into [0, capacity - seqlen_new]);
// key j lives in row j of its cache, or with a block table in row j % page_size of page block_table[b, j /
// page_size] (clamped into [0, num_pages)). Blocks split each sequence's keys evenly into `splits` ranges;
// with more than one, each writes its range's normalised output and LSE to the fp32 workspace, and the
// combine kernel merges them by LSE.
struct AttnDecodeParams {
  const void* q;        // (batch, seqlen_q, heads_q, head_dim)
  const void* k_cache;  // (batch, capacity, heads_kv, head_dim), or paged (num_pages, page_size, heads_kv, head_dim)
  const void* v_cache;  // like k_cache
  const void* k_new;    // (batch, seqlen_new, heads_kv, head_dim), appended before attention; null with seqlen_new 0
  const void* v_new;
  void* o;              // (batch, seqlen_q, heads_q, head_dim)
  float* lse;           // (batch, heads_q, seqlen_q) contiguous, natural log; may be null
  const int* cache_seqlens;  // (batch): keys in the cache before this call's new ones; null: every row, capacity
  const int* block_table;    // (batch, block_table_stride) page indices, or null for a contiguous cache
  float* o_partial;     // workspace (splits, batch, heads_q, seqlen_q, head_dim) when splits > 1
  float* lse_partial;   // workspace (splits, batch, heads_q, seqlen_q) when splits > 1
  // An FP8 cache's scales (fp32): a cached key stands for its value times k_scale[b * k_scale_batch_stride +
  // h * k_scale_head_stride] for sequence b and kv head h (strides 0 share one), and an appended key is stored as
  // k / that scale; v_scale likewise. Null: 1.
  const float* k_scale;
  const float* v_scale;

  long long q_batch_stride, q_row_stride, q_head_stride;
  long long k_batch_stride, k_row_stride, k_head_stride;  // batch stride: one page's when paged
  long long v_batch_stride, v_row_stride, v_head_stride;
  long long kn_batch_stride, kn_row_stride, kn_head_stride;
  long long vn_batch_stride, vn_row_stride, vn_head_stride;
  long long o_batch_stride, o_row_stride, o_head_stride;
  long long block_table_stride;
  long long k_scale_batch_stride, k_scale_head_stride;
  long long v_scale_batch_stride, v_scale_head_stride;

  int batch;
  int heads_q;
  int heads_kv;
  int group_size;     // heads_q / heads_kv: the query heads a block packs with each new token
  int seqlen_q;       // new query tokens per sequence
  int seqlen_new;     // appended tokens per sequence (0: none)
  int capacity;       // key rows a sequence's cache can hold: its rows, or pages per sequence * page_size
  int page_size;      // rows per page (paged only)
  int num_pages;      // pages in the cache (paged only)
  int row_blocks;     // blocks over one kv head's packed rows (group_size * seqlen_q)
  int splits;         // key ranges per sequence (gridDim.x of the attention kernel)
  int causal_bottom_right;  // causal configs: 1 aligns the queries with the last keys, 0 with the first
  // As in AttnFwdParams, about each sequence's own diagonal (the kernels set its causal_offset from
  // causal_bottom_right): a window's unbounded side bounded by capacity on the left and seqlen_q on the right, the
  // chunk by capacity; the sinks
  // applied where a row's ranges meet (the combine kernel with splits); softcap_grad unread (no backward). A user
  // variant's functions see the new tokens as query rows 0 .. seqlen_q - 1 and the cache's keys by their position,
  // as a dense call with fewer queries than keys.
  VariantArgs variant;
};

// A CUtensorMap (cuda.h) by another name, so NVRTC needs no toolkit header: 128 opaque bytes that the
// driver's cuTensorMapEncodeTiled fills and TMA instructions read from kernel parameter space.
struct alignas(64) TmaDescriptor {
  unsigned long long opaque[16];
};

// The Hopper forward family (fwd_sm90.cuh) takes TMA descriptors of q, k, v and o besides the plain
// parameters. Each describes its tensor as 4-D (head_dim, seqlen, heads, batch) with byte strides.
struct AttnFwdSm90Params {
  AttnFwdParams base;
  // The maps' boxes span 128 bytes of a row: 64 columns of 16 bits, or 128 of 8 (FP8 configs' q, k and v).
  TmaDescriptor q_map;  // box (64, block_m, 1, 1): the whole Q tile, one 64-column chunk per copy
  TmaDescriptor k_map;  // box (64, block_n, 1, 1); over a paged cache see v_fine_map
  TmaDescriptor v_map;  // box (64, block_n, 1, 1); FP8: base.v_t, box (128 keys, the values' tile rows, 1, 1)
  TmaDescriptor o_map;  // box (64, 64, 1, 1): one consumer warpgroup's rows
  // Persistent kernels under a causal mask: the tiles claimed so far past the first gridDim.x; 0 when
  // the kernel starts, and set back to 0 by its last claim. Null otherwise.
  int* tile_counter;
  // Persistent kernels under a causal mask: (batch, head) pairs per section of the tile list, so many
  // that one section's K and V fit in about half the L2 cache.
  int l2_section;
  // Packed batches over a paged cache (kPaged): k_map and v_map see the cache as (64, page_size, heads_kv,
  // num_pages) in boxes of paged_box_rows(page_size, block_n) rows; v_fine_map the same in boxes of 16 rows. FP8
  // reads V as Vᵀ (v_map above) and has no v_fine_map.
  TmaDescriptor v_fine_map;
};

// Query rows per semaphore of the Hopper family's dQ adds (one per 64-row tile of the accumulator; a
// block_m of 128 uses the first of its two). A semaphore is two counters: the adds begun (the
// deterministic strategy's turns, each done before the next begins; under a mask the atomic strategy's
// tickets, with kBwdSm90DqStored added once the first add, a store, is done) and the atomic strategy's adds
// done.
inline constexpr int kBwdSm90SemaphoreRows = 64;
inline constexpr int kBwdSm90SemaphoreInts = 2;
inline constexpr int kBwdSm90DqStored = 1 << 30;

// The deterministic strategy's turn at a query block's semaphore (the Hopper family, without a mask), where the
// key blocks of a launch group rotate their walks (bwd_sm90.cuh's dq_turn): the block at place `index` of the
// group's launch order, `size` blocks, starts its walk at query block size - 1 - index; `first` is the turn of the
// group's first add, `m` the query block. The group's blocks that reach m without wrapping add first, in launch
// order (they arrive so, one step apart); then those that reach it after wrapping, at the ends of their walks.
FLASHGEN_HOST_DEVICE constexpr int rotated_dq_turn(int first, int index, int size, int m) {
  const int arriving = m + 1 < size ? m + 1 : size;  // the group's blocks that reach m without wrapping
  const int first_arriving = size - arriving;        // the place of the first of them
  return index >= first_arriving ? first + index - first_arriving : first + arriving + index;
}

// The backward's per-row workspace arrays (D, the base-2 LSE, the dQ accumulator, the semaphores) of a packed
// batch hold rows_per_head = packed_workspace_rows(total_q, batch, pad) rows per head (and the FP8 forward's Vᵀ
// of a packed batch as many keys, of total_k with pad kFp8BlockN). Unpadded (pad 1, the sm80
// family) sequence i's rows start at its first query row. With pad rows (the Hopper family, 128) they start at
// floor((q_begin + pad·i) / pad) · pad, a multiple of pad, with room to pad the sequence's rows to one: the
// next sequence's start is at least pad · (floor(L / pad) + 1) ≥ round_up(L, pad) rows further (L its
// length), and the last one's padded rows end by total_q + pad · batch.
FLASHGEN_HOST_DEVICE constexpr long long packed_workspace_rows(long long total_q, int batch, int pad) {
  return pad == 1 ? total_q : (total_q + static_cast<long long>(pad) * batch + pad - 1) / pad * pad;
}
FLASHGEN_HOST_DEVICE constexpr long long packed_workspace_first_row(int q_begin, int sequence, int pad) {
  return pad == 1 ? q_begin : (q_begin + static_cast<long long>(pad) * sequence) / pad * pad;
}

// Where packed sequence `sequence` of an FP8 forward starts in Vᵀ's keys (fwd_sm90_values.cuh), each at a multiple
// of the FP8 key block (pad, 128): from its first key row k_begin by the padded-row rule above, or over a paged cache
// (every sequence's keys from 0) at sequence · round_up(max_keys, pad), max_keys the call's max_seqlen_k.
FLASHGEN_HOST_DEVICE constexpr long long fp8_values_t_origin(bool paged, int k_begin, int sequence, int max_keys,
                                                             int pad) {
  return paged ? static_cast<long long>(sequence) * ((max_keys + pad - 1) / pad * pad)
               : packed_workspace_first_row(k_begin, sequence, pad);
}

// Rows of the backward's per-row workspace arrays (D; the Hopper family's base-2 LSE) over every (batch, head):
// heads_q · packed_workspace_rows for a packed batch, else batch · heads_q · seqlen_q rounded up to pad.
FLASHGEN_HOST_DEVICE constexpr long long bwd_workspace_rows(bool packed, long long total_q, int batch, int heads_q,
                                                            int seqlen_q, int pad) {
  return packed ? heads_q * packed_workspace_rows(total_q, batch, pad)
                : static_cast<long long>(batch) * heads_q * ((seqlen_q + pad - 1) / pad * pad);
}

// The sinks' gradient's partials (configs with kSinkGrad, bwd_rows.cuh) follow D in the workspace at D's 256-byte
// aligned end, so the kernels find them at dsum + this offset without a params field of their own: (heads_q, batch,
// key blocks, warps) fp32, one per warp of each dkdv block and query head, each block's written once.
FLASHGEN_HOST_DEVICE constexpr long long bwd_sink_partials_offset(long long workspace_rows) {
  return (workspace_rows + 63) / 64 * 64;
}
FLASHGEN_HOST_DEVICE constexpr long long bwd_sink_partials_count(int heads_q, int batch, int key_blocks, int warps) {
  return static_cast<long long>(heads_q) * batch * key_blocks * warps;
}

// Backward pass: the forward's params (o its output, read here; lse as it wrote it; the paged cache's fields unused,
// zero), dO and the gradients, plus fp32 workspace. Packed batches as in AttnFwdParams (seqused_k unused: null); lse,
// the workspace's D and the dQ accumulator are then (heads_q, total_q[, head_dim]) rows. user_classes holds classes
// per kv head (head_group = group_size) with cols.
struct AttnBwdParams : AttnFwdParams {
  const void* dout;  // (batch, seqlen_q, heads_q, head_dim)
  void* dq;          // like q
  void* dk;          // like k
  void* dv;          // like v
  // Workspace rows per (batch, head) are seqlen_q rounded up to the config's kPadRows (bwd_rows.cuh).
  float* dsum;       // workspace (batch, heads_q, rows): D = rowsum(dO ∘ O)
  float* dq_accum;   // workspace (batch, heads_q, rows, head_dim) fp32 in DqAccum's layout (null without one)
  float* lse_log2;   // workspace (batch, heads_q, rows): LSE in base 2, Hopper family only (else null)
  int* dq_semaphore; // workspace (batch, heads_q, rows / 64, 2), the Hopper family only (else null): the adds
                     // a query block's dQ has begun and (atomic strategy) done

  long long do_batch_stride, do_row_stride, do_head_stride;
  long long dq_batch_stride, dq_row_stride, dq_head_stride;
  long long dk_batch_stride, dk_row_stride, dk_head_stride;
  long long dv_batch_stride, dv_row_stride, dv_head_stride;

  // The gradient of the forward's sinks (variant.sinks, which its LSE already includes): dsinks (heads_q, fp32)
  // receives it from BwdSinkGrad (bwd_rows.cuh). Null without sinks, and may be null with them (none wanted).
  float* dsinks;

  // An FP8 call's q, k and v (fp8_format 1: e4m3, 2: e5m2; 0: a 16-bit call, the rest unused): BwdWiden
  // (bwd_rows.cuh) writes each times its descale (q_descale, k_descale, v_descale) as the config's 16-bit type into
  // the workspace, BSHD contiguous, where q, k and v then point. Strides in elements: batch, row, head.
  int fp8_format;
  const void* fp8_sources[3];
  long long fp8_strides[3][3];
};

// The Hopper backward family (bwd_sm90.cuh) takes TMA descriptors besides the plain parameters, each
// describing its tensor as 4-D (head_dim, seqlen, heads, batch) like AttnFwdSm90Params's.
struct AttnBwdSm90Params {
  AttnBwdParams base;
  TmaDescriptor q_map;   // box (64, block_m, 1, 1)
  TmaDescriptor do_map;  // box (64, block_m, 1, 1)
  TmaDescriptor k_map;   // box (64, block_n, 1, 1)
  TmaDescriptor v_map;   // box (64, block_n, 1, 1)
  TmaDescriptor dk_map;  // box (64, 64, 1, 1): one consumer warpgroup's keys
  TmaDescriptor dv_map;  // box (64, 64, 1, 1)
};

}  // namespace flashgen
