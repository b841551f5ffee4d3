// Tests for the varlen calls' argument checks (flashgen_attention_varlen_forward and _backward): each bad
// argument refused with a message naming it, before anything touches a GPU.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "runtime/cuda_driver.hpp"
#include "support/fake_pointer.hpp"

namespace {

using flashgen::test::fake_pointer;

flashgen_tensor packed(void* data, int64_t total, int64_t heads, int64_t head_dim) {
  return flashgen_tensor{data, FLASHGEN_FLOAT16, {1, total, heads, head_dim},
                         {total * heads * head_dim, heads * head_dim, head_dim, 1}};
}

// Three sequences packed into 300 query rows and 500 key rows, 8 query heads over 2 key/value heads.
flashgen_varlen_forward_args valid_args() {
  flashgen_varlen_forward_args args{};
  args.size = sizeof(args);
  args.q = packed(fake_pointer(1), 300, 8, 64);
  args.k = packed(fake_pointer(2), 500, 2, 64);
  args.v = packed(fake_pointer(3), 500, 2, 64);
  args.out = packed(fake_pointer(4), 300, 8, 64);
  args.lse = static_cast<float*>(fake_pointer(5));
  args.cu_seqlens_q = static_cast<const int32_t*>(fake_pointer(6));
  args.cu_seqlens_k = static_cast<const int32_t*>(fake_pointer(7));
  args.batch = 3;
  args.max_seqlen_q = 200;
  args.max_seqlen_k = 300;
  args.options.mask = FLASHGEN_MASK_CAUSAL;
  return args;
}

// The keys and values in 40 pages of 32 keys, 8 pages per sequence.
void use_pages(flashgen_varlen_forward_args& a) {
  a.k = flashgen_tensor{fake_pointer(2), FLASHGEN_FLOAT16, {40, 32, 2, 64}, {32 * 2 * 64, 2 * 64, 64, 1}};
  a.v = a.k;
  a.v.data = fake_pointer(3);
  a.block_table = static_cast<const int32_t*>(fake_pointer(12));
  a.max_pages = 8;
  a.max_seqlen_k = 200;
}

void check_rejected(const std::function<void(flashgen_varlen_forward_args&)>& edit, int status,
                    const std::string& message) {
  flashgen_varlen_forward_args args = valid_args();
  edit(args);
  INFO("expected: " << message);
  CHECK(flashgen_attention_varlen_forward(&args, nullptr) == status);
  const std::string error = flashgen_last_error();
  INFO("got: " << error);
  CHECK(error.find(message) != std::string::npos);
}

}  // namespace

TEST_CASE("varlen forward rejects each bad argument with a message naming it", "[c_api][varlen]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  CHECK(flashgen_attention_varlen_forward(nullptr, nullptr) == kInvalid);
  CHECK(std::string(flashgen_last_error()).find("args: null pointer") != std::string::npos);
  check_rejected([](auto& a) { a.size = 0; }, kInvalid, "args.size is 0; this flashgen's argument struct");
  check_rejected([](auto& a) { a.size += 8; }, kInvalid, "args.size is 584, not this flashgen's 576 bytes");
  // The dense call's checks of the tensors and options apply.
  check_rejected([](auto& a) { a.k.shape[3] = 32; }, kInvalid, "k.shape[3] (head_dim) is 32 but q.shape[3]");
  check_rejected([](auto& a) { a.v.shape[1] = 499; }, kInvalid, "v.shape[1] (seqlen) is 499 but k.shape[1]");
  check_rejected([](auto& a) { a.options.mask = static_cast<flashgen_mask>(5); }, kInvalid, "opts.mask: unknown value 5");
  // The packing.
  check_rejected(
      [](auto& a) {
        for (flashgen_tensor* t : {&a.q, &a.out}) t->shape[0] = 2;
        for (flashgen_tensor* t : {&a.k, &a.v}) t->shape[0] = 2;
      },
      kInvalid, "q.shape[0] is 2: a packed batch is one entry [1, total, heads, head_dim]");
  check_rejected([](auto& a) { a.cu_seqlens_q = nullptr; }, kInvalid, "cu_seqlens_q: null pointer");
  check_rejected([](auto& a) { a.cu_seqlens_k = nullptr; }, kInvalid, "cu_seqlens_k: null pointer");
  check_rejected(
      [](auto& a) { a.cu_seqlens_k = reinterpret_cast<const int32_t*>(reinterpret_cast<uintptr_t>(a.cu_seqlens_k) + 2); },
      kInvalid, "cu_seqlens_k: pointer must be 4-byte aligned");
  check_rejected([](auto& a) { a.seqused_k = reinterpret_cast<const int32_t*>(reinterpret_cast<uintptr_t>(a.lse) + 2); },
                 kInvalid, "seqused_k: pointer must be 4-byte aligned");
  check_rejected([](auto& a) { a.batch = 0; }, kInvalid, "batch must be in [1, 65535] (sequences; grid limit), got 0");
  check_rejected([](auto& a) { a.batch = 65536; }, kInvalid, "batch must be in [1, 65535]");
  check_rejected([](auto& a) { a.max_seqlen_q = 0; }, kInvalid, "max_seqlen_q must be in [1, total_q = 300], got 0");
  check_rejected([](auto& a) { a.max_seqlen_q = 301; }, kInvalid, "max_seqlen_q must be in [1, total_q = 300], got 301");
  check_rejected([](auto& a) { a.max_seqlen_k = 501; }, kInvalid, "max_seqlen_k must be in [1, total_k = 500], got 501");
}

TEST_CASE("varlen forward over a paged cache rejects bad pages with a message naming them", "[c_api][varlen]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  auto paged = [](flashgen_varlen_forward_args& a) { use_pages(a); };
  check_rejected([&](auto& a) { paged(a), a.k.shape[1] = a.v.shape[1] = 24; }, kInvalid,
                 "k.shape[1] (page_size) must be a multiple of 16 with a block_table, got 24");
  check_rejected([&](auto& a) { paged(a), a.v.shape[0] = 39; }, kInvalid, "v.shape[0]");
  check_rejected([&](auto& a) { paged(a), a.max_pages = 0; }, kInvalid, "max_pages must be at least 1");
  check_rejected(
      [&](auto& a) { paged(a), a.block_table = reinterpret_cast<const int32_t*>(reinterpret_cast<uintptr_t>(a.lse) + 2); },
      kInvalid, "block_table: pointer must be 4-byte aligned");
  check_rejected([&](auto& a) { paged(a), a.max_seqlen_k = 257; }, kInvalid,
                 "max_seqlen_k must be at most max_pages * page_size = 256, got 257");
  check_rejected([&](auto& a) { paged(a), a.k.stride[1] = 36; }, kInvalid, "k.stride[1]");
  // A user mask over a paged cache walks every key block of the base mask: a block mask is refused by name.
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "return (q_idx & 1) == (kv_idx & 1);";
  flashgen_variant* variant = nullptr;
  REQUIRE(flashgen_variant_create(&desc, &variant) == FLASHGEN_SUCCESS);
  flashgen_block_mask* kept = nullptr;
  REQUIRE(flashgen_block_mask_create(&kept) == FLASHGEN_SUCCESS);
  check_rejected([&](auto& a) { paged(a), a.options.variant = variant, a.options.block_mask = kept; }, kInvalid,
                 "opts.block_mask: a packed call over a paged cache has no block classes");
  flashgen_block_mask_destroy(kept);
  flashgen_variant_destroy(variant);
}

TEST_CASE("varlen forward with valid arguments gets as far as the GPU", "[c_api][varlen]") {
  if (flashgen::driver_available()) FLASHGEN_SKIP_TEST("a driver is present: the [gpu] varlen cases launch");
  flashgen_varlen_forward_args args = valid_args();
  CHECK(flashgen_attention_varlen_forward(&args, nullptr) == FLASHGEN_ERROR_NO_DEVICE);
  // Only sizeof: the struct without its last two fields is the size of an older flashgen.h's whole struct.
  args.size = offsetof(flashgen_varlen_forward_args, block_table);
  CHECK(flashgen_attention_varlen_forward(&args, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("the variants grew the argument structs: an older caller's size is refused, not misread",
          "[c_api][varlen][window][alibi][sinks][chunk][user_variant]") {
  // LP64 layouts: the options 16 -> 24 bytes (the window) -> 40 (ALiBi) -> 64 (the sinks and the chunk) -> 88 (a
  // user variant) -> 96 (a block mask) -> 104 (their own size, first) -> 176 (an FP8 forward's descales), and every
  // struct that embeds them.
  CHECK(sizeof(flashgen_attention_options) == 176);
  CHECK(offsetof(flashgen_attention_options, softmax_scale) == 8);
  CHECK(offsetof(flashgen_attention_options, window_left) == 24);
  CHECK(offsetof(flashgen_attention_options, alibi_slopes) == 32);
  CHECK(offsetof(flashgen_attention_options, sinks) == 48);
  CHECK(offsetof(flashgen_attention_options, dsinks) == 56);
  CHECK(offsetof(flashgen_attention_options, attention_chunk) == 64);
  CHECK(offsetof(flashgen_attention_options, variant) == 72);
  CHECK(offsetof(flashgen_attention_options, variant_scalars) == 88);
  CHECK(offsetof(flashgen_attention_options, block_mask) == 96);
  CHECK(offsetof(flashgen_attention_options, q_descale) == 104);
  CHECK(offsetof(flashgen_attention_options, v_descale_stride) == 160);
  CHECK(offsetof(flashgen_varlen_forward_args, options) == 384);
  CHECK(offsetof(flashgen_varlen_forward_args, block_table) == 560);
  CHECK(sizeof(flashgen_varlen_forward_args) == 576);
  CHECK(sizeof(flashgen_varlen_backward_args) == 872);
  CHECK(sizeof(flashgen_kvcache_args) == 768);  // with an FP8 cache's scales and the options' descales
  // The sizes callers compiled against the earlier flashgen.h files pass: the varlen forward's before the window
  // (400, and 416 whole), after it (408 before block_table, 424 whole) and after ALiBi (424 before block_table,
  // 440 whole), after the sinks and the chunk (448 before block_table, 464 whole), after the variant (472, 488) and
  // after the block mask (480, 496) and after the options' size (488, 504), the varlen backward's (712, 720, 736, 760,
  // 784, 792, 800), the KV-cache call's (560, 568, 584, 608, 632, 640, 648 before the cache's scales, 696 after
  // them). None is this struct's offset of block_table (560), but no size other than sizeof is read anyway.
  for (const size_t old_size : {size_t{400}, size_t{408}, size_t{416}, size_t{424}, size_t{440}, size_t{464},
                                size_t{472}, size_t{480}, size_t{488}, size_t{496}, size_t{504}}) {
    INFO(old_size);
    check_rejected([&](auto& a) { a.size = old_size; }, FLASHGEN_ERROR_INVALID_ARGUMENT,
                   "args.size is " + std::to_string(old_size) +
                       "; this flashgen's argument struct has 576 bytes (set size to sizeof; rebuild a caller "
                       "compiled against an older flashgen.h)");
  }
  for (const size_t old_size :
       {size_t{712}, size_t{720}, size_t{736}, size_t{760}, size_t{784}, size_t{792}, size_t{800}}) {
    flashgen_varlen_backward_args backward{};
    backward.size = old_size;
    CHECK(flashgen_attention_varlen_backward(&backward, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(flashgen_last_error()).find("args.size is " + std::to_string(old_size) +
                                                  "; this flashgen's argument struct has 872") != std::string::npos);
  }
  for (const size_t old_size :
       {size_t{560}, size_t{568}, size_t{584}, size_t{608}, size_t{632}, size_t{640}, size_t{648}, size_t{696}}) {
    flashgen_kvcache_args kvcache{};
    kvcache.size = old_size;
    CHECK(flashgen_attention_kvcache(&kvcache, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(flashgen_last_error()).find("args.size is " + std::to_string(old_size) +
                                                  "; this flashgen's argument struct has 768") != std::string::npos);
  }
  // The options inside an argument struct carry their own size too.
  check_rejected([](auto& a) { a.options.size = 0; }, FLASHGEN_ERROR_INVALID_ARGUMENT,
                 "args.options.size is 0; this flashgen's options struct has 176 bytes");
}

TEST_CASE("varlen backward rejects bad arguments with a message naming them", "[c_api][varlen]") {
  const flashgen_varlen_forward_args f = valid_args();
  flashgen_varlen_backward_args args{};
  args.size = sizeof(args);
  args.q = f.q, args.k = f.k, args.v = f.v, args.out = f.out;
  args.dout = packed(fake_pointer(8), 300, 8, 64);
  args.dq = packed(fake_pointer(9), 300, 8, 64);
  args.dk = packed(fake_pointer(10), 500, 2, 64);
  args.dv = packed(fake_pointer(11), 500, 2, 64);
  args.lse = f.lse;
  args.cu_seqlens_q = f.cu_seqlens_q, args.cu_seqlens_k = f.cu_seqlens_k;
  args.batch = f.batch, args.max_seqlen_q = f.max_seqlen_q, args.max_seqlen_k = f.max_seqlen_k;
  args.options = f.options;
  auto rejected = [&](const std::function<void(flashgen_varlen_backward_args&)>& edit, const std::string& message) {
    flashgen_varlen_backward_args bad = args;
    edit(bad);
    INFO("expected: " << message);
    CHECK(flashgen_attention_varlen_backward(&bad, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
    const std::string error = flashgen_last_error();
    INFO("got: " << error);
    CHECK(error.find(message) != std::string::npos);
  };
  rejected([](auto& a) { a.size = 16; }, "args.size is 16");
  rejected([](auto& a) { a.lse = nullptr; }, "lse: null pointer");
  rejected([](auto& a) { a.dk.shape[1] = 499; }, "dk.shape[1]");
  rejected([](auto& a) { a.cu_seqlens_k = nullptr; }, "cu_seqlens_k: null pointer");
  rejected([](auto& a) { a.max_seqlen_k = 0; }, "max_seqlen_k must be in [1, total_k = 500], got 0");
  if (!flashgen::driver_available()) {
    CHECK(flashgen_attention_varlen_backward(&args, nullptr) == FLASHGEN_ERROR_NO_DEVICE);
  }
}

TEST_CASE("a paged call's K and V tiles are copied in boxes that lie in one page", "[c_api][varlen][tma]") {
  // Pages of 32 keys under 128-key tiles: every TMA box of K and of V is 32 rows (a V box of the tile's 128 rows
  // would write past the block's shared memory).
  flashgen_varlen_forward_args args = valid_args();
  use_pages(args);
  const flashgen::ForwardCall call = flashgen::make_varlen_forward_call(args);
  for (const char* name : {"fwd_sm90_fp16_d64_m192_n128_s2_causal_ovl_varlen_paged",
                           "fwd_sm90_fp16_d64_m128_n128_s2_causal_ovl_pp_varlen_paged"}) {
    INFO(name);
    const flashgen::FwdTmaTensors tensors(call.problem, call.params, flashgen::KernelConfig::from_name(name));
    CHECK(tensors.kv_rows == 32);
    CHECK(tensors.v_rows == 32);
  }
}
