#include "executor/device_memory.h"

#include <map>
#include <mutex>

#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "executor/counting_allocator.h"
#include "planner/units.h"

namespace zplan {
namespace {

constexpr size_t kAggregate = 0;  // StatType::AGGREGATE

// One offload stream per device for the process's life (the pool hands out
// streams round robin, so it is asked once).
c10::Stream OffloadStream(c10::DeviceIndex index) {
  static std::mutex mu;
  static std::map<c10::DeviceIndex, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(index);
  if (it == streams.end()) it = streams.emplace(index, c10::cuda::getStreamFromPool(false, index).unwrap()).first;
  return it->second;
}

}  // namespace

int CudaDeviceCount() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

absl::StatusOr<at::Device> SelectDevice(bool cuda, int local_rank) {
  if (!cuda) return at::Device(at::kCPU);
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "the plan targets a GPU but no CUDA device is visible; plan with --gpu cpu to run on CPU ranks");
  }
  const auto index = static_cast<c10::DeviceIndex>(local_rank % count);
  c10::cuda::set_device(index);
  return at::Device(at::kCUDA, index);
}

std::string DeviceName(const at::Device& device) {
  if (!device.is_cuda()) return "cpu";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess) return "cuda";
  return prop.name;
}

absl::Status CheckSharedDevice(const at::Device& device, int ranks_on_device, int64_t planned_bytes_per_rank) {
  if (!device.is_cuda() || ranks_on_device <= 1 || planned_bytes_per_rank <= 0) return absl::OkStatus();
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return absl::OkStatus();
  const int64_t total = static_cast<int64_t>(total_bytes);
  if (static_cast<double>(ranks_on_device) * planned_bytes_per_rank <= total) return absl::OkStatus();
  const int64_t fit = total / planned_bytes_per_rank;
  return absl::FailedPreconditionError(absl::StrCat(
      ranks_on_device, " ranks share cuda:", device.index(), " (", DeviceName(device), ", ", FormatBytes(total),
      ") and each is planned at ", FormatBytes(planned_bytes_per_rank), ": ",
      FormatBytes(ranks_on_device * planned_bytes_per_rank), " in all does not fit; run at most ", fit,
      " rank(s) per GPU (zplan --gpus), or plan a smaller --micro-batch or --seq"));
}

bool SupportsBf16(const at::Device& device) {
  if (!device.is_cuda()) return true;
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess && prop.major >= 8;
}

void WaitForDevice(const at::Device& device) {
  if (!device.is_cuda()) return;
  c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
  OffloadStream(device.index()).synchronize();
}

OffloadStreamScope::OffloadStreamScope(const at::Device& device, bool enabled) {
  if (!enabled || !device.is_cuda()) return;
  const c10::Stream side = OffloadStream(device.index());
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(c10::cuda::getCurrentCUDAStream(device.index()).unwrap());
  ready.block(side);
  guard_.emplace(side);
}

void OffloadStreamScope::Retain(const at::Tensor& tensor) {
  if (tensor.defined() && tensor.is_cuda()) tensor.record_stream(c10::cuda::getCurrentCUDAStream(tensor.device().index()));
}

DeviceMemorySample SampleDeviceMemory(const at::Device& device) {
  DeviceMemorySample s;
  if (!device.is_cuda()) {
    const CpuMemoryStats cpu = GetCpuMemoryStats();
    s.allocated_bytes = cpu.current_bytes;
    s.peak_allocated_bytes = cpu.peak_bytes;
    return s;
  }
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  s.allocated_bytes = stats.allocated_bytes[kAggregate].current;
  s.peak_allocated_bytes = stats.allocated_bytes[kAggregate].peak;
  s.reserved_bytes = stats.reserved_bytes[kAggregate].current;
  s.peak_reserved_bytes = stats.reserved_bytes[kAggregate].peak;
  s.num_alloc_retries = stats.num_alloc_retries;
  s.num_ooms = stats.num_ooms;
  s.pinned_bytes = at::getHostAllocator(at::kCUDA)->get_stats().allocated_bytes.current;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    s.device_used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
  }
  return s;
}

void ResetDevicePeak(const at::Device& device) {
  if (device.is_cuda()) {
    // Segments freed since construction go back to the driver first, so the
    // reserved peak measures the steady state, not the model's construction.
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  } else {
    ResetCpuPeak();
  }
}

}  // namespace zplan
