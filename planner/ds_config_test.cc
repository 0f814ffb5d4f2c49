#include "planner/ds_config.h"

#include "gtest/gtest.h"
#include "planner/model_spec.h"
#include "planner/run_config.h"

namespace zplan {
namespace {

absl::Status Apply(const std::string& text, RunConfig* config) {
  auto model = LoadPreset("qwen3-0.6b");  // hidden 1024
  return ApplyDeepSpeedConfig(text, "ds_config.json", *model, config);
}

TEST(DsConfigTest, ReadsSeed004Config) {
  RunConfig config;
  ASSERT_TRUE(Apply(R"({
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
    "bf16": {"enabled": true}
  })", &config).ok());
  EXPECT_EQ(config.zero().stage(), 2);
  EXPECT_EQ(config.zero().offload_optimizer(), OFFLOAD_CPU);
  EXPECT_TRUE(config.zero().pin_memory());
  EXPECT_EQ(config.precision(), PRECISION_BF16);
  EXPECT_DOUBLE_EQ(config.optimizer().beta2(), 0.95);
  EXPECT_EQ(config.optimizer().warmup_steps(), 10);
}

TEST(DsConfigTest, ResolvesAutoLikeHuggingFace) {
  RunConfig config;
  ASSERT_TRUE(Apply(R"({"train_micro_batch_size_per_gpu": "auto", "fp16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
      "overlap_comm": true, "sub_group_size": 1e9}})", &config).ok());
  EXPECT_EQ(config.zero().reduce_bucket_elements(), 1024 * 1024);
  EXPECT_EQ(config.zero().stage3_prefetch_bucket_elements(), 943718);  // 0.9 * h^2
  EXPECT_EQ(config.zero().stage3_param_persistence_threshold(), 10240);
  EXPECT_EQ(config.micro_batch_size(), 0);  // left to the command line
  EXPECT_EQ(config.precision(), PRECISION_UNSPECIFIED);
}

TEST(DsConfigTest, WithoutHalfPrecisionDeepSpeedTrainsInFp32) {
  RunConfig config;
  config.set_precision(PRECISION_BF16);  // e.g. a default from elsewhere
  ASSERT_TRUE(Apply(R"({"zero_optimization": {"stage": 1}})", &config).ok());
  EXPECT_EQ(config.precision(), PRECISION_FP32);
  config.set_precision(PRECISION_BF16);
  ASSERT_TRUE(Apply(R"({"bf16": {"enabled": false}, "fp16": {"enabled": false}})", &config).ok());
  EXPECT_EQ(config.precision(), PRECISION_FP32);
}

TEST(DsConfigTest, ReadsTheAdamImplementation) {
  RunConfig config;
  ASSERT_TRUE(Apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})", &config).ok());
  EXPECT_EQ(config.optimizer().implementation(), ADAM_IMPL_DEEPSPEED);
  ASSERT_TRUE(Apply(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": true}}})", &config).ok());
  EXPECT_EQ(config.optimizer().implementation(), ADAM_IMPL_TORCH);
  ASSERT_TRUE(Apply(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true, "foreach": true}}})", &config).ok());
  EXPECT_EQ(config.optimizer().implementation(), ADAM_IMPL_TORCH_FOREACH);
  ASSERT_TRUE(Apply(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true, "fused": true}}})", &config).ok());
  EXPECT_EQ(config.optimizer().implementation(), ADAM_IMPL_TORCH_FUSED);
  const absl::Status lamb = Apply(R"({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})", &config);
  EXPECT_EQ(lamb.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lamb.message().find("optimizer.type"), std::string::npos) << lamb.message();
}

TEST(DsConfigTest, InfersAccumulationFromTrainBatchSize) {
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(4);
  ASSERT_TRUE(Apply(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2})", &config).ok());
  EXPECT_EQ(config.gradient_accumulation_steps(), 8);
}

TEST(DsConfigTest, RejectsInconsistentBatchSizes) {
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(4);
  absl::Status s = Apply(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                             "gradient_accumulation_steps": 2})", &config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("train_batch_size"), std::string::npos) << s;
}

TEST(DsConfigTest, RejectsWrongTypeNamingKeyPath) {
  RunConfig config;
  absl::Status s = Apply("{\n \"zero_optimization\": {\n  \"stage\": \"three\"\n }\n}", &config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "ds_config.json: zero_optimization.stage: expected an integer, got string \"three\"");
}

TEST(DsConfigTest, RejectsStageFour) {
  RunConfig config;
  absl::Status s = Apply(R"({"zero_optimization": {"stage": 4}})", &config);
  EXPECT_NE(s.message().find("stages 0, 1, 2 and 3"), std::string::npos) << s;
}

TEST(DsConfigTest, RejectsNvmeOffload) {
  RunConfig config;
  absl::Status s = Apply(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})", &config);
  EXPECT_NE(s.message().find("NVMe"), std::string::npos) << s;
}

TEST(DsConfigTest, RejectsMalformedJsonWithLine) {
  RunConfig config;
  absl::Status s = Apply("{\n \"zero_optimization\": {\"stage\": 2,}\n}", &config);
  EXPECT_EQ(std::string(s.message()), "ds_config.json:2:34: malformed JSON: a trailing comma before '}'; remove it");
}

TEST(DsConfigTest, ReadsTheActivationCheckpointingBlock) {
  RunConfig config;
  ASSERT_TRUE(Apply(R"({"activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
                       "contiguous_memory_optimization": true, "number_checkpoints": 24}})",
                    &config)
                  .ok());
  const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
  EXPECT_TRUE(ds.partition_activations() && ds.cpu_checkpointing() && ds.contiguous_memory_optimization());
  EXPECT_EQ(ds.number_checkpoints(), 24);
  // The model's code, not the file, decides whether DeepSpeed's checkpoint runs.
  EXPECT_FALSE(ds.enabled());
  const absl::Status s = Apply(R"({"activation_checkpointing": {"number_checkpoints": -1}})", &config);
  EXPECT_NE(s.message().find("activation_checkpointing.number_checkpoints"), std::string::npos) << s;
}

TEST(DsConfigTest, DeprecatedCpuOffloadAlias) {
  RunConfig config;
  ASSERT_TRUE(Apply(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})", &config).ok());
  EXPECT_EQ(config.zero().offload_optimizer(), OFFLOAD_CPU);
}

}  // namespace
}  // namespace zplan
