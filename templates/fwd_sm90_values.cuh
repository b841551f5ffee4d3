// Vᵀ for the FP8 forward (fwd_sm90.cuh), the first kernel of its module: 8-bit wgmma reads both operands K-major,
// so P V takes V as (head_dim, keys) rows with the keys contiguous, and in each 32-key step in the order P's
// fragments hold them (fp8.cuh's pv_key). One block turns 64 keys of one (batch entry, kv head) into head_dim rows of
// 64 bytes: v_t[b, h, c, 32s + k] = v[b, 32s + pv_key(k), h, c], zero past seqlen_k up to v_t_keys. A packed batch's
// sequence b (blockIdx.z) goes to entry 0 from its own origin, packed_workspace_first_row(k_begin, b, kFp8BlockN),
// zero past its keys up to its last key block's end, which the next sequence's origin never precedes.
#pragma once

#include "attn_params.cuh"
#include "fp8.cuh"
#include "fwd_traits.cuh"
#include "sequence.cuh"

namespace flashgen {

template <class Cfg>
struct FwdSm90Values {
  static constexpr int kKeys = 64;                    // per block
  static constexpr int kDim = Cfg::kHeadDim;          // FP8: a multiple of 16 up to 256
  static constexpr int kPitch = kDim + 16;            // bytes per key row in shared memory
  static_assert(kDim % 16 == 0 && kDim <= 256, "FP8 head dims are whole 16-byte units");

  // Grid: (v_t_keys / 64 rounded up, heads_kv, batch); packed, (max_seqlen_k in whole key blocks / 64, ...).
  static __device__ void run(const AttnFwdParams& p) {
    __shared__ __align__(16) unsigned char tile[kKeys * kPitch];
    const int key0 = static_cast<int>(blockIdx.x) * kKeys;
    const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
    const auto* v = static_cast<const unsigned char*>(p.v) + head * p.v_head_stride;
    int keys = p.seqlen_k, entry = batch;
    long long origin = 0, end = p.v_t_keys;  // the sequence's first Vᵀ key, and the end of what it writes
    if constexpr (ConfigVarlen<Cfg>::value) {
      const SequenceRows rows = sequence_rows(p, batch);
      v += rows.k_begin * p.v_row_stride;
      keys = rows.seqlen_k, entry = 0;
      origin = packed_workspace_first_row(rows.k_begin, batch, kFp8BlockN);
      end = (keys + kFp8BlockN - 1) / kFp8BlockN * kFp8BlockN;
      if (key0 >= end) return;  // the whole block: before any barrier
    } else {
      v += batch * p.v_batch_stride;
    }
    // The block's keys as rows, 16 bytes a thread at a time; keys past the sequence's as zeros.
    for (int i = threadIdx.x; i < kKeys * (kDim / 16); i += kValuesThreads) {
      const int key = i / (kDim / 16), unit = i % (kDim / 16);
      uint4 bytes = make_uint4(0u, 0u, 0u, 0u);
      if (key0 + key < keys) {
        bytes = *reinterpret_cast<const uint4*>(v + (key0 + key) * p.v_row_stride + unit * 16);
      }
      *reinterpret_cast<uint4*>(tile + key * kPitch + unit * 16) = bytes;
    }
    __syncthreads();
    // Row c of Vᵀ, 16 keys a thread at a time, each 16 in pv_key's order within its 32-key step.
    auto* v_t = static_cast<unsigned char*>(p.v_t) +
                ((entry * p.heads_kv + head) * static_cast<long long>(kDim)) * p.v_t_keys + origin;
    for (int i = threadIdx.x; i < kDim * (kKeys / 16); i += kValuesThreads) {
      const int c = i / (kKeys / 16), unit = i % (kKeys / 16);
      if (key0 + unit * 16 >= end) continue;
      unsigned w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = 0u;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int k = unit * 16 + 4 * j + b;  // within the block: step k / 32, position k % 32
          const int key = k / 32 * 32 + fp8::pv_key(k % 32);
          w[j] |= static_cast<unsigned>(tile[key * kPitch + c]) << (8 * b);
        }
      }
      *reinterpret_cast<uint4*>(v_t + c * p.v_t_keys + key0 + unit * 16) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
struct FlashgenValuesCheckConfig {
  static constexpr int kHeadDim = 128;
};
extern "C" __global__ void __launch_bounds__(flashgen::kValuesThreads)
    fwd_sm90_values_standalone(const __grid_constant__ flashgen::AttnFwdParams params) {
  flashgen::FwdSm90Values<FlashgenValuesCheckConfig>::run(params);
}
#endif
