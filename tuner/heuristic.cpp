// Built-in forward config choice: a preference list per head_dim, first entry valid on the arch wins.
// Chosen so every default candidate compiles without spills (see tests/tuner/test_heuristic.cpp).
#include "tuner/heuristic.hpp"

#include <algorithm>
#include <set>

#include "flashgen/error.hpp"

namespace flashgen {

namespace {

struct Tile {
  int block_m, block_n, warps, stages;
  bool q_in_regs = false;
};

// Ordered by measured speed (H200, 4k tokens, bench/results): two 16-row tiles per warp reuse every
// K/V fragment twice, which matters more than a wide key block; a 64-key S tile next to a (32, 128)
// O tile spills, so d128 takes 32-key blocks; small head_dims have room to keep Q in registers.
// The 64-row fallbacks fit sm_86/sm_89's 99 KB.
std::vector<Tile> preferences(int head_dim) {
  if (head_dim <= 64) return {{128, 64, 4, 3, true}, {128, 64, 4, 3}, {64, 64, 4, 2}};
  if (head_dim <= 128) return {{128, 32, 4, 3}, {128, 32, 4, 2}, {64, 64, 4, 2}, {64, 32, 4, 2}};
  if (head_dim <= 192) return {{128, 64, 8, 2}, {128, 32, 8, 2}, {64, 64, 4, 2}, {64, 32, 4, 2}};
  // A 64-key S tile next to the (16, 256) O tile spills; 48 keys fit registers and Hopper's 227 KB.
  return {{128, 48, 8, 2}, {128, 32, 8, 2}, {64, 32, 4, 2}};
}

KernelConfig with_tile(DType dtype, int head_dim, MaskKind mask, const Tile& tile) {
  KernelConfig c;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.mask = mask;
  c.block_m = tile.block_m;
  c.block_n = tile.block_n;
  c.stages = tile.stages;
  c.knobs = Sm80Knobs{tile.warps, tile.q_in_regs};
  return c;
}

struct Sm90Tile {
  int block_m, block_n, stages;
  bool overlap, pingpong;
  int groups = 1;
};

// The Hopper family ahead of the sm80 family, by tile width (sm90_tile_dim: head_dim rounded up to whole 64-column
// chunks; padded tiles still outrun the sm80 family). Overlap everywhere, ping-pong on top of it for two consumers;
// d64 three consumers (192 rows, no registers left for ping-pong) or four (256 rows, 64-key blocks: more warps per
// scheduler hide the softmax's latency), under a causal mask two groups of 128-row tiles in one block (less masked
// work per tile), and in fp16 the rows' sums from the tensor cores (d64 only: wider tiles' tensor cores are the
// busier); d256 64-key blocks. The key block shrinks as O grows so that O, S and P fit a consumer's registers.
// Packed batches have no groups: under a causal mask their d64 tiles take 128 keys and three consumers (192 rows).
// A sliding window takes the causal mask's tiles, its query blocks seeing key ranges of their own. The measurements
// behind each: bench/notes_fwd_sm90.md, "The built-in choice".
std::vector<Sm90Tile> sm90_preferences(int tile_dim, MaskKind mask, bool varlen) {
  if (tile_dim == 64) {
    const Sm90Tile m256{256, 64, 3, true, false};
    const Sm90Tile grouped{128, 64, 3, true, false, 2};
    const Sm90Tile m192{192, 128, 2, true, false};
    const Sm90Tile wide{128, 128, 3, true, false};
    const bool hides_keys = mask != MaskKind::kNone;
    if (hides_keys && varlen) return {m192, wide, m256, {128, 64, 2, false, false}};
    if (hides_keys) return {grouped, m256, m192, {128, 64, 2, false, false}};
    return {m256, m192, {128, 128, 2, true, true}, {128, 64, 2, false, false}};
  }
  if (tile_dim == 128) return {{128, 128, 2, true, true}, {128, 96, 2, true, true}, {128, 64, 2, false, false}};
  if (tile_dim == 192) return {{128, 112, 2, true, true}, {128, 96, 2, true, true}, {128, 64, 2, false, false}};
  if (tile_dim == 256) return {{128, 64, 2, true, true}, {128, 80, 2, true, true}, {64, 64, 2, false, false}};
  return {};
}

// FP8 (8-bit wgmma, Vᵀ in 128-key rows): 128 keys a block, two consumers taking turns, at every head dim up to 256
// (O of 256 columns, S and P still fit 240 registers; the tiles of two stages, Q and the 16-bit output's own rows
// fit 227 KB); d64 three consumers (192 rows), overlapping only without a mask (bench/notes_fwd_sm90.md, "FP8").
// Last, turns without overlap: read through pages (232 registers a consumer) the overlapping d256 tiles spill.
std::vector<Sm90Tile> sm90_fp8_preferences(int tile_dim, MaskKind mask) {
  const std::vector<Sm90Tile> turns = {
      {128, 128, 2, true, true}, {128, 128, 2, true, false}, {128, 128, 2, false, true}};
  if (tile_dim != 64) return turns;
  return {{192, 128, 2, mask == MaskKind::kNone, false}, turns[0], turns[1]};
}

// Keys or values wider than 256 columns: 64 query rows a block; values that wide take two consumers for them, each
// holding half of O's columns (value_split 2), taking turns at issuing their products (both compute the rows' S:
// turns keep their softmaxes apart). The key block is what two stages of wide K and V tiles, Q and O's staging rows
// leave room for in 227 KB: 64 keys beside values of 512 and keys of up to 64 columns, 32 beside keys of 512. Keys
// that wide beside values of up to 256 take one consumer, which has no one to take turns with: the last three.
std::vector<Sm90Tile> sm90_wide_preferences() {
  return {{64, 64, 2, true, true},  {64, 48, 2, true, true},  {64, 32, 2, true, true},
          {64, 64, 2, true, false}, {64, 48, 2, true, false}, {64, 32, 2, true, false}};
}

}  // namespace

std::vector<KernelConfig> heuristic_forward_configs(DType dtype, int head_dim, MaskKind mask, int arch,
                                                    bool varlen, int head_dim_v) {
  std::vector<KernelConfig> configs;
  std::string last_reason = "no candidate";
  if (head_dim_v == head_dim) head_dim_v = 0;  // one name per config
  if (arch == 90) {
    // The wider of the two dims picks the tiles, as for the sm80 family below.
    const int tile_dim = sm90_tile_dim(std::max(head_dim, head_dim_v));
    const int value_split = sm90_tile_dim(head_dim_v > 0 ? head_dim_v : head_dim) > 256 ? 2 : 1;
    const std::vector<Sm90Tile> tiles = is_fp8(dtype)    ? sm90_fp8_preferences(tile_dim, mask)
                                        : tile_dim > 256 ? sm90_wide_preferences()
                                                         : sm90_preferences(tile_dim, mask, varlen);
    for (const Sm90Tile& tile : tiles) {
      KernelConfig c;
      c.dtype = dtype, c.head_dim = head_dim, c.mask = mask, c.head_dim_v = head_dim_v;
      // An FP8 call's output type is its own (the planner sets it): the tiles serve bf16 and fp16 alike.
      if (is_fp8(dtype)) c.out_dtype = DType::kBFloat16;
      c.block_m = tile.block_m, c.block_n = tile.block_n, c.stages = tile.stages;
      Sm90Knobs& k = c.knobs.emplace<Sm90Knobs>();
      k.overlap = tile.overlap, k.pingpong = tile.pingpong, k.groups = tile.groups;
      k.value_split = value_split;
      k.tensor_sum = tile_dim == 64 && dtype == DType::kFloat16;
      // Persistent blocks win without a mask, and under a causal mask since its tiles are claimed longest first
      // from L2-sized sections (bench/notes_fwd_sm90.md, "The built-in choice"); a window's tiles are claimed so too.
      k.persistent = true;
      // Packed batches: one block per tile (sequence.cuh binds a block to its sequence).
      if (varlen) c.varlen = true, k.persistent = false, k.groups = 1, k.cluster = 1;
      if (auto why = c.invalid_reason(arch)) {
        // The sm80 family takes none of these.
        if ((tile_dim > 256 || is_fp8(dtype)) && last_reason == "no candidate") last_reason = *why;
      } else {
        configs.push_back(c);
      }
    }
  }
  // The wider of the two dims sizes the sm80 tiles: O's columns are the values', Q's and K's the keys'.
  if (is_fp8(dtype) && arch != 90) last_reason = "FP8 attention needs sm_90a (8-bit wgmma); this GPU is sm_" +
                                                  std::to_string(arch);
  for (const Tile& tile : is_fp8(dtype) ? std::vector<Tile>{} : preferences(std::max(head_dim, head_dim_v))) {
    KernelConfig c = with_tile(dtype, head_dim, mask, tile);
    c.varlen = varlen;
    c.head_dim_v = head_dim_v;
    if (auto why = c.invalid_reason(arch)) {
      if (std::max(head_dim, head_dim_v) <= 256 || last_reason == "no candidate") last_reason = *why;
    } else {
      configs.push_back(c);
    }
  }
  if (configs.empty()) {
    const std::string values = head_dim_v > 0 ? " with values of head dim " + std::to_string(head_dim_v) : "";
    fail(Status::kUnsupported, "no forward config for head_dim " + std::to_string(head_dim) + values + " on sm_" +
                                   std::to_string(arch) + ": " + last_reason);
  }
  return configs;
}

KernelConfig heuristic_forward_config(DType dtype, int head_dim, MaskKind mask, int arch) {
  return heuristic_forward_configs(dtype, head_dim, mask, arch).front();
}

std::vector<KernelConfig> default_forward_candidates(int arch) {
  std::vector<KernelConfig> out;
  std::set<std::string> seen;
  auto add = [&](const KernelConfig& c) {
    if (!c.invalid_reason(arch) && seen.insert(c.name()).second) out.push_back(c);
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (MaskKind mask : {MaskKind::kNone, MaskKind::kCausal})
      for (int d : {32, 64, 96, 128, 192, 256}) {
        // The first choice of each family: on sm_90 the sm80 one is the fallback for what TMA cannot take.
        bool sm80_added = false, sm90_added = false;
        for (const KernelConfig& c : heuristic_forward_configs(dtype, d, mask, arch)) {
          bool& added = c.family() == KernelFamily::kSm90 ? sm90_added : sm80_added;
          if (!added) add(c);
          added = true;
        }
      }
  // Tile variants the tuner tries first, for the head_dims that matter most.
  const Tile variants[] = {{128, 64, 8, 2}, {128, 128, 8, 2}, {64, 64, 4, 3}, {128, 32, 4, 2}, {128, 32, 4, 4}};
  for (int d : {64, 128}) {
    for (const Tile& tile : variants) add(with_tile(DType::kFloat16, d, MaskKind::kNone, tile));
    add(with_tile(DType::kFloat16, d, MaskKind::kNone, {128, 64, 8, 2, /*q_in_regs=*/true}));
  }
  return out;
}

namespace {

struct BwdTile {
  int block_m, block_n, warps, stages, d_split;
  int dq_block_m, dq_block_n, dq_warps, dq_stages;
};

// Each warp of the dkdv kernel holds dK and dV for 16 keys x its head_dim slice in registers (128
// registers at a 128-wide slice), next to Sᵀ and dPᵀ of a whole query block, so wide heads take two
// slices. 128-key blocks of 8 warps halve the atomic dQ traffic per FLOP and share each Q/dO tile among
// more keys: they win for the atomic strategy, while the deterministic strategy prefers 4-warp 64-key
// blocks next to its dq kernel (bench/notes_bwd_sm80.md, "Versions"). The first entries need Hopper's shared memory; the
// next ones fit sm_80's 163 KB and the last sm_86/sm_89's 99 KB. Keys wider than 256 (head_dim 512) keep K and V
// of 64 keys resident (32 where the shared memory is sm_80's) and take four 128-column slices, beside 16 query
// rows a stage; their dq kernel's 32 rows in two warps keep ptxas within the registers. Checked spill-free by
// tests/tuner/test_heuristic.cpp.
std::vector<BwdTile> backward_preferences(int head_dim, int keys_dim, bool deterministic) {
  const int split = head_dim <= 128 ? 1 : head_dim <= 256 ? 2 : 4;
  const BwdTile small = {16, 32, 2, 2, split, 32, 16, 2, 2};
  if (keys_dim > 256) return {{16, 64, 4, 2, 4, 32, 16, 2, 2}, {16, 64, 4, 2, 4, 64, 16, 4, 2}, small};
  if (head_dim <= 64) {
    if (deterministic) return {{64, 64, 4, 2, 1, 64, 64, 4, 2}, {32, 64, 4, 2, 1, 64, 32, 4, 2}, small};
    return {{64, 128, 8, 2, 1, 64, 64, 4, 2}, {64, 64, 4, 2, 1, 64, 64, 4, 2}, small};
  }
  if (head_dim <= 128) {
    if (deterministic) return {{64, 64, 4, 2, 1, 64, 32, 4, 2}, {32, 64, 4, 2, 1, 64, 32, 4, 2}, small};
    return {{64, 128, 8, 2, 1, 64, 32, 4, 2}, {32, 128, 8, 2, 1, 64, 32, 4, 2}, {32, 64, 4, 2, 1, 64, 32, 4, 2},
            small};
  }
  // A 32-key S tile next to a (16, 192..256) dQ tile spills in the dq kernel; 16 keys fit.
  const int dq_block_n = head_dim <= 160 ? 32 : 16;
  return {{32, 128, 8, 2, 2, 64, dq_block_n, 4, 2}, {32, 64, 4, 2, 2, 64, dq_block_n, 4, 2},
          {16, 64, 4, 2, 2, 64, 16, 4, 2}, small};
}

}  // namespace

std::vector<BwdConfig> heuristic_backward_configs(DType dtype, int head_dim, MaskKind mask, bool deterministic,
                                                  int arch, int head_dim_v) {
  std::vector<BwdConfig> configs;
  const int value_dim = head_dim_v > 0 ? head_dim_v : head_dim;
  const int own_value_dim = value_dim != head_dim ? value_dim : 0;
  const int wide = std::max(head_dim, value_dim);
  std::string last_reason = "no candidate";
  // On sm_90 the Hopper family comes first, by tile width (head_dim rounded up to whole 64-column chunks: on
  // padded tiles it outruns the sm80 family, bench/notes_bwd_sm90.md, Versions: every head_dim): 128 keys in two
  // consumer warpgroups, with 64-query steps on 128-column tiles (dK, dV and Sᵀ fill the registers) and 128-query
  // steps on 64; on 192 and 256, 64 keys and 64 queries, the two consumers splitting the work between dK and dV,
  // with the staged dQ tile: on 192 beside two stages, on 256 beside one (faster than two stages with dQ added from
  // registers, bench/notes_bwd_sm90.md, Versions: head_dim 256 with one stage).
  // Both dQ strategies run on its one dkdv kernel.
  if (arch == 90) {
    BwdConfig c;
    c.knobs = BwdSm90Knobs{};
    c.dtype = dtype;
    c.head_dim = head_dim;
    c.head_dim_v = own_value_dim;
    c.mask = mask;
    c.deterministic = deterministic;
    const int tile_dim = sm90_tile_dim(wide);
    c.block_m = tile_dim == 64 ? 128 : 64;
    c.block_n = tile_dim <= 128 ? 128 : 64;
    c.stages = tile_dim == 256 ? 1 : 2;
    if (!c.invalid_reason(arch)) configs.push_back(c);
    // Then the same family with fewer registers, before falling back to the sm80 family where the first spills
    // (a soft cap's derivative): 64 keys per step on 128-column tiles and narrower, two stages (dQ added from
    // registers, no staged tile) on 256.
    if (tile_dim <= 128) {
      c.block_n = 64;
    } else {
      c.stages = 3 - c.stages;
    }
    if (!c.invalid_reason(arch)) configs.push_back(c);
  }
  for (const BwdTile& tile : backward_preferences(wide, head_dim, deterministic)) {
    BwdConfig c;
    c.dtype = dtype;
    c.head_dim = head_dim;
    c.head_dim_v = own_value_dim;
    c.mask = mask;
    c.deterministic = deterministic;
    c.block_m = tile.block_m, c.block_n = tile.block_n, c.stages = tile.stages;
    c.knobs = BwdSm80Knobs{tile.warps, tile.d_split};
    c.dq_block_m = tile.dq_block_m, c.dq_block_n = tile.dq_block_n, c.dq_warps = tile.dq_warps;
    c.dq_stages = tile.dq_stages;
    if (auto why = c.invalid_reason(arch)) {
      if (std::max(head_dim, head_dim_v) <= 256 || last_reason == "no candidate") last_reason = *why;
    } else {
      configs.push_back(c);
    }
  }
  if (configs.empty()) {
    fail(Status::kUnsupported, "no backward config for head_dim " + std::to_string(head_dim) +
                                   (own_value_dim ? " with values of " + std::to_string(value_dim) : "") + " on sm_" +
                                   std::to_string(arch) + ": " + last_reason);
  }
  return configs;
}

BwdConfig heuristic_backward_config(DType dtype, int head_dim, MaskKind mask, bool deterministic, int arch,
                                    int head_dim_v) {
  return heuristic_backward_configs(dtype, head_dim, mask, deterministic, arch, head_dim_v).front();
}

}  // namespace flashgen
