// The tensors TMA can describe (tma_layout.hpp): alignment, head_dim, box rows and strides, by the driver's limits.
#include "generator/tma_layout.hpp"

namespace flashgen {

namespace {

constexpr int64_t kMaxStrideBytes = int64_t(1) << 40;

}  // namespace

std::optional<std::string> tma_unsupported_reason(const TmaTensor& t, int box_rows) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return "the base address is not 16-byte aligned";
  // The maps copy boxes of 128-byte rows; a head dim of up to 512 (a values' own) takes at most eight of them.
  if (t.keys_as_columns) {
    if (t.head_dim % 16 != 0) return "keys are not padded to a multiple of 16";
  } else if (t.head_dim % 8 != 0 || t.head_dim > 512) {
    return "head_dim is not a multiple of 8 up to 512";
  }
  if (box_rows < 1 || box_rows > 256) return "a TMA box has at most 256 rows";
  const int64_t strides[3] = {t.row_stride, t.head_stride, t.batch_stride};
  const int64_t extents[3] = {t.seqlen, t.heads, t.batch};
  for (int i = 0; i < 3; ++i) {
    const int64_t bytes = strides[i] * elem_bytes(t.dtype);
    // A dimension of extent 1 never steps, so its stride does not matter (it is replaced when encoding).
    if (extents[i] == 1) continue;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= kMaxStrideBytes) {
      return "stride " + std::to_string(strides[i]) + " is not a positive multiple of 16 bytes below 2^40";
    }
  }
  return std::nullopt;
}

}  // namespace flashgen
