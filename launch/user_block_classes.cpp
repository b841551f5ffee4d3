#include "launch/user_block_classes.hpp"

#include <cstdint>

#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"

flashgen_block_mask::~flashgen_block_mask() {
  // Each in its own context, which may be gone by now (then its memory went with it).
  for (const auto& [key, classes] : kept) {
    if (flashgen::driver().cuCtxPushCurrent(classes.context) != CUDA_SUCCESS) continue;
    flashgen::driver().cuMemFree(classes.memory);
    CUcontext popped = nullptr;
    flashgen::driver().cuCtxPopCurrent(&popped);
  }
}

namespace flashgen {

namespace {

size_t groups(const UserBlockLaunch& l) { return size_t(l.batch) * size_t(l.shape.heads); }

size_t rows_bytes(const UserBlockLaunch& l) { return align_workspace_part(groups(l) * size_t(l.shape.row_blocks) * 4 * sizeof(int)); }
size_t cols_bytes(const UserBlockLaunch& l) {
  return !l.backward ? 0 : align_workspace_part(groups(l) * size_t(l.shape.col_blocks) * 4 * sizeof(int));
}

}  // namespace

UserBlockLaunch UserBlockLaunch::plan(int block_m, int block_n, int row_blocks, int col_blocks, int heads,
                                      int head_group, int batch, bool backward) {
  UserBlockLaunch l;
  // The tiles' grid is (key blocks, query blocks, groups): y and z stop at 65535.
  if (row_blocks <= 0 || col_blocks <= 0 || row_blocks > 65535 || int64_t{heads} * batch > 65535) return l;
  l.shape.block_m = block_m;
  l.shape.block_n = block_n;
  l.shape.row_blocks = row_blocks;
  l.shape.col_blocks = col_blocks;
  l.shape.heads = heads;
  l.shape.head_group = head_group;
  l.batch = batch;
  l.backward = backward;
  const unsigned groups[2] = {static_cast<unsigned>(heads), static_cast<unsigned>(batch)};
  l.tiles_grid[0] = static_cast<unsigned>(col_blocks);
  l.tiles_grid[1] = static_cast<unsigned>(row_blocks);
  l.tiles_grid[2] = groups[0] * groups[1];
  l.ranges_grid[0] = static_cast<unsigned>(row_blocks);
  l.ranges_grid[1] = groups[0];
  l.ranges_grid[2] = groups[1];
  l.bands_grid[0] = groups[0];
  l.bands_grid[1] = groups[1];
  return l;
}

size_t UserBlockLaunch::bytes() const {
  if (!*this) return 0;
  return rows_bytes(*this) + cols_bytes(*this) + align_workspace_part(groups(*this) * size_t(shape.row_blocks) * size_t(shape.col_blocks));
}

UserBlockClasses UserBlockLaunch::at(CUdeviceptr memory) const {
  UserBlockClasses c = shape;
  c.rows = reinterpret_cast<int*>(memory);
  c.cols = !backward ? nullptr : reinterpret_cast<int*>(memory + rows_bytes(*this));
  c.tiles = reinterpret_cast<unsigned char*>(memory + rows_bytes(*this) + cols_bytes(*this));
  return c;
}

void UserBlockLaunch::launch(CUstream stream, void** args) const {
  launch_kernel(tiles, tiles_grid, kUserBlockThreads, 0, stream, args);
  launch_kernel(ranges, ranges_grid, 32, 0, stream, args);
  if (backward) launch_kernel(bands, bands_grid, kUserBlockThreads, 0, stream, args);
}

void UserBlockLaunch::launch_kept(flashgen_block_mask& mask, const std::string& key, UserBlockClasses& classes,
                                  CUstream stream, void** args) const {
  const std::lock_guard<std::mutex> lock(mask.mutex);
  if (auto found = mask.kept.find(key); found != mask.kept.end()) {
    classes = at(found->second.memory);
    return;
  }
  flashgen_block_mask::Classes kept;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&kept.context));
  FLASHGEN_CU_CHECK(cuMemAlloc(&kept.memory, bytes()));
  try {
    classes = at(kept.memory);
    launch(stream, args);
  } catch (...) {
    driver().cuMemFree(kept.memory);
    throw;
  }
  mask.kept.emplace(key, kept);
}

}  // namespace flashgen
