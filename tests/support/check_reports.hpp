// Turns the reports of flashgen::test::check_forward into Catch2 checks, printing each report's text
// (the first mismatches) when a check fails. Shared by the [gpu] forward tests.
#pragma once

#include "catch.hpp"
#include "support/attention_reference.hpp"

namespace flashgen::test {

inline void check_reports(const ForwardCheck& check) {
  {
    INFO(check.out.text);
    CHECK(check.out.not_written == 0);
    CHECK(check.out.ok);
  }
  {
    INFO(check.out_touched_text);
    CHECK(check.out_touched == 0);
  }
  if (check.has_lse) {
    {
      INFO(check.lse.text);
      CHECK(check.lse.not_written == 0);
      CHECK(check.lse.ok);
    }
    INFO(check.lse_touched_text);
    CHECK(check.lse_touched == 0);
  }
}

}  // namespace flashgen::test
