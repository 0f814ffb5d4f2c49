// File: gpu_catalog.h
// The GPU catalog (configs/gpus/catalog.textproto, compiled in): capacity and
// runtime constants per device kind.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(GpuSpec gpu, FindGpu("h100-80gb"));
#ifndef ZPLAN_PLANNER_GPU_CATALOG_H_
#define ZPLAN_PLANNER_GPU_CATALOG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/gpu.pb.h"

namespace zplan {

inline constexpr absl::string_view kDefaultGpu = "h100-80gb";
inline constexpr absl::string_view kCpuDevice = "cpu";

const GpuCatalog& GetGpuCatalog();

// kInvalidArgument naming --gpu and listing the catalog keys when unknown.
absl::StatusOr<GpuSpec> FindGpu(absl::string_view key);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_GPU_CATALOG_H_
