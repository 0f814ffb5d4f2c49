// File: zero_offload.h
// ZeRO-Offload for one rank, the sizes of what executor/zero_offload.cc and
// the engine's offload buffers hold: with offload_optimizer the fp32 master,
// Adam states and gradients on the host (stage 3 also its working-dtype
// gradient partition), with offload_param the parameter shard on the host,
// stages 1/2's staging buffers (temp_grad_buffer_for_gpu_offload and its
// host twin, the bit16 partition copy), and which host buffers DeepSpeed
// pins, each rounded up to a power of two. One of StepSizer's concerns
// (zero_partitioning.h lists them); never fails.
//
// Example:
//   SizeOffload(in, &sizes);  // host_master, host_optimizer, host_grads, host_pinned, ...
#ifndef ZPLAN_PLANNER_ZERO_OFFLOAD_H_
#define ZPLAN_PLANNER_ZERO_OFFLOAD_H_

#include "planner/step_sizes.h"
#include "planner/zero_partitioning.h"

namespace zplan {

// host_master, host_optimizer, host_grads, host_params,
// offload_staging_resident, host_offload_staging, host_pinned and
// host_pinned_rounding.
void SizeOffload(const ZeroSizingInputs& in, StepSizes* sizes);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_OFFLOAD_H_
