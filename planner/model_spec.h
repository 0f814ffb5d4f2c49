// File: model_spec.h
// Where a ModelSpec comes from: a preset name, a Hugging Face config.json, or
// a bare parameter count; and the checks every spec passes before planning.
//
// Presets live in configs/models/*.textproto and are compiled into the binary.
// Every spec carries `source`, the assumptions behind its shape.
//
// Rejections (kInvalidArgument, one line naming the field and the fix):
// unknown preset (the message lists the presets), non-positive sizes, heads
// that do not divide hidden (without an explicit head_dim), kv heads that do
// not divide heads, MoE configs, malformed JSON (with its line).
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

// Reads a Hugging Face config.json (Llama/Mistral/Qwen2/Qwen3/GPT-2/Qwen
// key names, GQA, explicit head_dim, tied embeddings) from its `text`.
// Errors read "<source>: <key>: <what>" (planner/json.h).
absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(absl::string_view text, absl::string_view source);
absl::StatusOr<ModelSpec> LoadHfConfig(const std::string& path);

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

// Fills num_kv_heads (= heads) and head_dim (= hidden / heads) when unset.
ModelSpec ResolveModelSpec(ModelSpec spec);

// Checks a resolved spec; messages name the field (e.g. "model.num_kv_heads").
absl::Status ValidateModelSpec(const ModelSpec& spec);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_MODEL_SPEC_H_
