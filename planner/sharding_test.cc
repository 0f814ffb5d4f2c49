#include "planner/sharding.h"

#include "gtest/gtest.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"

namespace zplan {
namespace {

TEST(ShardingTest, FlatShardPadsToAlignmentTimesWorld) {
  EXPECT_EQ(FlatShardElements(100, 8), 14);   // padded to 112 = 7 * 16
  EXPECT_EQ(FlatShardElements(16, 8), 2);     // already aligned
  EXPECT_EQ(FlatShardElements(1, 1), 2);      // 2-element alignment even alone
}

TEST(ShardingTest, EveryElementIsOwnedExactlyOnce) {
  auto model = LoadPreset("gpt2");
  const auto params = ParameterInventory(*model);
  for (int64_t world : {1, 2, 3, 8, 64, 1000}) {
    const ShardLayout layout = ComputeShardLayout(params, world, 100'000);
    EXPECT_EQ(layout.total_elements, 124'439'808);
    EXPECT_GE(layout.flat_padded_elements, layout.total_elements);
    EXPECT_LT(layout.flat_padded_elements - layout.total_elements, kFlatAlignmentElements * world);
    // Stage 3: each parameter padded to a multiple of world.
    EXPECT_GE(layout.stage3_grad_shard_elements * world, layout.total_elements);
    EXPECT_LT(layout.stage3_grad_shard_elements * world - layout.total_elements,
              static_cast<int64_t>(params.size()) * world);
  }
}

TEST(ShardingTest, PersistenceThresholdKeepsSmallParametersWhole) {
  auto model = LoadPreset("gpt2");
  const auto params = ParameterInventory(*model);
  const ShardLayout all = ComputeShardLayout(params, 8, 0);
  EXPECT_EQ(all.stage3_persistent_elements, 0);
  const ShardLayout some = ComputeShardLayout(params, 8, 100'000);
  // Biases and norms (<= 100k elements) stay whole; the 768x768 and larger matrices shard.
  EXPECT_GT(some.stage3_persistent_elements, 0);
  EXPECT_LT(some.stage3_persistent_elements, 1'000'000);
}

TEST(ShardingTest, PartitionHoldsEveryParameterThatTouchesTheShardWhole) {
  // Parameters of 6, 10 and 4 elements over 2 ranks: shards [0, 10), [10, 20).
  auto param = [](int64_t n) {
    TensorSpec t;
    t.add_shape(n);
    t.set_dtype(DTYPE_BF16);
    return t;
  };
  const std::vector<FlatPartition> two = FlatPartitionsByRank({param(6), param(10), param(4)}, 2);
  ASSERT_EQ(two.size(), 2u);
  // Rank 0 touches the 6 and the 10 (16 elements), rank 1 the 10 and the 4.
  EXPECT_EQ(two[0].params_elements, 16);
  EXPECT_EQ(two[0].max_piece_elements, 6);
  EXPECT_EQ(two[0].first_param, 0);
  EXPECT_EQ(two[0].last_param, 1);
  EXPECT_EQ(two[1].params_elements, 14);
  EXPECT_EQ(two[1].max_piece_elements, 6);
  EXPECT_EQ(two[1].first_param, 1);
  const std::vector<FlatPartition> one = FlatPartitionsByRank({param(6), param(10), param(4)}, 1);
  EXPECT_EQ(one[0].params_elements, 20);
  EXPECT_EQ(one[0].max_piece_elements, 10);
}

}  // namespace
}  // namespace zplan
