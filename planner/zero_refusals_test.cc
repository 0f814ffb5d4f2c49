#include "planner/zero_refusals.h"

#include <string>

#include "gtest/gtest.h"
#include "planner/run_config.h"

namespace zplan {
namespace {

RunConfig Config(int stage) {
  RunConfig config;
  config.mutable_zero()->set_stage(stage);
  return ResolveRunConfig(config);
}

void ExpectRefused(const absl::Status& status, const std::string& says) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(says), std::string::npos) << status;
}

TEST(ZeroRefusalsTest, DefaultsPassEveryCheck) {
  ModelSpec model;
  model.set_vocab_size(256);
  for (int stage = 0; stage <= 3; ++stage) {
    const RunConfig config = Config(stage);
    StepSizes s;
    s.stage = stage;
    EXPECT_TRUE(RefuseDeepSpeedCheckpointing(config).ok());
    EXPECT_TRUE(RefuseZeroConfig(config).ok());
    EXPECT_TRUE(RefuseStep(model, config, s).ok());
    EXPECT_TRUE(RefuseEngineConfig(config).ok());
  }
}

TEST(ZeroRefusalsTest, SlidingWindowMaskRefusedOnlyOnSdpasMathPath) {
  ModelSpec model;
  model.set_attention_impl(ATTENTION_SDPA);
  model.set_sliding_window(2047);
  model.set_attention_dropout(0.1);
  RunConfig config = Config(2);
  StepSizes s;
  s.cpu_ranks = true;
  config.set_seq_length(2046);
  EXPECT_TRUE(RefuseStep(model, config, s).ok()) << "below the window SDPA runs with is_causal";
  config.set_seq_length(2047);
  ExpectRefused(RefuseStep(model, config, s), "SDPA's math path takes it");
  s.cpu_ranks = false;  // CUDA's kernels take the mask
  EXPECT_TRUE(RefuseStep(model, config, s).ok());
  s.cpu_ranks = true;
  model.set_attention_dropout(0);  // CPU's flash kernel takes it
  EXPECT_TRUE(RefuseStep(model, config, s).ok());
  model.set_attention_impl(ATTENTION_EAGER);  // eager's mask is [s, s] whatever the window
  model.set_attention_dropout(0.1);
  EXPECT_TRUE(RefuseStep(model, config, s).ok());
}

TEST(ZeroRefusalsTest, ParameterOffloadNeedsStage3) {
  RunConfig config = Config(2);
  config.mutable_zero()->set_offload_param(OFFLOAD_CPU);
  ExpectRefused(RefuseZeroConfig(config), "parameter offload needs ZeRO stage 3, got stage 2");
  ExpectRefused(RefuseEngineConfig(config), "parameter offload needs ZeRO stage 3");
}

TEST(ZeroRefusalsTest, OptimizerOffloadNeedsStage1) {
  RunConfig config = Config(0);
  config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
  StepSizes s;
  s.offload_optimizer = true;
  ExpectRefused(RefuseStep(ModelSpec(), config, s), "optimizer offload needs ZeRO stage >= 1");
  ExpectRefused(RefuseEngineConfig(config), "optimizer offload needs ZeRO stage >= 1");
}

TEST(ZeroRefusalsTest, LigerFusedLoss) {
  RunConfig config = Config(3);
  config.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
  ExpectRefused(RefuseZeroConfig(config), "under ZeRO-3");
  RunConfig stage2 = Config(2);
  stage2.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
  EXPECT_TRUE(RefuseZeroConfig(stage2).ok());
  StepSizes s;
  s.stage = 2;
  ExpectRefused(RefuseStep(ModelSpec(), stage2, s), "this model has none");
  ModelSpec lora;
  lora.set_vocab_size(256);
  lora.mutable_lora();
  ExpectRefused(RefuseStep(lora, stage2, s), "with LoRA is not modelled");
  ModelSpec granite;
  granite.set_vocab_size(256);
  granite.set_logits_scaling(8.0);
  ExpectRefused(RefuseStep(granite, stage2, s), "Liger has no fused linear cross-entropy for Granite");
}


TEST(ZeroRefusalsTest, ContiguousCheckpointingNeedsPartitionedActivations) {
  RunConfig config = Config(1);
  config.mutable_deepspeed_checkpointing()->set_contiguous_memory_optimization(true);
  ExpectRefused(RefuseDeepSpeedCheckpointing(config), "only with partition_activations");
  config.mutable_deepspeed_checkpointing()->set_partition_activations(true);
  ExpectRefused(RefuseDeepSpeedCheckpointing(config), "number_checkpoints");
}

TEST(ZeroRefusalsTest, Stage3MixesPartitionDtypesWithModulesToSave) {
  ModelSpec model;
  model.set_vocab_size(256);
  model.mutable_lora()->add_modules_to_save("lm_head");
  RunConfig config = Config(3);  // zero.Init by default at stage 3, bf16
  EXPECT_TRUE(Stage3MixesPartitionDtypes(model, config));
  StepSizes s;
  s.stage = 3;
  ExpectRefused(RefuseStep(model, config, s), "one dtype per partition");
  config.set_precision(PRECISION_FP32);
  EXPECT_FALSE(Stage3MixesPartitionDtypes(model, config));
  EXPECT_FALSE(Stage3MixesPartitionDtypes(model, Config(2)));
}

}  // namespace
}  // namespace zplan
