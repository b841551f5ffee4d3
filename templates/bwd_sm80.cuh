// Backward attention on tensor cores for sm_80 and newer (mma.sync m16n8k16, ldmatrix, cp.async).
// Generic over a config type (see the generated BwdConfig in generator/generator.cpp). The kernels and
// the order they run in are described in bwd_traits.cuh. Notation: S = Q Kᵀ (unscaled), P = softmax
// of scale·S recomputed from the forward's LSE, dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP − D);
// then dV = Pᵀ dO, dK = scale · dSᵀ Q, dQ = scale · dS K. Masking and scores go through the config's
// Variant (variant.cuh, block_range.cuh); dS is taken with respect to q·k (its score_grad).
// The dkdv kernel is bwd_sm80_dkdv.cuh's, the deterministic strategy's dq kernel bwd_sm80_dq.cuh's, the row kernels
// (preprocess, convert, the sinks' gradient) bwd_rows.cuh's.
#pragma once

#include "bwd_rows.cuh"
#include "bwd_sm80_dkdv.cuh"
#include "bwd_sm80_dq.cuh"

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` compile this template on its own for a default config.
struct FlashgenDefaultBwdConfig {
  static constexpr flashgen::ElemType kElem = flashgen::ElemType::kBFloat16;
  static constexpr int kHeadDim = 128;
  static constexpr flashgen::MaskKind kMask = flashgen::MaskKind::kCausal;
  using Variant = flashgen::CausalMask;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = 4;
  static constexpr int kStages = 2;
  static constexpr int kDSplit = 1;
  static constexpr bool kAtomicDq = true;
  static constexpr flashgen::DqAccum kDqAccum = flashgen::DqAccum::kRows;
  static constexpr int kDqBlockM = 64;
  static constexpr int kDqBlockN = 64;
  static constexpr int kDqWarps = 4;
  static constexpr int kDqStages = 2;
  static constexpr int kPadRows = 1;
};

extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm80_standalone_preprocess(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdPreprocess<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::BwdDkdvSm80<FlashgenDefaultBwdConfig>::kThreads, 1)
    bwd_sm80_standalone_dkdv(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdDkdvSm80<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::BwdDqSm80<FlashgenDefaultBwdConfig>::kThreads, 1)
    bwd_sm80_standalone_dq(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdDqSm80<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm80_standalone_convert(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdConvertDq<FlashgenDefaultBwdConfig>::run(params);
}
extern "C" __global__ void __launch_bounds__(flashgen::kBwdRowKernelThreads)
    bwd_sm80_standalone_sink_grad(const __grid_constant__ flashgen::AttnBwdParams params) {
  flashgen::BwdSinkGrad<FlashgenDefaultBwdConfig>::run(params);
}
#endif
