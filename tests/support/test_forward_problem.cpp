// CPU checks of the forward tests' problems (support/forward_problem.hpp): the randomized matrix covers
// what the [gpu] cases claim, shaped logits move the kernel's running max, and check_forward flags damage.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "check/reference.hpp"
#include "support/attention_reference.hpp"
#include "support/forward_problem.hpp"
#include "support/strided_tensors.hpp"

using namespace flashgen::test;

namespace {

using flashgen::AttentionShape;

// templates/fwd_sm80.cuh's kRescaleSlack: the running max moves only when a block's max exceeds it by more.
constexpr double kRescaleSlack = 8.0;

// The kernel's running max replayed on the host over every row that sees a key, for key blocks of one
// block_n, on float64 logits of the stored inputs (log2 units, scale applied).
struct RunningMaxStats {
  int64_t min_moves = std::numeric_limits<int64_t>::max();  // moves after a row's first block
  int64_t max_moves = 0;
  double largest_move = 0.0;  // m_new - m_old of one of those moves
  double largest_p_log2 = -std::numeric_limits<double>::infinity();  // largest s - m: P = exp2(s - m)

  std::string describe() const {
    std::ostringstream s;
    s << "moves after the first block: " << min_moves << ".." << max_moves << " per row, largest move "
      << largest_move << ", largest P 2^" << largest_p_log2;
    return s.str();
  }
};

std::vector<RunningMaxStats> running_max_stats(const Problem& p, const HostProblem& host,
                                               const std::vector<int>& block_ns) {
  const AttentionShape& s = p.shape;
  const double scale_log2 = flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim) / std::log(2.0);
  std::vector<RunningMaxStats> stats(block_ns.size());
  std::vector<double> logits(static_cast<size_t>(s.seqlen_k));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t visible = flashgen::visible_key_count(flashgen::from_c(p.mask), i, s.seqlen_q, s.seqlen_k);
        if (visible == 0) continue;
        const double* q_row = host.q.data() + ((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim;
        for (int64_t j = 0; j < visible; ++j) {
          const double* k_row = host.k.data() + ((b * s.seqlen_k + j) * s.heads_kv + s.kv_head(h)) * s.head_dim;
          double dot = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d) dot += q_row[d] * k_row[d];
          logits[static_cast<size_t>(j)] = dot * scale_log2;
        }
        for (size_t n = 0; n < block_ns.size(); ++n) {
          RunningMaxStats& row_stats = stats[n];
          double m = -std::numeric_limits<double>::infinity();
          int64_t moves = -1;  // the first block always moves m off -inf; that one is not counted
          for (int64_t start = 0; start < visible; start += block_ns[n]) {
            const auto first = logits.begin() + start;
            const auto last = first + std::min<int64_t>(block_ns[n], visible - start);
            const double block_max = *std::max_element(first, last);
            if (block_max > m + kRescaleSlack) {
              if (moves >= 0) row_stats.largest_move = std::max(row_stats.largest_move, block_max - m);
              m = block_max;
              ++moves;
            }
            row_stats.largest_p_log2 = std::max(row_stats.largest_p_log2, block_max - m);
          }
          row_stats.min_moves = std::min(row_stats.min_moves, moves);
          row_stats.max_moves = std::max(row_stats.max_moves, moves);
        }
      }
  return stats;
}

}  // namespace

TEST_CASE("randomized attention matrix covers every parameter", "[attention]") {
  const std::vector<Problem> problems = randomized_matrix(kMatrixSeed);
  std::set<int64_t> head_dims;
  std::set<int> dtypes, masks, layouts;
  std::set<int64_t> groups;
  bool mqa = false, custom_scale = false, default_scale = false;
  for (const Problem& p : problems) {
    INFO(p.describe());
    CHECK(p.shape.reference_cost() <= kMaxReferenceCost);
    CHECK(p.shape.heads_q % p.shape.heads_kv == 0);
    CHECK(p.shape.heads_q <= 8);
    CHECK(p.shape.batch >= 1);
    CHECK(p.shape.batch <= 3);
    head_dims.insert(p.shape.head_dim);
    dtypes.insert(p.dtype);
    masks.insert(p.mask);
    layouts.insert(static_cast<int>(p.layout));
    groups.insert(p.shape.heads_q / p.shape.heads_kv);
    mqa = mqa || (p.shape.heads_kv == 1 && p.shape.heads_q > 1);
    (p.softmax_scale > 0.0f ? custom_scale : default_scale) = true;
  }
  CHECK(head_dims == std::set<int64_t>{32, 40, 64, 72, 96, 128, 136, 192, 256});
  CHECK(dtypes.size() == 2);
  CHECK(masks.size() == 3);
  CHECK(layouts.size() == 2);
  CHECK(groups.count(1) == 1);
  CHECK(groups.count(2) == 1);
  CHECK(groups.count(4) == 1);
  CHECK(mqa);
  CHECK(custom_scale);
  CHECK(default_scale);
  // The same seed gives the same matrix: a failure names a problem that can be rerun.
  const std::vector<Problem> again = randomized_matrix(kMatrixSeed);
  REQUIRE(again.size() == problems.size());
  for (size_t i = 0; i < problems.size(); ++i) CHECK(again[i].describe() == problems[i].describe());
}

TEST_CASE("shaped logits move the kernel's running max as the rescaling test claims", "[attention]") {
  const std::vector<int> block_ns = {16, 32, 48, 64, 128};  // every block_n a config may use here
  for (const Problem& p : rescale_problems()) {
    INFO(p.describe());
    const HostProblem host = make_host_problem(p);
    double largest = 0.0;
    for (const std::vector<double>* values : {&host.q, &host.k, &host.v})
      for (double value : *values) largest = std::max(largest, std::fabs(value));
    CHECK(largest < 16.0);  // inputs far inside fp16's range (65504)
    const std::vector<RunningMaxStats> stats = running_max_stats(p, host, block_ns);
    for (size_t n = 0; n < block_ns.size(); ++n) {
      INFO("block_n " << block_ns[n] << ": " << stats[n].describe());
      switch (p.logits) {
        case Logits::kRising:
          CHECK(stats[n].min_moves >= 3);
          break;
        case Logits::kPlateau:
          CHECK(stats[n].max_moves == 0);
          CHECK(stats[n].largest_p_log2 >= 5.0);
          break;
        case Logits::kJump:
          CHECK(stats[n].min_moves == 1);
          CHECK(stats[n].max_moves == 1);
          CHECK(stats[n].largest_move >= 16.0);
          break;
        default:
          FAIL_CHECK("not a shaped problem");
      }
    }
  }
}

TEST_CASE("check_forward passes an exact output and flags each kind of damage", "[attention]") {
  for (Layout layout : {Layout::kBSHD, Layout::kPadded, Layout::kPackedQKV}) {
    Problem p = make_problem(2, 64, 64, 4, 2, 40, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, 901);
    p.layout = layout;
    INFO(p.describe());
    const HostProblem host = make_host_problem(p);
    const AttentionShape& s = p.shape;
    const flashgen::test::ForwardReference reference = flashgen::test::forward_reference(
        s, host.q, host.k, host.v, flashgen::effective_softmax_scale(p.softmax_scale, s.head_dim), p.mask, p.dtype);

    // What an exact kernel leaves in poisoned buffers: the float64 result rounded to the dtype, lse as float.
    std::vector<uint16_t> out_storage(static_cast<size_t>(host.layout.out_elements), flashgen::test::kPoison16);
    std::vector<double> exact_out = reference.ref64.out;
    const flashgen::DType dtype = flashgen::from_c(p.dtype);
    for (double& value : exact_out) value = flashgen::round_to_dtype(static_cast<float>(value), dtype);
    flashgen::test::store_values(exact_out, host.layout.out, 0, p.dtype, out_storage);
    float poison = 0.0f;
    std::memcpy(&poison, &flashgen::test::kPoison32, sizeof(poison));
    std::vector<float> lse(reference.ref64.lse.size() + kGuardElements, poison);
    for (size_t i = 0; i < reference.ref64.lse.size(); ++i) lse[i] = static_cast<float>(reference.ref64.lse[i]);

    const ForwardCheck exact = flashgen::test::check_forward(reference, out_storage, host.layout.out, &lse);
    INFO(exact.out.text << "\n" << exact.out_touched_text << "\n" << exact.lse.text << "\n" << exact.lse_touched_text);
    CHECK(exact.ok());
    CHECK(exact.out.checked == static_cast<int64_t>(reference.ref64.out.size()));
    CHECK_FALSE(flashgen::test::check_forward(reference, out_storage, host.layout.out, nullptr).has_lse);

    std::vector<uint16_t> damaged = out_storage;
    damaged[static_cast<size_t>(host.layout.out.offset(1, 63, 3, 39))] = flashgen::test::kPoison16;
    const ForwardCheck unwritten = flashgen::test::check_forward(reference, damaged, host.layout.out, &lse);
    CHECK(unwritten.out.not_written == 1);
    CHECK_FALSE(unwritten.ok());

    damaged = out_storage;
    damaged.back() = 0;  // the last guard element
    const ForwardCheck outside = flashgen::test::check_forward(reference, damaged, host.layout.out, &lse);
    CHECK(outside.out_touched == 1);
    CHECK(outside.out.ok);
    CHECK_FALSE(outside.ok());

    std::vector<float> bad_lse = lse;
    bad_lse[5] += 0.5f;
    bad_lse.back() = 0.0f;
    const ForwardCheck lse_damage = flashgen::test::check_forward(reference, out_storage, host.layout.out, &bad_lse);
    CHECK(lse_damage.lse.mismatches == 1);
    CHECK(lse_damage.lse_touched == 1);
    CHECK_FALSE(lse_damage.ok());
  }
}
