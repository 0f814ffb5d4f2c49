#include "planner/eager_experts.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "planner/expert_routing.h"

namespace zplan {
namespace {

ExpertRouting Kind(ExpertRouting::Kind kind) {
  ExpertRouting r;
  r.set_kind(kind);
  return r;
}

// The counting allocator's peaks of the experts module alone (bf16, CPU,
// transformers 5.23), as tools/eager_experts.py measured them on the tiny
// configs at 512 tokens (docs/moe.md): forward, under no_grad, backward.
struct Measured {
  const char* config;
  EagerExpertsShape shape;
  int64_t experts;
  ExpertRouting::Kind routing;
  int64_t forward, nograd, backward;
};

TEST(EagerExpertsTest, ModelsEqualTheMeasuredPeaks) {
  const EagerExpertsShape qwen3{512, 128, 96, 2, 2, 2}, mixtral{512, 128, 96, 2, 2, 4}, granite{512, 128, 64, 2, 2, 2};
  const Measured rows[] = {
      {"qwen3_moe", qwen3, 8, ExpertRouting::ROUTING_BALANCED, 1797184, 370752, 802304},
      {"qwen3_moe", qwen3, 8, ExpertRouting::ROUTING_WORST, 1797136, 868368, 263168},
      {"mixtral", mixtral, 4, ExpertRouting::ROUTING_BALANCED, 1962016, 668704, 424960},
      {"mixtral", mixtral, 4, ExpertRouting::ROUTING_WORST, 2158608, 1165328, 786432},
      {"granitemoe", granite, 16, ExpertRouting::ROUTING_BALANCED, 1600640, 337152, 1327872},
      {"granitemoe", granite, 16, ExpertRouting::ROUTING_WORST, 1600528, 803856, 518144},
  };
  for (const Measured& m : rows) {
    const std::vector<int64_t> pairs = PairsPerExpert(Kind(m.routing), 0, m.shape.tokens, m.experts, m.shape.top_k);
    const EagerExpertsBytes bytes = EagerExpertsAllocations(pairs, m.shape);
    EXPECT_EQ(bytes.forward_peak, m.forward) << m.config << " " << m.routing;
    EXPECT_EQ(bytes.nograd_peak, m.nograd) << m.config << " " << m.routing;
    EXPECT_EQ(bytes.backward_peak, m.backward) << m.config << " " << m.routing;
    // Every saved tensor is in the forward's peak.
    EXPECT_LT(bytes.saved, bytes.forward_peak) << m.config;
  }
}

TEST(EagerExpertsTest, RecomputedBackwardFreesTheProductsFactorsFirst) {
  // Mixtral's tiny config (fp32 pair weights) checkpointed under DeepSpeed, layer 0 of rank 0 in the
  // oracle's allocation trace (mixtral-eager-z2-bf16-ckpt's last step): the loop's backward rose 744,960 B
  // above its start; the order of a standalone backward would put it one expert's [n, h] higher.
  const std::vector<int64_t> pairs = {489, 516, 461, 582};
  EagerExpertsShape shape{1024, 128, 96, 2, 2, 4};
  EXPECT_EQ(EagerExpertsAllocations(pairs, shape).backward_peak, 744960 + 582 * 128 * 2);
  shape.recomputed = true;
  EXPECT_EQ(EagerExpertsAllocations(pairs, shape).backward_peak, 744960);
}

TEST(EagerExpertsTest, AnInputGradientMadeBeforeTheLoopTakesEveryExpertsRows) {
  // Qwen2-MoE's tiny config checkpointed at ZeRO-3 (qwen2_moe-eager-z3-bf16-ckpt, rank 0, layer 2): its
  // shared expert's gate made the input's gradient before the loop; the loop's backward rose 470,672 B
  // above its start, at the first expert's rows, and its second expert's bank copy stood at 382,598 B.
  const std::vector<int64_t> pairs = {205, 57, 391, 75, 556, 511, 69, 184};
  EagerExpertsShape shape{1024, 128, 64, 2, 2, 2};
  shape.recomputed = true;
  EXPECT_EQ(EagerExpertsAllocations(pairs, shape).backward_peak, 382598 + 262144);
  shape.input_grad_exists = true;
  EXPECT_EQ(EagerExpertsAllocations(pairs, shape).backward_peak, 470672);
}

TEST(EagerExpertsTest, FullSizeQwen3MoeLayerBackward) {
  // One Qwen3-30B-A3B layer (128 experts, top 8) at 2048 tokens, measured.
  const EagerExpertsShape shape{2048, 2048, 768, 8, 2, 2};
  EXPECT_EQ(EagerExpertsAllocations(PairsPerExpert(Kind(ExpertRouting::ROUTING_BALANCED), 0, 2048, 128, 8), shape)
                .backward_peak,
            2023781888);
  EXPECT_EQ(EagerExpertsAllocations(PairsPerExpert(Kind(ExpertRouting::ROUTING_WORST), 0, 2048, 128, 8), shape)
                .backward_peak,
            1960828928);
}

TEST(EagerExpertsTest, PastTheDownBanksHookMostOfWhatTheLoopSavedIsFreed) {
  // qwen3_moe-wide-eager's layer 2 as zrun routed it (fp32, 1024 tokens; the zrun row
  // qwen3_moe-wide-eager-z1-fp32-w1-b1, whose gradient partition appears at that hook).
  const std::vector<int64_t> pairs = {102, 912, 3, 52, 832, 10, 13, 20, 0, 98, 0, 797, 9, 78, 198, 972};
  const EagerExpertsShape shape{1024, 256, 128, 4, 4, 4};
  const EagerExpertsBytes bytes = EagerExpertsAllocations(pairs, shape);
  EXPECT_LT(bytes.past_down_hook_peak, 0);  // below the backward's start
  // Both gate_up buffers (the accumulated one, the last expert's zeros) and the down bank's gradient are live.
  const int64_t gate_up_bank = 16 * 256 * 256 * 4, down_bank = 16 * 256 * 128 * 4;
  EXPECT_GE(bytes.past_down_hook_peak + bytes.saved, 2 * gate_up_bank + down_bank - 1024 * 256 * 4);
  EXPECT_LT(bytes.past_down_hook_peak + bytes.saved, bytes.backward_peak + bytes.saved);
}

TEST(EagerExpertsTest, SavedDoesNotDependOnTheRouting) {
  const EagerExpertsShape shape{300, 64, 48, 2, 2, 2};
  const int64_t balanced =
      EagerExpertsAllocations(PairsPerExpert(Kind(ExpertRouting::ROUTING_BALANCED), 0, 300, 6, 2), shape).saved;
  const int64_t worst =
      EagerExpertsAllocations(PairsPerExpert(Kind(ExpertRouting::ROUTING_WORST), 0, 300, 6, 2), shape).saved;
  EXPECT_EQ(balanced, worst);
  EXPECT_EQ(balanced, 600 * (16 + 2 + (3 * 64 + 4 * 48) * 2));
}

}  // namespace
}  // namespace zplan
