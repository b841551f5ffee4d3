// Plain-text tables for the flashgen tool: columns sized to their widest cell, the first column
// left-aligned (names), the others right-aligned (numbers).
#pragma once

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace flashgen::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}

  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void print(std::ostream& os) const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      width.resize(std::max(width.size(), row.size()), 0);
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        const std::string pad(width[c] - row[c].size(), ' ');
        if (c > 0) line += "  ";
        line += c == 0 ? row[c] + pad : pad + row[c];
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      os << line << '\n';
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting into a std::string, for table cells and report lines.
template <typename... Ts>
std::string format(const char* fmt, Ts... values) {
  const int size = std::snprintf(nullptr, 0, fmt, values...);
  std::string text(size > 0 ? static_cast<size_t>(size) : 0, '\0');
  std::snprintf(text.data(), text.size() + 1, fmt, values...);
  return text;
}

}  // namespace flashgen::cli
