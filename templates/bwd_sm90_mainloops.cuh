// The Hopper backward's main loops (bwd_sm90_consumer.cuh): a consumer warpgroup's walk over the block's
// query blocks, the consumers taking turns (ping_pong) or in lock step (lock_step: the dK/dV split and the query
// split among them), and what both share: the scores' wgmma product and dSᵀ's staging.
#pragma once

#include "attn_params.cuh"
#include "bwd_sm90_layout.cuh"
#include "bwd_sm90_scheduler.cuh"
#include "sm80_primitives.cuh"
#include "sm90_primitives.cuh"
#include "sm90_wgmma_rs.cuh"
#include "sm90_wgmma_ss.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90Mainloops : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using Scheduler = BwdSm90Scheduler<Cfg>;
  using Work = typename Scheduler::Work;
  using typename L::Barriers;
  using typename L::Part;
  using typename L::u32;
  using typename L::u64;
  using typename L::Variant;
  using L::kBlockM;
  using L::kBlockN;
  using L::kChunks;
  using L::kDGroups;
  using L::kDGroupsV;
  using L::kDSteps;
  using L::kDStepsV;
  using L::kDeferDq;
  using L::kDeterministic;
  using L::kDqChunkBytes;
  using L::kDqCols;
  using L::kDqGroups;
  using L::kDqRowTiles;
  using L::kDqStaged;
  using L::kDqWriterThreads;
  using L::kDsOffset;
  using L::kDsTileBytes;
  using L::kDsTiles;
  using L::kElem;
  using L::kExchangeOffset;
  using L::kMSteps;
  using L::kNSteps;
  using L::kQTileBytes;
  using L::kQuerySplit;
  using L::kRowBytes;
  using L::kRowStatsBytes;
  using L::kRowStatsOffset;
  using L::kSGroups;
  using L::kStageBytes;
  using L::kStageOffset;
  using L::kStages;
  using L::kStepConsumers;
  using L::kTileDim;
  using L::kTileDimV;
  using L::consumers_sync;
  using L::dq_empty_barrier;
  using L::dq_full_barrier;
  using L::ring_phase;
  using L::swizzled;
  using L::turn_barrier;

  // Step it's Pᵀ and dSᵀ as 16-bit A fragments (of dV += Pᵀ dO and dK += dSᵀ Q; accumulator groups 2j and
  // 2j + 1 are k-step j's fragment), and dSᵀ into step it's swizzled dSᵀ tile, at ds_tile(it), for the dQ product
  // (this thread's keys from key_row0); with kDeferDq once every consumer's dQ product of kDsTiles steps ago has
  // read the tile, announced on its ds_full barrier.
  template <int kFrags, class DsTile>
  static __device__ __forceinline__ void stage_ds(u32 (&p_frag)[kMSteps][4], u32 (&ds_frag)[kFrags][4],
                                                  const float (&acc_s)[kSGroups][4], const float (&acc_dp)[kSGroups][4],
                                                  const DsTile& ds_tile, const Barriers& bars, int it, int key_row0,
                                                  int t) {
#pragma unroll
    for (int j = 0; j < kMSteps; ++j) {
      sm80::pack_a<kElem>(p_frag[j], acc_s[2 * j], acc_s[2 * j + 1]);
      sm80::pack_a<kElem>(ds_frag[j], acc_dp[2 * j], acc_dp[2 * j + 1]);
    }
    if constexpr (kDeferDq) {
      if (it >= kDsTiles) sm90::mbarrier_wait(bars.ds_empty(it % kDsTiles), ((it / kDsTiles) & 1) ^ 1);
    }
    const u32 sds = ds_tile(it);
#pragma unroll
    for (int i = 0; i < kSGroups; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 word = ds_frag[i / 2][2 * (i % 2) + h];
        sm90::st_shared_u32(sds + swizzled(kBlockN, key_row0 + 8 * h, 8 * i + 2 * t), word);
      }
    sm90::fence_proxy_async_smem();
    if constexpr (kDeferDq) sm90::mbarrier_arrive(bars.ds_full(it % kDsTiles));
  }

  // acc = A Bᵀ over kSteps k-steps of a head dim as one wgmma group (Sᵀ = K Qᵀ over head_dim, or dPᵀ = V dOᵀ over
  // the values'): A the consumer's 64 rows of K or V, B the stage's Q or dO, both K-major.
  template <int kSteps>
  static __device__ __forceinline__ void transposed_product(float (&acc)[kSGroups][4], u64 desc_a, u64 desc_b) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const u32 offset = (kk / 4) * kBlockN * kRowBytes + (kk % 4) * 32;
      const u32 q_offset = (kk / 4) * kBlockM * kRowBytes + (kk % 4) * 32;
      sm90::WgmmaSS<kBlockM>::template run<kElem>(acc, sm90::smem_desc_advance(desc_a, offset),
                                                  sm90::smem_desc_advance(desc_b, q_offset), kk > 0 ? 1 : 0);
    }
    sm90::wgmma_commit();
  }

  // A consumer thread's place (consume): its consumer, which 64 keys of the block are its (key_consumer) and its
  // accumulators' rows key_row0 and + 8 and column pair t; its share of dQ (dq_tile0, dq_col0); the K tile, its
  // 64 rows of K and of V and its dQ tile in shared memory.
  struct ThreadPlace {
    int consumer, key_consumer, key_row0, t, dq_tile0, dq_col0;
    u32 sk, sk_rows, sv_rows, sdq;
  };

  // The consumers take turns issuing their products, so that one computes Pᵀ and dSᵀ while the other's
  // products run (the lock-step loop below runs both consumers' softmax at once, with the tensor cores idle).
  // A step's work: Sᵀ and dPᵀ (scores), Pᵀ and dSᵀ (softmax), dV and dK (grads), and one step later its dQ
  // (defer_dq: the other consumer's dSᵀ of the step before is staged by then). Consumer c's turn at step it
  // issues step it's grads, step it - 1's dQ and step it + 1's scores back to back, hands the turn over
  // (barrier turn_barrier(1 - c)) and computes step it + 1's softmax. Consumer 0 takes the first turn.
  // Within a turn the grads are waited for before Sᵀ is issued and dQ is staged before dPᵀ is, so at most
  // two accumulators besides dK and dV are in flight (three spill at the 240-register budget); issuing Sᵀ
  // behind dQ keeps the tensor cores fed (issued only after the grads and dQ were done, it lost time:
  // bench/notes_bwd_sm90.md, Versions: ping-pong).
  // The first and last turns are compile-time instances (run-time conditions inside one turn kept the
  // scores' accumulators live across iterations: 300-650 bytes of spills). Three dSᵀ tiles: a consumer
  // stores step it's while the other's dQ product of step it - 2 may still read its tile.
  // dK += dSᵀ Q reads dSᵀ from its shared tile where the gradient reads the score (the soft cap): its
  // fragments then live only within the softmax, whose longer work would otherwise spill 16-24 bytes.
  template <class Probabilities, class Gradients>
  static __device__ void ping_pong(const AttnBwdParams& p, const Work& w, u32 smem, const Barriers& bars,
                                   const ThreadPlace& place, float (&acc_dk)[kDGroups][4],
                                   float (&acc_dv)[kDGroupsV][4], const Probabilities& probabilities,
                                   const Gradients& gradients) {
    const int consumer = place.consumer;
    const int key_consumer = place.key_consumer;
    const int key_row0 = place.key_row0;
    const int t = place.t;
    const int dq_col0 = place.dq_col0;
    const u32 sk = place.sk;
    const u32 sk_rows = place.sk_rows;
    const u32 sv_rows = place.sv_rows;
    const u32 sdq = place.sdq;
    constexpr bool kDkFromTile = Variant::kGradReadsScore;
    u32 p_frag[kMSteps][4];                     // Pᵀ of the step whose grads are next, as 16-bit A fragments
    u32 ds_kept[kDkFromTile ? 1 : kMSteps][4];  // its dSᵀ
    const u64 desc_k_rows = sm90::smem_desc_sw128(sk_rows, 16, 1024);
    const u64 desc_v_rows = sm90::smem_desc_sw128(sv_rows, 16, 1024);
    const u64 desc_k_mn = sm90::smem_desc_sw128(sk, kBlockN * kRowBytes, 1024);
    const u32 thread_in_group = threadIdx.x % 128;
    auto stage_q = [&](int it) { return smem + kStageOffset + (it % kStages) * kStageBytes; };
    auto ds_tile = [&](int it) { return smem + kDsOffset + (it % kDsTiles) * kDsTileBytes; };
    auto ds_phase = [&](int it) { return static_cast<u32>((it / kDsTiles) & 1); };
    // Sᵀ = K Qᵀ or dPᵀ = V dOᵀ of this consumer's keys, (64, kBlockM), kSteps k-steps along head_dim or the values'.
    auto issue_scores = [&](float(&acc)[kSGroups][4], u64 desc_a, u32 tile, auto steps) {
      const u64 desc_b = sm90::smem_desc_sw128(tile, 16, 1024);
      sm90::wgmma_fence();
      transposed_product<decltype(steps)::value>(acc, desc_a, desc_b);
    };
    using ScoreSteps = sm80::IntConstant<kDSteps>;
    using ValueSteps = sm80::IntConstant<kDStepsV>;
    // Step it's Pᵀ and dSᵀ from its Sᵀ and dPᵀ (the two newest wgmma groups), into p_frag and ds_kept, and
    // dSᵀ into its tile once both consumers' dQ products of kDsTiles steps ago have read it.
    auto softmax = [&](int it, float(&acc_s)[kSGroups][4], float(&acc_dp)[kSGroups][4]) {
      const int head = Scheduler::head_of(p, w, it);
      const int m_block = Scheduler::m_block_of(w, it);
      const int m_start = m_block * kBlockM;
      const u32 s_lse = smem + kRowStatsOffset + (it % kStages) * kRowStatsBytes;
      const u32 s_dsum = s_lse + kBlockM * 4;
      sm90::wgmma_wait<1>();
      sm90::pin_registers(acc_s);
      if (m_block < w.m_interior || m_block >= w.m_interior_end) {
        probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<true>{});
      } else {
        probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<false>{});
      }
      sm90::wgmma_wait<0>();
      sm90::pin_registers(acc_dp);
#pragma unroll
      for (int i = 0; i < kSGroups; ++i) gradients(acc_s, acc_dp, i, s_lse, s_dsum, head, m_start);
      // dSᵀ's fragments: kept for the next turn's dK, or (kDkFromTile) only until they are stored in the tile.
      u32 ds_local[kDkFromTile ? kMSteps : 1][4];
      auto& ds_frag = *[&] {
        if constexpr (kDkFromTile) {
          return &ds_local;
        } else {
          return &ds_kept;
        }
      }();
      stage_ds(p_frag, ds_frag, acc_s, acc_dp, ds_tile, bars, it, key_row0, t);
    };
    // dQ = dS K of step it (this consumer's 64 columns), once both consumers' dSᵀ of it are staged.
    auto issue_dq = [&](int it, float(&acc_dq)[kDqGroups][4]) {
      sm90::mbarrier_wait(bars.ds_full(it % kDsTiles), ds_phase(it));
      sm90::wgmma_fence();
      const u64 desc_ds_mn = sm90::smem_desc_sw128(ds_tile(it), kBlockN * kRowBytes, 1024);
#pragma unroll
      for (int j = 0; j < kNSteps; ++j) {
        const u32 step = j * 16 * kRowBytes;
        const u64 desc_k = sm90::smem_desc_advance(desc_k_mn, (dq_col0 / 64) * kBlockN * kRowBytes + step);
        sm90::WgmmaSSMN<kDqCols>::template run<kElem>(acc_dq, sm90::smem_desc_advance(desc_ds_mn, step), desc_k,
                                                      j > 0 ? 1 : 0);
      }
      sm90::wgmma_commit();
    };
    // Step it's dQ, complete, into the shared tile for the writer (in accumulator order, as below).
    auto stage_dq = [&](int it, float(&acc_dq)[kDqGroups][4]) {
      sm90::pin_registers(acc_dq);
      sm90::mbarrier_arrive(bars.ds_empty(it % kDsTiles));
      if (it >= 1) sm90::named_barrier_sync(dq_empty_barrier(consumer), kDqWriterThreads);
#pragma unroll
      for (int i = 0; i < kDqGroups; ++i) {
        const int chunk = dq_col0 / 64 + i / 8;
        const int offset = chunk * (kDqChunkBytes / 4) + ((i % 8) * 128 + static_cast<int>(thread_in_group)) * 4;
        sm90::st_shared_f32x4(sdq + offset * 4, acc_dq[i][0], acc_dq[i][1], acc_dq[i][2], acc_dq[i][3]);
      }
      sm90::fence_proxy_async_smem();
      sm90::named_barrier_arrive(dq_full_barrier(consumer), kDqWriterThreads);
    };
    // Consumer c's turn at step it (kPrev: it > 0, kNext: it + 1 < iterations).
    auto turn = [&](int it, auto prev, auto next) {
      constexpr bool kPrev = decltype(prev)::value;
      constexpr bool kNext = decltype(next)::value;
      const u32 sq = stage_q(it);
      const u32 sdo = sq + kQTileBytes;
      // dV and dK settle in their registers first: the first turn's zeros would otherwise be moved in after
      // the wgmma fence, where ptxas must fence again (and serializes every wgmma when that is under a branch).
      sm90::pin_registers(acc_dv);
      sm90::pin_registers(acc_dk);
      sm90::named_barrier_sync(turn_barrier(consumer), 256);
      // dV += Pᵀ dO and dK += dSᵀ Q: queries are the k dimension; dO and Q are read MN-major.
      const u64 desc_do_mn = sm90::smem_desc_sw128(sdo, kBlockM * kRowBytes, 1024);
      const u64 desc_q_mn = sm90::smem_desc_sw128(sq, kBlockM * kRowBytes, 1024);
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kMSteps; ++j) {
        sm90::WgmmaRS<kTileDimV>::template run<kElem>(acc_dv, p_frag[j],
                                                     sm90::smem_desc_advance(desc_do_mn, j * 16 * kRowBytes), 1);
      }
      if constexpr (kDkFromTile) {
        // This consumer's keys of step it's dSᵀ tile, stored by its own threads before the turn's barrier.
        const u64 desc_ds_rows = sm90::smem_desc_sw128(ds_tile(it) + key_consumer * 64 * kRowBytes, 16, 1024);
#pragma unroll
        for (int j = 0; j < kMSteps; ++j) {
          const u32 offset = (j / 4) * kBlockN * kRowBytes + (j % 4) * 32;
          sm90::WgmmaSSKMN<kTileDim>::template run<kElem>(acc_dk, sm90::smem_desc_advance(desc_ds_rows, offset),
                                                         sm90::smem_desc_advance(desc_q_mn, j * 16 * kRowBytes), 1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kMSteps; ++j) {
          sm90::WgmmaRS<kTileDim>::template run<kElem>(acc_dk, ds_kept[j],
                                                       sm90::smem_desc_advance(desc_q_mn, j * 16 * kRowBytes), 1);
        }
      }
      sm90::wgmma_commit();
      float acc_dq[kDqGroups][4];  // (64, kDqCols) of step it - 1's query block
      if constexpr (kPrev) {
        issue_dq(it - 1, acc_dq);
        sm90::wgmma_wait<1>();
      } else {
        sm90::wgmma_wait<0>();
      }
      sm90::pin_registers(acc_dv);
      sm90::pin_registers(acc_dk);
      // Done with the stage: its Q and dO read by step it's products, its LSE and D by its softmax (every
      // consumer thread arrives, as in the loop below).
      sm90::mbarrier_arrive(bars.empty(it % kStages));
      float acc_s[kSGroups][4];   // (64 keys, kBlockM queries) of step it + 1
      float acc_dp[kSGroups][4];
      if constexpr (kNext) {
        sm90::mbarrier_wait(bars.full((it + 1) % kStages), ring_phase(it + 1));
        issue_scores(acc_s, desc_k_rows, stage_q(it + 1), ScoreSteps{});
      }
      if constexpr (kPrev) {
        sm90::wgmma_wait<kNext ? 1 : 0>();
        stage_dq(it - 1, acc_dq);
      }
      if constexpr (kNext) issue_scores(acc_dp, desc_v_rows, stage_q(it + 1) + kQTileBytes, ValueSteps{});
      if (consumer == 0 || kNext) sm90::named_barrier_arrive(turn_barrier(1 - consumer), 256);
      if constexpr (kNext) softmax(it + 1, acc_s, acc_dp);
    };

    if (w.iterations > 0) {
      if (consumer == 1) sm90::named_barrier_arrive(turn_barrier(0), 256);
      {
        float acc_s[kSGroups][4];
        float acc_dp[kSGroups][4];
        sm90::mbarrier_wait(bars.full(0), ring_phase(0));
        issue_scores(acc_s, desc_k_rows, stage_q(0), ScoreSteps{});
        issue_scores(acc_dp, desc_v_rows, stage_q(0) + kQTileBytes, ValueSteps{});
        softmax(0, acc_s, acc_dp);
      }
      const int last = w.iterations - 1;
      if (last == 0) {
        turn(0, sm80::BoolConstant<false>{}, sm80::BoolConstant<false>{});
      } else {
        turn(0, sm80::BoolConstant<false>{}, sm80::BoolConstant<true>{});
        for (int it = 1; it < last; ++it) turn(it, sm80::BoolConstant<true>{}, sm80::BoolConstant<true>{});
        turn(last, sm80::BoolConstant<true>{}, sm80::BoolConstant<false>{});
      }
      float acc_dq[kDqGroups][4];
      issue_dq(last, acc_dq);
      sm90::wgmma_wait<0>();
      stage_dq(last, acc_dq);
    }
  }

  // The consumers in lock step (every tiling without ping_pong: the dK/dV split and the query split among
  // them): each step's Sᵀ and dPᵀ, Pᵀ and dSᵀ, dV and dK, then its dQ share (kPasses passes of kDqCols
  // columns), the dK/dV split's consumers passing dPᵀ and Pᵀ's fragments through the exchange tile.
  // With kDeferDq a step adds the previous step's dQ (after issuing its own dV and dK), and one more
  // iteration adds the last step's: the consumers meet at no barrier of a step, each waiting only for the
  // other's dSᵀ of the step before (staged a step ago) and, before storing dSᵀ into a tile, for the other's
  // dQ product that read it two steps ago.
  template <int kPasses, Part kPart, class Probabilities, class Gradients>
  static __device__ void lock_step(const AttnBwdParams& p, const Work& w, u32 smem, const Barriers& bars,
                                   const ThreadPlace& place, float (&acc_dk)[kDGroups][4],
                                   float (&acc_dv)[kDGroupsV][4], const Probabilities& probabilities,
                                   const Gradients& gradients) {
    const int consumer = place.consumer;
    constexpr bool kHasDk = kPart != Part::kGrads;
    constexpr bool kHasDv = kPart != Part::kScores;
    for (int it = kQuerySplit ? consumer : 0; it < w.iterations + (kDeferDq ? 1 : 0); it += kStepConsumers) {
      const int head = Scheduler::head_of(p, w, it);
      const int m_block = Scheduler::m_block_of(w, it);
      const int m_start = m_block * kBlockM;
      const int s = it % kStages;
      const u32 sq = smem + kStageOffset + s * kStageBytes;
      const u32 sdo = sq + kQTileBytes;
      const u32 s_lse = smem + kRowStatsOffset + s * kRowStatsBytes;
      const u32 s_dsum = s_lse + kBlockM * 4;
      const u32 sds = smem + kDsOffset + (it % 2) * kDsTileBytes;
      if (!kDeferDq || it < w.iterations) {  // with kDeferDq the last iteration only adds dQ
        sm90::mbarrier_wait(bars.full(s), ring_phase(it));
        const u64 desc_k_rows = sm90::smem_desc_sw128(place.sk_rows, 16, 1024);
        const u64 desc_v_rows = sm90::smem_desc_sw128(place.sv_rows, 16, 1024);
        const u64 desc_q = sm90::smem_desc_sw128(sq, 16, 1024);
        const u64 desc_do = sm90::smem_desc_sw128(sdo, 16, 1024);

        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for this consumer's keys: (64, kBlockM), k-steps along the head dims. With the
        // dK/dV split consumer 0 computes Sᵀ and consumer 1 dPᵀ.
        float acc_s[kSGroups][4];
        float acc_dp[kSGroups][4];
        sm90::wgmma_fence();
        if constexpr (kPart != Part::kGrads) transposed_product<kDSteps>(acc_s, desc_k_rows, desc_q);
        if constexpr (kPart != Part::kScores) transposed_product<kDStepsV>(acc_dp, desc_v_rows, desc_do);

        // Pᵀ and dSᵀ as 16-bit A fragments (groups 2j, 2j+1 are k-step j's A fragment).
        u32 p_frag[kMSteps][4];
        u32 ds_frag[kMSteps][4];
        // The exchange tile's slot of this thread's accumulator group (or fragment) i.
        const u32 exchange = smem + kExchangeOffset + (threadIdx.x % 128) * 16;
        auto exchange_slot = [&](int i) { return exchange + static_cast<u32>(i) * 128 * 16; };
        if constexpr (kPart == Part::kGrads) {
          // dPᵀ to consumer 0; back come Pᵀ's fragments (written over this thread's own slots, whose dPᵀ
          // consumer 0's same thread has read).
          sm90::wgmma_wait<0>();
          sm90::pin_registers(acc_dp);
#pragma unroll
          for (int i = 0; i < kSGroups; ++i) {
            sm90::st_shared_f32x4(exchange_slot(i), acc_dp[i][0], acc_dp[i][1], acc_dp[i][2], acc_dp[i][3]);
          }
          consumers_sync();  // dPᵀ stored
          consumers_sync();  // Pᵀ's fragments stored
#pragma unroll
          for (int j = 0; j < kMSteps; ++j) sm90::ld_shared_u32x4(exchange_slot(j), p_frag[j]);
        } else {
          sm90::wgmma_wait<kPart == Part::kBoth ? 1 : 0>();
          sm90::pin_registers(acc_s);
          if (m_block < w.m_interior || m_block >= w.m_interior_end) {
            probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<true>{});
          } else {
            probabilities(acc_s, s_lse, head, m_start, sm80::BoolConstant<false>{});
          }
          if constexpr (kPart == Part::kBoth) {
            sm90::wgmma_wait<0>();
            sm90::pin_registers(acc_dp);
          } else {
            consumers_sync();  // dPᵀ stored
          }
          // dSᵀ = Pᵀ ∘ (dPᵀ - D), with respect to q·k (the dK/dV split's consumer 0 reads dPᵀ group by group).
#pragma unroll
          for (int i = 0; i < kSGroups; ++i) {
            if constexpr (kPart == Part::kScores) {
              sm90::ld_shared_f32x4(exchange_slot(i), acc_dp[i][0], acc_dp[i][1], acc_dp[i][2], acc_dp[i][3]);
            }
            gradients(acc_s, acc_dp, i, s_lse, s_dsum, head, m_start);
          }
          // dSᵀ into shared memory for the dQ product; Pᵀ's fragments to consumer 1.
          stage_ds(p_frag, ds_frag, acc_s, acc_dp, [&](int) { return sds; }, bars, it, place.key_row0, place.t);
          if constexpr (kPart == Part::kScores) {
#pragma unroll
            for (int j = 0; j < kMSteps; ++j) sm90::st_shared_u32x4(exchange_slot(j), p_frag[j]);
            consumers_sync();  // Pᵀ's fragments stored
          }
        }

        // dV += Pᵀ dO and dK += dSᵀ Q (the dK/dV split: the consumer's one of them): queries are the k
        // dimension; dO and Q are read MN-major.
        const u64 desc_do_mn = sm90::smem_desc_sw128(sdo, kBlockM * kRowBytes, 1024);
        const u64 desc_q_mn = sm90::smem_desc_sw128(sq, kBlockM * kRowBytes, 1024);
        sm90::wgmma_fence();
        if constexpr (kHasDv) {
#pragma unroll
          for (int j = 0; j < kMSteps; ++j) {
            const u64 desc_do_j = sm90::smem_desc_advance(desc_do_mn, j * 16 * kRowBytes);
            sm90::WgmmaRS<kTileDimV>::template run<kElem>(acc_dv, p_frag[j], desc_do_j, 1);
          }
        }
        if constexpr (kHasDk) {
#pragma unroll
          for (int j = 0; j < kMSteps; ++j) {
            const u64 desc_q_j = sm90::smem_desc_advance(desc_q_mn, j * 16 * kRowBytes);
            sm90::WgmmaRS<kTileDim>::template run<kElem>(acc_dk, ds_frag[j], desc_q_j, 1);
          }
        }
        sm90::wgmma_commit();
      }

      // dQ = dS K of step dq_it (this step's, or with kDeferDq the previous one's) once every consumer's dSᵀ
      // of it is staged: A = dSᵀ and B = K, both read MN-major; keys are the k dimension. The dSᵀ tiles
      // alternate, so without kDeferDq the next step's stores need no barrier of their own.
      const int dq_it = kDeferDq ? it - 1 : it;
      if (kDeferDq && dq_it < 0) {  // no dQ yet: done with the stage once dV and dK are
        sm90::wgmma_wait<0>();
        sm90::pin_registers(acc_dv);
        sm90::pin_registers(acc_dk);
        sm90::mbarrier_arrive(bars.empty(s));
        continue;
      }
      if constexpr (kDeferDq) {
        sm90::mbarrier_wait(bars.ds_full(dq_it % 2), (dq_it / 2) & 1);
      } else if constexpr (kQuerySplit) {
        sm90::named_barrier_sync(2 + consumer, 128);  // its own dSᵀ, in its own tile (it % 2 == consumer)
      } else {
        consumers_sync();
      }
      const int dq_head = kDeferDq ? Scheduler::head_of(p, w, dq_it) : head;
      const int dq_m_start = kDeferDq ? Scheduler::m_block_of(w, dq_it) * kBlockM : m_start;
      const u32 dq_sds = kDeferDq ? smem + kDsOffset + (dq_it % 2) * kDsTileBytes : sds;
      const u64 desc_ds_mn = sm90::smem_desc_sw128(dq_sds, kBlockN * kRowBytes, 1024);
      const u64 desc_k_mn = sm90::smem_desc_sw128(place.sk, kBlockN * kRowBytes, 1024);
      const u32 thread_in_group = threadIdx.x % 128;
      // the query block's first accumulator row
      const long long dq_row0 = Scheduler::workspace_row(p, w, dq_head, dq_m_start);
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int col0 = place.dq_col0 + pass * kDqCols;
        float acc_dq[kDqRowTiles][kDqGroups][4];  // (kDqRowTiles x 64, kDqCols) of the query block
        if (pass > 0) sm90::wgmma_fence();  // the previous pass's reductions read these registers
#pragma unroll
        for (int r = 0; r < kDqRowTiles; ++r) {
#pragma unroll
          for (int j = 0; j < kNSteps; ++j) {
            const u32 step = j * 16 * kRowBytes;
            const u64 desc_ds = sm90::smem_desc_advance(desc_ds_mn, (place.dq_tile0 + r) * kBlockN * kRowBytes + step);
            const u64 desc_k = sm90::smem_desc_advance(desc_k_mn, (col0 / 64) * kBlockN * kRowBytes + step);
            sm90::WgmmaSSMN<kDqCols>::template run<kElem>(acc_dq[r], desc_ds, desc_k, j > 0 ? 1 : 0);
          }
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        if (pass == 0) {
          if constexpr (kHasDv) sm90::pin_registers(acc_dv);
          if constexpr (kHasDk) sm90::pin_registers(acc_dk);
        }
#pragma unroll
        for (int r = 0; r < kDqRowTiles; ++r) sm90::pin_registers(acc_dq[r]);
        // This thread is done with the stage (its wgmma have read Q and dO). Every consumer thread arrives,
        // for its own loads of LSE and D where it has any (one lane arriving for its warp after the bar.sync
        // is as correct, but compute-sanitizer's racecheck follows an mbarrier's order only from the threads
        // that arrive, and reports the producer's bulk copies of the stage's next use against the other
        // lanes' loads).
        if (pass == 0 && (!kDeferDq || it < w.iterations)) sm90::mbarrier_arrive(bars.empty(s));
        if constexpr (kDeferDq) {
          if (pass + 1 == kPasses) sm90::mbarrier_arrive(bars.ds_empty(dq_it % 2));  // this dSᵀ tile read
        }

        // This consumer's share of the query block's dQ in accumulator order: each 64 x 64 chunk holds this
        // thread's four values of 8-column group i at 16 * (128 * i + its index in the warpgroup), so a
        // warp's 16-byte accesses are 512 consecutive bytes. Rows past seqlen_q exist in the padded
        // accumulator and receive zeros.
        auto chunk_offset = [&](int r, int i) {  // in floats
          const int chunk = (place.dq_tile0 + r) * kChunks + col0 / 64 + i / 8;
          return chunk * (kDqChunkBytes / 4) + ((i % 8) * 128 + static_cast<int>(thread_in_group)) * 4;
        };
        if constexpr (kDqStaged) {
          // Into the shared dQ tile, once the writer has added the previous step's and handed it back.
          if (dq_it >= kStepConsumers && pass == 0) {
            sm90::named_barrier_sync(dq_empty_barrier(consumer), kDqWriterThreads);
          }
#pragma unroll
          for (int r = 0; r < kDqRowTiles; ++r)
#pragma unroll
            for (int i = 0; i < kDqGroups; ++i) {
              sm90::st_shared_f32x4(place.sdq + chunk_offset(r, i) * 4, acc_dq[r][i][0], acc_dq[r][i][1],
                                    acc_dq[r][i][2], acc_dq[r][i][3]);
            }
          if (pass + 1 == kPasses) {
            sm90::fence_proxy_async_smem();  // the writer's bulk reduce-add reads through the async proxy
            sm90::named_barrier_arrive(dq_full_barrier(consumer), kDqWriterThreads);
          }
        } else {
          // Straight into the accumulator with vector reductions; the deterministic strategy first waits for
          // this block's turn (write_dq says which), which passes on after the last pass.
          if (kDeterministic && pass == 0) {
            if (consumer == 0 && thread_in_group == 0) {
              const int turn = Scheduler::dq_turn(p, w, dq_m_start);
              while (sm90::ld_acquire_gpu(Scheduler::dq_semaphore(p, dq_row0)) != turn) {
              }
            }
            consumers_sync();
          }
          float* dq_tile = p.dq_accum + dq_row0 * kTileDim;
#pragma unroll
          for (int r = 0; r < kDqRowTiles; ++r)
#pragma unroll
            for (int i = 0; i < kDqGroups; ++i) {
              sm90::red_add_f32x4(dq_tile + chunk_offset(r, i), acc_dq[r][i][0], acc_dq[r][i][1], acc_dq[r][i][2],
                                  acc_dq[r][i][3]);
            }
        }
      }
      if constexpr (!kDqStaged && kDeterministic) {
        __threadfence();  // every thread's adds done before the turn passes on
        consumers_sync();
        if (consumer == 0 && thread_in_group == 0) {
          sm90::st_release_gpu(Scheduler::dq_semaphore(p, dq_row0), Scheduler::dq_turn(p, w, dq_m_start) + 1);
        }
      }
    }
  }

};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::BwdSm90Mainloops<FlashgenDefaultBwdSm90Config>;
#endif
