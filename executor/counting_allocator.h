// File: counting_allocator.h
// A c10 CPU allocator that counts the bytes of every live CPU tensor, so zrun
// measures exactly what the planner predicts on CPU ranks (DESIGN §4), and
// attributes them to the planner's components (proto/memory.proto).
//
// InstallCountingCpuAllocator() wraps the current default CPU allocator and
// must run before the first tensor is created; tensors that existed before
// keep their old deleters and are not counted. Pinned memory, Gloo's internal
// buffers and BLAS workspaces do not go through it. Thread-safe. Freed large
// blocks are reused for an allocation of at least half their size while the
// blocks under live tensors plus the kept ones stay within the live
// high-water mark plus 64 MiB (CpuMemoryStats::kept_bytes).
//
// Attribution: an allocation takes its thread's current tag (SetMemoryTag /
// ScopedMemoryTag; TEMPORARIES when none is set) and may be retagged later
// (TagAllocation, e.g. a weight gradient the engine keeps). Inside a part's
// forward the tag is "pending" (BeginForwardPart): SettleForwardPart() then
// makes what survived the part ACTIVATIONS (saved for backward) and what was
// freed meanwhile TEMPORARIES — also in the peak's breakdown, when the peak
// fell inside that part. The peak breakdown is taken at the moment of the
// peak, so its components sum to peak_bytes.
//
// Example:
//   InstallCountingCpuAllocator();
//   ResetCpuPeak();  ...  CpuMemoryStats stats = GetCpuMemoryStats();
//   MemoryBreakdown at_peak = GetCpuPeakBreakdown();
#ifndef ZPLAN_EXECUTOR_COUNTING_ALLOCATOR_H_
#define ZPLAN_EXECUTOR_COUNTING_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "proto/memory.pb.h"

namespace zplan {

struct CpuMemoryStats {
  int64_t current_bytes = 0;     // live tensor bytes now
  int64_t peak_bytes = 0;        // max of current since the last reset
  int64_t allocations = 0;       // COUNT since install
  // Freed blocks of 1 MiB or more kept for a later allocation; resident, so
  // live blocks + kept never exceed the largest live total so far + 64 MiB.
  int64_t kept_bytes = 0;
};

// Idempotent; returns false if it could not be installed (then stats stay 0).
bool InstallCountingCpuAllocator();
CpuMemoryStats GetCpuMemoryStats();
// Sets the peak (and its breakdown) to what is live now.
void ResetCpuPeak();
// Live bytes per component at the peak since the last reset; peak_bytes is the sum.
MemoryBreakdown GetCpuPeakBreakdown();

// The calling thread's tag for new allocations.
void SetMemoryTag(Component component);
void BeginForwardPart();
// Resolves the pending allocations (see above); later ones take `next`.
void SettleForwardPart(Component next);
// Retags a live allocation by its data pointer; unknown pointers are ignored.
void TagAllocation(const void* data, Component component);

// The allocation log: while enabled, every allocation and release of a
// counted tensor is appended (bytes negative for a release), so a step's
// timeline can be read back event by event, e.g. to compare a framework's
// buffers and lifetimes with the planner's simulated step.
struct AllocationEvent {
  int64_t bytes = 0;        // > 0 allocation, < 0 release
  int tag = 0;              // the allocation's tag (Component, or pending)
  int64_t live_bytes = 0;   // live tensor bytes after the event
};
void EnableAllocationLog(bool enabled);
// Events since the last call (or since the log was enabled); clears them.
std::vector<AllocationEvent> TakeAllocationLog();

// Sets the thread's tag for a scope and restores the previous one.
class ScopedMemoryTag {
 public:
  explicit ScopedMemoryTag(Component component);
  ~ScopedMemoryTag();
  ScopedMemoryTag(const ScopedMemoryTag&) = delete;
  ScopedMemoryTag& operator=(const ScopedMemoryTag&) = delete;

 private:
  int previous_;
};

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_COUNTING_ALLOCATOR_H_
