#include "planner/zplan_command.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "planner/cli.h"
#include "planner/memory_model.h"
#include "planner/proto_io.h"
#include "proto/report.pb.h"

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
                          "logits and loss", "buffers", "temporaries", "runtime", "allocator",
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
  absl::Status status = RunCapture(o, &text);
  EXPECT_EQ(ExitCodeFor(status), kExitBudget) << status;
  EXPECT_NE(text.find("fits CPU ranks"), std::string::npos) << text;
  EXPECT_NE(text.find(": NO (margin -"), std::string::npos) << text;
  // The plan that breaks its budget is still written, and the exit code says so.
  o.out = TempPath("cpu_budget.pb");
  std::remove(o.out.c_str());
  status = RunCapture(o);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(ExitCodeFor(status), kExitBudget);
  EXPECT_TRUE(absl::StartsWith(status.message(), "does not fit (--budget-gib 0.001): the device peak per rank, "))
      << status;
  EXPECT_TRUE(absl::EndsWith(status.message(), ", is over the 1.0 MiB budget; the plan is in " + o.out)) << status;
  auto plan = ReadProtoFile<Plan>(o.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits());
  EXPECT_LT(plan->device_margin_bytes(), 0);
  o.budget_gib = "64";  // a budget it fits: exit 0
  EXPECT_TRUE(RunCapture(o).ok());
}

// Grid, sweep and max-batch plan many configurations: with a budget given,
// exit 3 when none fits it; without one, "none fits" is a finding (exit 0).
TEST(ZplanCommandTest, NothingFittingTheGivenBudgetExitsWithTheBudgetCode) {
  ZplanOptions o = Base();
  std::string text;
  o.budget_gib = "0.5";
  absl::Status status = RunCapture(o, &text);
  EXPECT_EQ(ExitCodeFor(status), kExitBudget) << status;
  EXPECT_EQ(std::string(status.message()), "no row of the grid fits (--budget-gib 0.5)");
  EXPECT_NE(text.find("recommended: none fits"), std::string::npos) << text;
  o.out = TempPath("grid_none.pb");
  std::remove(o.out.c_str());
  status = RunCapture(o);
  EXPECT_EQ(ExitCodeFor(status), kExitBudget) << status;
  EXPECT_NE(status.message().find("nothing written: give --zero-stage"), std::string::npos) << status;
  EXPECT_FALSE(Exists(o.out));
  o.out.clear();
  o.budget_gib = "70";  // some rows fit
  EXPECT_TRUE(RunCapture(o).ok());
  o.budget_gib.clear();
  o.host_ram_gib = "1";  // every row builds the model in more host RAM than that
  status = RunCapture(o);
  EXPECT_EQ(ExitCodeFor(status), kExitBudget) << status;
  EXPECT_EQ(std::string(status.message()), "no row of the grid fits (--host-ram-gib 1)");
  o.host_ram_gib.clear();
  o.command = "sweep";
  o.micro_batch = "2,4";
  o.zero_stage = "2,3";
  o.budget_gib = "1";
  status = RunCapture(o, &text);
  EXPECT_EQ(ExitCodeFor(status), kExitBudget) << status;
  EXPECT_EQ(std::string(status.message()), "no row of the sweep fits (--budget-gib 1)");
  o.command = "max-batch";
  o.micro_batch.clear();
  o.zero_stage.clear();
  status = RunCapture(o, &text);
  EXPECT_EQ(ExitCodeFor(status), kExitBudget) << status;
  o.budget_gib = "70";
  EXPECT_TRUE(RunCapture(o, &text).ok()) << text;
  // Without a budget flag, the GPU's capacity judges the fit but never the exit code.
  o = Base();
  o.seq = "262144";
  o.zero_stage = "0";
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find(": NO (margin -"), std::string::npos) << text;
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

// --plot with the plan it writes, and `show --plot --report` with the plan
// zrun ran; a failed run keeps the picture there was.
TEST(ZplanCommandTest, PlotDrawsThePlanWrittenOrShown) {
  ZplanOptions o = Base();
  o.model = "debug-tiny";
  o.zero_stage = "2";
  o.out = TempPath("plotted.pb");
  o.plot = TempPath("plotted.png");
  ASSERT_TRUE(RunCapture(o).ok());
  auto png = ReadFile(o.plot);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(png->substr(0, 4), "\x89PNG");

  Report report;
  PhaseSample* sample = report.add_ranks()->add_samples();
  sample->set_step(1);
  sample->set_phase(PHASE_BACKWARD);
  sample->set_allocated_bytes(int64_t{1} << 20);
  ZplanOptions show;
  show.command = "show";
  show.plan_path = o.out;
  show.plot = TempPath("shown.svg");
  show.report = TempPath("report.pb");
  ASSERT_TRUE(WriteProtoFile(show.report, report).ok());
  ASSERT_TRUE(RunCapture(show).ok());
  auto svg = ReadFile(show.plot);
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find("<title>debug-tiny · ZeRO-2"), std::string::npos);

  o.seq = "0";
  EXPECT_FALSE(RunCapture(o).ok());
  EXPECT_EQ(*ReadFile(o.plot), *png);
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
  const char* message;        // substring of the error
  const char* hf = nullptr;   // written as the --hf-config file
  const char* ds = nullptr;   // written as the --ds-config file
};

void Nothing(ZplanOptions*) {}

class ZplanRejectionTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(ZplanRejectionTest, RejectsWithFieldAndWritesNothing) {
  ZplanOptions o = Base();
  o.zero_stage = "2";
  const BadInput& input = GetParam();
  if (input.hf != nullptr) {
    o.model.clear();
    o.hf_config = TempPath(std::string(input.name) + "_config.json");
    ASSERT_TRUE(WriteFileAtomically(o.hf_config, input.hf).ok());
  }
  if (input.ds != nullptr) {
    o.ds_config = TempPath(std::string(input.name) + "_ds.json");
    ASSERT_TRUE(WriteFileAtomically(o.ds_config, input.ds).ok());
  }
  input.mutate(&o);
  o.out = TempPath(std::string(input.name) + ".pb");
  std::remove(o.out.c_str());
  absl::Status status = RunCapture(o);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(ExitCodeFor(status), kExitBadInput) << status;
  EXPECT_NE(status.message().find(GetParam().message), std::string::npos) << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << "one line: " << status;
  EXPECT_FALSE(Exists(o.out));
}

void WriteBadHf(ZplanOptions* o) {
  o->model.clear();
  o->hf_config = TempPath("bad_heads.json");
  (void)WriteFileAtomically(o->hf_config, R"({"model_type": "llama", "hidden_size": 1000, "num_hidden_layers": 2,
      "num_attention_heads": 3, "intermediate_size": 4000, "vocab_size": 100})");
}

void WriteMalformedDs(ZplanOptions* o) {
  o->ds_config = TempPath("malformed.json");
  (void)WriteFileAtomically(o->ds_config, "{\n  \"zero_optimization\": {\n    \"stage\": 2,\n  }\n}\n");
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
        BadInput{"dims_zero_layers", [](ZplanOptions* o) { o->layers = "0"; }, "--layers: 0 is outside 1 .. 2048"},
        BadInput{"stage_4", [](ZplanOptions* o) { o->zero_stage = "4"; }, "--zero-stage"},
        BadInput{"zero_seq", [](ZplanOptions* o) { o->seq = "0"; }, "--seq: 0 is outside 1 .. 16777216"},
        BadInput{"negative_batch", [](ZplanOptions* o) { o->micro_batch = "-2"; }, "--micro-batch"},
        BadInput{"zero_gpus", [](ZplanOptions* o) { o->gpus = "0"; }, "--gpus"},
        BadInput{"not_a_number", [](ZplanOptions* o) { o->seq = "8k"; }, "--seq: \"8k\" is not an integer"},
        BadInput{"unreadable_ds", [](ZplanOptions* o) { o->ds_config = "/no/such/ds.json"; }, "/no/such/ds.json"},
        BadInput{"malformed_ds", WriteMalformedDs, "malformed.json:3:15: malformed JSON: a trailing comma"},
        BadInput{"wrong_type_ds", WriteWrongTypeDs, "zero_optimization.overlap_comm: expected true or false"},
        BadInput{"unknown_gpu", [](ZplanOptions* o) { o->gpu = "tpu-v5"; }, "h100-80gb"},
        BadInput{"param_offload_stage2", [](ZplanOptions* o) { o->offload_param = "cpu"; }, "needs ZeRO stage 3"},
        BadInput{"opt_offload_stage0", [](ZplanOptions* o) { o->zero_stage = "0"; o->offload_optimizer = "cpu"; },
                 "stage >= 1"},
        BadInput{"two_models", [](ZplanOptions* o) { o->params = "7e9"; }, "give one"},
        BadInput{"tiny_params", [](ZplanOptions* o) { o->model.clear(); o->params = "1000"; }, "--params"},
        BadInput{"list_outside_sweep", [](ZplanOptions* o) { o->micro_batch = "1,2"; }, "zplan sweep"},
        BadInput{"bad_format", [](ZplanOptions* o) { o->format = "yaml"; }, "--format"},
        BadInput{"bad_precision", [](ZplanOptions* o) { o->precision = "int8"; }, "--precision"},
        BadInput{"bf16_on_volta", [](ZplanOptions* o) { o->gpu = "v100-32gb"; }, "no bf16"},
        // Issue 10's defect classes: each crashed, hung or gave a wrong result before.
        BadInput{"seq_near_2_63", [](ZplanOptions* o) { o->seq = "9e18"; }, "--seq: 9e18 is outside 1 .. 16777216"},
        BadInput{"nodes_near_2_63", [](ZplanOptions* o) { o->nodes = "9e18"; }, "--nodes: 9e18 is outside"},
        BadInput{"gpus_1e9", [](ZplanOptions* o) { o->gpus = "1e9"; }, "--gpus: 1e9 is outside 1 .. 1024"},
        BadInput{"world_too_large", [](ZplanOptions* o) { o->gpus = "1024"; o->nodes = "1024"; },
                 "more than the 262144 ranks"},
        BadInput{"budget_nan", [](ZplanOptions* o) { o->budget_gib = "nan"; }, "--budget-gib: \"nan\" is not"},
        BadInput{"host_ram_inf", [](ZplanOptions* o) { o->host_ram_gib = "inf"; }, "--host-ram-gib"},
        BadInput{"scores_overflow", [](ZplanOptions* o) { o->seq = "16777216"; o->micro_batch = "1024"; },
                 "the attention scores (micro-batch x heads x seq x seq) would take about"},
        BadInput{"hf_hidden_2_32", Nothing, "model.hidden_size: 4294967296 is outside",
                 R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4294967296,
                     "num_attention_heads": 1, "intermediate_size": 64, "vocab_size": 100})"},
        BadInput{"hf_layers_50000", Nothing, "model.num_layers: 50000 is outside 1 .. 2048",
                 R"({"model_type": "llama", "num_hidden_layers": 50000, "hidden_size": 64,
                     "num_attention_heads": 1, "intermediate_size": 64, "vocab_size": 100})"},
        BadInput{"hf_int_1e300", Nothing, "num_hidden_layers: 1e+300 is too large to be a count",
                 R"({"model_type": "llama", "num_hidden_layers": 1e300, "hidden_size": 64,
                     "num_attention_heads": 1, "intermediate_size": 64, "vocab_size": 100})"},
        BadInput{"hf_no_vocab", Nothing, "vocab_size: missing",
                 R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                     "num_attention_heads": 1, "intermediate_size": 64})"},
        BadInput{"hf_multimodal", Nothing, "text_config: a multimodal config (model_type \"gemma3\")",
                 R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 64}})"},
        BadInput{"hf_vision_language", Nothing, "image_size (--image-size): 0; qwen3_vl takes square images",
                 R"({"model_type": "qwen3_vl", "text_config": {"hidden_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000,
                     "intermediate_size": 128}, "vision_config": {"depth": 3, "hidden_size": 32, "num_heads": 4,
                     "intermediate_size": 64, "out_hidden_size": 64, "num_position_embeddings": 64,
                     "deepstack_visual_indexes": [1]}})"},
        BadInput{"hf_vision_language_image_size", Nothing, "image_size (--image-size): 0",
                 R"({"model_type": "qwen2_5_vl", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
                     "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 64,
                     "out_hidden_size": 64, "fullatt_block_indexes": [1]}})"},
        BadInput{"hf_moe", Nothing, "n_routed_experts: a mixture of experts of model_type \"deepseek_v2\" is not modelled",
                 R"({"model_type": "deepseek_v2", "num_hidden_layers": 2, "hidden_size": 64, "n_routed_experts": 8,
                     "num_attention_heads": 1, "intermediate_size": 64, "vocab_size": 100})"},
        BadInput{"hf_moe_aux_fused_loss", [](ZplanOptions* o) { o->loss = "liger-fused"; },
                 "output_router_logits: the auxiliary load-balancing loss beside Liger's fused cross-entropy is not "
                 "planned",
                 R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_experts": 8,
                     "output_router_logits": true, "num_attention_heads": 1, "intermediate_size": 64,
                     "vocab_size": 100})"},
        BadInput{"hf_moe_top_k", Nothing, "num_experts_per_tok: 9: must be between 1 and num_experts (8)",
                 R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_experts": 8,
                     "num_experts_per_tok": 9, "num_attention_heads": 1, "intermediate_size": 64,
                     "vocab_size": 100})"},
        BadInput{"hf_moe_dense_layers", Nothing, "mlp_only_layers: must hold layer indices",
                 R"({"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_experts": 8,
                     "mlp_only_layers": ["first"], "num_attention_heads": 1, "intermediate_size": 64,
                     "vocab_size": 100})"},
        BadInput{"hf_moe_experts_impl", Nothing, "_experts_implementation: \"sonicmoe\" is not modelled",
                 R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64, "num_local_experts": 4,
                     "_experts_implementation": "sonicmoe", "num_attention_heads": 1, "intermediate_size": 64,
                     "vocab_size": 100})"},
        BadInput{"experts_on_dense", [](ZplanOptions* o) { o->experts = "eager"; }, "--experts: eager: the model has no"},
        BadInput{"routing_no_file", [](ZplanOptions* o) { o->routing = "/no/such/routing.json"; },
                 "--routing: /no/such/routing.json: no such file; give balanced, worst"},
        BadInput{"routing_on_dense", [](ZplanOptions* o) { o->routing = "configs/routing/qwen3_moe-tiny.json"; },
                 "has none: leave --routing out"},
        BadInput{"hf_moe_eager_gpt_oss", Nothing, "\"eager\" with GptOssExperts' own loop",
                 R"({"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64, "num_local_experts": 4,
                     "_experts_implementation": "eager", "num_attention_heads": 2, "num_key_value_heads": 1,
                     "head_dim": 32, "intermediate_size": 64, "vocab_size": 100})"},
        BadInput{"hf_moe_routing_other_config", [](ZplanOptions* o) {
                   o->routing = "configs/routing/qwen3_moe-tiny.json"; },
                 "qwen3_moe-tiny.json: layer 0: 8 counts, but the model has 4 experts",
                 R"({"model_type": "mixtral", "num_hidden_layers": 3, "hidden_size": 64, "num_local_experts": 4,
                     "_experts_implementation": "eager", "num_attention_heads": 1, "intermediate_size": 64,
                     "vocab_size": 100})"},
        BadInput{"hf_name_lone_surrogate", Nothing, "config.json:1:21: malformed JSON: missing low surrogate",
                 R"({"_name_or_path": "a\ud800b", "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                     "num_attention_heads": 1, "intermediate_size": 64, "vocab_size": 100})"},
        BadInput{"hf_name_invalid_utf8", Nothing, "config.json:1:21: malformed JSON: encountered non UTF-8",
                 "{\"_name_or_path\": \"a\xff\", \"model_type\": \"llama\", \"num_hidden_layers\": 2, "
                 "\"hidden_size\": 64, \"num_attention_heads\": 1, \"intermediate_size\": 64, \"vocab_size\": 100}"},
        BadInput{"ds_micro_zero", Nothing, "train_micro_batch_size_per_gpu: 0 is outside 1 ..", nullptr,
                 R"({"train_micro_batch_size_per_gpu": 0, "train_batch_size": 16})"},
        BadInput{"ds_accum_zero", Nothing, "gradient_accumulation_steps: 0 is outside 1 ..", nullptr,
                 R"({"gradient_accumulation_steps": 0, "train_batch_size": 16})"},
        BadInput{"ds_batch_not_divisible", Nothing, "15 != micro-batch 2 x accumulation 1 x world size 8", nullptr,
                 R"({"train_batch_size": 15, "train_micro_batch_size_per_gpu": 2})"},
        BadInput{"ds_autoep", Nothing, "expert_parallel.enabled: DeepSpeed's AutoEP", nullptr,
                 R"({"expert_parallel": {"enabled": true, "autoep_size": 2}})"},
        BadInput{"ds_leaf_module", Nothing, "zero_optimization.leaf_module: leaf modules other than", nullptr,
                 R"({"zero_optimization": {"stage": 3, "leaf_module": {"classes": ["MyMoE"]}}})"},
        BadInput{"ds_fp16_and_bf16", Nothing, "fp16 and bf16 are both enabled", nullptr,
                 R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"},
        BadInput{"ds_bucket_1e300", Nothing, "too large to be a count", nullptr,
                 R"({"zero_optimization": {"reduce_bucket_size": 1e300}})"},
        BadInput{"ds_lr_negative", Nothing, "optimizer.learning_rate (optimizer.params.lr): -1 is outside", nullptr,
                 R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})"},
        // LoRA (issue 11).
        BadInput{"lora_r_zero", [](ZplanOptions* o) { o->lora_r = "0"; }, "--lora-r: 0 is outside 1 .. 2048"},
        BadInput{"lora_r_wider_than_model", [](ZplanOptions* o) { o->lora_r = "4096"; }, "--lora-r: 4096 is outside"},
        BadInput{"lora_unknown_target", [](ZplanOptions* o) { o->lora_targets = "q_proj,c_attn"; },
                 "--lora-targets: model.lora.target_modules: \"c_attn\" is not a block linear"},
        BadInput{"lora_save_unknown_module", [](ZplanOptions* o) { o->lora_modules_to_save = "score"; },
                 "--lora-modules-to-save: model.lora.modules_to_save: \"score\" is not modelled"},
        BadInput{"lora_save_tied_head", [](ZplanOptions* o) { o->lora_modules_to_save = "lm_head"; },
                 "--lora-modules-to-save: model.lora.modules_to_save: \"lm_head\" needs a language model with "
                 "untied embeddings"},
        BadInput{"lora_save_head_zero3_bf16",
                 [](ZplanOptions* o) {
                   o->model = "debug-tiny";
                   o->lora_modules_to_save = "lm_head";
                   o->zero_stage = "3";
                 },
                 "model.lora.modules_to_save: at ZeRO-3 with zero.Init and bf16/fp16"},
        BadInput{"lora_missing_config", [](ZplanOptions* o) { o->lora_config = "/no/such/adapter_config.json"; },
                 "/no/such/adapter_config.json"},
        // ViT (issue 11): the image fixes the sequence; shapes it cannot plan are named.
        BadInput{"vit_seq_not_the_image", [](ZplanOptions* o) { o->seq = "256"; },
                 "seq_length (--seq): 256, but a ViT's sequence is fixed by its image: (256 / 16)^2 patches + CLS = 257",
                 R"({"model_type": "vit", "image_size": 256})"},
        BadInput{"vit_patch_not_dividing", Nothing, "model.vision.image_size: 100 is not a multiple of patch_size 16",
                 R"({"model_type": "vit", "image_size": 100})"},
        BadInput{"vit_not_square", Nothing, "image_size: zplan plans square images and patches",
                 R"({"model_type": "vit", "image_size": [224, 160]})"},
        BadInput{"vit_side_1e300", Nothing, "image_size: 1e+300 is not a side of 1 .. 65536 pixels",
                 R"({"model_type": "vit", "image_size": [1e300, 1e300]})"},
        BadInput{"vit_patches_too_many", Nothing, "model.vision: 4294967297 patch tokens is more than",
                 R"({"model_type": "vit", "image_size": 65536, "patch_size": 1})"},
        BadInput{"vit_quick_gelu", Nothing, "hidden_act: \"quick_gelu\" is not modelled in vit's MLP; use \"gelu\"",
                 R"({"model_type": "vit", "hidden_act": "quick_gelu"})"},
        // --plot and --report: refused before any planning.
        BadInput{"plot_jpeg", [](ZplanOptions* o) { o->plot = TempPath("step.jpg"); },
                 "names no image format; give a path ending in .png or .svg"},
        BadInput{"plot_missing_dir", [](ZplanOptions* o) { o->plot = "/no/such/dir/step.png"; },
                 "--plot: cannot write /no/such/dir/step.png"},
        BadInput{"report_without_plot", [](ZplanOptions* o) { o->report = "/no/such/report.pb"; },
                 "--report: its samples are drawn on --plot"},
        BadInput{"report_missing", [](ZplanOptions* o) {
                   o->plot = TempPath("step.png");
                   o->report = "/no/such/report.pb";
                 },
                 "--report: /no/such/report.pb: no such file"},
        BadInput{"report_without_samples", [](ZplanOptions* o) {
                   o->plot = TempPath("step.png");
                   o->report = TempPath("empty_report.pb");
                   (void)WriteFileAtomically(o->report, "");  // parses as a Report with no ranks
                 },
                 "--report: the report has no ranks"},
        BadInput{"plot_in_sweep", [](ZplanOptions* o) {
                   o->command = "sweep";
                   o->plot = TempPath("step.svg");
                 },
                 "--plot draws one plan"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return std::string(info.param.name); });

// LoRA from flags: the adapters train, the rest is frozen; the header says how many train.
TEST(ZplanCommandTest, LoraFlagsPlanTheAdaptersOnly) {
  ZplanOptions o = Base();
  o.zero_stage = "2";
  o.format = "json";
  std::string full, lora;
  ASSERT_TRUE(RunCapture(o, &full).ok());
  o.lora_r = "16";
  o.lora_targets = "all-linear";
  ASSERT_TRUE(RunCapture(o, &lora).ok());
  EXPECT_NE(lora.find("\"rank\": \"16\""), std::string::npos) << lora.substr(0, 2000);
  EXPECT_NE(lora.find("\"frozen\": true"), std::string::npos);
  o.format = "table";
  ASSERT_TRUE(RunCapture(o, &lora).ok());
  EXPECT_NE(lora.find(" trainable), seq 8192"), std::string::npos) << lora;
}

// modules_to_save lm_head: the grid leaves out the ZeRO-3 rows DeepSpeed
// cannot start in bf16 and says why; in fp32 they are planned.
TEST(ZplanCommandTest, LoraHeadCopyLeavesOutZero3OnlyWhereDeepSpeedFails) {
  ZplanOptions o = Base();
  o.model = "debug-tiny";
  o.seq = "256";
  o.lora_modules_to_save = "lm_head";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find(" trainable), seq 256"), std::string::npos) << text;
  EXPECT_EQ(text.find("\n3      "), std::string::npos) << text;
  EXPECT_NE(text.find("ZeRO-3 rows left out: DeepSpeed cannot partition peft's fp32 adapters"), std::string::npos);
  o.precision = "fp32";
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("\n3      optimizer+params"), std::string::npos) << text;
}

// transformers' activation_checkpointing_enable(every_n_layers=2,
// offload=True): half the blocks keep all they save; the checkpointed
// blocks' inputs go to pinned host memory.
TEST(ZplanCommandTest, CheckpointEveryAndOffloadMoveActivations) {
  ZplanOptions o = Base();
  o.zero_stage = "0";
  o.gpus = "1";
  o.checkpointing = "true";
  o.out = TempPath("every.pb");
  ASSERT_TRUE(RunCapture(o).ok());
  auto every = ReadProtoFile<Plan>(o.out);
  o.checkpoint_every = "2";
  ASSERT_TRUE(RunCapture(o).ok());
  auto every2 = ReadProtoFile<Plan>(o.out);
  o.checkpoint_offload = "true";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("activation checkpointing every 2 blocks, inputs offloaded"), std::string::npos) << text;
  auto offloaded = ReadProtoFile<Plan>(o.out);
  ASSERT_TRUE(every.ok() && every2.ok() && offloaded.ok());
  // Tensor bytes at the peak (the allocator's cache may hide the difference).
  auto tensors = [](const Plan& p) { return LiveTensorBytes(p.device_per_rank()); };
  EXPECT_GT(tensors(*every2), tensors(*every));
  EXPECT_LT(tensors(*offloaded), tensors(*every2));
  // 16 blocks, 8 checkpointed: 8 inputs of 1 x 8192 x 2048 bf16 (32 MiB each).
  EXPECT_EQ(offloaded->host_per_node().activations_bytes(), 8 * (int64_t{32} << 20));
  EXPECT_EQ(offloaded->host_per_node().pinned_bytes() - every2->host_per_node().pinned_bytes(), 8 * (int64_t{32} << 20));
  // Offload without checkpointing names the flags.
  o.checkpointing = "false";
  const absl::Status status = RunCapture(o);
  EXPECT_NE(status.message().find("--checkpoint-offload"), std::string::npos) << status;
  EXPECT_NE(status.message().find("--checkpointing true"), std::string::npos) << status;
}

// --checkpoint-function deepspeed applies the DeepSpeed config's
// activation_checkpointing block; without it the block changes nothing.
TEST(ZplanCommandTest, CheckpointFunctionAppliesTheDeepSpeedBlock) {
  const std::string ds_config = TempPath("ds_checkpointing.json");
  ASSERT_TRUE(WriteFileAtomically(
                  ds_config, R"({"bf16": {"enabled": true}, "activation_checkpointing":
                                 {"partition_activations": true, "cpu_checkpointing": true}})")
                  .ok());
  ZplanOptions o = Base();
  o.zero_stage = "2";
  o.gpus = "1";
  o.checkpointing = "true";
  o.ds_config = ds_config;
  o.out = TempPath("torch.pb");
  ASSERT_TRUE(RunCapture(o).ok());
  auto torch = ReadProtoFile<Plan>(o.out);
  o.checkpoint_function = "deepspeed";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("(deepspeed.checkpointing, partitioned, to CPU)"), std::string::npos) << text;
  auto deepspeed = ReadProtoFile<Plan>(o.out);
  ASSERT_TRUE(torch.ok() && deepspeed.ok());
  // 16 inputs of 1 x 8192 x 2048 bf16 (32 MiB) in pageable host memory.
  EXPECT_EQ(torch->host_per_node().activations_bytes(), 0);
  EXPECT_EQ(deepspeed->host_per_node().activations_bytes(), 16 * (int64_t{32} << 20));
  EXPECT_EQ(deepspeed->host_per_node().pinned_bytes(), torch->host_per_node().pinned_bytes());
  EXPECT_LT(LiveTensorBytes(deepspeed->device_per_rank()), LiveTensorBytes(torch->device_per_rank()));
  o.checkpoint_function = "megatron";
  const absl::Status status = RunCapture(o);
  EXPECT_NE(status.message().find("--checkpoint-function"), std::string::npos) << status;
  EXPECT_NE(status.message().find("torch or deepspeed"), std::string::npos) << status;
}

// The grid shows each row's peak with Liger's fused loss ('-' at ZeRO-3);
// --loss liger-fused plans it, leaves ZeRO-3 out of its grid, and a stage-3
// breakdown or an unknown value is refused naming the flag.
TEST(ZplanCommandTest, FusedLossColumnAndFlag) {
  ZplanOptions o = Base();
  o.micro_batch = "2";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("fused loss GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("lm_head.weight partitioned"), std::string::npos) << text;
  o.loss = "liger-fused";
  ASSERT_TRUE(RunCapture(o, &text).ok());
  EXPECT_NE(text.find("Liger fused loss"), std::string::npos) << text;
  EXPECT_EQ(text.find("3      none"), std::string::npos) << text;
  EXPECT_NE(text.find("ZeRO-3 rows left out"), std::string::npos) << text;
  o.zero_stage = "2";
  ASSERT_TRUE(RunCapture(o, &text).ok());
  // The loss no longer sets the peak (backward does).
  EXPECT_EQ(text.find("log-softmax"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU peak at: backward"), std::string::npos) << text;
  o.zero_stage = "3";
  absl::Status status = RunCapture(o);
  EXPECT_NE(status.message().find("--loss liger-fused"), std::string::npos) << status;
  o.loss = "chunked";
  status = RunCapture(o);
  EXPECT_NE(status.message().find("full or liger-fused"), std::string::npos) << status;
}

// --kernels picks fla's and causal-conv1d's kernels where the model has
// their layers, says so in the header, and refuses them elsewhere.
TEST(ZplanCommandTest, KernelsFlagPlansThePackagesTransformersWouldImport) {
  ZplanOptions o = Base();
  o.model.clear();
  o.hf_config = TempPath("qwen3_5_kernels.json");
  ASSERT_TRUE(WriteFileAtomically(o.hf_config, R"({"model_type": "qwen3_5_text", "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
      "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 48,
      "linear_value_head_dim": 32, "vocab_size": 3072})").ok());
  o.seq = "4096";
  o.zero_stage = "2";
  o.format = "textproto";
  std::string fallback, fused;
  ASSERT_TRUE(RunCapture(o, &fallback).ok());
  EXPECT_TRUE(absl::StrContains(fallback, "linear_attention_impl: LINEAR_ATTENTION_TORCH")) << fallback;
  o.kernels = "fla, causal_conv1d";
  ASSERT_TRUE(RunCapture(o, &fused).ok());
  EXPECT_TRUE(absl::StrContains(fused, "linear_attention_impl: LINEAR_ATTENTION_FLA")) << fused;
  EXPECT_TRUE(absl::StrContains(fused, "short_conv_impl: SHORT_CONV_CAUSAL_CONV1D")) << fused;
  o.format = "table";
  ASSERT_TRUE(RunCapture(o, &fused).ok());
  EXPECT_TRUE(absl::StrContains(fused, "linear attention by fla, short conv by causal-conv1d")) << fused;
  o.kernels = "flash_attn";
  EXPECT_TRUE(absl::StrContains(RunCapture(o).message(), "none, or fla and causal_conv1d"));
  o = Base();
  o.kernels = "fla";
  EXPECT_TRUE(absl::StrContains(RunCapture(o).message(), "--kernels fla: 1b has no linear-attention layers"))
      << RunCapture(o);
}

// A ViT's image gives its sequence: zplan plans it without --seq, and the
// max-seq search answers the image's own.
TEST(ZplanCommandTest, VitTakesItsSequenceFromTheImage) {
  ZplanOptions o = Base();
  o.model = "vit-b-encoder";
  o.seq.clear();
  o.zero_stage = "3";
  o.out = TempPath("vit.pb");
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find("(85,846,274 parameters), seq 257"), std::string::npos) << text;
  auto plan = ReadProtoFile<Plan>(o.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config().seq_length(), 257);
  o.command = "max-batch";
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find("max seq (micro-batch 1)"), std::string::npos) << text;
  EXPECT_NE(text.find("  257\n"), std::string::npos) << text;
}

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

std::string SmallConfig(const std::string& model_type) {
  return R"({"model_type": ")" + model_type + R"(", "hidden_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1000})";
}

// zplan count: the parameters per part, all and trainable (with LoRA the
// adapters alone); --format json is protobuf's, textproto is refused.
TEST(ZplanCommandTest, CountPrintsParametersAndTrainableOnes) {
  ZplanOptions o;
  o.command = "count";
  o.model = "debug-tiny";
  o.format = "json";
  auto count = [&o](absl::string_view key) -> int64_t {
    std::string text;
    EXPECT_TRUE(RunCapture(o, &text).ok()) << text;
    const size_t at = text.find(absl::StrCat("\"", key, "\": "));
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + key.size() + 4));
  };
  const int64_t total = count("total_params");
  EXPECT_GT(total, 0);
  EXPECT_EQ(count("trainable_params"), total);
  o.lora_r = "4";
  o.lora_targets = "q_proj,v_proj";
  const int64_t adapters = count("trainable_params");
  EXPECT_GT(adapters, 0);
  EXPECT_LT(adapters, total / 10);
  EXPECT_EQ(count("total_params"), total + adapters);
  o.format = "textproto";
  EXPECT_EQ(ExitCodeFor(RunCapture(o)), kExitBadInput);
}

// A config.json whose model_type has no family is refused, naming the field,
// the value, the supported types and the flag; with --approximate-as it is
// planned as that family, and the plan and every text output say so.
TEST(ZplanCommandTest, UnsupportedModelTypeIsRefusedOrPlannedAsAMarkedApproximation) {
  ZplanOptions o;
  o.seq = "256";
  o.zero_stage = "2";
  for (const std::string type : {"bert", "starcoder2"}) {
    o.hf_config = TempPath(type + ".json");
    ASSERT_TRUE(WriteFileAtomically(o.hf_config, SmallConfig(type)).ok());
    o.out = TempPath(type + ".pb");
    const absl::Status status = RunCapture(o);
    EXPECT_EQ(ExitCodeFor(status), kExitBadInput) << status;
    EXPECT_NE(status.message().find("model_type: \"" + type + "\" is not supported; zplan plans llama, mistral, "
                                    "qwen2, qwen3, granite, granitemoehybrid, phi3, olmo2, olmo3, smollm3, glm4, gemma3_text, gemma2, gemma4_text, lfm2, qwen3_5_text, qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3, gpt2, vit. Planning it as one of those is an unvalidated "
                                    "approximation: to accept that, add --approximate-as FAMILY"),
              std::string::npos)
        << status;
    EXPECT_FALSE(Exists(o.out));
  }
  const std::string line =
      "\nmodel_type \"starcoder2\" planned as llama: an unvalidated approximation, nothing about \"starcoder2\" was "
      "checked\n";
  o.approximate_as = "llama";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find(line), std::string::npos) << "breakdown\n" << text;
  EXPECT_LT(text.find(line), text.find("component")) << "near the top\n" << text;
  auto plan = ReadProtoFile<Plan>(o.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->model().model_type(), "starcoder2");
  EXPECT_EQ(plan->model().unvalidated_approximation(), line.substr(1, line.size() - 2));
  ZplanOptions show;
  show.command = "show";
  show.plan_path = o.out;
  ASSERT_TRUE(RunCapture(show, &text).ok()) << text;
  EXPECT_NE(text.find(line), std::string::npos) << "show\n" << text;
  o.out.clear();
  o.zero_stage.clear();
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find(line), std::string::npos) << "grid\n" << text;
  o.command = "sweep";
  o.micro_batch = "1,2";
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find(line), std::string::npos) << "sweep\n" << text;
  o.command = "max-batch";
  o.micro_batch.clear();
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find(line), std::string::npos) << "max-batch\n" << text;
  // Only for a config.json.
  ZplanOptions preset = Base();
  preset.approximate_as = "llama";
  EXPECT_NE(RunCapture(preset).message().find("--approximate-as: only with --hf-config"), std::string::npos);
}

// --params is no transformers model: its standard shape says so, as its source does.
TEST(ZplanCommandTest, ParamsShapeSaysItIsAStandardShape) {
  ZplanOptions o;
  o.params = "7.5e9";
  o.gpus = "64";
  std::string text;
  ASSERT_TRUE(RunCapture(o, &text).ok()) << text;
  EXPECT_NE(text.find("\nmodel: standard shape for --params 7500000000: GPT-3-style blocks"), std::string::npos)
      << text;
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

// A plan cut short still parses as a protobuf (fields are optional); `show`
// printed it as an all-zero plan and zrun ran it with every check off.
TEST(ZplanCommandTest, ShowRejectsEveryTruncationEmptyFileAndDirectory) {
  ZplanOptions o = Base();
  o.model = "debug-tiny";
  o.zero_stage = "3";
  o.out = TempPath("whole.pb");
  ASSERT_TRUE(RunCapture(o).ok());
  const std::string whole = *ReadFile(o.out);
  ZplanOptions show;
  show.command = "show";
  show.plan_path = o.out;
  ASSERT_TRUE(RunCapture(show).ok());
  show.plan_path = TempPath("cut.pb");
  for (size_t length = 0; length < whole.size(); length += length + 64 < whole.size() ? 97 : 1) {
    ASSERT_TRUE(WriteFileAtomically(show.plan_path, whole.substr(0, length)).ok());
    const absl::Status status = RunCapture(show);
    ASSERT_EQ(ExitCodeFor(status), kExitBadInput) << "cut at " << length << " of " << whole.size() << ": " << status;
  }
  show.plan_path = std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  const absl::Status directory = RunCapture(show);
  EXPECT_EQ(ExitCodeFor(directory), kExitBadInput) << directory;
  EXPECT_NE(directory.message().find("is a directory"), std::string::npos) << directory;
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
