// A user mask's block classes for one launch (templates/user_blocks.cuh): the kernels that compute them before the
// attention kernels, their grids, and the memory they take. The forward takes the memory for the call in stream
// order (StreamAllocation), the backward holds it in its workspace, and a caller's block mask (KeptBlockClasses;
// the C ABI's flashgen_block_mask holds one) keeps it across calls.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "templates/attn_params.cuh"

namespace flashgen {

// A user mask's classes kept across calls (CallOptions::block_mask), per launch key (block_mask_key), each in device
// memory of its own (cuMemAlloc in the context of the call that computed them), freed with the mask.
struct KeptBlockClasses {
  struct Classes {
    CUdeviceptr memory = 0;
    CUcontext context = nullptr;
    unsigned long long context_id = 0;  // cuCtxGetId: tells the context from a later one given the same handle
    CUevent ready = nullptr;  // recorded after the kernels that fill memory: other streams wait for it
  };
  std::mutex mutex;
  std::map<std::string, Classes> kept;

  KeptBlockClasses() = default;
  KeptBlockClasses(const KeptBlockClasses&) = delete;
  KeptBlockClasses& operator=(const KeptBlockClasses&) = delete;
  ~KeptBlockClasses();
};

// What decides a launch's classes besides the variant's buffers' contents (the caller's promise): the config (tiles,
// masks, the variant's functions), the shapes and the base mask's arguments and alignment, a packed batch's offsets
// and used keys, the buffers' pointers and the scalars (launch_kept adds the context).
template <class Params>
std::string block_mask_key(const std::string& config, const Params& p) {
  std::string key = config;
  auto add = [&](long long value) { key += ' ' + std::to_string(value); };
  for (long long value : {(long long)p.batch, (long long)p.heads_q, (long long)p.heads_kv, (long long)p.seqlen_q,
                          (long long)p.seqlen_k, (long long)p.variant.causal_offset, (long long)p.variant.window_left,
                          (long long)p.variant.window_right, (long long)p.variant.attention_chunk, (long long)p.total_q,
                          (long long)p.total_k, (long long)p.causal_bottom_right}) {
    add(value);
  }
  for (const int* offsets : {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k}) {
    add(static_cast<long long>(reinterpret_cast<std::uintptr_t>(offsets)));
  }
  for (const void* buffer : p.variant.user_buffers) {
    add(static_cast<long long>(reinterpret_cast<std::uintptr_t>(buffer)));
  }
  for (unsigned scalar : p.variant.user_scalars) add(scalar);
  return key;
}

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

  // The classes of the launch whose params are *p, in mask: where they are kept, p's classes point there and stream
  // waits for the kernels that filled them; where not, memory is allocated and kept for them and the kernels launched
  // to fill it (args: p as cuLaunchKernel takes it), which a stream capturing a CUDA graph cannot do (Error naming
  // opts.block_mask). key: block_mask_key of the launch, in the current context.
  void launch_kept(KeptBlockClasses& mask, const std::string& launch_key, UserBlockClasses& classes,
                   CUstream stream, void** args) const;
};

}  // namespace flashgen
