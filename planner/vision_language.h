// File: vision_language.h
// Vision-language models as transformers 5.23.0 builds them (docs/vlm_sources.md):
// llava (a CLIP tower, LlavaMultiModalProjector, any supported language
// model), qwen2_5_vl, qwen3_vl and qwen3_5 with its vision_config. This reads
// the config.json's vision side into a VisionLanguageSpec and says which
// family reads its language model and where that model's keys are; the
// tower's and projector's parameters, exact in name, shape and order against
// the model transformers builds, are inventory.h's VisionLanguageParameters.
//
// What is planned: the parameters (zplan count) and the memory of all four:
// the tower's blocks are a ModelSpec of their own (vision_tower.h) that the
// block rules walk as they walk a language model's, run before the language
// model's in one stack (memory_model.h); its image tokens take
// images_per_sample x ImageTokensPerImage positions of the sequence. zrun
// trains no vision-language model yet and refuses them by name.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(VisionLanguageConfig vl, ReadVisionLanguageConfig(config, "llava"));
//   vl.spec.text_model_type();  // "llama": text_config's model_type, the family reading it
#ifndef ZPLAN_PLANNER_VISION_LANGUAGE_H_
#define ZPLAN_PLANNER_VISION_LANGUAGE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/json.h"
#include "proto/model.pb.h"

namespace zplan {

// Whether model_type is one of the vision-language types read here.
bool IsVisionLanguageType(absl::string_view model_type);
// "llava, qwen2_5_vl, qwen3_vl, qwen3_5".
std::string VisionLanguageModelTypes();

struct VisionLanguageConfig {
  VisionLanguageSpec spec;
  // The language model's keys: text_config, or the top level of a flat
  // config (Qwen2_5_VLConfig.__post_init__ moves them into text_config).
  std::optional<JsonObject> text;
  // The language model's head is tied to its embedding: the top level's
  // tie_word_embeddings, else text_config's, else the class default.
  bool tie_word_embeddings = false;
};

// Reads the vision side of a config.json of a vision-language model_type,
// with each config class's defaults; refuses what is not modelled by key
// (a SigLIP tower, a list of LLaVA feature layers).
absl::StatusOr<VisionLanguageConfig> ReadVisionLanguageConfig(const JsonObject& config,
                                                              absl::string_view model_type);

// Checks a VisionLanguageSpec's fields (bounds, the merger's and
// projector's widths against the language model's hidden size).
absl::Status ValidateVisionLanguage(const ModelSpec& spec);

// Freezes the parts `parts` names, a comma list of vision_tower, projector
// and language_model (the oracle's --freeze); kInvalidArgument names an
// unknown part.
absl::Status FreezeParts(absl::string_view parts, VisionLanguageSpec* v);


}  // namespace zplan

#endif  // ZPLAN_PLANNER_VISION_LANGUAGE_H_
