// Every row of both agreement suites, judged from its recording
// (tools/recordings.h): each case is planned afresh by zplan and compared with
// what zrun or real DeepSpeed measured when the row was recorded. A stale
// recording (its producer's sources, the packages' versions or the case's
// inputs changed) fails, naming the rows and the command that re-records
// them; the documents must be what the recordings generate; the live subset
// (tests/accuracy_test, tests/deepspeed_agreement_test) must cover every
// mechanism of its suite.
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "planner/memory_model.h"
#include "planner/plan_builder.h"
#include "planner/proto_io.h"
#include "tests/doc_diff.h"
#include "tools/recordings.h"

namespace zplan {
namespace {

class RecordingsTest : public ::testing::TestWithParam<Suite> {};

TEST_P(RecordingsTest, EveryRowIsCurrentWithinItsGoalsAndDocumented) {
  const Suite suite = GetParam();
  const AccuracyOptions o = RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/" + SuiteName(suite));
  auto producer = CurrentProducer(suite, o);
  ASSERT_TRUE(producer.ok()) << producer.status();
  auto judged = JudgeRecordings(suite, o, *producer);
  ASSERT_TRUE(judged.ok()) << judged.status();
  ASSERT_TRUE(judged->stale.empty()) << judged->stale.size() << " of " << SuiteMatrix(suite).size() << " "
                                     << SuiteName(suite) << " recordings are stale:\n  "
                                     << absl::StrJoin(judged->stale, "\n  ") << "\nRe-record them with: "
                                     << RecordCommand(suite);
  for (const AccuracyRow& row : judged->rows) {
    const RankMeasurement& worst = row.ranks[row.worst_rank];
    EXPECT_TRUE(row.device_ok) << row.config.name << ": device peak " << worst.device.peak_bytes()
                               << " B measured on rank " << worst.rank << " vs "
                               << LiveTensorBytes(PlannedDevice(row.plan, worst.rank)) << " B planned ("
                               << 100 * row.device_error << "%)";
    EXPECT_TRUE(row.host_ok) << row.config.name << ": host VmHWM off the plan by " << row.host_worst_diff_bytes
                             << " B of " << row.host_planned_bytes << " B";
  }
  auto committed = ReadFile(SuiteDocPath(suite));
  ASSERT_TRUE(committed.ok()) << committed.status();
  const std::string diff = FirstDifference(*committed, SuiteMarkdown(suite, *judged));
  EXPECT_TRUE(diff.empty()) << SuiteDocPath(suite) << " is not what the recordings generate, at " << diff
                            << "\nRegenerate it with: bazel run //tools:accuracy -- --docs";
}

TEST_P(RecordingsTest, TheLiveSubsetCoversEveryMechanismOfTheSuite) {
  const Suite suite = GetParam();
  const AccuracyOptions o = RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/live-" +
                                                    SuiteName(suite));
  const std::vector<std::string> live = LiveCases(suite);
  std::set<std::string> all, covered, unknown(live.begin(), live.end());
  int index = 0;
  for (const AccuracyCase& c : SuiteMatrix(suite)) {
    auto plan = PlanCase(c, o, CaseDir(c, o, ++index));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::set<std::string> mechanisms = Mechanisms(c, *plan);
    all.insert(mechanisms.begin(), mechanisms.end());
    if (unknown.erase(c.name) > 0) covered.insert(mechanisms.begin(), mechanisms.end());
  }
  EXPECT_TRUE(unknown.empty()) << "LiveCases(" << SuiteName(suite) << ") names cases the suite does not have: "
                               << absl::StrJoin(unknown, ", ");
  std::vector<std::string> missing;
  for (const std::string& m : all) {
    if (covered.count(m) == 0) missing.push_back(m);
  }
  EXPECT_TRUE(missing.empty()) << "no live " << SuiteName(suite) << " case exercises: " << absl::StrJoin(missing, ", ")
                               << " (tools/recordings.cc, LiveCases)";
}

INSTANTIATE_TEST_SUITE_P(Suites, RecordingsTest, ::testing::Values(Suite::kZrun, Suite::kDeepSpeed),
                         [](const ::testing::TestParamInfo<Suite>& info) {
                           return std::string(info.param == Suite::kZrun ? "Zrun" : "DeepSpeed");
                         });

}  // namespace
}  // namespace zplan
