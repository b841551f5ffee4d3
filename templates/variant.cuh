// Attention variants: one policy type per way of masking and transforming scores. The generated config
// names it (`using Variant = flashgen::CausalMask;`) and every kernel family asks it the same questions
// at the same places, mostly through block_range.cuh: which keys a row sees (and, in the backward, which
// queries see a key), hence which key blocks a query block visits and which of them need a per-element
// mask; whether one score is visible; each score's transform before the softmax max, and its derivative
// on dS. A new variant (a user's mask) is one more policy here.
//
// A policy is a struct of static members. Params is AttnFwdParams or AttnBwdParams (attn_params.cuh), or the
// decode kernel's DecodeSequence, which all carry seqlen_q, seqlen_k and `variant`, the variant's run-time
// arguments (VariantArgs: the causal offset, the scale, a window, a cap, per-head slopes behind a pointer).
// Positions are sequence indices: query row q in [0, seqlen_q), key k in [0, seqlen_k); head is the query
// head. Keys past seqlen_k are hidden by the kernels for every variant; a policy speaks of the keys inside.
//
//   kHidesKeys                 compile time: some key inside seqlen_k may be hidden from some row. When
//                              false the three range questions are never asked (every row sees every key)
//                              and no block is partial but seqlen_k's ragged last one.
//   visible(p, at)             whether key at.k is visible to query at.q: the definition the answers
//                              below agree with (tests/templates/variant_check.cu checks each policy).
//   row_keys(p, batch, head, row, last_bound, key_base)
//                              the same for one row and consecutive keys, in the form a kernel tests once
//                              per score: key key_base + o is hidden iff .hidden(o) (keys past last_bound
//                              too; o is a fragment's constant column offset).
//   last_key(p, batch, row)    the last key row sees (may lie outside [0, seqlen_k)).
//   key_end(p, batch, row_end) one past the last key any row before row_end sees: key_end(r + 1) ==
//                              last_key(r) + 1, both given in the form the kernels use them.
//   first_query(p, batch, key) the first query that sees key.
//   key_queries(p, batch, head, key, query_base)
//                              the column form of the same for the transposed layout (the backward's Sᵀ, a key
//                              per row): query query_base + o is hidden from key iff .hidden(o), for a key
//                              inside seqlen_k; .hide_every_query() makes it hide them all (a key past it).
//   kHidesEarlyKeys            compile time: a row may also not see keys before some first one (a window).
//                              When true two more questions are asked:
//   first_key(p, batch, row)   the first key row sees (may lie outside [0, seqlen_k)).
//   last_query(p, batch, key)  the last query that sees key.
//   score(p, at, s)            the score of (at.q, at.k) from s = q·k (softmax scale not applied), in the
//                              same units: the kernels scale it, take the max and exponentiate. Identity in
//                              the masks below; SoftCap<Mask> caps it, Alibi<Base> adds a bias.
//   score_grad(p, at, x, ds)   the backward's counterpart: from ds, the gradient with respect to score(p, at, s),
//                              the gradient with respect to s, given x = score(p, at, s) · scale_log2 (the
//                              transformed score in the units the kernels exponentiate, which they compute
//                              before the softmax; a hidden key's, whose ds is 0, may come as 0 instead).
//                              Identity in the masks. kGradReadsScore: whether score_grad reads x (a kernel
//                              keeps x to dS's computation only when it does).
//   row_scores(p, at)          score for one row and consecutive keys, in the form a kernel applies once per
//                              score: the score of key at.k + o is .score(s, o) · score_unit(p) (o a fragment's
//                              constant column offset after unrolling), what score() gives, with the row's share
//                              computed once. A forward kernel folds score_unit(p) into its softmax scale, so a
//                              transform whose last step is a multiply by a constant (the soft cap's) leaves it
//                              out of the row form: one multiply per score fewer.
//   score_unit(p)              the units of the row form's scores, in q·k units (> 0); kScaledRows: whether it
//                              may differ from 1 (a soft cap), else a kernel reads its scale as it is.
//   kEveryBlockPartial         compile time: no key block is known to need no per-element mask (a user's mask):
//                              every block a walk visits is partial.
// The ranges take each row to see one run of consecutive keys whose ends grow with the row: a prefix
// (none, causal; block_range.cuh derives the blocks from last_key, key_end and first_query) or, with
// kHidesEarlyKeys, a window that slides (also from first_key and last_query), whose key blocks are then
// partial at both ends of a row's run. Ranges take the batch, not the head: the backward's dkdv kernels
// share one query range among a kv head's query heads. A kernel asks all of these with values it already holds; a policy
// that hides no key, or transforms no score, leaves no instruction behind.
#pragma once

namespace flashgen {

// Where one score lies.
struct ScoreAt {
  int batch;
  int head;  // the query head
  int q;     // query row in its sequence
  int k;     // key in its sequence
};

// The visible keys of one row as a kernel tests them: key base + o is hidden iff o > last (o, a
// fragment's column offset, is a constant after unrolling: one compare per score).
struct KeysUpTo {
  int last;  // the last visible key, relative to the base
  __host__ __device__ __forceinline__ bool hidden(int offset) const { return offset > last; }
};

// The same for a run of keys that also starts past the base: key base + o is hidden iff o < first or o > last.
struct KeysBetween {
  int first;  // the first visible key, relative to the base
  int last;
  __host__ __device__ __forceinline__ bool hidden(int offset) const { return offset < first || offset > last; }
};

// A key's visible queries as a kernel of the transposed layout (Sᵀ: a key per row) tests them: query base + o is
// hidden iff o < first (o >= 0, a fragment's constant column offset: one compare per score).
struct QueriesFrom {
  int first;  // the first visible query, relative to the base
  __host__ __device__ __forceinline__ bool hidden(int offset) const { return offset < first; }
  __host__ __device__ __forceinline__ void hide_every_query() { first = 1 << 30; }
};

// The same for a run of queries that also ends: query base + o is hidden iff o < first or o > last.
struct QueriesBetween {
  int first;  // the first visible query, relative to the base
  int last;
  __host__ __device__ __forceinline__ bool hidden(int offset) const { return offset < first || offset > last; }
  __host__ __device__ __forceinline__ void hide_every_query() { first = 1 << 30; }
};

// The score hooks of a variant that leaves scores as they are: a base of the masks below.
struct UnchangedScores {
  // Whether every score is q·k itself (no transform, no bias): an FP8 forward then folds its descales into the
  // softmax's scale instead of multiplying each score.
  static constexpr bool kPlainScores = true;
  static constexpr bool kGradReadsScore = false;
  static constexpr bool kScaledRows = false;
  // Whether no key block can be known to need no per-element mask (a user's mask, whose hidden keys no formula
  // places): block_range.cuh then makes every block of a walk partial.
  static constexpr bool kEveryBlockPartial = false;
  // Whether its per-score work in the backward needs more registers than the Hopper backward's turns leave (a
  // user's mask or score_mod, or the soft cap under ALiBi): that config's consumers step together
  // (bwd_sm90_lock_step).
  static constexpr bool kWideScoreWork = false;

  struct Row {
    __host__ __device__ __forceinline__ float score(float s, int /*offset*/) const { return s; }
  };
  template <class Params>
  static __host__ __device__ __forceinline__ Row row_scores(const Params&, const ScoreAt&) {
    return {};
  }
  template <class Params>
  static __host__ __device__ __forceinline__ float score_unit(const Params&) {
    return 1.f;
  }

  template <class Params>
  static __host__ __device__ __forceinline__ float score(const Params&, const ScoreAt&, float s) {
    return s;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ float score_grad(const Params&, const ScoreAt&, float /*x*/, float ds) {
    return ds;
  }
};

// Every key inside seqlen_k is visible; scores unchanged.
struct NoMask : UnchangedScores {
  static constexpr bool kHidesKeys = false;
  static constexpr bool kHidesEarlyKeys = false;

  template <class Params>
  static __host__ __device__ __forceinline__ bool visible(const Params&, const ScoreAt&) {
    return true;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ KeysUpTo row_keys(const Params&, int /*batch*/, int /*head*/,
                                                                int /*row*/, int last_bound, int key_base) {
    return {last_bound - key_base};
  }
  template <class Params>
  static __host__ __device__ __forceinline__ QueriesFrom key_queries(const Params&, int /*batch*/, int /*head*/,
                                                                      int /*key*/, int /*query_base*/) {
    return {0};
  }
};

// Key k is visible to query q iff k <= q + causal_offset (p.variant's): one policy for both alignments, the launcher
// sets the offset (seqlen_k - seqlen_q bottom-right, 0 top-left). Scores unchanged.
struct CausalMask : UnchangedScores {
  static constexpr bool kHidesKeys = true;
  static constexpr bool kHidesEarlyKeys = false;

  template <class Params>
  static __host__ __device__ __forceinline__ bool visible(const Params& p, const ScoreAt& at) {
    return at.k <= at.q + p.variant.causal_offset;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ KeysUpTo row_keys(const Params& p, int /*batch*/, int /*head*/, int row,
                                                                int last_bound, int key_base) {
    const int last = min(last_bound, row + p.variant.causal_offset);
    return {last - key_base};
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int last_key(const Params& p, int /*batch*/, int row) {
    return row + p.variant.causal_offset;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int key_end(const Params& p, int /*batch*/, int row_end) {
    return row_end + p.variant.causal_offset;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int first_query(const Params& p, int /*batch*/, int key) {
    return key - p.variant.causal_offset;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ QueriesFrom key_queries(const Params& p, int batch, int /*head*/, int key,
                                                                      int query_base) {
    const int first = first_query(p, batch, key);
    return {first - query_base};
  }
};

// floor(x / d) for d > 0 and x of either sign (C++ division truncates towards zero).
__host__ __device__ __forceinline__ int floor_div(int x, int d) { return (x >= 0 ? x : x - d + 1) / d; }

// A sliding window about the diagonal: key k is visible to query q iff
// q + causal_offset - window_left <= k <= q + causal_offset + window_right (p.variant's), the offset being the
// bottom-right alignment's (seqlen_k - seqlen_q; FlashAttention's window_size) and both sides >= 0 (the
// launcher bounds an unbounded left side by seqlen_k and right side by seqlen_q, so no sum below passes
// seqlen_q + seqlen_k plus a block). A causal window has window_right 0. kChunked (ChunkedWindow, Llama 4's
// chunked attention): k must also lie in the chunk of attention_chunk = C > 0 positions that holds the row's
// diagonal (the launcher bounds C by seqlen_k); each end of a row's run is clamped to its chunk, so both still
// grow with the row (chunked causal attention is the window (seqlen_k, 0) with a chunk). A policy of its own:
// the chunk's division per row costs the plain window's register-bound tiles a spill. Scores unchanged.
template <bool kChunked>
struct WindowMask : UnchangedScores {
  static constexpr bool kHidesKeys = true;
  static constexpr bool kHidesEarlyKeys = true;

  // The first and last positions of the chunk that holds position x (chunked only).
  template <class Params>
  static __host__ __device__ __forceinline__ int chunk_first(const Params& p, int x) {
    return floor_div(x, p.variant.attention_chunk) * p.variant.attention_chunk;
  }
  // The first position of a key's chunk: keys are never negative, so one unsigned division (visible() asks it per
  // score, the backward's walks per key block; floor_div's signed form there cost the d64 Hopper backward a spill).
  template <class Params>
  static __host__ __device__ __forceinline__ int key_chunk_first(const Params& p, int key) {
    return static_cast<int>(static_cast<unsigned>(key) / static_cast<unsigned>(p.variant.attention_chunk)) *
           p.variant.attention_chunk;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int chunk_last(const Params& p, int x) {
    return chunk_first(p, x) + p.variant.attention_chunk - 1;
  }

  template <class Params>
  static __host__ __device__ __forceinline__ bool visible(const Params& p, const ScoreAt& at) {
    const int diagonal = at.q + p.variant.causal_offset;
    const bool in_window = at.k >= diagonal - p.variant.window_left && at.k <= diagonal + p.variant.window_right;
    if constexpr (kChunked) {
      // The diagonal in the key's chunk: one division, by the key, which a kernel testing a key's scores across its
      // tile shares.
      const int first = key_chunk_first(p, at.k);
      return in_window && diagonal >= first && diagonal - first < p.variant.attention_chunk;
    } else {
      return in_window;
    }
  }
  template <class Params>
  static __host__ __device__ __forceinline__ KeysBetween row_keys(const Params& p, int batch, int /*head*/, int row,
                                                                   int last_bound, int key_base) {
    if constexpr (kChunked) {
      return {first_key(p, batch, row) - key_base, min(last_bound, last_key(p, batch, row)) - key_base};
    } else {
      const int diagonal = row + p.variant.causal_offset;
      return {diagonal - p.variant.window_left - key_base,
              min(last_bound, diagonal + p.variant.window_right) - key_base};
    }
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int last_key(const Params& p, int /*batch*/, int row) {
    const int diagonal = row + p.variant.causal_offset;
    if constexpr (kChunked) return min(diagonal + p.variant.window_right, chunk_last(p, diagonal));
    return diagonal + p.variant.window_right;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int key_end(const Params& p, int batch, int row_end) {
    if constexpr (kChunked) return last_key(p, batch, row_end - 1) + 1;
    return row_end + p.variant.causal_offset + p.variant.window_right;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int first_query(const Params& p, int /*batch*/, int key) {
    const int first = key - p.variant.causal_offset - p.variant.window_right;
    if constexpr (kChunked) return max(first, key_chunk_first(p, key) - p.variant.causal_offset);
    return first;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int first_key(const Params& p, int /*batch*/, int row) {
    const int diagonal = row + p.variant.causal_offset;
    if constexpr (kChunked) return max(diagonal - p.variant.window_left, chunk_first(p, diagonal));
    return diagonal - p.variant.window_left;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int last_query(const Params& p, int /*batch*/, int key) {
    const int last = key - p.variant.causal_offset + p.variant.window_left;
    if constexpr (kChunked) {
      return min(last, key_chunk_first(p, key) + p.variant.attention_chunk - 1 - p.variant.causal_offset);
    }
    return last;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ QueriesBetween key_queries(const Params& p, int batch, int /*head*/,
                                                                         int key, int query_base) {
    const int first = first_query(p, batch, key), last = last_query(p, batch, key);
    return {first - query_base, last - query_base};
  }
};

using SlidingWindow = WindowMask<false>;
using ChunkedWindow = WindowMask<true>;

// tanh(x) for the score hooks: the tensor cores' neighbour MUFU.TANH on the device (max relative error about
// 2^-11, as the peers' soft caps use), the C library's on the host (tests/templates/variant_check.cu).
__host__ __device__ __forceinline__ float score_tanh(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);
#endif
}

// A soft cap on Mask's scores: cap · tanh(score · scale / cap) before the softmax (Gemma 2, Grok), in q·k
// units as the hooks speak: (cap / scale) · tanh(s · scale / cap) with p.variant's softcap_in = scale / cap and
// softcap_out = cap / scale. Its derivative with respect to s is 1 - tanh², tanh being x · softcap_grad
// (x = cap · tanh · log2(e), softcap_grad = 1 / (cap · log2(e))). The row form gives tanh alone, in units of
// softcap_out. Mask decides visibility.
template <class Mask>
struct SoftCap : Mask {
  static constexpr bool kPlainScores = false;
  static constexpr bool kGradReadsScore = true;
  static constexpr bool kScaledRows = true;

  template <class Params>
  static __host__ __device__ __forceinline__ float score(const Params& p, const ScoreAt&, float s) {
    return p.variant.softcap_out * score_tanh(s * p.variant.softcap_in);
  }
  template <class Params>
  static __host__ __device__ __forceinline__ float score_grad(const Params& p, const ScoreAt&, float x, float ds) {
    const float t = x * p.variant.softcap_grad;
    return ds * (1.f - t * t);
  }

  struct Row {
    float in;  // softcap_in
    __host__ __device__ __forceinline__ float score(float s, int /*offset*/) const { return score_tanh(s * in); }
  };
  template <class Params>
  static __host__ __device__ __forceinline__ Row row_scores(const Params& p, const ScoreAt&) {
    return {p.variant.softcap_in};
  }
  template <class Params>
  static __host__ __device__ __forceinline__ float score_unit(const Params& p) {
    return p.variant.softcap_out;
  }
};

// ALiBi on Base's scores (a mask, or a soft cap of one): score - slope · |q + causal_offset - k| / scale,
// FlashAttention's bias -slope · |i + seqlen_k - seqlen_q - j| in the softmax's units (about the top-left
// diagonal under the top-left causal mask), one slope per query head or per sequence and query head
// (p.variant's alibi_slopes and alibi_batch_stride), added after Base's transform as FlashAttention adds it after the
// soft cap. The bias does not depend on s, so the gradient is Base's, given Base's own score in log2 units:
// x less the bias. The slope is a load per score that a kernel's unrolled loop reads once per row (its
// address depends on the row's head only); Base decides visibility.
template <class Base>
struct Alibi : Base {
  static constexpr bool kPlainScores = false;
  static constexpr bool kGradReadsScore = Base::kGradReadsScore;
  static constexpr bool kWideScoreWork = Base::kWideScoreWork || Base::kGradReadsScore;

  // The bias of (at.q, at.k) in q·k units.
  template <class Params>
  static __host__ __device__ __forceinline__ float bias(const Params& p, const ScoreAt& at) {
    const float slope = p.variant.alibi_slopes[at.batch * p.variant.alibi_batch_stride + at.head];
    return -slope * p.variant.inv_scale * fabsf(static_cast<float>(at.q + p.variant.causal_offset - at.k));
  }
  template <class Params>
  static __host__ __device__ __forceinline__ float score(const Params& p, const ScoreAt& at, float s) {
    return Base::score(p, at, s) + bias(p, at);
  }
  template <class Params>
  static __host__ __device__ __forceinline__ float score_grad(const Params& p, const ScoreAt& at, float x, float ds) {
    if constexpr (Base::kGradReadsScore) return Base::score_grad(p, at, x - bias(p, at) * p.variant.scale_log2, ds);
    return Base::score_grad(p, at, x, ds);
  }

  // One row's scores: the slope (in Base's row units) and the row's distance to key at.k as floats once per row, so
  // a score's bias is a float add of a constant and a multiply-add (no integer distance converted per score).
  // Distances below 2^24 are exact in float.
  template <class BaseRow>
  struct Row {
    BaseRow base;
    float slope;     // slope / (scale · Base::score_unit(p))
    float distance;  // q + causal_offset - at.k
    __host__ __device__ __forceinline__ float score(float s, int offset) const {
      return base.score(s, offset) - slope * fabsf(distance - static_cast<float>(offset));
    }
  };
  template <class Params>
  static __host__ __device__ __forceinline__ auto row_scores(const Params& p, const ScoreAt& at) {
    using BaseRow = decltype(Base::row_scores(p, at));
    const float slope = p.variant.alibi_slopes[at.batch * p.variant.alibi_batch_stride + at.head] *
                        (p.variant.inv_scale / Base::score_unit(p));
    return Row<BaseRow>{Base::row_scores(p, at), slope, static_cast<float>(at.q + p.variant.causal_offset - at.k)};
  }
};

// A user-defined variant (flashgen_variant_create) around Base, a built-in mask (and its soft cap or ALiBi when
// User modifies no score). User is the generated flashgen_user::Functions: the caller's mask_mod, score_mod,
// score_grad and score_bias as const member functions of an object that holds the buffers and scalars they read
// (User::of(p.variant) loads them from its user_buffers and user_scalars), with compile-time flags kMasks and kScore.
// A key is visible when Base's mask and the user's both show it. The user's functions speak in the softmax's
// units (scores times the scale), the hooks in q·k units: score_mod(s · scale) / scale. Base's ranges still
// bound every walk (a user mask only hides more), but no block is known to be full: kEveryBlockPartial.
// score_grad's derivative is given in terms of the modified score, x · ln 2 in the softmax's units (x the
// hooks' log2 units); a bias's is 1.
enum class UserScore { kNone, kMod, kBias };

template <class Base, class User>
struct UserVariant : Base {
  static_assert(User::kScore == UserScore::kNone || !Base::kGradReadsScore,
                "a user's score function takes the place of the soft cap and ALiBi");
  // A user's score functions take Base's scores in q·k units and give them so; its mask alone keeps Base's row
  // units (kScaledRows and score_unit are Base's).
  static_assert(User::kScore == UserScore::kNone || !Base::kScaledRows,
                "a user's score function takes Base's scores in q·k units (score_unit 1)");
  using BaseVariant = Base;
  static constexpr bool kHidesKeys = Base::kHidesKeys || User::kMasks;
  // A user mask may hide keys before a row's first visible one: its block classes start the walks past them
  // (block_range.cuh), and every walk is masked at both ends.
  static constexpr bool kHidesEarlyKeys = Base::kHidesEarlyKeys || User::kMasks;
  static constexpr bool kEveryBlockPartial = User::kMasks;
  static constexpr bool kPlainScores = User::kScore == UserScore::kNone && Base::kPlainScores;
  static constexpr bool kGradReadsScore = User::kScore == UserScore::kMod || Base::kGradReadsScore;
  static constexpr bool kWideScoreWork = User::kScore == UserScore::kMod || User::kMasks || Base::kWideScoreWork;

  // The user's functions see query rows inside the problem: a tile's rows past seqlen_q (padding, whose results no
  // one keeps) ask as its last row, so that a buffer of seqlen_q entries is never read past its end.
  template <class Params>
  static __device__ __forceinline__ int user_row(const Params& p, int row) {
    return min(row, p.seqlen_q - 1);
  }
  // Keys likewise where a kernel asks for every key of a tile before masking (the backward's visible, score and
  // score_grad): a key past seqlen_k, hidden whatever the user's function says, asks as the last key. The row forms
  // need no clamp of their own: row_keys clamps its keys to its last bound, and row_scores asks only for keys that
  // Base shows, all inside seqlen_k.
  template <class Params>
  static __device__ __forceinline__ int user_key(const Params& p, int key) {
    return min(key, p.seqlen_k - 1);
  }

  template <class Params>
  static __device__ __forceinline__ bool visible(const Params& p, const ScoreAt& at) {
    if constexpr (User::kMasks) {
      if (!User::of(p.variant).mask_mod(at.batch, at.head, user_row(p, at.q), user_key(p, at.k))) return false;
    }
    return Base::visible(p, at);
  }

  // One row's keys: Base's, and the user's mask per key. The mask is asked for every key, Base's hidden ones too
  // (keys past last_bound as the last one), so that its reads do not wait on Base's answer and what it reads for
  // the row alone is read once, not once per key.
  template <class BaseKeys>
  struct Keys {
    BaseKeys base;
    User user;
    int batch, head, row, key_base, last_bound;
    __device__ __forceinline__ bool hidden(int offset) const {
      if constexpr (User::kMasks) {
        const bool user_hides = !user.mask_mod(batch, head, row, min(key_base + offset, last_bound));
        return base.hidden(offset) | user_hides;
      }
      return base.hidden(offset);
    }
  };
  template <class Params>
  static __device__ __forceinline__ auto row_keys(const Params& p, int batch, int head, int row, int last_bound,
                                                  int key_base) {
    using BaseKeys = decltype(Base::row_keys(p, batch, head, row, last_bound, key_base));
    return Keys<BaseKeys>{Base::row_keys(p, batch, head, row, last_bound, key_base), User::of(p.variant), batch, head,
                          user_row(p, row), key_base, last_bound};
  }

  // One key's queries (the transposed layout): Base's, and the user's mask per query, asked for every query as
  // row_keys asks for every key (queries past seqlen_q as the last one).
  template <class BaseQueries>
  struct Queries {
    BaseQueries base;
    User user;
    int batch, head, key, query_base, last_row;
    __device__ __forceinline__ bool hidden(int offset) const {
      if constexpr (User::kMasks) {
        const bool user_hides = !user.mask_mod(batch, head, min(query_base + offset, last_row), key);
        return base.hidden(offset) | user_hides;
      }
      return base.hidden(offset);
    }
    __device__ __forceinline__ void hide_every_query() { base.hide_every_query(); }
  };
  template <class Params>
  static __device__ __forceinline__ auto key_queries(const Params& p, int batch, int head, int key, int query_base) {
    using BaseQueries = decltype(Base::key_queries(p, batch, head, key, query_base));
    return Queries<BaseQueries>{Base::key_queries(p, batch, head, key, query_base), User::of(p.variant), batch, head,
                                user_key(p, key), query_base, p.seqlen_q - 1};
  }

  // The range questions: Base's where it hides keys, else every key of every row (its own mask bounds nothing).
  template <class Params>
  static __host__ __device__ __forceinline__ int last_key(const Params& p, int batch, int row) {
    if constexpr (Base::kHidesKeys) return Base::last_key(p, batch, row);
    return p.seqlen_k - 1;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int key_end(const Params& p, int batch, int row_end) {
    if constexpr (Base::kHidesKeys) return Base::key_end(p, batch, row_end);
    return p.seqlen_k;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int first_query(const Params& p, int batch, int key) {
    if constexpr (Base::kHidesKeys) return Base::first_query(p, batch, key);
    return 0;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int first_key(const Params& p, int batch, int row) {
    if constexpr (Base::kHidesEarlyKeys) return Base::first_key(p, batch, row);
    return 0;
  }
  template <class Params>
  static __host__ __device__ __forceinline__ int last_query(const Params& p, int batch, int key) {
    if constexpr (Base::kHidesEarlyKeys) return Base::last_query(p, batch, key);
    return p.seqlen_q - 1;
  }

  template <class Params>
  static __device__ __forceinline__ float score(const Params& p, const ScoreAt& at, float s) {
    const float base = Base::score(p, at, s);
    if constexpr (User::kScore == UserScore::kMod) {
      return User::of(p.variant).score_mod(base * p.variant.scale, at.batch, at.head, user_row(p, at.q),
                                           user_key(p, at.k)) *
             p.variant.inv_scale;
    } else if constexpr (User::kScore == UserScore::kBias) {
      return base + User::of(p.variant).score_bias(at.batch, at.head, user_row(p, at.q), user_key(p, at.k)) *
                        p.variant.inv_scale;
    } else {
      return base;
    }
  }
  template <class Params>
  static __device__ __forceinline__ float score_grad(const Params& p, const ScoreAt& at, float x, float ds) {
    if constexpr (User::kScore == UserScore::kMod) {
      constexpr float kLn2 = 0.693147180559945309f;
      return ds * User::of(p.variant).score_grad(x * kLn2, at.batch, at.head, user_row(p, at.q), user_key(p, at.k));
    } else if constexpr (User::kScore == UserScore::kBias) {
      return ds;
    } else {
      return Base::score_grad(p, at, x, ds);
    }
  }

  // One row's scores: Base's, then the user's function of each key.
  template <class BaseRow>
  struct Row {
    BaseRow base;
    User user;
    int batch, head, q, key_base;
    float scale, inv_scale;
    __device__ __forceinline__ float score(float s, int offset) const {
      const float b = base.score(s, offset);
      if constexpr (User::kScore == UserScore::kMod) {
        return user.score_mod(b * scale, batch, head, q, key_base + offset) * inv_scale;
      } else if constexpr (User::kScore == UserScore::kBias) {
        return b + user.score_bias(batch, head, q, key_base + offset) * inv_scale;
      } else {
        return b;
      }
    }
  };
  template <class Params>
  static __device__ __forceinline__ auto row_scores(const Params& p, const ScoreAt& at) {
    using BaseRow = decltype(Base::row_scores(p, at));
    return Row<BaseRow>{Base::row_scores(p, at), User::of(p.variant), at.batch, at.head, user_row(p, at.q), at.k,
                        p.variant.scale, p.variant.inv_scale};
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own.
struct FlashgenVariantCheckParams {
  int seqlen_q, seqlen_k;
  struct {
    int causal_offset;
  } variant;  // what the masks below read of VariantArgs
};
__global__ void flashgen_variant_check(const FlashgenVariantCheckParams p, int* out) {
  const flashgen::ScoreAt at{0, 0, static_cast<int>(threadIdx.x), static_cast<int>(blockIdx.x)};
  out[threadIdx.x] = flashgen::CausalMask::visible(p, at) + flashgen::NoMask::visible(p, at) +
                     flashgen::CausalMask::row_keys(p, 0, 0, at.q, p.seqlen_k - 1, 0).hidden(at.k);
}
#endif
