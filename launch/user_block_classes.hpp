// A user mask's block classes for one dense launch (templates/user_blocks.cuh): the kernels that compute them before
// the attention kernels, their grids, and the memory they take. The forward takes the memory from the stream's pool
// for the call; the backward holds it in its workspace.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "templates/attn_params.cuh"

namespace flashgen {

struct UserBlockLaunch {
  UserBlockClasses shape{};     // everything but the pointers; row_blocks 0: the launch has no classes
  int batch = 0;
  bool backward = false;        // with the key blocks' walks (UserBlockBands)
  CUfunction tiles = nullptr;   // each tile's class
  CUfunction ranges = nullptr;  // each query block's walk
  CUfunction bands = nullptr;   // the backward's: the bands and each key block's walk
  unsigned tiles_grid[3] = {1, 1, 1};   // key blocks, query blocks, heads * batch (kUserBlockThreads threads)
  unsigned ranges_grid[3] = {1, 1, 1};  // query blocks, heads, batch (32 threads)
  unsigned bands_grid[3] = {1, 1, 1};   // heads, batch (kUserBlockThreads threads)

  // The classes of a launch at tiles block_m x block_n over row_blocks query blocks and col_blocks key blocks, in
  // heads class heads per batch entry each serving head_group query heads, without their kernels (the caller loads
  // them), or none (empty) where the grids would pass the device's limits: that launch walks every block with the
  // mask. Needs no GPU.
  static UserBlockLaunch plan(int block_m, int block_n, int row_blocks, int col_blocks, int heads, int head_group,
                              int batch, bool backward);

  explicit operator bool() const { return shape.row_blocks > 0; }
  // Bytes of the classes: the query blocks' ints, the key blocks' (backward), a byte per tile; each part 256-aligned.
  size_t bytes() const;
  // The classes placed at memory (bytes() of device memory): shape with its pointers.
  UserBlockClasses at(CUdeviceptr memory) const;
  // The kernels in stream order; args: the launch's params (holding at()'s classes) as cuLaunchKernel takes them.
  void launch(CUstream stream, void** args) const;
};

}  // namespace flashgen
