// A fresh directory under /tmp for one test, removed with everything in it when the test ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "catch.hpp"

namespace flashgen::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "flashgen-test") {
    std::string pattern = "/tmp/" + prefix + "-XXXXXX";
    const char* made = ::mkdtemp(pattern.data());
    REQUIRE(made != nullptr);
    path_ = made;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace flashgen::testing
