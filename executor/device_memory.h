// File: device_memory.h
// The device a rank trains on and its memory counters, one interface for
// CPU ranks (the counting allocator: exact tensor bytes) and CUDA ranks (the
// caching allocator's peak allocated / reserved, retries, OOMs, and
// device-wide used memory from cudaMemGetInfo). The only file of zrun that
// includes CUDA headers.
#ifndef ZPLAN_EXECUTOR_DEVICE_MEMORY_H_
#define ZPLAN_EXECUTOR_DEVICE_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include "absl/status/statusor.h"

namespace zplan {

struct DeviceMemorySample {
  int64_t allocated_bytes = 0;       // live tensor bytes
  int64_t peak_allocated_bytes = 0;  // since the last reset
  int64_t reserved_bytes = 0;        // CUDA: caching allocator segments
  int64_t peak_reserved_bytes = 0;
  int64_t device_used_bytes = 0;     // CUDA: total - free, whole device
  int64_t num_alloc_retries = 0;     // COUNT (CUDA)
  int64_t num_ooms = 0;              // COUNT (CUDA)
  int64_t pinned_bytes = 0;          // CUDA: page-locked host memory in use (offload)
};

// CPU, or cuda:local_rank % device_count when `cuda` is true (made current).
// kFailedPrecondition when CUDA is wanted but no device is visible.
absl::StatusOr<at::Device> SelectDevice(bool cuda, int local_rank);

// Number of visible CUDA devices (0 without CUDA).
int CudaDeviceCount();

std::string DeviceName(const at::Device& device);

// Ranks that share one GPU (Gloo, more local ranks than devices) each hold
// their planned peak, context included: kFailedPrecondition naming how many
// fit when `ranks_on_device` x `planned_bytes_per_rank` exceeds the device,
// instead of an out-of-memory error mid-step on one rank. CPU: always OK.
absl::Status CheckSharedDevice(const at::Device& device, int ranks_on_device, int64_t planned_bytes_per_rank);

// Whether `device` computes in bf16 (CPU: yes; CUDA: compute capability >= 8.0).
bool SupportsBf16(const at::Device& device);

// Returns once every copy and kernel enqueued so far on the device's current
// stream and its offload stream is done (CPU: at once): the host then reads
// what non_blocking copies wrote into pinned buffers (stage_1_and_2.py,
// _wait_for_offload_copies).
void WaitForDevice(const at::Device& device);

// While alive and `enabled`, CUDA work goes to the device's offload stream,
// ordered after everything the compute stream had enqueued: the reduction
// and the copies of offloaded gradients to pinned host memory then overlap
// the rest of backward (stage3.py, reduce_and_partition_stream). Device
// tensors that another stream allocated and the current one reads must be
// Retain-ed (record_stream), so that their blocks are not reused before the
// reads finish. CPU: does nothing.
class OffloadStreamScope {
 public:
  OffloadStreamScope(const at::Device& device, bool enabled);
  // Keeps `tensor`'s block from reuse until the current stream's work so far
  // is done (no-op on CPU, for undefined tensors and on the block's own stream).
  static void Retain(const at::Tensor& tensor);

 private:
  std::optional<c10::StreamGuard> guard_;
};

DeviceMemorySample SampleDeviceMemory(const at::Device& device);
// Peaks restart from what is live now; on CUDA the cached free segments
// (construction, warm-up) are returned to the driver first (emptyCache).
void ResetDevicePeak(const at::Device& device);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_DEVICE_MEMORY_H_
