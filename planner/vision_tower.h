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
// and the per-block saved-activation and transient rules read it):
// CLIPEncoderLayer (models/clip/modeling_clip.py) is a pre-norm encoder
// block -- LayerNorm, q/k/v/out_proj with biases, fc1, the activation, fc2
// with biases -- that attends to every token of its image (no mask, no
// RoPE). Its rows are images x TowerTokensPerImage. A frozen tower's
// (freeze_vision_tower) has frozen weights. Only for a llava spec.
ModelSpec TowerSpec(const ModelSpec& spec);

// Tokens the CLIP tower runs per image: the patches and the CLS token
// (CLIPVisionEmbeddings.forward).
int64_t TowerTokensPerImage(const VisionLanguageSpec& v);
// Image tokens per image in the language model's sequence
// (LlavaProcessor.replace_image_token): the patches, and the CLS token when
// vision_feature_select_strategy is "full".
int64_t ImageTokensPerImage(const VisionLanguageSpec& v);
// The tower blocks whose output reaches the projector, which run a
// backward: hidden_states[feature_layer] is the output of block
// feature_layer - 1 (hidden_states[0] is the embeddings'; -2, llava's
// default, leaves the last block and post_layernorm without a gradient).
int TowerBlocksWithGradient(const VisionLanguageSpec& v);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_VISION_TOWER_H_
