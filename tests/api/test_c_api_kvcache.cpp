// Tests for flashgen_attention_kvcache's argument checks: each bad argument refused with a message naming it,
// before anything touches a GPU; a valid call's problem and parameters as the kernels read them.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "flashgen/flashgen.h"
#include "launch/attention_kvcache.hpp"
#include "launch/tensor_checks.hpp"
#include "support/fake_pointer.hpp"
#include "tuner/decode_choice.hpp"
#include "tuner/problem_key.hpp"

namespace {

using flashgen::test::fake_pointer;

flashgen_tensor bshd(void* data, int64_t n0, int64_t n1, int64_t heads, int64_t head_dim) {
  return flashgen_tensor{data, FLASHGEN_BFLOAT16, {n0, n1, heads, head_dim},
                         {n1 * heads * head_dim, heads * head_dim, head_dim, 1}};
}

// Four sequences, one new token each, 32 query heads over 8 kv heads, a paged cache of 100 pages of 64 keys
// with 16 pages per sequence, and one appended token.
flashgen_kvcache_args valid_args() {
  flashgen_kvcache_args args{};
  args.size = sizeof(args);
  args.q = bshd(fake_pointer(1), 4, 1, 32, 128);
  args.k_cache = bshd(fake_pointer(2), 100, 64, 8, 128);
  args.v_cache = bshd(fake_pointer(3), 100, 64, 8, 128);
  args.k_new = bshd(fake_pointer(4), 4, 1, 8, 128);
  args.v_new = bshd(fake_pointer(5), 4, 1, 8, 128);
  args.out = bshd(fake_pointer(6), 4, 1, 32, 128);
  args.lse = static_cast<float*>(fake_pointer(7));
  args.cache_seqlens = static_cast<const int32_t*>(fake_pointer(8));
  args.block_table = static_cast<const int32_t*>(fake_pointer(9));
  args.max_pages = 16;
  args.options.mask = FLASHGEN_MASK_CAUSAL;
  return args;
}

// base (valid_args() by default) edited is refused with status and an error holding message.
void check_rejected(const std::function<void(flashgen_kvcache_args&)>& edit, int status, const std::string& message,
                    const flashgen_kvcache_args& base = valid_args()) {
  flashgen_kvcache_args args = base;
  edit(args);
  INFO("expected: " << message);
  CHECK(flashgen_attention_kvcache(&args, nullptr) == status);
  const std::string error = flashgen_last_error();
  INFO("got: " << error);
  CHECK(error.find(message) != std::string::npos);
}

}  // namespace

TEST_CASE("KV-cache attention rejects each bad argument with a message naming it", "[c_api][kvcache]") {
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT;
  CHECK(flashgen_attention_kvcache(nullptr, nullptr) == kInvalid);
  CHECK(std::string(flashgen_last_error()).find("args: null pointer") != std::string::npos);
  check_rejected([](auto& a) { a.size = 0; }, kInvalid, "args.size is 0; this flashgen's argument struct");
  check_rejected([](auto& a) { a.q.data = nullptr; }, kInvalid, "q.data: null pointer");
  check_rejected([](auto& a) { a.options.softcap = -1.f; }, kInvalid, "opts.softcap must be 0 (none) or a positive");
  static const float slopes[8] = {};
  check_rejected([](auto& a) { a.options.alibi_slopes = slopes, a.options.alibi_batch_stride = 3; }, kInvalid,
                 "opts.alibi_batch_stride must be 0");
  check_rejected([](auto& a) { a.options.mask = FLASHGEN_MASK_SLIDING_WINDOW, a.options.window_left = -3; }, kInvalid,
                 "opts.window_left must be >= 0");
  check_rejected([](auto& a) { a.options.mask = FLASHGEN_MASK_SLIDING_WINDOW, a.options.window_right = -2; }, kInvalid,
                 "opts.window_right must be >= 0");
  check_rejected([](auto& a) { a.v_cache.dtype = FLASHGEN_FLOAT16; }, kInvalid, "v_cache.dtype is fp16 but q.dtype");
  check_rejected([](auto& a) { a.k_cache.shape[3] = 64; }, kInvalid, "k_cache.shape[3] (head_dim) is 64");
  check_rejected([](auto& a) { a.v_cache.shape[3] = 64; }, kInvalid,
                 "v_cache.shape[3] (head_dim) is 64 but k_cache.shape[3] (head_dim) is 128: values of a head dim of "
                 "their own are read as the first columns of the keys (a latent cache, as MLA's)");
  check_rejected([](auto& a) { a.v_cache.shape[0] = 99; }, kInvalid, "v_cache.shape[0]");
  check_rejected([](auto& a) { a.q.shape[2] = 12; a.out.shape[2] = 12; }, kInvalid, "multiple");
  check_rejected([](auto& a) { a.out.shape[1] = 2; }, kInvalid, "out.shape[1]");
  check_rejected([](auto& a) { a.k_cache.shape[1] = 40; a.v_cache.shape[1] = 40; }, kInvalid,
                 "k_cache.shape[1] (page_size) must be a multiple of 16");
  check_rejected([](auto& a) { a.max_pages = 0; }, kInvalid, "max_pages must be in [1, 2^30]");
  check_rejected([](auto& a) { a.block_table = reinterpret_cast<const int32_t*>(0x100002); }, kInvalid,
                 "block_table: pointer must be 4-byte aligned");
  check_rejected([](auto& a) { a.block_table = nullptr; }, kInvalid,
                 "k_cache.shape[0] (batch) is 100 but q.shape[0] (batch) is 4");
  check_rejected([](auto& a) { a.v_new.data = nullptr; }, kInvalid, "v_new.data: null pointer, but k_new is given");
  check_rejected([](auto& a) { a.k_new.data = nullptr; }, kInvalid, "k_new.data: null pointer, but v_new is given");
  check_rejected([](auto& a) { a.k_new.shape[2] = 4; a.v_new.shape[2] = 4; }, kInvalid, "k_new.shape[2]");
  check_rejected([](auto& a) { a.v_new.shape[1] = 2; }, kInvalid, "v_new.shape[1]");
  check_rejected([](auto& a) { a.cache_seqlens = nullptr; }, kInvalid, "cache_seqlens: null pointer, but k_new");
  check_rejected([](auto& a) { a.k_new.shape[1] = a.v_new.shape[1] = 1025; }, kInvalid,
                 "k_new.shape[1] (seqlen_new) is 1025, more than a sequence's cache holds (1024 keys)");
  check_rejected([](auto& a) { a.num_splits = -1; }, kInvalid, "num_splits must be in [0, 128]");
  check_rejected([](auto& a) { a.num_splits = 129; }, kInvalid, "num_splits must be in [0, 128]");
  check_rejected([](auto& a) { a.workspace = reinterpret_cast<void*>(0x100010); }, kInvalid,
                 "workspace: pointer must be 256-byte aligned");
  check_rejected([](auto& a) { a.options.mask = static_cast<flashgen_mask>(7); }, kInvalid, "mask");
  check_rejected([](auto& a) { a.q.stride[2] = 12; }, kInvalid, "q.stride[2]");
  check_rejected([](auto& a) { a.k_cache.stride[2] = 4; }, kInvalid, "k_cache.stride[2]");
  size_t bytes = 0;
  flashgen_kvcache_args args = valid_args();
  args.max_pages = -3;
  CHECK(flashgen_attention_kvcache_workspace_size(&args, nullptr, &bytes) == kInvalid);
  args = valid_args();
  CHECK(flashgen_attention_kvcache_workspace_size(&args, nullptr, nullptr) == kInvalid);
  CHECK(std::string(flashgen_last_error()).find("workspace_bytes: null pointer") != std::string::npos);
}

TEST_CASE("a KV-cache call binds its cache, pages and new tokens as the kernels read them", "[kvcache]") {
  const flashgen::KvCacheCall call = flashgen::make_kvcache_call(valid_args());
  const flashgen::AttnDecodeParams& p = call.params;
  CHECK(call.problem.kv_cache);
  CHECK(call.problem.paged);
  CHECK(call.problem.shape.seqlen_k == 16 * 64);
  CHECK(p.capacity == 1024);
  CHECK(p.page_size == 64);
  CHECK(p.num_pages == 100);
  CHECK(p.block_table_stride == 16);
  CHECK(p.group_size == 4);
  CHECK(p.seqlen_new == 1);
  CHECK(p.k_batch_stride == 64 * 8 * 128);
  CHECK(p.causal_bottom_right == 1);
  const flashgen::DecodeConfig module;  // head_dim 128, as the call's
  CHECK(flashgen::kvcache_workspace_bytes(call, module, 1) == 0);
  // 3 ranges x 4 sequences x 32 heads x 1 token: 384 rows of 128 floats and 384 LSEs, each part 256-aligned.
  CHECK(flashgen::kvcache_workspace_bytes(call, module, 3) == 384 * 128 * 4 + 1536);

  flashgen_kvcache_args contiguous = valid_args();
  contiguous.block_table = nullptr;
  contiguous.k_cache = contiguous.v_cache = bshd(fake_pointer(2), 4, 300, 8, 128);
  contiguous.k_new.data = contiguous.v_new.data = nullptr;
  contiguous.cache_seqlens = nullptr;
  const flashgen::KvCacheCall dense = flashgen::make_kvcache_call(contiguous);
  CHECK_FALSE(dense.problem.paged);
  CHECK(dense.params.capacity == 300);
  CHECK(dense.params.seqlen_new == 0);
  CHECK(dense.params.k_new == nullptr);
  CHECK(dense.params.variant.window_left == 0);
  CHECK(dense.params.variant.window_right == 0);
}

TEST_CASE("a KV-cache call takes a soft cap and ALiBi into its module and its problem class",
          "[kvcache][softcap][alibi]") {
  flashgen_kvcache_args args = valid_args();
  const flashgen::KvCacheCall plain = flashgen::make_kvcache_call(args);
  static const float slopes[8] = {};
  args.options.softcap = 30.f;
  args.options.alibi_slopes = slopes;
  const flashgen::KvCacheCall modified = flashgen::make_kvcache_call(args);
  CHECK(modified.problem.score_mods() == flashgen::ScoreMods{true, true});
  CHECK(modified.params.variant.softcap_in == modified.params.variant.scale / 30.f);
  CHECK(modified.params.variant.softcap_out == 30.f / modified.params.variant.scale);
  CHECK(modified.params.variant.alibi_slopes == slopes);
  CHECK(modified.params.variant.inv_scale == 1.f / modified.params.variant.scale);
  CHECK(plain.params.variant.alibi_slopes == nullptr);
  CHECK(plain.params.variant.softcap_in == 0.f);
  // Keyed apart from the plain problem, and served by modules that compile the modifiers in.
  CHECK(flashgen::problem_key(modified.problem).class_id() != flashgen::problem_key(plain.problem).class_id());
  const flashgen::DecodeChoice choice = flashgen::heuristic_decode_choice(modified.problem, 90, 132);
  CHECK(choice.config.mods == flashgen::ScoreMods{true, true});
  CHECK(choice.config.name().find("_softcap_alibi") != std::string::npos);
  CHECK(flashgen::DecodeConfig::from_name(choice.config.name()) == choice.config);
  const nlohmann::json j = choice.config;
  CHECK(j.get<flashgen::DecodeConfig>() == choice.config);
  flashgen::DecodeConfig plain_module = choice.config;
  plain_module.mods = {};
  CHECK_THROWS_WITH(flashgen::check_requested_config(plain_module, modified.problem, 90),
                    Catch::Matchers::Contains("does not match the problem"));
}

TEST_CASE("a KV-cache call takes a sliding window about each sequence's last key", "[kvcache][window]") {
  auto call_with = [](int left, int right, flashgen_mask mask = FLASHGEN_MASK_SLIDING_WINDOW) {
    flashgen_kvcache_args args = valid_args();
    args.options.mask = mask, args.options.window_left = left, args.options.window_right = right;
    return flashgen::make_kvcache_call(args);
  };
  // Aligned bottom-right, as the causal mask: the kernels read causal_bottom_right and both sides.
  const flashgen::KvCacheCall window = call_with(256, 0);
  CHECK(window.problem.mask_kind() == flashgen::MaskKind::kWindow);
  CHECK(window.problem.kv_cache);
  CHECK(window.params.causal_bottom_right == 1);
  CHECK(window.params.variant.window_left == 256);
  CHECK(window.params.variant.window_right == 0);
  // An unbounded side, or one past every key, is the least that reaches every key from every new row: capacity
  // (1024) on the left, seqlen_q (1) on the right.
  const flashgen::KvCacheCall open_right = call_with(16, -1);
  CHECK(open_right.params.variant.window_left == 16);
  CHECK(open_right.params.variant.window_right == 1);
  CHECK(call_with(1 << 30, 3).params.variant.window_left == 1024);
  // Normalized as dense calls are: (-1, 0) runs the bottom-right causal mask, (-1, -1) no mask.
  const flashgen::KvCacheCall causal = call_with(-1, 0);
  CHECK(causal.problem.mask_kind() == flashgen::MaskKind::kCausal);
  CHECK(causal.params.causal_bottom_right == 1);
  CHECK(causal.params.variant.window_left == 0);
  const flashgen::KvCacheCall none = call_with(-1, -1);
  CHECK(none.problem.mask_kind() == flashgen::MaskKind::kNone);
  CHECK(none.params.causal_bottom_right == 1);  // unread without a mask
  // The window fields are read under the window mask only.
  CHECK(call_with(-7, 5, FLASHGEN_MASK_CAUSAL).params.variant.window_left == 0);
  // A config must be of the window: the causal module is refused for it, and the window's for the causal mask.
  flashgen::DecodeConfig config;
  config.dtype = flashgen::DType::kBFloat16;
  config.paged = true;
  config.mask = flashgen::MaskKind::kWindow;
  CHECK_NOTHROW(flashgen::check_requested_config(config, window.problem, 90));
  CHECK_THROWS_WITH(flashgen::check_requested_config(config, causal.problem, 90),
                    Catch::Matchers::Contains("does not match the problem"));

  // 257 keys end at each sequence's last: at most 5 of the 16 blocks of 64 hold them, so at most 5 ranges,
  // and the workspace is sized for those: 5 ranges x 4 sequences x 32 heads x 1 token, 640 rows of 128 floats
  // and 640 LSEs (each part 256-aligned already).
  CHECK(flashgen::clamp_splits(window, config, 64) == 5);
  CHECK(flashgen::clamp_splits(causal, config, 64) == 16);
  CHECK(flashgen::kvcache_workspace_bytes(window, config, flashgen::clamp_splits(window, config, 64)) ==
        640 * 128 * 4 + 640 * 4);
}

TEST_CASE("a KV-cache call takes a user variant, its buffers and scalars bound as the kernels read them",
          "[kvcache][user_variant]") {
  // A tree mask of speculative decoding: each new token sees the cache before `prefix` and the new tokens its row of
  // the tree's bits allows.
  const flashgen_variant_arg buffers[] = {{"tree", FLASHGEN_ARG_UINT8}};
  const flashgen_variant_arg scalars[] = {{"prefix", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "return kv_idx < prefix || tree[q_idx * 8 + kv_idx - prefix] != 0;";
  desc.buffers = buffers, desc.num_buffers = 1;
  desc.scalars = scalars, desc.num_scalars = 1;
  flashgen_variant* variant = nullptr;
  REQUIRE(flashgen_variant_create(&desc, &variant) == FLASHGEN_SUCCESS);
  flashgen_kvcache_args args = valid_args();
  args.options.variant = variant;
  CHECK(flashgen_attention_kvcache(&args, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(flashgen_last_error()), Catch::Matchers::Contains("opts.variant_buffers is NULL"));
  const void* pointers[] = {fake_pointer(10)};
  const int32_t prefix = 5;
  args.options.variant_buffers = pointers, args.options.variant_scalars = &prefix;
  const flashgen::KvCacheCall call = flashgen::make_kvcache_call(args);
  REQUIRE(call.problem.user != nullptr);
  CHECK(call.problem.user->tag == flashgen_variant_tag(variant));
  CHECK(call.params.variant.user_buffers[0] == pointers[0]);
  CHECK(call.params.variant.user_buffers[1] == nullptr);
  CHECK(call.params.variant.user_scalars[0] == 5u);
  // Decoding keeps no block classes, so a block mask is refused by name.
  flashgen_block_mask* kept = nullptr;
  REQUIRE(flashgen_block_mask_create(&kept) == FLASHGEN_SUCCESS);
  args.options.block_mask = kept;
  CHECK(flashgen_attention_kvcache(&args, nullptr) == FLASHGEN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(flashgen_last_error()),
             Catch::Matchers::Contains("opts.block_mask: KV-cache calls keep no block classes"));
  flashgen_block_mask_destroy(kept);
  args.options.block_mask = nullptr;
  // The base class's problem key: a user variant runs the tiles chosen (and tuned) for the mask under it.
  flashgen_kvcache_args plain = valid_args();
  CHECK(flashgen::problem_key(call.problem) == flashgen::problem_key(flashgen::make_kvcache_call(plain).problem));
  flashgen_variant_destroy(variant);
}

// One sequence's MLA decode: 128 query heads over one latent kv head of 576 columns, v_cache its first 512.
TEST_CASE("a latent cache's call reads the values as the keys' first columns and refuses every other layout",
          "[c_api][kvcache][latent]") {
  auto latent_args = [] {
    flashgen_kvcache_args args = valid_args();
    args.q = bshd(fake_pointer(1), 4, 1, 128, 576);
    args.k_cache = bshd(fake_pointer(2), 100, 64, 1, 576);
    args.v_cache = args.k_cache;
    args.v_cache.shape[3] = 512;
    args.k_new = bshd(fake_pointer(4), 4, 1, 1, 576);
    args.v_new = flashgen_tensor{};
    args.out = bshd(fake_pointer(6), 4, 1, 128, 512);
    return args;
  };
  const flashgen::KvCacheCall call = flashgen::make_kvcache_call(latent_args());
  CHECK(call.problem.head_dim() == 576);
  CHECK(call.problem.value_dim() == 512);
  CHECK(call.params.v_cache == call.params.k_cache);
  CHECK(call.params.v_new == nullptr);
  CHECK(flashgen::heuristic_decode_choice(call.problem, 90, 132).config.latent);
  // Workspace rows of the values' 512 floats: 3 ranges x 4 sequences x 128 heads.
  const flashgen::DecodeConfig module = flashgen::heuristic_decode_choice(call.problem, 90, 132).config;
  CHECK(flashgen::kvcache_workspace_bytes(call, module, 3) == 1536 * 512 * 4 + 1536 * 4);

  auto rejected = [&](const std::function<void(flashgen_kvcache_args&)>& edit, int status, const std::string& message) {
    check_rejected(edit, status, message, latent_args());
  };
  const int kInvalid = FLASHGEN_ERROR_INVALID_ARGUMENT, kUnsupported = FLASHGEN_ERROR_UNSUPPORTED;
  rejected([](auto& a) { a.v_cache.data = fake_pointer(3); }, kInvalid,
           "v_cache.shape[3] (head_dim) is 512 but k_cache.shape[3] (head_dim) is 576: values of a head dim of their "
           "own are read as the first columns of the keys");
  rejected([](auto& a) { a.v_cache.stride[1] = 512; }, kInvalid, "v_cache must be a view of k_cache's first 512");
  rejected([](auto& a) { a.v_cache.shape[3] = a.out.shape[3] = 544; }, kUnsupported,
           "v_cache.shape[3] (head_dim) = 544 is unsupported for a latent cache");
  rejected([](auto& a) { a.v_cache.shape[3] = a.out.shape[3] = 576; a.k_cache.shape[3] = 640; }, kInvalid,
           "k_cache.shape[3]");
  rejected(
      [](auto& a) {
        a.q = bshd(fake_pointer(1), 4, 1, 128, 600);
        a.k_cache = a.v_cache = bshd(fake_pointer(2), 100, 64, 1, 600);
        a.v_cache.shape[3] = 512;
        a.k_new = flashgen_tensor{};
      },
      kUnsupported,
           "k_cache.shape[3] (head_dim) = 600 is unsupported for a latent cache");
  rejected([](auto& a) { a.out.shape[3] = 576; }, kInvalid, "out.shape[3] (head_dim) is 576 but v_cache.shape[3]");
  rejected([](auto& a) { a.v_new = a.k_new; }, kInvalid, "v_new: a latent cache's new values are k_new's first 512");
  rejected([](auto& a) { a.k_cache.shape[1] = a.v_cache.shape[1] = 40; }, kInvalid,
           "k_cache.shape[1] (page_size) must be a multiple of 16");
}
