// [gpu] flashgen_attention_forward through the C ABI against the float64 reference: masking edge cases, the
// randomized matrix, strides, head_dims 8 and 248, lse NULL, user streams, changing seqlens, lazy rescaling.
#include <cuda.h>

#include <vector>

#include "catch.hpp"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/forward_problem.hpp"
#include "support/user_stream.hpp"

using namespace flashgen::test;

TEST_CASE("attention forward: causal alignment and fully masked rows", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (const Problem& p : masking_edge_problems()) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: randomized matrix against the float64 reference", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (const Problem& p : randomized_matrix(kMatrixSeed)) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: BHSD, padded and packed-qkv strides", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (const Problem& p : layout_problems()) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: lse may be NULL", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // The second has fully masked rows: without lse their out must still be 0.
  std::vector<Problem> problems = {
      make_problem(2, 128, 256, 4, 2, 64, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 301),
      make_problem(1, 203, 7, 2, 1, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 302),
  };
  for (Problem& p : problems) {
    p.with_lse = false;
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: runs on a stream from cuStreamCreate", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  for (unsigned flags : {static_cast<unsigned>(CU_STREAM_DEFAULT), static_cast<unsigned>(CU_STREAM_NON_BLOCKING)}) {
    Stream stream(flags);
    Problem p = make_problem(2, 256, 1023, 4, 1, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 401 + flags);
    INFO("stream flags " << flags << ": " << p.describe());
    run_and_check(p, stream.get());
  }
}

TEST_CASE("attention forward: back-to-back calls with different seqlens", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // One kernel config (bf16, d 128, causal) with batch and seqlens changing between calls, then the first
  // problem again: sequence lengths are runtime arguments, nothing may be stale.
  const std::vector<Problem> problems = {
      make_problem(1, 128, 128, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 501),
      make_problem(3, 1023, 203, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 502),
      make_problem(2, 7, 2049, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 503),
      make_problem(1, 113, 64, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 504),
      make_problem(1, 128, 128, 2, 2, 128, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 501),
  };
  for (const Problem& p : problems) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: head_dim 8 and 248", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  const flashgen_dtype f16 = FLASHGEN_FLOAT16;
  const flashgen_dtype bf16 = FLASHGEN_BFLOAT16;
  const flashgen_mask none = FLASHGEN_MASK_NONE;
  const flashgen_mask br = FLASHGEN_MASK_CAUSAL;
  const flashgen_mask tl = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  // The smallest head_dim (padded to one 16-column mma step) and the largest non-standard one (padded to
  // 256). The padded layout puts NaN in the 8 columns after each head that the kernel pads to.
  std::vector<Problem> problems = {
      make_problem(2, 203, 64, 4, 2, 8, f16, br, 601),
      make_problem(1, 130, 1023, 2, 1, 8, bf16, none, 602),
      make_problem(1, 77, 77, 3, 1, 8, bf16, tl, 603),
      make_problem(1, 128, 128, 2, 1, 8, f16, br, 604),
      make_problem(1, 203, 7, 2, 1, 248, bf16, br, 605),  // rows 0..195 see no key
      make_problem(1, 130, 1023, 1, 1, 248, f16, tl, 606),
      make_problem(2, 113, 256, 2, 2, 248, f16, none, 607),
      make_problem(1, 64, 64, 2, 1, 248, bf16, br, 608),
  };
  problems[0].layout = Layout::kPadded;
  problems[2].layout = Layout::kBHSD;
  problems[2].softmax_scale = 0.3f;
  problems[3].layout = Layout::kPackedQKV;
  problems[4].layout = Layout::kPadded;
  problems[6].layout = Layout::kBHSD;
  problems[7].layout = Layout::kPackedQKV;
  for (const Problem& p : problems) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: running max moves over a history (lazy rescaling)", "[gpu][attention]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  // Logits that climb, plateau inside the rescale slack, or jump by ~20 in log2 units along the keys
  // (checked on the CPU by "shaped logits move the kernel's running max ..."): out and lse must still
  // match the float64 reference.
  for (const Problem& p : rescale_problems()) {
    INFO(p.describe());
    run_and_check(p);
  }
}
