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
//   Stage3BlockGathers blocks;
//   SizeStage3Gathers(in, SavePolicyFor(config), &blocks, &sizes);
#ifndef ZPLAN_PLANNER_ZERO_GATHER_H_
#define ZPLAN_PLANNER_ZERO_GATHER_H_

#include <vector>

#include "planner/inventory.h"
#include "planner/step_sizes.h"
#include "planner/zero_partitioning.h"

namespace zplan {

// Per layer (bytes; empty below stage 3): what is gathered while the block
// computes -- its partitioned parameters and the next block's prefetched --
// and its partitioned parameters alone, what is kept when it is kept whole
// (StepSizes::BlockKind's gather and gather_kept).
// `held`: its expert banks, which the experts save as views (grouped_mm's
// transposed bank, the eager loop's selected experts; zero3_linear_wrap
// saves what F.linear is given), so a release (param.data = empty) leaves
// their storage alive until the block's backward has run, the backward's
// gather a second copy (a checkpointed block's forward saves nothing).
struct Stage3BlockGathers {
  std::vector<int64_t> gather;
  std::vector<int64_t> kept;
  std::vector<int64_t> held;
};

// `blocks`, and gather_kept_from / _partial, gather_held_partial, embed_kept, head_kept,
// embed_gather and head_gather; `saves` is what autograd keeps (SavePolicyFor).
void SizeStage3Gathers(const ZeroSizingInputs& in, const SavePolicy& saves, Stage3BlockGathers* blocks,
                       StepSizes* sizes);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_GATHER_H_
