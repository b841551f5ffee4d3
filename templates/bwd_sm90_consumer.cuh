// The Hopper backward's consumer (bwd_sm90.cuh): one warpgroup of 64 keys (with the dK/dV split, its part of
// the block's 64) walks the block's query blocks: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ on wgmma from shared memory, Pᵀ
// and dSᵀ in registers (bwd_scores.cuh), dV += Pᵀ dO and dK += dSᵀ Q, dSᵀ staged for dQ = dS K, whose share it
// stores to the dQ tile (or adds to the accumulator). Here: the thread's place, dK and dV, and the scores' Pᵀ and
// dSᵀ; the main loops in bwd_sm90_mainloops.cuh (the consumers' turns, or lock step), the stores of dK and dV in
// bwd_sm90_epilogue.cuh.
#pragma once

#include "attn_params.cuh"
#include "bwd_scores.cuh"
#include "bwd_sm90_epilogue.cuh"
#include "bwd_sm90_layout.cuh"
#include "bwd_sm90_mainloops.cuh"
#include "bwd_sm90_scheduler.cuh"
#include "sm90_primitives.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90Consumer : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using Epilogue = BwdSm90Epilogue<Cfg>;
  using Mainloops = BwdSm90Mainloops<Cfg>;
  using Scheduler = BwdSm90Scheduler<Cfg>;
  using Work = typename Scheduler::Work;
  using ThreadPlace = typename Mainloops::ThreadPlace;
  using typename L::Barriers;
  using typename L::Part;
  using typename L::u32;
  using typename L::Variant;
  using L::kDGroups;
  using L::kDGroupsV;
  using L::kDkdvSplit;
  using L::kDqColParts;
  using L::kDqCols;
  using L::kDqOffset;
  using L::kDqPasses;
  using L::kDqRowTiles;
  using L::kDqTileBytes;
  using L::kPingPong;
  using L::kQuerySplit;
  using L::kRowBytes;
  using L::kSGroups;
  using L::kTraits;
  using L::kVOffset;
  static constexpr bool kSinkGrad = ConfigSinkGrad<Cfg>::value;  // the sinks' gradient summed over the scores

  // kPasses: this consumer's dQ passes (kDqCols columns each); kPart: what else it computes.
  template <int kPasses, Part kPart>
  static __device__ void consume(const AttnBwdSm90Params& params, const AttnBwdParams& p, const Work& w, u32 smem,
                                 const Barriers& bars) {
    const int consumer = threadIdx.x / 128 - 1;
    const int warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // accumulator row within an 8-row group
    const int t = lane % 4;  // accumulator column pair
    const int key_consumer = kTraits.key_consumers == 1 ? 0 : consumer;  // which 64 keys of the block are its
    const int key_row0 = key_consumer * 64 + warp * 16 + g;  // this thread's keys: key_row0 and + 8, block-relative
    const u32 sk = smem;
    const u32 sv = smem + kVOffset;
    const u32 sk_rows = sk + key_consumer * 64 * kRowBytes;  // this consumer's 64 keys in chunk 0
    const u32 sv_rows = sv + key_consumer * 64 * kRowBytes;
    const u32 sdq = smem + kDqOffset + (kQuerySplit ? consumer : 0) * kDqTileBytes;

    // This consumer's share of dQ: 64-row tiles of the query block and a range of columns (the dK/dV split:
    // consumer 0 takes the first two chunks).
    // With the query split, all of its own query block's dQ.
    constexpr bool kSplitRows = kDqColParts == 1;
    const int dq_tile0 = kQuerySplit ? 0 : kSplitRows ? consumer * kDqRowTiles : consumer / kDqColParts;
    const int dq_col0 = kQuerySplit || kSplitRows ? 0
                        : kDkdvSplit              ? (consumer % kDqColParts) * kDqPasses * kDqCols
                                                  : (consumer % kDqColParts) * kDqCols;

    float acc_dk[kDGroups][4];
    float acc_dv[kDGroupsV][4];
#pragma unroll
    for (int i = 0; i < (kDGroups > kDGroupsV ? kDGroups : kDGroupsV); ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (i < kDGroups) acc_dk[i][e] = 0.f;
        if (i < kDGroupsV) acc_dv[i][e] = 0.f;
      }

    // The sinks' gradient (ConfigSinkGrad): this warp's Σ P_sink · P · dP over the scores of query head sink_head,
    // added to its partial (bwd_rows.cuh) when the walk moves to another head and at its end. The partials start at
    // 0, so a warp that sees no score of a head (a consumer that only computes dPᵀ: the dK/dV split) leaves 0.
    float sink_sum = 0.f;
    int sink_head = -1;
    [[maybe_unused]] auto sink_partial = [&](int head) {
      return bwd::sink_partial<Cfg>(params.base, head, w.batch, w.n_block, consumer * 4 + warp);
    };
    [[maybe_unused]] auto flush_sink_sum = [&] {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) sink_sum += __shfl_xor_sync(0xffffffffu, sink_sum, offset);
      if (lane == 0 && sink_head >= 0) *sink_partial(sink_head) += sink_sum;
      sink_sum = 0.f;
    };
    if constexpr (kSinkGrad) {
      static_assert(ConfigSinkGrad<Cfg>::partial_warps == kTraits.consumers * 4, "one partial per consumer warp");
      if (lane == 0) {
        for (int head = w.kv_head * p.group_size; head < (w.kv_head + 1) * p.group_size; ++head) {
          *sink_partial(head) = 0.f;
        }
      }
    }

    sm90::mbarrier_wait(bars.kv_full(), 0);

    // Where entry (i, 2h + e) of this thread's Sᵀ lies: key key_row0 + 8h, query 8i + 2t + e.
    auto score_at = [&](int head, int m_start, int i, int h, int e) {
      return ScoreAt{w.batch, head, m_start + 8 * i + 2 * t + e, w.n_start + key_row0 + 8 * h};
    };
    // Pᵀ = exp2(x - lse2) with x = s * scale_log2 (s: the variant's score) and hidden entries at 0; queries past
    // seqlen_q have lse2 = +inf in the padded workspace, so only keys need masking. A variant whose gradient
    // reads its score (kGradReadsScore) keeps x here (-inf where hidden) and takes Pᵀ from it with dSᵀ
    // (gradients below), once dPᵀ is in: then x needs no register of its own, nor a log2 to rebuild it from P.
    auto probabilities = [&](float (&acc_s)[kSGroups][4], u32 s_lse, int head, int m_start, auto masked) {
      // Key row h's hidden queries, at offsets from the thread's first column m_start + 2t.
      using Queries = decltype(bwd::key_queries<Variant>(p, w.batch, head, 0, 0));
      Queries queries[2];
      if constexpr (decltype(masked)::value) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          queries[h] = bwd::key_queries<Variant>(p, w.batch, head, w.n_start + key_row0 + 8 * h, m_start + 2 * t);
        }
      }
#pragma unroll
      for (int i = 0; i < kSGroups; ++i) {
        float lse2[2];
        if constexpr (!Variant::kGradReadsScore) sm90::ld_shared_f32x2(s_lse + (8 * i + 2 * t) * 4, lse2[0], lse2[1]);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const ScoreAt at = score_at(head, m_start, i, h, e);
            float s = bwd::scaled_score<Variant>(p, at, acc_s[i][2 * h + e]);
            if (decltype(masked)::value && queries[h].hidden(8 * i + e)) s = neg_inf();
            if constexpr (Variant::kGradReadsScore) {
              acc_s[i][2 * h + e] = s;
            } else {
              acc_s[i][2 * h + e] = bwd::probability(s, lse2[e]);
            }
          }
      }
    };
    // Group i's dSᵀ = Pᵀ ∘ (dPᵀ - D) into acc_dp, with respect to q·k (the variant's score_grad), and, where
    // acc_s still holds the score x (kGradReadsScore), Pᵀ into acc_s. A hidden entry (x = -inf, P = 0) gets
    // dS = 0 by a select; its gradient is evaluated at x = 0 meanwhile (the soft cap's at -inf is NaN). With
    // either select alone ptxas spills more at the d64 and d256 tiles' register bound.
    auto gradients = [&](float (&acc_s)[kSGroups][4], float (&acc_dp)[kSGroups][4], int i, u32 s_lse, u32 s_dsum,
                         int head, int m_start) {
      float dsum[2];
      sm90::ld_shared_f32x2(s_dsum + (8 * i + 2 * t) * 4, dsum[0], dsum[1]);
      float lse2[2];
      if constexpr (Variant::kGradReadsScore || kSinkGrad) {
        sm90::ld_shared_f32x2(s_lse + (8 * i + 2 * t) * 4, lse2[0], lse2[1]);
      }
      if constexpr (kSinkGrad) {
        if (head != sink_head) {
          flush_sink_sum();
          sink_head = head;
        }
      }
      // Σ P · dP over this thread's two keys of queries 8i + 2t and + 1 (kSinkGrad).
      [[maybe_unused]] float row_sum[2] = {0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const ScoreAt at = score_at(head, m_start, i, e / 2, e % 2);
        if constexpr (kSinkGrad && !Variant::kGradReadsScore) row_sum[e % 2] += acc_s[i][e] * acc_dp[i][e];
        if constexpr (Variant::kGradReadsScore) {
          const float x = acc_s[i][e];
          const bool hidden = x == neg_inf();
          acc_s[i][e] = bwd::probability(x, lse2[e % 2]);
          if constexpr (kSinkGrad) row_sum[e % 2] += acc_s[i][e] * acc_dp[i][e];
          const float grad =
              bwd::score_gradient<Variant>(p, at, hidden ? 0.f : x, acc_s[i][e], acc_dp[i][e], dsum[e % 2]);
          acc_dp[i][e] = hidden ? 0.f : grad;
        } else {
          acc_dp[i][e] = bwd::score_gradient<Variant>(p, at, 0.f, acc_s[i][e], acc_dp[i][e], dsum[e % 2]);
        }
      }
      if constexpr (kSinkGrad) {
        const float sink_log2 = p.variant.sinks[head] * 1.4426950408889634f;
        sink_sum += bwd::sink_probability(sink_log2, lse2[0]) * row_sum[0] +
                    bwd::sink_probability(sink_log2, lse2[1]) * row_sum[1];
      }
    };

    const ThreadPlace place{consumer, key_consumer, key_row0, t, dq_tile0, dq_col0, sk, sk_rows, sv_rows, sdq};
    if constexpr (kPingPong) {
      Mainloops::ping_pong(p, w, smem, bars, place, acc_dk, acc_dv, probabilities, gradients);
    } else {
      Mainloops::template lock_step<kPasses, kPart>(p, w, smem, bars, place, acc_dk, acc_dv, probabilities, gradients);
    }

    if constexpr (kSinkGrad) flush_sink_sum();
    Epilogue::template store<kPart>(params, p, w, smem, bars, consumer, key_consumer, key_row0, t, acc_dk, acc_dv);
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::BwdSm90Consumer<FlashgenDefaultBwdSm90Config>;
#endif
