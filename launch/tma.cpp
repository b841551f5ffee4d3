// TMA descriptor encoding for the sm90 family, of the tensors generator/tma_layout.hpp accepts.
#include "launch/tma.hpp"

#include <cuda.h>

#include <cstring>

#include "flashgen/error.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {

// Copied bytewise; TMA itself needs the 64-byte alignment TmaDescriptor has in kernel parameter space.
static_assert(sizeof(TmaDescriptor) == sizeof(CUtensorMap), "TmaDescriptor must have CUtensorMap's size");

void encode_tma_map(TmaDescriptor* map, const TmaTensor& t, int box_rows) {
  if (auto why = tma_unsupported_reason(t, box_rows)) fail(Status::kInvalidArgument, "TMA: " + *why);
  const cuuint64_t dims[4] = {cuuint64_t(t.head_dim), cuuint64_t(t.seqlen), cuuint64_t(t.heads),
                              cuuint64_t(t.batch)};
  // Strides of dimensions 1..3 in bytes. An extent-1 dimension gets its predecessor's span, a stride
  // the driver accepts whatever the caller's (unused) stride was.
  cuuint64_t strides[3];
  const int64_t given[3] = {t.row_stride, t.head_stride, t.batch_stride};
  const int64_t elem = elem_bytes(t.dtype);
  int64_t span = t.head_dim * elem;
  for (int i = 0; i < 3; ++i) {
    const int64_t bytes = dims[i + 1] == 1 ? (span + 15) / 16 * 16 : given[i] * elem;
    strides[i] = cuuint64_t(bytes);
    span = bytes * int64_t(dims[i + 1]);
  }
  const cuuint32_t box[4] = {cuuint32_t(128 / elem), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = is_fp8(t.dtype)                ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                  : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap encoded;
  FLASHGEN_CU_CHECK(cuTensorMapEncodeTiled(&encoded, type, 4, const_cast<void*>(t.data), dims, strides, box,
                                           element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  std::memcpy(map, &encoded, sizeof encoded);
}

bool tma_maps_retargetable() {
  static const bool retargetable = [] {
    const TmaTensor shape{nullptr, DType::kFloat16, 2, 256, 4, 128, 256 * 4 * 128, 4 * 128, 128};
    const uint64_t addresses[2] = {uint64_t(1) << 20, (uint64_t(1) << 46) + 4096};
    TmaDescriptor maps[2];
    for (int i = 0; i < 2; ++i) {
      TmaTensor t = shape;
      t.data = reinterpret_cast<const void*>(addresses[i]);
      try {
        encode_tma_map(&maps[i], t, 64);
      } catch (const Error&) {
        return false;
      }
      uint64_t stored = 0;
      std::memcpy(&stored, &maps[i], sizeof stored);
      if (stored != addresses[i]) return false;
    }
    return std::memcmp(reinterpret_cast<const char*>(&maps[0]) + 8, reinterpret_cast<const char*>(&maps[1]) + 8,
                       sizeof(TmaDescriptor) - 8) == 0;
  }();
  return retargetable;
}

void retarget_tma_map(TmaDescriptor* map, const void* data) {
  const uint64_t address = reinterpret_cast<uint64_t>(data);
  std::memcpy(map, &address, sizeof address);
}

}  // namespace flashgen
