// File: allocator_replay.h
// What PyTorch's CUDA caching allocator reserves beyond the live tensors at
// a planned step's peak: the simulator's events (simulator.h) replayed
// through the allocator's rules (caching_allocator.h). Reserved, not
// allocated, memory is what a GPU runs out of: logits-sized segments split
// by smaller requests make the next step's logits map new segments.
//
// The replay runs as zrun measures (executor/trainer.cc): one warm-up step,
// emptyCache (ResetDevicePeak), then kMeasuredSteps steps whose peak
// reserved is the prediction. Each step replays the simulated one (the last
// micro-step, simulator.h); resident allocations made at its start stay,
// and those the step frees (stage-0 gradients set to None) come back at the
// next. Every request is on the default stream, and a freed block returns
// at once.
//
// Not modelled: with offload, gradients read by the offload stream come back
// only when that stream's copies end (record_stream), so their blocks are
// missing from the pool for a while. How long depends on the device's
// timing; on an H100 that cost seed 000's plan at micro-batch 2 one more
// segment of its largest request (docs/gpu_validation.md), and the plan
// reports that segment as a risk (OffloadWaitRiskBytes), not in the peak.
//
// Example:
//   StepSizes sizes = WithAllocatorCache(sizer.For(micro_batch, seq));
//   StepPeak(sizes).allocator_bytes();  // reserved - tensors at the peak
#ifndef ZPLAN_PLANNER_ALLOCATOR_REPLAY_H_
#define ZPLAN_PLANNER_ALLOCATOR_REPLAY_H_

#include <cstdint>

#include "planner/memory_model.h"

namespace zplan {

// Steps replayed after the warm-up; one more changed no prediction over
// the H100 matrix's 13 plans (docs/gpu_validation.md).
inline constexpr int kMeasuredSteps = 2;

// The caching allocator's peak reserved bytes over the measured steps; 0 on
// CPU ranks (no caching allocator).
int64_t ReplayedPeakReservedBytes(const StepSizes& sizes);

// `sizes` with allocator_cached set: the replayed peak reserved minus the
// tensor bytes at the step's peak, never negative; 0 on CPU ranks.
StepSizes WithAllocatorCache(StepSizes sizes);

// With offload, the bytes one more segment of the step's largest request
// would add (see above); 0 without offload or on CPU ranks.
int64_t OffloadWaitRiskBytes(const StepSizes& sizes);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ALLOCATOR_REPLAY_H_
