#include "tests/live_check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "planner/memory_model.h"

namespace zplan {

void ExpectLiveCasesMeasureTheirRecordings(Suite suite) {
  AccuracyOptions o = RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/live");
  const std::vector<std::string> live = LiveCases(suite);
  int index = 0, run = 0;
  for (const AccuracyCase& c : SuiteMatrix(suite)) {
    ++index;
    if (std::find(live.begin(), live.end(), c.name) == live.end()) continue;
    ++run;
    SCOPED_TRACE(c.name);
    auto recording = ReadRecording(RecordingPath(suite, c.name));
    ASSERT_TRUE(recording.ok()) << recording.status() << "; record it with " << RecordCommand(suite);
    const std::string dir = CaseDir(c, o, index);
    auto plan = PlanCase(c, o, dir);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto report = MeasureCase(c, o, dir);
    ASSERT_TRUE(report.ok()) << report.status();
    plan = PlanOnMeasuredRouting(c, o, dir, *std::move(plan), *report);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto row = JudgeRow(c, *std::move(plan), *report);
    ASSERT_TRUE(row.ok()) << row.status();
    EXPECT_TRUE(row->device_ok) << "device peak " << 100 * row->device_error << "% off the plan";
    EXPECT_TRUE(row->host_ok) << "host VmHWM off the plan by " << row->host_worst_diff_bytes << " B";
    const Report& recorded = recording->report();
    ASSERT_EQ(report->ranks_size(), recorded.ranks_size());
    for (int r = 0; r < report->ranks_size(); ++r) {
      const MemoryBreakdown& now = report->ranks(r).measured_device();
      const MemoryBreakdown& then = recorded.ranks(r).measured_device();
      EXPECT_EQ(now.peak_bytes(), then.peak_bytes())
          << "rank " << r << " measured " << now.peak_bytes() << " B, recorded " << then.peak_bytes()
          << " B: the recording no longer describes its producer; re-record with " << RecordCommand(suite)
          << " --cases all";
      const std::vector<NamedBytes> a = TensorComponents(now), b = TensorComponents(then);
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_LE(std::abs(a[k].bytes - b[k].bytes), kComponentSplitTolerance * now.peak_bytes())
            << "rank " << r << " " << a[k].name << ": " << a[k].bytes << " B measured, " << b[k].bytes
            << " B recorded";
      }
    }
  }
  EXPECT_EQ(run, static_cast<int>(live.size())) << "LiveCases names cases the suite does not have";
}

}  // namespace zplan
