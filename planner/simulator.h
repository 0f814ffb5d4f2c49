// File: simulator.h
// Expands one rank's step program (step_program.h) into its ordered ALLOC/FREE
// events and reports the peak and the event that sets it: the timeline, the
// allocator replay (allocator_replay.h) and the Perfetto trace read these.
// The peak is StepPeak's (step_program.h), which visits each group of
// identical blocks once; tests check the two agree on many configurations.
//
// Example:
//   SimulatedStep step = SimulateStep(sizes);
//   step.peak.peak_bytes() == StepPeakBytes(sizes);
#ifndef ZPLAN_PLANNER_SIMULATOR_H_
#define ZPLAN_PLANNER_SIMULATOR_H_

#include <vector>

#include "planner/memory_model.h"
#include "planner/step_program.h"
#include "proto/memory.pb.h"

namespace zplan {

struct SimulatedStep {
  std::vector<MemoryEvent> events;   // in order; live_bytes after each
  std::vector<int> event_handles;    // per event, the allocation it makes or frees
  MemoryBreakdown peak;              // live components at the peak + runtime + allocator
  int peak_event_index = -1;         // into events
};

// Every event of `program`, built from `sizes` (whose runtime and allocator
// bytes complete the peak). With record_events false only the peak is
// computed (no event list kept).
SimulatedStep ExpandStepProgram(const StepProgram& program, const StepSizes& sizes, bool record_events = true);

// ExpandStepProgram(BuildStepProgram(sizes), sizes, record_events).
SimulatedStep SimulateStep(const StepSizes& sizes, bool record_events = true);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_SIMULATOR_H_
