#include "tests/doc_diff.h"

#include <sstream>

namespace zplan {

std::string FirstDifference(const std::string& committed, const std::string& fresh) {
  if (committed == fresh) return "";
  std::istringstream a(committed), b(fresh);
  std::string line_a, line_b;
  for (int line = 1; static_cast<bool>(std::getline(a, line_a)) | static_cast<bool>(std::getline(b, line_b));
       ++line) {
    if (line_a != line_b) {
      return "line " + std::to_string(line) + ":\n  committed: " + line_a + "\n  fresh:     " + line_b;
    }
    line_a.clear();
    line_b.clear();
  }
  return "the end of the text";  // equal lines, different line endings
}

}  // namespace zplan
