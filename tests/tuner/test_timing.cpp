// Timing statistics (CPU) used by the tuner's sweeps.
#include "catch.hpp"
#include "tuner/timing.hpp"

TEST_CASE("summarize gives median and interpolated percentiles", "[tuner][timing]") {
  const flashgen::TimingResult r = flashgen::summarize({5, 1, 4, 2, 3});
  CHECK(r.samples == 5);
  CHECK(r.median_ms == 3);
  CHECK(r.p10_ms == Approx(1.4));
  CHECK(r.p90_ms == Approx(4.6));
  CHECK(r.spread() == Approx((4.6 - 1.4) / 3));

  const flashgen::TimingResult one = flashgen::summarize({2.5});
  CHECK(one.median_ms == 2.5);
  CHECK(one.spread() == 0);
  CHECK(flashgen::summarize({}).samples == 0);
}
