// The built-in choice for KV-cache (decode) calls: a DecodeConfig for the problem class and a split count for
// the problem's sizes on a GPU. A decode kernel streams K and V once, so the choice is about keeping enough
// bytes in flight on every SM: the packed query rows of a kv head in as few 16-row tiles as fit, as many
// pipeline stages as leave room for two blocks per SM, and enough key ranges per sequence to fill the GPU.
#pragma once

#include <vector>

#include "generator/decode_config.hpp"
#include "problem/attention_problem.hpp"
#include "tuner/choice.hpp"

namespace flashgen {

// The heuristic config for a KV-cache problem (problem.kv_cache) on sm_<arch>, and the split count that
// fills `multiprocessors` SMs best: the fewest ranges whose waves of blocks come within 85% of the fullest
// last wave any count reaches, one range when the sequences and heads alone fill the GPU.
DecodeChoice heuristic_decode_choice(const AttentionProblem& problem, int arch, int multiprocessors);

// The split count heuristic_decode_choice takes for config: exported for callers that force a config.
int heuristic_decode_splits(const AttentionProblem& problem, const DecodeConfig& config, int arch, int multiprocessors);

// The split counts worth timing for config at the problem's sizes: one range, heuristic_decode_splits's count,
// and the fewest ranges that give every SM one, two, three and four blocks; ascending, each at most
// max_decode_splits (the key blocks the rows can visit: a short window over a long cache has few to split).
std::vector<int> decode_split_counts(const AttentionProblem& problem, const DecodeConfig& config, int arch,
                                     int multiprocessors);

// choice with a caller's split count (requested >= 1) in place of its own: at most max_decode_splits (a range past
// the key blocks the rows visit would be empty), the reason saying what was asked and, where capped, what runs.
DecodeChoice with_requested_splits(DecodeChoice choice, const AttentionProblem& problem, int requested);

// choice with its own split count at most max_decode_splits (a stored count timed at other sizes of the bucket may
// pass the key blocks this problem's rows visit), the reason saying what runs where capped.
DecodeChoice with_visited_splits(DecodeChoice choice, const AttentionProblem& problem);

}  // namespace flashgen
