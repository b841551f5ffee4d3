// Global -> shared tile copies with cp.async, shared by every sm80 kernel family: rows of up to
// head_dim 16-bit elements land in padded shared-memory rows, and what lies past the tensor (rows past
// the end, the head_dim padding) is zero-filled rather than read.
#pragma once

#include "sm80_primitives.cuh"

namespace flashgen {
namespace sm80 {

// kThreads threads copy tiles whose rows hold kValidChunks 16-byte chunks of data, padded with zeros to
// kChunks chunks, into shared-memory rows of kRow elements.
template <int kThreads, int kRow, int kChunks, int kValidChunks>
struct TileCopy {
  // Copies rows [0, kRows) of a (rows, head_dim) global tile to smem at byte address smem_tile,
  // zero-filling rows past rows_valid (which may be <= 0) and the head_dim padding. Zero-fill copies
  // read nothing but still name `inside`, an address inside the tensor. Consecutive threads take
  // consecutive 16-byte chunks, so each warp reads whole rows.
  template <int kRows>
  static __device__ __forceinline__ void load(u32 smem_tile, const u16* gmem, long long row_stride,
                                                   int rows_valid, const u16* inside, int tid) {
    if constexpr (kThreads % kChunks == 0) {
      // Each thread keeps one chunk column and steps down kRowsPerPass rows a pass: one running
      // pointer instead of a 64-bit offset per pass held across the main loop.
      constexpr int kRowsPerPass = kThreads / kChunks;
      const int row0 = tid / kChunks;
      const int chunk = tid % kChunks;
      const u16* src = gmem + row0 * row_stride + chunk * 8;
      const long long step = kRowsPerPass * row_stride;
      u32 dst = smem_tile + (row0 * kRow + chunk * 8) * 2;
#pragma unroll
      for (int row = 0; row < kRows; row += kRowsPerPass) {
        if (kRows % kRowsPerPass == 0 || row + row0 < kRows) {
          const bool valid = row + row0 < rows_valid && chunk < kValidChunks;
          sm80::cp_async_16(dst, valid ? src : inside, valid);
        }
        src += step;
        dst += kRowsPerPass * kRow * 2;
      }
    } else {
      constexpr int kTotal = kRows * kChunks;
#pragma unroll
      for (int i0 = 0; i0 < kTotal; i0 += kThreads) {
        const int i = i0 + tid;
        if (kTotal % kThreads == 0 || i < kTotal) {
          const int row = i / kChunks;
          const int chunk = i % kChunks;
          const bool valid = row < rows_valid && chunk < kValidChunks;
          const u16* src = valid ? gmem + row * row_stride + chunk * 8 : inside;
          sm80::cp_async_16(smem_tile + (row * kRow + chunk * 8) * 2, src, valid);
        }
      }
    }
  }

  // load() for the K or V rows of a paged cache: row r of the tile is key key0 + r of its sequence, in row
  // (key0 + r) % page_size of page pages[(key0 + r) / page_size] (clamped into [0, num_pages)), pages being
  // page_stride elements apart from base, rows row_stride. Rows past rows_valid are zero-filled.
  template <int kRows>
  static __device__ __forceinline__ void load_paged(u32 smem_tile, const u16* base, long long page_stride,
                                                    long long row_stride, const int* pages, int page_size,
                                                    int num_pages, int key0, int rows_valid, int tid) {
    constexpr int kTotal = kRows * kChunks;
#pragma unroll 8
    for (int i0 = 0; i0 < kTotal; i0 += kThreads) {
      const int i = i0 + tid;
      if (kTotal % kThreads == 0 || i < kTotal) {
        const int row = i / kChunks;
        const int chunk = i % kChunks;
        const bool valid = row < rows_valid && chunk < kValidChunks;
        const u16* src = base;
        if (valid) {
          const int key = key0 + row;
          const int page = min(max(pages[key / page_size], 0), num_pages - 1);
          src = base + page * page_stride + (key % page_size) * row_stride + chunk * 8;
        }
        sm80::cp_async_16(smem_tile + (row * kRow + chunk * 8) * 2, src, valid);
      }
    }
  }
};

}  // namespace sm80
}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own.
__global__ void flashgen_tile_copy_check(const flashgen::sm80::u16* src, int rows) {
  extern __shared__ unsigned char smem[];
  flashgen::sm80::TileCopy<128, 136, 16, 16>::load<64>(flashgen::sm80::smem_addr(smem), src, 128, rows, src,
                                                        threadIdx.x);
  flashgen::sm80::cp_async_commit();
}
#endif
