// File: zero_optimizer_step.h
// The optimizer step's temporaries for one rank, the sizes of what
// executor/zero_optimizer_step.cc allocates: stages 1/2 flatten the gradient
// partition and upcast it to fp32 (stage_1_and_2.py, step), stage 3 upcasts
// one sub_group_size chunk at a time, stage 0 flattens every gradient
// (FP16_Optimizer) or steps each parameter (StepsEachParameter), and the Adam
// implementation's fp32 temporaries (torch's for-loop and foreach paths;
// none for the fused kernels). The fp64 norm
// copies are per rank (zero_buckets.h, RankVariant). One of StepSizer's
// concerns (zero_partitioning.h lists them); never fails.
//
// Example:
//   SizeOptimizerStep(in, &sizes);  // step_upcast, step_flat_grads, step_optimizer_temps, ...
#ifndef ZPLAN_PLANNER_ZERO_OPTIMIZER_STEP_H_
#define ZPLAN_PLANNER_ZERO_OPTIMIZER_STEP_H_

#include "planner/step_sizes.h"
#include "planner/zero_partitioning.h"

namespace zplan {

// step_flat_grads, step_fp32_grads, step_upcast, step_grad_copies and
// step_optimizer_temps (nothing on the device with optimizer offload).
void SizeOptimizerStep(const ZeroSizingInputs& in, StepSizes* sizes);

// Whether the optimizer steps each parameter on its own, as at stage 0
// outside FP16_Optimizer: fp32 (engine.py, _take_model_step), or a torch
// optimizer in mixed precision (runtime/fp16/unfused_optimizer.py,
// FP16_UnfusedOptimizer). zrun's engine steps the same way.
bool StepsEachParameter(const RunConfig& config);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_OPTIMIZER_STEP_H_
