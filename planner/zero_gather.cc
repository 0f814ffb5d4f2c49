#include "planner/zero_gather.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "planner/block_layout.h"

namespace zplan {

void SizeStage3Gathers(const ZeroSizingInputs& in, const SavePolicy& saves, Stage3BlockGathers* blocks,
                       StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ModelSpec& model = in.model;
  const ZeroConfig& zero = in.config.zero();
  const std::vector<TensorSpec>& params = in.params;
  const int64_t w = in.w;
  const int64_t h = model.hidden_size();
  const int64_t vocab = model.vocab_size();
  const bool gathers = GathersParameters(s.stage, s.world_size, s.offload_param, s.cpu_ranks);
  // Blocks: the gathered block, its prefetch and what stays gathered.
  if (gathers && s.num_layers > 0) {
    auto partitioned = [&](const TensorSpec& t) { return NumElements(t) > zero.stage3_param_persistence_threshold(); };
    std::vector<std::vector<const TensorSpec*>> of_layer(s.num_layers);
    std::vector<int64_t> partitioned_elements(s.num_layers, 0);
    std::vector<bool> runs_backward, block_backward(s.num_layers, false);
    for (const TensorSpec& t : params) {
      runs_backward.push_back(RunsBackward(model, t, saves));
      const int block = StepBlockOf(model, t);
      if (block < 0) continue;
      of_layer[block].push_back(&t);
      if (partitioned(t)) partitioned_elements[block] += NumElements(t);
      if (runs_backward.back()) block_backward[block] = true;
    }
    blocks->gather.assign(s.num_layers, 0);
    blocks->kept.assign(s.num_layers, 0);
    blocks->held.assign(s.num_layers, 0);
    // GptOssExperts hands the banks to grouped_mm as they are: the parameter itself is saved.
    const bool banks_saved_as_views = model.has_moe() && !model.moe().gpt_oss_experts();
    auto is_bank = [](const TensorSpec& t) {
      return absl::EndsWith(t.name(), kExpertsGateUp) || absl::EndsWith(t.name(), kExpertsDown);
    };
    for (int i = 0; i < s.num_layers; ++i) {
      // The block being computed plus the next one's parameters prefetched in
      // order while fewer than min(prefetch bucket, live cap - gathered) are
      // in flight (DeepSpeed's PartitionedParameterCoordinator; the parameter
      // that crosses the limit is included); the last block's prefetch is
      // planned as a block like itself.
      const int64_t limit = std::min(zero.stage3_prefetch_bucket_elements(),
                                     zero.stage3_max_live_parameters() - partitioned_elements[i]);
      int64_t prefetched = 0;
      for (const TensorSpec* t : of_layer[std::min(i + 1, s.num_layers - 1)]) {
        if (prefetched >= limit) break;
        if (partitioned(*t)) prefetched += NumElements(*t);
      }
      blocks->gather[i] = (partitioned_elements[i] + prefetched) * w;
      // A block no gradient reaches (a vision tower's past its selected
      // features, or frozen without a graph) is never kept for a backward.
      blocks->kept[i] = block_backward[i] ? partitioned_elements[i] * w : 0;
      for (const TensorSpec* t : of_layer[i]) {
        if (banks_saved_as_views && block_backward[i] && is_bank(*t) && partitioned(*t)) {
          blocks->held[i] += NumElements(*t) * w;
        }
      }
    }
    // Kept parameters (sharding.h): the later the block, the nearer its
    // backward, so blocks from some index on are kept whole (the step
    // program's groups rely on it; the simulator test checks it).
    const Stage3Retention retention =
        Stage3RetentionOf(model, params, s.tied, zero, runs_backward);
    std::vector<int64_t> kept(s.num_layers, 0), kept_banks(s.num_layers, 0);
    for (size_t j = 0; j < params.size(); ++j) {
      const TensorSpec& t = params[j];
      const int block = StepBlockOf(model, t);
      if (block < 0 || !retention.kept_after_forward[j] || !partitioned(t)) continue;
      kept[block] += NumElements(t) * w;
      if (is_bank(t)) kept_banks[block] += NumElements(t) * w;
    }
    int from = s.num_layers;
    while (from > 0 && kept[from - 1] == blocks->kept[from - 1]) --from;
    s.gather_kept_from = from;
    s.gather_kept_partial = from > 0 ? kept[from - 1] : 0;
    s.gather_held_partial = from > 0 ? std::max<int64_t>(0, blocks->held[from - 1] - kept_banks[from - 1]) : 0;
    s.embed_kept = retention.embedding_kept;
    s.head_kept = retention.head_kept;
  }
  // Model ends: the embedding and head, partitioned ones gathered.
  if (model.has_vision()) {
    // The patch projection and CLS token, the positions and the classifier
    // (inventory.h); at stage 3 the partitioned ones are gathered together.
    for (const TensorSpec& t : params) {
      if (t.layer() >= 0 || absl::StartsWith(t.name(), "final_norm")) continue;
      const int64_t bytes = NumElements(t) * w;
      const bool head = absl::StartsWith(t.name(), "classifier");
      if (gathers && NumElements(t) > zero.stage3_param_persistence_threshold()) {
        (head ? s.head_gather : s.embed_gather) += bytes;
      }
    }
  } else if (s.has_head) {
    // A vision-language model's tower embeddings and projector: gathered
    // with the embedding (approximation: DeepSpeed gathers each as its
    // module runs, the tower's at the forward's start and after the tower's
    // first block in backward, the projector's after the tower).
    for (const TensorSpec& t : params) {
      if (gathers && t.part() != PART_LANGUAGE_MODEL && t.layer() < 0 &&
          NumElements(t) > zero.stage3_param_persistence_threshold()) {
        s.embed_gather += NumElements(t) * w;
      }
    }
    if (gathers && vocab * h > zero.stage3_param_persistence_threshold()) {
      s.embed_gather += vocab * h * w;
      s.head_gather = vocab * h * w;
    }
    // Learned positions (GPT-2's wpe) are gathered, and kept, with it.
    const int64_t positions =
        model.position_embedding() == POSITION_LEARNED ? model.max_position_embeddings() * h : 0;
    if (gathers && positions > zero.stage3_param_persistence_threshold()) {
      s.embed_gather += positions * w;
    }
  }
}

}  // namespace zplan
