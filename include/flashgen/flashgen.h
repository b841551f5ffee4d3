/* flashgen C ABI: attention kernels generated and compiled at run time for the GPU in hand.
 * Stable names and semantics for outside programs and harnesses (ctypes, other languages). */
#ifndef FLASHGEN_FLASHGEN_H
#define FLASHGEN_FLASHGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FLASHGEN_FLOAT16 = 0,
  FLASHGEN_BFLOAT16 = 1,
  FLASHGEN_FLOAT8_E4M3 = 2, /* e4m3fn (torch.float8_e4m3fn): the forward's q, k and v, dense or packed (with a
                               16-bit out, on sm_90), and a KV cache's k_cache and v_cache; nowhere else */
  FLASHGEN_FLOAT8_E5M2 = 3  /* e5m2 (torch.float8_e5m2): likewise */
} flashgen_dtype;

typedef enum {
  FLASHGEN_MASK_NONE = 0,
  FLASHGEN_MASK_CAUSAL = 1,          /* aligned bottom-right: key j visible to query i iff j <= i + seqlen_k - seqlen_q */
  FLASHGEN_MASK_CAUSAL_TOP_LEFT = 2, /* aligned top-left: key j visible to query i iff j <= i */
  FLASHGEN_MASK_SLIDING_WINDOW = 3   /* a window about the bottom-right diagonal: query i sees keys j in
                                        [i + seqlen_k - seqlen_q - window_left, i + seqlen_k - seqlen_q + window_right]
                                        (options.window_left / window_right; FlashAttention's window_size), a side
                                        of -1 unbounded. A causal window has window_right = 0; (-1, 0) is
                                        FLASHGEN_MASK_CAUSAL and (-1, -1) FLASHGEN_MASK_NONE, and run as them */
} flashgen_mask;

typedef struct {
  void* data;             /* device pointer, 16-byte aligned */
  flashgen_dtype dtype;
  int64_t shape[4];       /* [batch, seqlen, heads, head_dim] */
  int64_t stride[4];      /* elements; stride[3] must be 1, the others non-negative multiples of 16 bytes (8
                             16-bit elements, 16 FP8 ones) */
} flashgen_tensor;

/* A user-defined variant (flashgen_variant_create): the caller's own mask and score functions in C++ device code,
 * compiled into the kernels by NVRTC. Opaque; one handle serves any number of calls, on any thread and device. */
typedef struct flashgen_variant flashgen_variant;

/* A user mask's block classes kept by the caller across calls, as FlexAttention's block mask is (see
 * flashgen_block_mask_create). Opaque. */
typedef struct flashgen_block_mask flashgen_block_mask;

/* Options of every attention call. size is sizeof(flashgen_attention_options) as the caller compiled it, so that a
 * library can tell a caller built against another flashgen.h and refuse it rather than misread its options. In C,
 * start from FLASHGEN_ATTENTION_OPTIONS_INIT (size set, everything else 0: no mask, no variant); in C++ size
 * defaults to it, so `flashgen_attention_options opts{};` is ready to fill in. */
typedef struct flashgen_attention_options {
#ifdef __cplusplus
  size_t size = sizeof(flashgen_attention_options);
#else
  size_t size;
#endif
  float softmax_scale;    /* finite, scale * log2(e) too; <= 0: 1/sqrt(head_dim) */
  flashgen_mask mask;
  int deterministic;      /* backward: nonzero gives bitwise-identical gradients on repeated runs */
  float softcap;          /* > 0: each score s = q·k · scale becomes softcap · tanh(s / softcap) before the
                             softmax (Gemma 2's logit soft cap; its derivative in the backward); 0: none.
                             Dense, packed and KV-cache calls (forward only there) */
  int32_t window_left;    /* FLASHGEN_MASK_SLIDING_WINDOW only (ignored under the other masks): the keys before */
  int32_t window_right;   /* and after the diagonal a query sees, each >= 0, or -1 for no bound on that side.
                             Dense, packed and KV-cache calls (a KV-cache call's diagonal is each sequence's own:
                             its last new query's is its last key). */
  const float* alibi_slopes;  /* NULL: none. Else ALiBi (BLOOM, MPT; FlashAttention's alibi_slopes): an fp32 device
                                 array of one slope per query head ([heads_q]) or per sequence and query head
                                 ([batch, heads_q], alibi_batch_stride apart), and the score of query i and key j
                                 (scaled, after the soft cap) gains -slope · |i + seqlen_k - seqlen_q - j| (about
                                 the top-left diagonal, -slope · |i - j|, under FLASHGEN_MASK_CAUSAL_TOP_LEFT).
                                 Dense, packed and KV-cache calls (each sequence about its own diagonal, a KV-cache
                                 call's ending at its last key). With slopes, a given softmax_scale must be at least
                                 1e-30 (the kernels divide by it) */
  int64_t alibi_batch_stride; /* elements between sequences' slopes, heads_q to 2^40; 0: every sequence shares one
                                 [heads_q] array */
  const float* sinks;     /* NULL: none. Else attention sinks (gpt-oss): an fp32 device array of one logit per query
                             head ([heads_q]), in the units of the scaled scores, that joins each row's softmax
                             denominator with no value: out_i = sum_j e^(s_ij) v_j / (e^sink + sum_j e^(s_ij)), and
                             lse includes it, log(e^sink + sum_j e^(s_ij)) (a row that sees no key gets out 0 and
                             lse = sink). -inf for a head: no sink there. Any mask and variant; dense, packed and
                             KV-cache calls */
  float* dsinks;          /* backward calls with sinks: an fp32 device array [heads_q] that receives the sinks'
                             gradient (written, not accumulated: the sum over every sequence and row, the same bits
                             on every run), or NULL when none is wanted. Must be NULL without sinks; forward calls
                             ignore it */
  int32_t attention_chunk; /* > 0: chunked attention (Llama 4's attention_chunk): query i sees only keys j of its own
                              chunk of that many positions, floor(j / C) == floor((i + seqlen_k - seqlen_q) / C),
                              on top of the mask: FLASHGEN_MASK_CAUSAL (chunked causal), FLASHGEN_MASK_NONE
                              (bidirectional within chunks) or a window; not FLASHGEN_MASK_CAUSAL_TOP_LEFT. Kernels
                              of its own (_chunk). 0: none. Dense, packed and KV-cache calls */
  const flashgen_variant* variant; /* NULL: none. Else a user-defined variant (flashgen_variant_create): its mask hides
                                      keys on top of the mask above (and any window or chunk), its score function
                                      or bias applies to the scaled scores (not with softcap or alibi_slopes).
                                      Dense, packed and KV-cache calls (there the new tokens are queries 0 ..
                                      seqlen_q - 1, each key at its position), forward and backward (a score
                                      function needs its score_grad there) */
  const void* const* variant_buffers; /* with a variant declaring buffers: host array of its num_buffers device
                                         pointers, in its order (each read-only, as long as its functions index it) */
  const void* variant_scalars;   /* with a variant declaring scalars: host array of its num_scalars 4-byte values
                                    (float or int32, as declared), in its order */
  flashgen_block_mask* block_mask; /* NULL: a call with a variant's mask_mod classifies its blocks itself. Else the
                                      classes kept across calls (flashgen_block_mask_create): computed by the first
                                      call of a config, shapes and variant arguments, reused by the later ones */
  const float* q_descale; /* FP8 forward (q, k and v FLOAT8_E4M3 or FLOAT8_E5M2, one format; sm_90): fp32 device
                             arrays of descales, q, k and v of batch entry b and kv head h standing for their values
                             times descale[b * stride[0] + h * stride[1]] (FlashAttention-3's q_descale, k_descale,
                             v_descale of shape [batch, heads_kv]; strides {0, 0}: one value for all). NULL: 1. Must
                             be NULL for 16-bit tensors. Their values are not read on the host: zero, negative or
                             non-finite descales are not refused */
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_stride[2]; /* elements, each in [0, 2^40] */
  int64_t k_descale_stride[2];
  int64_t v_descale_stride[2];
  /* The window fields grew the struct from 16 to 24 bytes, the ALiBi fields to 40, the sinks and the chunk to 64,
     the variant to 88, the block mask to 96 and size to 104, the descales to 176. Every call refuses options whose
     size is not this library's, naming the argument: callers compiled against an older flashgen.h, whose options
     began with softmax_scale and mask, are refused too (those eight bytes read as 176 only for a denormal scale). */
} flashgen_attention_options;

/* Options with size set and every other field 0 (designated in C, so that -Wextra sees no missing field). */
#ifdef __cplusplus
#define FLASHGEN_ATTENTION_OPTIONS_INIT flashgen_attention_options{}
#else
#define FLASHGEN_ATTENTION_OPTIONS_INIT {.size = sizeof(flashgen_attention_options)}
#endif

/* Status codes. 0 is success; every failure also sets flashgen_last_error(). */
enum {
  FLASHGEN_SUCCESS = 0,
  FLASHGEN_ERROR_INVALID_ARGUMENT = 1, /* bad shape, dtype, stride, alignment, null pointer */
  FLASHGEN_ERROR_UNSUPPORTED = 2,      /* a valid request this build cannot serve (e.g. head_dim) */
  FLASHGEN_ERROR_NO_DEVICE = 3,        /* no CUDA driver or GPU */
  FLASHGEN_ERROR_COMPILE = 4,          /* NVRTC failed; the message carries the log */
  FLASHGEN_ERROR_CUDA = 5,             /* a CUDA driver call failed */
  FLASHGEN_ERROR_INTERNAL = 6
};

/* out = softmax(q kᵀ · scale [masked]) v, and lse = log-sum-exp of each row (natural log, fp32,
 * [batch, heads_q, seqlen_q] contiguous) when lse is not NULL. head_dim is a multiple of 8 up to 256, or up to 512
 * on the Hopper family (the backward then runs the sm80 family's column slices). heads_q must be a multiple of heads_kv
 * (query head h reads key/value head h / (heads_q / heads_kv)). v and out may have a head dim of their own
 * (v.shape[3] == out.shape[3], a multiple of 8 up to 512; MLA's prefill: q and k of 192, v and out of 128),
 * as far as a kernel family takes it (FLASHGEN_ERROR_UNSUPPORTED otherwise). A row that sees no key (bottom-right
 * causal with seqlen_q > seqlen_k, a window that holds no key) gets output 0 and lse -inf, never NaN.
 * FP8: q, k and v all FLOAT8_E4M3 or all FLOAT8_E5M2 with out BFLOAT16 or FLOAT16 and opts' descales, head_dim a
 * multiple of 16 up to 256, on sm_90; V is transposed first into memory taken from flashgen's pool for the call
 * (batch * heads_kv * head_dim * seqlen_k bytes, seqlen_k rounded up to 32), given back in stream order (a graph
 * memory node while the stream captures).
 * Runs on cuda_stream (a CUstream / cudaStream_t; NULL is the legacy default stream) in the stream's
 * context, else the caller's current CUDA context, else the primary context of the device q is on.
 * Asynchronous: the call returns once the kernel is queued (the first call for a problem class may first
 * compile or load its kernel). Nothing is allocated per call, except an FP8 call's Vᵀ (above) and a 4-byte tile
 * counter taken from flashgen's memory pool (see flashgen_attention_backward) and given back, stream-ordered, by the
 * persistent causal and windowed sm90 kernels on the per-thread default stream, on a stream that is capturing a
 * graph (there a graph memory node), or past 1024 streams in a context. */
int flashgen_attention_forward(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                               const flashgen_tensor* out, float* lse /* may be NULL */,
                               const flashgen_attention_options* opts, void* cuda_stream);

/* Gradients of flashgen_attention_forward: given dout = dL/d(out), writes dq, dk, dv (shaped and typed
 * like q, k, v, each with its own strides; dout like out, of v's head dim where v has one of its own). out and
 * lse are exactly what the forward wrote for the same q, k, v and opts. With grouped heads (heads_q a multiple of heads_kv), dk and dv sum over each kv
 * head's group of query heads. Rows that saw no key get zero gradients, never NaN.
 * FP8: q, k and v of the FP8 forward (all FLOAT8_E4M3 or all FLOAT8_E5M2, opts' descales, head_dim a multiple of 16
 * up to 256, v's the same) with out, dout, dq, dk and dv of the forward's 16-bit output type: the gradients are those
 * of the dequantized q, k and v (each value times its descale). q, k and v are widened to the output type in the
 * workspace (2 bytes an element more each, first) and the 16-bit backward runs over them. Dense batches only; sm_89
 * or newer.
 * opts->deterministic != 0 computes dq in a separate pass that owns each element, so repeated runs give
 * identical bits; otherwise dq is accumulated with fp32 atomics (faster, last-bit nondeterministic).
 * Workspace: fp32 row values (4 * batch * heads_q * rows bytes, twice for the sm90 kernels) plus, when
 * not deterministic, the fp32 dq accumulator (4 * batch * heads_q * rows * head_dim bytes), rows being
 * seqlen_q (rounded up to 128 for the sm90 kernels; see flashgen_attention_backward_workspace_size),
 * taken in cuda_stream's order from flashgen's own memory pool of the device and given back after the
 * kernels (cuMemAllocFromPoolAsync / cuMemFreeAsync: no synchronization). The pool keeps that memory
 * between calls, so a call of a size seen before maps none; flashgen_release_cached_memory() gives it back
 * to the driver. While cuda_stream captures a graph, the workspace is a graph memory node instead.
 * flashgen_attention_backward_with_workspace takes a caller-provided workspace.
 * Stream, context and error semantics as for the forward. */
int flashgen_attention_backward(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                                const flashgen_tensor* out, const flashgen_tensor* dout, const float* lse,
                                const flashgen_tensor* dq, const flashgen_tensor* dk, const flashgen_tensor* dv,
                                const flashgen_attention_options* opts, void* cuda_stream);

/* Device workspace flashgen_attention_backward_with_workspace needs for exactly these arguments, in bytes
 * (the same checks as the backward; it picks the config for the stream's device, compiling or loading its
 * kernels if this process has not yet, and launches none of them; with tune-on-first-use on, an untuned
 * problem is swept first, as the call would, which takes seconds once per bucket). At most
 * 4 * batch * heads_q * rows * (head_dim + 2.2) bytes plus alignment, rows = seqlen_q rounded up to 128; with a
 * user variant's mask_mod, plus its block classes: per batch entry and kv head (once per batch entry with
 * mask_same_for_heads), 16 bytes per query block and per key block and a byte per (query, key) block pair. */
int flashgen_attention_backward_workspace_size(const flashgen_tensor* q, const flashgen_tensor* k,
                                               const flashgen_tensor* v, const flashgen_tensor* out,
                                               const flashgen_tensor* dout, const float* lse,
                                               const flashgen_tensor* dq, const flashgen_tensor* dk,
                                               const flashgen_tensor* dv, const flashgen_attention_options* opts,
                                               void* cuda_stream, size_t* workspace_bytes);

/* flashgen_attention_backward with a caller-provided workspace instead of flashgen's pool: device
 * memory of the launch's device, 256-byte aligned, at least flashgen_attention_backward_workspace_size()
 * bytes, not touched by anything else until the kernels queued on cuda_stream have run (no need to clear
 * it). Allocates nothing and never synchronizes, so it can be captured into a CUDA graph once its kernels
 * are loaded (after one call, or one workspace-size query, on the same device). */
int flashgen_attention_backward_with_workspace(const flashgen_tensor* q, const flashgen_tensor* k,
                                               const flashgen_tensor* v, const flashgen_tensor* out,
                                               const flashgen_tensor* dout, const float* lse,
                                               const flashgen_tensor* dq, const flashgen_tensor* dk,
                                               const flashgen_tensor* dv, const flashgen_attention_options* opts,
                                               void* workspace, size_t workspace_bytes, void* cuda_stream);

/* What flashgen_attention_forward would run for exactly these arguments, as one JSON object written to
 * json (json_capacity bytes, NUL-terminated):
 *   {"pass": "forward", "config": "fwd_sm80_...", "arch": 90,
 *    "source": "tuning database" | "tuned on first use" | "shipped defaults" | "heuristic" | "requested",
 *    "reason": "<the chooser's full explanation>", "source_path": "<kernel cache>/sources/<config>.cu",
 *    "grid": [x, y, z], "threads": N, "smem_bytes": N,
 *    "kernels": [{"symbol": ..., "registers": N, "spill_store_bytes": N, "spill_load_bytes": N}]}
 * source_path is the generated translation unit (as `flashgen emit` prints it), written there on every
 * call; it is null, with "source_path_error" saying why, when it cannot be written. Compiles or loads the
 * kernel like a first call and launches nothing; with tune-on-first-use on, an untuned problem is tuned
 * first, as the call would. *json_length (when not NULL) receives the length of the text without its NUL,
 * also when json_capacity is too small; then nothing is written and the status is
 * FLASHGEN_ERROR_INVALID_ARGUMENT. */
int flashgen_explain_forward(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                             const flashgen_tensor* out, float* lse, const flashgen_attention_options* opts,
                             void* cuda_stream, char* json, size_t json_capacity, size_t* json_length);

/* The same for flashgen_attention_backward: "pass": "backward", a bwd_... config chosen as the backward
 * chooses it (tuning database, shipped defaults or heuristic; tuned first with tune-on-first-use on), one
 * entry of "kernels" per kernel of the module in launch order (with its "grid", "threads" and
 * "smem_bytes"), and "workspace_bytes". */
int flashgen_explain_backward(const flashgen_tensor* q, const flashgen_tensor* k, const flashgen_tensor* v,
                              const flashgen_tensor* out, const flashgen_tensor* dout, const float* lse,
                              const flashgen_tensor* dq, const flashgen_tensor* dk, const flashgen_tensor* dv,
                              const flashgen_attention_options* opts, void* cuda_stream, char* json,
                              size_t json_capacity, size_t* json_length);

/* Arguments of flashgen_attention_varlen_forward: a packed batch of `batch` sequences of different lengths.
 * size is sizeof(flashgen_varlen_forward_args) as the caller compiled it, so that a library can tell a caller
 * built against another flashgen.h and refuse it rather than misread its arguments. */
typedef struct {
  size_t size;
  flashgen_tensor q, k, v, out;  /* q, out: [1, total_q, heads_q, head_dim]; k, v: [1, total_k, heads_kv, head_dim];
                                    strides as for the dense call */
  float* lse;                    /* fp32 [heads_q, total_q] contiguous (natural log), or NULL */
  const int32_t* cu_seqlens_q;   /* device, batch + 1: sequence b's queries are rows [cu_seqlens_q[b],
                                    cu_seqlens_q[b + 1]) of q and out; 0 first, non-decreasing, total_q last */
  const int32_t* cu_seqlens_k;   /* device, batch + 1: its keys are rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) */
  const int32_t* seqused_k;      /* device, batch: sequence b uses the first seqused_k[b] keys from
                                    cu_seqlens_k[b] (a KV cache's filled part), or NULL */
  int64_t batch;                 /* sequences, 1 to 65535; empty sequences are allowed */
  int64_t max_seqlen_q;          /* at least every sequence's query count (rows past it are not computed) */
  int64_t max_seqlen_k;          /* at least every sequence's key count */
  flashgen_attention_options options; /* the mask's alignment applies per sequence */
  /* Keys and values in a paged cache (prefill against a KV cache), or block_table NULL for packed k and v. With a
     block table, k and v are [num_pages, page_size, heads_kv, head_dim] (page_size a multiple of 16), sequence
     b's key j lies in row j % page_size of page block_table[b * max_pages + j / page_size], and its key count
     is seqused_k[b], else cu_seqlens_k[b + 1] - cu_seqlens_k[b] (the offsets then only give the counts). */
  const int32_t* block_table;    /* device int32 [batch, max_pages], or NULL */
  int64_t max_pages;             /* pages per sequence: block_table's row length */
} flashgen_varlen_forward_args;

/* The forward of each packed sequence as its own problem (flashgen_attention_forward's semantics per
 * sequence: its causal alignment, GQA, a row that sees no key gets 0 and lse -inf). The offsets live on the
 * device and are not read by the host: the kernels clamp them into [0, total_q] and [0, total_k], so bad
 * offsets give wrong rows but never an access outside the tensors. Stream, context and error semantics as
 * for flashgen_attention_forward. */
int flashgen_attention_varlen_forward(const flashgen_varlen_forward_args* args, void* cuda_stream);

/* Arguments of flashgen_attention_varlen_backward: the varlen forward's packed batch, its out and lse, dout,
 * and the gradients to write (dq and dout like q, dk and dv like k). size as in flashgen_varlen_forward_args. */
typedef struct {
  size_t size;
  flashgen_tensor q, k, v, out, dout, dq, dk, dv;
  const float* lse;              /* fp32 [heads_q, total_q], as flashgen_attention_varlen_forward wrote it */
  const int32_t* cu_seqlens_q;   /* device, batch + 1, as for the forward */
  const int32_t* cu_seqlens_k;
  int64_t batch;
  int64_t max_seqlen_q;
  int64_t max_seqlen_k;
  flashgen_attention_options options; /* deterministic: dq without atomics, bitwise repeatable */
} flashgen_varlen_backward_args;

/* Gradients of flashgen_attention_varlen_forward, each sequence's as flashgen_attention_backward computes
 * them (keys no query of their sequence sees get zero dk and dv). The workspace (4 * heads_q * total_q bytes,
 * plus 4 * heads_q * total_q * head_dim without deterministic) comes from flashgen's memory pool in
 * cuda_stream's order, as for flashgen_attention_backward. Offsets as for the forward (clamped on the
 * device). */
int flashgen_attention_varlen_backward(const flashgen_varlen_backward_args* args, void* cuda_stream);

/* Arguments of flashgen_attention_kvcache: a few new query tokens of each of `batch` sequences attending to
 * its KV cache (decoding), contiguous or paged, optionally after appending the new tokens' keys and values
 * to the cache in the same call. size as in flashgen_varlen_forward_args. */
typedef struct {
  size_t size;
  flashgen_tensor q;         /* [batch, seqlen_q, heads_q, head_dim]: the new queries */
  flashgen_tensor k_cache;   /* contiguous: [batch, capacity, heads_kv, head_dim];
                                paged (block_table given): [num_pages, page_size, heads_kv, head_dim],
                                page_size a multiple of 16. q's dtype, or FP8 (FLASHGEN_FLOAT8_E4M3 or _E5M2, the
                                same in v_cache; sm_89 and newer, head_dim a multiple of 32 up to 256, not a latent
                                cache): each key stands for its value times k_scale, widened to q's type exactly */
  flashgen_tensor v_cache;   /* shaped like k_cache, with its own strides; or a latent cache's (MLA's decode, sm_90):
                                k_cache's first head_dim_v columns (same data and strides, shape[3] = head_dim_v, a
                                multiple of 128 up to 512 and 64 below k_cache's, a multiple of 64 up to 576) */
  flashgen_tensor k_new;     /* [batch, seqlen_new, heads_kv, head_dim] appended to the cache before attending, or
                                data NULL (and the rest ignored) to append nothing */
  flashgen_tensor v_new;     /* like k_new; given exactly when k_new is (never with a latent cache: its values are
                                k_new's first columns) */
  flashgen_tensor out;       /* like q, with v_cache's head dim */
  float* lse;                /* fp32 [batch, heads_q, seqlen_q] contiguous (natural log), or NULL */
  const int32_t* cache_seqlens; /* device, batch: keys in sequence b's cache before this call's new ones (the
                                   new tokens go to rows cache_seqlens[b] ...); NULL: every cache holds capacity
                                   keys (then nothing can be appended) */
  const int32_t* block_table;   /* device, [batch, max_pages] row-major: sequence b's key j lives in row
                                   j % page_size of page block_table[b * max_pages + j / page_size]; NULL for a
                                   contiguous cache */
  int64_t max_pages;         /* block_table's pages per sequence (its row length); capacity = max_pages * page_size */
  int64_t num_splits;        /* key ranges per sequence: 0 lets flashgen choose for the GPU and problem; n >= 1 uses
                                exactly n (capped at the key blocks a sequence's rows can visit: the capacity's, or
                                under a window those of window_left + seqlen_q keys); 1 gives batch-invariant
                                results */
  void* workspace;           /* device memory for the ranges' partial results (splits > 1), 256-byte aligned, at least
                                flashgen_attention_kvcache_workspace_size() bytes; NULL: from flashgen's pool */
  size_t workspace_bytes;
  flashgen_attention_options options; /* FLASHGEN_MASK_CAUSAL aligns each sequence's queries with its last keys:
                                         new query i of n sees cache_seqlens[b] + seqlen_new - n + i + 1 keys.
                                         FLASHGEN_MASK_SLIDING_WINDOW lies about the same diagonal, seqlen_k being
                                         that sequence's cache_seqlens[b] + seqlen_new: new query i of n sees keys
                                         cache_seqlens[b] + seqlen_new - n + i - window_left to ... + window_right */
  const float* k_scale;      /* an FP8 cache's key scales (fp32, device): sequence b's keys of kv head h stand for
                                their values times k_scale[b * k_scale_stride[0] + h * k_scale_stride[1]], and a new
                                key k is stored as k / that scale, rounded to nearest even and saturated (±448 for
                                e4m3). Strides 0 share one scale: {0, 0} one per tensor, {0, 1} one per kv head.
                                NULL: 1. Must be NULL for a 16-bit cache */
  int64_t k_scale_stride[2];
  const float* v_scale;      /* the values' likewise */
  int64_t v_scale_stride[2];
  /* The scales grew the struct by 48 bytes; a size from an older flashgen.h is refused naming args.size. */
} flashgen_kvcache_args;

/* out = attention of each sequence's new queries over its cache (the first cache_seqlens[b] + seqlen_new
 * keys), with GQA/MQA as for flashgen_attention_forward; a row that sees no key gets 0 and lse -inf. With
 * k_new/v_new, their rows are first written to the cache (through the block table when paged) at rows
 * [cache_seqlens[b], cache_seqlens[b] + seqlen_new); cache_seqlens itself is not updated. cache_seqlens and
 * block_table live on the device and are not read by the host: the kernels clamp cache_seqlens[b] into
 * [0, capacity - seqlen_new] and page indices into [0, num_pages), so bad values give wrong rows but never
 * an access outside the tensors. With more than one key range per sequence the ranges' fp32 partial outputs
 * go to the workspace and a second kernel merges them. Allocates nothing and never synchronizes when the
 * workspace is given (or one range is used), so it can be captured into a CUDA graph once its kernels are
 * loaded. Stream, context and error semantics as for flashgen_attention_forward. */
int flashgen_attention_kvcache(const flashgen_kvcache_args* args, void* cuda_stream);

/* Device workspace flashgen_attention_kvcache needs for exactly these arguments, in bytes (0 with one key
 * range): 4 * splits * batch * heads_q * seqlen_q * (head_dim + 1) plus alignment. Picks the configuration
 * and split count for the stream's device as the call would, and launches nothing. */
int flashgen_attention_kvcache_workspace_size(const flashgen_kvcache_args* args, void* cuda_stream,
                                              size_t* workspace_bytes);

/* The type of a user variant's buffer (a device array its functions read as `const T* name`) or scalar (a value
 * they read as `T name`; FLASHGEN_ARG_FLOAT32 and FLASHGEN_ARG_INT32 only). */
typedef enum {
  FLASHGEN_ARG_FLOAT32 = 0, /* float */
  FLASHGEN_ARG_INT32 = 1,   /* int */
  FLASHGEN_ARG_INT64 = 2,   /* long long (buffers only) */
  FLASHGEN_ARG_UINT8 = 3    /* unsigned char, e.g. a bool mask table (buffers only) */
} flashgen_arg_type;

typedef struct {
  const char* name;       /* a C++ identifier, unique in the variant, not one of the functions' parameters */
  flashgen_arg_type type;
} flashgen_variant_arg;

/* A user-defined variant, FlexAttention's mask_mod and score_mod as C++ device code. Each function is given as
 * its body (statements ending in a return), compiled as a __device__ member function that sees the declared
 * buffers and scalars by name, and anything `helpers` defines (device functions, constants, at namespace
 * scope). Positions are sequence indices: q_idx of the query in [0, seqlen_q), kv_idx of the key in
 * [0, seqlen_k), batch the batch entry (a packed call's sequence), head the query head. The functions may be
 * asked about any such position, those that the built-in mask (causal, window, chunk) hides too. At least one of
 * mask_mod, score_mod and score_bias must be given; score_mod and score_bias not both. size is
 * sizeof(flashgen_variant_desc) as the caller compiled it. */
typedef struct {
  size_t size;
  const char* mask_mod;   /* NULL or the body of  bool mask_mod(int batch, int head, int q_idx, int kv_idx):
                             false hides key kv_idx from query q_idx. A row that sees no key gets out 0, lse -inf */
  const char* score_mod;  /* NULL or the body of  float score_mod(float score, int batch, int head, int q_idx,
                             int kv_idx): the score (q·k · softmax_scale) as the softmax takes it */
  const char* score_grad; /* with score_mod, for the backward: the body of  float score_grad(float modified, int batch,
                             int head, int q_idx, int kv_idx) returning d score_mod / d score where score_mod gave
                             `modified` (the kernels keep the modified score, not the input, so the derivative is
                             given in terms of it: a scale, a bias, a cap, any invertible function). NULL: the
                             backward refuses the variant */
  const char* score_bias; /* NULL or the body of  float score_bias(int batch, int head, int q_idx, int kv_idx): added
                             to the score (a relative-position bias, a bias table); its gradient is derived (1) */
  const char* helpers;    /* NULL or device code at namespace scope the bodies may call */
  const flashgen_variant_arg* buffers; /* num_buffers entries (at most 8), or NULL */
  int32_t num_buffers;
  const flashgen_variant_arg* scalars; /* num_scalars entries (at most 8), or NULL */
  int32_t num_scalars;
  int32_t mask_same_for_heads; /* nonzero: mask_mod gives every head the same answer (it ignores head), so the
                                  kernels classify each block once per batch entry, with head 0, rather than per
                                  head (see below). A mask that does depend on head must leave it 0 */
} flashgen_variant_desc;

/* Block sparsity: a call with a mask_mod first runs small generated kernels that classify each (query block, key
 * block) tile of the chosen kernel's tiles as empty, partial or full under the mask (per query head in the forward,
 * per kv head in the backward, or once per batch entry with mask_same_for_heads; a packed batch's per sequence); the
 * attention kernels then skip the empty blocks before and after each query block's visible run and evaluate the mask
 * only on partial ones. The backward widens each query block's run so that both its ends grow with the query block
 * (masks whose runs already do, such as documents, prefixes and windows, lose nothing). A forward call's classes
 * live in stream-ordered memory taken and given back around the call; the backward's in its workspace
 * (flashgen_attention_backward_workspace_size counts them); with options.block_mask, in the block mask, computed
 * once and reused. Calls over a paged cache have none. */

/* Checks desc, compiles its functions once with NVRTC (for any GPU: no device is needed) and returns a handle in
 * *variant. The functions' text becomes part of every kernel that uses it: its hash is in the kernels' names
 * (`_u<12 hex digits>`) and cache keys, so equal descriptions share compiled kernels. A function that does not
 * compile gives FLASHGEN_ERROR_COMPILE, flashgen_last_error() holding NVRTC's messages with the function's name
 * and its own line numbers ("mask_mod(2): error: ..."). */
int flashgen_variant_create(const flashgen_variant_desc* desc, flashgen_variant** variant);
/* Releases a handle (NULL is ignored). Calls already queued need it no more. */
void flashgen_variant_destroy(flashgen_variant* variant);
/* "u" and the hash's 12 hex digits, as kernel names carry it; valid while the handle lives. */
const char* flashgen_variant_tag(const flashgen_variant* variant);

/* An empty block mask in *mask. A call whose options name it and a variant with a mask_mod keeps the classes of its
 * kernel's tiles there, in device memory the mask owns (allocated by the first call of each config, shapes, variant
 * and buffer pointers and scalars, which computes them: not inside a CUDA graph capture), and a later call of the
 * same reuses them instead of classifying again: a model's layers share one per batch, as they share
 * FlexAttention's block mask. A forward and a backward call keep their own (their tiles differ). Calls are matched
 * by pointers and sizes, not contents: the caller promises that the variant's buffers, and a packed call's
 * cu_seqlens_q, cu_seqlens_k and seqused_k, hold what they held when the classes were computed; when they change
 * (a new batch, even at the same addresses), use another mask. Each distinct call keeps its classes until the mask
 * is destroyed. A call on another stream waits for the kernels that computed them (an event); the first call of a
 * shape cannot be captured into a CUDA graph (it allocates), later ones can, once that first call has completed
 * (a capture records no wait on it). Thread-safe. */
int flashgen_block_mask_create(flashgen_block_mask** mask);
/* Frees the mask and its device memory (NULL is ignored), after the work queued in each of its contexts has
 * completed (it synchronizes them). Not while a CUDA graph that used it may still run. */
void flashgen_block_mask_destroy(flashgen_block_mask* mask);

/* A forward problem by its sizes, for tuning. */
typedef struct {
  flashgen_dtype dtype;
  flashgen_mask mask;    /* not FLASHGEN_MASK_SLIDING_WINDOW, which needs a window: a windowed call is tuned
                            on its first use (flashgen_set_tune_on_first_use) */
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
} flashgen_forward_problem;

/* Tunes the forward kernel for problem's size bucket on the device of cuda_stream's context (else the
 * current context, else device 0) now: sweeps 16 candidate configs (the built-in choice, its one-knob
 * neighbours, others spread evenly over the search space; each compiled, checked against a float64
 * reference on its own random inputs and timed, on a stream of its own; seconds, synchronously), stores
 * every row and the winner in the user's tuning database, and makes the winner this process's choice for
 * that bucket. Writes {"problem": "<bucket id>", "config": "<winner>", "reason": ..., "db": "<path>"} to
 * json as flashgen_explain_forward does. A bucket already tuned by this process is not swept again. A
 * failed sweep returns its cause's status (FLASHGEN_ERROR_CUDA, FLASHGEN_ERROR_COMPILE, or
 * FLASHGEN_ERROR_INVALID_ARGUMENT for a tuning database that cannot be written there). */
int flashgen_tune_forward(const flashgen_forward_problem* problem, void* cuda_stream, char* json,
                          size_t json_capacity, size_t* json_length);

/* Tune-on-first-use, off by default (also switched on by FLASHGEN_TUNE=1 in the environment): a forward
 * or backward call whose problem size bucket the user's tuning database does not hold for this GPU first
 * sweeps 16 candidate configs (compiling, checking and timing them; seconds, synchronously, never while
 * the stream is capturing a CUDA graph), stores the results in the database and runs the winner. A dense
 * call with a user variant is tuned as a problem of its own (keyed by the variant's tag): its base class's
 * tiles with the functions compiled in, checked against the functions evaluated with the call's own
 * variant_buffers and variant_scalars, which must stay valid for the call as they always must. */
void flashgen_set_tune_on_first_use(int enabled);

/* Gives the device memory flashgen's pools keep between calls (the workspaces of calls that took none from
 * the caller) back to the driver, on every device; memory of calls still queued stays theirs until they
 * have run. The next such call maps its workspace again. Without a GPU, or before any such call, it does
 * nothing. */
int flashgen_release_cached_memory(void);

/* Thread-local text of the last failure on this thread ("" if none). */
const char* flashgen_last_error(void);

/* Library version, e.g. "0.1.0". */
const char* flashgen_version(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHGEN_FLASHGEN_H */
