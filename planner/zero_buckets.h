// File: zero_buckets.h
// ZeRO's gradient reduction for one rank, the sizes of what
// executor/zero_buckets.cc allocates: DeepSpeed's contiguous-gradients (IPG)
// reduce buckets (stages 1/2 per backward, two with overlap_comm; stage 3
// once), stage 0's flat reduce bucket, the backward part whose gradient hook
// brings the buckets, and per rank the stage-1/2 gradient partition
// (copy_grads_in_partition) with the moment it appears. One of StepSizer's
// concerns (zero_partitioning.h lists them); never fails.
//
// Example:
//   SizeReduceBuckets(in, &sizes);  // ipg_buckets, buckets_resident, reduce_temp, ipg_from, ...
//   SizeGradPartitions(in, sizes, &variants, &rank_variant);
#ifndef ZPLAN_PLANNER_ZERO_BUCKETS_H_
#define ZPLAN_PLANNER_ZERO_BUCKETS_H_

#include <cstdint>
#include <vector>

#include "planner/step_sizes.h"
#include "planner/zero_partitioning.h"

namespace zplan {

// What distinguishes one rank from another (stages 1/2): its gradient
// partition, when that appears, its fp64 norm copy, and with optimizer
// offload and accumulation its host gradient buffers (StepSizes fields of
// the same names).
struct RankVariant {
  int64_t grad_partition = 0;
  int grad_partition_from = StepSizes::kAtEpilogue;
  StepSizes::PartitionMoment grad_partition_moment = StepSizes::PartitionMoment::kBlockStart;
  int64_t step_norm_copy = 0;
  int64_t host_grad_accumulation = 0;
  int64_t host_grad_accumulation_pinned = 0;
  // ZeRO-1 with overlap_comm (StepSizes::BlockKind::retained_mlp): per
  // layer, the gradients of each half kept to the epilogue; the LM head's.
  std::vector<int64_t> retained_mlp, retained_attn;
  int64_t retained_head = 0;
  StepSizes::OffloadNormCopy offload_norm_copy;  // optimizer offload
  bool operator==(const RankVariant& o) const {
    return grad_partition == o.grad_partition && grad_partition_from == o.grad_partition_from &&
           grad_partition_moment == o.grad_partition_moment &&
           step_norm_copy == o.step_norm_copy && host_grad_accumulation == o.host_grad_accumulation &&
           host_grad_accumulation_pinned == o.host_grad_accumulation_pinned && retained_mlp == o.retained_mlp &&
           retained_attn == o.retained_attn && retained_head == o.retained_head &&
           offload_norm_copy == o.offload_norm_copy;
  }
};

// The reduce buckets (ipg_buckets or buckets_resident, buckets_touched,
// epilogue_moved_grads), stage 0's reduce_temp, and ipg_from /
// ipg_at_attention.
void SizeReduceBuckets(const ZeroSizingInputs& in, StepSizes* sizes);

// Stages 1/2 (and stage 2 with offload and accumulation): each rank's
// RankVariant; appends the distinct ones to `variants` and, per rank, its
// index there to `rank_variant`. Nothing at other stages.
void SizeGradPartitions(const ZeroSizingInputs& in, const StepSizes& s, std::vector<RankVariant>* variants,
                        std::vector<int>* rank_variant);

// BlockKind::down_weight_grad_waiting: down_proj's weight gradient of
// `down_weight_elements`, when larger than a bucket, waits whole for the next
// reduction (stage_1_and_2.py, extra_large_param_to_reduce); 0 otherwise.
int64_t DownWeightGradWaitingBytes(const ZeroSizingInputs& in, const StepSizes& s, int64_t down_weight_elements);

// Stage 3 (reduced in the gradient hooks): what a mixture of experts' MLP
// half holds at its reductions beyond what its gradient moments count, the
// largest over its reductions:
//   copy     at the one its largest gradient brings, an expert bank larger
//            than a bucket (StepSizer folds it into gate_up_proj's moment):
//            the copies and what else waits for it;
//   pending  at the one that runs once its expert nodes are done (the
//            router's hook, or a leaf module's end of backward), the bank's
//            gradients waiting whole for it and the copies
//            (StepSizes::BlockKind::mlp_reduce_pending).
// Dense halves' reductions run past their widest moment (not counted).
struct Stage3ExpertReductions {
  int64_t copy = 0;
  int64_t pending = 0;
  bool operator==(const Stage3ExpertReductions& o) const { return copy == o.copy && pending == o.pending; }
};
// Per step block (StepBlockOf); empty below stage 3.
std::vector<Stage3ExpertReductions> SizeStage3Reductions(const ZeroSizingInputs& in, const StepSizes& s);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_BUCKETS_H_
