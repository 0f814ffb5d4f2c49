#include "planner/step_program.h"

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "planner/gpu_catalog.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/run_config.h"
#include "planner/simulator.h"

namespace zplan {
namespace {

// Sizes of `preset` (or a configs/hf/ file) at a stage, with checkpointing every `every` blocks (0: none).
StepSizes Sizes(const std::string& preset, int stage, int every, int64_t rank = 0) {
  // "<config>+frozen-tower": a vision-language config with its tower frozen.
  absl::string_view name = preset;
  const bool frozen_tower = absl::ConsumeSuffix(&name, "+frozen-tower");
  auto model = absl::EndsWith(name, ".json") ? LoadHfConfig(absl::StrCat("configs/hf/", name))
                                             : LoadPreset(std::string(name));
  EXPECT_TRUE(model.ok()) << model.status();
  if (frozen_tower) model->mutable_vision_language()->set_freeze_vision_tower(true);
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(8);
  config.mutable_zero()->set_stage(stage);
  config.mutable_zero()->set_reduce_bucket_elements(3'000'000);
  config.set_seq_length(512);
  config.set_micro_batch_size(2);
  config.set_activation_checkpointing(every > 0);
  config.set_checkpoint_every_n_layers(std::max(every, 1));
  if (stage == 3) config.mutable_zero()->set_stage3_max_reuse_distance(CountParameters(*model));
  // A Qwen tower's images: 224 px (64 image tokens).
  if (model->has_vision_language() && model->vision_language().tower() != VISION_TOWER_CLIP) config.set_image_size(224);
  config = ResolveRunConfig(config);
  auto sizer = StepSizer::Create(*model, config, *FindGpu(config.cluster().gpu()));
  EXPECT_TRUE(sizer.ok()) << sizer.status();
  return sizer->ForRank(2, 512, rank);
}

// Vision-language models: a tower before the language model, llava's last
// tower block without a backward; checkpointed every block or not at all.
constexpr char kLlavaWide[] = "tiny/llava-wide.json";
constexpr char kQwen2_5Vl[] = "tiny/qwen2_5_vl.json";
constexpr char kLlavaFrozenTower[] = "tiny/llava-wide.json+frozen-tower";
// Mixtures of experts: a dense layer among the MoE ones, the auxiliary loss's kept router logits.
constexpr char kQwen2Moe[] = "tiny/qwen2_moe.json";
constexpr char kQwen3MoeAux[] = "tiny/qwen3_moe-aux.json";
std::vector<int> EveryFor(absl::string_view preset) {
  if (absl::StrContains(preset, "tiny/")) return {0, 1};
  return {0, 1, 2, 3};
}

// Grouping identical blocks changes nothing in the step: the grouped
// program's events are the per-block program's, one for one.
TEST(StepProgramTest, GroupsExpandToThePerBlockProgram) {
  // Gemma 3 1B at seq 512: five sliding layers (past the 512-token window:
  // masked) to one full, and the full layers' RoPE tables freed at layer 5.
  for (const char* preset : {"debug-tiny", "gpt2", "1b", "llama3-8b", "gemma-3-1b-it.json", kLlavaWide, kQwen2_5Vl,
                             kLlavaFrozenTower, kQwen2Moe, kQwen3MoeAux}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int every : EveryFor(preset)) {
        for (int64_t rank : {0, 3, 7}) {
          const StepSizes s = Sizes(preset, stage, every, rank);
          SCOPED_TRACE(std::string(preset) + " stage " + std::to_string(stage) + " every " + std::to_string(every) +
                       " rank " + std::to_string(rank));
          const StepProgram grouped = BuildStepProgram(s), flat = BuildStepProgram(s, /*grouped=*/false);
          const SimulatedStep a = ExpandStepProgram(grouped, s), b = ExpandStepProgram(flat, s);
          ASSERT_EQ(a.events.size(), b.events.size());
          for (size_t i = 0; i < a.events.size(); ++i) {
            ASSERT_EQ(a.events[i].SerializeAsString(), b.events[i].SerializeAsString()) << "event " << i;
          }
          EXPECT_EQ(a.peak.SerializeAsString(), b.peak.SerializeAsString());
          // The grouped program is smaller wherever blocks repeat.
          if (s.num_layers >= 8) {
            EXPECT_LT(grouped.ops.size(), flat.ops.size());
          }
        }
      }
    }
  }
}

// The fast evaluator finds the expansion's peak: bytes, breakdown and event.
TEST(StepProgramTest, PeakIsTheExpansionsPeak) {
  for (const char* preset :
       {"debug-tiny", "gpt2", "1b", "qwen3-0.6b", "llama3-8b", "gemma-3-1b-it.json", kLlavaWide, kQwen2_5Vl,
        kLlavaFrozenTower, kQwen2Moe, kQwen3MoeAux}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int every : EveryFor(preset)) {
        const StepSizes s = Sizes(preset, stage, every);
        const MemoryBreakdown fast = StepPeak(s);
        const SimulatedStep step = SimulateStep(s, /*record_events=*/false);
        EXPECT_EQ(fast.SerializeAsString(), step.peak.SerializeAsString())
            << preset << " stage " << stage << " every " << every << ": fast at \"" << fast.peak_event()
            << "\", expansion at \"" << step.peak.peak_event() << "\"";
        EXPECT_EQ(StepPeakBytes(s), step.peak.peak_bytes());
      }
    }
  }
}

// The allocator replay (allocator_replay.h) maps handles to blocks: every
// ALLOC names a handle not live, every FREE a live one of the same size and
// component, and what is live at the end is the resident state.
TEST(StepProgramTest, ExpandedHandlesPairAllocationsAndFrees) {
  for (const char* preset :
       {"debug-tiny", "1b", "llama3-8b", kLlavaWide, kQwen2_5Vl, kLlavaFrozenTower, kQwen2Moe, kQwen3MoeAux}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int every : EveryFor(preset)) {
        const StepSizes s = Sizes(preset, stage, every);
        const SimulatedStep step = SimulateStep(s);
        ASSERT_EQ(step.event_handles.size(), step.events.size());
        std::map<int, const MemoryEvent*> live;
        for (size_t i = 0; i < step.events.size(); ++i) {
          const MemoryEvent& event = step.events[i];
          const int handle = step.event_handles[i];
          if (event.kind() == MemoryEvent::ALLOC) {
            ASSERT_TRUE(live.emplace(handle, &event).second) << preset << " event " << i << ": handle live";
          } else {
            auto it = live.find(handle);
            ASSERT_NE(it, live.end()) << preset << " event " << i << ": freed handle not live";
            EXPECT_EQ(it->second->bytes(), event.bytes());
            EXPECT_EQ(it->second->component(), event.component());
            live.erase(it);
          }
        }
        for (const auto& [handle, event] : live) EXPECT_EQ(event->phase(), PHASE_INIT) << event->tensor();
      }
    }
  }
}

TEST(StepProgramTest, TensorNameTakesTheLayer) {
  EXPECT_EQ(TensorName("forward, layer #, parameters gathered", 12), "forward, layer 12, parameters gathered");
  EXPECT_EQ(TensorName("the batch", 3), "the batch");
  // After a tower of 24 blocks: its own, and the language model's from 0.
  EXPECT_EQ(TensorName("backward, layer #, MLP gradients", 5, 24), "backward, vision layer 5, MLP gradients");
  EXPECT_EQ(TensorName("backward, layer #, MLP gradients", 53, 24), "backward, layer 29, MLP gradients");
}

}  // namespace
}  // namespace zplan
