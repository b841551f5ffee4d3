// The kernel-module contract (generator/kernel_module.hpp): each config type's answers of a call, can_implement with
// its shortfall and reason, and workspace with its parts, for the forward, backward and KV-cache families. No GPU:
// the calls' tensors sit at pointers that are never dereferenced.
#include <cstdint>
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/kernel_module.hpp"
#include "support/fake_pointer.hpp"

using flashgen::AttentionProblem;
using flashgen::AttentionShape;
using flashgen::DeviceTraits;
using flashgen::DType;
using flashgen::Implementability;
using flashgen::Mask;
using flashgen::Shortfall;
using flashgen::Workspace;
using flashgen::test::fake_pointer;

namespace {

constexpr DeviceTraits kSm80{80, 108, 40 << 20};
constexpr DeviceTraits kSm90{90, 132, 50 << 20};

AttentionShape shape_of(int batch, int seqlen, int heads, int head_dim) {
  AttentionShape s;
  s.batch = batch, s.seqlen_q = s.seqlen_k = seqlen, s.heads_q = s.heads_kv = heads, s.head_dim = head_dim;
  return s;
}

// Strides of a contiguous (batch, seqlen, heads, head_dim) tensor of shape s.
void contiguous(const AttentionShape& s, long long& batch, long long& row, long long& head) {
  head = s.head_dim, row = s.heads_q * s.head_dim, batch = s.seqlen_q * row;
}

// The forward's tensors of a dense call, contiguous, at aligned fake pointers.
template <class Params>
void bind_dense(Params& p, const AttentionShape& s) {
  p.q = fake_pointer(1), p.k = fake_pointer(2), p.v = fake_pointer(3), p.o = fake_pointer(4);
  contiguous(s, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  contiguous(s, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  contiguous(s, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  contiguous(s, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  p.batch = static_cast<int>(s.batch), p.heads_q = p.heads_kv = static_cast<int>(s.heads_q), p.group_size = 1;
  p.seqlen_q = p.seqlen_k = static_cast<int>(s.seqlen_q);
}

flashgen::AttnFwdParams dense_forward(const AttentionShape& s) {
  flashgen::AttnFwdParams p{};
  bind_dense(p, s);
  return p;
}

// The backward's: the forward's tensors and the gradients, each contiguous like q.
flashgen::AttnBwdParams dense_backward(const AttentionShape& s) {
  flashgen::AttnBwdParams p{};
  bind_dense(p, s);
  p.dout = fake_pointer(5), p.dq = fake_pointer(6), p.dk = fake_pointer(7), p.dv = fake_pointer(8);
  contiguous(s, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  contiguous(s, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  contiguous(s, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  contiguous(s, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  return p;
}

// The error a launcher raises for answer: its message, after "kUnsupported: " where that is its status.
std::string refusal(const std::string& config, const Implementability& answer) {
  try {
    flashgen::fail_unimplementable(config, answer);
  } catch (const flashgen::Error& e) {
    return (e.status() == flashgen::Status::kUnsupported ? "kUnsupported: " : "") + std::string(e.what());
  }
  return "no error";
}

}  // namespace

TEST_CASE("every config type keeps the kernel-module contract", "[generator][module]") {
  CHECK(flashgen::IsKernelModule<flashgen::KernelConfig>::value);
  CHECK(flashgen::IsKernelModule<flashgen::BwdConfig>::value);
  CHECK(flashgen::IsKernelModule<flashgen::DecodeConfig>::value);
  CHECK_FALSE(flashgen::IsKernelModule<int>::value);
}

TEST_CASE("workspace parts are placed one after another at 256-byte offsets", "[generator][module]") {
  Workspace w;
  CHECK(w.append(1) == 0);
  CHECK(w.append(256) == 256);
  CHECK(w.append(0) == 512);
  CHECK(w.append(257) == 512);
  CHECK(w.bytes == 1024);
  CHECK(flashgen::workspace_part(0x10000, 256) == 0x10100);
  CHECK(flashgen::workspace_part(0x10000, Workspace::kAbsent) == 0);
}

TEST_CASE("a forward config answers whether it can implement a call, and why not", "[generator][module]") {
  const AttentionShape shape = shape_of(2, 1000, 8, 128);
  const AttentionProblem problem = forward_problem(DType::kBFloat16, shape, Mask::kCausal);
  flashgen::AttnFwdParams p = dense_forward(shape);
  const auto sm80 = flashgen::KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n64_w4_s2_causal");
  const auto sm90 = flashgen::KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_pst");
  REQUIRE_FALSE(sm90.invalid_reason(90));
  CHECK(sm80.can_implement(problem, p, kSm80));
  CHECK(sm90.can_implement(problem, p, kSm90));
  CHECK(sm80.workspace(p).bytes == 0);

  // Another problem: the dtype, or a packed batch's config for a dense one, each in the launcher's words.
  const AttentionProblem fp16 = forward_problem(DType::kFloat16, shape, Mask::kCausal);
  const Implementability other = sm80.can_implement(fp16, p, kSm80);
  CHECK(other.shortfall == Shortfall::kProblem);
  CHECK(refusal(sm80.name(), other) ==
        "config fwd_sm80_bf16_d128_m128_n64_w4_s2_causal does not match the problem (dtype, head_dim, mask, soft cap, "
        "ALiBi)");
  flashgen::KernelConfig packed = sm80;
  packed.varlen = true;
  CHECK(packed.can_implement(problem, p, kSm80).reason == "is for packed batches, not for this call's dense batch");
  flashgen::KernelConfig narrow_values = sm80;
  narrow_values.head_dim_v = 64;
  CHECK(narrow_values.can_implement(problem, p, kSm80).reason == "has values of head dim 64, the call's have 128");
  AttentionShape narrow_shape = shape;
  narrow_shape.head_dim_v = 64;
  const AttentionProblem narrow = forward_problem(DType::kBFloat16, narrow_shape, Mask::kCausal);
  CHECK(narrow_values.can_implement(narrow, p, kSm80));
  CHECK(sm80.can_implement(narrow, p, kSm80).reason == "has values of head dim 128, the call's have 64");

  // The arch: the sm90 family on sm_80.
  const Implementability arch = sm90.can_implement(problem, p, kSm80);
  CHECK(arch.shortfall == Shortfall::kArch);
  CHECK(arch.reason == "the sm90 kernel family needs sm_90a (wgmma, TMA, setmaxnreg)");

  // TMA: a base address off 16 bytes is refused with the tensor named, as kUnsupported; the sm80 family reads it.
  p.k = static_cast<const char*>(p.k) + 8;
  const Implementability tma = sm90.can_implement(problem, p, kSm90);
  CHECK(tma.shortfall == Shortfall::kTmaLayout);
  CHECK(tma.reason == "k: the base address is not 16-byte aligned");
  CHECK(refusal(sm90.name(), tma) == "kUnsupported: config " + sm90.name() +
                                          " needs TMA, which cannot describe k: the base address is not 16-byte "
                                          "aligned");
  CHECK(sm80.can_implement(problem, p, kSm80));

  // A persistent walk of 65535 x 65535 one-block tiles passes its int indices; one block per tile is fine.
  const AttentionShape wide = shape_of(65535, 100, 65535, 128);
  const AttentionProblem wide_problem = forward_problem(DType::kBFloat16, wide, Mask::kCausal);
  const flashgen::AttnFwdParams wide_params = dense_forward(wide);
  const Implementability tiles = sm90.can_implement(wide_problem, wide_params, kSm90);
  CHECK(tiles.shortfall == Shortfall::kTileCount);
  CHECK(tiles.reason == "4294836225 tiles are more than a persistent kernel indexes");
  flashgen::KernelConfig walked = sm90;
  walked.sm90()->persistent = false;
  CHECK(walked.can_implement(wide_problem, wide_params, kSm90));
}

TEST_CASE("a backward config answers can_implement, and lays out its workspace by family and dQ strategy",
          "[generator][module]") {
  const AttentionShape shape = shape_of(2, 100, 4, 128);
  const AttentionProblem problem = backward_problem(DType::kBFloat16, shape, Mask::kNone, false);
  flashgen::AttnBwdParams p = dense_backward(shape);
  const auto atomic = flashgen::BwdConfig::from_name("bwd_sm80_bf16_d128_m64_n64_w4_s2_x1");
  const auto sm90 = flashgen::BwdConfig::from_name("bwd_sm90_bf16_d128_m64_n128_s2");
  REQUIRE_FALSE(atomic.invalid_reason(80));
  REQUIRE_FALSE(sm90.invalid_reason(90));

  // sm80, atomic dQ: 2 x 4 x 100 rows of D (3200 bytes, to 3328), then the fp32 accumulator of 128 columns.
  const flashgen::BwdWorkspace rows = atomic.workspace(p);
  CHECK(rows.dsum == 0);
  CHECK(rows.lse_log2 == Workspace::kAbsent);
  CHECK(rows.dq_accum == 3328);
  CHECK(rows.dq_semaphore == Workspace::kAbsent);
  CHECK(rows.user_classes == Workspace::kAbsent);
  CHECK(rows.bytes == 3328 + 800 * 128 * 4);

  // Deterministic sm80: the dq kernel owns dQ, so D alone; a user mask's classes go last.
  flashgen::BwdConfig deterministic = atomic;
  deterministic.deterministic = true;
  const flashgen::BwdWorkspace det = deterministic.workspace(p, 1000);
  CHECK(det.dq_accum == Workspace::kAbsent);
  CHECK(det.user_classes == 3328);
  CHECK(det.bytes == 3328 + 1024);

  // sm90: rows padded to 128 per (batch, head), 1024 in all: D, the base-2 LSE, the 64-column tiles'
  // accumulator, and two semaphore ints per 64 rows.
  const flashgen::BwdWorkspace tiles = sm90.workspace(p);
  CHECK(sm90.workspace_rows(p) == 128);
  CHECK(tiles.lse_log2 == 4096);
  CHECK(tiles.dq_accum == 8192);
  CHECK(tiles.dq_semaphore == 8192 + 1024 * 128 * 4);
  CHECK(tiles.bytes == tiles.dq_semaphore + 256);

  // With the sinks' gradient: its partials (heads_q x batch x key blocks x warps) sit where the kernels find them,
  // D's end rounded to 64 rows (attn_params.cuh's bwd_sink_partials_offset), and the rest moves past them.
  flashgen::BwdConfig sinks = atomic;
  sinks.sink_grad = true;
  const flashgen::BwdWorkspace with_sinks = sinks.workspace(p);
  CHECK(with_sinks.sink_partials == size_t(4 * flashgen::bwd_sink_partials_offset(800)));
  CHECK(with_sinks.sink_partials == 3328);
  CHECK(with_sinks.dq_accum == 3328 + 4 * size_t(4 * 2 * 2 * sinks.sink_partial_warps()));
  CHECK(rows.sink_partials == Workspace::kAbsent);

  CHECK(atomic.can_implement(problem, p, kSm80));
  CHECK(sm90.can_implement(problem, p, kSm90));
  CHECK(sm90.can_implement(problem, p, kSm80).reason ==
        "the sm90 kernel family needs sm_90 (wgmma, TMA and setmaxnreg are sm_90a instructions)");
  p.dk_row_stride = 4 * 128 + 4;  // rows 1032 bytes apart: not a multiple of 16
  const Implementability tma = sm90.can_implement(problem, p, kSm90);
  CHECK(tma.shortfall == Shortfall::kTmaLayout);
  CHECK(tma.reason == "dk: stride 516 is not a positive multiple of 16 bytes below 2^40");
  const AttentionProblem causal = backward_problem(DType::kBFloat16, shape, Mask::kCausal, false);
  CHECK(atomic.can_implement(causal, p, kSm80).shortfall == Shortfall::kProblem);
}

TEST_CASE("a KV-cache config answers can_implement, and sizes its split workspace", "[generator][module]") {
  AttentionShape shape = shape_of(4, 1, 32, 128);
  shape.heads_kv = 8, shape.seqlen_k = 1024;
  AttentionProblem problem = forward_problem(DType::kFloat16, shape, Mask::kCausal);
  problem.kv_cache = true;
  flashgen::AttnDecodeParams p{};
  p.batch = 4, p.heads_q = 32, p.heads_kv = 8, p.group_size = 4, p.seqlen_q = 1;
  flashgen::DecodeConfig config;
  config.mask = flashgen::MaskKind::kCausal;

  // One range needs nothing; 3 ranges x 4 sequences x 32 heads x 1 token: 384 partial rows of 128 floats, then
  // 384 LSEs (1536 bytes, already 256-aligned).
  p.splits = 1;
  CHECK(config.workspace(p).bytes == 0);
  CHECK(config.workspace(p).o_partial == Workspace::kAbsent);
  p.splits = 3;
  const flashgen::DecodeWorkspace split = config.workspace(p);
  CHECK(split.o_partial == 0);
  CHECK(split.lse_partial == 384 * 128 * 4);
  CHECK(split.bytes == 384 * 128 * 4 + 1536);

  CHECK(config.can_implement(problem, p, kSm80));
  CHECK(config.can_implement(problem, p, DeviceTraits{75, 40, 4 << 20}).reason ==
        "the decode kernels need sm_80 or newer (mma.sync m16n8k16 bf16, cp.async)");
  flashgen::DecodeConfig paged = config;
  paged.paged = true;
  const Implementability cache = paged.can_implement(problem, p, kSm80);
  CHECK(cache.shortfall == Shortfall::kProblem);
  CHECK(refusal(paged.name(), cache) ==
        "config dec_sm80_fp16_d128_r16_n64_w4_s4_causal_paged reads a paged cache, but no block_table is given");

  // 8 kv heads of 131072 packed rows each, 8192 blocks of 16: one block past the grid's 65535.
  p.group_size = 1, p.heads_q = 8, p.seqlen_q = 131072;
  CHECK(config.row_blocks(p) == 8192);
  const Implementability grid = config.can_implement(problem, p, kSm80);
  CHECK(grid.shortfall == Shortfall::kGridLimit);
  CHECK(refusal(config.name(), grid) ==
        "q: heads_kv * ceil(heads_q / heads_kv * seqlen_q / 16) blocks must be at most 65535 (grid limits)");
}
