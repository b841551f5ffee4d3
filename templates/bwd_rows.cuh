// The backward's row kernels, shared by both families (bwd_sm80.cuh, bwd_sm90.cuh): the preprocess
// (D = rowsum(dO ∘ O), zeroing the fp32 dQ accumulator where the dkdv kernel only adds to it), the
// conversion of that accumulator to dQ, and the sinks' gradient. Generic over a config type with kElem,
// kHeadDim, kBlockM, kBlockN, kStages, kAtomicDq, kDqAccum and kPadRows: the workspace holds
// round_up(seqlen_q, kPadRows) rows per (batch, head); rows past seqlen_q get D = 0 and LSE2 = +inf, so P and their dQ are 0, which
// lets the Hopper family read and add whole query blocks.
#pragma once

#include "attn_params.cuh"
#include "fp8.cuh"
#include "block_range.cuh"
#include "bwd_traits.cuh"
#include "sequence.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "softmax.cuh"

namespace flashgen {
namespace bwd {

// The forward's natural-log LSE in the base-2 units of P = exp2(s * scale_log2 - lse2). A row that saw
// no key has LSE -inf; +inf makes its P 0 instead of inf.
__device__ __forceinline__ float lse_to_log2(float lse) {
  return lse == neg_inf() ? pos_inf() : lse * 1.4426950408889634f;
}

// Rows per (batch, head) of the workspace arrays (a packed sequence's: its own, bound by bind_sequence).
template <class Cfg>
__device__ __forceinline__ int padded_rows(const AttnBwdParams& p) {
  return (p.seqlen_q + Cfg::kPadRows - 1) / Cfg::kPadRows * Cfg::kPadRows;
}

// Index of (batch, head)'s first row in the workspace arrays: (batch, heads_q, padded rows) for a dense
// batch; for a packed one, whose arrays bind_sequence pointed at the sequence's first workspace row,
// head · rows per head (attn_params.cuh's packed_workspace_rows).
template <class Cfg>
__device__ __forceinline__ long long workspace_row0(const AttnBwdParams& p, int batch, int head) {
  if constexpr (ConfigVarlen<Cfg>::value) {
    return head * packed_workspace_rows(p.total_q, p.batch, Cfg::kPadRows);
  } else {
    return (static_cast<long long>(batch) * p.heads_q + head) * padded_rows<Cfg>(p);
  }
}

// The semaphore of the query block whose first workspace row is row0 (attn_params.cuh): its adds begun,
// then (the atomic strategy's) its adds done.
__device__ __forceinline__ int* dq_semaphore(const AttnBwdParams& p, long long row0) {
  return p.dq_semaphore + row0 / kBwdSm90SemaphoreRows * kBwdSm90SemaphoreInts;
}

// The sinks' gradient's partial of one warp of a dkdv block (ConfigSinkGrad): slot ((head · batch entries + batch) ·
// key blocks + key_block) · warps + warp after D (attn_params.cuh's bwd_sink_partials_offset). `unbound`: the
// call's params, a packed batch's before bind_sequence (its D and sizes are the whole batch's).
template <class Cfg>
__device__ __forceinline__ float* sink_partial(const AttnBwdParams& unbound, int head, int batch, int key_block,
                                               int warp) {
  const long long rows = bwd_workspace_rows(ConfigVarlen<Cfg>::value, unbound.total_q, unbound.batch, unbound.heads_q,
                                            unbound.seqlen_q, Cfg::kPadRows);
  const int key_blocks = (unbound.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const long long block = (static_cast<long long>(head) * unbound.batch + batch) * key_blocks + key_block;
  return unbound.dsum + bwd_sink_partials_offset(rows) + block * ConfigSinkGrad<Cfg>::partial_warps + warp;
}

}  // namespace bwd

// D = rowsum(dO ∘ O) for every (batch, head, query) row of the padded workspace, kRowLanes lanes per row
// (bwd_preprocess_row_lanes: one per 16-byte chunk, so a warp reads several short rows at once);
// zeroes the row's share of the fp32 dQ accumulator when the dkdv kernel adds into one without writing
// it first (dq_first_add_stores), and the semaphore of each 64-row tile with the Hopper family's (tiled)
// accumulator; writes the LSE in base 2 when the config's dkdv kernel reads it from the workspace
// (p.lse_log2 set).
template <class Cfg>
struct BwdPreprocess {
  using u16 = sm80::u16;
  using u32 = sm80::u32;
  static constexpr int kThreads = kBwdRowKernelThreads;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kValueDim = ConfigHeadDimV<Cfg>::value;  // O's and dO's columns
  static constexpr int kChunks = kValueDim / 8;                  // 16-byte chunks per row
  static constexpr int kRowLanes = bwd_preprocess_row_lanes(kValueDim);
  static constexpr int kLaneChunks = (kChunks + kRowLanes - 1) / kRowLanes;  // a lane's chunks of its row
  static constexpr int kRowsPerBlock = bwd_preprocess_rows_per_block(kValueDim);
  static constexpr int kAccumCols = dq_accum_cols(Cfg::kDqAccum, kHeadDim);
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;
  static constexpr bool kZeroAccum =
      Cfg::kDqAccum != DqAccum::kNone &&
      !dq_first_add_stores(Cfg::kDqAccum, kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, !Cfg::kAtomicDq,
                           Cfg::Variant::kHidesKeys, kValueDim);

  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {  // a packed sequence's rows, padded as the config's workspace is
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z, kAccumCols, Cfg::kPadRows);
      if (static_cast<int>(blockIdx.x * kRowsPerBlock) >= bwd::padded_rows<Cfg>(p)) return;
      run_rows(p);
    } else {
      run_rows(params);
    }
  }

  // Every lane runs the shuffles; lanes past the padded rows store nothing.
  static __device__ void run_rows(const AttnBwdParams& p) {
    const int lane = threadIdx.x % kRowLanes;  // this lane's 16-byte chunk of its row
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kRowLanes;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const bool padded_row = row < bwd::padded_rows<Cfg>(p);
    const long long flat_row = bwd::workspace_row0<Cfg>(p, batch, head) + row;
    const bool valid = row < p.seqlen_q;

    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kLaneChunks; ++c) {
      const int chunk = lane + c * kRowLanes;
      if (valid && chunk < kChunks) {
        const u16* o = static_cast<const u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                       row * p.o_row_stride + chunk * 8;
        const u16* d = static_cast<const u16*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride +
                       row * p.do_row_stride + chunk * 8;
        const uint4 ov = *reinterpret_cast<const uint4*>(o);
        const uint4 dv = *reinterpret_cast<const uint4*>(d);
        const u32 ow[4] = {ov.x, ov.y, ov.z, ov.w};
        const u32 dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float o_lo, o_hi, d_lo, d_hi;
          sm80::unpack2<Cfg::kElem>(ow[i], o_lo, o_hi);
          sm80::unpack2<Cfg::kElem>(dw[i], d_lo, d_hi);
          sum += o_lo * d_lo + o_hi * d_hi;
        }
      }
    }
#pragma unroll
    for (int offset = kRowLanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (!padded_row) return;
    if (lane == 0) {
      p.dsum[flat_row] = sum;
      if (p.lse_log2 != nullptr) {
        p.lse_log2[flat_row] = valid ? bwd::lse_to_log2(p.lse[row_base<kVarlen>(p, batch, head, p.seqlen_q) + row])
                                     : pos_inf();
      }
    }

    // Either layout of the accumulator gives each (batch, head) rows · kAccumCols values, so zeroing the
    // row's span zeroes a 64-row tile's values once its 64 rows have run.
    if constexpr (kZeroAccum) {
      float4 zero;
      zero.x = zero.y = zero.z = zero.w = 0.f;
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + flat_row * kAccumCols);
      for (int i = lane; i < kAccumCols / 4; i += kRowLanes) acc[i] = zero;
    }
    if constexpr (Cfg::kDqAccum == DqAccum::kTiles) {
      if (lane == 0 && flat_row % kBwdSm90SemaphoreRows == 0) {
        int* semaphore = bwd::dq_semaphore(p, flat_row);
        for (int i = 0; i < kBwdSm90SemaphoreInts; ++i) semaphore[i] = 0;
      }
    }
  }
};

// dQ = scale * accumulator, rounded to the 16-bit type. Row-major accumulator (DqAccum::kRows): one
// thread per 8 elements of a row, a block per kThreads / kChunks rows. Tiled (kTiles): a block per 64 x 64
// chunk of a tile, one thread per 8 columns of two rows (g and g + 8 of a 16-row group). Where the dkdv
// kernel counts its adds (dq_adds_counted), this kernel starts while the dkdv kernel's last blocks run
// (PreparedBackward launches it so): a block waits until the semaphore of its query block counts every key
// block that sees it (none: dQ = 0, the accumulator perhaps unwritten: dq_first_add_stores), and the last
// block waits for the dkdv kernel to end, so that nothing after this kernel in the stream starts before
// both have.
template <class Cfg>
struct BwdConvertDq {
  using u16 = sm80::u16;
  using u32 = sm80::u32;
  static constexpr int kThreads = kBwdRowKernelThreads;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kAccumCols = dq_accum_cols(Cfg::kDqAccum, kHeadDim);
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;
  static constexpr bool kCounted =
      dq_adds_counted(Cfg::kDqAccum, kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, ConfigHeadDimV<Cfg>::value);
  static_assert(Cfg::kDqAccum != DqAccum::kNone, "nothing to convert without a dQ accumulator");

  static __device__ void run(const AttnBwdParams& params) {
    if constexpr (kVarlen) {
      AttnBwdParams p = params;
      bind_sequence(p, blockIdx.z, kAccumCols, Cfg::kPadRows);
      convert(p);
    } else {
      convert(params);
    }
    if constexpr (kCounted) {
      if (blockIdx.x + 1 == gridDim.x && blockIdx.y + 1 == gridDim.y && blockIdx.z + 1 == gridDim.z) {
        sm80::wait_for_primary();
      }
    }
  }

  // Waits until every key block that sees the query block holding workspace row tile_row (query row
  // `row` of `batch` and `head`) has added its dQ, and says whether any has (KeyBlocks counts them as the dkdv
  // kernel's turns do).
  static __device__ bool wait_for_adds(const AttnBwdParams& p, int batch, int head, long long tile_row, int row) {
    const int m_start = row - row % Cfg::kBlockM;
    const int adds = KeyBlocks<typename Cfg::Variant, Cfg::kBlockN>(p, batch, m_start, Cfg::kBlockM, head).count();
    const int* done = bwd::dq_semaphore(p, tile_row - tile_row % Cfg::kBlockM) + (Cfg::kAtomicDq ? 1 : 0);
    if (threadIdx.x == 0) {
      while (sm90::ld_acquire_gpu(done) != adds) __nanosleep(1000);  // light on the L2 the dkdv kernel works in
    }
    __syncthreads();
    return adds > 0;
  }

  static __device__ void convert(const AttnBwdParams& p) {
    if constexpr (Cfg::kDqAccum == DqAccum::kTiles) {
      static_assert(kThreads == 256, "256 threads per 64 x 64 chunk");
      run_tiles(p);
    } else {
      run_rows(p);
    }
  }

  static __device__ void run_rows(const AttnBwdParams& p) {
    const int i = blockIdx.x * kThreads + threadIdx.x;
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const long long flat_row = bwd::workspace_row0<Cfg>(p, batch, head) + row;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + flat_row * kHeadDim + chunk * 8);
    const float4 a = src[0];
    const float4 b = src[1];
    const float s = p.variant.scale;
    uint4 out;
    out.x = sm80::pack2<Cfg::kElem>(a.x * s, a.y * s);
    out.y = sm80::pack2<Cfg::kElem>(a.z * s, a.w * s);
    out.z = sm80::pack2<Cfg::kElem>(b.x * s, b.y * s);
    out.w = sm80::pack2<Cfg::kElem>(b.z * s, b.w * s);
    u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
              row * p.dq_row_stride + chunk * 8;
    *reinterpret_cast<uint4*>(dq) = out;
  }

  // Block x: chunk x % kTileChunks of 64-row tile x / kTileChunks. Thread (w, g, i): 8-column group i of
  // rows 16w + g and 16w + g + 8. In the chunk, the warpgroup thread 32w + 4g + t holds the values of
  // group i at float 4 * (128 * i + 32w + 4g + t): (row 16w + g, columns 8i + 2t, +1), then the same of
  // row + 8; the four threads t of one (w, g) are 64 contiguous bytes. Groups past head_dim (the last
  // chunk's padding) have nothing to convert.
  static __device__ void run_tiles(const AttnBwdParams& p) {
    constexpr int kTileChunks = kAccumCols / 64;
    const int tile = blockIdx.x / kTileChunks;
    const int chunk = blockIdx.x % kTileChunks;
    const int i = threadIdx.x % 8;
    const int g = threadIdx.x / 8 % 8;
    const int w = threadIdx.x / 64;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    if (tile * 64 >= p.seqlen_q) return;
    const long long tile_row = bwd::workspace_row0<Cfg>(p, batch, head) + tile * 64;
    bool written = true;
    if constexpr (kCounted) written = wait_for_adds(p, batch, head, tile_row, tile * 64);
    const int row = tile * 64 + w * 16 + g;
    if (row >= p.seqlen_q) return;
    if (kAccumCols != kHeadDim && chunk * 64 + 8 * i >= kHeadDim) return;  // the last chunk's padding
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + tile_row * kAccumCols + chunk * 64 * 64) +
                        128 * i + 32 * w + 4 * g;
    float4 v[4];  // thread t's values
#pragma unroll
    for (int t = 0; t < 4; ++t) v[t] = written ? src[t] : make_float4(0.f, 0.f, 0.f, 0.f);
    const float s = p.variant.scale;
    u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride + row * p.dq_row_stride +
              chunk * 64 + 8 * i;
    uint4 out;
    out.x = sm80::pack2<Cfg::kElem>(v[0].x * s, v[0].y * s);
    out.y = sm80::pack2<Cfg::kElem>(v[1].x * s, v[1].y * s);
    out.z = sm80::pack2<Cfg::kElem>(v[2].x * s, v[2].y * s);
    out.w = sm80::pack2<Cfg::kElem>(v[3].x * s, v[3].y * s);
    *reinterpret_cast<uint4*>(dq) = out;
    if (row + 8 >= p.seqlen_q) return;
    out.x = sm80::pack2<Cfg::kElem>(v[0].z * s, v[0].w * s);
    out.y = sm80::pack2<Cfg::kElem>(v[1].z * s, v[1].w * s);
    out.z = sm80::pack2<Cfg::kElem>(v[2].z * s, v[2].w * s);
    out.w = sm80::pack2<Cfg::kElem>(v[3].z * s, v[3].w * s);
    *reinterpret_cast<uint4*>(dq + 8 * p.dq_row_stride) = out;
  }
};

// The sinks' gradient (p.dsinks; attn_params.cuh), after the preprocess: a sink has no value, so its score's
// gradient in row i is P_sink · (0 - D_i), P_sink = exp(sink - LSE_i) its share of the row's softmax (the
// forward's LSE includes it) and D_i = Σ_j P_ij dP_ij; dsink of head h sums that over every row of head h in every
// sequence. Without ConfigSinkGrad, D_i is the workspace's rowsum(dO ∘ O) over the stored (rounded) output; with it,
// the dkdv kernel has summed P_sink · P_ij · dP_ij over its scores in fp32 into one partial per warp and query head
// (bwd::sink_partial), and this kernel adds the head's partials (bench/notes_variants.md, "The sinks' gradient's
// error"). One block per query head sums in a fixed order: the same bits on every run, without atomics.
template <class Cfg>
struct BwdSinkGrad {
  static constexpr int kThreads = kBwdRowKernelThreads;
  static constexpr bool kVarlen = ConfigVarlen<Cfg>::value;

  static __device__ void run(const AttnBwdParams& p) {
    const int head = blockIdx.x;
    float sum;
    if constexpr (ConfigSinkGrad<Cfg>::value) {
      sum = partials_sum(p, head);
    } else {
      const float sink = p.variant.sinks[head];
      sum = 0.f;
      for (int batch = 0; batch < p.batch; ++batch) {
        // The sequence's rows in the forward's LSE and in the workspace (bind_sequence's, without a params copy).
        long long lse_row0, workspace_row0;
        int rows;
        if constexpr (kVarlen) {
          const SequenceRows s = sequence_rows(p, batch);
          rows = s.seqlen_q;
          lse_row0 = static_cast<long long>(head) * p.total_q + s.q_begin;
          workspace_row0 = head * packed_workspace_rows(p.total_q, p.batch, Cfg::kPadRows) +
                           packed_workspace_first_row(s.q_begin, batch, Cfg::kPadRows);
        } else {
          rows = p.seqlen_q;
          lse_row0 = row_base<false>(p, batch, head, p.seqlen_q);
          workspace_row0 = bwd::workspace_row0<Cfg>(p, batch, head);
        }
        for (int row = threadIdx.x; row < rows; row += kThreads) {
          const float lse = p.lse[lse_row0 + row];  // -inf only without a sink (a -inf one) in a row of no key
          if (lse != neg_inf()) sum += expf(sink - lse) * p.dsum[workspace_row0 + row];
        }
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    __shared__ float warp_sums[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.f;
      for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
      p.dsinks[head] = -total;
    }
  }

  // This thread's share of the head's partials (ConfigSinkGrad): each batch entry's key blocks, a packed sequence's
  // own (the blocks past its keys return at once and write none).
  static __device__ __forceinline__ float partials_sum(const AttnBwdParams& p, int head) {
    const int key_blocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
    float sum = 0.f;
    for (int batch = 0; batch < p.batch; ++batch) {
      const int seqlen_k = kVarlen ? min(sequence_rows(p, batch).seqlen_k, p.seqlen_k) : p.seqlen_k;
      const int blocks = min((seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, key_blocks);
      const int count = blocks * ConfigSinkGrad<Cfg>::partial_warps;
      const float* partials = bwd::sink_partial<Cfg>(p, head, batch, 0, 0);
      for (int i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
    }
    return sum;
  }
};

// An FP8 backward's q, k and v as the config's 16-bit type, each value times its descale (exact before the rounding
// to 16 bits, which a 16-bit backward's inputs carry too), into the workspace rows q, k and v point at (BSHD
// contiguous). blockIdx.z: tensor (q, k, v) · batch + batch entry; blockIdx.y: head; a thread per 8 columns of a row.
template <class Cfg>
struct BwdWiden {
  static constexpr int kThreads = kBwdRowKernelThreads;

  static __device__ void run(const AttnBwdParams& p) {
    const int tensor = blockIdx.z / p.batch, batch = blockIdx.z % p.batch, head = blockIdx.y;
    const int heads = tensor == 0 ? p.heads_q : p.heads_kv;
    const int dim = tensor == 2 ? ConfigHeadDimV<Cfg>::value : Cfg::kHeadDim;
    const int rows = tensor == 0 ? p.seqlen_q : p.seqlen_k;
    const long long chunk = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (head >= heads || chunk >= static_cast<long long>(rows) * (dim / 8)) return;
    const int row = static_cast<int>(chunk / (dim / 8)), col = static_cast<int>(chunk % (dim / 8)) * 8;
    const long long(&stride)[3] = p.fp8_strides[tensor];
    const unsigned char* from = static_cast<const unsigned char*>(p.fp8_sources[tensor]) + batch * stride[0] +
                                row * stride[1] + head * stride[2] + col;
    const float* descales = tensor == 0 ? p.q_descale : tensor == 1 ? p.k_descale : p.v_descale;
    const long long(&descale_strides)[2] =
        tensor == 0 ? p.q_descale_strides : tensor == 1 ? p.k_descale_strides : p.v_descale_strides;
    const float scale = fp8::descale(descales, descale_strides, batch, tensor == 0 ? head / p.group_size : head);
    const uint2 codes = *reinterpret_cast<const uint2*>(from);
    const sm80::u32 words[2] = {codes.x, codes.y};
    sm80::u32 out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned short pair = static_cast<unsigned short>(words[i / 2] >> (16 * (i % 2)));
      const float2 values = widen_pair(pair, p.fp8_format);
      out[i] = sm80::pack2<Cfg::kElem>(values.x * scale, values.y * scale);
    }
    const void* base = tensor == 0 ? p.q : tensor == 1 ? p.k : p.v;
    uint4* to = reinterpret_cast<uint4*>(
        static_cast<unsigned short*>(const_cast<void*>(base)) +
        ((static_cast<long long>(batch) * rows + row) * heads + head) * dim + col);
    *to = make_uint4(out[0], out[1], out[2], out[3]);
  }

  // Two FP8 codes (the first in the low byte) as floats, exactly: every e4m3 and e5m2 value is an fp16 one.
  static __device__ __forceinline__ float2 widen_pair(unsigned short pair, int format) {
    sm80::u32 halves = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (format == 1) {
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(pair));
    } else {
      asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(halves) : "h"(pair));
    }
#else
    __trap();  // FP8 calls run on sm_89 and newer (the launcher refuses the rest)
#endif
    float lo, hi;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(lo) : "h"(static_cast<unsigned short>(halves)));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(hi) : "h"(static_cast<unsigned short>(halves >> 16)));
    return make_float2(lo, hi);
  }
};

}  // namespace flashgen
