// The sweep report's SVG charts (see report_svg.hpp). Sizes are in SVG user units; the page scales each chart to
// its grid cell through the viewBox, and its CSS gives the marks their colours.
#include "tuner/report_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace flashgen::svg {
namespace {

std::string fixed(double value, int decimals = 1) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// Coordinates with one decimal: enough for a screen, and short.
std::string at(double value) { return fixed(value, 1); }

// ---- Strip chart geometry: (kWidth, kHeight) with the plot inside the margins. -----------------
constexpr double kWidth = 300, kHeight = 224;
constexpr double kLeft = 56, kRight = kWidth - 10;
constexpr double kTopPlain = 12, kTopWithBand = 30;  // a band of value-less marks above the plot needs 18 more
constexpr double kBottom = kHeight - 44;
constexpr double kDot = 3.2, kDiamond = 6.5, kRing = 8, kOuterRing = 11.5;

std::string tick_label(double value) { return number_text(value); }

// Horizontal offsets of the marks of one column, so that marks of close values (neighbours in value order) sit
// apart: the centre, then alternately left and right, within most of the column's width.
double spread_offset(size_t rank, double column_width) {
  const double step = std::max(std::min(6.0, column_width * 0.8 / 9), 0.5);
  size_t slots = std::max<size_t>(1, static_cast<size_t>(column_width * 0.8 / step));
  if (slots % 2 == 0) --slots;  // odd: as many slots left of the centre as right of it
  const size_t slot = rank % slots;
  const double side = slot % 2 == 1 ? -1.0 : 1.0;
  return side * static_cast<double>((slot + 1) / 2) * step;
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string number_text(double value) {
  char text[48];
  const double magnitude = std::fabs(value);
  if (value == 0) return "0";
  if (magnitude >= 1000 && magnitude < 1e5)
    std::snprintf(text, sizeof text, "%.0f", value);
  else
    std::snprintf(text, sizeof text, "%.3g", value);
  return text;
}

ValueAxis ValueAxis::fit(const std::vector<double>& values, double log_ratio, bool from_zero) {
  ValueAxis axis;
  if (values.empty()) return axis;
  const double lo = *std::min_element(values.begin(), values.end());
  const double hi = *std::max_element(values.begin(), values.end());
  if (!from_zero && lo > 0 && hi / lo >= log_ratio) {
    axis.log_ = true;
    const double margin = std::pow(hi / lo, 0.06);
    axis.lo_ = lo / margin;
    axis.hi_ = hi * margin;
    return axis;
  }
  if (from_zero) {
    axis.lo_ = 0;
    axis.hi_ = hi > 0 ? hi * 1.04 : 1;
    return axis;
  }
  double span = hi - lo;
  if (span <= 0) span = lo != 0 ? std::fabs(lo) * 0.2 : 1;
  axis.lo_ = lo - 0.08 * span;
  axis.hi_ = hi + 0.08 * span;
  if (lo >= 0) axis.lo_ = std::max(axis.lo_, 0.0);
  return axis;
}

double ValueAxis::position(double value) const {
  if (log_) return (std::log10(value) - std::log10(lo_)) / (std::log10(hi_) - std::log10(lo_));
  return (value - lo_) / (hi_ - lo_);
}

std::vector<double> ValueAxis::ticks(int most) const {
  std::vector<double> ticks;
  if (log_) {
    const int first = static_cast<int>(std::floor(std::log10(lo_)));
    const int last = static_cast<int>(std::ceil(std::log10(hi_)));
    // The densest set of steps per decade that gives at most `most` ticks.
    const std::vector<std::vector<double>> step_sets = {
        {1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1.5, 2, 3, 5, 7}, {1, 2, 5}, {1, 3}, {1}};
    for (const std::vector<double>& steps : step_sets) {
      ticks.clear();
      for (int decade = first; decade <= last; ++decade)
        for (double m : steps) {
          const double t = m * std::pow(10.0, decade);
          if (t >= lo_ && t <= hi_) ticks.push_back(t);
        }
      if (static_cast<int>(ticks.size()) <= most) break;
    }
    if (ticks.size() >= 2) return ticks;
    // A log axis spanning less than the steps above: linear steps inside it, placed on the log axis.
  }
  const double raw = (hi_ - lo_) / std::max(most, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude * 10;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  ticks.clear();
  for (double k = std::ceil(lo_ / step); k * step <= hi_ * (1 + 1e-12); k += 1) ticks.push_back(k * step);
  return ticks;
}

std::string strip_chart(const StripChart& chart) {
  std::vector<double> values;
  bool valueless = false;
  for (const StripMark& m : chart.marks) {
    if (m.value)
      values.push_back(*m.value);
    else
      valueless = true;
  }
  const ValueAxis axis = ValueAxis::fit(values, chart.log_ratio);
  const double top = valueless ? kTopWithBand : kTopPlain;
  const double columns = static_cast<double>(std::max<size_t>(chart.columns.size(), 1));
  const double column_width = (kRight - kLeft) / columns;
  auto y_of = [&](double v) { return std::clamp(kBottom - axis.position(v) * (kBottom - top), top, kBottom); };
  auto x_of = [&](size_t column) { return kLeft + (static_cast<double>(column) + 0.5) * column_width; };

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " + at(kWidth) + " " + at(kHeight) +
                  "\" width=\"" + at(kWidth) + "\" height=\"" + at(kHeight) + "\"";
  if (!chart.attributes.empty()) s += " " + chart.attributes;
  s += ">";
  // Every other column shaded, so a mark's column reads at a glance.
  for (size_t c = 1; c < chart.columns.size(); c += 2) {
    s += "<rect class=\"band\" x=\"" + at(kLeft + static_cast<double>(c) * column_width) + "\" y=\"" + at(top) +
         "\" width=\"" + at(column_width) + "\" height=\"" + at(kBottom - top) + "\"/>";
  }
  // Value axis: grid lines and labels.
  for (double t : axis.ticks(6)) {
    const double y = y_of(t);
    s += "<line class=\"grid\" x1=\"" + at(kLeft) + "\" x2=\"" + at(kRight) + "\" y1=\"" + at(y) + "\" y2=\"" + at(y) +
         "\"/>";
    s += "<text class=\"tick\" x=\"" + at(kLeft - 4) + "\" y=\"" + at(y + 3.5) + "\" text-anchor=\"end\">" +
         escape(tick_label(t)) + "</text>";
  }
  s += "<line class=\"axis\" x1=\"" + at(kLeft) + "\" x2=\"" + at(kLeft) + "\" y1=\"" + at(top) + "\" y2=\"" +
       at(kBottom) + "\"/>";
  s += "<line class=\"axis\" x1=\"" + at(kLeft) + "\" x2=\"" + at(kRight) + "\" y1=\"" + at(kBottom) + "\" y2=\"" +
       at(kBottom) + "\"/>";
  const std::string y_label = chart.y_label + (axis.log() ? ", log scale" : "");
  const double y_middle = (top + kBottom) / 2;
  s += "<text class=\"axis-label\" transform=\"translate(12 " + at(y_middle) +
       ") rotate(-90)\" text-anchor=\"middle\">" + escape(y_label) + "</text>";
  if (valueless) {
    s += "<text class=\"tick\" x=\"" + at(kLeft - 4) + "\" y=\"" + at(kTopPlain + 6) +
         "\" text-anchor=\"end\">failed</text>";
  }
  // Column labels: level while they fit their column, slanted otherwise.
  size_t longest = 0;
  for (const std::string& label : chart.columns) longest = std::max(longest, label.size());
  const bool slanted = static_cast<double>(longest) * 6.2 + 6 > column_width;  // 10.5 px digits are about 6 wide
  for (size_t c = 0; c < chart.columns.size(); ++c) {
    const double x = x_of(c), y = kBottom + 13;
    if (slanted) {
      s += "<text class=\"tick\" transform=\"translate(" + at(x + 3) + " " + at(y - 4) + ") rotate(-30)\" " +
           "text-anchor=\"end\">" + escape(chart.columns[c]) + "</text>";
    } else {
      s += "<text class=\"tick\" x=\"" + at(x) + "\" y=\"" + at(y) + "\" text-anchor=\"middle\">" +
           escape(chart.columns[c]) + "</text>";
    }
  }
  s += "<text class=\"axis-label\" x=\"" + at((kLeft + kRight) / 2) + "\" y=\"" + at(kHeight - 5) +
       "\" text-anchor=\"middle\">" + escape(chart.x_label) + "</text>";

  if (chart.reference) {
    const double y = y_of(*chart.reference);
    s += "<line class=\"reference\" x1=\"" + at(kLeft) + "\" x2=\"" + at(kRight) + "\" y1=\"" + at(y) + "\" y2=\"" +
         at(y) + "\"/>";
  }
  if (chart.column_best) {
    std::vector<double> best(chart.columns.size(), std::numeric_limits<double>::infinity());
    for (const StripMark& m : chart.marks)
      if (m.value && m.column < best.size()) best[m.column] = std::min(best[m.column], *m.value);
    for (size_t c = 0; c < best.size(); ++c) {
      if (!std::isfinite(best[c])) continue;
      const double y = y_of(best[c]);
      s += "<line class=\"best\" x1=\"" + at(x_of(c) - column_width * 0.42) + "\" x2=\"" +
           at(x_of(c) + column_width * 0.42) + "\" y1=\"" + at(y) + "\" y2=\"" + at(y) + "\"/>";
    }
  }

  // Each column's marks in value order (value-less ones after), so that neighbours in value get different offsets.
  std::vector<size_t> order(chart.marks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const StripMark &x = chart.marks[a], &y = chart.marks[b];
    if (x.column != y.column) return x.column < y.column;
    if (x.value.has_value() != y.value.has_value()) return x.value.has_value();
    return x.value && *x.value < *y.value;
  });
  std::vector<std::pair<double, double>> place(chart.marks.size());  // (x, y) per mark
  size_t rank = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const StripMark& m = chart.marks[order[i]];
    if (i == 0 || chart.marks[order[i - 1]].column != m.column ||
        chart.marks[order[i - 1]].value.has_value() != m.value.has_value())
      rank = 0;
    const double x = x_of(m.column) + spread_offset(rank++, column_width);
    place[order[i]] = {x, m.value ? y_of(*m.value) : kTopPlain + 3};
  }
  // Emphasised marks last, so they are drawn on top of the others.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return !chart.marks[a].emphasised && chart.marks[b].emphasised; });
  for (size_t i : order) {
    const StripMark& m = chart.marks[i];
    const auto [x, y] = place[i];
    s += "<g class=\"mark" + (m.classes.empty() ? "" : " " + escape(m.classes)) + "\" data-key=\"" + escape(m.key) +
         "\"><title>" + escape(m.title) + "</title>";
    if (!m.value) {
      s += "<path class=\"cross\" d=\"M" + at(x - 3) + " " + at(y - 3) + "l6 6m0 -6l-6 6\"/></g>";
      continue;
    }
    if (m.emphasised && m.spread > 0) {
      const double lo = y_of(*m.value * (1 - m.spread / 2)), hi = y_of(*m.value * (1 + m.spread / 2));
      s += "<line class=\"whisker\" x1=\"" + at(x) + "\" x2=\"" + at(x) + "\" y1=\"" + at(lo) + "\" y2=\"" + at(hi) +
           "\"/>";
    }
    if (m.diamond) {
      s += "<path class=\"diamond\" d=\"M" + at(x) + " " + at(y - kDiamond) + "l" + at(kDiamond) + " " + at(kDiamond) +
           "l" + at(-kDiamond) + " " + at(kDiamond) + "l" + at(-kDiamond) + " " + at(-kDiamond) + "z\"/>";
    } else {
      s += "<circle class=\"dot\" cx=\"" + at(x) + "\" cy=\"" + at(y) + "\" r=\"" + at(kDot) + "\"/>";
    }
    if (m.ring) s += "<circle class=\"ring\" cx=\"" + at(x) + "\" cy=\"" + at(y) + "\" r=\"" + at(kRing) + "\"/>";
    if (m.outer_ring)
      s += "<circle class=\"outer-ring\" cx=\"" + at(x) + "\" cy=\"" + at(y) + "\" r=\"" + at(kOuterRing) + "\"/>";
    s += "</g>";
  }
  return s + "</svg>";
}

std::string bar_chart(const BarChart& chart) {
  constexpr double kChartWidth = 660, kLabel = 190, kValueSpace = 150, kRow = 26, kTop = 6, kAxis = 36;
  const double right = kChartWidth - kValueSpace;
  const double height = kTop + kRow * static_cast<double>(chart.bars.size()) + kAxis;
  std::vector<double> values;
  for (const Bar& b : chart.bars) {
    values.push_back(b.value);
    if (b.outline) values.push_back(*b.outline);
  }
  const ValueAxis axis = ValueAxis::fit(values, 0, /*from_zero=*/true);
  auto x_of = [&](double v) { return kLabel + axis.position(v) * (right - kLabel); };
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " + at(kChartWidth) + " " + at(height) +
                  "\" width=\"" + at(kChartWidth) + "\" height=\"" + at(height) + "\"";
  if (!chart.attributes.empty()) s += " " + chart.attributes;
  s += ">";
  const double axis_y = kTop + kRow * static_cast<double>(chart.bars.size());
  for (double t : axis.ticks(6)) {
    const double x = x_of(t);
    s += "<line class=\"grid\" x1=\"" + at(x) + "\" x2=\"" + at(x) + "\" y1=\"" + at(kTop) + "\" y2=\"" + at(axis_y) +
         "\"/>";
    s += "<text class=\"tick\" x=\"" + at(x) + "\" y=\"" + at(axis_y + 13) + "\" text-anchor=\"middle\">" +
         escape(number_text(t)) + "</text>";
  }
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const Bar& b = chart.bars[i];
    const double y = kTop + kRow * static_cast<double>(i);
    s += "<g class=\"bar-row\"><title>" + escape(b.title) + "</title>";
    s += "<text class=\"bar-label\" x=\"" + at(kLabel - 8) + "\" y=\"" + at(y + 17) + "\" text-anchor=\"end\">" +
         escape(b.label) + "</text>";
    double end = x_of(b.value);
    s += "<rect class=\"bar\" x=\"" + at(kLabel) + "\" y=\"" + at(y + 6) + "\" width=\"" + at(end - kLabel) +
         "\" height=\"14\"/>";
    if (b.outline) {
      const double outline_end = x_of(*b.outline);
      s += "<rect class=\"bar-outline\" x=\"" + at(kLabel) + "\" y=\"" + at(y + 3) + "\" width=\"" +
           at(outline_end - kLabel) + "\" height=\"20\"/>";
      end = std::max(end, outline_end);
    }
    s += "<text class=\"bar-value\" x=\"" + at(end + 6) + "\" y=\"" + at(y + 17) + "\">" + escape(b.value_text) +
         "</text></g>";
  }
  s += "<line class=\"axis\" x1=\"" + at(kLabel) + "\" x2=\"" + at(right) + "\" y1=\"" + at(axis_y) + "\" y2=\"" +
       at(axis_y) + "\"/>";
  s += "<text class=\"axis-label\" x=\"" + at((kLabel + right) / 2) + "\" y=\"" + at(height - 4) +
       "\" text-anchor=\"middle\">" + escape(chart.axis_label) + "</text>";
  return s + "</svg>";
}

}  // namespace flashgen::svg
