#include "tools/recordings.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/proto_io.h"

namespace zplan {
namespace {

using ::testing::HasSubstr;

AccuracyOptions TempOptions() {
  AccuracyOptions o;
  o.root = std::getenv("TEST_TMPDIR");
  return o;
}

TEST(RecordingsTest, InputsCarryTheFilesTheArgumentsName) {
  AccuracyOptions o = TempOptions();
  ASSERT_TRUE(WriteFileAtomically(o.root + "/config.json", "{\"model_type\": \"llama\"}").ok());
  AccuracyCase c{.name = "c", .zplan_args = {"--hf-config", "config.json", "--seq", "128"}};
  Plan plan;
  plan.mutable_config()->set_seq_length(128);
  auto zrun = InputsOf(Suite::kZrun, c, plan, o);
  ASSERT_TRUE(zrun.ok()) << zrun.status();
  EXPECT_EQ(zrun->files().at("config.json"), "{\"model_type\": \"llama\"}");
  EXPECT_EQ(zrun->files().size(), 1u);  // "128" and the flags name no file
  EXPECT_EQ(zrun->config().seq_length(), 128);
  auto deepspeed = InputsOf(Suite::kDeepSpeed, c, plan, o);
  ASSERT_TRUE(deepspeed.ok());
  EXPECT_FALSE(deepspeed->has_config()) << "the oracle does not read the plan";
}

TEST(RecordingsTest, StalenessNamesWhatChanged) {
  AccuracyOptions o = TempOptions();
  ASSERT_TRUE(WriteFileAtomically(o.root + "/a.json", "{}").ok());
  AccuracyCase c{.name = "c", .zplan_args = {"--hf-config", "a.json"}};
  const Producer producer{.sources = "abc 3", .versions = {{"torch", "2.11.0"}}};
  Recording r;
  *r.mutable_inputs() = *InputsOf(Suite::kDeepSpeed, c, Plan(), o);
  r.set_producer_sources(producer.sources);
  r.mutable_versions()->insert({"torch", "2.11.0"});
  EXPECT_EQ(Staleness(r, *InputsOf(Suite::kDeepSpeed, c, Plan(), o), producer), "");

  Producer other_sources = producer;
  other_sources.sources = "abd 3";
  EXPECT_THAT(Staleness(r, r.inputs(), other_sources), HasSubstr("sources changed"));
  Producer other_torch = producer;
  other_torch.versions["torch"] = "2.12.0";
  EXPECT_THAT(Staleness(r, r.inputs(), other_torch), HasSubstr("torch 2.12.0 now, recorded with 2.11.0"));
  ASSERT_TRUE(WriteFileAtomically(o.root + "/a.json", "{\"n\": 1}").ok());
  EXPECT_THAT(Staleness(r, *InputsOf(Suite::kDeepSpeed, c, Plan(), o), producer), HasSubstr("a.json"));
}

TEST(RecordingsTest, ARecordingReadsBackAsWritten) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/suite/case.textproto";
  Recording r;
  r.set_case_name("case");
  r.mutable_report()->add_ranks()->mutable_measured_device()->set_peak_bytes(12345);
  ASSERT_TRUE(WriteRecording(path, r).ok());
  auto back = ReadRecording(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->report().ranks(0).measured_device().peak_bytes(), 12345);
  EXPECT_TRUE(absl::IsNotFound(ReadRecording(path + ".missing").status()));
}

TEST(RecordingsTest, MechanismsNameWhatACaseExercises) {
  Plan plan;
  RunConfig& config = *plan.mutable_config();
  config.mutable_zero()->set_stage(3);
  config.mutable_zero()->set_offload_param(OFFLOAD_CPU);
  config.set_precision(PRECISION_BF16);
  config.set_activation_checkpointing(true);
  config.set_checkpoint_every_n_layers(2);
  config.mutable_cluster()->set_gpus_per_node(8);
  config.mutable_cluster()->set_num_nodes(1);
  plan.mutable_model()->mutable_lora()->add_modules_to_save("lm_head");
  const std::set<std::string> m = Mechanisms(AccuracyCase{.name = "c", .emulate_rank = 5}, plan);
  for (const char* want : {"ZeRO-3", "bf16", "offload parameters", "checkpointing", "checkpointing every k blocks",
                           "LoRA", "LoRA's modules_to_save", "emulated rank"}) {
    EXPECT_EQ(m.count(want), 1u) << want;
  }
  EXPECT_EQ(m.count("world 4+"), 0u) << "an emulated rank is not a world of real ranks";
}

}  // namespace
}  // namespace zplan
