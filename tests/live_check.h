// File: live_check.h
// The live half of "measure once, judge every time" (tools/recordings.h): the
// suite's LiveCases are planned, trained again (zrun or real DeepSpeed on CPU
// ranks) and must measure what their recordings say: every rank's device peak
// to the byte, its components within kComponentSplitTolerance of the peak
// (how a peak splits depends a little on the CPU's kernels), and the goals.
// So a recording cannot drift from what its producer does today.
#ifndef ZPLAN_TESTS_LIVE_CHECK_H_
#define ZPLAN_TESTS_LIVE_CHECK_H_

#include "tools/recordings.h"

namespace zplan {

// Runs the live subset of `suite` with gtest expectations.
void ExpectLiveCasesMeasureTheirRecordings(Suite suite);

}  // namespace zplan

#endif  // ZPLAN_TESTS_LIVE_CHECK_H_
