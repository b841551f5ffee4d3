// A user mask's block classes: planning their launch, their kernels, and the classes kept across calls.
#include "launch/user_block_classes.hpp"

#include <cstdint>
#include <string>

#include "flashgen/error.hpp"
#include "launch/tensor_checks.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {

KeptBlockClasses::~KeptBlockClasses() {
  // Each in its own context, which may be gone by now (then its memory went with it; a handle that now names another
  // context has another id). Calls still queued may read the classes (Python frees a mask when it is collected), so
  // the context's work finishes first; where it cannot be waited for, the memory is left rather than freed under it.
  if (kept.empty()) return;  // (nothing was computed: perhaps no driver at all, which driver() would throw for)
  const DriverApi& cu = driver();
  for (const auto& [key, classes] : kept) {
    if (cu.cuCtxPushCurrent(classes.context) != CUDA_SUCCESS) continue;
    unsigned long long id = 0;
    if (cu.cuCtxGetId(classes.context, &id) == CUDA_SUCCESS && id == classes.context_id &&
        cu.cuCtxSynchronize() == CUDA_SUCCESS) {
      cu.cuEventDestroy(classes.ready);
      cu.cuMemFree(classes.memory);
    }
    CUcontext popped = nullptr;
    cu.cuCtxPopCurrent(&popped);
  }
}

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
  launch_kernel(ranges, ranges_grid, kUserBlockRangesThreads, 0, stream, args);
  if (backward) launch_kernel(bands, bands_grid, kUserBlockThreads, 0, stream, args);
}

void UserBlockLaunch::launch_kept(KeptBlockClasses& mask, const std::string& launch_key, UserBlockClasses& classes,
                                  CUstream stream, void** args) const {
  KeptBlockClasses::Classes kept;
  FLASHGEN_CU_CHECK(cuCtxGetCurrent(&kept.context));
  FLASHGEN_CU_CHECK(cuCtxGetId(kept.context, &kept.context_id));
  const std::string key = launch_key + " context " + std::to_string(kept.context_id);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  FLASHGEN_CU_CHECK(cuStreamIsCapturing(stream, &capture));
  const std::lock_guard<std::mutex> lock(mask.mutex);
  if (auto found = mask.kept.find(key); found != mask.kept.end()) {
    classes = at(found->second.memory);
    // After the kernels that filled them, on whichever stream they ran (a graph being captured was made after them).
    if (capture == CU_STREAM_CAPTURE_STATUS_NONE) FLASHGEN_CU_CHECK(cuStreamWaitEvent(stream, found->second.ready, 0));
    return;
  }
  FLASHGEN_REQUIRE(capture == CU_STREAM_CAPTURE_STATUS_NONE,
                   "opts.block_mask: the first call of a shape computes its classes into memory it allocates, which "
                   "a CUDA graph capture cannot hold: make that call once before capturing");
  FLASHGEN_CU_CHECK(cuMemAlloc(&kept.memory, bytes()));
  try {
    FLASHGEN_CU_CHECK(cuEventCreate(&kept.ready, CU_EVENT_DISABLE_TIMING));
    classes = at(kept.memory);
    launch(stream, args);
    FLASHGEN_CU_CHECK(cuEventRecord(kept.ready, stream));
  } catch (...) {
    // The kernels queued before the failure may still write the memory.
    if (driver().cuStreamSynchronize(stream) == CUDA_SUCCESS) driver().cuMemFree(kept.memory);
    if (kept.ready != nullptr) driver().cuEventDestroy(kept.ready);
    throw;
  }
  mask.kept.emplace(key, kept);
}

}  // namespace flashgen
