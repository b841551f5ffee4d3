// One warp's steps over one K/V tile of the sm80 families' forward attention (fwd_sm80.cuh, decode_sm80.cuh):
// S = Q Kᵀ on mma.sync m16n8k16, the online softmax's update (softmax.cuh), and O += P V, on kMTiles 16-row
// tiles of queries and kNTiles 8-key column tiles of S in the accumulator layout. The kernels keep the order
// of the steps and what goes between them (the next tile's copies, the variant's scores). The sm80 backward
// (bwd_sm80.cuh) takes the tile product for its S, dP, Sᵀ and dPᵀ.
#pragma once

#include "sm80_primitives.cuh"
#include "softmax.cuh"

namespace flashgen {
namespace sm80 {

// S = Q Kᵀ over kKSteps k-steps of 16: load_a(mt, kk, a) gives the A fragment of query tile mt at k-step kk
// (from registers or shared memory); k_tile + k_lane is the lane's ldmatrix address of key 0 of the warp's keys
// in a (keys, kRow) K tile (k_lane: the lane pattern of fwd_sm80.cuh's). Tile and lane stay apart so that the
// addresses are summed as the kernels summed them before this step was shared (the same PTX).
template <ElemType kElem, int kKSteps, int kRow, int kMTiles, int kNTiles, class LoadA>
__device__ __forceinline__ void qk_product(float (&acc_s)[kMTiles][kNTiles][4], LoadA&& load_a, u32 k_tile,
                                           u32 k_lane) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    u32 a[kMTiles][4];  // (kMTiles) A fragments of Q for k-step kk, 16x16 each
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) load_a(mt, kk, a[mt]);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      u32 b[4];  // B fragments of key tiles 2np and 2np+1, 16x8 each
      ldmatrix_x4(b, k_tile + k_lane + (np * 16 * kRow + kk * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_16816<kElem>(acc_s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<kElem>(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// The online softmax over one tile's scores (the variant's already): every row's block max first, then one vote
// of the warp on rescaling O and the sums; then P = exp2(s * scale_log2 - m) added to the rows' sums and rounded
// to the 16-bit type as the A fragments of P V.
template <ElemType kElem, int kMTiles, int kNTiles, int kDTiles>
__device__ __forceinline__ void softmax_update(float (&acc_s)[kMTiles][kNTiles][4], float (&row_max)[kMTiles][2],
                                               float (&row_sum)[kMTiles][2], float (&acc_o)[kMTiles][kDTiles][4],
                                               u32 (&p_frag)[kMTiles][kNTiles / 2][4], const float& scale_log2) {
  float block_max[kMTiles][2];  // this tile's max (log2 units) of rows g and g + 8 of each tile
  bool any_rescale = false;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      block_max[mt][h] = softmax::block_max<kNTiles>(acc_s[mt], h, scale_log2);
      any_rescale |= softmax::max_moves(block_max[mt][h], row_max[mt][h]);
    }
  if (__any_sync(0xffffffffu, any_rescale)) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool moves = softmax::max_moves(block_max[mt][h], row_max[mt][h]);
        const float correction = softmax::move_max(moves, block_max[mt][h], row_max[mt][h]);
        row_sum[mt][h] *= correction;
        softmax::scale_row(acc_o[mt], h, correction);
      }
  }
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      row_sum[mt][h] += softmax::exponentiate<kNTiles, true>(acc_s[mt], h, row_max[mt][h], scale_log2);
    pack_a_steps<kElem, kNTiles / 2>(p_frag[mt], acc_s[mt]);
  }
}

// O += P V: the keys are the k dimension; v_tile + v_lane is the lane's ldmatrix address of key 0 of the warp's
// keys in a (keys, kRow) V tile read transposed (v_lane: the lane pattern of fwd_sm80.cuh's).
template <ElemType kElem, int kRow, int kMTiles, int kPSteps, int kDTiles>
__device__ __forceinline__ void pv_product(float (&acc_o)[kMTiles][kDTiles][4], const u32 (&p_frag)[kMTiles][kPSteps][4],
                                           u32 v_tile, u32 v_lane) {
#pragma unroll
  for (int j = 0; j < kPSteps; ++j)
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      u32 b[4];  // B fragments of V for d tiles 2dp and 2dp+1, 16x8 each
      ldmatrix_x4_trans(b, v_tile + v_lane + (j * 16 * kRow + dp * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_16816<kElem>(acc_o[mt][2 * dp], p_frag[mt][j], b[0], b[1]);
        mma_16816<kElem>(acc_o[mt][2 * dp + 1], p_frag[mt][j], b[2], b[3]);
      }
    }
}

}  // namespace sm80
}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -c` check this header on its own: one tile of 16 rows by 16 keys.
__global__ void flashgen_sm80_attend_check(float* out) {
  extern __shared__ unsigned char smem[];
  const flashgen::sm80::u32 base = flashgen::sm80::smem_addr(smem);
  float acc_s[1][2][4], acc_o[1][8][4] = {}, row_max[1][2] = {{-1e30f, -1e30f}}, row_sum[1][2] = {};
  flashgen::sm80::u32 p_frag[1][1][4];
  auto load_a = [&](int, int kk, flashgen::sm80::u32 (&a)[4]) { flashgen::sm80::ldmatrix_x4(a, base + kk * 32); };
  flashgen::sm80::qk_product<flashgen::ElemType::kFloat16, 4, 72>(acc_s, load_a, base, 0u);
  flashgen::sm80::softmax_update<flashgen::ElemType::kFloat16>(acc_s, row_max, row_sum, acc_o, p_frag, 1.f);
  flashgen::sm80::pv_product<flashgen::ElemType::kFloat16, 72>(acc_o, p_frag, base, 0u);
  out[threadIdx.x] = acc_o[0][0][0] + row_sum[0][0];
}
#endif
