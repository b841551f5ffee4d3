// Tests for problem/attention_problem: the problem type's constructors, its kernel mask kind (a window's
// normalization), dQ strategy, options and group arithmetic, and the lengths a packed batch is run with from its
// sizes.
#include <algorithm>
#include <numeric>
#include <vector>

#include "catch.hpp"
#include "problem/attention_problem.hpp"
#include "problem/call.hpp"

using flashgen::AttentionProblem;
using flashgen::AttentionShape;
using flashgen::DType;

TEST_CASE("forward and backward problems carry their pass, mask and dQ strategy", "[problem]") {
  const AttentionShape shape{/*batch=*/2, /*seqlen_q=*/100, /*seqlen_k=*/300, /*heads_q=*/12, /*heads_kv=*/4,
                             /*head_dim=*/80};
  const AttentionProblem forward = flashgen::forward_problem(DType::kBFloat16, shape, flashgen::Mask::kCausalTopLeft);
  CHECK(forward.pass == flashgen::Pass::kForward);
  CHECK_FALSE(forward.backward());
  CHECK(forward.dtype == DType::kBFloat16);
  CHECK(forward.head_dim() == 80);
  CHECK(forward.mask == flashgen::Mask::kCausalTopLeft);
  // Both causal alignments run the causal kernels; the alignment stays in the problem.
  CHECK(forward.mask_kind() == flashgen::MaskKind::kCausal);
  CHECK(flashgen::forward_problem(DType::kFloat16, shape, flashgen::Mask::kNone).mask_kind() ==
        flashgen::MaskKind::kNone);

  // A forward problem has no dQ strategy, whatever the field holds.
  AttentionProblem odd = forward;
  odd.dq = flashgen::DqStrategy::kDeterministic;
  CHECK_FALSE(odd.deterministic());

  const AttentionProblem det = flashgen::backward_problem(DType::kFloat16, shape, flashgen::Mask::kCausal, true);
  CHECK(det.backward());
  CHECK(det.deterministic());
  CHECK(det.dq == flashgen::DqStrategy::kDeterministic);
  CHECK_FALSE(flashgen::backward_problem(DType::kFloat16, shape, flashgen::Mask::kCausal, false).deterministic());
}

TEST_CASE("a window is normalized in one place: unbounded windows run as the plain masks", "[problem][window]") {
  const AttentionShape shape{1, 100, 300, 4, 4, 64};
  auto masked = [&](flashgen::Mask mask, int left, int right) {
    return flashgen::backward_problem(DType::kFloat16, shape, mask, /*deterministic=*/true, left, right);
  };
  const AttentionProblem window = masked(flashgen::Mask::kSlidingWindow, 128, 0);
  CHECK(window.windowed());
  CHECK(window.mask_kind() == flashgen::MaskKind::kWindow);
  CHECK((window.window_left == 128 && window.window_right == 0));
  const AttentionProblem open_left = masked(flashgen::Mask::kSlidingWindow, -1, 5);
  CHECK((open_left.windowed() && open_left.window_left == -1 && open_left.window_right == 5));
  // No bound on either side: no mask; none on the left and nothing past the diagonal: the bottom-right causal mask.
  const AttentionProblem none = masked(flashgen::Mask::kSlidingWindow, -1, -1);
  CHECK(none.mask == flashgen::Mask::kNone);
  CHECK(none.mask_kind() == flashgen::MaskKind::kNone);
  const AttentionProblem causal = masked(flashgen::Mask::kSlidingWindow, -1, 0);
  CHECK(causal.mask == flashgen::Mask::kCausal);
  CHECK_FALSE(causal.windowed());
  CHECK((causal.window_left == -1 && causal.window_right == -1));
  // The other masks take no window; set_mask drops one the problem held.
  AttentionProblem reused = window;
  reused.set_mask(flashgen::Mask::kCausalTopLeft, 7, 7);
  CHECK((reused.mask == flashgen::Mask::kCausalTopLeft && reused.window_left == -1 && reused.window_right == -1));
  // A call's options give the problem back.
  AttentionProblem capped = window;
  capped.softcap = 30.f;
  const flashgen::CallOptions options = flashgen::call_options(capped, 0.125f);
  CHECK(options.softmax_scale == 0.125f);
  CHECK(options.mask == flashgen::Mask::kSlidingWindow);
  CHECK((options.window_left == 128 && options.window_right == 0));
  CHECK(options.softcap == 30.f);
  CHECK(options.deterministic);
  const AttentionProblem back = flashgen::backward_problem(DType::kFloat16, shape, options.mask, options.deterministic,
                                                           options.window_left, options.window_right);
  CHECK((back.mask == window.mask && back.window_left == 128 && back.window_right == 0));
}

TEST_CASE("a shape's query heads map onto their key/value heads in groups", "[problem]") {
  const AttentionShape gqa{1, 1, 1, /*heads_q=*/12, /*heads_kv=*/4, 64};
  CHECK(gqa.group_size() == 3);
  CHECK(gqa.kv_head(0) == 0);
  CHECK(gqa.kv_head(2) == 0);
  CHECK(gqa.kv_head(3) == 1);
  CHECK(gqa.kv_head(11) == 3);
  const AttentionShape mha{2, 5, 7, 3, 3, 64};
  CHECK(mha.group_size() == 1);
  CHECK(mha.kv_head(2) == 2);
  CHECK(mha.reference_cost() == 2.0 * 3 * 5 * 7 * 64);
  CHECK(flashgen::dtype_name(DType::kFloat16) == std::string("fp16"));
  CHECK(flashgen::dtype_name(DType::kBFloat16) == std::string("bf16"));
}

TEST_CASE("packed_lengths spreads a packed batch's lengths from the longest down to its total", "[problem]") {
  auto check = [](int64_t count, int64_t longest, int64_t total) {
    INFO(count << " sequences, longest " << longest << ", " << total << " tokens");
    const std::vector<int64_t> lengths = flashgen::packed_lengths(count, longest, total);
    REQUIRE(lengths.size() == static_cast<size_t>(count));
    CHECK(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) == total);
    CHECK(*std::max_element(lengths.begin(), lengths.end()) == longest);
    CHECK(*std::min_element(lengths.begin(), lengths.end()) >= 0);
    CHECK(flashgen::packed_lengths(count, longest, total) == lengths);  // deterministic
    return lengths;
  };
  CHECK(check(1, 300, 300) == std::vector<int64_t>{300});
  CHECK(check(4, 100, 400) == std::vector<int64_t>(4, 100));
  // 64 sequences between 128 and 8k: an even ramp, shuffled (not sorted either way).
  const std::vector<int64_t> ramp = check(64, 8192, 64 * (8192 + 128) / 2);
  CHECK(*std::min_element(ramp.begin(), ramp.end()) >= 120);
  CHECK_FALSE(std::is_sorted(ramp.begin(), ramp.end()));
  CHECK_FALSE(std::is_sorted(ramp.rbegin(), ramp.rend()));
  // Fewer tokens than a ramp to 0 holds: some sequences are empty.
  const std::vector<int64_t> sparse = check(10, 1000, 1500);
  CHECK(std::count(sparse.begin(), sparse.end(), 0) >= 5);
  check(7, 0, 0);
  check(3, 17, 50);
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(flashgen::packed_lengths(0, 10, 10), Contains("1 <= count"));
  CHECK_THROWS_WITH(flashgen::packed_lengths(2, 10, 21), Contains("total 21"));
  CHECK_THROWS_WITH(flashgen::packed_lengths(2, 10, 9), Contains("longest <= total"));
}
