// The [gpu] forward tests' problems: shape, dtype, mask, scale, memory layout and input kind; their host
// data and device tensors; run_and_check against the float64 reference; and the named problem sets.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

#include "check/reference.hpp"
#include "flashgen/flashgen.h"
#include "generator/kernel_config.hpp"
#include "runtime/device_buffer.hpp"

namespace flashgen::test {

// Memory layouts of q, k, v and out; the shape handed to flashgen is always [b, s, h, d].
enum class Layout {
  kBSHD,       // contiguous [b, s, h, d]
  kBHSD,       // memory [b, h, s, d]
  kPadded,     // [b, s, h, d] with gaps after every head, row and batch, filled with NaN
  kPackedQKV,  // q, k, v slices of one [b, s, heads_q + 2 * heads_kv, d] buffer (seqlen_q == seqlen_k);
               // out padded as kPadded
};

// What the inputs hold. The kernel keeps a running row max m in log2 units that moves only when a key
// block's max exceeds it by more than 8, rescaling O by exp2(m_old - m_new) (templates/fwd_sm80.cuh);
// with random normal inputs m never moves after the first block. The shaped kinds set each key's logit
// (in log2 units, before noise of ~0.14) so that it does; running_max_stats in
// tests/support/test_forward_problem.cpp replays m on the data to check that.
enum class Logits {
  kNormal,   // q, k, v standard normal
  kRising,   // logits climb from 0 to 48 along the keys: m moves every few blocks, over a live history
  kPlateau,  // key 5 peaks at 16, keys in the middle third sit at 22.5, the rest at 0: m never moves
             // after the first block, and later blocks have P = exp2(s - m) up to ~2^6.5, not <= 1
  kJump,     // 0 for the first half of the keys, 20 for the second: m moves once, by ~20, mid-sequence
};

struct Problem {
  AttentionShape shape;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  float softmax_scale = 0.0f;  // <= 0: the library's default 1/sqrt(head_dim)
  Layout layout = Layout::kBSHD;
  bool with_lse = true;
  Logits logits = Logits::kNormal;
  uint32_t seed = 1;

  std::string describe() const;  // every field, for INFO and to rerun a failure
};

// Where one tensor lives: its buffer, its first element and its strides.
struct Placement {
  int buffer = 0;
  int64_t base = 0;  // elements from the buffer start; keeps 16-byte alignment (a multiple of 8)
  StridedView view;
};

struct ProblemLayout {
  Placement q, k, v;
  StridedView out;                     // in its own buffer, base 0
  std::vector<int64_t> input_elements; // size of each input buffer, guard included
  int64_t out_elements = 0;            // guard included
};

// Host side of one problem: 16-bit images of the input buffers (NaN outside the tensors) and the same
// values as contiguous [b, s, h, d] doubles for the references.
struct HostProblem {
  ProblemLayout layout;
  std::vector<std::vector<uint16_t>> buffers;
  std::vector<double> q, k, v;
};

// Draws the inputs from p.seed (normal or shaped as p.logits says) and lays them out as p.layout says.
HostProblem make_host_problem(const Problem& p);

// The problem's input buffers, uploaded.
std::vector<DeviceBuffer> upload_inputs(const HostProblem& host);

// q, k and v over the uploaded inputs.
struct InputTensors {
  flashgen_tensor q, k, v;
};
InputTensors input_tensors(const std::vector<DeviceBuffer>& in, const ProblemLayout& layout, flashgen_dtype dtype);

// Runs one problem on stream (NULL: the legacy default stream) and checks out and lse against the float64
// reference with the naive-dtype error budget: through the C ABI when configs is empty, else once per
// config through launch_forward, outputs poisoned before each run. The caller holds a ScopedContext.
void run_and_check(const Problem& p, CUstream stream = nullptr,
                   const std::vector<flashgen::KernelConfig>& configs = {});

// A problem in the BSHD layout with the default scale, lse and normal inputs.
Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                     int64_t head_dim, flashgen_dtype dtype, flashgen_mask mask, uint32_t seed);

// ---------------------------------------------------------------------------------------------------
// Problem sets, each the same on every machine.

// Keeps each problem's CPU references (two passes of b * hq * sq * sk * d multiply-adds each, float64
// and float32) to a fraction of a second.
constexpr double kMaxReferenceCost = 6e7;

// The randomized matrix: every head_dim (the standard ones three times, 40/72/136 once), both dtypes,
// the three masks, GQA groups 1/2/4 and MQA, both plain layouts and custom or default scales, each list
// balanced then shuffled so the combinations vary; seqlens drawn independently for q and k. Batch, heads
// and finally the seqlens give way when the reference would cost too much.
std::vector<Problem> randomized_matrix(uint32_t seed);
constexpr uint32_t kMatrixSeed = 20250611u;

// Masking edge cases: fully masked rows, both alignments, extreme seqlen ratios, a sharp softmax.
std::vector<Problem> masking_edge_problems();

// Strided layouts: BHSD, padded rows/heads/batches, q/k/v slices of one packed buffer.
std::vector<Problem> layout_problems();

// The shaped problems of the rescaling test: each logit shape at head_dim 64 and 128, both dtypes, with
// no mask and with bottom-right causal (query row i then sees the first i + 871 of the 1000 keys), GQA
// 2:1. 1000 keys leave a partial last block for every block_n.
std::vector<Problem> rescale_problems();

}  // namespace flashgen::test
