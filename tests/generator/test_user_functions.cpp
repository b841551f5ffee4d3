// A user variant in the generated source: its functions rendered into the config header under #line directives,
// the policy wrapping the base mask, the tag ending the kernels' names; and its kernels compiling with NVRTC on
// both families and both passes.
#include <string>

#include "catch.hpp"
#include "generator/generator.hpp"
#include "problem/user_variant.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace {

// A prefix-LM mask (the first `prefix` keys seen by every query, causal after them) and a per-head bias table.
std::shared_ptr<const flashgen::UserVariant> prefix_lm_with_bias() {
  flashgen::UserVariantDesc desc;
  desc.mask_mod = "return kv_idx < prefix || kv_idx <= q_idx;";
  desc.score_bias = "return head_bias[head];";
  desc.buffers = {{"head_bias", flashgen::UserArgType::kFloat32}};
  desc.scalars = {{"prefix", flashgen::UserArgType::kInt32}};
  return flashgen::make_user_variant(desc);
}

const std::string& config_header(const flashgen::GeneratedSource& source) { return source.headers.front().contents; }

}  // namespace

TEST_CASE("a user variant's functions are rendered into the config header around the base mask",
          "[generator][user_variant]") {
  const auto user = prefix_lm_with_bias();
  flashgen::KernelConfig c;
  c.block_n = 32;
  c.stages = 2;
  c.user = user;
  CHECK(c.name() == "fwd_sm80_fp16_d128_m128_n32_w4_s2_" + user->tag);
  const std::string header = config_header(flashgen::generate(c));
  CHECK(header.find("  using Variant = flashgen::UserVariant<flashgen::NoMask, flashgen_user::Functions>;\n") !=
        std::string::npos);
  CHECK(header.find("#line 1 \"mask_mod\"\nreturn kv_idx < prefix || kv_idx <= q_idx;\n") != std::string::npos);
  CHECK(header.find("  const float* __restrict__ head_bias;\n") != std::string::npos);
  CHECK(header.find("f.prefix = static_cast<int>(p.user_scalars[0]);") != std::string::npos);
  CHECK(header.find("kScore = flashgen::UserScore::kBias;") != std::string::npos);
  flashgen::KernelConfig plain = c;
  plain.user = nullptr;
  CHECK(plain != c);
  CHECK(config_header(flashgen::generate(plain)).find("flashgen_user") == std::string::npos);
  flashgen::BwdConfig b;
  b.mask = flashgen::MaskKind::kCausal;
  b.user = user;
  CHECK(b.name() == "bwd_sm80_fp16_d128_m64_n64_w4_s2_x1_causal_" + user->tag);
  CHECK(b.symbol(flashgen::BwdKernel::kDkdv).rfind(b.name() + "_", 0) == 0);
  CHECK(config_header(flashgen::generate(b)).find("flashgen::UserVariant<flashgen::CausalMask, flashgen_user::Functions>") !=
        std::string::npos);
}

// The Hopper families' tiles keep their registers with a user mask and bias; the sm80 forward's 128-row tile spills
// (the mask's per-score calls beside its accumulators), which only its timing pays.
TEST_CASE("a user variant's kernels compile on both families, both passes, the Hopper ones without spills",
          "[generator][user_variant][nvrtc]") {
  const auto user = prefix_lm_with_bias();
  flashgen::KernelConfig sm80 = flashgen::KernelConfig::from_name("fwd_sm80_bf16_d128_m128_n64_w4_s2_causal");
  flashgen::KernelConfig sm90 = flashgen::KernelConfig::from_name("fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_pst");
  flashgen::BwdConfig bwd90 = flashgen::BwdConfig::from_name("bwd_sm90_bf16_d128_m64_n128_s2_causal");
  for (flashgen::KernelConfig* c : {&sm80, &sm90}) {
    c->user = user;
    INFO(c->name());
    REQUIRE(flashgen::has_user_block_classes(*c));
    const flashgen::CompiledKernel k = flashgen::compile_nvrtc(flashgen::generate(*c), c->sm90() ? 90 : 80);
    CHECK(k.usage.registers > 0);
    if (c->sm90()) CHECK(k.usage.spill_store_bytes == 0);
    CHECK(k.usage_of(c->symbol(flashgen::FwdKernel::kUserBlockTiles)).registers > 0);  // the block classes' kernel
  }
  bwd90.user = user;
  REQUIRE(flashgen::has_user_block_classes(bwd90));
  const flashgen::CompiledKernel k = flashgen::compile_nvrtc(flashgen::generate(bwd90), 90);
  INFO(k.log);
  CHECK(k.usage_of(bwd90.symbol(flashgen::BwdKernel::kDkdv)).spill_store_bytes == 0);
  for (flashgen::BwdKernel classes : {flashgen::BwdKernel::kUserBlockTiles, flashgen::BwdKernel::kUserBlockRanges,
                                      flashgen::BwdKernel::kUserBlockBands}) {
    INFO(bwd90.symbol(classes));
    CHECK(k.usage_of(bwd90.symbol(classes)).registers > 0);
  }
  flashgen::BwdConfig packed = bwd90;  // a packed batch's classes are per sequence
  packed.varlen = true;
  CHECK(flashgen::has_user_block_classes(packed));
  const flashgen::CompiledKernel kp = flashgen::compile_nvrtc(flashgen::generate(packed), 90);
  CHECK(kp.usage_of(packed.symbol(flashgen::BwdKernel::kUserBlockTiles)).registers > 0);
  flashgen::KernelConfig paged = sm90;  // over a paged cache there are none: its walk masks every block
  paged.varlen = paged.paged = true;
  CHECK_FALSE(flashgen::has_user_block_classes(paged));
}

TEST_CASE("a user variant's KV-cache module names it and compiles", "[generator][user_variant][nvrtc]") {
  const auto user = prefix_lm_with_bias();
  flashgen::DecodeConfig c = flashgen::DecodeConfig::from_name("dec_sm80_bf16_d128_r16_n64_w4_s3_causal_paged");
  c.user = user;
  CHECK(c.name() == "dec_sm80_bf16_d128_r16_n64_w4_s3_causal_paged_" + user->tag);
  CHECK(c.symbol(flashgen::DecodeKernel::kAttend).rfind(c.name() + "_", 0) == 0);
  const flashgen::GeneratedSource source = flashgen::generate(c);
  CHECK(config_header(source).find("flashgen::UserVariant<flashgen::CausalMask, flashgen_user::Functions>") !=
        std::string::npos);
  const flashgen::CompiledKernel k = flashgen::compile_nvrtc(source, 90);
  INFO(k.log);
  const flashgen::ResourceUsage attend = k.usage_of(c.symbol(flashgen::DecodeKernel::kAttend));
  CHECK(attend.registers > 0);
  CHECK(attend.spill_store_bytes == 0);
}
