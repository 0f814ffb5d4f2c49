// File: simulator.h
// Replays one training step of one rank as an ordered list of ALLOC/FREE
// events and reports the peak and the event that sets it.
//
// The step is the last micro-step of a gradient-accumulation window (the one
// that ends with the optimizer step): resident model states and buckets,
// forward block by block (stage-3 gathers and releases, checkpointed inputs or
// saved activations), loss (logits, fp32 upcast, log-softmax and gradient),
// backward block by block (recompute, gradient temporaries, weight gradients
// kept or moved into reduce buckets), embedding backward, the stage-0/1
// reduction bucket and the optimizer's fp32 upcast. Runtime and allocator
// band are added to the peak as in the closed form (memory_model.h), which
// this must agree with exactly; tests check that on many configurations.
//
// Example:
//   SimulatedStep step = SimulateStep(sizes);
//   step.peak.peak_bytes == ClosedFormDevicePeak(sizes).peak_bytes();
#ifndef ZPLAN_PLANNER_SIMULATOR_H_
#define ZPLAN_PLANNER_SIMULATOR_H_

#include <vector>

#include "planner/memory_model.h"
#include "proto/memory.pb.h"

namespace zplan {

struct SimulatedStep {
  std::vector<MemoryEvent> events;   // in order; live_bytes after each
  std::vector<int> event_handles;    // per event, the allocation it makes or frees
  MemoryBreakdown peak;              // live components at the peak + runtime + allocator
  int peak_event_index = -1;         // into events
};

// With record_events false only the peak is computed (no event list kept),
// which is what sweeps and max-batch searches need.
SimulatedStep SimulateStep(const StepSizes& sizes, bool record_events = true);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_SIMULATOR_H_
