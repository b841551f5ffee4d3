// User-defined variants through the C ABI without a GPU: flashgen_variant_create's checks of a description (each
// refusal naming its field), its tag, a function that does not compile (NVRTC's messages with the function's own
// line numbers), the calls' refusals of a variant they cannot take, and the kernels a variant generates compiling
// for both families and both passes.
#include <string>

#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "generator/generator.hpp"
#include "problem/user_variant.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "support/fake_pointer.hpp"

namespace {

// A document mask over a causal base: keys of the query's own document, read from an int32 buffer of document ids.
flashgen_variant_desc document_mask() {
  static const flashgen_variant_arg buffers[] = {{"doc", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "return doc[q_idx] == doc[kv_idx];";
  desc.buffers = buffers;
  desc.num_buffers = 1;
  return desc;
}

// A relative-position bias with its scale as a scalar: score + scale * (kv_idx - q_idx), and the derivative 1.
flashgen_variant_desc relative_bias() {
  static const flashgen_variant_arg scalars[] = {{"slope", FLASHGEN_ARG_FLOAT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.score_mod = "return score + slope * float(kv_idx - q_idx);";
  desc.score_grad = "return 1.f;";
  desc.scalars = scalars;
  desc.num_scalars = 1;
  return desc;
}

struct Created {
  int status;
  flashgen_variant* variant = nullptr;
  std::string error;
  ~Created() { flashgen_variant_destroy(variant); }
};

Created create(const flashgen_variant_desc& desc) {
  Created c{0, nullptr, {}};
  c.status = flashgen_variant_create(&desc, &c.variant);
  c.error = flashgen_last_error();
  return c;
}

}  // namespace

TEST_CASE("a user variant is created and tagged by the hash of its functions", "[c_api][user_variant]") {
  const Created doc = create(document_mask());
  REQUIRE(doc.status == FLASHGEN_SUCCESS);
  const std::string tag = flashgen_variant_tag(doc.variant);
  CHECK(tag.size() == 13);
  CHECK(tag[0] == 'u');
  CHECK(tag.find_first_not_of("0123456789abcdef", 1) == std::string::npos);
  const Created again = create(document_mask());
  REQUIRE(again.status == FLASHGEN_SUCCESS);
  CHECK(flashgen_variant_tag(again.variant) == tag);  // equal descriptions share kernels
  flashgen_variant_desc other = document_mask();
  other.mask_mod = "return doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx;";
  const Created changed = create(other);
  REQUIRE(changed.status == FLASHGEN_SUCCESS);
  CHECK(flashgen_variant_tag(changed.variant) != tag);
  const Created bias = create(relative_bias());
  REQUIRE(bias.status == FLASHGEN_SUCCESS);
  CHECK(flashgen_variant_tag(bias.variant) != tag);
}

TEST_CASE("a user function that does not compile comes back with NVRTC's messages at its own lines",
          "[c_api][user_variant]") {
  flashgen_variant_desc desc = document_mask();
  desc.mask_mod = "const int d = doc[q_idx];\nreturn d == documents[kv_idx];";
  const Created c = create(desc);
  CHECK(c.status == FLASHGEN_ERROR_COMPILE);
  CHECK(c.variant == nullptr);
  CHECK_THAT(c.error, Catch::Matchers::Contains("do not compile"));
  CHECK_THAT(c.error, Catch::Matchers::Contains("mask_mod(2)"));
  CHECK_THAT(c.error, Catch::Matchers::Contains("documents"));
}

TEST_CASE("a user variant's description is checked field by field", "[c_api][user_variant]") {
  const flashgen_variant_arg dup[] = {{"doc", FLASHGEN_ARG_INT32}, {"doc", FLASHGEN_ARG_FLOAT32}};
  const flashgen_variant_arg reserved[] = {{"q_idx", FLASHGEN_ARG_INT32}};
  const flashgen_variant_arg bad_name[] = {{"2d", FLASHGEN_ARG_INT32}};
  const flashgen_variant_arg bad_scalar[] = {{"n", FLASHGEN_ARG_UINT8}};
  struct Case {
    const char* what;
    void (*edit)(flashgen_variant_desc&);
    const char* message;
  };
  static const flashgen_variant_arg* s_dup = dup;
  static const flashgen_variant_arg* s_reserved = reserved;
  static const flashgen_variant_arg* s_bad_name = bad_name;
  static const flashgen_variant_arg* s_bad_scalar = bad_scalar;
  const Case cases[] = {
      {"size", [](flashgen_variant_desc& d) { d.size = 8; }, "desc.size"},
      {"nothing", [](flashgen_variant_desc& d) { d.mask_mod = nullptr; }, "at least one of"},
      {"empty body", [](flashgen_variant_desc& d) { d.mask_mod = "  \n"; }, "desc.mask_mod"},
      {"mod and bias", [](flashgen_variant_desc& d) { d.score_mod = "return score;", d.score_bias = "return 0.f;"; },
       "desc.score_bias"},
      {"grad alone", [](flashgen_variant_desc& d) { d.score_grad = "return 1.f;"; }, "desc.score_grad"},
      {"count", [](flashgen_variant_desc& d) { d.num_buffers = 9; }, "num_buffers must be 0 to 8"},
      {"null list", [](flashgen_variant_desc& d) { d.buffers = nullptr; }, "desc.buffers is NULL"},
      {"twice", [](flashgen_variant_desc& d) { d.buffers = s_dup, d.num_buffers = 2; }, "declared twice"},
      {"reserved", [](flashgen_variant_desc& d) { d.buffers = s_reserved; }, "desc.buffers[0].name 'q_idx' is taken"},
      {"identifier", [](flashgen_variant_desc& d) { d.buffers = s_bad_name; }, "not a C++ identifier"},
      {"scalar type",
       [](flashgen_variant_desc& d) { d.scalars = s_bad_scalar, d.num_scalars = 1; }, "desc.scalars[0].type"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    flashgen_variant_desc desc = document_mask();
    c.edit(desc);
    const Created created = create(desc);
    CHECK(created.status == FLASHGEN_ERROR_INVALID_ARGUMENT);
    CHECK(created.variant == nullptr);
    CHECK_THAT(created.error, Catch::Matchers::Contains(c.message));
  }
  flashgen_variant* out = nullptr;
  CHECK(flashgen_variant_create(nullptr, &out) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(flashgen_last_error()), Catch::Matchers::Contains("desc: null pointer"));
}

TEST_CASE("calls refuse a user variant they cannot take, naming the argument", "[c_api][user_variant]") {
  const Created doc = create(document_mask());
  const Created bias = create(relative_bias());
  REQUIRE(doc.status == FLASHGEN_SUCCESS);
  REQUIRE(bias.status == FLASHGEN_SUCCESS);
  void* data = flashgen::test::fake_pointer(1);
  const flashgen_tensor t{data, FLASHGEN_FLOAT16, {1, 64, 2, 64}, {64 * 2 * 64, 2 * 64, 64, 1}};
  const float slope = 0.5f;
  struct Case {
    const char* what;
    const flashgen_variant* variant;
    const void* const* buffers;
    const void* scalars;
    float softcap;
    const char* message;
  };
  const Case cases[] = {
      {"buffers missing", doc.variant, nullptr, nullptr, 0.f, "opts.variant_buffers is NULL"},
      {"scalars missing", bias.variant, nullptr, nullptr, 0.f, "opts.variant_scalars is NULL"},
      {"score function beside a cap", bias.variant, nullptr, &slope, 30.f, "takes the place of opts.softcap"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    flashgen_attention_options opts{};
    opts.variant = c.variant, opts.variant_buffers = c.buffers, opts.variant_scalars = c.scalars;
    opts.softcap = c.softcap;
    CHECK(flashgen_attention_forward(&t, &t, &t, &t, nullptr, &opts, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(flashgen_last_error()), Catch::Matchers::Contains(c.message));
  }
  // A block mask keeps a mask's classes: refused without a variant that has a mask_mod, and by KV-cache calls.
  flashgen_block_mask* kept = nullptr;
  CHECK(flashgen_block_mask_create(nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(flashgen_last_error()), Catch::Matchers::Contains("mask: null pointer"));
  REQUIRE(flashgen_block_mask_create(&kept) == FLASHGEN_SUCCESS);
  const flashgen_variant* without_mask[] = {nullptr, bias.variant};
  for (const flashgen_variant* variant : without_mask) {
    flashgen_attention_options opts{};
    opts.variant = variant, opts.variant_scalars = &slope;
    opts.block_mask = kept;
    CHECK(flashgen_attention_forward(&t, &t, &t, &t, nullptr, &opts, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(flashgen_last_error()), Catch::Matchers::Contains("opts.block_mask: given without a variant"));
  }
  flashgen_block_mask_destroy(kept);
  flashgen_block_mask_destroy(nullptr);
  flashgen_variant_desc no_grad = relative_bias();
  no_grad.score_grad = nullptr;
  const Created forward_only = create(no_grad);
  REQUIRE(forward_only.status == FLASHGEN_SUCCESS);
  flashgen_attention_options opts{};
  opts.variant = forward_only.variant, opts.variant_scalars = &slope;
  CHECK(flashgen_attention_backward(&t, &t, &t, &t, &t, static_cast<const float*>(data), &t, &t, &t, &opts, nullptr) ==
        FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(flashgen_last_error()), Catch::Matchers::Contains("no score_grad"));
}
