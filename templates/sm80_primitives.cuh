// Thin wrappers over the sm_80 PTX the attention kernels are built from: cp.async, ldmatrix,
// mma.sync m16n8k16, packing fp32 pairs to 16-bit pairs, base-2 exponent. No toolkit headers needed,
// so NVRTC compiles the templates without an include path.
#pragma once

#include "fwd_traits.cuh"

namespace flashgen {
namespace sm80 {

typedef unsigned short u16;  // fp16 or bf16 bits; the kernels never do arithmetic on them directly
typedef unsigned int u32;

// std::integral_constant without <type_traits>: NVRTC compiles the templates with no standard headers.
template <bool kValue>
struct BoolConstant {
  static constexpr bool value = kValue;
};
template <int kValue>
struct IntConstant {
  static constexpr int value = kValue;
};

// Shared-memory address (32-bit, .shared window) of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_addr(const void* ptr) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(ptr));
  return addr;
}

// 16-byte global -> shared copy that bypasses L1; copies zeros instead when !valid (src is not read).
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// cp_async_16 with a hint that L2 fetch the whole 256-byte block around src from memory: for streams that read
// every byte of long rows once (a KV cache), so the DRAM reads come in fewer, longer bursts.
__device__ __forceinline__ void cp_async_16_stream(u32 dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// 4-byte global -> shared copy through L1 (for per-row floats such as LSE); zeros when !valid.
__device__ __forceinline__ void cp_async_4(u32 dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Programmatic dependent launch (sm_90; nothing before): a kernel launched after this one with programmatic
// stream serialization may start once every block of this one has called launch_dependents (or exited), and
// waits in wait_for_primary until this one's memory is visible. Both are no-ops without such a launch.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i; r[i] holds matrix i.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// As ldmatrix_x4, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d (16x8 fp32) += a (16x16 row-major) * b (16x8 column-major), 16-bit operands.
template <ElemType kElem>
__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if constexpr (kElem == ElemType::kBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Rounds (lo, hi) to the 16-bit type and packs them, lo in the low half.
template <ElemType kElem>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  if constexpr (kElem == ElemType::kBFloat16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// An fp32 accumulator's 8-column groups 2j and 2j + 1 of 16 rows (mma.sync m16n8 or wgmma layout: row g
// in [0], [1], row g + 8 in [2], [3]) are laid out as the 16-bit A operand of k-step j (16 x 16) of
// mma.sync m16n8k16 and of wgmma with A in registers: packs groups lo and hi as that fragment.
template <ElemType kElem>
__device__ __forceinline__ void pack_a(u32 (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<kElem>(lo[0], lo[1]);
  a[1] = pack2<kElem>(lo[2], lo[3]);
  a[2] = pack2<kElem>(hi[0], hi[1]);
  a[3] = pack2<kElem>(hi[2], hi[3]);
}

// The first kSteps k-steps of an accumulator tile (8 * 2 * kSteps columns) as A fragments.
template <ElemType kElem, int kSteps, int kFragSteps, int kGroups>
__device__ __forceinline__ void pack_a_steps(u32 (&a)[kFragSteps][4], const float (&acc)[kGroups][4]) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j) pack_a<kElem>(a[j], acc[2 * j], acc[2 * j + 1]);
}

// The two 16-bit values of a packed pair as fp32: (low half, high half).
template <ElemType kElem>
__device__ __forceinline__ void unpack2(u32 pair, float& lo, float& hi) {
  if constexpr (kElem == ElemType::kBFloat16) {
    lo = __uint_as_float(pair << 16);
    hi = __uint_as_float(pair & 0xffff0000u);
  } else {
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi)
        : "r"(pair));
  }
}

// *addr += value in global memory, result unused (red.global.add.f32).
__device__ __forceinline__ void atomic_add_f32(float* addr, float value) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(addr), "f"(value) : "memory");
}

// addr[0] += a, addr[1] += b in global memory (addr 8-byte aligned): one vector reduction on sm_90+.
__device__ __forceinline__ void atomic_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  atomic_add_f32(addr, a);
  atomic_add_f32(addr + 1, b);
#endif
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace sm80
}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own.
__global__ void flashgen_sm80_primitives_check(float* out) {
  float d[4] = {0, 0, 0, 0};
  const flashgen::sm80::u32 a[4] = {0, 0, 0, 0};
  flashgen::sm80::mma_16816<flashgen::ElemType::kBFloat16>(d, a, 0u, 0u);
  out[threadIdx.x] = flashgen::sm80::exp2_approx(d[0]);
}
#endif
