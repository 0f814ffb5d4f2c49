#include "planner/plan_builder.h"

#include <string>

#include "gtest/gtest.h"
#include "planner/model_spec.h"

namespace zplan {
namespace {

struct SearchCase {
  std::string model;
  int stage;
  bool offload;
  int64_t gpus_per_node, nodes, micro_batch, seq;
};

// The searches skip replaying the allocator where the tensors alone do not
// fit and walk down from there; the answer must still be the exact edge: the
// plan at it fits, the one above it does not.
TEST(PlanBuilderTest, SearchesFindTheExactEdgeWithTheAllocatorCache) {
  for (const SearchCase& c : {SearchCase{"qwen3-0.6b", 0, false, 1, 1, 2, 2048},
                              SearchCase{"1b", 3, true, 4, 1, 2, 8192},
                              SearchCase{"llama3-8b", 2, false, 8, 64, 1, 2048},
                              SearchCase{"llama3-8b", 3, false, 8, 2, 1, 4096}}) {
    SCOPED_TRACE(c.model + " stage " + std::to_string(c.stage));
    auto model = LoadPreset(c.model);
    ASSERT_TRUE(model.ok()) << model.status();
    RunConfig config;
    config.mutable_cluster()->set_gpu("h100-80gb");
    config.mutable_cluster()->set_gpus_per_node(c.gpus_per_node);
    config.mutable_cluster()->set_num_nodes(c.nodes);
    config.mutable_zero()->set_stage(c.stage);
    config.mutable_zero()->set_offload_optimizer(c.offload ? OFFLOAD_CPU : OFFLOAD_NONE);
    config.set_micro_batch_size(c.micro_batch);
    config.set_seq_length(c.seq);
    auto fits_device = [&](RunConfig shape) {
      auto plan = BuildPlan(*model, shape);
      EXPECT_TRUE(plan.ok()) << plan.status();
      return plan.ok() && plan->device_margin_bytes() >= 0;
    };
    auto batch = MaxMicroBatch(*model, config);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_GT(*batch, 0);
    RunConfig shape = config;
    shape.set_micro_batch_size(*batch);
    EXPECT_TRUE(fits_device(shape));
    shape.set_micro_batch_size(*batch + 1);
    EXPECT_FALSE(fits_device(shape));
    auto seq = MaxSeqLength(*model, config);
    ASSERT_TRUE(seq.ok()) << seq.status();
    ASSERT_GT(*seq, 0);
    shape = config;
    shape.set_seq_length(*seq);
    EXPECT_TRUE(fits_device(shape));
    shape.set_seq_length(*seq + 1);
    EXPECT_FALSE(fits_device(shape));
  }
}

}  // namespace
}  // namespace zplan
