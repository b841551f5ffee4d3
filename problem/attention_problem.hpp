// The one description of an attention problem: its pass, element type, sizes, mask and (backward) dQ
// strategy. A call carries it from the C ABI through dispatch, tuning and the store (whose ProblemKey
// buckets it); the references and the CLI take it too. Tensors are not part of it: launch/ binds them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "problem/user_variant.hpp"
#include "templates/fwd_traits.cuh"

namespace flashgen {

// The element type of q, k, v and the outputs. Host code and the generated kernels name one enum: the
// device-side ElemType of templates/fwd_traits.cuh.
using DType = ElemType;

const char* dtype_name(DType dtype);  // "fp16", "bf16", "e4m3", "e5m2"

enum class Pass { kForward, kBackward };

// How the backward sums each query's dQ over key blocks. kAtomic: fp32 atomics from the dK/dV kernel, then
// a conversion. kDeterministic: a kernel of its own owns each dQ element, so repeated runs give identical
// bits. Each strategy has its own kernels, so its own tuning data.
enum class DqStrategy { kAtomic, kDeterministic };

// The sizes of a dense problem: q is [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv,
// head_dim], v [batch, seqlen_k, heads_kv, value_dim()] and the output [batch, seqlen_q, heads_q, value_dim()].
struct AttentionShape {
  int64_t batch = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t head_dim = 64;
  // The values' (and the output's) head dim where it is not head_dim (MLA's 192 and 128); 0: head_dim.
  int64_t head_dim_v = 0;

  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }

  // Query heads per key/value head (GQA/MQA; 1 for multi-head attention).
  int64_t group_size() const { return heads_q / heads_kv; }
  // The key/value head query head head_q reads: head_q / group_size().
  int64_t kv_head(int64_t head_q) const { return head_q / group_size(); }
  // Multiply-adds of one reference pass (QKᵀ and PV each cost about this much): bounds the CPU time.
  double reference_cost() const {
    return static_cast<double>(batch) * heads_q * seqlen_q * seqlen_k * std::max(head_dim, value_dim());
  }
};

// The score modifiers a kernel compiles in around its mask (templates/variant.cuh), each a policy whose
// values are run-time parameters: config names, problem classes and tuning data keep them apart.
struct ScoreMods {
  bool softcap = false;  // SoftCap: cap · tanh(score / cap) before the softmax
  bool alibi = false;    // Alibi: a per-head bias linear in the distance to the diagonal, after the cap

  bool any() const { return softcap || alibi; }
  bool operator==(const ScoreMods& o) const { return softcap == o.softcap && alibi == o.alibi; }
  bool operator!=(const ScoreMods& o) const { return !(*this == o); }
};

// The caller's mask as the layers below api/ name it: none, causal with the diagonal aligned bottom-right (the
// last query sees the last key) or top-left (query i sees keys 0..i), or a window about the bottom-right diagonal
// (window_left, window_right; attention_chunk). The values are flashgen.h's flashgen_mask's (api/ translates);
// kernel class keys hold them.
enum class Mask : int { kNone = 0, kCausal = 1, kCausalTopLeft = 2, kSlidingWindow = 3 };

struct AttentionProblem {
  Pass pass = Pass::kForward;
  DType dtype = DType::kFloat16;
  AttentionShape shape;
  Mask mask = Mask::kNone;  // the caller's, causal alignment included (a window's: set_mask)
  DqStrategy dq = DqStrategy::kAtomic;     // the backward's; the forward ignores it
  // A packed batch of sequences of different lengths: shape.batch sequences of at most shape.seqlen_q
  // queries and shape.seqlen_k keys (the longest ones'), total_q and total_k rows in all.
  bool varlen = false;
  int64_t total_q = 0;
  int64_t total_k = 0;
  // New query tokens against a KV cache (decoding): shape.seqlen_q new tokens per sequence over a cache of
  // shape.seqlen_k rows (its capacity; each sequence's filled length lives on the device), read through a
  // block table of pages of page_size keys when paged.
  bool kv_cache = false;
  bool paged = false;
  int page_size = 0;
  // An FP8 KV cache's element type (e4m3 or e5m2, widened to dtype as the kernels read it); empty: dtype.
  std::optional<DType> cache_dtype;
  // An FP8 forward's (dtype e4m3 or e5m2) output type, bf16 or fp16; empty: dtype.
  std::optional<DType> out_dtype;
  // Scores soft-capped to cap · tanh(score / cap) before the softmax (options.softcap); 0: none.
  float softcap = 0.f;
  // ALiBi slopes come with the call (options.alibi_slopes, a device array like the tensors): its scores gain
  // -slope · |distance to the diagonal|.
  bool alibi = false;
  // With mask Mask::kSlidingWindow: the keys before and after the bottom-right diagonal a query sees
  // (options.window_left / window_right), -1 for no bound on that side; -1 under the other masks.
  int window_left = -1;
  int window_right = -1;
  // Chunked attention (options.attention_chunk, Llama 4): > 0 hides every key outside the chunk of that many
  // positions that holds a row's bottom-right diagonal. Only with mask Mask::kSlidingWindow (the
  // chunked window's kernels, MaskKind::kChunk): set_mask turns a chunked call of no mask or the causal mask into
  // the window of those.
  int attention_chunk = 0;
  // The backward of a call with sinks that wants their gradient (options.dsinks): its kernels sum that gradient over
  // their scores (BwdConfig::sink_grad). Not part of a problem class's tuning key: the tiles are the call's without it.
  bool sink_grad = false;
  // A user-defined variant (options.variant), its buffers and scalars coming with the call: its kernels are the
  // base mask's (and score modifiers') with the user's functions compiled in. Null: none.
  std::shared_ptr<const UserVariant> user;

  // Sets mask, window and chunk from a caller's, the one place a window is normalized: without a
  // chunk a window unbounded on both sides runs as no mask, and one unbounded on the left and 0 on the right as
  // the bottom-right causal mask (whose kernels need no first key per row); any other window keeps its sides.
  // With a chunk (> 0) no mask and the causal mask become the windows (-1, -1) and (-1, 0) and keep it; the
  // top-left causal mask takes none (the launchers refuse it first).
  void set_mask(Mask caller_mask, int caller_window_left = -1, int caller_window_right = -1,
                int caller_attention_chunk = 0);

  // The kernels' mask kind: both causal alignments run the causal kernels (the offset is a parameter).
  MaskKind mask_kind() const {
    if (mask == Mask::kNone) return MaskKind::kNone;
    if (!windowed()) return MaskKind::kCausal;
    return attention_chunk > 0 ? MaskKind::kChunk : MaskKind::kWindow;
  }
  bool windowed() const { return mask == Mask::kSlidingWindow; }
  bool backward() const { return pass == Pass::kBackward; }
  bool deterministic() const { return backward() && dq == DqStrategy::kDeterministic; }
  bool softcapped() const { return softcap > 0.f; }
  ScoreMods score_mods() const { return {softcapped(), alibi}; }
  int head_dim() const { return static_cast<int>(shape.head_dim); }
  DType kv_dtype() const { return cache_dtype.value_or(dtype); }
  DType output_dtype() const { return out_dtype.value_or(dtype); }
  int value_dim() const { return static_cast<int>(shape.value_dim()); }
};

// A problem of the given pass over shape, its mask, window and chunk set by set_mask; the backward's dQ strategy from
// deterministic.
AttentionProblem forward_problem(DType dtype, const AttentionShape& shape, Mask mask, int window_left = -1,
                                 int window_right = -1, int attention_chunk = 0);
AttentionProblem backward_problem(DType dtype, const AttentionShape& shape, Mask mask, bool deterministic,
                                  int window_left = -1, int window_right = -1, int attention_chunk = 0);

// The sequence lengths a packed batch is run with where only its sizes are known (a tuning sweep of a varlen
// problem, `flashgen run --varlen`): `count` lengths spread evenly from `longest` down to what makes `total` in
// all (down to empty sequences when total is less than half of count * longest), in a fixed shuffled order, as a
// real batch's lengths come in no order. The same arguments give the same list on every machine. Throws
// Error(kInvalidArgument) unless 1 <= count, 0 <= longest and longest <= total <= count * longest.
std::vector<int64_t> packed_lengths(int64_t count, int64_t longest, int64_t total);

// The sequences of a packed problem run from its sizes: packed_lengths of its queries, and of its keys in the
// same order so long queries meet long keys (the queries' lengths themselves when seqlen_k == seqlen_q and
// total_k == total_q: self-attention over packed documents).
struct PackedBatch {
  AttentionShape shape;               // the problem's: batch sequences of at most seqlen_q and seqlen_k
  std::vector<int64_t> len_q, len_k;  // per sequence
  std::vector<int32_t> cu_q, cu_k;    // batch + 1 offsets: sequence b's rows are [cu[b], cu[b + 1])

  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  // Sequence b as a problem of its own: batch 1, its lengths.
  AttentionShape sequence(size_t b) const;
  // The sequences a sampled check looks at: the longest, the shortest and the first and last of those with
  // queries and keys (each once, ascending).
  std::vector<size_t> sampled_sequences() const;
};
PackedBatch packed_batch(const AttentionProblem& problem);  // problem.varlen; throws as packed_lengths does

}  // namespace flashgen
