// File: units.h
// Byte units and their formatting. GiB is 2^30 and is labelled "GiB"
// everywhere; decimal GB (1e9) appears only where a source uses it and is
// labelled "GB" (DESIGN §3).
#ifndef ZPLAN_PLANNER_UNITS_H_
#define ZPLAN_PLANNER_UNITS_H_

#include <cstdint>
#include <string>

namespace zplan {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr int64_t kGB = 1000 * 1000 * 1000;

inline double ToGiB(int64_t bytes) { return static_cast<double>(bytes) / kGiB; }

// "12.34 GiB", "512.0 MiB" or "64 B": the largest unit that keeps >= 1.
std::string FormatBytes(int64_t bytes);

// 1235814400 -> "1,235,814,400".
std::string FormatCount(int64_t value);

// Ceiling division for non-negative values.
inline constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline constexpr int64_t RoundUp(int64_t a, int64_t multiple) {
  return CeilDiv(a, multiple) * multiple;
}
// The smallest power of two >= a (a in [0, 2^62]; 0 stays 0, as c10's PowerOf2Ceil).
inline constexpr int64_t RoundUpToPowerOfTwo(int64_t a) {
  int64_t p = 1;
  while (a > 0 && p < a) p <<= 1;
  return a > 0 ? p : 0;
}

}  // namespace zplan

#endif  // ZPLAN_PLANNER_UNITS_H_
