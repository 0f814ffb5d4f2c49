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
  // Parameters in flat order against the shard boundaries.
  const int64_t shard = layout.flat_shard_elements;
  std::vector<int64_t> touching(world, 0);
  int64_t offset = 0;
  for (const TensorSpec& tensor : parameters) {
    const int64_t begin = offset, end = offset + NumElements(tensor);
    offset = end;
    if (begin == end) continue;
    for (int64_t rank = begin / shard; rank < world && rank * shard < end; ++rank) {
      touching[rank] += end - begin;
      const int64_t piece = std::min(end, (rank + 1) * shard) - std::max(begin, rank * shard);
      layout.flat_partition_max_piece_elements = std::max(layout.flat_partition_max_piece_elements, piece);
    }
  }
  layout.flat_partition_params_elements = *std::max_element(touching.begin(), touching.end());
  return layout;
}

}  // namespace zplan
