#include "tests/doc_diff.h"

#include <cmath>
#include <functional>
#include <regex>
#include <sstream>
#include <vector>

namespace zplan {
namespace {

using LinesEqual = std::function<bool(const std::string&, const std::string&)>;

std::string FirstLineDifference(const std::string& committed, const std::string& fresh, const LinesEqual& equal) {
  std::istringstream a(committed), b(fresh);
  std::string line_a, line_b;
  for (int line = 1; static_cast<bool>(std::getline(a, line_a)) | static_cast<bool>(std::getline(b, line_b));
       ++line) {
    if (!equal(line_a, line_b)) {
      return "line " + std::to_string(line) + ":\n  committed: " + line_a + "\n  fresh:     " + line_b;
    }
    line_a.clear();
    line_b.clear();
  }
  return "";
}

// A line with its figures taken out: `skeleton` keeps the rest of the text,
// with '#' where a byte quantity was.
struct Figures {
  std::string skeleton;
  std::vector<double> bytes;
};

Figures TakeFigures(const std::string& line) {
  // A percentage, and the planned bytes a cell names beside one ("(-76.77% of
  // 1.6 MiB)", present only when measured and planned differ), are derived.
  static const std::regex kPlannedBeside(R"( \([+-]?[0-9.]+% of [0-9.]+ [KMGT]?i?B\))");
  static const std::regex kPercent(R"([+-]?[0-9.]+%)");
  static const std::regex kBytes(R"(\b([0-9.]+) (B|KiB|MiB|GiB|TiB)\b)");
  const std::string text = std::regex_replace(std::regex_replace(line, kPlannedBeside, ""), kPercent, "%");
  Figures f;
  size_t copied = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kBytes); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const std::string unit = m[2];
    const int power = unit == "B" ? 0 : std::string("KMGT").find(unit[0]) + 1;
    f.bytes.push_back(std::stod(m[1]) * std::pow(1024.0, power));
    f.skeleton += text.substr(copied, m.position(0) - copied) + "#";
    copied = m.position(0) + m.length(0);
  }
  f.skeleton += text.substr(copied);
  return f;
}

}  // namespace

std::string FirstDifference(const std::string& committed, const std::string& fresh) {
  if (committed == fresh) return "";
  const std::string diff =
      FirstLineDifference(committed, fresh, [](const std::string& a, const std::string& b) { return a == b; });
  return diff.empty() ? "the end of the text" : diff;  // equal lines, different line endings
}

std::string FirstDifferenceWithin(const std::string& committed, const std::string& fresh, double fraction) {
  return FirstLineDifference(committed, fresh, [fraction](const std::string& a, const std::string& b) {
    const Figures fa = TakeFigures(a), fb = TakeFigures(b);
    if (fa.skeleton != fb.skeleton) return false;
    double line_bytes = 0;
    for (double v : fb.bytes) line_bytes += v;
    for (size_t k = 0; k < fa.bytes.size(); ++k) {
      if (std::fabs(fa.bytes[k] - fb.bytes[k]) > fraction * line_bytes) return false;
    }
    return true;
  });
}

}  // namespace zplan
