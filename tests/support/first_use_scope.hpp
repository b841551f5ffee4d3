// Tune-on-first-use switched on, and the user's tuning database pointed at a file of the test's own, for
// one scope; both restored when it ends, a failed REQUIRE included.
#pragma once

#include <stdlib.h>

#include <optional>
#include <string>

#include "dispatch/select.hpp"

namespace flashgen::testing {

class FirstUseScope {
 public:
  explicit FirstUseScope(const std::string& db) : was_on_(flashgen::tune_on_first_use()) {
    if (const char* value = std::getenv("FLASHGEN_TUNING_DB")) previous_db_ = value;
    ::setenv("FLASHGEN_TUNING_DB", db.c_str(), 1);
    flashgen::set_tune_on_first_use(true);
  }
  ~FirstUseScope() {
    flashgen::set_tune_on_first_use(was_on_);
    if (previous_db_) {
      ::setenv("FLASHGEN_TUNING_DB", previous_db_->c_str(), 1);
    } else {
      ::unsetenv("FLASHGEN_TUNING_DB");
    }
  }
  FirstUseScope(const FirstUseScope&) = delete;
  FirstUseScope& operator=(const FirstUseScope&) = delete;

 private:
  bool was_on_;
  std::optional<std::string> previous_db_;
};

}  // namespace flashgen::testing
