#include "planner/zero_buckets.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "planner/block_layout.h"
#include "planner/units.h"

namespace zplan {
namespace {

// Per rank, the backward part (StepSizes::grad_partition_from) of the first
// stage-2 bucket reduction that carries one of its parameters
// (stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads: a
// gradient that would overflow a non-empty bucket reduces it first, one
// larger than the bucket fills it alone; the epilogue reduces the rest).
// Gradient hooks fire in reverse parameter order, a tied embedding's last.
// `gelu_mlp`: the MLP's widest moment comes before down_proj's hooks (a GELU
// MLP whose down_proj keeps its input: BlockBackwardTransientBytes), and
// there the partition misses down_proj's weight gradient if that went into
// the bucket; one larger than the bucket waits beside the partition through
// the activation's backward (StepSizes::block_down_weight_grad_waiting).
struct PartitionStart {
  int part = StepSizes::kAtEpilogue;
  bool at_attention = false;       // a block's attention half
  bool at_down_proj_hook = false;  // StepSizes::grad_partition_at_down_proj_hook
};
std::vector<PartitionStart> FirstReductionPartByRank(const std::vector<BlockOp>& layout,
                                                     const std::vector<TensorSpec>& params,
                                                     const std::vector<FlatPartition>& partitions, int num_layers,
                                                     int64_t bucket_elements, bool gelu_mlp) {
  std::vector<PartitionStart> from(partitions.size());
  std::vector<bool> seen(partitions.size(), false);
  // A reduction of the bucket holding parameters [lo, hi] at parameter i's
  // hook. The step program's moment of an attention half is its first
  // gradient's (the widest point), so a partition made at a later hook of
  // the half counts from the next half; an MLP half's comes after
  // down_proj's hooks (BlockBackwardTransientBytes), which count for it.
  auto reduce = [&](int lo, int hi, int i) {
    const TensorSpec& t = params[i];
    PartitionStart start;
    start.part = t.layer() >= 0 ? t.layer() : t.name().rfind("embed", 0) == 0 ? -1 : num_layers;
    start.at_attention = t.layer() >= 0 && !InMlpHalf(layout, t);
    start.at_down_proj_hook = gelu_mlp && IsDownProjTensor(layout, t);
    const bool first_of_half = i + 1 == static_cast<int>(params.size()) || params[i + 1].layer() != t.layer() ||
                               InMlpHalf(layout, params[i + 1]) != InMlpHalf(layout, t);
    const bool before_moment = first_of_half || IsDownProjTensor(layout, t);
    if (t.layer() >= 0 && !before_moment) {
      if (!start.at_attention) {
        start.at_attention = true;
      } else {
        start.part = t.layer() - 1;  // the previous block's MLP half, or the embedding (-1)
        start.at_attention = false;
      }
    }
    for (size_t r = 0; r < partitions.size(); ++r) {
      const FlatPartition& p = partitions[r];
      if (!seen[r] && p.first_param >= 0 && p.first_param <= hi && p.last_param >= lo) {
        seen[r] = true;
        from[r] = start;
      }
    }
  };
  int64_t fill = 0;
  int hi = static_cast<int>(params.size()) - 1;
  for (int i = hi; i >= 0; --i) {
    const int64_t numel = NumElements(params[i]);
    if (fill > 0 && fill + numel > bucket_elements) {
      reduce(i + 1, hi, i);
      fill = 0;
      hi = i;
    }
    fill += numel;
  }
  return from;  // the rest: at the epilogue
}

}  // namespace

void SizeReduceBuckets(const ZeroSizingInputs& in, StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ZeroConfig& zero = in.config.zero();
  const std::vector<TensorSpec>& trainable = in.trainable;
  const int64_t w = in.w;
  const int64_t trained = s.shards.trainable_elements;
  const bool stage1_epilogue = in.stage1_epilogue;
  // DeepSpeed's contiguous-gradients reduce buckets: made per backward at
  // stages 1/2 (stage_1_and_2.py, setup_buckets; a second one with
  // overlap_comm), at initialize at stage 3, one per gradient dtype
  // (stage3.py, DeepSpeedZeroOptimizer_Stage3.__init__: ipg_buckets).
  if (s.stage >= 1 && zero.contiguous_gradients()) {
    const int64_t buckets = zero.overlap_comm() && s.stage < 3 ? 2 : 1;
    (s.stage == 3 ? s.buckets_resident : s.ipg_buckets) = zero.reduce_bucket_elements() * w * buckets;
    s.buckets_touched = std::min(zero.reduce_bucket_elements(), trained) * w * buckets;
    if (stage1_epilogue) {
      // The gradients that fill the bucket before the first reduction
      // (reduce_independent_p_g_buckets_and_remove_grads reduces when the
      // next one would overflow it).
      int64_t moved = 0;
      for (const TensorSpec& t : trainable) {
        if (moved + NumElements(t) > zero.reduce_bucket_elements()) break;
        moved += NumElements(t);
      }
      s.epilogue_moved_grads = moved * w;
    }
  }
  // Stage 0 reduces gradients after backward through one flat bucket.
  if (s.stage == 0) s.reduce_temp = std::min(zero.reduce_bucket_elements(), trained) * w;

  // The first gradient of backward (hooks fire in reverse parameter order, a
  // tied embedding's last) brings the IPG buckets.
  if (!trainable.empty()) {
    const TensorSpec& first = trainable.back();
    s.ipg_from = first.layer() >= 0                          ? first.layer()
                 : absl::StartsWith(first.name(), "lm_head") || absl::StartsWith(first.name(), "classifier")
                     ? s.kHeadPart()
                 : absl::StartsWith(first.name(), "final_norm") ? s.num_layers
                                                                : -1;
    s.ipg_at_attention = first.layer() >= 0 && !InMlpHalf(BlockLayout(in.model), first);
  }
}

void SizeGradPartitions(const ZeroSizingInputs& in, const StepSizes& s, std::vector<RankVariant>* variants_out,
                        std::vector<int>* rank_variant_out) {
  std::vector<RankVariant>& variants = *variants_out;
  std::vector<int>& rank_variant = *rank_variant_out;
  const ModelSpec& model = in.model;
  const ZeroConfig& zero = in.config.zero();
  const std::vector<TensorSpec>& trainable = in.trainable;
  const int64_t w = in.w;
  const bool stage1_epilogue = in.stage1_epilogue;
  const bool host_accumulation = s.stage == 2 && s.offload_optimizer && s.grad_accum > 1;
  if (((s.stage == 1 || s.stage == 2) && !s.offload_optimizer) || host_accumulation) {
    const std::vector<FlatPartition> partitions = FlatPartitionsByRank(trainable, s.world_size);
    std::vector<PartitionStart> from(partitions.size());
    if (s.stage == 2 && s.grad_accum > 1) {
      from.assign(partitions.size(), PartitionStart{s.kBeforeForward()});
    } else if (stage1_epilogue) {
      from.assign(partitions.size(), PartitionStart{StepSizes::kAtEpilogue});
    } else {
      // Every down_proj keeps its input unless LoRA freezes it.
      from = FirstReductionPartByRank(BlockLayout(model), trainable, partitions, s.num_layers,
                                      zero.reduce_bucket_elements(), model.ffn_type() == FFN_GELU && !model.has_lora());
    }
    for (size_t r = 0; r < partitions.size(); ++r) {
      RankVariant v;
      if (host_accumulation) {
        // One host buffer per parameter, pinned as its own block (memory_model.h).
        for (int i = partitions[r].first_param; i >= 0 && i <= partitions[r].last_param; ++i) {
          const int64_t bytes = NumElements(trainable[i]) * w;
          v.host_grad_accumulation += bytes;
          if (s.pin_memory && !s.cpu_ranks) v.host_grad_accumulation_pinned += RoundUpToPowerOfTwo(bytes);
        }
      } else {
        v.grad_partition = partitions[r].params_elements * w;
        v.grad_partition_from = from[r].part;
        v.grad_partition_at_attention = from[r].at_attention;
        v.grad_partition_at_down_proj_hook = from[r].at_down_proj_hook;
        v.step_norm_copy = partitions[r].max_piece_elements * 8;  // get_norm_dtype(): fp64
      }
      auto it = std::find(variants.begin(), variants.end(), v);
      rank_variant.push_back(static_cast<int>(it - variants.begin()));
      if (it == variants.end()) variants.push_back(v);
    }
  }
}

void SizeDownWeightGradWaiting(const ZeroSizingInputs& in, int64_t down_weight_elements, StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ZeroConfig& zero = in.config.zero();
  const int64_t w = in.w;
  const bool stage1_epilogue = in.stage1_epilogue;
  const bool reduced_in_hooks = (s.stage == 1 || s.stage == 2) && !stage1_epilogue;
  if (reduced_in_hooks && zero.contiguous_gradients() && down_weight_elements > zero.reduce_bucket_elements()) {
    s.block_down_weight_grad_waiting = down_weight_elements * w;
  }
}

}  // namespace zplan
