// Tests for tuner/sweep_driver's host helpers: the window a shrunk float64 check problem of a windowed sweep
// runs with.
#include "catch.hpp"
#include "problem/attention_problem.hpp"
#include "tuner/sweep_driver.hpp"

using flashgen::AttentionProblem;

namespace {

AttentionProblem sized(int64_t seqlen_q, int64_t seqlen_k, int left, int right) {
  flashgen::AttentionShape shape;
  shape.seqlen_q = seqlen_q, shape.seqlen_k = seqlen_k;
  return flashgen::forward_problem(flashgen::DType::kBFloat16, shape, flashgen::Mask::kSlidingWindow, left, right);
}

}  // namespace

TEST_CASE("a shrunk check problem's window is scaled to its lengths and stays a window", "[tuner][sweep][window]") {
  // A 4k causal window over 16k keys hides keys of a 259-key check only once scaled: 4095 * 259 / 16384 = 65.
  const AttentionProblem big = sized(16384, 16384, 4095, 0);
  const AttentionProblem small = flashgen::sweep_driver::with_check_window(sized(259, 259, 4095, 0), big);
  CHECK(small.windowed());
  CHECK(small.window_left == 65);
  CHECK(small.window_right == 0);
  CHECK(small.shape.seqlen_k == 259);
  // A side that was bounded stays >= 1 (so (-1, R) does not become the causal mask); -1 and 0 are kept.
  const AttentionProblem right_only = flashgen::sweep_driver::with_check_window(sized(259, 321, -1, 3), sized(8192, 32768, -1, 3));
  CHECK(right_only.windowed());
  CHECK(right_only.window_left == -1);
  CHECK(right_only.window_right == 1);
  // A check as long as the sweep keeps the window; a problem without one is left as it is.
  CHECK(flashgen::sweep_driver::with_check_window(sized(100, 100, 7, 2), sized(100, 100, 7, 2)).window_left == 7);
  flashgen::AttentionShape shape;
  const AttentionProblem causal = flashgen::forward_problem(flashgen::DType::kFloat16, shape, flashgen::Mask::kCausal);
  CHECK(flashgen::sweep_driver::with_check_window(causal, causal).mask == flashgen::Mask::kCausal);
  CHECK_FALSE(flashgen::sweep_driver::with_check_window(causal, causal).windowed());
}
