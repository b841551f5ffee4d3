// Packed variable-length batches in the kernels: which configs serve them (kVarlen), and how a block
// finds its own sequence's rows, lengths and causal offset in the packed tensors (attn_params.cuh).
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

__device__ inline int clamp_offset(int offset, int low, int high) { return min(max(offset, low), high); }

// Points p (a block's own copy of the kernel's params) at packed sequence `sequence`: q, k, v, o and lse
// at its first rows, seqlen_q and seqlen_k its lengths, causal_offset its alignment's. Offsets are clamped
// into the tensors. Returns false when the block's first query row, m_start, lies past the sequence's end:
// the block has nothing to do.
__device__ inline bool bind_sequence(AttnFwdParams& p, int sequence, int m_start) {
  const int q_begin = clamp_offset(p.cu_seqlens_q[sequence], 0, p.total_q);
  const int q_end = clamp_offset(p.cu_seqlens_q[sequence + 1], q_begin, p.total_q);
  const int k_begin = clamp_offset(p.cu_seqlens_k[sequence], 0, p.total_k);
  const int k_end = p.seqused_k != nullptr ? clamp_offset(k_begin + max(p.seqused_k[sequence], 0), k_begin, p.total_k)
                                           : clamp_offset(p.cu_seqlens_k[sequence + 1], k_begin, p.total_k);
  // The grid reaches seqlen_q (max_seqlen_q) rows: a longer sequence's rows past it are not computed.
  p.seqlen_q = min(q_end - q_begin, p.seqlen_q);
  p.seqlen_k = k_end - k_begin;
  if (m_start >= p.seqlen_q) return false;
  p.causal_offset = p.causal_bottom_right ? p.seqlen_k - p.seqlen_q : 0;
  using u16 = unsigned short;
  p.q = static_cast<const u16*>(p.q) + q_begin * p.q_row_stride;
  p.o = static_cast<u16*>(p.o) + q_begin * p.o_row_stride;
  p.k = static_cast<const u16*>(p.k) + k_begin * p.k_row_stride;
  p.v = static_cast<const u16*>(p.v) + k_begin * p.v_row_stride;
  if (p.lse != nullptr) p.lse += q_begin;
  return true;
}

// Index of (batch, head, row)'s LSE: (batch, heads_q, seqlen_q) for a dense batch; (heads_q, total_q) for a
// packed one, whose lse bind_sequence pointed at the sequence's first row.
template <bool kVarlen>
__device__ inline long long lse_index(const AttnFwdParams& p, int batch, int head, int row) {
  if constexpr (kVarlen) return static_cast<long long>(head) * p.total_q + row;
  return (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q + row;
}

}  // namespace flashgen
