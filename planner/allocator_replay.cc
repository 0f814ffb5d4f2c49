#include "planner/allocator_replay.h"

#include <algorithm>
#include <unordered_map>

#include "planner/caching_allocator.h"
#include "planner/simulator.h"
#include "planner/status_macros.h"
#include "planner/step_program.h"

namespace zplan {

int64_t ReplayedPeakReservedBytes(const StepSizes& sizes) {
  if (sizes.cpu_ranks) return 0;
  const SimulatedStep step = SimulateStep(sizes);
  CachingAllocatorModel allocator;
  std::unordered_map<int, int64_t> address_of;  // simulator handle -> block
  int64_t peak_reserved = 0;
  for (int replay = 0; replay <= kMeasuredSteps; ++replay) {
    for (size_t i = 0; i < step.events.size(); ++i) {
      const MemoryEvent& event = step.events[i];
      const int handle = step.event_handles[i];
      if (event.kind() == MemoryEvent::ALLOC) {
        // Resident state is allocated once; what the step freed comes back.
        if (event.phase() == PHASE_INIT && address_of.count(handle) > 0) continue;
        address_of[handle] = allocator.Allocate(event.bytes(), /*stream=*/0).address;
      } else {
        ZPLAN_CHECK(allocator.Free(address_of.at(handle)));
        address_of.erase(handle);
      }
      if (replay > 0) peak_reserved = std::max(peak_reserved, allocator.reserved_bytes());
    }
    if (replay == 0) allocator.ReleaseCached();  // zrun's ResetDevicePeak after the warm-up
  }
  return peak_reserved;
}

StepSizes WithAllocatorCache(StepSizes sizes) {
  sizes.allocator_cached = 0;
  const int64_t tensors = StepPeakBytes(sizes) - sizes.runtime;
  sizes.allocator_cached = std::max<int64_t>(0, ReplayedPeakReservedBytes(sizes) - tensors);
  return sizes;
}

int64_t OffloadWaitRiskBytes(const StepSizes& sizes) {
  if (sizes.cpu_ranks || !(sizes.offload_optimizer || sizes.offload_param)) return 0;
  int64_t largest = 0;
  for (const MemoryEvent& event : SimulateStep(sizes).events) largest = std::max(largest, event.bytes());
  return CachingAllocatorModel::SegmentSizeFor(CachingAllocatorModel::RoundSize(largest));
}

}  // namespace zplan
