// Strided [b, s, h, d] views and device tensors of the [gpu] attention tests: the BHSD and padded views,
// the NaN guard after each buffer, and flashgen_tensor descriptors over a DeviceBuffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "runtime/device_buffer.hpp"

namespace flashgen::test {

// Elements of NaN after every buffer: writes past the end show up as overwritten guard.
constexpr int64_t kGuardElements = 64;

// Memory [b, h, s, d] of a [b, s, h, d] tensor.
inline StridedView bhsd_view(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  StridedView view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  view.stride[0] = heads * seqlen * head_dim;
  view.stride[1] = head_dim;
  view.stride[2] = seqlen * head_dim;
  return view;
}

// Gaps of 8 elements after each head, 16 after each row and 32 after each batch: strides stay multiples
// of 8 as flashgen.h requires, and a kernel that reads past head_dim (e.g. to the 16-column mma step for
// d = 40, 72, 136) picks up NaN instead of a neighbour's finite values.
inline StridedView padded_view(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  StridedView view = StridedView::contiguous(batch, seqlen, heads, head_dim);
  view.stride[2] = head_dim + 8;
  view.stride[1] = heads * view.stride[2] + 16;
  view.stride[0] = seqlen * view.stride[1] + 32;
  return view;
}

// A 16-bit tensor of the given view whose first element is base elements into buffer.
inline flashgen_tensor make_tensor(const DeviceBuffer& buffer, int64_t base, const StridedView& view,
                                   flashgen_dtype dtype) {
  flashgen_tensor tensor{};
  tensor.data = buffer.data(static_cast<size_t>(base) * sizeof(uint16_t));
  tensor.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    tensor.shape[i] = view.shape[i];
    tensor.stride[i] = view.stride[i];
  }
  return tensor;
}

}  // namespace flashgen::test
