// The Hopper backward's scheduler (bwd_sm90.cuh): which key block of which kv head and batch entry a block
// computes, in which order it walks the query blocks that see it, and where each step's query block lies in the
// workspace, with its dQ semaphore and, under the deterministic strategy, this block's turn there.
#pragma once

#include "attn_params.cuh"
#include "block_range.cuh"
#include "bwd_rows.cuh"
#include "bwd_sm90_layout.cuh"
#include "sequence.cuh"
#include "sm90_primitives.cuh"
#include "variant.cuh"

namespace flashgen {

template <class Cfg>
struct BwdSm90Scheduler : BwdSm90Layout<Cfg> {
  using L = BwdSm90Layout<Cfg>;
  using typename L::Variant;
  using L::kBlockM;
  using L::kBlockN;
  using L::kDeterministic;
  using L::kDkdvSplit;
  using L::kFirstAddStores;
  using L::kTileDim;
  using L::kVarlen;

  // This block's key block n_block of batch entry (or packed sequence) `batch` and kv head; where the TMA
  // maps hold its rows (a packed batch is one entry of total rows: its sequence starts at q_row0, k_row0);
  // the query blocks that see some key of it, per query head: m_first .. m_blocks - 1, those in
  // [m_interior, m_interior_end) seeing every key (no mask code; block_range.cuh), walked from
  // m_first + rotation, wrapping.
  struct Work {
    int n_block, n_start, kv_head, batch;
    int q_row0, k_row0, tma_batch;
    int m_blocks, m_first, m_interior, m_interior_end, per_head, iterations, rotation;
  };

  // Which key block of which kv head and batch entry (or packed sequence) this block is: the grid is
  // (key blocks, kv heads, batch), and blocks launch in the order of x, then y, then z. The deterministic
  // strategy takes key blocks last first (see write_dq), so a block waits only on blocks launched before
  // it, or without a mask on blocks of its own launch group (dq_turn). On 128-key blocks it launches them
  // launch_group() key blocks of every (kv head, batch) at a time: a query block's turns then chain the few
  // key blocks of its head that run together rather than all of them, so a late step holds back fewer
  // blocks (bench/notes_bwd_sm90.md, Versions: launch groups).
  // The 64-key blocks of the dK/dV split keep whole heads together: their single stage waits for each Q
  // tile, which a whole head's blocks find in L2 (grouped, they ran slower).
  struct Place {
    int n_block, kv_head, batch;
  };
  // Key blocks per launch group: 8, or on 64-column tiles without a mask, whose steps are short, 2 where a head has
  // fewer than 8 key blocks: its walk is then too short for a group of 8 to rotate (dq_turn), and an unrotated
  // group's blocks all reach query block 0 in the same step (bench/notes_bwd_sm90.md, Versions: launch groups,
  // rotated walks).
  static __device__ int launch_group(int n_blocks) {
    if constexpr (kTileDim == 64 && !Variant::kHidesKeys) {
      return n_blocks < 8 ? 2 : 8;
    } else {
      return 8;
    }
  }
  static __device__ Place place_of_this_block() {
    const int n_blocks = gridDim.x;
    if constexpr (!kDeterministic) {
      return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    } else if constexpr (kDkdvSplit) {
      return {n_blocks - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    } else {
      const int launch = launch_group(n_blocks);
      const int heads = gridDim.y, pairs = gridDim.y * gridDim.z;
      const int linear = blockIdx.x + n_blocks * (blockIdx.y + heads * blockIdx.z);
      const int whole_groups = n_blocks / launch;
      const int group = min(linear / (launch * pairs), whole_groups);  // the last takes what remains
      const int size = group < whole_groups ? launch : n_blocks - whole_groups * launch;
      const int within = linear - group * launch * pairs;
      const int pair = within / size;
      return {n_blocks - 1 - (group * launch + within % size), pair % heads, pair / heads};
    }
  }

  // The deterministic strategy's turns without a mask (dq_turn): key block n_block's launch group (launch_group key
  // blocks, the last group what remains) and its place in the group's launch order; whether the walks rotate. They
  // do where every head's walk is as long as a group (no two blocks of a group start at the same query block) and
  // one launch group of every (batch, kv head) pair fills the SMs (counted by sm_count_bound) with a group to spare:
  // a group then starts once the group before it of its pair has finished, instead of waiting on that group's last
  // adds, which a rotated walk makes at its end (bench/notes_bwd_sm90.md, Versions: rotated walks).
  static constexpr bool kRotatedTurns = kDeterministic && !Variant::kHidesKeys && !kDkdvSplit && !kVarlen;
  struct RotatedTurns {
    int launch, groups_before, index, size;
    bool rotate;
  };
  static __device__ RotatedTurns rotated_turns(const Work& w) {
    RotatedTurns t;
    const int n_blocks = gridDim.x;
    t.launch = launch_group(n_blocks);
    const int order = n_blocks - 1 - w.n_block;  // launch order in the head
    t.groups_before = order / t.launch;
    t.index = order % t.launch;
    const int whole_groups = n_blocks / t.launch;
    t.size = t.groups_before < whole_groups ? t.launch : n_blocks - whole_groups * t.launch;
    t.rotate = w.per_head >= t.launch &&
               static_cast<long long>(gridDim.y) * gridDim.z * t.launch >= sm90::sm_count_bound() + t.launch;
    return t;
  }

  // p: params.base, or with a packed batch the sequence's own (bind_sequence), whose rows are `rows`.
  static __device__ Work work_of(const AttnBwdParams& p, const SequenceRows& rows) {
    const Place place = place_of_this_block();
    Work w;
    w.n_block = place.n_block;
    w.n_start = w.n_block * kBlockN;
    w.kv_head = place.kv_head;
    w.batch = place.batch;
    w.q_row0 = kVarlen ? rows.q_begin : 0;
    w.k_row0 = kVarlen ? rows.k_begin : 0;
    w.tma_batch = kVarlen ? 0 : w.batch;
    const QueryBlocks<Variant, kBlockM, kBlockN> queries(p, w.batch, w.n_start, [&] { return p.seqlen_k - w.n_start; },
                                                         w.kv_head);
    w.m_blocks = queries.end;
    w.m_first = queries.begin;
    w.m_interior = queries.full_begin;
    w.m_interior_end = queries.full_end;
    w.per_head = w.m_blocks - w.m_first;
    w.iterations = w.per_head * p.group_size;
    // Key blocks that see every query block would reach each at the same step, where the atomic
    // strategy's first add stores and the others wait for it (write_dq): each starts at a query block of
    // its own instead. Causal key blocks reach a query block one or two steps apart from the diagonal on,
    // and the deterministic turns follow that order.
    w.rotation = !kDeterministic && kFirstAddStores && w.m_first == 0 && w.per_head > 0 ? w.n_block % w.per_head : 0;
    if constexpr (kRotatedTurns) {
      // The block's launch group and place in it (place_of_this_block): the group's blocks start their walks one
      // query block apart, the first launched furthest on (dq_turn).
      const RotatedTurns t = rotated_turns(w);
      if (t.rotate) w.rotation = t.size - 1 - t.index;
    }
    return w;
  }

  static __device__ int head_of(const AttnBwdParams& p, const Work& w, int it) {
    return w.kv_head * p.group_size + it / w.per_head;
  }
  static __device__ int m_block_of(const Work& w, int it) { return w.m_first + (it + w.rotation) % w.per_head; }

  // The first row of a query block of `head` in the workspace arrays (padded: whole blocks are read and added).
  static __device__ long long workspace_row(const AttnBwdParams& p, const Work& w, int head, int m_start) {
    return bwd::workspace_row0<Cfg>(p, w.batch, head) + m_start;
  }

  // The semaphore of the query block whose first workspace row is row0 (bwd::dq_semaphore), and the count
  // it holds when this key block may add to it under the deterministic strategy (write_dq says in which
  // order).
  static __device__ int* dq_semaphore(const AttnBwdParams& p, long long row0) { return bwd::dq_semaphore(p, row0); }
  static __device__ int dq_turn(const AttnBwdParams& p, const Work& w, int m_start) {
    if constexpr (kRotatedTurns) {
      // Without a mask every key block reaches every query block. The blocks of a launch group start their walks at
      // query blocks size - 1 - index (index: the place in the group's launch order), so at query block m those that
      // started at or before it arrive in launch order, one step apart, and those that wrap around to it arrive
      // last, at the end of their walks, again in launch order. The turns follow, group by group in launch order:
      // a group's blocks that arrive without wrapping, then those that wrap. A block waits on blocks launched before
      // it, or on blocks of its own group, which are resident together once the groups launched before it have
      // finished, provided the process may use as many SMs as a group has blocks (at most 8): fewer, as under an MPS
      // thread percentage or a green context of fewer SMs, which %nsmid does not show, could hang here.
      const RotatedTurns t = rotated_turns(w);
      const int first = t.groups_before * t.launch;
      return t.rotate ? rotated_dq_turn(first, t.index, t.size, m_start / kBlockM) : first + t.index;
    } else {
      // (A user mask's classes are per kv head: any query head of the group reads them.)
      return KeyBlocks<Variant, kBlockN>(p, w.batch, m_start, kBlockM, w.kv_head * p.group_size).end - 1 - w.n_block;
    }
  }
  // Step it's query block as the dQ writer and the turn warps see it: its first workspace row, its semaphore and,
  // under the deterministic strategy, this block's turn there.
  struct DqSite {
    long long row0;
    int* semaphore;
    int turn;
  };
  static __device__ DqSite dq_site(const AttnBwdParams& p, const Work& w, int it) {
    const int m_start = m_block_of(w, it) * kBlockM;
    const long long row0 = workspace_row(p, w, head_of(p, w, it), m_start);
    return {row0, dq_semaphore(p, row0), kDeterministic ? dq_turn(p, w, m_start) : 0};
  }
};

}  // namespace flashgen

#ifdef FLASHGEN_STANDALONE
// Lets `nvcc -DFLASHGEN_STANDALONE -gencode=arch=compute_90a,code=sm_90a -c` compile this file on its own.
template struct flashgen::BwdSm90Scheduler<FlashgenDefaultBwdSm90Config>;
#endif
