#include "executor/trainer.h"

#include <thread>
#include <vector>

#include "executor/counting_allocator.h"
#include "executor/tiny_model_testing.h"
#include "gtest/gtest.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"

namespace zplan {
namespace {

Plan MakePlan(int stage, bool offload, bool ckpt, int world, Precision precision, int64_t accum = 1,
              bool offload_param = false) {
  RunConfig config;
  config.mutable_cluster()->set_gpu("cpu");
  config.mutable_cluster()->set_gpus_per_node(world);
  config.mutable_zero()->set_stage(stage);
  config.mutable_zero()->set_offload_optimizer(offload ? OFFLOAD_CPU : OFFLOAD_NONE);
  config.mutable_zero()->set_offload_param(offload_param ? OFFLOAD_CPU : OFFLOAD_NONE);
  config.mutable_zero()->set_stage3_param_persistence_threshold(100);  // norms stay whole
  config.mutable_zero()->set_reduce_bucket_elements(3000);  // several buckets, some gradients larger
  config.mutable_zero()->set_sub_group_elements(5000);
  config.set_activation_checkpointing(ckpt);
  config.set_precision(precision);
  config.set_micro_batch_size(2);
  config.set_seq_length(16);
  config.set_gradient_accumulation_steps(accum);
  config.mutable_optimizer()->set_learning_rate(3e-3);
  config.mutable_optimizer()->set_gradient_clipping(1.0);
  config.set_seed(5);
  auto plan = BuildPlan(TinyModel(), config, {.record_timeline = false});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// Losses of rank 0 after running every rank on its own thread over Gloo.
std::vector<double> Train(const Plan& plan, int64_t steps) {
  const int world = static_cast<int>(plan.config().cluster().gpus_per_node());
  auto port = FindFreePort();
  std::vector<std::vector<double>> losses(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankInfo info{r, world, r, world, "127.0.0.1", *port};
      auto comm = CreateCollectives(info, CollectiveBackend::kGloo, absl::Seconds(60));
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto report = TrainRank(plan, comm->get(), {.steps = steps});
      ASSERT_TRUE(report.ok()) << report.status();
      losses[r].assign(report->losses().begin(), report->losses().end());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < world; ++r) EXPECT_EQ(losses[r], losses[0]) << "ranks disagree on the mean loss";
  return losses[0];
}

void ExpectSameLosses(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << what << " step " << i;
  }
}

// Stages 1-3, each with and without optimizer offload (stage 3 also with
// parameter offload) and checkpointing, against stage 0, at world 1, 2 and 4.
// Five steps: four optimizer updates (Adam's moments past their first step,
// clipping, offloaded states written back) reach losses that are compared.
void ExpectGridMatchesStageZero(Precision precision, double rtol, int64_t accum) {
  InstallCountingCpuAllocator();
  constexpr int64_t kSteps = 5;
  for (int world : {1, 2, 4}) {
    const std::vector<double> baseline = Train(MakePlan(0, false, false, world, precision, accum), kSteps);
    for (int stage : {1, 2, 3}) {
      for (int offload = 0; offload <= (stage == 3 ? 2 : 1); ++offload) {
        for (bool ckpt : {false, true}) {
          const std::string what = "world " + std::to_string(world) + " stage " + std::to_string(stage) +
                                   (offload >= 1 ? " offload" : "") + (offload == 2 ? "+params" : "") +
                                   (ckpt ? " ckpt" : "");
          ExpectSameLosses(Train(MakePlan(stage, offload >= 1, ckpt, world, precision, accum, offload == 2), kSteps),
                           baseline, rtol, what);
        }
      }
    }
  }
}

TEST(TrainerTest, StagesMatchStageZeroLossesFp32) { ExpectGridMatchesStageZero(PRECISION_FP32, 1e-5, 1); }

TEST(TrainerTest, StagesMatchStageZeroLossesBf16WithAccumulation) {
  ExpectGridMatchesStageZero(PRECISION_BF16, 1e-2, 2);
}

TEST(TrainerTest, RejectsModelThatDoesNotMatchThePlan) {
  Plan plan = MakePlan(0, false, false, 1, PRECISION_FP32);
  plan.mutable_parameters(2)->set_name("layers.0.attn.wrong");
  RankInfo info;
  auto comm = CreateCollectives(info, CollectiveBackend::kEmulated, absl::Seconds(1));
  auto report = TrainRank(plan, comm->get(), {.steps = 1});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(report.status().message().find("layers.0.attn.wrong"), std::string::npos) << report.status();
}

}  // namespace
}  // namespace zplan
