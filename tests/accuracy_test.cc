// The agreement suite: every configuration of tools/accuracy.h is planned by
// zplan and trained by zrun; each must meet the device and host goals, and
// docs/accuracy.md's device tables must be what this run measured: the peaks
// exact, the components at the peak within kComponentSplitTolerance (regenerate
// with bazel run //tools:accuracy -- --out docs/accuracy.md).
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "planner/memory_model.h"
#include "planner/proto_io.h"
#include "tests/doc_diff.h"
#include "tools/accuracy.h"

namespace zplan {
namespace {

// The text of `markdown` from `from` up to `to` (either "" for its end).
std::string Section(const std::string& markdown, const std::string& from, const std::string& to) {
  const size_t begin = from.empty() ? 0 : markdown.find(from);
  if (begin == std::string::npos) return "";
  return markdown.substr(begin, to.empty() ? std::string::npos : markdown.find(to, begin) - begin);
}

TEST(AccuracyTest, EveryConfigurationMeetsTheGoalsAndTheDocIsCurrent) {
  ASSERT_GE(AccuracyMatrix().size(), 32u);
  const AccuracyOptions o = RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/accuracy");
  auto rows = RunAccuracyMatrix(AccuracyMatrix(), o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (const AccuracyRow& row : *rows) {
    const RankMeasurement& worst = row.ranks[row.worst_rank];
    EXPECT_TRUE(row.device_ok) << row.config.name << ": device peak " << worst.device.peak_bytes()
                               << " B measured on rank " << worst.rank << " vs "
                               << LiveTensorBytes(row.plan.device_per_rank()) << " B planned ("
                               << 100 * row.device_error << "%)";
    EXPECT_TRUE(row.host_ok) << row.config.name << ": host VmHWM off the plan by " << row.host_worst_diff_bytes
                             << " B of " << row.host_planned_bytes << " B";
  }
  auto committed = ReadFile("docs/accuracy.md");
  ASSERT_TRUE(committed.ok()) << committed.status();
  const std::string fresh = AccuracyMarkdown(*rows);
  std::string diff = FirstDifference(Section(*committed, "", kComponentSectionHeading),
                                     Section(fresh, "", kComponentSectionHeading));
  if (diff.empty()) {
    diff = FirstDifferenceWithin(Section(*committed, kComponentSectionHeading, kHostSectionHeading),
                                 Section(fresh, kComponentSectionHeading, kHostSectionHeading),
                                 kComponentSplitTolerance);
    if (!diff.empty()) {
      diff = absl::StrCat("the per-component table (by more than ", 100 * kComponentSplitTolerance, "% of a row), ",
                          diff);
    }
  }
  if (!diff.empty()) {
    FAIL() << "docs/accuracy.md differs from this run at " << diff
           << "\nRegenerate with: bazel run //tools:accuracy -- --out docs/accuracy.md";
  }
}

}  // namespace
}  // namespace zplan
