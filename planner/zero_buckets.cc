#include "planner/zero_buckets.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "planner/block_layout.h"
#include "planner/inventory.h"
#include "planner/units.h"
#include "planner/vision_tower.h"

namespace zplan {
namespace {

// The backward part whose hooks make a vision-language model's gradient
// outside the blocks: the projector's at the start of the last tower block
// with a gradient (its backward runs right before), the tower embeddings'
// with the embedding (-1: after the tower's first block); `otherwise` for
// the language model's. Approximation: hooks are taken in reverse
// parameter order, which puts the token embedding's before the projector's;
// it comes last.
int GradientPartOf(const ModelSpec& model, const TensorSpec& t, int otherwise) {
  if (t.part() == PART_PROJECTOR) return TowerBlocksWithGradient(model.vision_language()) - 1;
  if (t.part() == PART_VISION_TOWER) return -1;
  return otherwise;
}

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
// the activation's backward (StepSizes::block_down_weight_grad_waiting). So
// does a mixture of experts' (its pairs' first gradients come before the
// experts' down_proj gradient).
struct PartitionStart {
  int part = StepSizes::kAtEpilogue;
  StepSizes::PartitionMoment moment = StepSizes::PartitionMoment::kBlockStart;
};
// With optimizer offload, each rank's reduction whose fp64 norm copy of a
// piece of one parameter stands highest above what is gone by then
// (StepSizes::OffloadNormCopy), among the reductions noted.
class LargestPieces {
 public:
  LargestPieces(const std::vector<TensorSpec>& params, int64_t world) : begin_(params.size() + 1, 0), by_rank_(world) {
    for (size_t j = 0; j < params.size(); ++j) begin_[j + 1] = begin_[j] + NumElements(params[j]);
    shard_ = FlatShardElements(begin_.back(), world);
  }
  // A reduction of the bucket holding parameters [lo, hi] (seen by `rank` alone when >= 0).
  void Note(int lo, int hi, const StepSizes::OffloadNormCopy& moment, int64_t rank = -1) {
    for (int64_t r = 0; r < static_cast<int64_t>(by_rank_.size()); ++r) {
      if (rank >= 0 && r != rank) continue;
      for (int j = lo; j <= hi; ++j) {
        const int64_t copy = (std::min(begin_[j + 1], (r + 1) * shard_) - std::max(begin_[j], r * shard_)) * 8;
        const StepSizes::OffloadNormCopy& best = by_rank_[r];
        // The highest moment: the copy (get_norm_dtype(): fp64) less what is gone by then.
        if (copy > 0 && (best.bytes == 0 || copy - moment.gone_bytes > best.bytes - best.gone_bytes)) {
          by_rank_[r] = moment;
          by_rank_[r].bytes = copy;
        }
      }
    }
  }
  const std::vector<StepSizes::OffloadNormCopy>& by_rank() const { return by_rank_; }

 private:
  std::vector<int64_t> begin_;  // each parameter's flat offset
  int64_t shard_ = 0;
  std::vector<StepSizes::OffloadNormCopy> by_rank_;
};
// Whether an attention-half parameter's gradient hook fires before q_norm's
// backward (BlockBackwardTransients::qk_norm_bytes): autograd runs the
// later-made paths first, so o_proj's, v's and k's hooks do, q_norm's,
// q_proj's and the pre-norm's do not.
bool BeforeQkNormMoment(const ModelSpec& model, KernelDevice device, const std::vector<BlockOp>& layout,
                        const TensorSpec& t) {
  if (!model.qk_norm() || model.attention_impl() != ATTENTION_SDPA || SdpaRunsMath(model, device) ||
      t.part() == PART_VISION_TOWER || !LayerAttends(model, t.layer())) {
    return false;
  }
  absl::string_view rest;
  const int op = OpOfParameter(model, layout, t.name(), &rest);
  if (op < 0) return false;
  switch (layout[op].kind) {
    case BlockOpKind::kQkvProjection: return !absl::StartsWith(rest, "q_proj") && !absl::StartsWith(rest, kQkvProj);
    case BlockOpKind::kQkNorm: return !absl::StartsWith(rest, kQNorm);
    case BlockOpKind::kOutProjection: return true;
    default: return false;
  }
}

std::vector<PartitionStart> FirstReductionPartByRank(const ModelSpec& model, KernelDevice device,
                                                     const std::vector<TensorSpec>& params,
                                                     const std::vector<FlatPartition>& partitions, int num_layers,
                                                     int64_t bucket_elements, bool gelu_mlp,
                                                     LargestPieces* largest = nullptr) {
  std::vector<PartitionStart> from(partitions.size());
  std::vector<bool> seen(partitions.size(), false);
  auto note_pieces = [&](int lo, int hi, const StepSizes::OffloadNormCopy& moment) {
    if (largest != nullptr) largest->Note(lo, hi, moment);
  };
  // A reduction of the bucket holding parameters [lo, hi] at parameter i's
  // hook. The step program's moment of an attention half is its first
  // gradient's (the widest point), so a partition made at a later hook of
  // the half counts from the next half; an MLP half's comes after
  // down_proj's hooks (BlockBackwardTransientBytes), which count for it.
  auto reduce = [&](int lo, int hi, int i) {
    const TensorSpec& t = params[i];
    using Moment = StepSizes::PartitionMoment;
    PartitionStart start;
    const int block = StepBlockOf(model, t);
    // Its own block's (a dense layer before mixture-of-experts ones, a tower block, differ).
    const std::vector<BlockOp> layout = StepBlockLayout(model, std::max(block, 0));
    start.part = block >= 0 ? block : GradientPartOf(model, t, t.name().rfind("embed", 0) == 0 ? -1 : num_layers);
    const bool in_attention = block >= 0 && !InMlpHalf(layout, t);
    if (in_attention) start.moment = Moment::kAttention;
    if (IsDownProjTensor(layout, t) && (gelu_mlp || MoeBlockOf(model, t) >= 0)) {
      start.moment = Moment::kDownProjHook;
    }
    const bool first_of_half = i + 1 == static_cast<int>(params.size()) ||
                               StepBlockOf(model, params[i + 1]) != block ||
                               InMlpHalf(layout, params[i + 1]) != InMlpHalf(layout, t);
    const bool before_moment = first_of_half || IsDownProjTensor(layout, t);
    note_pieces(lo, hi, StepSizes::OffloadNormCopy{0, start.part, in_attention, before_moment || block < 0});
    if (block >= 0 && !before_moment) {
      if (!in_attention && !IsPreNormTensor(layout, t)) {
        start.moment = Moment::kMlpPreNorm;  // gate's or up's hook: the pre-norm's backward comes after
      } else if (!in_attention) {
        start.moment = Moment::kAttention;  // the pre-norm's own hook, after its backward
      } else if (BeforeQkNormMoment(model, device, layout, t)) {
        start.moment = Moment::kQkNorm;
      } else {
        start.part = block - 1;  // the previous block's MLP half, or the embedding (-1)
        start.moment = Moment::kBlockStart;
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
  note_pieces(0, hi, StepSizes::OffloadNormCopy{});
  return from;  // the rest: at the epilogue
}

// The stage-1 epilogue (reduce_gradients): the kept gradients go into the
// bucket in parameter order, a small one moved into it (a view of it from
// then on), one larger than the bucket reduced alone; a gradient that would
// overflow the bucket reduces it first, and with offload each gradient of
// a reduced bucket in the rank's partition is cleared once copied
// (copy_grads_in_partition, clear_grad_attribute); one outside it, larger
// than the bucket, stays to the end. What is gone at each reduction: the
// small gradients so far, and the rank's own ones before the bucket.
void NoteEpilogueReductions(const std::vector<TensorSpec>& params, const std::vector<FlatPartition>& partitions,
                            int64_t bucket_elements, int64_t w, LargestPieces* largest) {
  for (int64_t r = 0; r < static_cast<int64_t>(partitions.size()); ++r) {
    auto owned = [&](int j) { return j >= partitions[r].first_param && j <= partitions[r].last_param; };
    int64_t fill = 0, gone = 0, in_bucket = 0;
    int lo = 0;
    for (int i = 0; i <= static_cast<int>(params.size()); ++i) {
      const bool end = i == static_cast<int>(params.size());
      const int64_t numel = end ? 0 : NumElements(params[i]);
      if (fill > 0 && (end || fill + numel > bucket_elements)) {
        largest->Note(lo, i - 1, StepSizes::OffloadNormCopy{0, StepSizes::kAtEpilogue, false, false, gone + in_bucket}, r);
        for (int j = lo; j < i; ++j) {
          if (owned(j) || NumElements(params[j]) <= bucket_elements) gone += NumElements(params[j]) * w;
        }
        lo = i;
        fill = in_bucket = 0;
      }
      fill += numel;
      if (numel <= bucket_elements) in_bucket += numel * w;
    }
  }
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
    const int block = StepBlockOf(in.model, first);
    s.ipg_from = block >= 0                                  ? block
                 : absl::StartsWith(first.name(), "lm_head") || absl::StartsWith(first.name(), "classifier")
                     ? s.kHeadPart()
                 : absl::StartsWith(first.name(), "final_norm") ? s.num_layers
                                                                : GradientPartOf(in.model, first, -1);
    s.ipg_at_attention = block >= 0 && !InMlpHalf(StepBlockLayout(in.model, block), first);
  }
}

namespace {

// ZeRO-1 with overlap_comm reduces in the hooks but clears no gradient
// there (stage_1_and_2.py, reduce_ipg_grads: `else:  # zero stage 1`): one
// in the rank's partition becomes a view into it (copy_grads_in_partition),
// one no larger than a bucket a view into the IPG bucket, and one larger than
// a bucket, outside the partition, stays whole until the epilogue clears it
// (independent_gradient_partition_epilogue, _clear_param_grad_only).
void RetainOversizedGradients(const ZeroSizingInputs& in, const FlatPartition& partition, int num_layers,
                              RankVariant* v) {
  v->retained_mlp.assign(num_layers, 0);
  v->retained_attn.assign(num_layers, 0);
  for (int i = 0; i < static_cast<int>(in.trainable.size()); ++i) {
    const TensorSpec& t = in.trainable[i];
    const bool owned = i >= partition.first_param && i <= partition.last_param;
    if (owned || NumElements(t) <= in.config.zero().reduce_bucket_elements()) continue;
    const int64_t bytes = NumElements(t) * in.w;
    if (const int block = StepBlockOf(in.model, t); block >= 0) {
      (InMlpHalf(StepBlockLayout(in.model, block), t) ? v->retained_mlp : v->retained_attn)[block] += bytes;
    } else if (absl::StartsWith(t.name(), "lm_head")) {
      v->retained_head += bytes;
    }
  }
}

}  // namespace

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
  if ((s.stage == 1 || s.stage == 2) && s.offload_optimizer) {
    // At the boundary each parameter's piece of the partition is copied to
    // fp64 for its norm as its bucket is reduced (copy_grads_in_partition ->
    // set_norm_for_param_grad_in_gpu: accumulated_grad...to(get_norm_dtype()).norm(2)),
    // then upcast to fp32 for the host (4 bytes an element, less): the
    // largest piece's copy, at its reduction (stage 1: the epilogue's).
    const std::vector<FlatPartition> partitions = FlatPartitionsByRank(trainable, s.world_size);
    LargestPieces largest(trainable, s.world_size);
    if (stage1_epilogue) {
      NoteEpilogueReductions(trainable, partitions, zero.reduce_bucket_elements(), w, &largest);
    } else {
      FirstReductionPartByRank(model, KernelDeviceOf(s), trainable, partitions, s.num_layers,
                               zero.reduce_bucket_elements(), false, &largest);
    }
    for (size_t r = 0; r < partitions.size(); ++r) {
      RankVariant v;
      v.offload_norm_copy = largest.by_rank()[r];
      if (s.stage == 1 && zero.overlap_comm()) RetainOversizedGradients(in, partitions[r], s.num_layers, &v);
      if (host_accumulation) {
        // One host buffer per parameter, pinned as its own block (memory_model.h).
        for (int i = partitions[r].first_param; i >= 0 && i <= partitions[r].last_param; ++i) {
          const int64_t bytes = NumElements(trainable[i]) * w;
          v.host_grad_accumulation += bytes;
          if (s.pin_memory && !s.cpu_ranks) v.host_grad_accumulation_pinned += RoundUpToPowerOfTwo(bytes);
        }
      }
      auto it = std::find(variants.begin(), variants.end(), v);
      rank_variant.push_back(static_cast<int>(it - variants.begin()));
      if (it == variants.end()) variants.push_back(v);
    }
  } else if ((s.stage == 1 || s.stage == 2) && !s.offload_optimizer) {
    const std::vector<FlatPartition> partitions = FlatPartitionsByRank(trainable, s.world_size);
    std::vector<PartitionStart> from(partitions.size());
    if (s.stage == 2 && s.grad_accum > 1) {
      from.assign(partitions.size(), PartitionStart{s.kBeforeForward()});
    } else if (stage1_epilogue) {
      from.assign(partitions.size(), PartitionStart{StepSizes::kAtEpilogue});
    } else {
      // Every down_proj keeps its input unless LoRA freezes it.
      from = FirstReductionPartByRank(model, KernelDeviceOf(s), trainable, partitions, s.num_layers,
                                      zero.reduce_bucket_elements(), model.ffn_type() == FFN_GELU && BaseWeightsTrain(model));
    }
    for (size_t r = 0; r < partitions.size(); ++r) {
      RankVariant v;
      v.grad_partition = partitions[r].params_elements * w;
      v.grad_partition_from = from[r].part;
      v.grad_partition_moment = from[r].moment;
      v.step_norm_copy = partitions[r].max_piece_elements * 8;  // get_norm_dtype(): fp64
      if (s.stage == 1 && zero.overlap_comm()) RetainOversizedGradients(in, partitions[r], s.num_layers, &v);
      auto it = std::find(variants.begin(), variants.end(), v);
      rank_variant.push_back(static_cast<int>(it - variants.begin()));
      if (it == variants.end()) variants.push_back(v);
    }
  }
}

int64_t DownWeightGradWaitingBytes(const ZeroSizingInputs& in, const StepSizes& s, int64_t down_weight_elements) {
  const ZeroConfig& zero = in.config.zero();
  const bool reduced_in_hooks = (s.stage == 1 || s.stage == 2) && !in.stage1_epilogue;
  if (reduced_in_hooks && zero.contiguous_gradients() && down_weight_elements > zero.reduce_bucket_elements()) {
    return down_weight_elements * in.w;
  }
  return 0;
}

std::vector<Stage3ExpertReductions> SizeStage3Reductions(const ZeroSizingInputs& in, const StepSizes& s) {
  const ZeroConfig& zero = in.config.zero();
  std::vector<Stage3ExpertReductions> out;
  if (s.stage != 3) return out;
  out.resize(s.num_layers);
  const std::vector<TensorSpec>& params = in.trainable;
  const int64_t bucket_elements = zero.reduce_bucket_elements();
  const int64_t world = s.world_size;
  const int n = static_cast<int>(params.size());
  // Per gradient: its block (-1 outside the blocks), its leaf module (whose
  // gradients wait for its backward to end), whether it is an expert's, and
  // the weight whose bias it is (made by the same node, so made by the
  // bias's hook: autograd accumulates a linear's bias first). Per block:
  // its largest expert gradient (the MLP half's gradient moment).
  std::vector<int> block_of(n, -1), leaf(n, -1), weight_of(n, -1), largest(s.num_layers, -1);
  std::vector<bool> moe(n, false);
  for (int i = 0; i < n; ++i) {
    const int block = block_of[i] = StepBlockOf(in.model, params[i]);
    if (block < 0) continue;
    leaf[i] = DeepSpeedLeafBlockOf(in.model, params[i]);
    moe[i] = MoeBlockOf(in.model, params[i]) >= 0;
    if (moe[i] && (largest[block] < 0 || NumElements(params[i]) > NumElements(params[largest[block]]))) {
      largest[block] = i;
    }
    const std::string& name = params[i].name();
    if (i > 0 && (absl::EndsWith(name, ".bias") || absl::EndsWith(name, "_bias"))) {
      const std::string weight = name.substr(0, name.size() - 5);
      if (params[i - 1].name() == weight || params[i - 1].name() == weight + ".weight") weight_of[i] = i - 1;
    }
  }
  // The bucket (stage3.py, reduce_independent_p_g_buckets_and_remove_grads):
  // a gradient that would overflow it reduces it first; one that fits is
  // moved into it (__add_grad_to_ipg_bucket, with contiguous_gradients: its
  // own storage freed), one larger stays whole in it until the next reduction.
  std::vector<int> bucket;
  int64_t fill = 0;
  std::vector<int64_t> made(n, 0);  // gradients made and not yet moved or reduced
  int64_t made_total = 0;
  auto make = [&](int i) {
    if (made[i] > 0) return;
    made[i] = NumElements(params[i]) * in.w;
    made_total += made[i];
  };
  auto drop = [&](int i) {
    made_total -= made[i];
    made[i] = 0;
  };
  auto flush = [&](int at) {
    // __reduce_and_partition_ipg_grads -> __avg_scatter_grads ->
    // reduce_scatter_coalesced (reduce_scatter is on by default): one flat
    // copy of the bucket's gradients, each padded to a multiple of the world
    // (none for a single one that needs no padding); Gloo's reduce-scatter
    // copies its input too (ProcessGroupGloo; NCCL does not).
    int64_t padded = 0;
    for (int j : bucket) padded += (NumElements(params[j]) + world - 1) / world * world;
    const bool no_cat = bucket.size() == 1 && NumElements(params[bucket[0]]) % world == 0;
    const int64_t copies = ((no_cat ? 0 : padded) + (s.cpu_ranks ? padded : 0)) * in.w;
    int waiter = -1;  // a gradient that waited whole in the bucket
    for (int j : bucket) {
      if (made[j] > 0 && waiter < 0) waiter = j;
    }
    const int big = block_of[at] >= 0 && moe[at] ? largest[block_of[at]] : -1;
    if (waiter >= 0 && moe[waiter]) {
      // An expert bank's (or a leaf's) gradients are reduced once the
      // expert nodes are done (at the router's hook, or the leaf's end of
      // backward): all that is made then, and the copies.
      int64_t& pending = out[block_of[waiter]].pending;
      pending = std::max(pending, made_total + copies);
    } else if (big >= 0 && made[big] > 0 && NumElements(params[big]) > bucket_elements &&
               std::find(bucket.begin(), bucket.end(), big) == bucket.end()) {
      // An expert bank's gradient, its half's largest and larger than a
      // bucket, made: the reduction it brings stands beside it (its moment
      // has it). Past that moment the half is narrower, and a dense half's
      // reductions run past its widest moment (ViT's, measured 0.8 MB
      // below the peak): neither is counted.
      int64_t& copy = out[block_of[at]].copy;
      copy = std::max(copy, made_total - made[big] + copies);
    }
    for (int j : bucket) drop(j);  // partition_grads frees them
    bucket.clear();
    fill = 0;
  };
  auto hook = [&](int i) {
    const int64_t numel = NumElements(params[i]);
    if (!bucket.empty() && fill + numel > bucket_elements) flush(i);
    if (zero.contiguous_gradients() && fill + numel <= bucket_elements) drop(i);
    bucket.push_back(i);
    fill += numel;
  };
  // Hooks fire in reverse parameter order; a leaf module's gradients all
  // wait for its backward to end, then go in its parameters' order
  // (parameter_offload.py: the leaf's backward hook).
  for (int i = n - 1; i >= 0; --i) {
    if (leaf[i] < 0) {
      make(i);
      if (weight_of[i] >= 0) make(weight_of[i]);
      hook(i);
      continue;
    }
    int first = i;
    while (first > 0 && leaf[first - 1] == leaf[i]) --first;
    for (int j = first; j <= i; ++j) make(j);
    for (int j = first; j <= i; ++j) hook(j);
    i = first;
  }
  // The rest reduces after backward (independent_gradient_partition_epilogue).
  return out;
}

}  // namespace zplan
