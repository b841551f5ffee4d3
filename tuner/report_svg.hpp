// Inline SVG charts for the sweep report's page (report_html.cpp): a strip chart of values in labelled columns and a
// horizontal bar chart, each on a value axis (linear, or log10 where the values spread), and the escaping of text
// that they and the page share. They know nothing of tuning: the page says what a column and a mark are.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace flashgen::svg {

// Text for HTML and SVG content and double-quoted attribute values (the only kind the report writes): & < > " as
// character references.
std::string escape(const std::string& text);

// A number as a chart labels it: three significant digits, no exponent from 0.001 to 99999.
std::string number_text(double value);

// An axis over a range of values, linear or log10; position() maps a value to [0, 1] from lo to hi.
class ValueAxis {
 public:
  // An axis holding every value with a margin, log10 when all are positive and the largest is at least log_ratio
  // times the smallest. from_zero: a linear axis that starts at 0 (bars).
  static ValueAxis fit(const std::vector<double>& values, double log_ratio, bool from_zero = false);

  bool log() const { return log_; }
  double lo() const { return lo_; }
  double hi() const { return hi_; }
  double position(double value) const;
  // Round values inside the range, at most `most` of them: 1-2-5 steps (on a log axis: the densest of 1..9,
  // 1-1.5-2-3-5-7, 1-2-5, 1-3 and 1 per decade that fits; linear steps where the axis spans too little of a decade for
  // two).
  std::vector<double> ticks(int most) const;

 private:
  double lo_ = 0, hi_ = 1;
  bool log_ = false;
};

// One mark of a strip chart: a value in a column, or a value-less mark (a run that failed) drawn in a band above
// the plot. Each mark is one <g class="mark ..."> element holding its shapes and a <title> tooltip.
struct StripMark {
  size_t column = 0;
  std::optional<double> value;
  std::string classes;      // added after "mark": e.g. "winner builtin"; the page's CSS styles them
  std::string title;        // tooltip
  std::string key;          // its data-key attribute (a config name)
  double spread = 0;        // relative spread of the value: drawn as a whisker on emphasised marks when > 0
  bool emphasised = false;  // drawn last, on top, with its whisker
  bool diamond = false;     // a diamond instead of a dot
  bool ring = false;        // a ring around it
  bool outer_ring = false;  // a wider ring around it (the page styles it dashed)
};

struct StripChart {
  std::string x_label;               // under the columns
  std::string y_label;               // beside the value axis, e.g. "time (ms)"; ", log scale" is added on a log axis
  std::vector<std::string> columns;  // left to right
  std::vector<StripMark> marks;
  std::optional<double> reference;  // a dashed line across the plot (the best value)
  bool column_best = true;          // a short line at each column's smallest value
  std::string attributes;           // extra attributes of the <svg> element, already escaped (class, data-*)
  double log_ratio = 3;             // values spreading this much or more go on a log axis
};
std::string strip_chart(const StripChart& chart);

// A horizontal bar chart from 0: one row per bar, its label left, its value text right of the bar, and an
// optional second value drawn as an outline bar (a reference the bar is compared with).
struct Bar {
  std::string label;
  double value = 0;
  std::optional<double> outline;
  std::string value_text;
  std::string title;
};
struct BarChart {
  std::string axis_label;  // under the value axis, e.g. "winner's time (ms)"
  std::vector<Bar> bars;
  std::string attributes;
};
std::string bar_chart(const BarChart& chart);

}  // namespace flashgen::svg
