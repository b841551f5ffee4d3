// The options a problem's calls pass.
#include "problem/call.hpp"

namespace flashgen {

CallOptions call_options(const AttentionProblem& problem, float softmax_scale) {
  CallOptions options;
  options.softmax_scale = softmax_scale;
  options.mask = problem.mask;
  options.deterministic = problem.deterministic();
  options.softcap = problem.softcap;
  options.window_left = problem.window_left;
  options.window_right = problem.window_right;
  options.attention_chunk = problem.attention_chunk;
  return options;
}

}  // namespace flashgen
