// File: profiling.h
// Where a step's time and a GPU's memory go, written as the files PyTorch's
// own tools read (torchtitan's --profiling.enable_profiling and
// --profiling.enable_memory_snapshot do the same for Python runs).
//
//   * StepTrace: one optimizer step recorded with Kineto (CPU operators and,
//     on CUDA, every kernel through CUPTI), saved as a Chrome trace
//     (chrome://tracing, ui.perfetto.dev), and summed up in a few lines:
//     wall time, GPU busy time, the kernels and operators that took most.
//   * MemoryHistory: on CUDA, the caching allocator's history of
//     allocations, frees and segments, saved as the pickled snapshot that
//     pytorch.org/memory_viz reads (torch.cuda.memory._dump_snapshot).
//
// Both write to a temp file and rename it, so a crash leaves no half file
// (the trace through its own rename: Kineto writes the file itself).
//
// Example:
//   StepTrace trace;
//   trace.Start(device);
//   ... one step ...
//   ZPLAN_ASSIGN_OR_RETURN(std::string summary, trace.Finish(dir + "/rank-0.trace.json"));
#ifndef ZPLAN_EXECUTOR_PROFILING_H_
#define ZPLAN_EXECUTOR_PROFILING_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zplan {

class StepTrace {
 public:
  // Starts recording (CPU operators; CUDA kernels too on a CUDA device).
  void Start(const at::Device& device);
  // Stops, writes the trace to `path` and returns the summary. The device
  // is synchronized first, so the step's kernels are all in it.
  absl::StatusOr<std::string> Finish(const std::string& path);

 private:
  bool running_ = false;
  at::Device device_ = at::kCPU;
  int64_t started_ns_ = 0;
};

// Starts recording the CUDA caching allocator's events (no-op on CPU).
void StartMemoryHistory(const at::Device& device);
// Writes the recorded history and the current segments to `path`
// (kFailedPrecondition on CPU, where there is no caching allocator).
absl::Status WriteMemorySnapshot(const at::Device& device, const std::string& path);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_PROFILING_H_
