// File: zero_gather.h
// ZeRO-3's parameter gathers for one rank, the sizes of what the gather
// coordinator in executor/zero_gather.cc holds: a block gathered with the
// next one prefetched while fewer than min(stage3_prefetch_bucket_size,
// stage3_max_live_parameters - gathered) elements are in flight, what
// DeepSpeed keeps gathered from forward to backward (reuse distance,
// sharding.h Stage3Retention), and the embedding and head gathered. One of
// StepSizer's concerns (zero_partitioning.h lists them); sets nothing below
// stage 3 or on one rank; never fails.
//
// Example:
//   SizeStage3Gathers(in, BlockParameters(model, 0), SavePolicyFor(config), &sizes);
#ifndef ZPLAN_PLANNER_ZERO_GATHER_H_
#define ZPLAN_PLANNER_ZERO_GATHER_H_

#include <vector>

#include "planner/inventory.h"
#include "planner/step_sizes.h"
#include "planner/zero_partitioning.h"

namespace zplan {

// block_gather, gather_kept_from / _block / _partial, embed_kept, head_kept,
// embed_gather and head_gather. `block_params` are one block's parameters
// (BlockParameters(model, 0)); `saves` what autograd keeps (SavePolicyFor).
void SizeStage3Gathers(const ZeroSizingInputs& in, const std::vector<TensorSpec>& block_params,
                       const SavePolicy& saves, StepSizes* sizes);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_GATHER_H_
