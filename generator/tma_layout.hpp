// Which attention tensors TMA can describe (the sm90 families' can_implement asks; launch/tma.hpp encodes them): one
// tensor (batch, seqlen, heads, head_dim; unit head_dim stride) as a 4-D tiled map in boxes of 64 columns. No GPU.
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
};

// Why TMA cannot describe t with boxes of (64 columns, box_rows rows), or nullopt when it can (then the
// launcher uses the sm90 family; otherwise it falls back to the sm80 one). The limits are the driver's documented
// ones for cuTensorMapEncodeTiled, so a tensor it would refuse falls back instead of failing.
std::optional<std::string> tma_unsupported_reason(const TmaTensor& t, int box_rows);

}  // namespace flashgen
