// Which attention tensors TMA can describe (the sm90 families' can_implement asks; launch/tma.hpp encodes them): one
// tensor (batch, seqlen, heads, head_dim; unit head_dim stride) as a 4-D tiled map in boxes of 128-byte rows (64
// columns of 16 bits, 128 of 8). No GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "problem/attention_problem.hpp"

namespace flashgen {

struct TmaTensor {
  const void* data = nullptr;
  DType dtype = DType::kFloat16;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // elements
  // FP8's Vᵀ (batch, heads, head_dim rows, keys): its columns are keys (any multiple of 16), its rows the values'
  // head dim.
  bool keys_as_columns = false;
};

// A call's tensors as TMA sees them: a dense batch's entries, or a packed batch (varlen) as one entry of its total_q
// query and total_k key rows, whose kernels find each sequence's.
struct TmaCallLayout {
  DType dtype = DType::kFloat16;
  int64_t batch = 0, head_dim = 0, rows_q = 0, rows_k = 0;

  template <class Params>
  TmaCallLayout(const AttentionProblem& problem, const Params& p)
      : dtype(problem.dtype),
        batch(problem.varlen ? 1 : p.batch),
        head_dim(problem.head_dim()),
        rows_q(problem.varlen ? p.total_q : p.seqlen_q),
        rows_k(problem.varlen ? p.total_k : p.seqlen_k) {}

  // A tensor of the call's query rows (q, out, dout) or key rows (k, v, dk, dv), with its strides in elements, of
  // the problem's head_dim or of dim (> 0: the values' own, for v and out).
  TmaTensor queries(const void* data, int64_t heads, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                    int64_t dim = 0) const {
    return {data, dtype, batch, rows_q, heads, dim > 0 ? dim : head_dim, batch_stride, row_stride, head_stride};
  }
  TmaTensor keys(const void* data, int64_t heads, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                 int64_t dim = 0) const {
    return {data, dtype, batch, rows_k, heads, dim > 0 ? dim : head_dim, batch_stride, row_stride, head_stride};
  }
};

// Why TMA cannot describe t with boxes of (128 bytes of columns, box_rows rows), or nullopt when it can (then the
// launcher uses the sm90 family; otherwise it falls back to the sm80 one). The limits are the driver's documented
// ones for cuTensorMapEncodeTiled, so a tensor it would refuse falls back instead of failing.
std::optional<std::string> tma_unsupported_reason(const TmaTensor& t, int box_rows);

}  // namespace flashgen
