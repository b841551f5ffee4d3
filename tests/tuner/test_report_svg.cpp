// Tests for tuner/report_svg: escaping, number labels, the value axis (linear and log ticks) and the marks of a strip
// chart, value-less ones included. CPU only.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "tuner/report_svg.hpp"

namespace {

using namespace flashgen::svg;

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("report svg: escaping and number labels", "[report]") {
  CHECK(escape("a<b & \"c\">'d'") == "a&lt;b &amp; &quot;c&quot;&gt;'d'");
  CHECK(number_text(0) == "0");
  CHECK(number_text(0.012345) == "0.0123");
  CHECK(number_text(1.5) == "1.5");
  CHECK(number_text(123.4) == "123");
  CHECK(number_text(2684.7) == "2685");
}

TEST_CASE("report svg: a value axis turns logarithmic where values spread, its ticks inside it", "[report]") {
  const ValueAxis narrow = ValueAxis::fit({1.0, 1.2, 1.9}, 3);
  CHECK(!narrow.log());
  CHECK(narrow.position(1.0) > 0);
  CHECK(narrow.position(1.9) < 1);
  const ValueAxis wide = ValueAxis::fit({0.4, 1.0, 6.0}, 3);
  CHECK(wide.log());
  CHECK(wide.position(1.0) ==
        Approx((std::log10(1.0) - std::log10(wide.lo())) / (std::log10(wide.hi()) - std::log10(wide.lo()))));
  for (const ValueAxis& axis : {narrow, wide, ValueAxis::fit({0.05, 40.0}, 3), ValueAxis::fit({2.0}, 3)}) {
    const std::vector<double> ticks = axis.ticks(6);
    INFO("axis " << axis.lo() << " to " << axis.hi() << (axis.log() ? " (log)" : ""));
    CHECK(ticks.size() >= 2);
    CHECK(ticks.size() <= 6);
    for (double t : ticks) CHECK((t >= axis.lo() && t <= axis.hi() * (1 + 1e-9)));
  }
  const ValueAxis bars = ValueAxis::fit({3.0, 5.0}, 0, /*from_zero=*/true);
  CHECK(bars.lo() == 0);
  CHECK(bars.position(0) == 0);
}

TEST_CASE("report svg: a strip chart draws one mark per entry, value-less ones in a band", "[report]") {
  StripChart chart;
  chart.x_label = "block_n";
  chart.y_label = "time (ms)";
  chart.columns = {"64", "128", "n/a"};
  chart.attributes = "class=\"knob-chart\"";
  for (size_t i = 0; i < 9; ++i) {
    StripMark m;
    m.column = i % 3;
    if (i != 4) m.value = 1.0 + 0.1 * static_cast<double>(i);
    m.key = "c" + std::to_string(i);
    m.title = "<config " + std::to_string(i) + ">";
    m.classes = i == 0 ? "winner" : "";
    m.diamond = i == 0;
    m.emphasised = i == 0;
    chart.marks.push_back(m);
  }
  chart.reference = 1.0;
  const std::string svg = strip_chart(chart);
  CHECK(svg.rfind("<svg ", 0) == 0);
  CHECK(svg.find("class=\"knob-chart\"") != std::string::npos);
  CHECK(count(svg, "<g class=\"mark") == 9);
  CHECK(count(svg, "<g class=\"mark winner\"") == 1);
  CHECK(count(svg, "class=\"diamond\"") == 1);
  CHECK(count(svg, "class=\"cross\"") == 1);  // the one without a value
  CHECK(svg.find(">failed<") != std::string::npos);
  CHECK(count(svg, "class=\"best\"") == 3);
  CHECK(count(svg, "class=\"reference\"") == 1);
  CHECK(svg.find("&lt;config 3&gt;") != std::string::npos);
  // The winner is drawn last, on top of the others.
  CHECK(svg.rfind("<g class=\"mark") == svg.find("<g class=\"mark winner\""));

  BarChart bars;
  bars.axis_label = "time (ms)";
  bars.bars = {{"H100", 1.0, 1.2, "1 ms", "H100"}, {"H200", 0.9, std::nullopt, "0.9 ms", "H200"}};
  const std::string bar_svg = bar_chart(bars);
  CHECK(count(bar_svg, "class=\"bar\"") == 2);
  CHECK(count(bar_svg, "class=\"bar-outline\"") == 1);
}
