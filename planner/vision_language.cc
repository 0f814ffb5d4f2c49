#include "planner/vision_language.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner/limits.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// Each vision-language type: its tower and the family of its language model
// (empty: text_config's own model_type, LLaVA's "any language model").
struct VisionLanguageType {
  absl::string_view model_type;
  VisionTowerType tower;
  absl::string_view text_family;
  bool deepstack;  // Qwen3VLVisionConfig's deepstack_visual_indexes (Qwen3_5VisionConfig has none)
};

constexpr VisionLanguageType kTypes[] = {
    {"llava", VISION_TOWER_CLIP, "", false},
    {"qwen2_5_vl", VISION_TOWER_QWEN2_5_VL, "qwen2", false},  // Qwen2_5_VLTextConfig: Qwen2's attention and MLP
    {"qwen3_vl", VISION_TOWER_QWEN3_VL, "qwen3", true},       // Qwen3VLTextConfig: Qwen3's, q_norm and k_norm
    {"qwen3_5", VISION_TOWER_QWEN3_VL, "qwen3_5_text", false},
};

const VisionLanguageType* FindType(absl::string_view model_type) {
  for (const VisionLanguageType& t : kTypes) {
    if (t.model_type == model_type) return &t;
  }
  return nullptr;
}

// A member's value when present (absent or null keeps *out).
absl::Status ReadInt(const JsonObject& o, absl::string_view key, int64_t* out) {
  ZPLAN_ASSIGN_OR_RETURN(std::optional<int64_t> v, o.Int(key));
  if (v) *out = *v;
  return absl::OkStatus();
}
absl::Status ReadString(const JsonObject& o, absl::string_view key, std::string* out) {
  ZPLAN_ASSIGN_OR_RETURN(std::optional<std::string> v, o.String(key));
  if (v) *out = *v;
  return absl::OkStatus();
}
absl::Status ReadBool(const JsonObject& o, absl::string_view key, bool* out) {
  ZPLAN_ASSIGN_OR_RETURN(std::optional<bool> v, o.Bool(key));
  if (v) *out = *v;
  return absl::OkStatus();
}
// A list of block indexes (absent or null keeps *out).
absl::Status ReadIndexes(const JsonObject& o, absl::string_view key,
                         google::protobuf::RepeatedField<int64_t>* out) {
  const google::protobuf::Value* v = o.Find(key);
  if (v == nullptr || v->has_null_value()) return absl::OkStatus();
  if (!v->has_list_value()) return o.Error(key, "must be a list of block indexes");
  out->Clear();
  for (const google::protobuf::Value& e : v->list_value().values()) {
    if (!e.has_number_value() || e.number_value() != static_cast<int64_t>(e.number_value())) {
      return o.Error(key, "must be a list of integer block indexes");
    }
    out->Add(static_cast<int64_t>(e.number_value()));
  }
  return absl::OkStatus();
}

// CLIPVisionConfig (models/clip/configuration_clip.py), and LlavaConfig's
// own CLIP when vision_config is absent (configuration_llava.py,
// __post_init__: hidden 1024, intermediate 4096, patch 14, image 336, 24
// layers, 16 heads).
absl::Status ReadClipTower(const JsonObject& root, VisionLanguageSpec* vl) {
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> vision, root.Object("vision_config"));
  int64_t layers = 24, hidden = 1024, heads = 16, ffn = 4096, patch = 14, image = 336, channels = 3;
  std::string act = "quick_gelu";
  if (vision) {
    std::string type = "clip_vision_model";
    ZPLAN_RETURN_IF_ERROR(ReadString(*vision, "model_type", &type));
    if (type != "clip_vision_model") {
      return vision->Error("model_type", absl::StrCat(QuoteInput(type), ": zplan reads LLaVA with a CLIP tower "
                                                      "(clip_vision_model) only; a SigLIP or other tower is not "
                                                      "modelled"));
    }
    layers = 12, hidden = 768, heads = 12, ffn = 3072, patch = 32, image = 224;  // CLIPVisionConfig's defaults
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "num_hidden_layers", &layers));
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "hidden_size", &hidden));
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "num_attention_heads", &heads));
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "intermediate_size", &ffn));
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "patch_size", &patch));
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "image_size", &image));
    ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "num_channels", &channels));
    ZPLAN_RETURN_IF_ERROR(ReadString(*vision, "hidden_act", &act));
  }
  vl->set_num_layers(layers);
  vl->set_hidden_size(hidden);
  vl->set_num_heads(heads);
  vl->set_ffn_hidden_size(ffn);
  vl->set_patch_size(patch);
  vl->set_tower_image_size(image);
  vl->set_num_channels(channels);
  vl->set_activation(act);
  if (patch > 0) vl->set_num_position_embeddings((image / patch) * (image / patch) + 1);  // + the CLS token
  // LlavaConfig's own keys.
  int64_t feature_layer = -2, image_token = 32000;
  const google::protobuf::Value* layer_value = root.Find("vision_feature_layer");
  if (layer_value != nullptr && layer_value->has_list_value()) {
    return root.Error("vision_feature_layer", "a list of layers (their features concatenated) is not modelled; "
                                              "give one layer, e.g. -2");
  }
  ZPLAN_RETURN_IF_ERROR(ReadInt(root, "vision_feature_layer", &feature_layer));
  std::string strategy = "default", projector_act = "gelu";
  bool projector_bias = true;
  ZPLAN_RETURN_IF_ERROR(ReadString(root, "vision_feature_select_strategy", &strategy));
  if (strategy != "default" && strategy != "full") {
    return root.Error("vision_feature_select_strategy",
                      absl::StrCat(QuoteInput(strategy), " is not LLaVA's: \"default\" or \"full\""));
  }
  ZPLAN_RETURN_IF_ERROR(ReadString(root, "projector_hidden_act", &projector_act));
  ZPLAN_RETURN_IF_ERROR(ReadBool(root, "multimodal_projector_bias", &projector_bias));
  ZPLAN_RETURN_IF_ERROR(ReadInt(root, "image_token_id", &image_token));  // attribute_map: image_token_index
  ZPLAN_RETURN_IF_ERROR(ReadInt(root, "image_token_index", &image_token));
  vl->set_feature_layer(feature_layer);
  vl->set_feature_keeps_cls(strategy == "full");
  vl->set_projector_activation(projector_act);
  vl->set_projector_bias(projector_bias);
  vl->set_image_token_id(image_token);
  return absl::OkStatus();
}

// Qwen2_5_VLVisionConfig (configuration_qwen2_5_vl.py), Qwen3VLVisionConfig
// (configuration_qwen3_vl.py) and Qwen3_5VisionConfig
// (configuration_qwen3_5.py), attribute_map num_hidden_layers -> depth,
// num_attention_heads -> num_heads.
absl::Status ReadQwenTower(const JsonObject& root, const VisionLanguageType& type, VisionLanguageSpec* vl) {
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> vision, root.Object("vision_config"));
  const bool qwen2_5 = type.tower == VISION_TOWER_QWEN2_5_VL;
  int64_t layers = qwen2_5 ? 32 : 27, hidden = qwen2_5 ? 3584 : 1152, heads = 16, ffn = qwen2_5 ? 3420 : 4304,
          patch = qwen2_5 ? 14 : 16, channels = 3, temporal = 2, merge = 2, out = 3584, window = 112,
          positions = 2304;
  std::string act = qwen2_5 ? "silu" : "gelu_pytorch_tanh";
  google::protobuf::RepeatedField<int64_t> full_blocks, deepstack;
  // The config classes' fullatt_block_indexes and deepstack_visual_indexes.
  if (qwen2_5) {
    for (int64_t i : {7, 15, 23, 31}) full_blocks.Add(i);
  }
  if (type.deepstack) {
    for (int64_t i : {8, 16, 24}) deepstack.Add(i);
  }
  if (vision) {
    for (const auto& [key, out_value] :
         {std::pair{"depth", &layers}, {"num_hidden_layers", &layers}, {"hidden_size", &hidden},
          {"num_heads", &heads}, {"num_attention_heads", &heads}, {"intermediate_size", &ffn},
          {"patch_size", &patch}, {"in_channels", &channels}, {"temporal_patch_size", &temporal},
          {"spatial_merge_size", &merge}, {"out_hidden_size", &out}}) {
      ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, key, out_value));
    }
    ZPLAN_RETURN_IF_ERROR(ReadString(*vision, "hidden_act", &act));
    if (qwen2_5) {
      ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "window_size", &window));
      ZPLAN_RETURN_IF_ERROR(ReadIndexes(*vision, "fullatt_block_indexes", &full_blocks));
    } else {
      ZPLAN_RETURN_IF_ERROR(ReadInt(*vision, "num_position_embeddings", &positions));
      // Qwen3_5VisionModel builds no deepstack mergers, whatever the config says.
      if (type.deepstack) ZPLAN_RETURN_IF_ERROR(ReadIndexes(*vision, "deepstack_visual_indexes", &deepstack));
    }
  }
  vl->set_num_layers(layers);
  vl->set_hidden_size(hidden);
  vl->set_num_heads(heads);
  vl->set_ffn_hidden_size(ffn);
  vl->set_patch_size(patch);
  vl->set_num_channels(channels);
  vl->set_temporal_patch_size(temporal);
  vl->set_spatial_merge_size(merge);
  vl->set_out_hidden_size(out);
  vl->set_activation(act);
  if (qwen2_5) {
    vl->set_window_size(window);
    *vl->mutable_full_attention_blocks() = full_blocks;
  } else {
    vl->set_num_position_embeddings(positions);
    *vl->mutable_deepstack_blocks() = deepstack;
  }
  int64_t image_token = 0;
  ZPLAN_RETURN_IF_ERROR(ReadInt(root, "image_token_id", &image_token));
  vl->set_image_token_id(image_token);
  return absl::OkStatus();
}

}  // namespace

bool IsVisionLanguageType(absl::string_view model_type) { return FindType(model_type) != nullptr; }

std::string VisionLanguageModelTypes() {
  std::vector<absl::string_view> names;
  for (const VisionLanguageType& t : kTypes) names.push_back(t.model_type);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<VisionLanguageConfig> ReadVisionLanguageConfig(const JsonObject& config,
                                                              absl::string_view model_type) {
  const VisionLanguageType* type = FindType(model_type);
  if (type == nullptr) {
    return config.Error("model_type", absl::StrCat(QuoteInput(model_type), " is not a vision-language type; zplan "
                                                   "reads ", VisionLanguageModelTypes()));
  }
  VisionLanguageSpec spec;
  spec.set_tower(type->tower);
  if (type->tower == VISION_TOWER_CLIP) {
    ZPLAN_RETURN_IF_ERROR(ReadClipTower(config, &spec));
  } else {
    ZPLAN_RETURN_IF_ERROR(ReadQwenTower(config, *type, &spec));
  }
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> text, config.Object("text_config"));
  // Qwen2.5-VL's published configs are flat: the language model's keys at the top level.
  if (!text && type->tower == VISION_TOWER_QWEN2_5_VL) text = config;
  if (!text) {
    return config.Error("text_config", absl::StrCat("missing; a ", model_type, " config.json nests its language "
                                                    "model's config there"));
  }
  std::string family(type->text_family);
  if (family.empty()) {
    family = "llama";  // LlavaConfig: text_config's model_type, "llama" when it has none
    ZPLAN_RETURN_IF_ERROR(ReadString(*text, "model_type", &family));
  }
  // LlavaConfig / Qwen*Config.__post_init__: a True tie_word_embeddings in
  // text_config is forwarded to the top level, which decides.
  bool tied = false;
  ZPLAN_RETURN_IF_ERROR(ReadBool(*text, "tie_word_embeddings", &tied));
  bool root_tied = false;
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "tie_word_embeddings", &root_tied));
  spec.set_text_model_type(family);
  VisionLanguageConfig out{std::move(spec), std::move(text), tied || root_tied};
  return out;
}

absl::Status FreezeParts(absl::string_view parts, VisionLanguageSpec* v) {
  for (absl::string_view part : absl::StrSplit(parts, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (part == "vision_tower") {
      v->set_freeze_vision_tower(true);
    } else if (part == "projector") {
      v->set_freeze_projector(true);
    } else if (part == "language_model") {
      v->set_freeze_language_model(true);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", part, "\" is not a part: a comma list of vision_tower, projector, language_model"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateVisionLanguage(const ModelSpec& spec) {
  const VisionLanguageSpec& v = spec.vision_language();
  const bool qwen = v.tower() != VISION_TOWER_CLIP;
  ZPLAN_RETURN_IF_ERROR(CheckFields({
      {"model.vision_language.num_layers", v.num_layers(), 1, kMaxLayers, "vision blocks"},
      {"model.vision_language.hidden_size", v.hidden_size(), 1, kMaxHiddenSize, "the tower's width"},
      {"model.vision_language.num_heads", v.num_heads(), 1, v.hidden_size(), "the tower's heads"},
      {"model.vision_language.ffn_hidden_size", v.ffn_hidden_size(), 1, kMaxHiddenSize * 16, "the tower's MLP width"},
      {"model.vision_language.patch_size", v.patch_size(), 1, kMaxImageSize, "pixels per patch side"},
      {"model.vision_language.num_channels", v.num_channels(), 1, kMaxImageChannels, "e.g. 3"},
  }));
  if (v.hidden_size() % v.num_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.vision_language.hidden_size: ", v.hidden_size(),
                                                   " is not a multiple of num_heads ", v.num_heads()));
  }
  if (!qwen && v.activation() != "quick_gelu" && v.activation() != "gelu") {
    // vision_tower.h's TowerSpec: QuickGELUActivation or one GELU op.
    return absl::InvalidArgumentError(absl::StrCat("model.vision_language.activation (vision_config.hidden_act): \"",
                                                   v.activation(), "\" is not modelled for a CLIP tower; zplan "
                                                   "plans quick_gelu (CLIP's default) and gelu"));
  }
  if (qwen) {
    ZPLAN_RETURN_IF_ERROR(CheckFields({
        {"model.vision_language.temporal_patch_size", v.temporal_patch_size(), 1, 64, "frames per patch"},
        {"model.vision_language.spatial_merge_size", v.spatial_merge_size(), 1, 64, "patches merged per side"},
        {"model.vision_language.out_hidden_size", v.out_hidden_size(), 1, kMaxHiddenSize, "the merger's output"},
    }));
    // Qwen*Model.forward: inputs_embeds.masked_scatter(mask, image_embeds).
    if (v.out_hidden_size() != spec.hidden_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.vision_language.out_hidden_size: ", v.out_hidden_size(), " is not the language model's hidden_size ",
          spec.hidden_size(), "; transformers' masked_scatter of the image features into the embeddings would "
          "fail (the config classes' defaults are not a runnable model: set vision_config.out_hidden_size)"));
    }
    for (int64_t i : v.full_attention_blocks()) {
      ZPLAN_RETURN_IF_ERROR(CheckRange("model.vision_language.full_attention_blocks", i, 0, v.num_layers() - 1,
                                       "a vision block index"));
    }
    for (int64_t i : v.deepstack_blocks()) {
      ZPLAN_RETURN_IF_ERROR(CheckRange("model.vision_language.deepstack_blocks", i, 0, v.num_layers() - 1,
                                       "a vision block index"));
    }
  } else {
    ZPLAN_RETURN_IF_ERROR(CheckFields({
        {"model.vision_language.tower_image_size", v.tower_image_size(), v.patch_size(), kMaxImageSize,
         "pixels per side, >= patch_size"},
        {"model.vision_language.feature_layer", v.feature_layer(), -v.num_layers() - 1, v.num_layers(),
         "a hidden_states index of the tower: 0 the embeddings, -1 the last layer's output"},
    }));
  }
  return absl::OkStatus();
}

}  // namespace zplan
