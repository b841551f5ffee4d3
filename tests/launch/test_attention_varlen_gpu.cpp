// [gpu] tests of packed variable-length forward batches: every sequence's out and lse against its own
// float64 reference, with mixed lengths (0, 1, odd, one long among short ones), both causal alignments,
// GQA and MQA, several head_dims, seqused_k, and explicit configs of other tile sizes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "check/output_check.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"

namespace {

using flashgen::DeviceBuffer;

struct VarlenCase {
  std::string name;
  flashgen_dtype dtype = FLASHGEN_FLOAT16;
  int64_t head_dim = 64;
  int64_t heads_q = 4, heads_kv = 1;
  flashgen_mask mask = FLASHGEN_MASK_NONE;
  std::vector<int32_t> q_lens, k_lens;  // per sequence; k_lens are the rows of k and v each sequence owns
  std::vector<int32_t> used_k;          // seqused_k when not empty (each at most its k_lens entry)
  std::vector<std::string> configs;     // explicit configs run through launch_forward, besides the choice
};

std::vector<int32_t> offsets(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  return cu;
}

DeviceBuffer upload_ints(const std::vector<int32_t>& values) {
  DeviceBuffer buffer(values.size() * sizeof(int32_t));
  buffer.upload(values);
  return buffer;
}

std::vector<uint16_t> random_bits(size_t count, flashgen_dtype dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> bits(count);
  for (uint16_t& b : bits) b = flashgen::float_to_dtype_bits(normal(rng), dtype);
  return bits;
}

// Runs c through the C ABI (config empty) or launch_forward (an explicit config), outputs poisoned first,
// and checks every sequence's rows against its float64 reference.
void run_and_check(const VarlenCase& c, const std::string& config) {
  const int64_t batch = static_cast<int64_t>(c.q_lens.size());
  const std::vector<int32_t> cu_q = offsets(c.q_lens), cu_k = offsets(c.k_lens);
  const int64_t total_q = cu_q.back(), total_k = cu_k.back();
  const int64_t hq = c.heads_q, hkv = c.heads_kv, d = c.head_dim;
  std::mt19937_64 rng(0x5eed + total_q * 31 + total_k);
  const std::vector<uint16_t> q = random_bits(size_t(total_q * hq * d), c.dtype, rng);
  const std::vector<uint16_t> k = random_bits(size_t(total_k * hkv * d), c.dtype, rng);
  const std::vector<uint16_t> v = random_bits(size_t(total_k * hkv * d), c.dtype, rng);
  DeviceBuffer dq(q.size() * 2), dk(k.size() * 2), dv(v.size() * 2), dout(q.size() * 2);
  DeviceBuffer dlse(size_t(hq * total_q) * sizeof(float));
  dq.upload(q), dk.upload(k), dv.upload(v);
  dout.fill_bytes(0xff), dlse.fill_bytes(0xff);  // NaN: a row the kernel leaves unwritten fails the check
  DeviceBuffer dcu_q = upload_ints(cu_q), dcu_k = upload_ints(cu_k);
  DeviceBuffer dused = upload_ints(c.used_k.empty() ? std::vector<int32_t>{0} : c.used_k);

  auto packed = [&](const DeviceBuffer& b, int64_t total, int64_t heads) {
    return flashgen_tensor{b.data(), c.dtype, {1, total, heads, d}, {total * heads * d, heads * d, d, 1}};
  };
  flashgen_varlen_forward_args args{};
  args.size = sizeof(args);
  args.q = packed(dq, total_q, hq), args.k = packed(dk, total_k, hkv), args.v = packed(dv, total_k, hkv);
  args.out = packed(dout, total_q, hq);
  args.lse = static_cast<float*>(dlse.data());
  args.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.data());
  args.cu_seqlens_k = static_cast<const int32_t*>(dcu_k.data());
  args.seqused_k = c.used_k.empty() ? nullptr : static_cast<const int32_t*>(dused.data());
  args.batch = batch;
  args.max_seqlen_q = *std::max_element(c.q_lens.begin(), c.q_lens.end());
  args.max_seqlen_k = *std::max_element(c.k_lens.begin(), c.k_lens.end());
  args.options.mask = c.mask;
  if (config.empty()) {
    REQUIRE(flashgen_attention_varlen_forward(&args, nullptr) == FLASHGEN_SUCCESS);
  } else {
    flashgen::launch_forward(flashgen::make_varlen_forward_call(args), nullptr,
                             flashgen::KernelConfig::from_name(config));
  }
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  const std::vector<uint16_t> out = dout.download_all<uint16_t>();
  const std::vector<float> lse = dlse.download_all<float>();

  const double scale = flashgen::effective_softmax_scale(0.f, d);
  const flashgen::DtypeTolerances& tol = flashgen::tolerances(c.dtype);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = c.q_lens[b], sk = c.used_k.empty() ? c.k_lens[b] : c.used_k[b];
    if (sq == 0) continue;
    INFO(c.name << (config.empty() ? "" : " " + config) << ": sequence " << b << " of " << sq << " queries, " << sk
                << " keys");
    std::vector<double> want_out(size_t(sq * hq * d), 0.0), want_lse(size_t(hq * sq), -INFINITY);
    if (sk > 0) {
      const flashgen::AttentionShape shape{1, sq, sk, hq, hkv, d};
      const auto q_view = flashgen::StridedView::contiguous(1, sq, hq, d);
      const auto kv_view = flashgen::StridedView::contiguous(1, sk, hkv, d);
      const flashgen::AttentionResult ref = flashgen::attention_reference_f64(
          shape, flashgen::HostInput::bits16(q.data() + cu_q[b] * hq * d, c.dtype, q_view),
          flashgen::HostInput::bits16(k.data() + cu_k[b] * hkv * d, c.dtype, kv_view),
          flashgen::HostInput::bits16(v.data() + cu_k[b] * hkv * d, c.dtype, kv_view), scale, c.mask);
      want_out = ref.out, want_lse = ref.lse;
    }
    std::vector<double> got_out(want_out.size()), got_lse(want_lse.size());
    for (size_t i = 0; i < got_out.size(); ++i) {
      got_out[i] = flashgen::dtype_bits_to_float(out[size_t(cu_q[b] * hq * d) + i], c.dtype);
    }
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t r = 0; r < sq; ++r) got_lse[size_t(h * sq + r)] = lse[size_t(h * total_q + cu_q[b] + r)];
    const flashgen::CheckReport out_check = flashgen::check_elements("out", {sq, hq, d}, got_out, want_out, tol.out);
    const flashgen::CheckReport lse_check = flashgen::check_elements("lse", {hq, sq}, got_lse, want_lse, tol.lse);
    INFO(out_check.text << "\n" << lse_check.text);
    CHECK(out_check.ok);
    CHECK(lse_check.ok);
  }
}

}  // namespace

TEST_CASE("packed variable-length batches match each sequence's float64 reference", "[gpu][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const std::vector<VarlenCase> cases = {
      {"fp16 d64 bottom-right GQA 4", FLASHGEN_FLOAT16, 64, 4, 1, FLASHGEN_MASK_CAUSAL,
       // a sequence of one query, an empty one, keys fewer than queries (rows that see no key), no keys at
       // all, and one long sequence among short ones
       {1, 0, 77, 300, 128, 5, 1000}, {1, 3, 77, 513, 64, 0, 1000}, {},
       {"fwd_sm80_fp16_d64_m64_n64_w4_s2_causal_varlen", "fwd_sm80_fp16_d64_m128_n32_w4_s3_causal_varlen"}},
      {"bf16 d128 top-left", FLASHGEN_BFLOAT16, 128, 2, 2, FLASHGEN_MASK_CAUSAL_TOP_LEFT,
       {257, 1, 64, 190}, {300, 40, 64, 129}, {}, {}},
      {"fp16 d40 no mask MQA", FLASHGEN_FLOAT16, 40, 6, 1, FLASHGEN_MASK_NONE, {33, 129, 2}, {17, 200, 255}, {}, {}},
      {"fp16 d256 bottom-right GQA 2", FLASHGEN_FLOAT16, 256, 2, 1, FLASHGEN_MASK_CAUSAL, {130, 7, 64}, {130, 70, 1},
       {}, {}},
      {"bf16 d96 bottom-right seqused_k", FLASHGEN_BFLOAT16, 96, 4, 2, FLASHGEN_MASK_CAUSAL, {1, 4, 100, 0},
       {300, 64, 256, 10}, {217, 64, 100, 0}, {}},
  };
  for (const VarlenCase& c : cases) {
    run_and_check(c, "");
    for (const std::string& config : c.configs) run_and_check(c, config);
  }
}

TEST_CASE("a packed batch runs its own kernels, chosen for packed batches", "[gpu][varlen]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  DeviceBuffer buffer(size_t(64) * 2 * 64 * 2), offsets(3 * sizeof(int32_t));
  offsets.upload(std::vector<int32_t>{0, 20, 64});
  flashgen_varlen_forward_args args{};
  args.size = sizeof(args);
  args.q = args.k = args.v = args.out =
      flashgen_tensor{buffer.data(), FLASHGEN_FLOAT16, {1, 64, 2, 64}, {64 * 2 * 64, 2 * 64, 64, 1}};
  args.cu_seqlens_q = args.cu_seqlens_k = static_cast<const int32_t*>(offsets.data());
  args.batch = 2, args.max_seqlen_q = 44, args.max_seqlen_k = 44;
  const flashgen::ForwardPlan plan = flashgen::plan_forward(flashgen::make_varlen_forward_call(args), nullptr);
  CHECK(plan.launch.config.varlen);
  CHECK(plan.launch.config.family() == flashgen::KernelFamily::kSm80);
  CHECK(plan.launch.config.name().find("_varlen") != std::string::npos);
}
