// [gpu] User-defined variants (flashgen_variant_create, options.variant) on dense batches: out, lse and the three
// gradients against the float64 reference with the same functions written in C++, through the C ABI (the run-time
// choice: the sm90 families on sm_90) and on the sm80 families' built-in choices, both dQ strategies. A document
// mask over the causal mask (document ids in a buffer), a prefix-LM mask whose some rows see no key (a scalar), a
// mask whose visible blocks do not grow with the row (the backward's block classes widen them to bands), a
// relative-position bias table under a window (score_bias), and a soft cap written as a score function with its
// derivative; odd lengths, sq != sk, GQA; a user mask on inputs TMA cannot describe (the sm80 family's fallback with
// the functions). And a user variant tuned on first use, stored under its own key.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/from_c.hpp"
#include "catch.hpp"
#include "dispatch/dispatch.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "launch/attention_backward.hpp"
#include "launch/user_block_classes.hpp"
#include "support/dense_variant_problem.hpp"
#include "support/first_use_scope.hpp"
#include "support/raw_sqlite.hpp"
#include "support/temp_dir.hpp"
#include "tuner/choice.hpp"
#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"

namespace {

struct Handle {
  flashgen_variant* variant = nullptr;
  explicit Handle(const flashgen_variant_desc& desc) {
    const int status = flashgen_variant_create(&desc, &variant);
    INFO(flashgen_last_error());
    REQUIRE(status == FLASHGEN_SUCCESS);
  }
  ~Handle() { flashgen_variant_destroy(variant); }
};

// Runs problem p through the C ABI's choice, then on the sm80 families' built-in choices with its variant (a user
// mask's forward with its block classes on both families).
void run_everywhere(flashgen::test::DenseVariantProblem& p, const flashgen::ScopedContext& scope) {
  const int arch = flashgen::device_sm(scope.device());
  p.run_choice();
  const flashgen::ForwardCall fwd = p.forward_call();
  REQUIRE(fwd.problem.user);
  flashgen::KernelConfig sm80 = flashgen::heuristic_choice(fwd.problem.dtype, fwd.problem.head_dim(),
                                                           fwd.problem.mask_kind(), arch, true, false,
                                                           fwd.problem.score_mods())
                                    .config;
  sm80.user = fwd.problem.user;
  p.run_forward(sm80);
  for (bool deterministic : {false, true}) {
    const flashgen::BackwardCall bwd = p.backward_call(deterministic);
    flashgen::BwdConfig config =
        flashgen::heuristic_backward_choice(bwd.problem.dtype, bwd.problem.head_dim(), bwd.problem.mask_kind(),
                                            deterministic, arch, true, false, bwd.problem.score_mods())
            .config;
    config.user = bwd.problem.user;
    p.run_backward(config);
  }
}

}  // namespace

TEST_CASE("a user's document mask matches the float64 reference, forward and backward", "[gpu][user_variant]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  // Documents of random lengths per batch entry (long enough that whole key blocks lie outside a query block's
  // documents: the forward's block classes skip them), their ids in one int32 buffer [batch, seqlen].
  const flashgen::AttentionShape shape{2, 701, 701, 4, 2, 128};
  std::mt19937 rng(7);
  std::vector<int32_t> doc(size_t(shape.batch * shape.seqlen_q));
  for (int64_t b = 0; b < shape.batch; ++b) {
    int32_t id = 0;
    for (int64_t i = 0; i < shape.seqlen_q; ++i) {
      if (i > 0 && rng() % 150 == 0) ++id;
      doc[size_t(b * shape.seqlen_q + i)] = id;
    }
  }
  flashgen::DeviceBuffer ddoc(doc.size() * sizeof(int32_t));
  ddoc.upload(doc);
  const flashgen_variant_arg buffers[] = {{"doc", FLASHGEN_ARG_INT32}};
  const flashgen_variant_arg scalars[] = {{"n", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "return doc[batch * n + q_idx] == doc[batch * n + kv_idx];";
  desc.buffers = buffers, desc.num_buffers = 1;
  desc.scalars = scalars, desc.num_scalars = 1;
  desc.mask_same_for_heads = 1;
  const Handle handle(desc);
  const void* pointers[] = {ddoc.data()};
  const int32_t n = int32_t(shape.seqlen_q);
  flashgen_attention_options opts{};
  opts.mask = FLASHGEN_MASK_CAUSAL;
  opts.variant = handle.variant, opts.variant_buffers = pointers, opts.variant_scalars = &n;
  flashgen::test::DenseVariantProblem p(
      "bf16 d128 causal documents, GQA 2", FLASHGEN_BFLOAT16, shape, opts, 0xd0c, {}, 0, {},
      [&](flashgen::ReferenceVariant& v) {
        v.user_mask = [&](int64_t b, int64_t, int64_t i, int64_t j) {
          return doc[size_t(b * shape.seqlen_q + i)] == doc[size_t(b * shape.seqlen_q + j)];
        };
      });
  run_everywhere(p, scope);
  // Kept across calls: the first call of each pass and strategy computes its classes into the block mask, the
  // second round reuses them (three kept, still three after it).
  flashgen_block_mask* kept = nullptr;
  REQUIRE(flashgen_block_mask_create(&kept) == FLASHGEN_SUCCESS);
  p.opts.block_mask = kept;
  p.run_choice();
  CHECK(kept->classes.kept.size() == 3);
  p.run_choice();
  CHECK(kept->classes.kept.size() == 3);
  flashgen_block_mask_destroy(kept);
  // The same problem class without it again: the backward's workspace holds the classes once more (its own plan).
  p.opts.block_mask = nullptr;
  p.run_choice();
}

TEST_CASE("a user's prefix-LM mask with rows that see no key matches the float64 reference", "[gpu][user_variant]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const flashgen::AttentionShape shape{1, 200, 333, 2, 1, 64};
  const flashgen_variant_arg scalars[] = {{"prefix", FLASHGEN_ARG_INT32}, {"offset", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "if (q_idx % 7 == 3) return false;  // rows that see nothing\n"
                  "return kv_idx < prefix || kv_idx <= q_idx + offset;";
  desc.scalars = scalars, desc.num_scalars = 2;
  const Handle handle(desc);
  const int32_t values[] = {70, int32_t(shape.seqlen_k - shape.seqlen_q)};
  flashgen_attention_options opts{};
  opts.mask = FLASHGEN_MASK_NONE;
  opts.variant = handle.variant, opts.variant_scalars = values;
  flashgen::test::DenseVariantProblem p(
      "fp16 d64 prefix-LM, MQA, sq < sk", FLASHGEN_FLOAT16, shape, opts, 0x9f1, {}, 0, {},
      [&](flashgen::ReferenceVariant& v) {
        v.user_mask = [&](int64_t, int64_t, int64_t i, int64_t j) {
          return i % 7 != 3 && (j < values[0] || j <= i + values[1]);
        };
      });
  run_everywhere(p, scope);
}

TEST_CASE("a user variant on inputs TMA cannot describe runs on the sm80 family with its functions, forward and "
          "backward", "[gpu][user_variant][sm90]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  FLASHGEN_REQUIRE_SM90(scope);
  const flashgen::AttentionShape shape{2, 190, 257, 4, 2, 128};
  const flashgen_variant_arg scalars[] = {{"stride", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "return (q_idx / stride) % 2 == 0 || kv_idx % 3 != 0;";
  desc.scalars = scalars, desc.num_scalars = 1;
  const Handle handle(desc);
  const int32_t stride = 16;
  flashgen_attention_options opts{};
  opts.mask = FLASHGEN_MASK_CAUSAL;
  opts.variant = handle.variant, opts.variant_scalars = &stride;
  flashgen::test::DenseVariantProblem p(
      "bf16 d128 causal, every third key hidden from alternate row bands, q shared by the batch", FLASHGEN_BFLOAT16,
      shape, opts, 0x7a1, {}, 0, {}, [&](flashgen::ReferenceVariant& v) {
        v.user_mask = [&](int64_t, int64_t, int64_t i, int64_t j) { return (i / stride) % 2 == 0 || j % 3 != 0; };
      });
  p.share_q_across_batch();
  const flashgen::ForwardLaunch fwd = flashgen::plan_forward(p.forward_call(), nullptr).launch;
  INFO(fwd.config.name() << ": " << fwd.reason);
  CHECK(fwd.config.family() == flashgen::KernelFamily::kSm80);
  CHECK(fwd.config.user != nullptr);
  CHECK(fwd.reason.find("TMA cannot describe q") != std::string::npos);
  for (bool deterministic : {false, true}) {
    const flashgen::BackwardLaunch bwd = flashgen::plan_backward(p.backward_call(deterministic), nullptr).launch;
    INFO(bwd.config.name() << ": " << bwd.reason);
    CHECK(bwd.config.family() == flashgen::KernelFamily::kSm80);
    CHECK(bwd.config.user != nullptr);
    CHECK(bwd.reason.find("TMA cannot describe q") != std::string::npos);
  }
  p.run_choice();  // out, lse and the gradients against float64, both dQ strategies
}

// The backward's block classes widen each query block's blocks to a band whose ends grow with the row: a mask whose
// early rows see late keys and late rows early ones (per head, the boundary differing between the two query heads of
// a kv head, whose classes are one), with a run of rows that see no key, must still give the right gradients, with
// the dkdv kernels' walks and the dQ adds' counts naming the same tiles under both strategies.
TEST_CASE("a user's mask whose visible blocks do not grow with the row matches the float64 reference",
          "[gpu][user_variant]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  const flashgen::AttentionShape shape{2, 500, 640, 4, 2, 64};
  const flashgen_variant_arg scalars[] = {{"sq", FLASHGEN_ARG_INT32}, {"sk", FLASHGEN_ARG_INT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "if (q_idx / 128 == 2) return false;  // query rows 256 .. 383 see no key\n"
                  "const bool early_row = 2 * q_idx < sq;\n"
                  "const bool early_key = (head % 2 == 0 ? 2 : 3) * kv_idx < sk;\n"
                  "return early_row != early_key;";
  desc.scalars = scalars, desc.num_scalars = 2;
  const Handle handle(desc);
  const int32_t values[] = {int32_t(shape.seqlen_q), int32_t(shape.seqlen_k)};
  flashgen_attention_options opts{};
  opts.mask = FLASHGEN_MASK_NONE;
  opts.variant = handle.variant, opts.variant_scalars = values;
  flashgen::test::DenseVariantProblem p(
      "fp16 d64 halves swapped per head, GQA 2", FLASHGEN_FLOAT16, shape, opts, 0x5a9, {}, 0, {},
      [&](flashgen::ReferenceVariant& v) {
        v.user_mask = [&](int64_t, int64_t h, int64_t i, int64_t j) {
          if (i / 128 == 2) return false;
          return (2 * i < values[0]) != ((h % 2 == 0 ? 2 : 3) * j < values[1]);
        };
      });
  run_everywhere(p, scope);
}

TEST_CASE("a user's bias table and score function match the float64 reference", "[gpu][user_variant]") {
  FLASHGEN_REQUIRE_GPU();
  flashgen::ScopedContext scope;
  SECTION("a relative-position bias per head under a window (score_bias)") {
    const flashgen::AttentionShape shape{2, 257, 190, 2, 2, 96};
    const int64_t span = 2 * 512 + 1;  // distances -512 .. 512
    std::vector<float> table(size_t(shape.heads_q * span));
    for (size_t i = 0; i < table.size(); ++i) table[i] = 0.6f * std::sin(0.37f * float(i));
    flashgen::DeviceBuffer dtable(table.size() * sizeof(float));
    dtable.upload(table);
    const flashgen_variant_arg buffers[] = {{"rel", FLASHGEN_ARG_FLOAT32}};
    flashgen_variant_desc desc{};
    desc.size = sizeof desc;
    desc.helpers = "constexpr int kMaxDistance = 512;";
    desc.score_bias = "return rel[head * (2 * kMaxDistance + 1) + kv_idx - q_idx + kMaxDistance];";
    desc.buffers = buffers, desc.num_buffers = 1;
    const Handle handle(desc);
    const void* pointers[] = {dtable.data()};
    flashgen_attention_options opts{};
    opts.mask = FLASHGEN_MASK_SLIDING_WINDOW;
    opts.window_left = 50, opts.window_right = 9;
    opts.variant = handle.variant, opts.variant_buffers = pointers;
    flashgen::test::DenseVariantProblem p(
        "fp16 d96 relative bias, window (50, 9), sq > sk", FLASHGEN_FLOAT16, shape, opts, 0xb1a5, {}, 0, {},
        [&](flashgen::ReferenceVariant& v) {
          v.user_score = [&](double s, int64_t, int64_t h, int64_t i, int64_t j) {
            return s + double(table[size_t(h * span + j - i + 512)]);
          };
        });
    run_everywhere(p, scope);
  }
  SECTION("a soft cap written as a score function, with its derivative") {
    const flashgen::AttentionShape shape{1, 150, 150, 4, 2, 128};
    const flashgen_variant_arg scalars[] = {{"cap", FLASHGEN_ARG_FLOAT32}};
    flashgen_variant_desc desc{};
    desc.size = sizeof desc;
    desc.score_mod = "return cap * tanhf(score / cap);";
    desc.score_grad = "const float t = modified / cap;\nreturn 1.f - t * t;";
    desc.scalars = scalars, desc.num_scalars = 1;
    const Handle handle(desc);
    const float cap = 2.f;
    flashgen_attention_options opts{};
    opts.mask = FLASHGEN_MASK_CAUSAL_TOP_LEFT;
    opts.variant = handle.variant, opts.variant_scalars = &cap;
    flashgen::test::DenseVariantProblem p(
        "bf16 d128 top-left causal, a user's cap 2", FLASHGEN_BFLOAT16, shape, opts, 0xca9, {}, 0, {},
        [&](flashgen::ReferenceVariant& v) {
          v.user_score = [&](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
          v.user_score_grad = [&](double m, int64_t, int64_t, int64_t, int64_t) { return 1 - (m / cap) * (m / cap); };
        });
    run_everywhere(p, scope);
  }
}

// Tune-on-first-use of a user variant: each pass's first call sweeps its base class's tiles with the variant
// compiled in, checked against the variant's functions evaluated on the GPU with the call's scalars, stores the
// rows under the variant's tag and runs the winner (checked here against the C++ reference of the functions).
TEST_CASE("a user variant is tuned on first use under its own key and runs its winner, forward and backward",
          "[gpu][user_variant][first_use]") {
  FLASHGEN_REQUIRE_GPU();
  const flashgen::testing::TempDir dir("flashgen-user-first-use");
  const std::string db = (dir.path() / "tuning.sqlite").string();
  flashgen::ScopedContext scope;
  const flashgen::AttentionShape shape{1, 555, 555, 4, 2, 64};  // a bucket no other case tunes
  const flashgen_variant_arg scalars[] = {{"prefix", FLASHGEN_ARG_INT32}, {"cap", FLASHGEN_ARG_FLOAT32}};
  flashgen_variant_desc desc{};
  desc.size = sizeof desc;
  desc.mask_mod = "return kv_idx < prefix || kv_idx <= q_idx;";
  desc.score_mod = "return cap * tanhf(score / cap);";
  desc.score_grad = "const float t = modified / cap;\nreturn 1.f - t * t;";
  desc.scalars = scalars, desc.num_scalars = 2;
  const Handle handle(desc);
  const int32_t prefix = 100;
  const float cap = 3.f;
  uint32_t values[2];
  std::memcpy(&values[0], &prefix, 4);
  std::memcpy(&values[1], &cap, 4);
  flashgen_attention_options opts{};
  opts.mask = FLASHGEN_MASK_NONE;
  opts.variant = handle.variant, opts.variant_scalars = values;
  flashgen::test::DenseVariantProblem p(
      "bf16 d64 prefix-LM with a user's cap 3", FLASHGEN_BFLOAT16, shape, opts, 0x7e5, {}, 0, {},
      [&](flashgen::ReferenceVariant& v) {
        v.user_mask = [&](int64_t, int64_t, int64_t i, int64_t j) { return j < prefix || j <= i; };
        v.user_score = [&](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
        v.user_score_grad = [&](double m, int64_t, int64_t, int64_t, int64_t) { return 1 - (m / cap) * (m / cap); };
      });
  {
    const flashgen::testing::FirstUseScope first_use(db);
    // The base class's bucket tuned first, by a call without the variant: the variant is still tuned on its own.
    flashgen_attention_options plain = opts;
    plain.variant = nullptr, plain.variant_scalars = nullptr;
    REQUIRE(flashgen_attention_forward(&p.tq, &p.tk, &p.tv, &p.tout, static_cast<float*>(p.dlse.data()), &plain,
                                       nullptr) == FLASHGEN_SUCCESS);
    p.run_choice();  // the forward, then the backward of each dQ strategy: each tuned on its first call
    const flashgen::ForwardLaunch launch = flashgen::attention_forward(p.forward_call(), nullptr);
    INFO(launch.reason);
    CHECK(launch.reason.rfind("tuned on first use", 0) == 0);
    CHECK(launch.reason.find("with the user variant " + std::string(flashgen_variant_tag(handle.variant))) !=
          std::string::npos);
    CHECK(launch.config.user == handle.variant->user);
  }
  const flashgen::TuningStore store(db, /*read_only=*/true);
  const flashgen::DeviceFingerprint device = flashgen::current_device_fingerprint(static_cast<int>(scope.device()));
  for (const flashgen::AttentionProblem& problem :
       {p.forward_call().problem, p.backward_call(false).problem, p.backward_call(true).problem}) {
    const flashgen::ProblemKey key = flashgen::problem_key(problem);
    INFO(key.id());
    CHECK(key.user_tag == flashgen_variant_tag(handle.variant));
    const auto stored = store.lookup_exact(device, key);
    REQUIRE(stored.has_value());
    const auto rows = store.candidates(device, key);
    CHECK(rows.size() >= 2);
    for (const flashgen::CandidateResult& row : rows) {
      INFO(flashgen::config_name(row.config) << ": " << row.detail);
      CHECK(row.status == flashgen::CandidateStatus::kOk);
    }
  }
  // The base class's forward rows are there too, apart; every row's name is a base class's config, no tag in it.
  CHECK(store.lookup_exact(device, flashgen::forward_problem_key(flashgen::DType::kBFloat16, 64, flashgen::MaskKind::kNone,
                                                                 2, 555, 555, 4)));
  flashgen::testing::RawSqlite raw(db);
  const std::vector<std::string> names = raw.column("SELECT config_name FROM candidates");
  CHECK(names.size() >= 8);
  for (const std::string& name : names) {
    INFO(name);
    CHECK(name.find("_u") == std::string::npos);
  }
}
