// File: model_spec.h
// Where a ModelSpec comes from: a preset name, a Hugging Face config.json, or
// a bare parameter count; and the checks every spec passes before planning.
//
// Presets live in configs/models/*.textproto and are compiled into the binary.
// Every spec carries `source`, the assumptions behind its shape, and
// `model_type`, the transformers model type whose family (model_family.h)
// it is a shape of: set from the config.json, and in each preset. A preset
// is a shape of one family (qwen-14b, first-generation Qwen, which has no
// family any more, records that it is planned as qwen2); --params' standard
// shape and a ModelSpec file without model_type have none, so their plans
// say where the shape came from instead (source).
//
// Rejections (kInvalidArgument, one line naming the field and the fix):
// unknown preset (the message lists the presets), non-positive sizes, heads
// that do not divide hidden (without an explicit head_dim), kv heads that do
// not divide heads, MoE configs, multimodal configs, a config.json whose
// model_type has no family (the message lists the supported ones and names
// --approximate-as), a spec whose model_type has none and that does not say
// it is an unvalidated approximation, malformed JSON (with its line).
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(ModelSpec spec, LoadPreset("llama3-8b"));
//   CountParameters(spec) == 8030261248;
#ifndef ZPLAN_PLANNER_MODEL_SPEC_H_
#define ZPLAN_PLANNER_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"

namespace zplan {

// Sorted preset names, e.g. {"1b", "debug-tiny", "gpt2", ...}.
std::vector<std::string> PresetNames();

// A validated, resolved preset.
absl::StatusOr<ModelSpec> LoadPreset(absl::string_view name);

// Reads a transformers config.json from its `text` through the family of its
// model_type (model_family.h: the keys it uses and the defaults of those it
// leaves out). A model_type without a family is refused, unless
// `approximate_as` names a family to plan it as: then the spec keeps the
// config's model_type and records ApproximationNote in
// unvalidated_approximation (an activation that family's MLP does not model
// is planned as the family's default, and `source` says so).
// `approximate_as` with a supported model_type, or naming no family, is
// refused too. Errors read "<source>: <key>: <what>" (planner/json.h).
absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(absl::string_view text, absl::string_view source,
                                                absl::string_view approximate_as = "");
absl::StatusOr<ModelSpec> LoadHfConfig(const std::string& path, absl::string_view approximate_as = "");

// A standard shape for a bare parameter count, by this rule:
//   GPT-3-style blocks (LayerNorm, GELU MLP of 4h, MHA with 128-wide heads,
//   biases), RoPE, tied embeddings; layers = h / 128 (GPT-3's depth/width
//   ratio); h is the largest multiple of 128 whose blocks leave room for a
//   vocabulary of at least kMinVocabForParams tokens; the vocabulary then
//   absorbs the rest, so the count is within h elements of `params` (below).
// kInvalidArgument when params is too small for the smallest such shape.
absl::StatusOr<ModelSpec> ModelSpecForParams(int64_t params);
inline constexpr int64_t kMinVocabForParams = 32000;

// LoRA (ModelSpec.lora). The block linears an adapter can target, by the
// names transformers gives them in Llama, Mistral and Qwen: q_proj, k_proj,
// v_proj, o_proj, gate_proj (SwiGLU only), up_proj, down_proj.
std::vector<std::string> LoraTargetNames(const ModelSpec& spec);
// PEFT's default r, lora_alpha and (for Llama, Mistral, Qwen2/3) target
// modules (peft/tuners/lora/config.py, LoraConfig; peft/utils/constants.py,
// TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
inline constexpr int64_t kPeftDefaultLoraRank = 8;
inline constexpr double kPeftDefaultLoraAlpha = 8;
inline constexpr const char* kPeftDefaultLoraTargets[] = {"q_proj", "v_proj"};
// The modules LoraSpec.modules_to_save may name, by transformers' names in
// Llama, Mistral and Qwen: the token embedding and the (untied) LM head.
inline constexpr const char* kLoraSavableModules[] = {"embed_tokens", "lm_head"};

// Reads a PEFT adapter_config.json (peft_type "LORA": r, lora_alpha,
// lora_dropout, target_modules as a list or "all-linear") into spec->lora.
// modules_to_save may name kLoraSavableModules (untied). What would
// change the memory and is not modelled -- DoRA, rank or alpha patterns,
// layers_to_transform, trainable biases, other modules_to_save, regex
// targets, adapters on embeddings or the LM head -- is refused by name.
// The spec must be resolved; the result is validated.
absl::Status ApplyLoraConfig(absl::string_view text, absl::string_view source, ModelSpec* spec);
absl::Status LoadLoraConfig(const std::string& path, ModelSpec* spec);

// Fills num_kv_heads (= heads) and head_dim (= hidden / heads) when unset,
// and the kernels of linear attention and short convolutions (transformers'
// torch fallbacks) where the model has those layers.
ModelSpec ResolveModelSpec(ModelSpec spec);

// Whether some layer is of `type` (layer_types).
bool HasLayersOf(const ModelSpec& spec, LayerType type);
// Whether some layer runs transformers' causal_conv1d_fn (short_conv_impl):
// LFM2's conv layers and Qwen3.5's linear-attention layers.
bool HasShortConv(const ModelSpec& spec);

// Checks a resolved spec; messages name the field (e.g. "model.num_kv_heads").
// A model_type without a family needs unvalidated_approximation.
absl::Status ValidateModelSpec(const ModelSpec& spec);

// The line zplan's text output prints about where the model came from, or ""
// when there is nothing to add: the unvalidated approximation when there is
// one; for a spec without model_type (--params' standard shape, a ModelSpec
// file), "model: " and its source (or name).
std::string ModelOriginLine(const ModelSpec& spec);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_MODEL_SPEC_H_
