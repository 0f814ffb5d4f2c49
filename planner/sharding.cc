#include "planner/sharding.h"

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

}  // namespace zplan
