// Thin wrappers over the sm_90a PTX the Hopper kernels are built from: mbarriers, TMA tile copies
// (cp.async.bulk.tensor), wgmma fences and shared-memory matrix descriptors, register reallocation
// (setmaxnreg), named barriers and clusters. No toolkit headers needed, as for sm80_primitives.cuh.
#pragma once

#include "fwd_traits.cuh"

namespace flashgen {
namespace sm90 {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void* ptr) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(ptr));
  return addr;
}

// ---- mbarriers (64-bit, in shared memory, addressed by their .shared address) ----

__device__ __forceinline__ void mbarrier_init(u32 bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA) and to the other threads.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` more bytes of TMA traffic for the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Raises the bytes the barrier's current phase waits for, without an arrival.
__device__ __forceinline__ void mbarrier_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// One arrival on bar once every cp.async this thread issued before has landed (the barrier's count includes it).
__device__ __forceinline__ void cp_async_mbarrier_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival on the barrier at this barrier's shared-memory offset in block `rank` of the cluster
// (this block's own, or a peer's). Default (CTA-scope) ordering: it announces that this block is done
// reading its own shared memory, which a peer's TMA may then overwrite.
__device__ __forceinline__ void mbarrier_arrive_cluster(u32 bar, u32 rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// Blocks until the phase with this parity has completed. A freshly initialised barrier counts its
// phase "-1" (parity 1) as completed, so a producer's first wait on an empty slot passes at once.
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
  u32 done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 value) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(value) : "memory");
}

// Stores four floats to 16 aligned bytes of shared memory.
__device__ __forceinline__ void st_shared_f32x4(u32 addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
  u32 value;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(value) : "r"(addr) : "memory");
  return value;
}

__device__ __forceinline__ void ld_shared_f32x4(u32 addr, float& a, float& b, float& c, float& d) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "r"(addr) : "memory");
}

__device__ __forceinline__ void st_shared_u32x4(u32 addr, const u32 (&v)[4]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

__device__ __forceinline__ void ld_shared_u32x4(u32 addr, u32 (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ld_shared_f32x2(u32 addr, float& a, float& b) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(a), "=f"(b) : "r"(addr) : "memory");
}

// ---- TMA (bulk tensor copies described by a CUtensorMap in kernel parameter space) ----

// Copies the box at coordinates (c0 innermost .. c3) of the tensor map into shared memory at dst
// (1024-byte aligned for 128-byte swizzling); completion is counted on bar in bytes. Out-of-bounds
// elements are filled with zeros.
__device__ __forceinline__ void tma_load_4d(u32 dst, const void* tensor_map, u32 bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];" ::"r"(dst),
      "l"(tensor_map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// As tma_load_4d, into the same shared-memory offset of every block of the cluster named in cta_mask
// (bit r: rank r), completing on the barrier at bar's offset in each of them.
__device__ __forceinline__ void tma_load_4d_multicast(u32 dst, const void* tensor_map, u32 bar, int c0, int c1,
                                                      int c2, int c3, u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(dst),
      "l"(tensor_map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask)
      : "memory");
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory to shared memory,
// counted on bar like a tile copy.
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Stores the box at src to the tensor map's coordinates; elements out of bounds are not written.
__device__ __forceinline__ void tma_store_4d(const void* tensor_map, u32 src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   tensor_map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Adds `bytes` (a multiple of 16; both addresses 16-byte aligned) of fp32 values at src in shared memory
// into global memory at dst, element by element, each add atomic: a bulk operation of this thread's bulk
// group, like a TMA store (the commit and wait below cover both).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared memory at src to global
// memory at dst: a bulk operation of this thread's bulk group, like a TMA store.
__device__ __forceinline__ void bulk_store(void* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until this thread's committed stores have finished reading their shared-memory source.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Waits until this thread's committed stores have finished writing global memory.
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Orders this thread's ordinary shared-memory writes before later async-proxy (TMA, wgmma) reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Adds four floats to 16 aligned bytes of global memory, each add atomic (no return value).
__device__ __forceinline__ void red_add_f32x4(float* addr, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// Orders this thread's async-proxy global accesses (bulk copies it has waited for) with its ordinary ones.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// At least the number of SMs on the device: %nsmid, one past the highest SM id, which may leave gaps.
__device__ __forceinline__ int sm_count_bound() {
  int count;
  asm("mov.u32 %0, %%nsmid;" : "=r"(count));
  return count;
}

// A flag in global memory read with acquire and written with release semantics at GPU scope: what the
// writer did before the release is visible to a reader after an acquire that sees the value.
__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}
__device__ __forceinline__ void st_release_gpu(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}
// Adds to a counter in global memory and returns its previous value with acquire semantics (what a
// release whose sum it sees made visible is visible to this thread after it); adds with release
// semantics, returning nothing; and adds with no ordering (after a fence_acq_rel_gpu, a release of what
// came before the fence: one fence for many counters).
__device__ __forceinline__ int atom_add_acquire_gpu(int* counter, int value) {
  int old;
  asm volatile("atom.acquire.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(value) : "memory");
  return old;
}
__device__ __forceinline__ void red_add_release_gpu(int* counter, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(counter), "r"(value) : "memory");
}
__device__ __forceinline__ void red_add_relaxed_gpu(int* counter, int value) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(counter), "r"(value) : "memory");
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ---- warpgroup matrix multiply ----

// Orders register and shared-memory accesses before the wgmma instructions that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most kPending committed wgmma groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of accumulator registers across wgmma issue and wait points:
// the asm statements above do not name the accumulators they race with.
template <int kRows, int kCols>
__device__ __forceinline__ void pin_registers(float (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
}

// Shared-memory matrix descriptor for a tile stored with 128-byte swizzling (rows of 64 16-bit
// elements, 8-row / 1024-byte swizzle atoms, as TMA writes them with CU_TENSOR_MAP_SWIZZLE_128B).
// leading_bytes: MN-major only, the distance between 64-element column chunks. stride_bytes: the
// distance between 8-row groups (1024 for a dense tile). Advancing the start address by k * 32 bytes
// selects k-step k within a 64-element chunk.
__device__ __forceinline__ u64 smem_desc_sw128(u32 addr, u32 leading_bytes, u32 stride_bytes) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>(leading_bytes >> 4) << 16) |
         (static_cast<u64>(stride_bytes >> 4) << 32) | (1ull << 62);
}

// Shared-memory matrix descriptor without swizzling: 8 x 16-byte core matrices, leading_bytes and
// stride_bytes apart. For the block of ones (tensor_sum), where every byte read holds the same value.
__device__ __forceinline__ u64 smem_desc_plain(u32 addr, u32 leading_bytes, u32 stride_bytes) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>(leading_bytes >> 4) << 16) |
         (static_cast<u64>(stride_bytes >> 4) << 32);
}

// desc with its start address moved on by bytes (a multiple of 16), e.g. to the next k-step. Only the
// 32-bit word holding the address field changes: shared-memory addresses stay below 2^18 bytes, so the
// add never carries out of the 14-bit field, and one 32-bit add replaces rebuilding the descriptor.
__device__ __forceinline__ u64 smem_desc_advance(u64 desc, u32 bytes) {
  const u32 low = static_cast<u32>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

// ---- registers and barriers ----

// This thread's warpgroup, threadIdx.x / 128, read through a shuffle from lane 0: the compiler then knows
// it is the same for the whole warp and keeps what is derived from it (shared-memory addresses, wgmma
// descriptors) in uniform registers instead of moving them over with R2UR before each wgmma.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
}

// Gives registers back to (dec) or takes them from (inc) the block's pool, for the whole warpgroup.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- clusters ----

// This block's rank within its cluster (0 without clusters).
__device__ __forceinline__ u32 cluster_rank() {
  u32 rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Barrier among every thread of every block of the cluster, ordering their earlier memory accesses
// before everything after it (barrier initialisation before any remote arrival).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// Barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1-15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// named_barrier_sync for threads that reach the barrier from different instructions (warpgroups running
// different code): barrier.sync without .aligned, which bar.sync implies.
__device__ __forceinline__ void named_barrier_sync_unaligned(u32 id, u32 threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Counts this warp's threads at barrier `id` without waiting: pairs with named_barrier_sync elsewhere.
__device__ __forceinline__ void named_barrier_arrive(u32 id, u32 threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sm90
}  // namespace flashgen
