#include "planner/vision_tower.h"

#include <string>

#include "gtest/gtest.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"

namespace zplan {
namespace {

constexpr char kLlava[] = R"({"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": 56, "patch_size": 14}})";

// CLIPEncoderLayer's tensors, as transformers registers them: k, v, q, out_proj
// [C, C] + [C], layer_norm1 2C, fc1 [I, C] + [I], fc2 [C, I] + [C], layer_norm2 2C.
TEST(VisionTowerTest, BlocksAreClipEncoderLayers) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromHfConfig(kLlava, "llava.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelSpec tower = TowerSpec(*spec);
  EXPECT_EQ(tower.ffn_type(), FFN_QUICK_GELU);  // CLIPVisionConfig's default hidden_act
  int64_t elements = 0;
  for (const TensorSpec& t : BlockParameters(tower, 1)) elements += NumElements(t);
  const int64_t c = 32, i = 64;
  EXPECT_EQ(elements, 4 * (c * c + c) + 2 * c + (i * c + i) + (c * i + c) + 2 * c);
}

// 56 / 14 = 4 patches a side: 16 patches and the CLS token run; the default
// select strategy drops the CLS token; vision_feature_layer -2 is block 1's
// output, so blocks 0 and 1 of 3 get a gradient.
TEST(VisionTowerTest, TokensAndTheBlocksThatGetAGradient) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromHfConfig(kLlava, "llava.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  VisionLanguageSpec v = spec->vision_language();
  EXPECT_EQ(TowerTokensPerImage(v, 0), 17);
  EXPECT_EQ(ImageTokensPerImage(v, 0), 16);
  EXPECT_EQ(TowerBlocksWithGradient(v), 2);
  v.set_feature_keeps_cls(true);
  v.set_feature_layer(-1);
  EXPECT_EQ(ImageTokensPerImage(v, 0), 17);
  EXPECT_EQ(TowerBlocksWithGradient(v), 3);
  v.set_feature_layer(1);  // hidden_states[1]: block 0's output
  EXPECT_EQ(TowerBlocksWithGradient(v), 1);
}

// Qwen2.5-VL: the side is the run's; 448 px in 14 px patches is 32 x 32
// patches, merged 2 x 2 into 256 image tokens; every block gets a gradient.
TEST(VisionTowerTest, QwenTowersTakeTheRunsImages) {
  const std::string qwen2_5_vl = R"({"model_type": "qwen2_5_vl", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
      "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 64,
      "out_hidden_size": 64, "fullatt_block_indexes": [1]}})";
  absl::StatusOr<ModelSpec> spec = ModelSpecFromHfConfig(qwen2_5_vl, "qwen2_5_vl.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const VisionLanguageSpec& v = spec->vision_language();
  EXPECT_EQ(TowerTokensPerImage(v, 448), 1024);
  EXPECT_EQ(ImageTokensPerImage(v, 448), 256);
  EXPECT_EQ(TowerBlocksWithGradient(v), 2);
  const ModelSpec tower = TowerSpec(*spec);
  EXPECT_TRUE(tower.fused_qkv_projection() && tower.mlp_bias());
  EXPECT_EQ(tower.ffn_type(), FFN_SWIGLU);
  EXPECT_EQ(tower.norm_type(), NORM_RMSNORM);
  // Its multimodal RoPE makes the language model's tables per sequence.
  EXPECT_TRUE(spec->rope_tables_per_sequence());
}

}  // namespace
}  // namespace zplan
