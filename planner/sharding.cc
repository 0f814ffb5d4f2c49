#include "planner/sharding.h"

#include <algorithm>

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

}  // namespace zplan
