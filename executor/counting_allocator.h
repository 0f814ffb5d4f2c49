// File: counting_allocator.h
// A c10 CPU allocator that counts the bytes of every live CPU tensor, so zrun
// measures exactly what the planner predicts on CPU ranks (DESIGN §4).
//
// InstallCountingCpuAllocator() wraps the current default CPU allocator and
// must run before the first tensor is created; tensors that existed before
// keep their old deleters and are not counted. Pinned memory, Gloo's internal
// buffers and BLAS workspaces do not go through it. Thread-safe.
//
// Example:
//   InstallCountingCpuAllocator();
//   ResetCpuPeak();  ...  CpuMemoryStats stats = GetCpuMemoryStats();
#ifndef ZPLAN_EXECUTOR_COUNTING_ALLOCATOR_H_
#define ZPLAN_EXECUTOR_COUNTING_ALLOCATOR_H_

#include <cstdint>

namespace zplan {

struct CpuMemoryStats {
  int64_t current_bytes = 0;     // live tensor bytes now
  int64_t peak_bytes = 0;        // max of current since the last reset
  int64_t allocations = 0;       // COUNT since install
};

// Idempotent; returns false if it could not be installed (then stats stay 0).
bool InstallCountingCpuAllocator();
CpuMemoryStats GetCpuMemoryStats();
// Sets the peak to the current live bytes.
void ResetCpuPeak();

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_COUNTING_ALLOCATOR_H_
