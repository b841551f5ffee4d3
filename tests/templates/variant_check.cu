// Checks every variant policy (templates/variant.cuh) against its own definition, visible(), on the host:
// the per-row forms the kernels test per score and the ranges they derive (block_range.cuh) must agree
// with it for every row, key and block of small problems, both alignments and ragged lengths. A new
// policy joins the list in main(). Built and run by standalone.cmake (nvcc, host code only).
#include <cmath>
#include <cstdio>
#include <utility>

#include <random>
#include <string>
#include <vector>

#include "block_range.cuh"
#include "user_blocks.cuh"
#include "variant.cuh"

namespace {

// What the policies read of AttnFwdParams / AttnBwdParams: the lengths and the variant's arguments, here a causal
// offset and ALiBi's slopes (no window, cap or user variant unless a check sets them).
struct Params {
  static constexpr float kSlopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};  // (batch 2, heads 2)
  int seqlen_q, seqlen_k;
  flashgen::VariantArgs variant{};

  Params(int queries, int keys, int causal_offset) : seqlen_q(queries), seqlen_k(keys) {
    variant.causal_offset = causal_offset;
    variant.alibi_slopes = kSlopes;
    variant.alibi_batch_stride = 2;
    variant.inv_scale = 8.f;
  }
};

int failures = 0;

void fail(const char* policy, const char* what, const Params& p, int a, int b) {
  if (++failures <= 20) {
    std::printf("%s: %s (seqlen_q %d, seqlen_k %d, offset %d, window %d %d, chunk %d; %d, %d)\n", policy, what,
                p.seqlen_q, p.seqlen_k, p.variant.causal_offset, p.variant.window_left, p.variant.window_right,
                p.variant.attention_chunk, a, b);
  }
}

// QueryBlocks' key count, as a callable its __host__ __device__ constructor may call on the host.
struct KeyCount {
  int keys;
  __host__ __device__ int operator()() const { return keys; }
};

template <class Variant>
bool visible(const Params& p, int q, int k) {
  return k < p.seqlen_k && Variant::visible(p, flashgen::ScoreAt{0, 0, q, k});
}

// The per-row forms: row_keys for every row and key base, key_queries for every key and query base, and
// (variants that hide keys) last_key, key_end and first_query, and (variants that hide early keys) first_key and
// last_query.
template <class Variant>
void check_rows(const char* name, const Params& p, int base_step) {
  for (int q = 0; q < p.seqlen_q; ++q) {
    for (int base = 0; base < p.seqlen_k; base += base_step) {
      const auto keys = Variant::row_keys(p, 0, 0, q, p.seqlen_k - 1, base);
      for (int k = base; k < p.seqlen_k + 8; ++k) {
        if (keys.hidden(k - base) == visible<Variant>(p, q, k)) fail(name, "row_keys disagrees", p, q, k);
      }
    }
    if constexpr (Variant::kHidesKeys) {
      const int last = Variant::last_key(p, 0, q);
      if (Variant::key_end(p, 0, q + 1) != last + 1) fail(name, "key_end(q + 1) != last_key(q) + 1", p, q, last);
      for (int k = 0; k < p.seqlen_k; ++k) {
        if (visible<Variant>(p, q, k) && k > last) fail(name, "a key past last_key is visible", p, q, k);
      }
      if (last >= 0 && last < p.seqlen_k && !visible<Variant>(p, q, last)) {
        fail(name, "last_key hidden", p, q, last);
      }
    }
  }
  for (int k = 0; k < p.seqlen_k; ++k) {
    for (int base = 0; base < p.seqlen_q; base += base_step) {
      const auto queries = Variant::key_queries(p, 0, 0, k, base);
      for (int q = base; q < p.seqlen_q; ++q) {
        if (queries.hidden(q - base) == visible<Variant>(p, q, k)) fail(name, "key_queries disagrees", p, q, k);
      }
      auto none = queries;
      none.hide_every_query();
      for (int q = base; q < p.seqlen_q + 8; ++q) {
        if (!none.hidden(q - base)) fail(name, "hide_every_query leaves a query", p, q, k);
      }
    }
  }
  if constexpr (Variant::kHidesKeys) {
    for (int k = 0; k < p.seqlen_k; ++k) {
      const int first = Variant::first_query(p, 0, k);
      for (int q = 0; q < p.seqlen_q; ++q) {
        if (visible<Variant>(p, q, k) && q < first) fail(name, "a query before first_query sees the key", p, q, k);
      }
      if (first >= 0 && first < p.seqlen_q && !visible<Variant>(p, first, k)) {
        fail(name, "first_query does not see the key", p, first, k);
      }
    }
  }
  if constexpr (Variant::kHidesEarlyKeys) {
    for (int q = 0; q < p.seqlen_q; ++q) {
      const int first = Variant::first_key(p, 0, q);
      for (int k = 0; k < p.seqlen_k; ++k) {
        if (visible<Variant>(p, q, k) && k < first) fail(name, "a key before first_key is visible", p, q, k);
      }
      if (first >= 0 && first < p.seqlen_k && !visible<Variant>(p, q, first)) {
        fail(name, "first_key hidden", p, q, first);
      }
    }
    for (int k = 0; k < p.seqlen_k; ++k) {
      const int last = Variant::last_query(p, 0, k);
      for (int q = 0; q < p.seqlen_q; ++q) {
        if (visible<Variant>(p, q, k) && q > last) fail(name, "a query past last_query sees the key", p, q, k);
      }
      if (last >= 0 && last < p.seqlen_q && !visible<Variant>(p, last, k)) {
        fail(name, "last_query does not see the key", p, last, k);
      }
    }
  }
}

// The forward's key blocks of each query block: none visible outside [begin, end) (skipped), all visible
// in [full_begin, full_end) (no mask); the backward's query blocks of each key block likewise; and the two
// agree on which (query block, key block) pairs meet, counted over whole query blocks as the backward's
// dQ turns count them.
template <class Variant, int kBlockM, int kBlockN>
void check_blocks(const char* name, const Params& p) {
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  for (int m = 0; m < m_blocks; ++m) {
    const int row_begin = m * kBlockM;
    const int rows = p.seqlen_q - row_begin < kBlockM ? p.seqlen_q - row_begin : kBlockM;
    const flashgen::KeyBlocks<Variant, kBlockN> blocks(p, 0, row_begin, rows);
    const int full_end = blocks.full_end(p, 0, row_begin);
    const int full_begin = blocks.full_begin(p, 0, row_begin + rows - 1, full_end);
    if (!(0 <= blocks.begin && blocks.begin <= full_begin && full_begin <= full_end && full_end <= blocks.end)) {
      fail(name, "key block bounds out of order", p, m, blocks.begin);
    }
    for (int q = row_begin; q < row_begin + rows; ++q) {
      for (int k = 0; k < p.seqlen_k; ++k) {
        if (visible<Variant>(p, q, k) && k >= blocks.key_end) fail(name, "visible key past key_end", p, q, k);
        if (visible<Variant>(p, q, k) && (k / kBlockN >= blocks.end || k / kBlockN < blocks.begin)) {
          fail(name, "visible key in a skipped block", p, q, k);
        }
      }
      for (int k = full_begin * kBlockN; k < full_end * kBlockN; ++k) {
        if (!visible<Variant>(p, q, k)) fail(name, "hidden key in a full key block", p, q, k);
      }
    }
  }
  for (int n = 0; n < n_blocks; ++n) {
    const int key_begin = n * kBlockN;
    const flashgen::QueryBlocks<Variant, kBlockM, kBlockN> queries(p, 0, key_begin,
                                                                    KeyCount{p.seqlen_k - key_begin});
    if (!Variant::kHidesEarlyKeys && queries.end != m_blocks) fail(name, "query blocks end", p, n, queries.end);
    if (!(0 <= queries.begin && queries.begin <= queries.full_begin && queries.full_begin <= queries.full_end &&
          queries.full_end <= queries.end && queries.end <= m_blocks)) {
      fail(name, "query block bounds out of order", p, n, queries.begin);
    }
    for (int k = key_begin; k < key_begin + kBlockN; ++k) {
      for (int q = 0; q < p.seqlen_q; ++q) {
        if (visible<Variant>(p, q, k) && (q / kBlockM < queries.begin || q / kBlockM >= queries.end)) {
          fail(name, "visible key in a skipped query block", p, q, k);
        }
        if (!visible<Variant>(p, q, k) && q / kBlockM >= queries.full_begin && q / kBlockM < queries.full_end) {
          fail(name, "hidden key in a full query block", p, q, k);
        }
      }
    }
    for (int m = 0; m < m_blocks; ++m) {
      const flashgen::KeyBlocks<Variant, kBlockN> blocks(p, 0, m * kBlockM, kBlockM);
      const bool by_keys = n >= blocks.begin && n < blocks.end;
      const bool by_queries = m >= queries.begin && m < queries.end;
      if (by_keys != by_queries) fail(name, "key and query ranges disagree on a pair of blocks", p, m, n);
    }
  }
}

template <class Variant>
void check_params(const char* name, const Params& p, int base_step) {
  check_rows<Variant>(name, p, base_step);
  check_blocks<Variant, 16, 16>(name, p);
  check_blocks<Variant, 32, 8>(name, p);
  check_blocks<Variant, 8, 32>(name, p);
}

template <class Variant>
void check(const char* name) {
  for (int seqlen_q : {1, 5, 16, 33, 70})
    for (int seqlen_k : {1, 7, 16, 40, 77})
      for (int offset = -20; offset <= 20 + seqlen_k; ++offset) {  // top-left 0, bottom-right seqlen_k - seqlen_q
        check_params<Variant>(name, Params{seqlen_q, seqlen_k, offset}, 3);
      }
}

// A window's sides from a single key to past every key (the launcher's bound for an unbounded side is
// seqlen_q + seqlen_k), over fewer sizes and offsets than check(): it has two more parameters.
template <class Variant>
void check_window(const char* name) {
  for (int seqlen_q : {1, 5, 33, 70})
    for (int seqlen_k : {1, 16, 77})
      for (int left : {0, 1, 9, 40, 147})
        for (int right : {0, 3, 20, 147})
          for (int offset = -20; offset <= 20 + seqlen_k; offset += 7) {
            Params p{seqlen_q, seqlen_k, offset};
            p.variant.window_left = left, p.variant.window_right = right;
            check_params<Variant>(name, p, 11);
          }
}

// A chunk (Llama 4's attention_chunk; ChunkedWindow) over the window shapes that carry one: chunked causal (the left side
// bounded as the launcher bounds it, the right 0), bidirectional chunks (both sides unbounded), and a window
// narrower or wider than the chunk; chunks of one key, shorter and longer than the blocks, and than every key.
template <class Variant>
void check_chunk(const char* name) {
  for (int seqlen_q : {1, 5, 33, 70})
    for (int seqlen_k : {1, 16, 77})
      for (const auto [left, right] : {std::pair{seqlen_k, 0}, std::pair{seqlen_k, seqlen_q}, std::pair{9, 0},
                                       std::pair{40, 3}})
        for (int chunk : {1, 3, 16, 40, 77})
          for (int offset = -20; offset <= 20 + seqlen_k; offset += 5) {
            Params p{seqlen_q, seqlen_k, offset};
            p.variant.window_left = left, p.variant.window_right = right;
            p.variant.attention_chunk = chunk < seqlen_k ? chunk : seqlen_k;
            // visible() against the chunk's own definition: in the window, and in the diagonal's chunk.
            const auto chunk_of = [&](int x) {  // floor(x / C), x of either sign
              return x >= 0 ? x / p.variant.attention_chunk : -((-x - 1) / p.variant.attention_chunk) - 1;
            };
            for (int q = 0; q < seqlen_q; ++q)
              for (int k = 0; k < seqlen_k; ++k) {
                const int diagonal = q + offset;
                const bool want = k >= diagonal - left && k <= diagonal + right && chunk_of(k) == chunk_of(diagonal);
                if (visible<Variant>(p, q, k) != want) fail(name, "visible() is not the chunk's definition", p, q, k);
              }
            check_params<Variant>(name, p, 11);
          }
}

// SoftCap's score is cap · tanh(q·k · scale / cap) once the kernels scale it, and its score_grad, given that
// score in log2 units, the derivative of score with respect to q·k (a central difference); visibility is its
// mask's (above).
void check_softcap() {
  const float scale = 0.125f, cap = 5.f;
  Params p{4, 4, 0};
  p.variant.softcap_in = scale / cap, p.variant.softcap_out = cap / scale;
  p.variant.softcap_grad = float(1 / (cap * 1.4426950408889634));
  p.variant.scale_log2 = float(scale * 1.4426950408889634);
  using Capped = flashgen::SoftCap<flashgen::CausalMask>;
  for (float s = -400.f; s <= 400.f; s += 12.5f) {
    const flashgen::ScoreAt at{0, 0, 1, 1};
    const double want = cap * std::tanh(double(s) * scale / cap);
    if (std::fabs(Capped::score(p, at, s) * scale - want) > 1e-4 * cap) fail("SoftCap", "score", p, int(s), 0);
    const double h = 1e-2;
    const double slope = (Capped::score(p, at, float(s + h)) - Capped::score(p, at, float(s - h))) / (2 * h);
    const float x = Capped::score(p, at, s) * p.variant.scale_log2;
    if (std::fabs(Capped::score_grad(p, at, x, 1.f) - slope) > 1e-2) fail("SoftCap", "score_grad", p, int(s), 0);
    // The row form, in units of score_unit (the forward kernels fold the unit into their softmax scale).
    if (Capped::row_scores(p, at).score(s, 3) * Capped::score_unit(p) != Capped::score(p, at, s)) {
      fail("SoftCap", "row_scores", p, int(s), 0);
    }
  }
}

// Alibi's score is Base's minus slope · |q + offset - k| / scale, slope per (batch, head), and its score_grad,
// given that score in log2 units, Base's derivative with respect to q·k (a central difference): checked over a
// soft cap, whose derivative reads the score, and visibility is Base's (above).
void check_alibi() {
  const float scale = 0.125f, cap = 5.f;
  Params p{9, 13, 4};
  p.variant.inv_scale = 1 / scale;
  p.variant.softcap_in = scale / cap, p.variant.softcap_out = cap / scale;
  p.variant.softcap_grad = float(1 / (cap * 1.4426950408889634));
  p.variant.scale_log2 = float(scale * 1.4426950408889634);
  using Biased = flashgen::Alibi<flashgen::CausalMask>;
  using CappedBiased = flashgen::Alibi<flashgen::SoftCap<flashgen::CausalMask>>;
  for (int batch = 0; batch < 2; ++batch)
    for (int head = 0; head < 2; ++head)
      for (int q = 0; q < p.seqlen_q; ++q)
        for (int k = 0; k < p.seqlen_k; ++k) {
          const flashgen::ScoreAt at{batch, head, q, k};
          const double slope = Params::kSlopes[batch * 2 + head], s = 3.0 * q - 2.0 * k;
          const double bias = -slope * std::abs(q + p.variant.causal_offset - k);
          if (std::fabs(Biased::score(p, at, float(s)) * scale - (s * scale + bias)) > 1e-5) {
            fail("Alibi", "score", p, q, k);
          }
          if (Biased::score_grad(p, at, 1.f, 0.75f) != 0.75f) fail("Alibi", "score_grad", p, q, k);
          // The row form the forward kernels apply, from a key base before k, alone (in q·k units) and over a cap.
          for (int base : {0, k / 2, k}) {
            const flashgen::ScoreAt from{batch, head, q, base};
            if (Biased::score_unit(p) != 1.f ||
                std::fabs(Biased::row_scores(p, from).score(float(s), k - base) - Biased::score(p, at, float(s))) >
                    1e-4f) {
              fail("Alibi", "row_scores", p, q, k);
            }
            if (std::fabs(CappedBiased::row_scores(p, from).score(float(s), k - base) * CappedBiased::score_unit(p) -
                          CappedBiased::score(p, at, float(s))) > 1e-4f) {
              fail("Alibi<SoftCap>", "row_scores", p, q, k);
            }
          }
          const double want = cap * std::tanh(s * scale / cap) + bias;
          if (std::fabs(CappedBiased::score(p, at, float(s)) * scale - want) > 1e-4 * cap) {
            fail("Alibi<SoftCap>", "score", p, q, k);
          }
          const double h = 1e-2;
          const double d = (CappedBiased::score(p, at, float(s + h)) - CappedBiased::score(p, at, float(s - h))) / (2 * h);
          const float x = CappedBiased::score(p, at, float(s)) * p.variant.scale_log2;
          if (std::fabs(CappedBiased::score_grad(p, at, x, 1.f) - d) > 1e-2) fail("Alibi<SoftCap>", "score_grad", p, q, k);
        }
}

// A user mask's classes through the walks the class kernels run (user_blocks.cuh), on tiles of several shapes: query
// block m visits key block n exactly when n's query blocks hold m (the backward's dQ counts and dkdv walks agree),
// every tile with a visible key lies in its query block's band, each key block's query blocks start and end no
// earlier than the previous one's, every full run holds full tiles only, and a mask whose runs already grow with the
// row (documents under causal) keeps its runs as they were.
void check_user_bands() {
  std::mt19937 rng(25);
  struct Shape {
    const char* name;
    int rows, cols;
  };
  for (const Shape& shape : {Shape{"square", 9, 9}, Shape{"wide", 5, 17}, Shape{"tall", 23, 4}, Shape{"one", 1, 1}}) {
    for (int kind = 0; kind < 4; ++kind) {  // random; documents under causal; rows reversed; with empty rows
      const int groups = 2, rows = shape.rows, cols = shape.cols;
      std::vector<unsigned char> tiles(size_t(groups) * rows * cols);
      std::vector<int> row_ints(size_t(groups) * rows * 4), col_ints(size_t(groups) * cols * 4);
      std::vector<int> doc_start(static_cast<size_t>(rows));
      for (int m = 0, start = 0; m < rows; ++m) {
        if (rng() % 3 == 0) start = m;
        doc_start[size_t(m)] = start;
      }
      for (int g = 0; g < groups; ++g)
        for (int m = 0; m < rows; ++m)
          for (int n = 0; n < cols; ++n) {
            int tile = static_cast<int>(rng() % 3);
            const int row = kind == 2 ? rows - 1 - m : m;
            if (kind == 1 || kind == 2) {  // a document of whole blocks: full before the diagonal, partial on it
              const int diagonal = row * cols / rows;
              tile = n < doc_start[size_t(row)] * cols / rows || n > diagonal ? 0 : n == diagonal ? 1 : 2;
            }
            if (kind == 3 && m % 3 == 1) tile = 0;
            tiles[(size_t(g) * rows + m) * cols + n] = static_cast<unsigned char>(tile);
          }
      flashgen::UserBlockClasses c{};
      c.rows = row_ints.data(), c.cols = col_ints.data(), c.tiles = tiles.data();
      c.row_blocks = rows, c.col_blocks = cols, c.heads = groups, c.head_group = 1;
      for (int g = 0; g < groups; ++g)
        for (int m = 0; m < rows; ++m) flashgen::user_query_block_walk(c, g, m);
      const std::vector<int> runs = row_ints;  // before the bands
      for (int g = 0; g < groups; ++g) {
        for (int n = 0; n < cols; ++n) flashgen::user_key_block_walk(c, g, n);
        for (int m = 0; m < rows; ++m) flashgen::user_query_block_band(c, g, m);
      }
      const std::string label = std::string("user bands, ") + shape.name + " tiles, kind " + std::to_string(kind);
      const char* name = label.c_str();
      const Params p{rows, cols, 0};  // for fail()'s report: the shape
      for (int g = 0; g < groups; ++g) {
        const int* row = row_ints.data() + size_t(g) * rows * 4;
        const int* col = col_ints.data() + size_t(g) * cols * 4;
        for (int m = 0; m < rows; ++m) {
          for (int n = 0; n < cols; ++n) {
            const bool in_row = row[4 * m] <= n && n < row[4 * m + 1];
            const bool in_col = col[4 * n] <= m && m < col[4 * n + 1];
            if (in_row != in_col) fail(name, "band: query and key blocks disagree", p, m, n);
            const int tile = tiles[(size_t(g) * rows + m) * cols + n];
            if (tile != 0 && !in_row) fail(name, "band: a visible tile is left out", p, m, n);
            const bool row_full = runs[(size_t(g) * rows + m) * 4 + 2] <= n && n < runs[(size_t(g) * rows + m) * 4 + 3];
            const bool col_full = col[4 * n + 2] <= m && m < col[4 * n + 3];
            if ((row_full || col_full) && tile != 2) fail(name, "band: a full run holds a partial tile", p, m, n);
          }
          if (kind == 1 && (row[4 * m] != runs[(size_t(g) * rows + m) * 4] ||
                            row[4 * m + 1] != runs[(size_t(g) * rows + m) * 4 + 1])) {
            fail(name, "band: a run that grows with the row was widened", p, m, row[4 * m]);
          }
        }
        for (int n = 1; n < cols; ++n) {
          if (col[4 * n] < col[4 * (n - 1)] || col[4 * n + 1] < col[4 * (n - 1) + 1]) {
            fail(name, "band: a key block's query blocks start or end before the previous one's", p, n, kind);
          }
        }
      }
    }
  }
}

}  // namespace

int main() {
  check_user_bands();
  check<flashgen::SoftCap<flashgen::NoMask>>("SoftCap<NoMask>");
  check<flashgen::SoftCap<flashgen::CausalMask>>("SoftCap<CausalMask>");
  check_softcap();
  check<flashgen::Alibi<flashgen::CausalMask>>("Alibi<CausalMask>");
  check_window<flashgen::Alibi<flashgen::SoftCap<flashgen::SlidingWindow>>>("Alibi<SoftCap<SlidingWindow>>");
  check_alibi();
  check<flashgen::NoMask>("NoMask");
  check<flashgen::CausalMask>("CausalMask");
  check_window<flashgen::SlidingWindow>("SlidingWindow");
  check_chunk<flashgen::ChunkedWindow>("ChunkedWindow");
  check_chunk<flashgen::Alibi<flashgen::SoftCap<flashgen::ChunkedWindow>>>("Alibi<SoftCap<ChunkedWindow>>");
  check_window<flashgen::SoftCap<flashgen::SlidingWindow>>("SoftCap<SlidingWindow>");
  if (failures > 0) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("variant policies agree with visible()\n");
  return 0;
}
