#include "planner/units.h"

#include <cstdlib>

#include "absl/strings/str_format.h"

namespace zplan {

std::string FormatBytes(int64_t bytes) {
  const int64_t magnitude = std::llabs(bytes);
  if (magnitude >= kGiB) return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / kGiB);
  if (magnitude >= kMiB) return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / kMiB);
  if (magnitude >= kKiB) return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / kKiB);
  return absl::StrFormat("%d B", bytes);
}

}  // namespace zplan
