#include "planner/expert_routing.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

int64_t Sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

ExpertRouting Kind(ExpertRouting::Kind kind) {
  ExpertRouting r;
  r.set_kind(kind);
  return r;
}

TEST(ExpertRoutingTest, BalancedAndWorstPairs) {
  EXPECT_THAT(PairsPerExpert(Kind(ExpertRouting::ROUTING_BALANCED), 0, 5, 4, 2), ElementsAre(3, 3, 2, 2));
  EXPECT_THAT(PairsPerExpert(Kind(ExpertRouting::ROUTING_WORST), 0, 5, 4, 2), ElementsAre(5, 5, 0, 0));
}

TEST(ExpertRoutingTest, MeasuredRoutingScalesToThePlansPairs) {
  absl::StatusOr<ExpertRouting> r = ParseRoutingJson(
      R"({"config": "x", "tokens": 8, "layers": [
            {"router": "model.layers.0.mlp.gate", "pairs_per_expert": [8, 4, 4, 0]},
            {"layer": 1, "pairs_per_expert": [1, 2, 3, 10]}]})",
      "routing.json");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->layers(0).layer(), 0);
  // As measured where the pairs agree; scaled otherwise, one pair per token at most.
  EXPECT_THAT(PairsPerExpert(*r, 0, 8, 4, 2), ElementsAre(8, 4, 4, 0));
  const std::vector<int64_t> scaled = PairsPerExpert(*r, 0, 4, 4, 2);
  EXPECT_EQ(Sum(scaled), 8);
  EXPECT_THAT(scaled, ElementsAre(4, 2, 2, 0));
  const std::vector<int64_t> capped = PairsPerExpert(*r, 1, 4, 4, 2);
  EXPECT_EQ(Sum(capped), 8);
  for (int64_t n : capped) EXPECT_LE(n, 4);
}

TEST(ExpertRoutingTest, BadRoutingFilesNameTheField) {
  EXPECT_THAT(ParseRoutingJson(R"({"layers": []})", "r.json").status().message(), HasSubstr("r.json: layers"));
  EXPECT_THAT(ParseRoutingJson(R"({"layers": [{"pairs_per_expert": [1]}]})", "r.json").status().message(),
              HasSubstr("layers[0]: needs \"layer\""));
  EXPECT_THAT(ParseRoutingJson(R"({"layers": [{"layer": 0, "pairs_per_expert": [1, -2]}]})", "r.json")
                  .status()
                  .message(),
              HasSubstr("layers[0].pairs_per_expert: expected a whole number"));
  EXPECT_THAT(ParseRouting("/nonexistent/routing.json").status().message(), HasSubstr("balanced, worst"));

  ModelSpec spec;
  spec.set_num_layers(2);
  spec.mutable_moe()->set_num_experts(4);
  spec.mutable_moe()->set_experts_per_token(2);
  absl::StatusOr<ExpertRouting> r =
      ParseRoutingJson(R"({"layers": [{"layer": 0, "pairs_per_expert": [1, 2, 3]}]})", "r.json");
  ASSERT_TRUE(r.ok());
  r->set_source("r.json");
  EXPECT_THAT(ValidateRouting(*r, spec).message(), HasSubstr("layer 0: 3 counts, but the model has 4 experts"));
  r->mutable_layers(0)->add_pairs_per_expert(2);
  EXPECT_THAT(ValidateRouting(*r, spec).message(), HasSubstr("MoE layer 1 has no routing"));
}

}  // namespace
}  // namespace zplan
