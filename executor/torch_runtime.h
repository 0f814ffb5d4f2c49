// File: torch_runtime.h
// What LibTorch this binary runs on, and a self-check that LibTorch and the
// project's protobuf coexist in one process.
//
// libtorch_cpu.so embeds an old protobuf for ONNX (DESIGN §5). It must not
// capture our protobuf symbols: CheckTorchWithPlan parses a Plan with the
// system protobuf and then runs a tensor op shaped by it in the same process.
// It never touches a GPU unless one is visible and requested.
#ifndef ZPLAN_EXECUTOR_TORCH_RUNTIME_H_
#define ZPLAN_EXECUTOR_TORCH_RUNTIME_H_

#include <string>

#include "absl/status/statusor.h"

namespace zplan {

struct TorchRuntimeInfo {
  std::string torch_version;     // e.g. "2.11.0"
  bool cuda_available = false;   // a CUDA device is usable from this process
  int cuda_device_count = 0;
};

TorchRuntimeInfo DescribeTorchRuntime();

// Reads the plan at `plan_path`, builds a [seq, hidden] activation and a
// [hidden, hidden] weight from its model (capped to 64 x 256 elements) on the
// CPU, and returns the sum of activation @ weight computed by LibTorch.
// kInvalidArgument for an unreadable plan or one without a model.
absl::StatusOr<double> CheckTorchWithPlan(const std::string& plan_path);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_TORCH_RUNTIME_H_
