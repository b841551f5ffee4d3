// Tune-on-first-use: with the switch on, a forward call of a problem bucket the user's database lacks
// sweeps it, stores the winner and runs it; the memoized choice serves later calls.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"
#include "dispatch/dispatch.hpp"
#include "dispatch/select.hpp"
#include "flashgen/flashgen.h"
#include "gpu.hpp"
#include "launch/attention.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/device_buffer.hpp"
#include "support/attention_reference.hpp"
#include "support/check_reports.hpp"
#include "support/first_use_scope.hpp"
#include "support/temp_dir.hpp"
#include "tuner/heuristic.hpp"
#include "tuner/problem_key.hpp"
#include "tuner/store.hpp"

namespace {

// Tune-on-first-use with a database path whose folder would have to be made inside a regular file
// (".../not-a-directory/tuning.sqlite"), for as long as it lives.
class UnwritableTuningDb {
 public:
  UnwritableTuningDb() : blocker_(make_blocker(dir_)), scope_((blocker_ / "tuning.sqlite").string()) {}

 private:
  static std::filesystem::path make_blocker(const flashgen::testing::TempDir& dir) {
    const std::filesystem::path blocker = dir.path() / "not-a-directory";
    std::ofstream(blocker) << "x";
    return blocker;
  }
  flashgen::testing::TempDir dir_{"flashgen-first-use"};
  std::filesystem::path blocker_;
  flashgen::testing::FirstUseScope scope_;
};

}  // namespace

TEST_CASE("the tune-on-first-use switch", "[tuner][first_use]") {
  const bool before = flashgen::tune_on_first_use();
  flashgen::set_tune_on_first_use(true);
  CHECK(flashgen::tune_on_first_use());
  flashgen::set_tune_on_first_use(false);
  CHECK_FALSE(flashgen::tune_on_first_use());
  flashgen::set_tune_on_first_use(before);
}

TEST_CASE("tune-on-first-use sweeps a new problem, stores it and runs the winner", "[gpu][tuner][first_use]") {
  FLASHGEN_REQUIRE_GPU();
  const flashgen::testing::TempDir dir("flashgen-first-use");
  const std::string db = (dir.path() / "tuning.sqlite").string();
  const flashgen::testing::FirstUseScope first_use(db);

  flashgen::ScopedContext context;
  const flashgen::AttentionShape shape{1, 777, 777, 2, 1, 40};  // a bucket nothing else in the suite uses
  flashgen::test::Rng rng(4242);
  const auto q = flashgen::test::normal_values(rng, 777 * 2 * 40, FLASHGEN_FLOAT16);
  const auto k = flashgen::test::normal_values(rng, 777 * 40, FLASHGEN_FLOAT16);
  const auto v = flashgen::test::normal_values(rng, 777 * 40, FLASHGEN_FLOAT16);
  auto upload = [](const std::vector<double>& values, const flashgen::StridedView& view) {
    std::vector<uint16_t> bits(static_cast<size_t>(view.span()), flashgen::test::kPoison16);
    flashgen::test::store_values(values, view, 0, FLASHGEN_FLOAT16, bits);
    flashgen::DeviceBuffer buffer(bits.size() * 2);
    buffer.upload(bits);
    return buffer;
  };
  const auto qv = flashgen::StridedView::contiguous(1, 777, 2, 40);
  const auto kv = flashgen::StridedView::contiguous(1, 777, 1, 40);
  flashgen::DeviceBuffer qd = upload(q, qv), kd = upload(k, kv), vd = upload(v, kv);
  flashgen::DeviceBuffer out(static_cast<size_t>(qv.span()) * 2);
  flashgen::CallOptions opts;
  opts.mask = flashgen::Mask::kCausalTopLeft;
  const flashgen::TensorView tq = flashgen::bshd_view(qd.data(), flashgen::DType::kFloat16, 1, 777, 2, 40);
  const flashgen::TensorView tk = flashgen::bshd_view(kd.data(), flashgen::DType::kFloat16, 1, 777, 1, 40);
  const flashgen::TensorView tv = flashgen::bshd_view(vd.data(), flashgen::DType::kFloat16, 1, 777, 1, 40);
  const flashgen::TensorView to = flashgen::bshd_view(out.data(), flashgen::DType::kFloat16, 1, 777, 2, 40);

  for (int call = 0; call < 2; ++call) {
    out.fill_bytes(0xFF);
    const flashgen::ForwardLaunch launch = flashgen::attention_forward(tq, tk, tv, to, nullptr, opts, nullptr);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    INFO("call " << call << ": " << flashgen::config_name(launch.config) << ": " << launch.reason);
    CHECK(launch.reason.rfind("tuned on first use", 0) == 0);
    CHECK(launch.reason.find(db) != std::string::npos);
    const auto reference = flashgen::test::forward_reference(shape, q, k, v, 1.0 / std::sqrt(40.0),
                                                             FLASHGEN_MASK_CAUSAL_TOP_LEFT, FLASHGEN_FLOAT16);
    const auto check = flashgen::test::check_forward(reference, out.download_all<uint16_t>(), qv, nullptr);
    flashgen::test::check_reports(check);

    const flashgen::TuningStore store(db, /*read_only=*/true);
    const auto key = flashgen::forward_problem_key(flashgen::DType::kFloat16, 40, flashgen::MaskKind::kCausal, 2, 777,
                                                   777, 2);
    const auto stored = store.lookup_exact(flashgen::current_device_fingerprint(0), key);
    REQUIRE(stored.has_value());
    CHECK(stored->config == flashgen::TunedConfig(launch.config));
    CHECK(store.candidates(flashgen::current_device_fingerprint(0), key).size() >= 2);
  }
}

TEST_CASE("a first-use sweep that cannot store its winner says why, at every call", "[gpu][tuner][first_use]") {
  FLASHGEN_REQUIRE_GPU();
  const UnwritableTuningDb first_use;
  flashgen::ScopedContext context;
  const int64_t seqlen = 333, heads = 3, head_dim = 24;  // a bucket nothing else in the suite uses
  flashgen::DeviceBuffer q(size_t(seqlen * heads * head_dim) * 2), k(q.bytes()), v(q.bytes()), out(q.bytes());
  for (flashgen::DeviceBuffer* b : {&q, &k, &v}) b->fill_bytes(0x3C);  // fp16 ~1.06: values, not zeros
  const flashgen::CallOptions opts;  // no mask
  auto view = [&](flashgen::DeviceBuffer& b) {
    return flashgen::bshd_view(b.data(), flashgen::DType::kFloat16, 1, seqlen, heads, head_dim);
  };
  const flashgen::TensorView tq = view(q), tk = view(k), tv = view(v), to = view(out);
  for (int call = 0; call < 2; ++call) {  // the second call does not sweep again but keeps the cause
    const flashgen::ForwardLaunch launch = flashgen::attention_forward(tq, tk, tv, to, nullptr, opts, nullptr);
    FLASHGEN_CU_CHECK(cuCtxSynchronize());
    INFO("call " << call << ": " << launch.reason);
    CHECK(launch.source != flashgen::ChoiceSource::kTunedOnFirstUse);
    CHECK(launch.reason.find("; tuning on first use failed: ") != std::string::npos);
    CHECK(launch.reason.find("not-a-directory") != std::string::npos);
  }
}

TEST_CASE("an explicit tune that cannot store its winner fails with the cause's status", "[gpu][tuner][first_use]") {
  FLASHGEN_REQUIRE_GPU();
  const UnwritableTuningDb first_use;
  flashgen::ScopedContext context;
  flashgen_forward_problem problem{};
  problem.dtype = FLASHGEN_FLOAT16, problem.mask = FLASHGEN_MASK_NONE;
  problem.batch = 1, problem.seqlen_q = 3000, problem.seqlen_k = 3000;  // a bucket nothing else in the suite uses
  problem.heads_q = 5, problem.heads_kv = 5, problem.head_dim = 40;
  char json[1024];
  for (int call = 0; call < 2; ++call) {  // an explicit request tries again, and fails again the same way
    const int status = flashgen_tune_forward(&problem, nullptr, json, sizeof json, nullptr);
    const std::string message = flashgen_last_error();
    INFO("call " << call << ": " << message);
    CHECK(status == FLASHGEN_ERROR_INVALID_ARGUMENT);  // a path that cannot hold a database, not an internal error
    CHECK(message.find("not-a-directory") != std::string::npos);
  }
}

TEST_CASE("tune-on-first-use sweeps a bucket whose neighbour alone is stored", "[gpu][tuner][first_use]") {
  FLASHGEN_REQUIRE_GPU();
  const flashgen::testing::TempDir dir("flashgen-first-use");
  const std::string db = (dir.path() / "tuning.sqlite").string();
  flashgen::ScopedContext context;
  const int arch = flashgen::device_sm(context.device());
  const int64_t seqlen = 700, heads = 2, head_dim = 56;  // buckets nothing else in the suite uses
  {  // the neighbouring bucket (seqlen 2048) tuned, this one (1024) not
    flashgen::TuningStore store(db);
    const flashgen::KernelConfig config =
        flashgen::heuristic_forward_config(flashgen::DType::kFloat16, head_dim, flashgen::MaskKind::kNone, arch);
    const auto neighbour = flashgen::forward_problem_key(flashgen::DType::kFloat16, head_dim,
                                                         flashgen::MaskKind::kNone, 1, 2048, 2048, heads);
    flashgen::CandidateResult row;
    row.config = flashgen::TunedConfig(config);
    row.median_ms = 0.05;
    row.samples = 10;
    store.record(flashgen::current_device_fingerprint(context.device()), neighbour, {row}, row.config, 0.05);
  }
  const flashgen::testing::FirstUseScope first_use(db);
  flashgen::DeviceBuffer q(size_t(seqlen * heads * head_dim) * 2), k(q.bytes()), v(q.bytes()), out(q.bytes());
  for (flashgen::DeviceBuffer* b : {&q, &k, &v}) b->fill_bytes(0x3C);  // fp16 ~1.06: values, not zeros
  const flashgen::CallOptions opts;  // no mask
  auto view = [&](flashgen::DeviceBuffer& b) {
    return flashgen::bshd_view(b.data(), flashgen::DType::kFloat16, 1, seqlen, heads, head_dim);
  };
  const flashgen::TensorView tq = view(q), tk = view(k), tv = view(v), to = view(out);
  const flashgen::ForwardLaunch launch = flashgen::attention_forward(tq, tk, tv, to, nullptr, opts, nullptr);
  FLASHGEN_CU_CHECK(cuCtxSynchronize());
  INFO(launch.reason);
  CHECK(launch.source == flashgen::ChoiceSource::kTunedOnFirstUse);
  const flashgen::TuningStore store(db, /*read_only=*/true);
  CHECK(store.winners().size() == 2);
}
