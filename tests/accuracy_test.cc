// The zrun suite's live subset: planner vs executor, trained again on every
// run (tests/live_check.h); every row is judged from its recording by
// tests/recordings_test.
#include "gtest/gtest.h"
#include "tests/live_check.h"

namespace zplan {
namespace {

TEST(AccuracyTest, LiveCasesMeasureTheirRecordings) { ExpectLiveCasesMeasureTheirRecordings(Suite::kZrun); }

}  // namespace
}  // namespace zplan
