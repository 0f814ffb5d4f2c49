// The DeepSpeed suite's live subset: real DeepSpeed + transformers trained
// again on CPU ranks on every run (tests/live_check.h); every row is judged
// from its recording by tests/recordings_test.
#include "gtest/gtest.h"
#include "tests/live_check.h"

namespace zplan {
namespace {

TEST(DeepSpeedAgreementTest, LiveCasesMeasureTheirRecordings) {
  ExpectLiveCasesMeasureTheirRecordings(Suite::kDeepSpeed);
}

}  // namespace
}  // namespace zplan
