// The host side of the explain calls: naming where a config choice came from, and writing generated
// sources where a person (or nvcc) can read them.
#include "api/explain.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "support/temp_dir.hpp"

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("choice sources have the names explain reports", "[explain]") {
  using flashgen::ChoiceSource;
  CHECK(std::string(flashgen::choice_source_name(ChoiceSource::kTuningDatabase)) == "tuning database");
  CHECK(std::string(flashgen::choice_source_name(ChoiceSource::kTunedOnFirstUse)) == "tuned on first use");
  CHECK(std::string(flashgen::choice_source_name(ChoiceSource::kShippedDefaults)) == "shipped defaults");
  CHECK(std::string(flashgen::choice_source_name(ChoiceSource::kHeuristic)) == "heuristic");
  CHECK(std::string(flashgen::choice_source_name(ChoiceSource::kRequested)) == "requested");
}

TEST_CASE("write_generated_source writes the self-contained translation unit atomically", "[explain]") {
  const flashgen::testing::TempDir temp("flashgen-explain");
  const flashgen::GeneratedSource source = flashgen::generate(flashgen::KernelConfig{});
  const std::filesystem::path dir = temp.path() / "sources";

  const std::filesystem::path path = flashgen::write_generated_source(source, dir);
  CHECK(path == dir / (source.kernel_name + ".cu"));
  CHECK(read_file(path) == source.self_contained());
  // Written again (every explain call does): replaced whole, no temporary left behind.
  CHECK(flashgen::write_generated_source(source, dir) == path);
  CHECK(read_file(path) == source.self_contained());
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("write_generated_source names the path when it cannot write", "[explain]") {
  const flashgen::testing::TempDir temp("flashgen-explain");
  const flashgen::GeneratedSource source = flashgen::generate(flashgen::KernelConfig{});
  // A regular file where the folder should be.
  const std::filesystem::path blocker = temp.path() / "sources";
  std::ofstream(blocker) << "not a folder";
  try {
    flashgen::write_generated_source(source, blocker);
    FAIL("expected an error");
  } catch (const flashgen::Error& e) {
    INFO(e.what());
    CHECK(e.status() == flashgen::Status::kInternal);
    CHECK(std::string(e.what()).find(blocker.string()) != std::string::npos);
  }
}
