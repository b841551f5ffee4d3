// A caller's tensor as the layers below api/ take it: api/ translates flashgen.h's flashgen_tensor into it field for
// field, and launch/ checks it, naming the caller's argument ("q.stride[3] must be 1 ...").
#pragma once

#include <cstdint>

#include "problem/attention_problem.hpp"

namespace flashgen {

// A [batch, seqlen, heads, head_dim] view of 16-bit elements in device memory.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat16;     // the caller's value as given: launch/ refuses one outside the enumerators
  int64_t shape[4] = {0, 0, 0, 0};   // [batch, seqlen, heads, head_dim]
  int64_t stride[4] = {0, 0, 0, 0};  // elements; launch/ asks stride[3] == 1 and the others multiples of 8
};

// A TensorView over a contiguous [batch, seqlen, heads, head_dim] buffer (BSHD).
inline TensorView bshd_view(void* data, DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.shape[0] = batch, t.shape[1] = seqlen, t.shape[2] = heads, t.shape[3] = head_dim;
  t.stride[0] = seqlen * heads * head_dim, t.stride[1] = heads * head_dim, t.stride[2] = head_dim, t.stride[3] = 1;
  return t;
}

}  // namespace flashgen
