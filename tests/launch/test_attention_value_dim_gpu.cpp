// [gpu] The forward of values with a head dim of their own (v and out [b, s, h, d_v] beside q and k of head_dim):
// MLA's prefill shapes (192, 128) and (128, 64), wider values than keys, a d_v off the 16-column mma step, through the
// C ABI's own choice and each family's tiles (the Hopper family's on sm_90), against the float64 reference.
#include <string>
#include <vector>

#include "catch.hpp"
#include "gpu.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/forward_problem.hpp"

using namespace flashgen::test;

namespace {

Problem with_value_dim(Problem p, int64_t head_dim_v) {
  p.shape.head_dim_v = head_dim_v;
  return p;
}

// A problem and the configs it runs through launch_forward.
struct ConfigCase {
  Problem problem;
  std::vector<const char*> configs;
};

void run_each(const std::vector<ConfigCase>& cases) {
  for (const auto& [problem, names] : cases) {
    INFO(problem.describe());
    std::vector<flashgen::KernelConfig> configs;
    for (const char* name : names) configs.push_back(flashgen::KernelConfig::from_name(name));
    run_and_check(problem, nullptr, configs);
  }
}

}  // namespace

TEST_CASE("attention forward: values of a head dim of their own, the C ABI's choice", "[gpu][attention][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  const flashgen_mask none = FLASHGEN_MASK_NONE, br = FLASHGEN_MASK_CAUSAL, tl = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
  std::vector<Problem> problems = {
      // MLA prefill: 192/128, causal, GQA; rows 0..200 of the second see no key.
      with_value_dim(make_problem(2, 300, 300, 4, 2, 192, FLASHGEN_BFLOAT16, br, 1101), 128),
      with_value_dim(make_problem(1, 333, 130, 2, 1, 192, FLASHGEN_FLOAT16, br, 1102), 128),
      with_value_dim(make_problem(1, 257, 515, 3, 3, 192, FLASHGEN_BFLOAT16, none, 1103), 128),
      // Narrower and wider values than keys, and a d_v off the 16-column step (padded, with NaN past each head).
      with_value_dim(make_problem(2, 200, 333, 4, 1, 128, FLASHGEN_FLOAT16, tl, 1104), 64),
      with_value_dim(make_problem(1, 129, 129, 2, 2, 64, FLASHGEN_BFLOAT16, br, 1105), 256),
      with_value_dim(make_problem(1, 100, 77, 2, 1, 64, FLASHGEN_FLOAT16, none, 1106), 40),
      with_value_dim(make_problem(1, 64, 190, 2, 2, 96, FLASHGEN_BFLOAT16, br, 1107), 384),
  };
  // FA3's 64 / 512: on sm_90 only (two consumers for each 64 rows split O's columns; an sm80 warp cannot hold them).
  if (flashgen::device_sm(context.device()) == 90) {
    problems.push_back(with_value_dim(make_problem(2, 257, 300, 4, 1, 64, FLASHGEN_BFLOAT16, br, 1108), 512));
  }
  problems[2].layout = Layout::kBHSD;
  problems[5].layout = Layout::kPadded;
  problems[6].with_lse = false;
  for (const Problem& p : problems) {
    INFO(p.describe());
    run_and_check(p);
  }
}

TEST_CASE("attention forward: values of a head dim of their own, each sm80 tile", "[gpu][attention][value_dim]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  const std::vector<ConfigCase> cases = {
      {with_value_dim(make_problem(1, 300, 411, 4, 2, 192, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 1201), 128),
       {"fwd_sm80_bf16_d192_v128_m64_n32_w4_s2_causal", "fwd_sm80_bf16_d192_v128_m64_n64_w4_s2_causal",
        "fwd_sm80_bf16_d192_v128_m128_n64_w8_s2_causal", "fwd_sm80_bf16_d192_v128_m128_n32_w8_s3_causal"}},
      {with_value_dim(make_problem(2, 200, 200, 4, 4, 128, FLASHGEN_FLOAT16, FLASHGEN_MASK_NONE, 1202), 64),
       {"fwd_sm80_fp16_d128_v64_m128_n64_w4_s2", "fwd_sm80_fp16_d128_v64_m128_n32_w4_s3",
        "fwd_sm80_fp16_d128_v64_m64_n64_w4_s2"}},
      {with_value_dim(make_problem(1, 150, 260, 2, 1, 64, FLASHGEN_BFLOAT16, FLASHGEN_MASK_CAUSAL, 1203), 256),
       {"fwd_sm80_bf16_d64_v256_m64_n32_w4_s2_causal", "fwd_sm80_bf16_d64_v256_m128_n48_w8_s2_causal"}},
  };
  run_each(cases);
}

TEST_CASE("attention forward: values of a head dim of their own, each sm90 tile", "[gpu][attention][value_dim][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  const flashgen_dtype f16 = FLASHGEN_FLOAT16, bf16 = FLASHGEN_BFLOAT16;
  const std::vector<ConfigCase> cases = {
      // MLA's prefill: persistent and not, ping-pong and three consumers, P through shared memory; rows of no key.
      {with_value_dim(make_problem(2, 300, 411, 4, 2, 192, bf16, FLASHGEN_MASK_CAUSAL, 1301), 128),
       {"fwd_sm90_bf16_d192_v128_m128_n112_s2_causal_ovl_pp_pst", "fwd_sm90_bf16_d192_v128_m128_n128_s2_causal_ovl_pp",
        "fwd_sm90_bf16_d192_v128_m64_n64_s2_causal", "fwd_sm90_bf16_d192_v128_m192_n64_s2_causal_ovl_pst_psm"}},
      {with_value_dim(make_problem(1, 517, 333, 2, 2, 192, f16, FLASHGEN_MASK_NONE, 1302), 128),
       {"fwd_sm90_fp16_d192_v128_m128_n112_s2_ovl_pp_pst", "fwd_sm90_fp16_d192_v128_m128_n128_s2_ovl_pp_c2"}},
      // Narrower and wider values than keys: staged in the Q rows, and in rows of their own.
      {with_value_dim(make_problem(2, 200, 260, 4, 1, 128, f16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 1303), 64),
       {"fwd_sm90_fp16_d128_v64_m128_n128_s2_causal_ovl_pp_pst", "fwd_sm90_fp16_d128_v64_m128_n128_s2_causal_ovl_pp"}},
      {with_value_dim(make_problem(1, 150, 260, 2, 1, 64, bf16, FLASHGEN_MASK_CAUSAL, 1304), 256),
       {"fwd_sm90_bf16_d64_v256_m128_n64_s2_causal_ovl_pp", "fwd_sm90_bf16_d64_v256_m64_n64_s2_causal"}},
      // A values' dim off the 64-column chunk: TMA fills the V tile's padding with zeros and clips the output's.
      {with_value_dim(make_problem(1, 190, 190, 2, 2, 128, bf16, FLASHGEN_MASK_NONE, 1305), 72),
       {"fwd_sm90_bf16_d128_v72_m128_n128_s2_ovl_pp"}},
      // Values wider than one consumer's registers (FA3's 64 / 512): two consumers for each 64 rows, each with half
      // of O's columns; ping-pong and not, persistent and not, P through shared memory, rows of no key.
      {with_value_dim(make_problem(2, 300, 211, 4, 1, 64, bf16, FLASHGEN_MASK_CAUSAL, 1306), 512),
       {"fwd_sm90_bf16_d64_v512_m64_n64_s2_causal_ovl_pp_pst_vs2", "fwd_sm90_bf16_d64_v512_m64_n64_s2_causal_ovl_vs2",
        "fwd_sm90_bf16_d64_v512_m64_n32_s2_causal_vs2", "fwd_sm90_bf16_d64_v512_m64_n48_s2_causal_ovl_pst_psm_vs2"}},
      {with_value_dim(make_problem(1, 257, 300, 2, 2, 128, f16, FLASHGEN_MASK_NONE, 1307), 512),
       {"fwd_sm90_fp16_d128_v512_m64_n48_s2_ovl_pp_pst_vs2", "fwd_sm90_fp16_d128_v512_m64_n32_s2_ovl_pp_vs2"}},
      // Parts of whole chunks past the values' dim (320: two of 192; 448: two of 256), a split of 256 and keys of 256.
      {with_value_dim(make_problem(1, 190, 170, 2, 1, 64, f16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 1308), 320),
       {"fwd_sm90_fp16_d64_v320_m64_n64_s2_causal_ovl_pp_pst_vs2"}},
      {with_value_dim(make_problem(1, 130, 140, 2, 2, 256, bf16, FLASHGEN_MASK_NONE, 1309), 448),
       {"fwd_sm90_bf16_d256_v448_m64_n32_s2_ovl_pp_pst_vs2"}},
      {with_value_dim(make_problem(1, 200, 200, 2, 2, 128, bf16, FLASHGEN_MASK_CAUSAL, 1310), 256),
       {"fwd_sm90_bf16_d128_v256_m64_n64_s2_causal_ovl_pp_vs2"}},
  };
  run_each(cases);
}

TEST_CASE("attention forward: keys of 512 (and 320, 384) on the Hopper family", "[gpu][attention][value_dim][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext context;
  FLASHGEN_REQUIRE_SM90(context);
  const flashgen_dtype f16 = FLASHGEN_FLOAT16, bf16 = FLASHGEN_BFLOAT16;
  const std::vector<ConfigCase> cases = {
      // Gemma 4's global layers and DeepSeek-V4: keys and values of 512, the output staged in the Q rows once both
      // consumers of the rows are done with them; GQA, rows of no key, persistent and not, ping-pong and not.
      {make_problem(2, 300, 211, 4, 1, 512, bf16, FLASHGEN_MASK_CAUSAL, 1401),
       {"fwd_sm90_bf16_d512_m64_n32_s2_causal_ovl_pp_pst_vs2", "fwd_sm90_bf16_d512_m64_n32_s2_causal_vs2",
        "fwd_sm90_bf16_d512_m64_n32_s2_causal_ovl_pst_psm_vs2"}},
      {make_problem(1, 257, 300, 2, 2, 512, f16, FLASHGEN_MASK_NONE, 1402),
       {"fwd_sm90_fp16_d512_m64_n32_s2_ovl_pp_vs2", "fwd_sm90_fp16_d512_m64_n32_s2_ovl_pp_pst_vs2"}},
      // Narrower values beside them: one consumer; 384 and 320 (parts of 192, the output in rows of its own at 320).
      {with_value_dim(make_problem(1, 190, 170, 2, 1, 512, bf16, FLASHGEN_MASK_CAUSAL_TOP_LEFT, 1403), 128),
       {"fwd_sm90_bf16_d512_v128_m64_n64_s2_causal_ovl_pst", "fwd_sm90_bf16_d512_v128_m64_n32_s2_causal"}},
      {make_problem(1, 200, 230, 2, 2, 384, bf16, FLASHGEN_MASK_CAUSAL, 1404),
       {"fwd_sm90_bf16_d384_m64_n48_s2_causal_ovl_pp_pst_vs2"}},
      {make_problem(1, 150, 140, 2, 1, 320, f16, FLASHGEN_MASK_NONE, 1405),
       {"fwd_sm90_fp16_d320_m64_n32_s2_ovl_pp_pst_vs2"}},
      // 448: each consumer 256 of O's columns, the second's last chunk padding that is never staged or stored.
      {make_problem(1, 170, 170, 2, 2, 448, bf16, FLASHGEN_MASK_CAUSAL, 1407),
       {"fwd_sm90_bf16_d448_m64_n32_s2_causal_ovl_pp_pst_vs2"}},
      {with_value_dim(make_problem(1, 130, 150, 2, 1, 64, bf16, FLASHGEN_MASK_NONE, 1408), 448),
       {"fwd_sm90_bf16_d64_v448_m64_n64_s2_ovl_pp_pst_vs2"}},
      // Keys of 440 beside values of 480: Q and K tiles padded to the output's eight chunks, O staged in the Q rows.
      {with_value_dim(make_problem(1, 160, 150, 2, 1, 440, f16, FLASHGEN_MASK_CAUSAL, 1409), 480),
       {"fwd_sm90_fp16_d440_v480_m64_n32_s2_causal_ovl_pp_pst_vs2"}},
  };
  run_each(cases);
  // The C ABI's own choice, and what the backward says of the shape.
  Problem mqa = make_problem(1, 333, 333, 8, 1, 512, bf16, FLASHGEN_MASK_CAUSAL, 1406);
  mqa.layout = Layout::kBHSD;
  INFO(mqa.describe());
  run_and_check(mqa);
}
