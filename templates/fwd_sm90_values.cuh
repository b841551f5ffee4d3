// Vᵀ for the FP8 forward (fwd_sm90.cuh), the first kernel of its module: 8-bit wgmma reads both operands K-major,
// so P V takes V as (head_dim, keys) rows with the keys contiguous, and in each 32-key step in the order P's
// fragments hold them (fp8.cuh's pv_key). One block turns 64 keys of one (batch entry, kv head) into head_dim rows of
// 64 bytes: v_t[b, h, c, 32s + k] = v[b, 32s + pv_key(k), h, c], zero past seqlen_k up to v_t_keys. A packed batch's
// sequence b (blockIdx.z) goes to entry 0 from its own origin (attn_params.cuh's fp8_values_t_origin), zero past its
// keys up to its last key block's end, which the next sequence's origin never precedes; over a paged cache its rows
// are read through the block table.
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
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value, kPaged = ConfigPaged<Cfg>::value;

  // Bytes from the sequence's (or batch entry's) V rows to its key `key`: a row, or over a paged cache the row of
  // the page the block table names (clamped into the cache, as the attention kernel reads it).
  static __device__ long long row_offset(const AttnFwdParams& p, int sequence, int key) {
    if constexpr (kPaged) {
      const int page = min(max(p.block_table[sequence * p.block_table_stride + key / p.page_size], 0), p.num_pages - 1);
      return page * p.v_page_stride + (key % p.page_size) * p.v_row_stride;
    } else {
      return key * p.v_row_stride;
    }
  }

  // Grid: (v_t_keys / 64 rounded up, heads_kv, batch); packed, (max_seqlen_k in whole key blocks / 64, ...).
  static __device__ void run(const AttnFwdParams& p) {
    __shared__ __align__(16) unsigned char tile[kKeys * kPitch];
    const int key0 = static_cast<int>(blockIdx.x) * kKeys;
    const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
    const auto* v = static_cast<const unsigned char*>(p.v) + head * p.v_head_stride;
    int keys = p.seqlen_k, entry = batch;
    long long origin = 0, end = p.v_t_keys;  // the sequence's first Vᵀ key, and the end of what it writes
    if constexpr (kVarlen) {
      const SequenceRows rows = fp8_sequence_rows<true>(p, batch, kPaged);
      v += rows.k_begin * p.v_row_stride;  // 0 over a paged cache
      keys = rows.seqlen_k, entry = 0;
      origin = fp8_values_t_origin(kPaged, rows.k_begin, batch, p.seqlen_k, kFp8BlockN);
      end = (keys + kFp8BlockN - 1) / kFp8BlockN * kFp8BlockN;
      if (key0 >= end) return;  // the whole block: before any barrier
    } else {
      v += batch * p.v_batch_stride;
    }
    // The block's keys as rows, 16 bytes a thread at a time; keys past the sequence's as zeros.
    for (int i = threadIdx.x; i < kKeys * (kDim / 16); i += kValuesThreads) {
      const int key = i / (kDim / 16), unit = i % (kDim / 16);
      uint4 bytes = make_uint4(0u, 0u, 0u, 0u);
      if (key0 + key < keys) bytes = *reinterpret_cast<const uint4*>(v + row_offset(p, batch, key0 + key) + unit * 16);
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
