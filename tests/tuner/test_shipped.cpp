// Shipped tuning defaults: read from export documents, matched by GPU kind (driver and toolchain
// versions may differ), exact bucket then nearest; placed after the user's database and before the
// heuristic in the run-time choice; and the embedded data itself is valid.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "dispatch/select.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/kernel_registry.hpp"
#include "support/parallel.hpp"
#include "support/resolved_choice.hpp"
#include "support/temp_dir.hpp"
#include "tuner/shipped.hpp"
#include "tuner/store.hpp"

using flashgen::testing::resolved;

using flashgen::DType;
using flashgen::MaskKind;

namespace {

flashgen::DeviceFingerprint h200(int driver_version) {
  flashgen::DeviceFingerprint d;
  d.gpu_name = "NVIDIA H200";
  d.sm = 90;
  d.sm_count = 132;
  d.driver_version = driver_version;
  d.nvrtc_version = "13.0";
  d.generator_version = "1";
  return d;
}

flashgen::KernelConfig tile(int head_dim, int block_m, int block_n, int warps, int stages) {
  flashgen::KernelConfig c;
  c.head_dim = head_dim;
  c.block_m = block_m, c.block_n = block_n, c.sm80()->warps = warps, c.stages = stages;
  return c;
}

// An export document holding one winner per (problem, config), recorded for device.
std::string export_text(const flashgen::DeviceFingerprint& device,
                        const std::vector<std::pair<flashgen::ProblemKey, flashgen::KernelConfig>>& winners) {
  flashgen::testing::TempDir dir("flashgen-shipped-test");
  flashgen::TuningStore store(dir.path() / "t.sqlite");
  for (const auto& [problem, config] : winners) {
    flashgen::CandidateResult row;
    row.config = config;
    row.median_ms = 1.0;
    row.samples = 10;
    store.record(device, problem, {row}, config, 1.0);
  }
  return store.export_json().dump();
}

}  // namespace

TEST_CASE("shipped defaults match the GPU kind, exact bucket first, then the nearest", "[tuner][shipped]") {
  const auto key4k = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 4096, 4096, 64);
  const auto key1k = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 1024, 1024, 64);
  const flashgen::KernelConfig a = tile(64, 64, 64, 4, 2), b = tile(64, 128, 128, 8, 2);
  const flashgen::ShippedDefaults shipped =
      flashgen::ShippedDefaults::from_files({{"h200.json", export_text(h200(13000), {{key4k, a}, {key1k, b}})}});
  REQUIRE(shipped.winners().size() == 2);

  bool exact = false;
  // Another driver version: the same kind of GPU.
  auto found = shipped.lookup(h200(13010), key4k, &exact);
  REQUIRE(found.has_value());
  CHECK(found->config == a);
  CHECK(exact);
  CHECK(found->source == "shipped defaults h200.json");
  const auto key2k = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 2048, 2048, 64);
  found = shipped.lookup(h200(13000), key2k, &exact);  // 1k and 4k are equally near: the smaller id wins
  REQUIRE(found.has_value());
  CHECK_FALSE(exact);
  CHECK(found->problem.id() == std::min(key1k.id(), key4k.id()));
  const auto key16k = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 16384, 16384, 64);
  found = shipped.lookup(h200(13000), key16k, &exact);
  REQUIRE(found.has_value());
  CHECK(found->config == a);

  flashgen::DeviceFingerprint h100 = h200(13000);
  h100.gpu_name = "NVIDIA H100 80GB HBM3";
  CHECK_FALSE(shipped.lookup(h100, key4k).has_value());
  // Swept by another generator version: its sweep did not time today's kernel families.
  flashgen::DeviceFingerprint other_generator = h200(13000);
  other_generator.generator_version = "0";
  CHECK_FALSE(shipped.lookup(other_generator, key4k).has_value());
  const auto causal = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kCausal, 1, 4096, 4096, 64);
  CHECK_FALSE(shipped.lookup(h200(13000), causal).has_value());
}

TEST_CASE("shipped defaults sit between the user's database and the heuristic", "[tuner][shipped][select]") {
  const auto key = flashgen::forward_problem_key(DType::kFloat16, 64, MaskKind::kNone, 1, 4096, 4096, 64);
  const flashgen::KernelConfig user = tile(64, 64, 64, 4, 2), shipped_config = tile(64, 128, 128, 8, 2);
  const flashgen::ShippedDefaults shipped =
      flashgen::ShippedDefaults::from_files({{"h200.json", export_text(h200(13000), {{key, shipped_config}})}});

  const auto from_shipped = resolved(flashgen::choose_forward_config(h200(13000), key, 90, nullptr, &shipped), 90);
  CHECK(from_shipped.config == shipped_config);
  CHECK(from_shipped.source == flashgen::ChoiceSource::kShippedDefaults);
  CHECK(from_shipped.reason.find("shipped defaults h200.json, exact bucket") != std::string::npos);

  flashgen::testing::TempDir dir("flashgen-shipped-test");
  flashgen::TuningStore store(dir.path() / "user.sqlite");
  flashgen::CandidateResult row;
  row.config = user;
  row.median_ms = 2.0;
  store.record(h200(13000), key, {row}, user, 2.0);
  const auto from_user = resolved(flashgen::choose_forward_config(h200(13000), key, 90, &store, &shipped), 90);
  CHECK(from_user.config == user);
  CHECK(from_user.source == flashgen::ChoiceSource::kTuningDatabase);
  CHECK(from_user.reason.find("tuning database") != std::string::npos);

  // A shipped config this arch cannot run (203 KB of shared memory on sm_80) falls to the heuristic.
  const auto wide = flashgen::forward_problem_key(DType::kFloat16, 256, MaskKind::kNone, 1, 4096, 4096, 64);
  flashgen::DeviceFingerprint a100 = h200(13000);
  a100.gpu_name = "NVIDIA A100-SXM4-80GB", a100.sm = 80, a100.sm_count = 108;
  const flashgen::ShippedDefaults hopper_only = flashgen::ShippedDefaults::from_files(
      {{"a100.json", export_text(a100, {{wide, tile(256, 128, 64, 8, 2)}})}});
  const auto passed = resolved(flashgen::choose_forward_config(a100, wide, 80, nullptr, &hopper_only), 80);
  CHECK(passed.reason.rfind("built-in heuristic", 0) == 0);
  CHECK(passed.source == flashgen::ChoiceSource::kHeuristic);
  CHECK(passed.reason.find("passed over") != std::string::npos);
}

TEST_CASE("a shipped file that is not an export is refused with its name", "[tuner][shipped]") {
  CHECK_THROWS_WITH(flashgen::ShippedDefaults::from_files({{"broken.json", "{not json"}}),
                    Catch::Contains("broken.json") && Catch::Contains("not JSON"));
  CHECK_THROWS_WITH(flashgen::ShippedDefaults::from_files({{"other.json", R"({"format": "something else"})"}}),
                    Catch::Contains("other.json") && Catch::Contains("not a flashgen tuning export"));
}

TEST_CASE("the embedded shipped data is valid for the GPUs it names", "[tuner][shipped]") {
  const flashgen::ShippedDefaults& shipped = flashgen::ShippedDefaults::instance();
  REQUIRE_FALSE(shipped.winners().empty());
  // Every shipped file was read (instance() leaves a bad one out with a warning only), and swept by this
  // generator version (lookup() passes over every winner of another, silently).
  std::set<std::string> gpus;
  for (const flashgen::StoredChoice& choice : shipped.winners()) {
    gpus.insert(choice.device.gpu_name);
    CHECK(choice.device.generator_version == flashgen::kGeneratorVersion);
  }
  CHECK(gpus == std::set<std::string>{"NVIDIA H100 80GB HBM3", "NVIDIA H200"});
  for (const flashgen::StoredChoice& choice : shipped.winners()) {
    INFO(choice.source << ": " << choice.device.id() << " " << choice.problem.id() << " " << flashgen::config_name(choice.config));
    std::visit(
        [&](const auto& config) {
          CHECK_FALSE(config.invalid_reason(choice.device.sm).has_value());
          CHECK(flashgen::kernel_config_of(config).dtype == choice.problem.dtype);
          CHECK(flashgen::kernel_config_of(config).head_dim == choice.problem.head_dim);
          CHECK(flashgen::kernel_config_of(config).mask == choice.problem.mask);
        },
        choice.config);
    CHECK(flashgen::of_problem(choice.config, choice.problem));
    CHECK(flashgen::is_backward(choice.config) == (choice.problem.pass == flashgen::Pass::kBackward));
    CHECK(choice.median_ms > 0);
  }
}

TEST_CASE("every embedded shipped winner compiles without spills or ptxas warnings", "[tuner][shipped][nvrtc]") {
  // A sweep times whatever compiles (a spill is a note on the candidate, and where NVRTC's log lacks
  // ptxas's report not even that), so a re-sweep could ship a forward or dkdv kernel that spills. The
  // exception: the deterministic backward's dq kernel, whose tiles won their sweeps with 8-48 bytes of
  // spills in 10 buckets (timed fastest and checked against float64 all the same), is not held to it.
  // Compiled through the process-wide registry and its disk cache ($FLASHGEN_CACHE_DIR), shared with the
  // sanitizer run.
  flashgen::KernelRegistry& registry = flashgen::KernelRegistry::instance();
  std::vector<std::pair<flashgen::TunedConfig, int>> jobs;
  std::set<std::pair<std::string, int>> seen;
  for (const flashgen::StoredChoice& choice : flashgen::ShippedDefaults::instance().winners())
    if (seen.insert({flashgen::config_name(choice.config), choice.device.sm}).second)
      jobs.emplace_back(choice.config, choice.device.sm);
  REQUIRE_FALSE(jobs.empty());
  auto compile = [&](const std::pair<flashgen::TunedConfig, int>& job) {
    return std::visit([&](const auto& config) { return registry.compiled(flashgen::kernel_config_of(config), job.second); },
                      job.first);
  };
  flashgen::testing::parallel_for(jobs.size(), [&](size_t i) { compile(jobs[i]); });

  for (const auto& job : jobs) {
    INFO("sm_" << job.second << " " << flashgen::config_name(job.first));
    const auto compiled = compile(job);
    INFO(compiled->log);
    std::vector<flashgen::ResourceUsage> usages;
    if (const auto* bwd = std::get_if<flashgen::BwdConfig>(&job.first)) {
      usages.push_back(compiled->usage_of(bwd->symbol(flashgen::BwdKernel::kPreprocess)));
      usages.push_back(compiled->usage_of(bwd->symbol(flashgen::BwdKernel::kDkdv)));
      if (!bwd->deterministic) usages.push_back(compiled->usage_of(bwd->symbol(flashgen::BwdKernel::kConvert)));
    } else if (const auto* dec = std::get_if<flashgen::DecodeSplitConfig>(&job.first)) {
      for (flashgen::DecodeKernel kernel :
           {flashgen::DecodeKernel::kAppend, flashgen::DecodeKernel::kAttend, flashgen::DecodeKernel::kCombine}) {
        usages.push_back(compiled->usage_of(dec->config.symbol(kernel)));
      }
    } else {
      usages.push_back(compiled->usage);
    }
    for (const flashgen::ResourceUsage& usage : usages) {
      CHECK(usage.registers > 0);
      CHECK(usage.spill_store_bytes == 0);
      CHECK(usage.spill_load_bytes == 0);
      CHECK(usage.stack_bytes == 0);
    }
    CHECK(compiled->ptxas_notes().empty());  // e.g. C7520: serialized wgmma
  }
}
