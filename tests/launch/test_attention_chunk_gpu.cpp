// [gpu] Chunked attention (options.attention_chunk, Llama 4) on dense batches: out, lse and the three gradients
// against the float64 reference with the chunk, through the C ABI (the run-time choice) and on both families'
// chunked-window kernels (the built-in choices and named sm90 tiles, both dQ strategies): chunked causal attention,
// bidirectional chunks, a window inside chunks, chunks narrower than a block, a chunk past every key, sq != sk on
// both sides. The packed and KV-cache calls' chunks are in test_attention_varlen_gpu.cpp and
// test_attention_kvcache_gpu.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "support/dense_variant_problem.hpp"
#include "tuner/choice.hpp"

namespace {

struct ChunkCase {
  const char* name;
  flashgen_dtype dtype;
  flashgen::AttentionShape shape;
  flashgen_mask mask;             // the caller's: causal, none or a window
  int window_left, window_right;  // with FLASHGEN_MASK_SLIDING_WINDOW
  int chunk;
  std::vector<std::string> forward_configs;  // besides the heuristic choices; sm90 ones run on sm_90 only
  std::vector<std::string> backward_configs;
};

bool runs_here(const std::string& name, int arch) { return arch >= 90 || name.find("_sm90_") == std::string::npos; }

}  // namespace

TEST_CASE("chunked attention matches the float64 reference, forward and backward, on both families",
          "[gpu][chunk]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const int arch = flashgen::device_sm(scope.device());
  const ChunkCase cases[] = {
      // Llama 4's: causal within chunks of 96 keys (not a multiple of the blocks), GQA.
      {"bf16 d128 causal, chunks of 96, GQA 2", FLASHGEN_BFLOAT16, {2, 333, 333, 4, 2, 128}, FLASHGEN_MASK_CAUSAL,
       -1, -1, 96,
       {"fwd_sm90_bf16_d128_m128_n128_s2_chunk_ovl_pp", "fwd_sm90_bf16_d128_m128_n128_s2_chunk_ovl_pst"},
       {"bwd_sm90_bf16_d128_m64_n128_s3_chunk_det"}},
      // Bidirectional chunks of 50, sq < sk (the chunks follow the bottom-right diagonal), MQA.
      {"fp16 d64 no mask, chunks of 50, 200 x 413 MQA", FLASHGEN_FLOAT16, {1, 200, 413, 2, 1, 64}, FLASHGEN_MASK_NONE,
       -1, -1, 50, {"fwd_sm90_fp16_d64_m192_n128_s2_chunk_ovl"}, {}},
      // A causal window of 40 inside chunks of 64: the window binds in a chunk's later rows, the chunk in its first.
      {"bf16 d64 window (40, 0), chunks of 64", FLASHGEN_BFLOAT16, {1, 300, 300, 2, 2, 64},
       FLASHGEN_MASK_SLIDING_WINDOW, 40, 0, 64, {}, {}},
      // Chunks of 7, narrower than every block; sq > sk: rows before 200 see no key (0 and -inf).
      {"fp16 d128 causal, chunks of 7, 300 x 100", FLASHGEN_FLOAT16, {1, 300, 100, 2, 2, 128}, FLASHGEN_MASK_CAUSAL,
       -1, -1, 7, {}, {}},
      // One chunk past every key: the causal mask's answer, from the chunked window's kernels.
      {"fp16 d96 causal, a chunk of 4096 over 257 keys", FLASHGEN_FLOAT16, {1, 257, 257, 2, 1, 96},
       FLASHGEN_MASK_CAUSAL, -1, -1, 4096, {}, {}},
  };
  for (const ChunkCase& c : cases) {
    flashgen_attention_options opts{};
    opts.mask = c.mask;
    opts.window_left = c.window_left, opts.window_right = c.window_right;
    opts.attention_chunk = c.chunk;
    flashgen::test::DenseVariantProblem p(c.name, c.dtype, c.shape, opts, 0xc4c + uint64_t(c.shape.head_dim + c.chunk));
    p.run_choice();  // through the C ABI

    // A chunked call runs the chunked window's kernels: the built-in choices of both families, then the named
    // configs.
    const flashgen::ForwardCall call = p.forward_call();
    REQUIRE(call.problem.mask_kind() == flashgen::MaskKind::kChunk);
    const flashgen::DType dtype = call.problem.dtype;
    const int head_dim = call.problem.head_dim();
    std::vector<flashgen::KernelConfig> forward;
    std::vector<flashgen::BwdConfig> backward;
    for (bool sm80_only : {true, false}) {
      forward.push_back(
          flashgen::heuristic_choice(dtype, head_dim, flashgen::MaskKind::kChunk, arch, sm80_only, false, {}).config);
      for (bool deterministic : {false, true}) {
        backward.push_back(flashgen::heuristic_backward_choice(dtype, head_dim, flashgen::MaskKind::kChunk,
                                                               deterministic, arch, sm80_only, false, {})
                               .config);
      }
    }
    for (const std::string& name : c.forward_configs) {
      if (runs_here(name, arch)) forward.push_back(flashgen::KernelConfig::from_name(name));
    }
    for (const std::string& name : c.backward_configs) {
      if (runs_here(name, arch)) backward.push_back(flashgen::BwdConfig::from_name(name));
    }
    for (const flashgen::KernelConfig& config : forward) p.run_forward(config);
    for (const flashgen::BwdConfig& config : backward) p.run_backward(config);
  }
}
