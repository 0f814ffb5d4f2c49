// File: vision_tower.h
// A vision-language model's vision tower as the step sizes it (llava's CLIP
// tower; vision_language.h reads the config): its blocks as a ModelSpec of
// their own, which BlockLayout, BlockParameters and the per-block
// saved-activation and transient rules walk as they walk a language
// model's, and the tokens it runs and hands on per image.
//
// Example:
//   const ModelSpec tower = TowerSpec(llava);  // CLIPEncoderLayer x num_layers
//   BlockSavedActivations(tower, images, TowerTokensPerImage(llava.vision_language()), ...);
#ifndef ZPLAN_PLANNER_VISION_TOWER_H_
#define ZPLAN_PLANNER_VISION_TOWER_H_

#include <cstdint>

#include "proto/model.pb.h"

namespace zplan {

// The vision tower's blocks as a ModelSpec (only BlockLayout, BlockParameters
// and the per-block saved-activation and transient rules read it), each a
// pre-norm encoder block that attends to every token of its image (or
// window) without a mask: CLIPEncoderLayer (models/clip/modeling_clip.py:
// LayerNorm, q/k/v/out_proj with biases, fc1, the activation, fc2 with
// biases) and Qwen2_5_VLVisionBlock (modeling_qwen2_5_vl.py: RMSNorm, a
// fused qkv, 2-D RoPE, a SwiGLU MLP with biases); Qwen3VLVisionBlock's for
// its parameters. Its rows are images x TowerTokensPerImage. A frozen
// tower's (freeze_vision_tower) has frozen weights.
ModelSpec TowerSpec(const ModelSpec& spec);

// The side of the images the tower runs, in pixels: CLIP's own
// (tower_image_size: its position table is fixed to it), a Qwen tower's
// `image_size` (RunConfig.image_size, a multiple of patch x merge).
int64_t TowerImageSize(const VisionLanguageSpec& v, int64_t image_size);
// Tokens the tower runs per image: CLIP's patches and its CLS token
// (CLIPVisionEmbeddings.forward), a Qwen tower's patches
// (Qwen2VLImageProcessor: (side / patch)^2, the still image repeated over
// temporal_patch_size frames inside each patch).
int64_t TowerTokensPerImage(const VisionLanguageSpec& v, int64_t image_size);
// Image tokens per image in the language model's sequence: llava's patches,
// and the CLS token when vision_feature_select_strategy is "full"
// (LlavaProcessor.replace_image_token); a Qwen tower's patches merged
// spatial_merge_size^2 to one (Qwen2_5_VLProcessor.replace_image_token).
int64_t ImageTokensPerImage(const VisionLanguageSpec& v, int64_t image_size);
// The tower blocks whose output reaches the projector, which run a
// backward: llava's hidden_states[feature_layer] is the output of block
// feature_layer - 1 (hidden_states[0] is the embeddings'; -2, its default,
// leaves the last block and post_layernorm without a gradient); a Qwen
// tower's all.
int TowerBlocksWithGradient(const VisionLanguageSpec& v);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_VISION_TOWER_H_
