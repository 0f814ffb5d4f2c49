// The DeepSpeed oracle itself (tools/deepspeed_oracle.py): real DeepSpeed +
// transformers on Gloo CPU ranks, measured by zplan's counting allocator
// inside each rank's Python process, read back through the same comparison
// as zrun's reports (tools/accuracy.h). The planner's agreement with it is
// docs/deepspeed_agreement.md (tools/recordings.h); this test checks the measurement: every rank reports, the
// parameters DeepSpeed holds are the planner's parameter bytes (plus the
// model's RoPE inv_freq buffers, which are not parameters), and the loss
// falls from the initial ln(vocab).
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "planner/plan_builder.h"
#include "tools/accuracy.h"

namespace zplan {
namespace {

TEST(DeepSpeedOracleTest, MeasuresEveryRanksParametersExactly) {
  // ZeRO-0 bf16, two ranks: every rank holds the whole bf16 model.
  const AccuracyCase c = DeepSpeedCase(
      "z0-bf16-w2", "configs/hf/tiny/llama.json",
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}})",
      /*world=*/2, /*seq=*/64);
  auto rows = RunAccuracyMatrix({c}, RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/oracle"));
  ASSERT_TRUE(rows.ok()) << rows.status();
  const AccuracyRow& row = rows->front();
  // What trained is what the plan says it models.
  EXPECT_EQ(row.plan.modelled_frameworks(), kModelledFrameworks);
  EXPECT_EQ(row.framework.rfind(row.plan.modelled_frameworks(), 0), 0u) << row.framework;
  ASSERT_EQ(row.ranks.size(), 2u);
  // llama.json: head_dim 32 -> the model's one rotary module keeps inv_freq
  // and original_inv_freq, 16 fp32 each.
  const int64_t rope_buffers_bytes = 2 * 16 * 4;
  for (const RankMeasurement& m : row.ranks) {
    EXPECT_EQ(m.device.params_bytes(), row.plan.device_per_rank().params_bytes() + rope_buffers_bytes)
        << "rank " << m.rank;
    EXPECT_GT(m.device.optimizer_states_bytes(), 0) << "rank " << m.rank;
  }
}

// Liger's fused linear cross-entropy, its Python as shipped and its Triton
// kernels as the oracle's numpy ports, trains the same model to the same
// losses as transformers' loss over the full logits (bf16: to 1e-2), and
// holds less at the peak.
TEST(DeepSpeedOracleTest, LigerFusedLossTrainsAsTheFullLoss) {
  const std::string ds = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 2, "reduce_bucket_size": 200000}})";
  const AccuracyCase full = DeepSpeedCase("z2-full-loss", "configs/hf/tiny/llama.json", ds, /*world=*/1, /*seq=*/128);
  const AccuracyCase fused = WithFusedLoss(DeepSpeedCase("z2-fused-loss", "configs/hf/tiny/llama.json", ds, 1, 128));
  auto rows = RunAccuracyMatrix({full, fused},
                                RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/liger"));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ((*rows)[0].losses.size(), 3u);
  ASSERT_EQ((*rows)[1].losses.size(), 3u);
  for (size_t step = 0; step < 3; ++step) {
    EXPECT_NEAR((*rows)[1].losses[step], (*rows)[0].losses[step], 1e-2) << "step " << step;
  }
  EXPECT_LT((*rows)[1].losses.back(), (*rows)[1].losses.front());
  EXPECT_NE((*rows)[1].framework.find("liger-kernel 0.8.5"), std::string::npos) << (*rows)[1].framework;
  EXPECT_LT((*rows)[1].ranks[0].device.peak_bytes(), (*rows)[0].ranks[0].device.peak_bytes());
}

}  // namespace
}  // namespace zplan
