// Keys of the tuning data: which GPU and toolchain (DeviceFingerprint) and which problem class and
// size bucket (ProblemKey). Rows of the SQLite store and the run-time lookup are keyed by both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "generator/kernel_config.hpp"
#include "problem/attention_problem.hpp"

namespace flashgen {

// Everything that can change which kernel is fastest or whether a cubin is valid.
struct DeviceFingerprint {
  std::string gpu_name;           // "NVIDIA H200"
  int sm = 0;                     // 90
  int sm_count = 0;               // 132
  int driver_version = 0;         // cuDriverGetVersion, e.g. 13000
  std::string nvrtc_version;      // "13.0"
  std::string generator_version;  // kGeneratorVersion

  // Stable text form, e.g. "NVIDIA H200|sm90|132sm|drv13000|nvrtc13.0|gen1"; the store's key.
  std::string id() const;
  bool operator==(const DeviceFingerprint& other) const { return id() == other.id(); }
};

// Fingerprint of local device `device` (an ordinal) from the CUDA driver, NVRTC and the generator.
// Throws Error(kNoDevice) without a driver, Error(kCuda) for a bad ordinal.
DeviceFingerprint current_device_fingerprint(int device = 0);

// Fingerprint for compile-only work on sm_<arch> with no device: gpu_name "sm_<arch> (no device)",
// sm_count 0, driver_version 0; the NVRTC and generator versions are the real ones.
DeviceFingerprint fingerprint_for_arch(int arch);

// Power-of-two bucket of a size: the smallest power of two >= n (n >= 1). Problems in one bucket share
// tuning data; "nearest" compares bucket exponents.
int64_t size_bucket(int64_t n);

// Problem class (exact) plus bucketed sizes.
struct ProblemKey {
  Pass pass = Pass::kForward;
  DqStrategy dq = DqStrategy::kAtomic;  // backward keys: each strategy has its own kernels and tuning data
  bool varlen = false;                  // packed batches run kernels of their own, so have data of their own
  bool kv_cache = false;                // decoding against a KV cache (the decode family, with its split count)
  std::optional<DType> cache_dtype;     // an FP8 KV cache's type ("dec_kve4m3"), kernels of their own; empty: dtype
  bool paged = false;                   // keys and values read through a block table (KV-cache or packed forward)
  // A packed forward over a paged cache: its pages' keys, part of the class ("fwd_varlen_paged256"). Its TMA boxes
  // hold gcd(page_size, block_n) rows, so the fastest tile follows the page size. 0 for every other key.
  int page_size = 0;
  DType dtype = DType::kFloat16;
  int head_dim = 128;
  // The values' head dim where it is not head_dim ("d192v128" in ids), 0 where it is: part of the class, as its
  // kernels are their own.
  int head_dim_v = 0;
  MaskKind mask = MaskKind::kNone;
  ScoreMods mods = {};              // soft cap, ALiBi: kernels of their own ("causal_softcap_alibi" in ids)
  int gqa_ratio = 1;                // heads_q / heads_kv
  int64_t seqlen_q_bucket = 1;      // size_bucket(seqlen_q)
  int64_t seqlen_k_bucket = 1;      // size_bucket(seqlen_k)
  int64_t batch_heads_bucket = 1;   // size_bucket(batch * heads_q)
  // Window keys (mask kWindow, and kChunk: a chunked window) only: size_bucket of the most keys a row sees
  // (window_span), and whether the window's right side is 0 (causal-shaped: no key past the diagonal). The
  // kernels are the same for every window; the time they take follows its span.
  int64_t window_bucket = 0;
  bool window_causal = false;
  // A user variant's tag ("u" and 12 hex digits of its functions' hash), empty for none: its problems are tuned and
  // stored apart from the base class's ("causal_u250e3288aa69" in ids), their winners the base class's configs,
  // to which the variant is attached at run time.
  std::string user_tag;

  // The pass in ids and the store's rows: "fwd", "bwd" or "bwd_det" (the deterministic dQ strategy),
  // "fwd_varlen", "bwd_varlen", "bwd_det_varlen" for packed batches (their sizes bucketed by the longest
  // sequence and the sequence count), "fwd_varlen_paged" and the page size ("fwd_varlen_paged16") for a packed
  // forward over a paged cache, and "dec" or "dec_paged" for KV-cache calls (bucketed by the new tokens per
  // sequence, the cache's capacity and batch * heads_q).
  std::string pass_id() const;
  // Exact problem class without the size buckets, e.g. "fwd|bf16|d128|causal|g4" ("d192v128" for values of a head dim
  // of their own).
  std::string class_id() const;
  // class_id plus buckets, e.g. "fwd|bf16|d128|causal|g4|q4096|k4096|bh64"; a window key's ends in its window
  // bucket, "c" when causal-shaped: "fwd|bf16|d128|window|g4|q4096|k4096|bh64|w1024c".
  std::string id() const;
  bool operator==(const ProblemKey& other) const { return id() == other.id(); }
  // head_dim_v, or head_dim where the values have the queries' head dim.
  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

// Sets key's pass, dQ strategy, varlen, kv_cache, paged and page_size from their text in ids (pass_id()); throws
// Error(kInvalidArgument) naming any other text.
void read_pass_id(const std::string& text, ProblemKey& key);
// A key's mask and score variant as class ids spell them: "none", "causal", "window", each with the score
// modifiers' suffixes ("_softcap", "_alibi"; generator/kernel_config.hpp), then a user variant's tag ("_u...").
std::string variant_text(MaskKind mask, const ScoreMods& mods, const std::string& user_tag = "");
// The same as the store's mask column and its JSON's "mask" spell it: variant_text, a window key's bucket and
// shape after "window" ("window1024c_softcap"), so that a row rebuilds its key (and the rows of other masks read
// as they always have).
std::string mask_text(const ProblemKey& key);
// Sets key's mask, score modifiers, window and user variant's tag from mask_text's spellings (a tag on a dense key
// only: read the pass first); throws Error(kInvalidArgument) naming any other.
void read_mask_text(const std::string& text, ProblemKey& key);

// The most keys a row of a window problem sees: both sides and the diagonal's key, an unbounded side counted as
// seqlen_k, at most seqlen_k, and at most the chunk of a chunked one.
int64_t window_span(const AttentionProblem& problem);

// The key a problem is tuned, stored and looked up under (both causal alignments run the causal kernels).
ProblemKey problem_key(const AttentionProblem& problem);

// The user variant's tag a problem's key carries: dense calls' (their sweeps compile the variant in and check it
// against its functions evaluated on the GPU); packed and KV-cache calls run their base class's data, untagged.
std::string user_key_tag(const AttentionProblem& problem);

// Key of a forward problem of the given sizes.
ProblemKey forward_problem_key(DType dtype, int head_dim, MaskKind mask, int gqa_ratio, int64_t seqlen_q,
                               int64_t seqlen_k, int64_t batch_heads);

// Key of a backward problem of the given sizes and dQ strategy.
ProblemKey backward_problem_key(DType dtype, int head_dim, MaskKind mask, bool deterministic, int gqa_ratio,
                                int64_t seqlen_q, int64_t seqlen_k, int64_t batch_heads);

// Distance between two keys of the same class: sum of |log2 bucket differences| (window keys' window buckets
// too, and 1 between a causal-shaped window and a two-sided one); used to pick the nearest stored bucket.
// Throws Error(kInvalidArgument) for keys of different classes.
int bucket_distance(const ProblemKey& a, const ProblemKey& b);

}  // namespace flashgen
