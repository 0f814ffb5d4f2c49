#include "planner/vision_tower.h"

#include "absl/strings/str_cat.h"

namespace zplan {

ModelSpec TowerSpec(const ModelSpec& spec) {
  const VisionLanguageSpec& v = spec.vision_language();
  ModelSpec tower;
  tower.set_name(absl::StrCat(spec.name(), " vision tower"));
  tower.set_model_type("clip_vision_model");
  tower.set_num_layers(v.num_layers());
  tower.set_hidden_size(v.hidden_size());
  tower.set_num_attention_heads(v.num_heads());
  tower.set_num_kv_heads(v.num_heads());
  tower.set_head_dim(v.hidden_size() / v.num_heads());
  tower.set_ffn_hidden_size(v.ffn_hidden_size());
  // CLIPMLP's ACT2FN[hidden_act]: QuickGELUActivation, or one GELU op.
  tower.set_ffn_type(v.activation() == "quick_gelu" ? FFN_QUICK_GELU : FFN_GELU);
  tower.set_norm_type(NORM_LAYERNORM);
  tower.set_norm_placement(NORM_PLACEMENT_PRE);
  // CLIPAttention follows the language model's attn_implementation.
  tower.set_attention_impl(spec.attention_impl());
  tower.set_position_embedding(POSITION_LEARNED);  // added once in the embeddings: nothing in the blocks
  tower.set_max_position_embeddings(v.num_position_embeddings());
  tower.set_attention_qkv_bias(true);
  tower.set_attention_out_bias(true);
  tower.set_mlp_bias(true);
  // Frozen, its weights keep no inputs for their gradients: a LoRA spec
  // without targets (BaseWeightsTrain false, no adapters). Under
  // checkpointing transformers' input-grad hook still gives its blocks'
  // inputs a gradient (memory_model.h).
  if (v.freeze_vision_tower()) tower.mutable_lora()->set_rank(1);
  return tower;
}

int64_t TowerTokensPerImage(const VisionLanguageSpec& v) {
  const int64_t side = v.tower_image_size() / v.patch_size();
  return side * side + 1;
}

int64_t ImageTokensPerImage(const VisionLanguageSpec& v) {
  return TowerTokensPerImage(v) - (v.feature_keeps_cls() ? 0 : 1);
}

int TowerBlocksWithGradient(const VisionLanguageSpec& v) {
  const int64_t index = v.feature_layer() < 0 ? v.num_layers() + 1 + v.feature_layer() : v.feature_layer();
  return static_cast<int>(index);
}

}  // namespace zplan
