#include "planner/sharding.h"

#include <algorithm>
#include <string>

#include "planner/inventory.h"
#include "planner/units.h"

namespace zplan {

int64_t FlatShardElements(int64_t elements, int64_t world) {
  return RoundUp(elements, kFlatAlignmentElements * world) / world;
}

ShardLayout ComputeShardLayout(const std::vector<TensorSpec>& parameters, int64_t world,
                               int64_t persistence_threshold_elements) {
  ShardLayout layout;
  layout.world_size = world;
  for (const TensorSpec& tensor : parameters) {
    const int64_t numel = NumElements(tensor);
    layout.total_elements += numel;
    layout.stage3_grad_shard_elements += Stage3ShardElements(numel, world);
    if (numel <= persistence_threshold_elements) {
      layout.stage3_persistent_elements += numel;
    } else {
      layout.stage3_shard_elements += Stage3ShardElements(numel, world);
    }
  }
  layout.flat_shard_elements = FlatShardElements(layout.total_elements, world);
  layout.flat_padded_elements = layout.flat_shard_elements * world;
  return layout;
}

std::vector<FlatPartition> FlatPartitionsByRank(const std::vector<TensorSpec>& parameters, int64_t world) {
  int64_t total = 0;
  for (const TensorSpec& tensor : parameters) total += NumElements(tensor);
  const int64_t shard = FlatShardElements(total, world);
  std::vector<FlatPartition> out(world);
  int64_t offset = 0;
  for (int i = 0; i < static_cast<int>(parameters.size()); ++i) {
    const int64_t begin = offset, end = offset + NumElements(parameters[i]);
    offset = end;
    for (int64_t rank = begin / shard; rank < world && rank * shard < end; ++rank) {
      FlatPartition& p = out[rank];
      p.params_elements += end - begin;
      p.max_piece_elements =
          std::max(p.max_piece_elements, std::min(end, (rank + 1) * shard) - std::max(begin, rank * shard));
      if (p.first_param < 0) p.first_param = i;
      p.last_param = i;
    }
  }
  return out;
}

Stage3Retention Stage3RetentionOf(const std::vector<TensorSpec>& parameters, bool tied_embeddings,
                                  int64_t max_reuse_distance_elements) {
  auto module_of = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  const int64_t reuse = max_reuse_distance_elements;
  Stage3Retention out;
  out.kept_after_forward.assign(parameters.size(), false);
  // A tied LM head is one more module after the last parameter.
  const int64_t tied_head =
      tied_embeddings && !parameters.empty() && parameters.front().name().rfind("embed_tokens", 0) == 0
          ? NumElements(parameters.front())
          : 0;
  int64_t after = tied_head;  // elements of the modules after the current one
  for (size_t i = parameters.size(); i-- > 0;) {
    size_t first = i;  // the module's parameters are [first, i]
    while (first > 0 && module_of(parameters[first - 1].name()) == module_of(parameters[i].name())) --first;
    for (size_t j = first; j <= i; ++j) out.kept_after_forward[j] = 2 * after < reuse;
    for (size_t j = first; j <= i; ++j) after += NumElements(parameters[j]);
    i = first;
  }
  out.head_kept = reuse > 0;
  if (tied_head > 0) {
    // Next used by the head's forward: the blocks and final norm in between.
    out.embedding_kept = after - 2 * tied_head < reuse;
    out.kept_after_forward[0] = out.embedding_kept;
  } else if (!parameters.empty() && parameters.front().name().rfind("embed_tokens", 0) == 0) {
    out.embedding_kept = out.kept_after_forward[0];
  }
  return out;
}

}  // namespace zplan
