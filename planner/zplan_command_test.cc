#include "planner/zplan_command.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "gtest/gtest.h"
#include "planner/proto_io.h"

namespace zplan {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

bool Exists(const std::string& path) { return ReadFile(path).ok(); }

absl::Status RunCapture(const ZplanOptions& o, std::string* text = nullptr) {
  std::ostringstream out;
  absl::Status status = RunZplan(o, out);
  if (text != nullptr) *text = out.str();
  return status;
}

ZplanOptions Base() {
  ZplanOptions o;
  o.model = "1b";
  o.seq = "8192";
  return o;
}

TEST(ZplanCommandTest, GridHasEveryStageAndOffload) {
  std::string text;
  ASSERT_TRUE(RunCapture(Base(), &text).ok());
  for (const char* row : {"0      none", "1      none", "1      optimizer", "2      none", "2      optimizer",
                          "3      none", "3      optimizer ", "3      optimizer+params"}) {
    EXPECT_NE(text.find(row), std::string::npos) << row << "\n" << text;
  }
  EXPECT_NE(text.find("recommended: stage"), std::string::npos);
  EXPECT_NE(text.find("1,235,814,400"), std::string::npos);
}

TEST(ZplanCommandTest, BreakdownNamesEveryComponentAndThePeak) {
  ZplanOptions o = Base();
  o.zero_stage = "3";
  o.offload_optimizer = "cpu";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  for (const char* row : {"params", "grads", "master params", "optimizer states", "activations",
                          "logits and loss", "buffers", "temporaries", "runtime", "allocator band",
                          "GPU peak at:", "host peak while building"}) {
    EXPECT_NE(text.find(row), std::string::npos) << row;
  }
}

TEST(ZplanCommandTest, OutThenShowRoundTripsAsJson) {
  ZplanOptions o = Base();
  o.zero_stage = "3";
  o.offload_optimizer = "cpu";
  o.format = "json";
  std::string direct;
  ASSERT_TRUE(RunCapture(o, &direct).ok());
  o.format = "table";
  o.out = TempPath("roundtrip.pb");
  ASSERT_TRUE(RunCapture(o).ok());
  ZplanOptions show;
  show.command = "show";
  show.plan_path = o.out;
  show.format = "json";
  std::string shown;
  ASSERT_TRUE(RunCapture(show, &shown).ok());
  EXPECT_EQ(shown, direct);
  EXPECT_NE(shown.find("\"total_params\": \"1235814400\""), std::string::npos);
  EXPECT_NE(shown.find("\"peak_bytes\""), std::string::npos);
}

TEST(ZplanCommandTest, CpuRanksHonourAGivenDeviceBudget) {
  ZplanOptions o;
  o.model = "debug-tiny";
  o.seq = "128";
  o.gpu = "cpu";
  o.zero_stage = "0";
  o.gpus = "1";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_EQ(text.find("fits CPU ranks"), std::string::npos) << "no capacity, no budget: nothing to judge\n" << text;
  o.budget_gib = "0.001";  // far below the plan's peak
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("fits CPU ranks"), std::string::npos) << text;
  EXPECT_NE(text.find(": NO (margin -"), std::string::npos) << text;
  o.out = TempPath("cpu_budget.pb");
  ASSERT_TRUE(RunCapture(o).ok());
  auto plan = ReadProtoFile<Plan>(o.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits());
  EXPECT_LT(plan->device_margin_bytes(), 0);
}

TEST(ZplanCommandTest, TimelineIsChromeTraceJson) {
  ZplanOptions o = Base();
  o.zero_stage = "2";
  o.timeline = TempPath("trace.json");
  ASSERT_TRUE(RunCapture(o).ok());
  auto text = ReadFile(o.timeline);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind("{\"displayTimeUnit\"", 0), 0u);
  EXPECT_NE(text->find("\"ph\":\"C\""), std::string::npos);
  EXPECT_NE(text->find("\"name\":\"backward\""), std::string::npos);
}

TEST(ZplanCommandTest, SweepPrintsEveryCombination) {
  ZplanOptions o = Base();
  o.command = "sweep";
  o.micro_batch = "2,4,8";
  o.zero_stage = "2,3";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  int rows = 0;
  for (size_t p = text.find("\n8192 "); p != std::string::npos; p = text.find("\n8192 ", p + 1)) ++rows;
  EXPECT_EQ(rows, 6) << text;
}

TEST(ZplanCommandTest, MaxBatchReportsBatchAndSequence) {
  ZplanOptions o = Base();
  o.command = "max-batch";
  o.zero_stage = "3";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("max micro-batch (seq 8192)"), std::string::npos) << text;
  EXPECT_NE(text.find("max seq (micro-batch 1)"), std::string::npos);
}

TEST(ZplanCommandTest, DsConfigThenFlagsOverride) {
  const std::string path = TempPath("ds.json");
  ASSERT_TRUE(WriteFileAtomically(path, R"({"train_micro_batch_size_per_gpu": 4,
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": true}})")
                  .ok());
  ZplanOptions o = Base();
  o.ds_config = path;
  o.micro_batch = "1";
  o.format = "textproto";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find("stage: 2"), std::string::npos);
  EXPECT_NE(text.find("offload_optimizer: OFFLOAD_CPU"), std::string::npos);
  EXPECT_NE(text.find("micro_batch_size: 1\n"), std::string::npos);
}

// One test per rejection: the error names the field, and nothing is written.
struct BadInput {
  const char* name;
  void (*mutate)(ZplanOptions*);
  const char* message;  // substring of the error
};

class ZplanRejectionTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(ZplanRejectionTest, RejectsWithFieldAndWritesNothing) {
  ZplanOptions o = Base();
  o.zero_stage = "2";
  GetParam().mutate(&o);
  o.out = TempPath(std::string(GetParam().name) + ".pb");
  std::remove(o.out.c_str());
  absl::Status status = RunCapture(o);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(GetParam().message), std::string::npos) << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << "one line: " << status;
  EXPECT_FALSE(Exists(o.out));
}

void WriteBadHf(ZplanOptions* o) {
  o->model.clear();
  o->hf_config = TempPath("bad_heads.json");
  (void)WriteFileAtomically(o->hf_config, R"({"hidden_size": 1000, "num_hidden_layers": 2,
      "num_attention_heads": 3, "intermediate_size": 4000, "vocab_size": 100})");
}

void WriteMalformedDs(ZplanOptions* o) {
  o->ds_config = TempPath("malformed.json");
  (void)WriteFileAtomically(o->ds_config, "{\n  \"zero_optimization\": {\n    \"stage\": 2,\n  }\n}\n");
}

void WriteTorchAdamDs(ZplanOptions* o) {
  o->zero_stage = "0";
  o->ds_config = TempPath("torch_adam.json");
  (void)WriteFileAtomically(o->ds_config, R"({"bf16": {"enabled": true},
                                                "optimizer": {"type": "AdamW", "params": {"torch_adam": true}}})");
}

void WriteWrongTypeDs(ZplanOptions* o) {
  o->ds_config = TempPath("wrongtype.json");
  (void)WriteFileAtomically(o->ds_config, "{\n  \"zero_optimization\": {\"overlap_comm\": \"yes\"}\n}\n");
}

INSTANTIATE_TEST_SUITE_P(
    Rejections, ZplanRejectionTest,
    ::testing::Values(
        BadInput{"unknown_preset", [](ZplanOptions* o) { o->model = "gpt5"; }, "presets: 1b, "},
        BadInput{"heads_not_dividing", WriteBadHf, "heads do not divide hidden_size"},
        BadInput{"dims_heads_not_dividing", [](ZplanOptions* o) { o->hidden = "1000"; o->heads = "3"; },
                 "heads do not divide hidden_size"},
        BadInput{"dims_zero_layers", [](ZplanOptions* o) { o->layers = "0"; }, "--layers: must be >= 1"},
        BadInput{"stage_4", [](ZplanOptions* o) { o->zero_stage = "4"; }, "--zero-stage"},
        BadInput{"zero_seq", [](ZplanOptions* o) { o->seq = "0"; }, "--seq: must be >= 1"},
        BadInput{"negative_batch", [](ZplanOptions* o) { o->micro_batch = "-2"; }, "--micro-batch"},
        BadInput{"zero_gpus", [](ZplanOptions* o) { o->gpus = "0"; }, "--gpus"},
        BadInput{"not_a_number", [](ZplanOptions* o) { o->seq = "8k"; }, "--seq: \"8k\" is not an integer"},
        BadInput{"unreadable_ds", [](ZplanOptions* o) { o->ds_config = "/no/such/ds.json"; }, "/no/such/ds.json"},
        BadInput{"malformed_ds", WriteMalformedDs, "malformed.json:4:"},
        BadInput{"wrong_type_ds", WriteWrongTypeDs, "zero_optimization.overlap_comm: expected true or false"},
        BadInput{"torch_adam_stage0_bf16", WriteTorchAdamDs, "FP16_UnfusedOptimizer, which zplan does not model"},
        BadInput{"unknown_gpu", [](ZplanOptions* o) { o->gpu = "tpu-v5"; }, "h100-80gb"},
        BadInput{"param_offload_stage2", [](ZplanOptions* o) { o->offload_param = "cpu"; }, "needs ZeRO stage 3"},
        BadInput{"opt_offload_stage0", [](ZplanOptions* o) { o->zero_stage = "0"; o->offload_optimizer = "cpu"; },
                 "stage >= 1"},
        BadInput{"two_models", [](ZplanOptions* o) { o->params = "7e9"; }, "give one"},
        BadInput{"tiny_params", [](ZplanOptions* o) { o->model.clear(); o->params = "1000"; }, "--params"},
        BadInput{"list_outside_sweep", [](ZplanOptions* o) { o->micro_batch = "1,2"; }, "zplan sweep"},
        BadInput{"bad_format", [](ZplanOptions* o) { o->format = "yaml"; }, "--format"},
        BadInput{"bad_precision", [](ZplanOptions* o) { o->precision = "int8"; }, "--precision"},
        BadInput{"bf16_on_volta", [](ZplanOptions* o) { o->gpu = "v100-32gb"; }, "no bf16"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return std::string(info.param.name); });

TEST(ZplanCommandTest, ExplicitDimensionsDescribeANewShape) {
  ZplanOptions o = Base();
  o.zero_stage = "3";
  o.layers = "32";
  o.hidden = "4096";
  o.heads = "32";
  o.kv_heads = "8";
  o.ffn = "14336";
  o.vocab = "128256";
  o.format = "textproto";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  // The Llama-3-8B shape with the 1b preset's tied embeddings: 8.03B - 0.525B.
  EXPECT_NE(text.find("total_params: 7504924672"), std::string::npos);
  EXPECT_NE(text.find("head_dim: 128"), std::string::npos);
}

TEST(ZplanCommandTest, FailedRunLeavesExistingPlanUntouched) {
  ZplanOptions o = Base();
  o.zero_stage = "1";
  o.out = TempPath("keep.pb");
  ASSERT_TRUE(RunCapture(o).ok());
  auto before = ReadFile(o.out);
  o.seq = "0";
  EXPECT_FALSE(RunCapture(o).ok());
  EXPECT_EQ(*ReadFile(o.out), *before);
}

TEST(ZplanCommandTest, ShowRejectsCorruptPlan) {
  const std::string path = TempPath("corrupt.pb");
  ASSERT_TRUE(WriteFileAtomically(path, "\x08\xff\xff\xff\xff").ok());
  ZplanOptions o;
  o.command = "show";
  o.plan_path = path;
  EXPECT_EQ(RunCapture(o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zplan
