#include "planner/units.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zplan {

std::string FormatBytes(int64_t bytes) {
  const int64_t magnitude = std::llabs(bytes);
  if (magnitude >= kGiB) return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / kGiB);
  if (magnitude >= kMiB) return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / kMiB);
  if (magnitude >= kKiB) return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / kKiB);
  return absl::StrFormat("%d B", bytes);
}

std::string FormatCount(int64_t value) {
  const std::string digits = absl::StrCat(value < 0 ? -value : value);
  std::string out = value < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace zplan
