// The sm80 backward's ldmatrix lane offsets (bwd_sm80_dkdv.cuh, bwd_sm80_dq.cuh).
#pragma once

#include "sm80_primitives.cuh"

namespace flashgen {
namespace bwd {

using sm80::u16;
using sm80::u32;

// Per-lane ldmatrix byte offsets within a tile of pitch kPitch elements (16-bit).
template <int kPitch>
struct Lanes {
  // A operand from a row-major (rows, k) tile: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
  // (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  static __device__ __forceinline__ u32 a(int lane) { return ((lane & 15) * kPitch + (lane >> 4) * 8) * 2; }
  // B operand of two n-tiles from an (n, k) row-major tile: (n 0-7, k 0-7), (n 0-7, k 8-15),
  // (n 8-15, k 0-7), (n 8-15, k 8-15).
  static __device__ __forceinline__ u32 b(int lane) {
    return ((lane & 7) + ((lane >> 4) << 3)) * kPitch * 2 + ((lane >> 3) & 1) * 16;
  }
  // B operand of two n-tiles from a (k, n) row-major tile, read transposed: (k 0-7, n 0-7),
  // (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  static __device__ __forceinline__ u32 b_trans(int lane) {
    return ((lane & 7) + ((lane >> 3) & 1) * 8) * kPitch * 2 + (lane >> 4) * 16;
  }
  // A operand from a (k, rows) row-major tile, read transposed: the same four matrices as a().
  static __device__ __forceinline__ u32 a_trans(int lane) {
    return ((lane & 7) + (lane >> 4) * 8) * kPitch * 2 + ((lane >> 3) & 1) * 16;
  }
};

}  // namespace bwd
}  // namespace flashgen
