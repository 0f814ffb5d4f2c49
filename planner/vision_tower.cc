#include "planner/vision_tower.h"

#include "absl/strings/str_cat.h"

namespace zplan {

ModelSpec TowerSpec(const ModelSpec& spec) {
  const VisionLanguageSpec& v = spec.vision_language();
  ModelSpec tower;
  tower.set_name(absl::StrCat(spec.name(), " vision tower"));
  tower.set_num_layers(v.num_layers());
  tower.set_hidden_size(v.hidden_size());
  tower.set_num_attention_heads(v.num_heads());
  tower.set_num_kv_heads(v.num_heads());
  tower.set_head_dim(v.hidden_size() / v.num_heads());
  tower.set_ffn_hidden_size(v.ffn_hidden_size());
  tower.set_norm_placement(NORM_PLACEMENT_PRE);
  // The towers' attention follows the language model's attn_implementation.
  tower.set_attention_impl(spec.attention_impl());
  tower.set_attention_qkv_bias(true);
  tower.set_attention_out_bias(true);
  tower.set_mlp_bias(true);
  switch (v.tower()) {
    case VISION_TOWER_CLIP:
      tower.set_model_type("clip_vision_model");
      // CLIPMLP's ACT2FN[hidden_act]: QuickGELUActivation, or one GELU op.
      tower.set_ffn_type(v.activation() == "quick_gelu" ? FFN_QUICK_GELU : FFN_GELU);
      tower.set_norm_type(NORM_LAYERNORM);
      tower.set_position_embedding(POSITION_LEARNED);  // added once in the embeddings: nothing in the blocks
      tower.set_max_position_embeddings(v.num_position_embeddings());
      break;
    case VISION_TOWER_QWEN2_5_VL:
      // Qwen2_5_VLVisionBlock: RMSNorm, one qkv Linear sliced into q, k, v
      // (views: v keeps the whole output), RoPE on q and k in fp32 from
      // tables the tower makes once, SDPA once per window or image whose
      // outputs torch.cat joins -- a copy proj keeps, as rope_concatenates'
      // contiguous copy -- and a SwiGLU MLP with biases.
      tower.set_model_type("qwen2_5_vl_vision");
      tower.set_ffn_type(FFN_SWIGLU);
      tower.set_norm_type(NORM_RMSNORM);
      tower.set_fused_qkv_projection(true);
      tower.set_position_embedding(POSITION_ROPE);
      tower.set_rope_concatenates(true);
      break;
    default:
      // Qwen3VLVisionBlock (parameters only: its memory is not planned):
      // LayerNorm, the fused qkv, linear_fc1, GELU (tanh), linear_fc2.
      tower.set_model_type("qwen3_vl_vision");
      tower.set_ffn_type(FFN_GELU);
      tower.set_norm_type(NORM_LAYERNORM);
      tower.set_fused_qkv_projection(true);
      tower.set_position_embedding(POSITION_ROPE);
      tower.set_rope_concatenates(true);
      break;
  }
  // Frozen, its weights keep no inputs for their gradients: a LoRA spec
  // without targets (BaseWeightsTrain false, no adapters). Under
  // checkpointing transformers' input-grad hook still gives its blocks'
  // inputs a gradient (memory_model.h).
  if (v.freeze_vision_tower()) tower.mutable_lora()->set_rank(1);
  return tower;
}

int64_t TowerImageSize(const VisionLanguageSpec& v, int64_t image_size) {
  return v.tower() == VISION_TOWER_CLIP || image_size <= 0 ? v.tower_image_size() : image_size;
}

int64_t TowerTokensPerImage(const VisionLanguageSpec& v, int64_t image_size) {
  const int64_t side = TowerImageSize(v, image_size) / v.patch_size();
  return side * side + (v.tower() == VISION_TOWER_CLIP ? 1 : 0);
}

int64_t ImageTokensPerImage(const VisionLanguageSpec& v, int64_t image_size) {
  if (v.tower() != VISION_TOWER_CLIP) {
    const int64_t merged = v.spatial_merge_size() * v.spatial_merge_size();
    return TowerTokensPerImage(v, image_size) / merged;
  }
  return TowerTokensPerImage(v, image_size) - (v.feature_keeps_cls() ? 0 : 1);
}

int TowerBlocksWithGradient(const VisionLanguageSpec& v) {
  if (v.tower() != VISION_TOWER_CLIP) return static_cast<int>(v.num_layers());
  const int64_t index = v.feature_layer() < 0 ? v.num_layers() + 1 + v.feature_layer() : v.feature_layer();
  return static_cast<int>(index);
}

}  // namespace zplan
