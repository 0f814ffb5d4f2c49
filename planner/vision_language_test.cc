#include "planner/vision_language.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"

namespace zplan {
namespace {

using ::testing::HasSubstr;

int64_t PartCount(const ModelSpec& spec, ModelPart part) {
  int64_t n = 0;
  for (const TensorSpec& t : ParameterInventory(spec)) {
    if (t.part() == part) n += NumElements(t);
  }
  return n;
}

// The counts docs/vlm_sources.md measured with transformers on the meta
// device (Qwen3.5-9B's published config); the whole-model count against
// transformers itself is //tests:param_counts_test.
TEST(VisionLanguageTest, Qwen35PublishedConfigByPart) {
  absl::StatusOr<ModelSpec> spec = LoadHfConfig("configs/hf/qwen3.5-9b.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model_type(), "qwen3_5");
  EXPECT_EQ(spec->vision_language().tower(), VISION_TOWER_QWEN3_VL);
  EXPECT_EQ(spec->vision_language().deepstack_blocks_size(), 0);
  EXPECT_EQ(PartCount(*spec, PART_VISION_TOWER), 415891440);
  EXPECT_EQ(PartCount(*spec, PART_PROJECTOR), 40119040);
  EXPECT_EQ(CountParameters(*spec), 9409813744);
}

// Every plan is sized by StepSizer::Create, which plans a tower's blocks and
// the language model's in one stack (a tower deeper than the language model
// once wrote past the per-layer tables there: the fuzzer's crash on
// Qwen2.5-VL-7B, 32 vision blocks and 28 layers) and refuses images the
// tower does not take.
TEST(VisionLanguageTest, TowersArePlannedInOneStackWithImagesTheyTake) {
  absl::StatusOr<ModelSpec> spec = LoadHfConfig("configs/hf/qwen2.5-vl-7b-instruct.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(8);
  config.mutable_zero()->set_stage(3);
  config.set_seq_length(512);
  // Planned, its 32 vision blocks before the 28 layers, with images of a size it takes.
  absl::Status status = BuildPlan(*spec, config, PlanOptions{}).status();
  EXPECT_THAT(status.message(), HasSubstr("image_size (--image-size): 0"));
  config.set_image_size(448);
  EXPECT_TRUE(BuildPlan(*spec, config, PlanOptions{}).ok());
  // Qwen3.5's tower takes sides in multiples of 32 (16 px patches merged 2 x 2).
  absl::StatusOr<ModelSpec> qwen3_5 = LoadHfConfig("configs/hf/qwen3.5-9b.json");
  ASSERT_TRUE(qwen3_5.ok()) << qwen3_5.status();
  config.set_image_size(464);
  EXPECT_THAT(BuildPlan(*qwen3_5, config, PlanOptions{}).status().message(),
              HasSubstr("multiple of patch_size x spatial_merge_size = 32"));
  config.set_image_size(448);
  EXPECT_TRUE(BuildPlan(*qwen3_5, config, PlanOptions{}).ok());
}

TEST(VisionLanguageTest, TowerAndProjectorComeFirst) {
  const std::string llava = R"({"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000},
      "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 56, "patch_size": 14}})";
  absl::StatusOr<ModelSpec> spec = ModelSpecFromHfConfig(llava, "llava.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<TensorSpec> params = ParameterInventory(*spec);
  EXPECT_EQ(params.front().name(), "vision_tower.embeddings.class_embedding");
  // The blocks as the step sizes them (vision_tower.h): CLIPEncoderLayer's tensors in block-layout order.
  EXPECT_EQ(params[5].name(), "vision_tower.layers.0.attn_norm.weight");
  EXPECT_EQ(params[7].name(), "vision_tower.layers.0.attn.q_proj.weight");
  // The position table: (56 / 14)^2 patches and the CLS token.
  EXPECT_THAT(params[2].shape(), ::testing::ElementsAre(17, 32));
  int first_lm = 0;
  while (params[first_lm].part() != PART_LANGUAGE_MODEL) ++first_lm;
  EXPECT_EQ(params[first_lm - 1].name(), "multi_modal_projector.linear_2.bias");
  EXPECT_EQ(params[first_lm].name(), "embed_tokens.weight");
  EXPECT_EQ(spec->vision_language().feature_layer(), -2);
}

// Qwen3-VL's deepstack mergers train with the tower (the Qwen recipe's
// tune_mm_vision), not with the merger (tune_mm_mlp).
TEST(VisionLanguageTest, DeepstackMergersCountWithTheTower) {
  const std::string qwen3_vl = R"({"model_type": "qwen3_vl", "text_config": {"hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "vocab_size": 1000, "intermediate_size": 128}, "vision_config": {"depth": 3, "hidden_size": 32,
      "num_heads": 4, "intermediate_size": 64, "out_hidden_size": 64, "num_position_embeddings": 64,
      "deepstack_visual_indexes": [1]}})";
  absl::StatusOr<ModelSpec> spec = ModelSpecFromHfConfig(qwen3_vl, "qwen3_vl.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const TensorSpec& t : ParameterInventory(*spec)) {
    if (t.name().find("deepstack_merger_list") != std::string::npos) {
      EXPECT_EQ(t.part(), PART_VISION_TOWER) << t.name();
    } else if (t.name().find("merger.") != std::string::npos) {
      EXPECT_EQ(t.part(), PART_PROJECTOR) << t.name();
    }
  }
  // merger: norm 2C + (4C)^2 + 4C + 4C x O + O, C = 32, O = 64.
  EXPECT_EQ(PartCount(*spec, PART_PROJECTOR), 2 * 32 + 128 * 128 + 128 + 128 * 64 + 64);
}

TEST(VisionLanguageTest, RefusesWhatIsNotModelledByKey) {
  const std::string siglip = R"({"model_type": "llava", "text_config": {"model_type": "llama"},
      "vision_config": {"model_type": "siglip_vision_model"}})";
  EXPECT_THAT(ModelSpecFromHfConfig(siglip, "s.json").status().message(),
              HasSubstr("vision_config.model_type: \"siglip_vision_model\""));
  const std::string layers = R"({"model_type": "llava", "vision_feature_layer": [-2, -5]})";
  EXPECT_THAT(ModelSpecFromHfConfig(layers, "l.json").status().message(), HasSubstr("vision_feature_layer"));
  // The config classes' defaults: a 3584-wide merger into a 4096-wide Qwen3-VL language model.
  const std::string qwen3_vl = R"({"model_type": "qwen3_vl", "text_config": {"hidden_size": 4096,
      "num_hidden_layers": 2, "num_attention_heads": 32, "vocab_size": 1000, "intermediate_size": 128}})";
  EXPECT_THAT(ModelSpecFromHfConfig(qwen3_vl, "q.json").status().message(), HasSubstr("out_hidden_size"));
}

TEST(VisionLanguageTest, FreezePartsByName) {
  VisionLanguageSpec v;
  ASSERT_TRUE(FreezeParts("vision_tower, language_model", &v).ok());
  EXPECT_TRUE(v.freeze_vision_tower());
  EXPECT_FALSE(v.freeze_projector());
  EXPECT_TRUE(v.freeze_language_model());
  const absl::Status unknown = FreezeParts("projector,tower", &v);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("\"tower\" is not a part"));
}

}  // namespace
}  // namespace zplan
