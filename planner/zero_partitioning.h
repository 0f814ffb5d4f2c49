// File: zero_partitioning.h
// ZeRO's partitioning of the model states for one rank, the sizes of what
// executor/zero_partitioning.cc allocates: the working-dtype parameters, the
// resident gradients, fp32 master weights and Adam's m and v per stage, with
// the padding of sharding.h (stages 1/2: one flat buffer split evenly;
// stage 3: ceil(numel / N) of every parameter, small ones kept whole), and
// the most tensor bytes a rank holds while the model is built (zero.Init at
// stage 3). One of the concerns StepSizer::Create (memory_model.h) is made
// of; the others are zero_buckets.h, zero_gather.h, zero_offload.h and
// zero_optimizer_step.h. Each Size* function fills its own StepSizes fields
// and nothing else, and never fails: what DeepSpeed refuses is refused
// before (zero_refusals.h).
//
// Example:
//   const ZeroSizingInputs in{model, config, params, trainable, w, owned, stage1_epilogue};
//   SizeModelStates(in, &sizes);  // params_resident, grads_resident, master_resident, ...
#ifndef ZPLAN_PLANNER_ZERO_PARTITIONING_H_
#define ZPLAN_PLANNER_ZERO_PARTITIONING_H_

#include <cstdint>
#include <vector>

#include "planner/inventory.h"
#include "planner/sharding.h"
#include "planner/step_sizes.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// Bytes per parameter of mixed-precision Adam beyond the working copy (ZeRO
// paper K = 12): fp32 master 4 + momentum 4 + variance 4.
inline constexpr int64_t kMasterBytesPerParam = 4;
inline constexpr int64_t kAdamStateBytesPerParam = 8;  // m + v, fp32
// DeepSpeed's CPU Adam keeps an fp32 gradient partition beside master, m, v.
inline constexpr int64_t kOffloadGradBytesPerParam = 4;

// Where the step's kernels run (CPU ranks or CUDA devices).
inline KernelDevice KernelDeviceOf(const StepSizes& s) {
  return s.cpu_ranks ? KernelDevice::kCpu : KernelDevice::kCuda;
}

// What every concern's sizing reads, worked out once by StepSizer::Create;
// the configuration fields of StepSizes (stage, world_size, offload_*,
// shards, ...) are set before any concern runs.
struct ZeroSizingInputs {
  const ModelSpec& model;
  const RunConfig& config;                   // resolved and validated
  const std::vector<TensorSpec>& params;     // ParameterInventory(model)
  const std::vector<TensorSpec>& trainable;  // TrainableParameters(params)
  int64_t w;                                 // bytes per working-dtype element
  int64_t adapter_w;                         // bytes per LoRA adapter element (SavePolicy.adapter_dtype)
  int64_t owned;                             // elements of the optimizer partition this rank owns
  bool stage1_epilogue;                      // stage 1 without overlap_comm: reduces after backward
};

// Resident parameters, gradients, master weights and Adam states
// (params_resident, grads_resident, master_resident, optimizer_resident).
void SizeModelStates(const ZeroSizingInputs& in, StepSizes* sizes);

// The most tensor bytes (device and host together) a rank holds while zrun
// builds its model and puts the parameters in place, before any optimizer
// state (executor/zero_partitioning.cc, PlaceParameters).
int64_t ConstructionPeakBytes(const std::vector<TensorSpec>& params, const ShardLayout& sh, const ZeroConfig& zero,
                              int stage, int64_t w, int64_t adapter_w, bool cpu_ranks);

// Stage 3: this rank's chunks of every parameter, in bytes (the LoRA
// adapters' at their own width).
int64_t Stage3ChunkBytes(const ShardLayout& sh, int64_t w, int64_t adapter_w);

// construction (ConstructionPeakBytes) and host_init_per_rank.
void SizeConstruction(const ZeroSizingInputs& in, StepSizes* sizes);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_PARTITIONING_H_
