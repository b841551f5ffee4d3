// Packed variable-length batches in the kernels: which configs serve them (kVarlen, and kPaged over a paged
// cache), and how a block finds its own sequence's rows, lengths and causal offset in the packed tensors
// (attn_params.cuh).
#pragma once

#include "attn_params.cuh"

namespace flashgen {

// Cfg::kVarlen where the generated config header names it (only varlen configs do), else false.
template <class Cfg, class = void>
struct ConfigVarlen {
  static constexpr bool value = false;
};
template <class Cfg>
struct ConfigVarlen<Cfg, decltype(void(Cfg::kVarlen))> {
  static constexpr bool value = Cfg::kVarlen;
};

// Cfg::kPaged where the generated config header names it (packed batches over a paged cache), else false.
template <class Cfg, class = void>
struct ConfigPaged {
  static constexpr bool value = false;
};
template <class Cfg>
struct ConfigPaged<Cfg, decltype(void(Cfg::kPaged))> {
  static constexpr bool value = Cfg::kPaged;
};

__device__ inline int clamp_offset(int offset, int low, int high) { return min(max(offset, low), high); }

// The rows of packed sequence `sequence` in q's rows [q_begin, q_begin + seqlen_q) and k's [k_begin,
// k_begin + seqlen_k), offsets clamped into the tensors; the grid reaches max_seqlen_q (p.seqlen_q) rows, so
// a longer sequence's rows past it are not computed, and a packed sequence's keys past max_seqlen_k
// (p.seqlen_k, the backward grid's reach) are not seen: offsets that break the arguments' contract give
// wrong values, never a wait for key blocks that do not run.
struct SequenceRows {
  int q_begin, seqlen_q, k_begin, seqlen_k;
};

// With paged keys (paged: a block table holds each sequence's own pages) every sequence's keys start at its
// key 0, and only their count comes from the offsets (or seqused_k), clamped into [0, total_k].
template <class Params>
__device__ inline SequenceRows sequence_rows(const Params& p, int sequence, bool paged = false) {
  const int q_begin = clamp_offset(p.cu_seqlens_q[sequence], 0, p.total_q);
  const int q_end = clamp_offset(p.cu_seqlens_q[sequence + 1], q_begin, p.total_q);
  if (paged) {
    const int keys = p.seqused_k != nullptr ? p.seqused_k[sequence]
                                            : p.cu_seqlens_k[sequence + 1] - p.cu_seqlens_k[sequence];
    return {q_begin, min(q_end - q_begin, p.seqlen_q), 0, clamp_offset(keys, 0, p.total_k)};
  }
  const int k_begin = clamp_offset(p.cu_seqlens_k[sequence], 0, p.total_k);
  const int k_end = p.seqused_k != nullptr ? clamp_offset(k_begin + max(p.seqused_k[sequence], 0), k_begin, p.total_k)
                                           : clamp_offset(p.cu_seqlens_k[sequence + 1], k_begin, p.total_k);
  return {q_begin, min(q_end - q_begin, p.seqlen_q), k_begin, min(k_end - k_begin, p.seqlen_k)};
}

// sequence_rows for the FP8 forward (kFp8), whose Vᵀ holds round_up(max_seqlen_k, 128) keys of a paged sequence
// (attn_params.cuh's fp8_values_t_origin): a paged sequence's keys past max_seqlen_k are not seen, as a packed one's.
template <bool kFp8, class Params>
__device__ inline SequenceRows fp8_sequence_rows(const Params& p, int sequence, bool paged) {
  SequenceRows rows = sequence_rows(p, sequence, paged);
  if (kFp8 && paged) rows.seqlen_k = min(rows.seqlen_k, p.seqlen_k);
  return rows;
}

// Points p (a block's own copy of the kernel's params) at packed sequence `sequence`, whose rows are s: q, k,
// v, o and lse at its first rows, seqlen_q and seqlen_k its lengths, causal_offset its alignment's. Returns
// false when the block's first query row, m_start, lies past the sequence's end: the block has nothing to do.
__device__ inline bool bind_sequence(AttnFwdParams& p, int sequence, const SequenceRows& s, int m_start) {
  p.seqlen_q = s.seqlen_q, p.seqlen_k = s.seqlen_k;
  if (m_start >= p.seqlen_q) return false;
  p.variant.causal_offset = p.causal_bottom_right ? p.seqlen_k - p.seqlen_q : 0;
  using u16 = unsigned short;
  p.q = static_cast<const u16*>(p.q) + s.q_begin * p.q_row_stride;
  p.o = static_cast<u16*>(p.o) + s.q_begin * p.o_row_stride;
  p.k = static_cast<const u16*>(p.k) + s.k_begin * p.k_row_stride;  // k_begin is 0 with paged keys
  p.v = static_cast<const u16*>(p.v) + s.k_begin * p.v_row_stride;
  if (p.block_table != nullptr) p.block_table += sequence * p.block_table_stride;
  if (p.lse != nullptr) p.lse += s.q_begin;
  return true;
}

// The same, reading the sequence's rows first.
__device__ inline bool bind_sequence(AttnFwdParams& p, int sequence, int m_start) {
  return bind_sequence(p, sequence, sequence_rows(p, sequence, p.block_table != nullptr), m_start);
}

// The same for the backward's kernels: every tensor at the sequence's first rows, the workspace arrays at
// its first workspace row (pad: the config's kPadRows; attn_params.cuh's packed_workspace_first_row). The
// caller decides from p.seqlen_q and p.seqlen_k whether its block has work.
__device__ inline void bind_sequence(AttnBwdParams& p, int sequence, const SequenceRows& s, int head_dim, int pad) {
  p.seqlen_q = s.seqlen_q, p.seqlen_k = s.seqlen_k;
  p.variant.causal_offset = p.causal_bottom_right ? p.seqlen_k - p.seqlen_q : 0;
  using u16 = unsigned short;
  p.q = static_cast<const u16*>(p.q) + s.q_begin * p.q_row_stride;
  p.o = static_cast<u16*>(p.o) + s.q_begin * p.o_row_stride;
  p.dout = static_cast<const u16*>(p.dout) + s.q_begin * p.do_row_stride;
  p.dq = static_cast<u16*>(p.dq) + s.q_begin * p.dq_row_stride;
  p.k = static_cast<const u16*>(p.k) + s.k_begin * p.k_row_stride;
  p.v = static_cast<const u16*>(p.v) + s.k_begin * p.v_row_stride;
  p.dk = static_cast<u16*>(p.dk) + s.k_begin * p.dk_row_stride;
  p.dv = static_cast<u16*>(p.dv) + s.k_begin * p.dv_row_stride;
  p.lse += s.q_begin;
  const long long row0 = packed_workspace_first_row(s.q_begin, sequence, pad);
  p.dsum += row0;
  if (p.lse_log2 != nullptr) p.lse_log2 += row0;
  if (p.dq_accum != nullptr) p.dq_accum += row0 * head_dim;
  if (p.dq_semaphore != nullptr) {  // row0: a multiple of 128
    p.dq_semaphore += row0 / kBwdSm90SemaphoreRows * kBwdSm90SemaphoreInts;
  }
}

// The same, reading the sequence's rows first.
__device__ inline void bind_sequence(AttnBwdParams& p, int sequence, int head_dim, int pad) {
  bind_sequence(p, sequence, sequence_rows(p, sequence), head_dim, pad);
}

// Index of (batch, head)'s first row in the per-row arrays (the forward's LSE, the backward's D and dQ
// accumulator rows): (batch, heads_q, rows) for a dense batch; (heads_q, total_q) for a packed one, whose
// arrays bind_sequence pointed at the sequence's first row.
template <bool kVarlen, class Params>
__device__ inline long long row_base(const Params& p, int batch, int head, int rows) {
  if constexpr (kVarlen) return static_cast<long long>(head) * p.total_q;
  return (static_cast<long long>(batch) * p.heads_q + head) * rows;
}

template <bool kVarlen>
__device__ inline long long lse_index(const AttnFwdParams& p, int batch, int head, int row) {
  return row_base<kVarlen>(p, batch, head, p.seqlen_q) + row;
}

}  // namespace flashgen
