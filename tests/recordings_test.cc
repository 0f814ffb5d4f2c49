// Every row of both agreement suites, judged from its recording
// (tools/recordings.h): each case is planned afresh by zplan and compared with
// what zrun or real DeepSpeed measured when the row was recorded. A stale
// recording (its producer's sources, the packages' versions or the case's
// inputs changed) fails, naming the rows and the command that re-records
// them; the documents must be what the recordings generate; the live subset
// (tests/accuracy_test, tests/deepspeed_agreement_test) must cover every
// mechanism of its suite.
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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

// README.md's "Supported model types" table counts, per model_type, the rows
// of each suite: the counts must be the matrices' own.
TEST_P(RecordingsTest, TheReadmeCountsTheRowsOfEachModelType) {
  const Suite suite = GetParam();
  const AccuracyOptions o = RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/types-" +
                                                    SuiteName(suite));
  std::map<std::string, int> rows;
  int index = 0;
  for (const AccuracyCase& c : SuiteMatrix(suite)) {
    auto plan = PlanCase(c, o, CaseDir(c, o, ++index));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ++rows[plan->model().model_type()];
  }
  auto readme = ReadFile("README.md");
  ASSERT_TRUE(readme.ok()) << readme.status();
  // | `llama` | Llama (...) | zrun rows | DeepSpeed rows | H100 rows |
  const int column = suite == Suite::kZrun ? 2 : 3;
  std::map<std::string, int> listed;
  for (absl::string_view line : absl::StrSplit(*readme, '\n')) {
    if (!absl::StartsWith(line, "| `")) continue;
    const std::vector<std::string> cells = absl::StrSplit(line.substr(2), " | ");
    int count = 0;
    if (cells.size() < 5 || !absl::SimpleAtoi(cells[column], &count)) continue;
    listed[std::string(absl::StripPrefix(absl::StripSuffix(cells[0], "`"), "`"))] = count;
  }
  for (const auto& [type, count] : rows) {
    auto it = listed.find(type);
    EXPECT_TRUE(it != listed.end() && it->second == count)
        << "README.md's supported model types: `" << type << "` has " << count << " " << SuiteName(suite)
        << " rows, the table says " << (it == listed.end() ? "nothing" : std::to_string(it->second));
  }
  for (const auto& [type, count] : listed) {
    EXPECT_TRUE(count == 0 || rows.count(type) > 0) << "README.md lists " << count << " " << SuiteName(suite)
                                                    << " rows of `" << type << "`, the suite has none";
  }
}

// An emulated rank ("<row>-emulated-<r>of<n>", one process on torch's fake
// process group) whose row also runs as a real world measured, when both
// were recorded, exactly what that world's rank r measured: component by
// component, byte for byte.
TEST_P(RecordingsTest, AnEmulatedRankMeasuresWhatItsRealRankMeasured) {
  const Suite suite = GetParam();
  std::set<std::string> names;
  for (const AccuracyCase& c : SuiteMatrix(suite)) names.insert(c.name);
  int twins = 0;
  for (const AccuracyCase& c : SuiteMatrix(suite)) {
    const size_t at = c.name.rfind("-emulated-");
    if (c.emulate_rank < 0 || at == std::string::npos || names.count(c.name.substr(0, at)) == 0) continue;
    ++twins;
    auto emulated = ReadRecording(RecordingPath(suite, c.name));
    auto real = ReadRecording(RecordingPath(suite, c.name.substr(0, at)));
    ASSERT_TRUE(emulated.ok()) << emulated.status();
    ASSERT_TRUE(real.ok()) << real.status();
    ASSERT_EQ(emulated->report().ranks_size(), 1) << c.name;
    const RankReport& e = emulated->report().ranks(0);
    EXPECT_EQ(emulated->report().backend(), "fake") << c.name;
    bool found = false;
    for (const RankReport& r : real->report().ranks()) {
      if (r.rank() != e.rank()) continue;
      found = true;
      EXPECT_EQ(e.measured_device().DebugString(), r.measured_device().DebugString())
          << c.name << " (emulated) against rank " << r.rank() << " of " << c.name.substr(0, at);
    }
    EXPECT_TRUE(found) << c.name << ": " << c.name.substr(0, at) << " has no rank " << e.rank();
  }
  if (suite == Suite::kDeepSpeed) EXPECT_GE(twins, 3) << "the DeepSpeed suite's emulated twins";
}

INSTANTIATE_TEST_SUITE_P(Suites, RecordingsTest, ::testing::Values(Suite::kZrun, Suite::kDeepSpeed),
                         [](const ::testing::TestParamInfo<Suite>& info) {
                           return std::string(info.param == Suite::kZrun ? "Zrun" : "DeepSpeed");
                         });

}  // namespace
}  // namespace zplan
