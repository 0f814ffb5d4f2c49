#include "executor/torch_runtime.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "planner/proto_io.h"
#include "proto/plan.pb.h"

namespace zplan {

TorchRuntimeInfo DescribeTorchRuntime() {
  TorchRuntimeInfo info;
  info.torch_version = TORCH_VERSION;
  info.cuda_available = torch::cuda::is_available();
  info.cuda_device_count = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
  return info;
}

absl::StatusOr<double> CheckTorchWithPlan(const std::string& plan_path) {
  Plan plan;
  absl::Status status = ReadProtoFile(plan_path, &plan);
  if (!status.ok()) return status;
  if (plan.model().hidden_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(plan_path, ": model.hidden_size must be > 0 (write the plan with zplan --out)"));
  }
  const int64_t hidden = std::min<int64_t>(plan.model().hidden_size(), 256);
  const int64_t rows = std::min<int64_t>(std::max<int64_t>(plan.config().seq_length(), 1), 64);
  at::Tensor x = at::ones({rows, hidden}, at::kFloat);
  at::Tensor w = at::full({hidden, hidden}, 0.5, at::kFloat);
  return at::matmul(x, w).sum().item<double>();
}

}  // namespace zplan
