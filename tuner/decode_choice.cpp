// The built-in decode choice: config from the problem class, split count from the sizes and the GPU.
#include "tuner/decode_choice.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace flashgen {

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// Blocks of one key range each: (sequence, kv head, packed row block).
long long base_blocks(const AttentionProblem& problem, const DecodeConfig& config) {
  const AttentionShape& s = problem.shape;
  return s.batch * s.heads_kv * ceil_div(s.group_size() * s.seqlen_q, config.rows);
}

}  // namespace

int heuristic_decode_splits(const AttentionProblem& problem, const DecodeConfig& config, int arch, int multiprocessors) {
  const long long base = base_blocks(problem, config);
  // One block per SM for a contiguous cache: a second one on the same SM adds no bandwidth (each already keeps
  // stages - 1 tiles in flight), while each range's prologue, epilogue and merge cost more. Two for a paged cache
  // where they fit: its rows' scattered pages take longer to reach, and a second block hides that
  // (bench/notes_decode.md, "The split count").
  // An FP8 cache's kernel is bounded for three blocks per SM (decode_traits' min_blocks), as many as fit.
  const int smem = config.smem_bytes(DecodeKernel::kAttend) + 1024;  // the driver reserves 1 KB per block
  const int wanted = config.latent ? 1 : std::max(config.traits().min_blocks, problem.paged ? 2 : 1);
  int per_sm = 1;
  while (per_sm < wanted && (per_sm + 1) * smem <= max_smem_per_block(arch) + 1024) ++per_sm;
  const long long slots = static_cast<long long>(multiprocessors) * per_sm;
  const int most = max_decode_splits(problem, config);
  // A walk that one block's pipeline holds whole (no more key blocks than its stages, a single block among them:
  // every load is in flight at once) is one trip to memory however it is split, and each more range only adds
  // its partials and the merge (bench/notes_decode.md, "A window that one block's pipeline holds").
  const long long blocks = max_decode_blocks(problem, config);
  auto efficiency = [&](int splits) {
    const double waves = static_cast<double>(base * splits) / static_cast<double>(slots);
    return waves / std::ceil(waves);
  };
  // Blocks enough to fill the GPU take one range each, unless an FP8 cache's three blocks per SM leave their last
  // wave mostly idle (1.3 waves at batch 64 and 8 kv heads): ranges then even the waves out (bench/notes_decode.md,
  // "An FP8 cache"; measured there only).
  if ((base >= slots && (per_sm < 3 || efficiency(1) >= 0.85)) || blocks <= config.stages) return 1;
  double best = 0.0;
  for (int splits = 1; splits <= most; ++splits) best = std::max(best, efficiency(splits));
  int chosen = most;
  for (int splits = 1; splits <= most; ++splits) {
    if (efficiency(splits) >= 0.85 * best) {
      chosen = splits;
      break;
    }
  }
  // A range's time follows its key blocks, and the longest range sets the call's: within the chosen count's waves,
  // the fewest ranges that give the fewest blocks per range (bench/notes_decode.md, "The split count").
  const auto waves = [&](int splits) { return ceil_div(base * splits, slots); };
  int fewest = chosen;
  for (int splits = chosen + 1; splits <= most && waves(splits) == waves(chosen); ++splits) {
    if (ceil_div(blocks, splits) < ceil_div(blocks, fewest)) fewest = splits;
  }
  return fewest;
}

std::vector<int> decode_split_counts(const AttentionProblem& problem, const DecodeConfig& config, int arch,
                                     int multiprocessors) {
  const long long base = base_blocks(problem, config);
  const int most = max_decode_splits(problem, config);
  std::vector<int> counts{1, heuristic_decode_splits(problem, config, arch, multiprocessors)};
  // The counts that give each SM 1-4 blocks: the least that fills those waves, and the most that stays within them.
  for (long long per_sm = 1; per_sm <= 4; ++per_sm) {
    counts.push_back(static_cast<int>(std::min<long long>(most, ceil_div(per_sm * multiprocessors, base))));
    counts.push_back(static_cast<int>(std::clamp<long long>(per_sm * multiprocessors / base, 1, most)));
  }
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

namespace {

// A latent cache's (values the keys' first columns): the Hopper latent kernel, with as deep a ring of K tiles as one
// block per SM holds, up to four.
DecodeChoice latent_choice(const AttentionProblem& problem, int arch, int multiprocessors) {
  DecodeChoice choice;
  DecodeConfig& c = choice.config;
  c = latent_decode_config(problem.dtype, problem.head_dim(), problem.value_dim());
  c.mask = problem.mask_kind();
  c.mods = problem.score_mods();
  c.paged = problem.paged;
  for (int stages = 3; stages <= 4; ++stages) {
    DecodeConfig deeper = c;
    deeper.stages = stages;
    if (deeper.smem_bytes(DecodeKernel::kAttend) > max_smem_per_block(arch)) break;
    c.stages = stages;
  }
  choice.splits = heuristic_decode_splits(problem, c, arch, multiprocessors);
  choice.reason = "built-in heuristic: the latent kernel, " + std::to_string(c.stages) + " stages; " +
                  std::to_string(choice.splits) + " key range" + (choice.splits == 1 ? "" : "s") +
                  " per sequence for " + std::to_string(multiprocessors) + " SMs";
  return choice;
}

}  // namespace

DecodeChoice heuristic_decode_choice(const AttentionProblem& problem, int arch, int multiprocessors) {
  if (problem.value_dim() != problem.head_dim()) return latent_choice(problem, arch, multiprocessors);
  DecodeChoice choice;
  DecodeConfig& c = choice.config;
  c.dtype = problem.dtype;
  c.head_dim = problem.head_dim();
  // The mask picks the module's kernels, not its tiles: a window streams the blocks it visits as the causal
  // mask does (the split count alone sees how few they are).
  c.mask = problem.mask_kind();
  c.mods = problem.score_mods();
  c.paged = problem.paged;
  c.cache_dtype = problem.cache_dtype;
  c.block_n = 64;
  c.warps = 4;
  // The fewest 16-row tiles that hold a kv head's packed rows, as far as the registers allow.
  const long long packed = problem.shape.group_size() * problem.shape.seqlen_q;
  c.rows = 16;
  for (int rows : {32, 64}) {
    if (packed <= rows / 2) break;
    DecodeConfig wider = c;
    wider.rows = rows;
    if (wider.traits().error != nullptr) break;
    c.rows = rows;
  }
  // As many stages as leave room for two blocks per SM, or as many as the registers are bounded for (an FP8 cache's
  // three), at least two stages, at most eight.
  const int budget = max_smem_per_block(arch) / std::max(2, c.traits().min_blocks) - 1024;
  c.stages = 2;
  for (int stages = 3; stages <= 8; ++stages) {
    DecodeConfig deeper = c;
    deeper.stages = stages;
    if (deeper.smem_bytes(DecodeKernel::kAttend) > budget) break;
    c.stages = stages;
  }
  choice.splits = heuristic_decode_splits(problem, c, arch, multiprocessors);
  choice.reason = "built-in heuristic: " + std::to_string(c.rows) + " packed query rows per block, " +
                  std::to_string(c.stages) + " stages; " + std::to_string(choice.splits) + " key range" +
                  (choice.splits == 1 ? "" : "s") + " per sequence for " + std::to_string(multiprocessors) + " SMs";
  return choice;
}

namespace {

std::string key_ranges(int n) { return std::to_string(n) + " key range" + (n == 1 ? "" : "s"); }

// choice run with at most max_decode_splits of `wanted` ranges, the reason saying so where capped.
DecodeChoice capped_to_visited(DecodeChoice choice, const AttentionProblem& problem, int wanted) {
  choice.splits = std::clamp(wanted, 1, max_decode_splits(problem, choice.config));
  if (choice.splits != wanted) {
    choice.reason += ", run as " + key_ranges(choice.splits) + " (the key blocks a sequence's rows visit)";
  }
  return choice;
}

}  // namespace

DecodeChoice with_requested_splits(DecodeChoice choice, const AttentionProblem& problem, int requested) {
  choice.reason += "; " + key_ranges(requested) + " as requested";
  return capped_to_visited(std::move(choice), problem, requested);
}

DecodeChoice with_visited_splits(DecodeChoice choice, const AttentionProblem& problem) {
  const int wanted = choice.splits;
  if (wanted >= 1 && wanted <= max_decode_splits(problem, choice.config)) return choice;
  choice.reason += "; " + key_ranges(wanted) + " chosen";
  return capped_to_visited(std::move(choice), problem, wanted);
}

}  // namespace flashgen
