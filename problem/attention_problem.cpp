// Names and constructors of the one problem type.
#include "problem/attention_problem.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>
#include <random>
#include <string>

#include "flashgen/error.hpp"

namespace flashgen {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3:
      return "e4m3";
    case DType::kFloat8E5M2:
      return "e5m2";
    default:
      return "fp16";
  }
}

void AttentionProblem::set_mask(Mask caller_mask, int caller_window_left, int caller_window_right,
                                int caller_attention_chunk) {
  mask = caller_mask;
  window_left = window_right = -1;
  attention_chunk = 0;
  if (caller_attention_chunk > 0 && caller_mask != Mask::kCausalTopLeft) {
    mask = Mask::kSlidingWindow;
    attention_chunk = caller_attention_chunk;
    if (caller_mask == Mask::kSlidingWindow) {
      window_left = caller_window_left, window_right = caller_window_right;
    } else {
      window_right = caller_mask == Mask::kCausal ? 0 : -1;
    }
    return;
  }
  if (caller_mask != Mask::kSlidingWindow) return;
  if (caller_window_left == -1 && caller_window_right == -1) {
    mask = Mask::kNone;
  } else if (caller_window_left == -1 && caller_window_right == 0) {
    mask = Mask::kCausal;
  } else {
    window_left = caller_window_left, window_right = caller_window_right;
  }
}

AttentionProblem forward_problem(DType dtype, const AttentionShape& shape, Mask mask, int window_left,
                                 int window_right, int attention_chunk) {
  AttentionProblem problem;
  problem.dtype = dtype;
  problem.shape = shape;
  problem.set_mask(mask, window_left, window_right, attention_chunk);
  return problem;
}

AttentionProblem backward_problem(DType dtype, const AttentionShape& shape, Mask mask, bool deterministic,
                                  int window_left, int window_right, int attention_chunk) {
  AttentionProblem problem = forward_problem(dtype, shape, mask, window_left, window_right, attention_chunk);
  problem.pass = Pass::kBackward;
  problem.dq = deterministic ? DqStrategy::kDeterministic : DqStrategy::kAtomic;
  return problem;
}

std::vector<int64_t> packed_lengths(int64_t count, int64_t longest, int64_t total) {
  FLASHGEN_REQUIRE(count >= 1 && longest >= 0 && longest <= total && total <= count * longest,
                   "packed_lengths: need 1 <= count, 0 <= longest <= total <= count * longest; got count " +
                       std::to_string(count) + ", longest " + std::to_string(longest) + ", total " + std::to_string(total));
  // A straight ramp from longest down to `last` over `ramp` sequences sums to ramp * (longest + last) / 2: the
  // shortest that reaches total, the rest of the batch empty when even a ramp to 0 over all of it is too much.
  const double mean = static_cast<double>(total) / static_cast<double>(count);
  int64_t ramp = count;
  double last = 2 * mean - static_cast<double>(longest);
  if (last < 0) {
    ramp = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(2.0 * static_cast<double>(total) / std::max<int64_t>(1, longest))));
    ramp = std::min(ramp, count);
    last = ramp == 1 ? static_cast<double>(longest) : 0.0;
  }
  std::vector<int64_t> lengths(static_cast<size_t>(count), 0);
  int64_t sum = 0;
  for (int64_t i = 0; i < ramp; ++i) {
    const double t = ramp == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(ramp - 1);
    lengths[size_t(i)] = std::clamp<int64_t>(std::llround(static_cast<double>(longest) + t * (last - longest)), 0, longest);
    sum += lengths[size_t(i)];
  }
  // Rounding (and a ramp that had to end at 0) leaves a few tokens over or under: take them from, or give them to,
  // the sequences after the first (which stays the longest), one token each in turn.
  for (size_t i = 1; sum != total; i = i + 1 < lengths.size() ? i + 1 : 1) {
    if (lengths.size() == 1) break;
    if (sum < total && lengths[i] < longest) ++lengths[i], ++sum;
    else if (sum > total && lengths[i] > 0) --lengths[i], --sum;
  }
  // Fisher-Yates over mt19937_64's specified sequence (std::shuffle's draws differ between standard libraries).
  std::mt19937_64 rng(0x5eed);
  for (size_t i = lengths.size(); i > 1; --i) std::swap(lengths[i - 1], lengths[size_t(rng() % i)]);
  return lengths;
}

AttentionShape PackedBatch::sequence(size_t b) const {
  AttentionShape one = shape;
  one.batch = 1, one.seqlen_q = len_q.at(b), one.seqlen_k = len_k.at(b);
  return one;
}

std::vector<size_t> PackedBatch::sampled_sequences() const {
  std::vector<size_t> nonempty;
  for (size_t b = 0; b < len_q.size(); ++b)
    if (len_q[b] > 0 && len_k[b] > 0) nonempty.push_back(b);
  if (nonempty.empty()) return {};
  auto by_length = [&](size_t a, size_t b) { return len_q[a] < len_q[b]; };
  std::vector<size_t> picked = {*std::max_element(nonempty.begin(), nonempty.end(), by_length),
                                *std::min_element(nonempty.begin(), nonempty.end(), by_length), nonempty.front(),
                                nonempty.back()};
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  return picked;
}

PackedBatch packed_batch(const AttentionProblem& problem) {
  FLASHGEN_REQUIRE(problem.varlen, "packed_batch: the problem is not a packed (varlen) one");
  const AttentionShape& s = problem.shape;
  PackedBatch batch;
  batch.shape = s;
  batch.len_q = packed_lengths(s.batch, s.seqlen_q, problem.total_q);
  batch.len_k = s.seqlen_k == s.seqlen_q && problem.total_k == problem.total_q
                    ? batch.len_q
                    : packed_lengths(s.batch, s.seqlen_k, problem.total_k);
  for (const auto& [lengths, cu] : {std::pair{&batch.len_q, &batch.cu_q}, std::pair{&batch.len_k, &batch.cu_k}}) {
    cu->push_back(0);
    for (int64_t n : *lengths) {
      FLASHGEN_REQUIRE(cu->back() + n <= INT32_MAX, "packed_batch: more than 2^31 - 1 rows");
      cu->push_back(static_cast<int32_t>(cu->back() + n));
    }
  }
  return batch;
}

}  // namespace flashgen
