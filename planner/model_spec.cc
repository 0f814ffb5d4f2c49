#include "planner/model_spec.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/block_layout.h"
#include "planner/inventory.h"
#include "planner/json.h"
#include "planner/limits.h"
#include "planner/model_family.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"
#include "planner/vision_language.h"

namespace zplan {

const std::vector<std::pair<std::string, std::string>>& EmbeddedModelPresets();

namespace {

constexpr absl::string_view kPresetDir = "configs/models/";
// GptOssConfig's swiglu_limit and swiglu_alpha defaults.
constexpr double kGptOssSwigluLimit = 7.0, kGptOssSwigluAlpha = 1.702;

std::map<std::string, std::string> PresetFiles() {
  std::map<std::string, std::string> presets;
  for (const auto& [path, contents] : EmbeddedModelPresets()) {
    absl::string_view name = path;
    name.remove_prefix(std::min(name.size(), kPresetDir.size()));
    name.remove_suffix(std::string_view(".textproto").size());
    presets[std::string(name)] = contents;
  }
  return presets;
}

// Reads a member into *out; absent or null leaves *out unchanged.
template <typename T, typename Reader>
absl::Status ReadInto(const JsonObject& config, Reader read, absl::string_view key, T* out) {
  auto value = (config.*read)(key);
  if (!value.ok()) return value.status();
  if (*value) *out = **value;
  return absl::OkStatus();
}

absl::Status ReadInt(const JsonObject& config, absl::string_view key, int64_t* out) {
  return ReadInto(config, &JsonObject::Int, key, out);
}
absl::Status ReadBool(const JsonObject& config, absl::string_view key, bool* out) {
  return ReadInto(config, &JsonObject::Bool, key, out);
}
absl::Status ReadDouble(const JsonObject& config, absl::string_view key, double* out) {
  return ReadInto(config, &JsonObject::Number, key, out);
}
absl::Status ReadString(const JsonObject& config, absl::string_view key, std::string* out) {
  return ReadInto(config, &JsonObject::String, key, out);
}

absl::Status ValidateLora(const ModelSpec& spec) {
  const LoraSpec& lora = spec.lora();
  if (spec.fused_qkv_projection() || spec.fused_gate_up_projection()) {
    // Which slices of a fused output an adapter's gradient reaches is not modelled.
    return absl::InvalidArgumentError(absl::StrCat("model.lora: LoRA on ", QuoteInput(spec.model_type()),
                                                   "'s fused qkv_proj and gate_up_proj is not modelled yet; plan "
                                                   "full fine-tuning (drop --lora-config)"));
  }
  if (spec.per_layer_input_size() > 0) {
    // peft's all-linear adapts the model-level per_layer_model_projection too, and a frozen one's norm
    // keeps more once the embedding's output requires grad: neither is modelled or checked.
    return absl::InvalidArgumentError(absl::StrCat(
        "model.lora: LoRA on ", QuoteInput(spec.model_type()), " with per-layer embeddings "
        "(hidden_size_per_layer_input ", spec.per_layer_input_size(), ") is not modelled yet; plan full fine-tuning "
        "(drop --lora-config)"));
  }
  ZPLAN_RETURN_IF_ERROR(CheckRange("model.lora.rank", lora.rank(), 1, spec.hidden_size(),
                                   "LoRA r; at most the model width"));
  ZPLAN_RETURN_IF_ERROR(CheckFinite("model.lora.alpha", lora.alpha(), -1e9, 1e9, "lora_alpha"));
  if (!(lora.dropout() >= 0 && lora.dropout() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("model.lora.dropout: a probability in [0, 1), got ", lora.dropout()));
  }
  const std::vector<std::string> known = LoraTargetNames(spec);
  if (lora.target_modules().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model.lora.target_modules: empty; name some of ",
                                                   absl::StrJoin(known, ", ")));
  }
  // peft matches a target by the module name's last part: in a mixture of
  // experts' layers that reaches the router and the shared expert, whose
  // adapters are not modelled (nor the fused experts, which are no Linear).
  std::set<std::string> in_experts_layers;
  if (spec.has_moe()) {
    for (const BlockLinear& linear : OpLinears(spec, {BlockOpKind::kMoe, "mlp", 0})) {
      const std::string name(linear.name);
      in_experts_layers.insert(name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1));
    }
  }
  std::set<std::string> seen;
  for (const std::string& target : lora.target_modules()) {
    if (in_experts_layers.count(target) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.lora.target_modules: ", QuoteInput(target), " adapts the mixture-of-experts layers' router or "
          "shared expert, which is not modelled yet; target the attention's projections (q_proj, k_proj, v_proj, "
          "o_proj)"));
    }
    if (std::find(known.begin(), known.end(), target) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.lora.target_modules: ", QuoteInput(target), " is not a block linear of this model; use ",
          absl::StrJoin(known, ", "), " (adapters on embeddings, the LM head or GPT-2's fused c_attn are not "
          "modelled)"));
    }
    if (!seen.insert(target).second) {
      return absl::InvalidArgumentError(absl::StrCat("model.lora.target_modules: ", QuoteInput(target),
                                                     " is listed twice"));
    }
  }
  seen.clear();
  for (const std::string& module : lora.modules_to_save()) {
    if (std::find(std::begin(kLoraSavableModules), std::end(kLoraSavableModules), module) ==
        std::end(kLoraSavableModules)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.lora.modules_to_save: ", QuoteInput(module), " is not modelled; zplan plans ",
          absl::StrJoin(kLoraSavableModules, " and "), " trained whole (untied); remove it"));
    }
    if (spec.vocab_size() == 0 || spec.has_vision() || spec.tie_word_embeddings()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.lora.modules_to_save: ", QuoteInput(module), " needs a language model with untied embeddings; "
          "with tied ones peft's copy unties the head from the frozen embedding, which is not modelled; remove it"));
    }
    if (!seen.insert(module).second) {
      return absl::InvalidArgumentError(absl::StrCat("model.lora.modules_to_save: ", QuoteInput(module),
                                                     " is listed twice"));
    }
  }
  return absl::OkStatus();
}

// A side of a square image or patch: an integer, or [height, width] with
// the two equal.
absl::Status ReadSide(const JsonObject& config, absl::string_view key, int64_t* out) {
  const google::protobuf::Value* value = config.Find(key);
  if (value != nullptr && value->has_list_value()) {
    const auto& sides = value->list_value().values();
    if (sides.size() != 2 || !sides[0].has_number_value() || sides[0].number_value() != sides[1].number_value()) {
      return config.Error(key, "zplan plans square images and patches: give one integer or [n, n]");
    }
    const double side = sides[0].number_value();
    if (!(side >= 1 && side <= kMaxImageSize && side == std::floor(side))) {
      return config.Error(key, absl::StrCat(side, " is not a side of 1 .. ", kMaxImageSize, " pixels"));
    }
    *out = static_cast<int64_t>(side);
    return absl::OkStatus();
  }
  return ReadInt(config, key, out);
}

// A per-layer list of config.json (layer_types, no_rope_layers): absent or
// null, `fallback(i)` for each layer; else one entry per layer, each taken
// by `take` (false: a value zplan does not model).
absl::Status ReadPerLayer(const JsonObject& config, absl::string_view key, absl::string_view expected,
                          const ModelFamily& family, int64_t layers, const std::function<void(int64_t)>& fallback,
                          const std::function<bool(const google::protobuf::Value&)>& take) {
  const google::protobuf::Value* given = config.Find(key);
  if (given == nullptr || given->has_null_value()) {
    for (int64_t i = 0; i < layers; ++i) fallback(i);
    return absl::OkStatus();
  }
  if (!given->has_list_value()) return config.Error(key, absl::StrCat("expected ", expected));
  const auto& values = given->list_value().values();
  if (static_cast<int64_t>(values.size()) != layers) {
    return config.Error(key, absl::StrCat(values.size(), " entries for num_hidden_layers ", layers, "; give ",
                                          expected));
  }
  for (const google::protobuf::Value& v : values) {
    if (!take(v)) {
      const std::string shown = v.has_string_value() ? QuoteInput(v.string_value())
                                : v.has_number_value() ? absl::StrCat(v.number_value())
                                                       : JsonTypeName(v);
      return config.Error(key, absl::StrCat(shown, " is not modelled in ", family.model_type, "; give ", expected));
    }
  }
  return absl::OkStatus();
}

// config.layer_types of "full_attention" and `other` (`other_type`), or
// without it full attention where `attends(i)` and `other` elsewhere.
absl::Status ReadLayerTypesOf(const JsonObject& config, const ModelFamily& family, absl::string_view other,
                              LayerType other_type, const std::function<bool(int64_t)>& attends, ModelSpec* spec) {
  spec->clear_layer_types();
  return ReadPerLayer(
      config, "layer_types", absl::StrCat("a list of \"full_attention\" or \"", other, "\", one per layer"), family,
      spec->num_layers(), [&](int64_t i) { spec->add_layer_types(attends(i) ? LAYER_FULL_ATTENTION : other_type); },
      [&](const google::protobuf::Value& v) {
        const bool full = v.has_string_value() && v.string_value() == "full_attention";
        const bool given = v.has_string_value() && v.string_value() == other;
        if (full || given) spec->add_layer_types(full ? LAYER_FULL_ATTENTION : other_type);
        return full || given;
      });
}

// config.layer_types, or the family's pattern: full attention every
// full_attention_interval layers, sliding (with delta_rule_layers: linear
// attention) between.
absl::Status ReadLayerTypes(const JsonObject& config, const ModelFamily& family, ModelSpec* spec) {
  int64_t interval = family.full_attention_interval;
  if (!family.full_attention_interval_key.empty()) {
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, family.full_attention_interval_key, &interval));
    if (interval <= 0) {
      return config.Error(family.full_attention_interval_key, "must be a positive number of layers");
    }
  }
  const bool linear = family.delta_rule_layers;
  ZPLAN_RETURN_IF_ERROR(ReadLayerTypesOf(config, family, linear ? "linear_attention" : "sliding_attention",
                                         linear ? LAYER_LINEAR_ATTENTION : LAYER_SLIDING_ATTENTION,
                                         [&](int64_t i) { return (i + 1) % interval == 0; }, spec));
  // Gemma4TextConfig.__post_init__ forces the last layer to full attention (with a warning).
  if (family.gemma4_layers && spec->layer_types_size() > 0) {
    spec->set_layer_types(spec->layer_types_size() - 1, LAYER_FULL_ATTENTION);
  }
  return absl::OkStatus();
}

// Gemma4TextConfig's per-layer shapes (ModelFamily::gemma4_layers): each
// layer's head width from per_layer_config (a config.json's, keyed by the
// layer's index), or as __post_init__ makes it, global_head_dim on every
// full layer; and the per-layer embeddings' widths.
absl::Status ReadGemma4Layers(const JsonObject& config, ModelSpec* spec) {
  constexpr int64_t kGlobalHeadDim = 512, kPerLayerInputSize = 256, kPerLayerVocab = 262144;  // its defaults
  int64_t global_head_dim = kGlobalHeadDim, per_layer = kPerLayerInputSize, per_layer_vocab = kPerLayerVocab;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "global_head_dim", &global_head_dim));
  if (const google::protobuf::Value* given = config.Find("hidden_size_per_layer_input");
      given != nullptr && given->has_null_value()) {
    per_layer = 0;  // null: no per-layer embeddings
  }
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "hidden_size_per_layer_input", &per_layer));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "vocab_size_per_layer_input", &per_layer_vocab));
  if (per_layer < 0) return config.Error("hidden_size_per_layer_input", "must be a width >= 0 (0: none)");
  spec->set_per_layer_input_size(per_layer);
  spec->set_per_layer_input_vocab_size(per_layer > 0 ? per_layer_vocab : 0);
  std::vector<int64_t> head_dims(spec->num_layers(), spec->head_dim());
  const google::protobuf::Value* overrides = config.Find("per_layer_config");
  if (overrides != nullptr && !overrides->has_null_value() && !overrides->has_struct_value()) {
    return config.Error("per_layer_config", absl::StrCat("expected an object of layer indices, got a ",
                                                         JsonTypeName(*overrides)));
  }
  if (overrides != nullptr && overrides->has_struct_value()) {
    for (const auto& [key, value] : overrides->struct_value().fields()) {
      int64_t layer = -1;
      if (!absl::SimpleAtoi(key, &layer) || layer < 0 || layer >= spec->num_layers() || !value.has_struct_value()) {
        return config.Error("per_layer_config", absl::StrCat(QuoteInput(key), ": expected a layer index below ",
                                                             spec->num_layers(), " holding {\"head_dim\": ...}"));
      }
      for (const auto& [field, v] : value.struct_value().fields()) {
        if (field != "head_dim" || !v.has_number_value() || v.number_value() != static_cast<int64_t>(v.number_value())) {
          return config.Error("per_layer_config", absl::StrCat("layer ", layer, "'s ", QuoteInput(field),
                                                               " is not modelled; zplan plans a head_dim per layer "
                                                               "(other keys, e.g. num_key_value_heads, come with "
                                                               "attention_k_eq_v, which is not modelled)"));
        }
        head_dims[layer] = static_cast<int64_t>(v.number_value());
      }
    }
  } else {
    for (int layer = 0; layer < spec->layer_types_size(); ++layer) {
      if (spec->layer_types(layer) == LAYER_FULL_ATTENTION) head_dims[layer] = global_head_dim;
    }
  }
  spec->clear_layer_head_dims();
  if (std::any_of(head_dims.begin(), head_dims.end(), [&](int64_t d) { return d != spec->head_dim(); })) {
    for (int64_t d : head_dims) spec->add_layer_head_dims(d);
  }
  spec->set_norm_pow_mean_square(true);
  spec->set_value_norm(true);
  return absl::OkStatus();
}

// The Gated DeltaNet's widths and conv (ModelFamily::delta_rule_layers;
// its layer_types are ReadLayerTypes'), the full layers' gated attention.
absl::Status ReadDeltaRuleConfig(const JsonObject& config, ModelSpec* spec) {
  // Qwen3_5TextConfig's defaults.
  constexpr int64_t kConvKernel = 4, kKeyHeads = 16, kValueHeads = 32, kHeadDim = 128;
  int64_t kernel = kConvKernel, key_heads = kKeyHeads, value_heads = kValueHeads, key_dim = kHeadDim,
          value_dim = kHeadDim;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "linear_conv_kernel_dim", &kernel));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "linear_num_key_heads", &key_heads));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "linear_num_value_heads", &value_heads));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "linear_key_head_dim", &key_dim));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "linear_value_head_dim", &value_dim));
  spec->set_conv_kernel_size(kernel);
  spec->set_linear_num_key_heads(key_heads);
  spec->set_linear_num_value_heads(value_heads);
  spec->set_linear_key_head_dim(key_dim);
  spec->set_linear_value_head_dim(value_dim);
  spec->set_attention_output_gate(true);
  return absl::OkStatus();
}

// Lfm2Config's layers and widths (ModelFamily::short_conv_layers): its
// layer_types, or full_attn_idxs' layers attending and the rest convolving
// (every layer attends when neither is given: Lfm2Config.__post_init__);
// the conv's kernel and bias; block_ff_dim and tie_embedding, which the
// config class takes for intermediate_size and tie_word_embeddings; and
// Lfm2MLP's width: int(2/3 of it) x block_ffn_dim_multiplier, rounded up to
// block_multiple_of, under block_auto_adjust_ff_dim.
absl::Status ReadShortConvConfig(const JsonObject& config, const ModelFamily& family, ModelSpec* spec) {
  constexpr int64_t kLfm2DefaultConvKernel = 3, kLfm2DefaultMultipleOf = 256;  // Lfm2Config's defaults
  const int64_t layers = spec->num_layers();
  std::vector<bool> attends(layers, true);
  const google::protobuf::Value* indices = config.Find("full_attn_idxs");
  if (indices != nullptr && !indices->has_null_value()) {
    if (!indices->has_list_value()) return config.Error("full_attn_idxs", "expected a list of layer indices");
    attends.assign(layers, false);
    for (const google::protobuf::Value& v : indices->list_value().values()) {
      const double i = v.has_number_value() ? v.number_value() : -1;
      if (i < 0 || i >= layers || i != static_cast<int64_t>(i)) {
        return config.Error("full_attn_idxs", absl::StrCat("expected layer indices below num_hidden_layers ", layers));
      }
      attends[static_cast<int64_t>(i)] = true;
    }
  }
  ZPLAN_RETURN_IF_ERROR(
      ReadLayerTypesOf(config, family, "conv", LAYER_CONV, [&](int64_t i) { return attends[i]; }, spec));
  int64_t kernel = kLfm2DefaultConvKernel;
  bool conv_bias = false, tied = spec->tie_word_embeddings();
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "conv_L_cache", &kernel));
  if (kernel < 1) return config.Error("conv_L_cache", "must be a positive number of tokens");
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "conv_bias", &conv_bias));
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "tie_embedding", &tied));
  spec->set_conv_kernel_size(kernel);
  spec->set_conv_bias(conv_bias);
  spec->set_tie_word_embeddings(tied);
  int64_t ffn = spec->ffn_hidden_size(), multiple_of = kLfm2DefaultMultipleOf;
  bool adjust = true;
  std::optional<double> multiplier = 1.0;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "block_ff_dim", &ffn));
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "block_auto_adjust_ff_dim", &adjust));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "block_multiple_of", &multiple_of));
  if (const google::protobuf::Value* given = config.Find("block_ffn_dim_multiplier");
      given != nullptr && given->has_null_value()) {
    multiplier.reset();
  } else {
    double m = *multiplier;
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "block_ffn_dim_multiplier", &m));
    multiplier = m;
  }
  if (adjust) {
    if (multiple_of < 1) return config.Error("block_multiple_of", "must be a positive width");
    ffn = 2 * ffn / 3;
    if (multiplier) {
      ffn = static_cast<int64_t>(*multiplier * ffn);
      ffn = multiple_of * ((ffn + multiple_of - 1) / multiple_of);
    }
  }
  spec->set_ffn_hidden_size(ffn);
  return absl::OkStatus();
}

// GraniteMoeHybridConfig's keys (ModelFamily::granite_hybrid_layers): the
// dense attention-only models are planned, the rest refused by the key.
absl::Status ReadGraniteHybridLayers(const JsonObject& config, const ModelFamily& family, ModelSpec* spec) {
  constexpr int64_t kDefaultLocalExperts = 8;  // GraniteMoeHybridConfig.num_local_experts
  int64_t experts = kDefaultLocalExperts;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_local_experts", &experts));
  if (experts > 0) {
    return config.Error("num_local_experts", absl::StrCat(experts, config.Find("num_local_experts") ? "" : " (absent)",
                                                          ": mixture-of-experts models are not supported; plan a "
                                                          "dense model (num_local_experts 0)"));
  }
  std::string positions;
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "position_embedding_type", &positions));
  if (positions != "rope") {
    return config.Error("position_embedding_type",
                        absl::StrCat(positions.empty() ? "null (absent)" : QuoteInput(positions),
                                     ": layers without positions are not modelled in granitemoehybrid; zplan plans "
                                     "\"rope\""));
  }
  if (config.Find("layer_types") == nullptr || config.Find("layer_types")->has_null_value()) {
    return config.Error("layer_types", "absent: every layer is a Mamba-2 layer (GraniteMoeHybridConfig), which is "
                                       "not modelled; zplan plans layer_types of \"attention\"");
  }
  // Every layer alike: no layer types in the spec.
  ZPLAN_RETURN_IF_ERROR(ReadPerLayer(
      config, "layer_types", "a list of \"attention\", one per layer (Mamba-2 layers are not modelled)", family,
      spec->num_layers(), [](int64_t) {},
      [](const google::protobuf::Value& v) { return v.has_string_value() && v.string_value() == "attention"; }));
  return absl::OkStatus();
}

// config.no_rope_layers (1: the layer applies RoPE), or the family's
// pattern: none every no_rope_layer_interval layers.
absl::Status ReadRopeLayers(const JsonObject& config, const ModelFamily& family, ModelSpec* spec) {
  spec->clear_rope_layers();
  return ReadPerLayer(
      config, "no_rope_layers", "a list of 1 (RoPE) or 0 (none), one per layer", family, spec->num_layers(),
      [&](int64_t i) { spec->add_rope_layers((i + 1) % family.no_rope_layer_interval != 0); },
      [&](const google::protobuf::Value& v) {
        if (!v.has_number_value() || (v.number_value() != 0 && v.number_value() != 1)) return false;
        spec->add_rope_layers(v.number_value() == 1);
        return true;
      });
}

// What a config.json of `family` leaves to its family, read into `spec`: the
// FFN type from the activation, norm, positions, biases, qk-norm, dropout at
// the family's sites with its defaults, the attention implementation and its
// softmax's dtype. Planned as another type's family (`approximated`), an
// activation that family's MLP does not model is planned as its default, and
// *substituted says so.
// A mixture-of-experts family's keys (ModelFamily::MoeKeys): the experts,
// their width and top-k, the shared expert, which layers stay dense, and the
// experts' implementation (config.json's _experts_implementation; transformers
// picks grouped_mm when none is asked: modeling_utils.py,
// get_correct_experts_implementation).
absl::Status ReadMoeConfig(const JsonObject& config, const ModelFamily& family, ModelSpec* spec) {
  const ModelFamily::MoeKeys& keys = family.moe;
  MoeSpec& moe = *spec->mutable_moe();
  int64_t experts = keys.default_experts, per_token = keys.default_experts_per_token, width = keys.default_expert_ffn,
          shared = keys.default_shared_expert_ffn, sparse_step = 1;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, keys.experts_key, &experts));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_experts_per_tok", &per_token));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, keys.expert_ffn_key, &width));
  if (!keys.shared_expert_ffn_key.empty()) ZPLAN_RETURN_IF_ERROR(ReadInt(config, keys.shared_expert_ffn_key, &shared));
  int64_t shared_experts = keys.default_shared_experts;
  if (!keys.shared_experts_count_key.empty()) {
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, keys.shared_experts_count_key, &shared_experts));
    if (shared_experts < 0) return config.Error(keys.shared_experts_count_key, "must be a count of experts, or 0");
  }
  if (experts < 1) return config.Error(keys.experts_key, "must be at least 1 expert");
  if (per_token < 1 || per_token > experts) {
    return config.Error("num_experts_per_tok", absl::StrCat(per_token, ": must be between 1 and ", keys.experts_key,
                                                            " (", experts, ")"));
  }
  if (width < 1) return config.Error(keys.expert_ffn_key, "must be a positive width");
  if (shared < 0) return config.Error(keys.shared_expert_ffn_key, "must be a width, or 0 for no shared expert");
  // DeepseekV3MoE's shared_experts: n_shared_experts experts wide.
  const bool counted_shared = !keys.shared_experts_count_key.empty();
  if (counted_shared) shared = shared_experts * width;
  moe.set_num_experts(experts);
  moe.set_experts_per_token(per_token);
  moe.set_expert_ffn_hidden_size(width);
  moe.set_shared_expert_ffn_hidden_size(shared);
  moe.set_shared_expert_gate(shared > 0 && !keys.shared_mlp_after_experts && !counted_shared);
  moe.set_shared_expert_fused_after_experts(shared > 0 && keys.shared_mlp_after_experts);
  moe.set_shared_expert_after_experts(shared > 0 && counted_shared);
  moe.set_router_before_experts(keys.router_before_experts);
  moe.set_routing_weights_fp32(keys.routing_weights_fp32);
  bool renormalize = keys.renormalizes_always || keys.default_norm_topk_prob;
  if (!keys.renormalizes_always) ZPLAN_RETURN_IF_ERROR(ReadBool(config, "norm_topk_prob", &renormalize));
  // GraniteMoe's softmax over the k needs no renormalization (its config has no norm_topk_prob).
  moe.set_renormalize_top_k(renormalize && !keys.top_k_then_softmax);
  moe.set_router_top_k_then_softmax(keys.top_k_then_softmax);
  moe.set_deepspeed_leaf(keys.deepspeed_leaf);
  if (keys.sigmoid_grouped_router) {
    // DeepseekV3TopkRouter views the scores [tokens, n_group, E / n_group]
    // and takes the top 2 of each group, then topk_group groups.
    int64_t groups = keys.default_router_groups, top_groups = keys.default_router_top_groups;
    double scaling = keys.default_routed_scaling_factor;
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "n_group", &groups));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "topk_group", &top_groups));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "routed_scaling_factor", &scaling));
    if (!std::isfinite(scaling)) return config.Error("routed_scaling_factor", "must be a finite number");
    if (groups < 1 || experts % groups != 0 || experts / groups < 2) {
      return config.Error("n_group", absl::StrCat(groups, ": must divide ", keys.experts_key, " (", experts,
                                                  ") into groups of at least 2 experts"));
    }
    if (top_groups < 1 || top_groups > groups) {
      return config.Error("topk_group", absl::StrCat(top_groups, ": must be between 1 and n_group (", groups, ")"));
    }
    if (per_token > top_groups * (experts / groups)) {
      return config.Error("num_experts_per_tok",
                          absl::StrCat(per_token, ": more than the ", top_groups * (experts / groups),
                                       " experts of topk_group groups"));
    }
    moe.set_router_sigmoid_grouped(true);
    moe.set_router_groups(groups);
    moe.set_router_top_groups(top_groups);
    moe.set_routed_scaling_factor(scaling);
  }
  if (keys.gpt_oss) {
    // GptOssConfig's swiglu_limit and swiglu_alpha.
    double limit = kGptOssSwigluLimit, alpha = kGptOssSwigluAlpha;
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "swiglu_limit", &limit));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "swiglu_alpha", &alpha));
    if (!(std::isfinite(limit) && limit > 0)) return config.Error("swiglu_limit", "must be a positive number");
    if (!std::isfinite(alpha)) return config.Error("swiglu_alpha", "must be a finite number");
    moe.set_router_top_k_in_working_dtype(true);
    moe.set_router_bias(true);
    moe.set_gpt_oss_experts(true);
    moe.set_swiglu_limit(limit);
    moe.set_swiglu_alpha(alpha);
  }
  bool aux_loss = false;
  double aux_loss_coef = keys.default_router_aux_loss_coef;
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "output_router_logits", &aux_loss));
  ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "router_aux_loss_coef", &aux_loss_coef));
  if (!std::isfinite(aux_loss_coef)) return config.Error("router_aux_loss_coef", "must be a finite number");
  moe.set_router_aux_loss(aux_loss);
  moe.set_router_aux_loss_coef(aux_loss_coef);
  if (keys.sparse_step_keys) {
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "decoder_sparse_step", &sparse_step));
    if (sparse_step < 1) return config.Error("decoder_sparse_step", "must be at least 1 (every layer MoE)");
    std::vector<int64_t> dense_listed;
    if (const google::protobuf::Value* listed = config.Find("mlp_only_layers");
        listed != nullptr && !listed->has_null_value()) {
      if (!listed->has_list_value()) return config.Error("mlp_only_layers", "must be a list of layer indices or null");
      for (const google::protobuf::Value& v : listed->list_value().values()) {
        if (!v.has_number_value() || v.number_value() < 0 || v.number_value() != static_cast<int64_t>(v.number_value())) {
          return config.Error("mlp_only_layers", "must hold layer indices (non-negative integers)");
        }
        dense_listed.push_back(static_cast<int64_t>(v.number_value()));
      }
    }
    // Layers outside ValidateModelSpec's range are refused there, by their own key.
    if (spec->num_layers() < 1 || spec->num_layers() > kMaxLayers) return absl::OkStatus();
    bool any_dense = false;
    std::vector<bool> dense(spec->num_layers());
    for (int64_t i = 0; i < spec->num_layers(); ++i) {
      dense[i] = (i + 1) % sparse_step != 0 ||
                 std::find(dense_listed.begin(), dense_listed.end(), i) != dense_listed.end();
      any_dense = any_dense || dense[i];
    }
    if (any_dense) {
      for (bool d : dense) moe.add_dense_layers(d);
    }
  }
  if (!keys.first_dense_layers_key.empty()) {
    int64_t first_dense = keys.default_first_dense_layers;
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, keys.first_dense_layers_key, &first_dense));
    if (first_dense < 0) return config.Error(keys.first_dense_layers_key, "must be a count of layers, or 0");
    if (first_dense > 0 && spec->num_layers() >= 1 && spec->num_layers() <= kMaxLayers) {
      for (int64_t i = 0; i < spec->num_layers(); ++i) moe.add_dense_layers(i < first_dense);
    }
  }
  std::string impl;
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "experts_implementation", &impl));
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "_experts_implementation", &impl));
  if (impl.empty() || impl == "grouped_mm") {
    moe.set_experts_impl(EXPERTS_GROUPED_MM);
  } else if (impl == "eager") {
    moe.set_experts_impl(EXPERTS_EAGER);
  } else if (impl == "batched_mm") {
    moe.set_experts_impl(EXPERTS_BATCHED_MM);
  } else {
    return config.Error("_experts_implementation",
                        absl::StrCat(QuoteInput(impl), " is not modelled; zplan plans \"grouped_mm\" (the default), "
                                     "\"eager\" and \"batched_mm\""));
  }
  return absl::OkStatus();
}

// DeepseekV3Config's latent attention keys (ModelFamily::LatentDefaults).
// Its heads are q's and k's nope + rope wide (the config's head_dim,
// qk_rope_head_dim, sizes RoPE alone), every one with its own key and value.
absl::Status ReadLatentAttention(const JsonObject& config, const ModelFamily& family, ModelSpec* spec) {
  const ModelFamily::LatentDefaults& d = family.latent_attention;
  int64_t q_rank = d.q_lora_rank, kv_rank = d.kv_lora_rank, nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim,
          v = d.v_head_dim;
  bool interleave = d.rope_interleave;
  if (const google::protobuf::Value* given = config.Find("q_lora_rank"); given != nullptr && given->has_null_value()) {
    q_rank = 0;  // null: one q_proj
  } else {
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "q_lora_rank", &q_rank));
    if (q_rank < 1) return config.Error("q_lora_rank", "must be a positive rank, or null for one q_proj");
  }
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "kv_lora_rank", &kv_rank));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "qk_nope_head_dim", &nope));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "qk_rope_head_dim", &rope));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "v_head_dim", &v));
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "rope_interleave", &interleave));
  for (const auto& [key, value] : {std::pair{"kv_lora_rank", kv_rank}, std::pair{"qk_nope_head_dim", nope},
                                   std::pair{"v_head_dim", v}}) {
    if (value < 1) return config.Error(key, "must be a positive width");
  }
  if (rope < 2 || rope % 2 != 0) {
    return config.Error("qk_rope_head_dim", "must be a positive even width (RoPE's pairs)");
  }
  // DeepseekV2Attention's num_key_value_groups repeats k and v, which
  // expand_kv already made for every head: only kv heads = heads runs.
  if (spec->num_kv_heads() > 0 && spec->num_kv_heads() != spec->num_attention_heads()) {
    return config.Error("num_key_value_heads",
                        absl::StrCat(spec->num_kv_heads(), ": latent attention expands k and v to every head; "
                                     "give num_attention_heads (", spec->num_attention_heads(), ") or leave it out"));
  }
  LatentAttentionSpec& latent = *spec->mutable_latent_attention();
  latent.set_q_lora_rank(q_rank);
  latent.set_kv_lora_rank(kv_rank);
  latent.set_qk_nope_head_dim(nope);
  latent.set_qk_rope_head_dim(rope);
  latent.set_v_head_dim(v);
  latent.set_rope_interleave(interleave);
  spec->set_num_kv_heads(spec->num_attention_heads());
  spec->set_head_dim(nope + rope);
  spec->set_rotary_dim(rope);
  // DeepseekV2Attention's scaling: (nope + rope)^-0.5, times yarn_get_mscale's
  // square where rope_parameters (or the legacy rope_scaling) names a
  // rope_type with mscale_all_dim (yarn_apply_mscale); numerics only.
  double scaling = 1.0 / std::sqrt(static_cast<double>(nope + rope));
  for (absl::string_view key : {"rope_scaling", "rope_parameters"}) {  // the legacy key wins (standardize_rope_params)
    ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> rope_config, config.Object(key));
    if (!rope_config) continue;
    std::string type = "default";
    double factor = 1.0, mscale_all_dim = 0;
    ZPLAN_RETURN_IF_ERROR(ReadString(*rope_config, "rope_type", &type));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(*rope_config, "factor", &factor));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(*rope_config, "mscale_all_dim", &mscale_all_dim));
    if (type != "default" && mscale_all_dim != 0 && factor > 1) {
      const double mscale = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
      scaling *= mscale * mscale;
    }
    break;
  }
  spec->set_attention_multiplier(scaling);
  return absl::OkStatus();
}

absl::Status ReadFamilyFields(const JsonObject& config, const ModelFamily& family, bool approximated,
                              ModelSpec* spec, std::string* substituted) {
  std::string act(family.default_activation), attn;
  ZPLAN_RETURN_IF_ERROR(ReadString(config, family.activation_key, &act));
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "_attn_implementation", &attn));
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "attn_implementation", &attn));
  std::optional<FfnType> ffn = FfnTypeFor(family, act);
  if (!ffn && !approximated) {
    return config.Error(family.activation_key,
                        absl::StrCat(QuoteInput(act), " is not modelled in ", family.model_type, "'s MLP; use ",
                                     ModelledActivations(family)));
  }
  if (!ffn) {
    *substituted = absl::StrCat(family.activation_key, " ", QuoteInput(act), " planned as ", family.default_activation);
    ffn = FfnTypeFor(family, family.default_activation);
  }
  spec->set_ffn_type(*ffn);
  if (!family.vision) {  // a ViT has no token embedding to tie
    bool tied = family.tie_word_embeddings;
    ZPLAN_RETURN_IF_ERROR(ReadBool(config, "tie_word_embeddings", &tied));
    spec->set_tie_word_embeddings(tied);
  }
  spec->set_norm_type(family.norm);
  spec->set_position_embedding(family.position);
  bool qkv_bias = family.qkv_bias, mlp_bias = family.mlp_bias;
  if (!family.qkv_bias_key.empty()) ZPLAN_RETURN_IF_ERROR(ReadBool(config, family.qkv_bias_key, &qkv_bias));
  if (!family.mlp_bias_key.empty()) ZPLAN_RETURN_IF_ERROR(ReadBool(config, family.mlp_bias_key, &mlp_bias));
  spec->set_attention_qkv_bias(qkv_bias);
  spec->set_attention_out_bias(family.out_bias == OutProjectionBias::kAlways ||
                               (family.out_bias == OutProjectionBias::kAsQkv && qkv_bias));
  spec->set_mlp_bias(mlp_bias);
  spec->set_qk_norm(family.qk_norm);
  // None asked: SDPA where the class supports it, eager otherwise (modeling_utils.py,
  // get_correct_attn_implementation); ValidateModelSpec refuses an SDPA it does not.
  spec->set_attention_impl(attn == "eager" || (attn.empty() && !family.supports_sdpa) ? ATTENTION_EAGER
                                                                                      : ATTENTION_SDPA);
  spec->set_eager_softmax_in_working_dtype(family.eager_softmax_in_working_dtype);
  struct Site {
    const DropoutSite& site;
    void (ModelSpec::*set)(double);
  };
  for (const Site& s : {Site{family.attention_dropout, &ModelSpec::set_attention_dropout},
                        Site{family.residual_dropout, &ModelSpec::set_residual_dropout},
                        Site{family.embedding_dropout, &ModelSpec::set_embedding_dropout}}) {
    double p = s.site.default_p;
    if (!s.site.key.empty()) ZPLAN_RETURN_IF_ERROR(ReadDouble(config, s.site.key, &p));
    (spec->*s.set)(p);
  }
  spec->set_fused_qkv_projection(family.fused_qkv);
  spec->set_fused_gate_up_projection(family.fused_gate_up);
  if (!family.sliding_window_key.empty()) {
    const google::protobuf::Value* given = config.Find(family.sliding_window_key);
    int64_t window = given != nullptr && given->has_null_value() ? 0 : family.default_sliding_window;  // null: none
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, family.sliding_window_key, &window));
    if (window < 0) return config.Error(family.sliding_window_key, "must be a positive number of tokens or null");
    spec->set_sliding_window(window);
  }
  if (family.full_attention_interval > 0) ZPLAN_RETURN_IF_ERROR(ReadLayerTypes(config, family, spec));
  if (family.no_rope_layer_interval > 0) ZPLAN_RETURN_IF_ERROR(ReadRopeLayers(config, family, spec));
  if (family.short_conv_layers) ZPLAN_RETURN_IF_ERROR(ReadShortConvConfig(config, family, spec));
  if (family.delta_rule_layers) ZPLAN_RETURN_IF_ERROR(ReadDeltaRuleConfig(config, spec));
  if (family.granite_hybrid_layers) ZPLAN_RETURN_IF_ERROR(ReadGraniteHybridLayers(config, family, spec));
  if (family.gemma4_layers) ZPLAN_RETURN_IF_ERROR(ReadGemma4Layers(config, spec));
  if (!family.moe.experts_key.empty()) ZPLAN_RETURN_IF_ERROR(ReadMoeConfig(config, family, spec));
  if (family.latent_attention.kv_lora_rank > 0) ZPLAN_RETURN_IF_ERROR(ReadLatentAttention(config, family, spec));
  for (absl::string_view key : family.unmodelled_keys) {
    const google::protobuf::Value* given = config.Find(key);
    if (given == nullptr || given->has_null_value() || (given->has_bool_value() && !given->bool_value()) ||
        (given->has_number_value() && given->number_value() == 0)) {
      continue;
    }
    const std::string shown = given->has_number_value() ? absl::StrCat(given->number_value())
                              : given->has_bool_value() ? "true"
                                                        : JsonTypeName(*given);
    return config.Error(key, absl::StrCat(shown, " is not modelled in ", family.model_type,
                                          "; zplan plans it with the key null or false"));
  }
  spec->set_norm_placement(family.norm_placement);
  spec->set_norm_weight_in_fp32(family.norm_weight_in_fp32);
  spec->set_norm_unit_offset(family.norm_unit_offset);
  spec->set_qk_norm_over_projection(family.qk_norm_over_projection);
  spec->set_rope_in_fp32(family.rope_in_fp32);
  spec->set_rope_concatenates(family.partial_rotary);
  spec->set_rope_interleaved(family.rope_interleaved);
  spec->set_rope_tables_per_sequence(family.rope_tables_per_sequence);
  spec->set_attention_sinks(family.attention_sinks);
  spec->set_rope_half_split(family.rope_half_split);
  if (family.partial_rotary) {
    // _compute_default_rope_parameters reads it from the config or its
    // rope_parameters, and rotates int(head_dim * factor) dims of each head.
    double factor = family.default_partial_rotary_factor;
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "partial_rotary_factor", &factor));
    ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> rope, config.Object("rope_parameters"));
    if (rope) ZPLAN_RETURN_IF_ERROR(ReadDouble(*rope, "partial_rotary_factor", &factor));
    const int64_t head_dim = spec->head_dim() > 0 ? spec->head_dim()
                             : spec->num_attention_heads() > 0 ? spec->hidden_size() / spec->num_attention_heads()
                                                                : 0;
    const int64_t rotary = static_cast<int64_t>(head_dim * factor);
    if (!(factor > 0 && factor <= 1) || rotary <= 0 || rotary % 2 != 0) {
      return config.Error("partial_rotary_factor", absl::StrCat(factor, " rotates ", rotary, " of ", head_dim,
                                                                " dims per head; give a factor in (0, 1] that "
                                                                "rotates an even number of them"));
    }
    spec->set_rotary_dim(rotary == head_dim ? 0 : rotary);
  }
  struct Softcap {
    absl::string_view key;
    double default_cap;
    void (ModelSpec::*set)(double);
  };
  for (const Softcap& c : {Softcap{family.attn_softcap_key, family.default_attn_softcap,
                                   &ModelSpec::set_attn_logit_softcapping},
                           Softcap{family.final_softcap_key, family.default_final_softcap,
                                   &ModelSpec::set_final_logit_softcapping}}) {
    if (c.key.empty()) continue;
    const google::protobuf::Value* given = config.Find(c.key);
    double cap = given != nullptr && given->has_null_value() ? 0 : c.default_cap;  // null: none
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, c.key, &cap));
    if (cap < 0) return config.Error(c.key, "must be positive or null (no softcapping)");
    (spec->*c.set)(cap);
  }
  if (family.embedding_scaled_by_sqrt_hidden) {
    spec->set_embedding_multiplier(std::sqrt(static_cast<double>(spec->hidden_size())));
  }
  if (!family.attention_scalar_key.empty() || family.default_attention_scalar > 0) {
    double scalar = family.default_attention_scalar;
    if (!family.attention_scalar_key.empty()) ZPLAN_RETURN_IF_ERROR(ReadDouble(config, family.attention_scalar_key, &scalar));
    if (!(scalar > 0)) return config.Error(family.attention_scalar_key, "must be positive: the scale is its -0.5 power");
    spec->set_attention_multiplier(1.0 / std::sqrt(scalar));
  }
  if (family.granite_multipliers) {
    // GraniteConfig's defaults; a value of 1.0 still runs its op.
    double embedding = 1.0, residual = 1.0, logits = 1.0, attention = 1.0;
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "embedding_multiplier", &embedding));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "residual_multiplier", &residual));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "logits_scaling", &logits));
    ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "attention_multiplier", &attention));
    if (logits == 0) return config.Error("logits_scaling", "is 0: GraniteForCausalLM divides the logits by it");
    spec->set_embedding_multiplier(embedding);
    spec->set_residual_multiplier(residual);
    spec->set_logits_scaling(logits);
    spec->set_attention_multiplier(attention);
  }
  return absl::OkStatus();
}

// transformers' ViTConfig (models/vit/configuration_vit.py) with its
// defaults, for ViTForImageClassification.
absl::StatusOr<ModelSpec> VitSpecFromHfConfig(const JsonObject& config, const ModelFamily& family,
                                              bool approximated, ModelSpec spec, std::string* substituted) {
  int64_t layers = 12, hidden = 768, heads = 12, ffn = 3072, image = 224, patch = 16, channels = 3;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_hidden_layers", &layers));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "hidden_size", &hidden));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_attention_heads", &heads));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, family.ffn_key, &ffn));
  ZPLAN_RETURN_IF_ERROR(ReadSide(config, "image_size", &image));
  ZPLAN_RETURN_IF_ERROR(ReadSide(config, "patch_size", &patch));
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_channels", &channels));
  // PretrainedConfig: num_labels, else as many as id2label names, else 2.
  int64_t labels = 2;
  if (const google::protobuf::Value* id2label = config.Find("id2label");
      id2label != nullptr && id2label->has_struct_value()) {
    labels = id2label->struct_value().fields_size();
  }
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_labels", &labels));
  ZPLAN_RETURN_IF_ERROR(ReadFamilyFields(config, family, approximated, &spec, substituted));
  spec.set_num_layers(layers);
  spec.set_hidden_size(hidden);
  spec.set_num_attention_heads(heads);
  spec.set_ffn_hidden_size(ffn);
  VisionSpec& vision = *spec.mutable_vision();
  vision.set_image_size(image);
  vision.set_patch_size(patch);
  vision.set_num_channels(channels);
  vision.set_num_labels(labels);
  return spec;
}

absl::Status ValidateVision(const ModelSpec& spec) {
  const VisionSpec& v = spec.vision();
  ZPLAN_RETURN_IF_ERROR(CheckFields({
      {"model.vision.patch_size", v.patch_size(), 1, kMaxImageSize, "pixels per patch side"},
      {"model.vision.image_size", v.image_size(), v.patch_size(), kMaxImageSize, "pixels per side, >= patch_size"},
      {"model.vision.num_channels", v.num_channels(), 1, kMaxImageChannels, "e.g. 3"},
      {"model.vision.num_labels", v.num_labels(), 1, kMaxVocabSize, "classifier outputs"},
  }));
  if (v.image_size() % v.patch_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.vision.image_size: ", v.image_size(),
                                                   " is not a multiple of patch_size ", v.patch_size(),
                                                   "; ViT's patch embedding would drop the remainder"));
  }
  if (VisionTokens(spec) > kMaxSeqLength) {
    return absl::InvalidArgumentError(absl::StrCat("model.vision: ", VisionTokens(spec), " patch tokens is more than ",
                                                   kMaxSeqLength, "; use larger patches or smaller images"));
  }
  if (spec.vocab_size() != 0) {
    return absl::InvalidArgumentError("model.vocab_size: a ViT (model.vision) has no token vocabulary; set it to 0");
  }
  if (spec.has_lora()) {
    return absl::InvalidArgumentError("model.lora: LoRA on a ViT is not modelled; plan it without adapters");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, contents] : PresetFiles()) names.push_back(name);
  return names;
}

absl::StatusOr<ModelSpec> LoadPreset(absl::string_view name) {
  const auto presets = PresetFiles();
  auto it = presets.find(std::string(name));
  if (it == presets.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--model: unknown preset \"", name,
                                                   "\"; presets: ", absl::StrJoin(PresetNames(), ", "),
                                                   " (or use --hf-config / --params)"));
  }
  ModelSpec spec;
  ZPLAN_RETURN_IF_ERROR(ParseProto(it->second, ProtoFormat::kText,
                                   absl::StrCat(kPresetDir, name, ".textproto"), &spec));
  spec = ResolveModelSpec(std::move(spec));
  ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(spec));
  return spec;
}

namespace {

// The language model of ModelSpecFromHfConfig: `config` is the whole
// config.json, or a vision-language model's text_config, read by
// vision_language's text family.
absl::StatusOr<ModelSpec> LanguageModelFromHfConfig(const JsonObject& config, absl::string_view source,
                                                    absl::string_view approximate_as, const std::string& model_type,
                                                    const std::string& name,
                                                    const std::optional<VisionLanguageConfig>& vision_language) {
  // The family: the model_type's own (a vision-language model's text family), or the one it is approximated as.
  const bool approximated = !approximate_as.empty();
  const ModelFamily* family =
      FindModelFamily(vision_language ? vision_language->spec.text_model_type() : model_type);
  if (vision_language && family == nullptr) {
    return config.Error("model_type", absl::StrCat(QuoteInput(vision_language->spec.text_model_type()),
                                                   " is not a language model zplan plans (", SupportedModelTypes(),
                                                   ")"));
  }
  if (approximated) {
    if (family != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--approximate-as: ", source, " is model_type ",
                                                     QuoteInput(model_type), ", which zplan plans as itself; drop "
                                                     "--approximate-as"));
    }
    family = FindModelFamily(approximate_as);
    if (family == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--approximate-as: ", QuoteInput(approximate_as),
                                                     " is not a model family; use one of ", SupportedModelTypes()));
    }
  } else if (family == nullptr) {
    return config.Error("model_type", absl::StrCat(
        model_type.empty() ? "missing" : absl::StrCat(QuoteInput(model_type), " is not supported"),
        "; zplan plans ", SupportedModelTypes(), ". Planning it as one of those is an unvalidated approximation: "
        "to accept that, add --approximate-as FAMILY (e.g. --approximate-as llama)"));
  }
  ModelSpec spec;
  spec.set_name(name.empty() ? std::string(source) : name);
  std::string substituted;  // an activation the approximating family does not model
  if (family->vision) {
    ZPLAN_ASSIGN_OR_RETURN(spec, VitSpecFromHfConfig(config, *family, approximated, std::move(spec), &substituted));
  } else {
    int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = family->default_head_dim, ffn = 0,
            vocab = 0, positions = 0;
    // GPT-2's own names first; the modern names override when both exist.
    if (family->gpt2_key_names) {
      ZPLAN_RETURN_IF_ERROR(ReadInt(config, "n_layer", &layers));
      ZPLAN_RETURN_IF_ERROR(ReadInt(config, "n_embd", &hidden));
      ZPLAN_RETURN_IF_ERROR(ReadInt(config, "n_head", &heads));
      ZPLAN_RETURN_IF_ERROR(ReadInt(config, "n_positions", &positions));
    }
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_hidden_layers", &layers));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "hidden_size", &hidden));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_attention_heads", &heads));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "num_key_value_heads", &kv_heads));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "head_dim", &head_dim));
    if (!family->ffn_key.empty()) ZPLAN_RETURN_IF_ERROR(ReadInt(config, family->ffn_key, &ffn));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "vocab_size", &vocab));
    ZPLAN_RETURN_IF_ERROR(ReadInt(config, "max_position_embeddings", &positions));
    // A vision-language model's text_config leaves out what its class defaults.
    const ModelFamily::Sizes& d = family->class_sizes;
    const bool class_defaults = vision_language.has_value() && d.hidden > 0;
    if (class_defaults) {
      const std::tuple<absl::string_view, int64_t*, int64_t> sizes[] = {
          {"num_hidden_layers", &layers, d.layers}, {"hidden_size", &hidden, d.hidden},
          {"num_attention_heads", &heads, d.heads}, {"vocab_size", &vocab, d.vocab},
          {family->ffn_key, &ffn, d.intermediate}};
      for (const auto& [key, value, fallback] : sizes) {
        if (config.Find(key) == nullptr) *value = fallback;
      }
    }
    for (const auto& [key, legacy] : {std::pair{"num_hidden_layers", "n_layer"}, std::pair{"hidden_size", "n_embd"},
                                      std::pair{"num_attention_heads", "n_head"}, std::pair{"vocab_size", ""}}) {
      const bool legacy_given = family->gpt2_key_names && *legacy != '\0' && config.Find(legacy) != nullptr;
      if (config.Find(key) == nullptr && !legacy_given && !class_defaults) {
        return config.Error(key, absl::StrCat("missing; zplan plans decoder language models from a transformers "
                                              "config.json, which has it (model_type ", QuoteInput(model_type), ")"));
      }
    }
    if (ffn == 0) ffn = family->ffn_default_multiple * hidden;  // GPT-2's n_inner: null means 4 * n_embd
    spec.set_num_layers(layers);
    spec.set_hidden_size(hidden);
    spec.set_num_attention_heads(heads);
    spec.set_num_kv_heads(kv_heads);
    spec.set_head_dim(head_dim);
    spec.set_ffn_hidden_size(ffn);
    spec.set_vocab_size(vocab);
    ZPLAN_RETURN_IF_ERROR(ReadFamilyFields(config, *family, approximated, &spec, &substituted));
    if (family->position == POSITION_LEARNED) spec.set_max_position_embeddings(positions);
  }
  if (vision_language) {
    spec.set_tie_word_embeddings(vision_language->tie_word_embeddings);
    *spec.mutable_vision_language() = vision_language->spec;
    // The Qwen types' multimodal RoPE: position ids [3, b, s], so cos and sin
    // [b, s, head_dim] (Qwen2_5_VLRotaryEmbedding, Qwen3VLTextRotaryEmbedding).
    if (vision_language->spec.tower() != VISION_TOWER_CLIP) spec.set_rope_tables_per_sequence(true);
  }
  spec.set_source(absl::StrCat("Hugging Face config ", source, " (model_type \"", model_type, "\"",
                               family->vision ? ", ViTForImageClassification" : "",
                               vision_language ? absl::StrCat(", its language model ", family->model_type) : "",
                               approximated ? absl::StrCat(", planned as ", family->model_type) : "",
                               substituted.empty() ? "" : absl::StrCat("; ", substituted), ")"));
  spec.set_model_type(model_type);
  if (approximated) spec.set_unvalidated_approximation(ApproximationNote(model_type, family->model_type));
  spec = ResolveModelSpec(std::move(spec));
  absl::Status valid = ValidateModelSpec(spec);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  return spec;
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(absl::string_view text, absl::string_view source,
                                                absl::string_view approximate_as) {
  ZPLAN_ASSIGN_OR_RETURN(const JsonObject config, ParseJsonObject(text, source));
  std::string model_type, name;
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "model_type", &model_type));
  // Experts in a model_type whose family has none (MoeKeys) are refused by
  // name, never planned as a dense model.
  const ModelFamily* own = FindModelFamily(model_type);
  if (own == nullptr || own->moe.experts_key.empty()) {
    for (absl::string_view moe_key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
      int64_t experts = 0;
      ZPLAN_RETURN_IF_ERROR(ReadInt(config, moe_key, &experts));
      if (experts > 1) {
        return config.Error(moe_key, absl::StrCat("a mixture of experts of model_type ", QuoteInput(model_type),
                                                  " is not modelled; zplan plans the mixture-of-experts types ",
                                                  MoeModelTypes(), ", or a dense model"));
      }
    }
  }
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "_name_or_path", &name));
  const bool approximated = !approximate_as.empty();
  // A vision-language model: its vision side here, its language model read
  // below from text_config (vision_language.h). Other multimodal configs
  // (Gemma 3, Mistral 3, ...) nest a language model zplan reads alone.
  std::optional<VisionLanguageConfig> vision_language;
  if (IsVisionLanguageType(model_type) && !approximated) {
    ZPLAN_ASSIGN_OR_RETURN(vision_language, ReadVisionLanguageConfig(config, model_type));
  } else if (config.Find("text_config") != nullptr && config.Find("num_hidden_layers") == nullptr) {
    return config.Error("text_config", absl::StrCat("a multimodal config (model_type ", QuoteInput(model_type),
                                                    "): zplan plans its language model only; save text_config "
                                                    "as its own config.json and pass that"));
  }
  return LanguageModelFromHfConfig(vision_language ? *vision_language->text : config, source, approximate_as,
                                   model_type, name, vision_language);
}

absl::StatusOr<ModelSpec> LoadHfConfig(const std::string& path, absl::string_view approximate_as) {
  ZPLAN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ModelSpecFromHfConfig(text, path, approximate_as);
}

absl::StatusOr<ModelSpec> ModelSpecForParams(int64_t params) {
  constexpr int64_t kWidthStep = 128;   // widths are multiples of 128 (tensor-core friendly)
  constexpr int64_t kHeadDim = 128;
  auto shape = [](int64_t h) {
    ModelSpec spec;
    spec.set_num_layers(std::max<int64_t>(2, h / 128));  // GPT-3: 4096 wide -> 32 layers
    spec.set_hidden_size(h);
    spec.set_num_attention_heads(std::max<int64_t>(1, h / kHeadDim));
    spec.set_head_dim(h >= kHeadDim ? kHeadDim : h);
    spec.set_num_kv_heads(spec.num_attention_heads());
    spec.set_ffn_hidden_size(4 * h);
    spec.set_ffn_type(FFN_GELU);
    spec.set_norm_type(NORM_LAYERNORM);
    spec.set_attention_impl(ATTENTION_SDPA);
    spec.set_position_embedding(POSITION_ROPE);
    spec.set_attention_qkv_bias(true);
    spec.set_attention_out_bias(true);
    spec.set_mlp_bias(true);
    spec.set_tie_word_embeddings(true);
    spec.set_vocab_size(0);
    return spec;
  };
  if (params <= 0) return absl::InvalidArgumentError("--params: must be > 0, e.g. --params 7.5e9");
  ModelSpec best;
  bool found = false;
  for (int64_t h = kWidthStep; h <= 131072; h += kWidthStep) {
    ModelSpec spec = shape(h);
    const int64_t without_vocab = CountParameters(spec);  // vocab 0: blocks + final norm
    if (without_vocab + kMinVocabForParams * h > params) break;
    spec.set_vocab_size((params - without_vocab) / h);
    best = spec;
    found = true;
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--params: ", params, " is below the smallest standard shape (",
        CountParameters(shape(kWidthStep)) + kMinVocabForParams * kWidthStep,
        " parameters); describe the model with --model or --hf-config instead"));
  }
  const int64_t count = CountParameters(best);
  best.set_name(absl::StrCat("params-", params));
  best.set_source(absl::StrCat(
      "standard shape for --params ", params, ": GPT-3-style blocks, ", best.num_layers(),
      " layers x ", best.hidden_size(), " wide (layers = width / 128), 128-wide MHA heads, GELU MLP 4h, "
      "LayerNorm, tied embeddings; the vocabulary (", best.vocab_size(),
      ") absorbs the remainder: ", count, " parameters (", count - params, " from the request)"));
  return best;
}

std::vector<std::string> LoraTargetNames(const ModelSpec& spec) {
  std::vector<std::string> names;
  for (int layer = 0; layer < spec.num_layers(); ++layer) {
    for (const BlockOp& op : BlockLayout(spec, layer)) {
      if (op.kind == BlockOpKind::kMoe) continue;  // ValidateLora refuses adapters there
      for (const BlockLinear& linear : OpLinears(spec, op)) {
        if (std::find(names.begin(), names.end(), linear.name) == names.end()) names.emplace_back(linear.name);
      }
    }
  }
  return names;
}

absl::Status ApplyLoraConfig(absl::string_view text, absl::string_view source, ModelSpec* spec) {
  ZPLAN_ASSIGN_OR_RETURN(const JsonObject config, ParseJsonObject(text, source));
  std::string peft_type = "LORA", bias = "none";
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "peft_type", &peft_type));
  if (peft_type != "LORA") {
    return config.Error("peft_type", absl::StrCat(QuoteInput(peft_type), " is not modelled; zplan plans LoRA"));
  }
  LoraSpec& lora = *spec->mutable_lora();
  int64_t rank = kPeftDefaultLoraRank;
  double alpha = kPeftDefaultLoraAlpha, dropout = 0;
  ZPLAN_RETURN_IF_ERROR(ReadInt(config, "r", &rank));
  ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "lora_alpha", &alpha));
  ZPLAN_RETURN_IF_ERROR(ReadDouble(config, "lora_dropout", &dropout));
  ZPLAN_RETURN_IF_ERROR(ReadString(config, "bias", &bias));
  lora.set_rank(rank);
  lora.set_alpha(alpha);
  lora.set_dropout(dropout);
  // Keys that change what trains or what is stored, and are not modelled.
  bool dora = false;
  ZPLAN_RETURN_IF_ERROR(ReadBool(config, "use_dora", &dora));
  if (dora) return config.Error("use_dora", "DoRA's magnitude vectors are not modelled; plan plain LoRA");
  if (bias != "none") {
    return config.Error("bias", absl::StrCat(QuoteInput(bias), ": trainable biases are not modelled; use \"none\""));
  }
  // Absent, null, {} and [] leave PEFT's defaults.
  for (absl::string_view key :
       {"rank_pattern", "alpha_pattern", "layers_to_transform", "target_parameters"}) {
    const google::protobuf::Value* value = config.Find(key);
    const bool unset = value == nullptr || value->has_null_value() ||
                       (value->has_list_value() && value->list_value().values().empty()) ||
                       (value->has_struct_value() && value->struct_value().fields().empty());
    if (!unset) {
      return config.Error(key, "not modelled: zplan plans one r on every targeted block linear, with every "
                               "other parameter frozen; remove it");
    }
  }
  lora.clear_modules_to_save();
  if (const google::protobuf::Value* saved = config.Find("modules_to_save");
      saved != nullptr && !saved->has_null_value()) {
    if (!saved->has_list_value()) {
      return config.Error("modules_to_save", absl::StrCat("expected a list of module names, got a ",
                                                          JsonTypeName(*saved)));
    }
    for (const google::protobuf::Value& v : saved->list_value().values()) {
      if (!v.has_string_value()) {
        return config.Error("modules_to_save", absl::StrCat("expected module names, got a ", JsonTypeName(v)));
      }
      lora.add_modules_to_save(v.string_value());
    }
  }
  const std::vector<std::string> known = LoraTargetNames(*spec);
  const google::protobuf::Value* targets = config.Find("target_modules");
  lora.clear_target_modules();
  if (targets == nullptr || targets->has_null_value()) {
    for (const char* name : kPeftDefaultLoraTargets) lora.add_target_modules(name);
  } else if (targets->has_string_value()) {
    if (targets->string_value() != "all-linear") {
      return config.Error("target_modules", absl::StrCat(QuoteInput(targets->string_value()),
                                                         ": a regular expression is not modelled; list the "
                                                         "modules, e.g. [\"q_proj\", \"v_proj\"], or use "
                                                         "\"all-linear\""));
    }
    for (const std::string& name : known) lora.add_target_modules(name);
  } else if (targets->has_list_value()) {
    for (const google::protobuf::Value& v : targets->list_value().values()) {
      if (!v.has_string_value()) {
        return config.Error("target_modules", absl::StrCat("expected module names, got a ", JsonTypeName(v)));
      }
      lora.add_target_modules(v.string_value());
    }
  } else {
    return config.Error("target_modules", absl::StrCat("expected a list of module names or \"all-linear\", got a ",
                                                       JsonTypeName(*targets)));
  }
  absl::Status valid = ValidateModelSpec(*spec);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  return absl::OkStatus();
}

absl::Status LoadLoraConfig(const std::string& path, ModelSpec* spec) {
  ZPLAN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ApplyLoraConfig(text, path, spec);
}

std::string ModelOriginLine(const ModelSpec& spec) {
  if (!spec.unvalidated_approximation().empty()) return spec.unvalidated_approximation();
  if (!spec.model_type().empty()) return "";
  return absl::StrCat("model: ", spec.source().empty() ? spec.name() : spec.source());
}

bool HasLayersOf(const ModelSpec& spec, LayerType type) {
  return std::find(spec.layer_types().begin(), spec.layer_types().end(), type) != spec.layer_types().end();
}

bool HasShortConv(const ModelSpec& spec) {
  return HasLayersOf(spec, LAYER_LINEAR_ATTENTION) || HasLayersOf(spec, LAYER_CONV);
}

ModelSpec ResolveModelSpec(ModelSpec spec) {
  if (spec.num_kv_heads() == 0) spec.set_num_kv_heads(spec.num_attention_heads());
  // Left unset when heads do not divide hidden, so validation can say so.
  if (spec.head_dim() == 0 && spec.num_attention_heads() > 0 &&
      spec.hidden_size() % spec.num_attention_heads() == 0) {
    spec.set_head_dim(spec.hidden_size() / spec.num_attention_heads());
  }
  if (spec.ffn_type() == FFN_TYPE_UNSPECIFIED) spec.set_ffn_type(FFN_SWIGLU);
  if (spec.norm_type() == NORM_TYPE_UNSPECIFIED) spec.set_norm_type(NORM_RMSNORM);
  if (spec.attention_impl() == ATTENTION_IMPL_UNSPECIFIED) spec.set_attention_impl(ATTENTION_SDPA);
  // transformers' torch fallbacks unless a plan names the kernels (--kernels).
  if (HasLayersOf(spec, LAYER_LINEAR_ATTENTION) && spec.linear_attention_impl() == LINEAR_ATTENTION_IMPL_UNSPECIFIED) {
    spec.set_linear_attention_impl(LINEAR_ATTENTION_TORCH);
  }
  if (HasShortConv(spec) && spec.short_conv_impl() == SHORT_CONV_IMPL_UNSPECIFIED) {
    spec.set_short_conv_impl(SHORT_CONV_TORCH);
  }
  if (spec.position_embedding() == POSITION_EMBEDDING_UNSPECIFIED) {
    spec.set_position_embedding(POSITION_ROPE);
  }
  // A ViT learns one position per token of its image.
  if (spec.has_vision()) {
    spec.set_position_embedding(POSITION_LEARNED);
    spec.set_max_position_embeddings(VisionTokens(spec));
  }
  return spec;
}

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  // A ViT's own fields first: its positions follow from them.
  if (spec.has_vision()) ZPLAN_RETURN_IF_ERROR(ValidateVision(spec));
  if (spec.has_vision_language()) ZPLAN_RETURN_IF_ERROR(ValidateVisionLanguage(spec));
  const bool every_layer_moe = spec.has_moe() && spec.moe().dense_layers_size() == 0;
  ZPLAN_RETURN_IF_ERROR(CheckFields({
      {"model.num_layers", spec.num_layers(), 1, kMaxLayers, "transformer blocks"},
      {"model.hidden_size", spec.hidden_size(), 1, kMaxHiddenSize, "model width"},
      {"model.num_attention_heads", spec.num_attention_heads(), 1, kMaxHeads, "query heads"},
      {"model.num_kv_heads", spec.num_kv_heads(), 1, kMaxHeads, "key/value heads"},
      {"model.ffn_hidden_size", spec.ffn_hidden_size(), every_layer_moe ? 0 : 1, kMaxFfnSize,
       "FFN inner width; 0 when every layer is a mixture of experts"},
      {"model.vocab_size", spec.vocab_size(), 0, kMaxVocabSize, "tokens; 0 = no token embedding"},
      {"model.max_position_embeddings", spec.max_position_embeddings(), 0, kMaxSeqLength, "learned position rows"},
  }));
  ZPLAN_RETURN_IF_ERROR(CheckRange("model.head_dim", spec.head_dim(), 0, kMaxHeadDim, "0 = hidden_size / heads"));
  if (spec.has_moe()) {
    const MoeSpec& moe = spec.moe();
    ZPLAN_RETURN_IF_ERROR(CheckFields({
        {"model.moe.num_experts", moe.num_experts(), 1, kMaxExperts, "experts per MoE layer"},
        {"model.moe.experts_per_token", moe.experts_per_token(), 1, moe.num_experts(), "top-k, at most the experts"},
        {"model.moe.expert_ffn_hidden_size", moe.expert_ffn_hidden_size(), 1, kMaxFfnSize, "each expert's width"},
        {"model.moe.shared_expert_ffn_hidden_size", moe.shared_expert_ffn_hidden_size(), 0, kMaxFfnSize,
         "0 = no shared expert"},
    }));
    const double expert_parameters = 3.0 * static_cast<double>(moe.num_experts()) *
                                     static_cast<double>(moe.expert_ffn_hidden_size()) *
                                     static_cast<double>(spec.hidden_size());
    if (expert_parameters * static_cast<double>(spec.num_layers()) > static_cast<double>(kMaxParameters)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model.moe.num_experts: %d experts %d wide over %d layers of width %d are about %.3g parameters, more than "
          "zplan plans (%.3g); check num_experts and the expert width",
          moe.num_experts(), moe.expert_ffn_hidden_size(), spec.num_layers(), spec.hidden_size(),
          expert_parameters * static_cast<double>(spec.num_layers()), static_cast<double>(kMaxParameters)));
    }
    if (!std::isfinite(moe.router_aux_loss_coef())) {
      return absl::InvalidArgumentError("model.moe.router_aux_loss_coef: must be a finite number");
    }
    if (moe.dense_layers_size() != 0 && moe.dense_layers_size() != spec.num_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("model.moe.dense_layers: ", moe.dense_layers_size(),
                                                     " entries for ", spec.num_layers(), " layers; give one per layer "
                                                     "or none (every layer MoE)"));
    }
  }
  ZPLAN_RETURN_IF_ERROR(CheckUtf8("model.name (_name_or_path)", spec.name()));
  ZPLAN_RETURN_IF_ERROR(CheckUtf8("model.source", spec.source()));
  ZPLAN_RETURN_IF_ERROR(CheckUtf8("model.model_type", spec.model_type()));
  ZPLAN_RETURN_IF_ERROR(CheckUtf8("model.unvalidated_approximation", spec.unvalidated_approximation()));
  if (!spec.model_type().empty() && LanguageModelFamilyOf(spec) == nullptr &&
      spec.unvalidated_approximation().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.model_type: ", QuoteInput(spec.model_type()), " is not supported (zplan plans ", SupportedModelTypes(),
        "), and model.unvalidated_approximation does not say it was planned as one of them; plan its config.json "
        "with zplan --approximate-as FAMILY, or leave model_type empty for a shape given directly"));
  }
  const ModelFamily* family = LanguageModelFamilyOf(spec);
  if (family != nullptr && !family->supports_sdpa && spec.attention_impl() == ATTENTION_SDPA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.attention_impl: SDPA; transformers refuses it for ", spec.model_type(),
        " (_supports_sdpa is False: SDPA has no ", spec.attention_sinks() ? "sinks" : "softcapping",
        ") and runs it eager; use --attention eager"));
  }
  if (spec.has_latent_attention()) {
    const LatentAttentionSpec& l = spec.latent_attention();
    ZPLAN_RETURN_IF_ERROR(CheckFields({
        {"model.latent_attention.q_lora_rank", l.q_lora_rank(), 0, kMaxHiddenSize, "0 = one q_proj"},
        {"model.latent_attention.kv_lora_rank", l.kv_lora_rank(), 1, kMaxHiddenSize, "the latent's width"},
        {"model.latent_attention.qk_nope_head_dim", l.qk_nope_head_dim(), 1, kMaxHeadDim, "q and k without RoPE"},
        {"model.latent_attention.qk_rope_head_dim", l.qk_rope_head_dim(), 2, kMaxHeadDim, "q and k with RoPE"},
        {"model.latent_attention.v_head_dim", l.v_head_dim(), 1, kMaxHeadDim, "each value head"},
    }));
    if (spec.head_dim() != l.qk_nope_head_dim() + l.qk_rope_head_dim() ||
        spec.num_kv_heads() != spec.num_attention_heads()) {
      return absl::InvalidArgumentError(
          "model.head_dim: latent attention's heads are qk_nope_head_dim + qk_rope_head_dim wide, one key and value "
          "head per query head; read the spec from its config.json");
    }
    // Planned as measured: SDPA, no attention dropout, full fine-tuning.
    if (spec.attention_impl() != ATTENTION_SDPA) {
      return absl::InvalidArgumentError(
          "model.attention_impl: latent attention is planned with SDPA only (eager's tensors were not measured); "
          "use --attention sdpa");
    }
    if (spec.attention_dropout() > 0) {
      return absl::InvalidArgumentError(
          "model.attention_dropout: latent attention with attention dropout is not modelled; set attention_dropout 0");
    }
    if (spec.has_lora()) {
      return absl::InvalidArgumentError(
          "model.lora: LoRA on latent attention (q_a_proj, kv_b_proj, ...) is not modelled yet; plan full "
          "fine-tuning (drop --lora-config)");
    }
  }
  if (spec.attention_sinks() && spec.attention_impl() != ATTENTION_EAGER) {
    return absl::InvalidArgumentError(
        "model.attention_sinks: only eager attention is planned with sinks (flash and flex kernels keep other "
        "tensors); use --attention eager");
  }
  if (spec.attn_logit_softcapping() > 0 && spec.attention_impl() == ATTENTION_SDPA) {
    return absl::InvalidArgumentError(
        "model.attn_logit_softcapping: SDPA has none (sdpa_attention_forward raises); use eager attention");
  }
  if (spec.head_dim() == 0 && spec.hidden_size() % spec.num_attention_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_attention_heads: ", spec.num_attention_heads(), " heads do not divide hidden_size ",
        spec.hidden_size(), "; choose a divisor or set head_dim"));
  }
  if (spec.head_dim() <= 0) return absl::InvalidArgumentError("model.head_dim: must be > 0");
  if (spec.num_attention_heads() % spec.num_kv_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_kv_heads: ", spec.num_kv_heads(), " does not divide num_attention_heads ",
        spec.num_attention_heads(), " (GQA groups must be equal)"));
  }
  if (spec.position_embedding() == POSITION_LEARNED && spec.max_position_embeddings() <= 0) {
    return absl::InvalidArgumentError(
        "model.max_position_embeddings: must be > 0 with learned positions");
  }
  for (const auto& [field, p] : {std::pair<const char*, double>{"attention_dropout", spec.attention_dropout()},
                                  {"residual_dropout", spec.residual_dropout()},
                                  {"embedding_dropout", spec.embedding_dropout()}}) {
    if (!(p >= 0 && p < 1)) {
      return absl::InvalidArgumentError(absl::StrCat("model.", field, ": a probability in [0, 1), got ", p));
    }
  }
  if (spec.rope_layers_size() != 0 && spec.rope_layers_size() != spec.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_layers: ", spec.rope_layers_size(),
                                                   " entries for num_layers ", spec.num_layers(),
                                                   "; give one per layer, or none"));
  }
  if (spec.layer_types_size() != 0 && spec.layer_types_size() != spec.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("model.layer_types: ", spec.layer_types_size(),
                                                   " entries for num_layers ", spec.num_layers(),
                                                   "; give one per layer, or none"));
  }
  for (int type : spec.layer_types()) {
    if (type == LAYER_TYPE_UNSPECIFIED || !LayerType_IsValid(type)) {
      return absl::InvalidArgumentError("model.layer_types: LAYER_TYPE_UNSPECIFIED; give each layer its type");
    }
    if ((type == LAYER_CONV || type == LAYER_LINEAR_ATTENTION) && spec.conv_kernel_size() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("model.conv_kernel_size: ", spec.conv_kernel_size(),
                                                     " with ", LayerType_Name(static_cast<LayerType>(type)),
                                                     " layers; give the conv's kernel in tokens (>= 1)"));
    }
  }
  if (HasLayersOf(spec, LAYER_LINEAR_ATTENTION)) {
    ZPLAN_RETURN_IF_ERROR(CheckFields({
        {"model.linear_num_key_heads", spec.linear_num_key_heads(), 1, kMaxHeads, "Gated DeltaNet key heads"},
        {"model.linear_num_value_heads", spec.linear_num_value_heads(), 1, kMaxHeads, "Gated DeltaNet value heads"},
        {"model.linear_key_head_dim", spec.linear_key_head_dim(), 1, kMaxHeadDim, "elements per key head"},
        {"model.linear_value_head_dim", spec.linear_value_head_dim(), 1, kMaxHeadDim, "elements per value head"},
    }));
    if (spec.linear_num_value_heads() % spec.linear_num_key_heads() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.linear_num_value_heads: ", spec.linear_num_value_heads(), " is not a multiple of linear_num_key_heads ",
          spec.linear_num_key_heads(), "; torch_chunk_gated_delta_rule repeats each key head to whole value heads"));
    }
  }
  // Each kernel choice is set exactly where the model has the layers it runs in.
  const auto check_impl = [](absl::string_view field, bool has, bool set, bool valid, absl::string_view choices,
                             absl::string_view layers) -> absl::Status {
    if (has && (!set || !valid)) {
      return absl::InvalidArgumentError(absl::StrCat("model.", field, ": ", set ? "not a known value" : "unset",
                                                     " for a model with ", layers, " layers; give ", choices));
    }
    if (!has && set) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.", field, ": set for a model without ", layers, " layers; leave it unset"));
    }
    return absl::OkStatus();
  };
  const bool delta_rule = HasLayersOf(spec, LAYER_LINEAR_ATTENTION), conv = HasShortConv(spec);
  ZPLAN_RETURN_IF_ERROR(check_impl("linear_attention_impl", delta_rule,
                                   spec.linear_attention_impl() != LINEAR_ATTENTION_IMPL_UNSPECIFIED,
                                   LinearAttentionImpl_IsValid(spec.linear_attention_impl()),
                                   "LINEAR_ATTENTION_TORCH or LINEAR_ATTENTION_FLA", "LAYER_LINEAR_ATTENTION"));
  ZPLAN_RETURN_IF_ERROR(check_impl("short_conv_impl", conv, spec.short_conv_impl() != SHORT_CONV_IMPL_UNSPECIFIED,
                                   ShortConvImpl_IsValid(spec.short_conv_impl()),
                                   "SHORT_CONV_TORCH or SHORT_CONV_CAUSAL_CONV1D",
                                   "LAYER_CONV or LAYER_LINEAR_ATTENTION"));
  // What the packages' kernels refuse at run time.
  constexpr int64_t kFlaMaxKeyHeadDim = 256;  // fla/ops/common/chunk_delta_h.py, chunk_gated_delta_rule_fwd_h
  if (spec.linear_attention_impl() == LINEAR_ATTENTION_FLA && spec.linear_key_head_dim() > kFlaMaxKeyHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.linear_key_head_dim: ", spec.linear_key_head_dim(), " with LINEAR_ATTENTION_FLA; fla's "
        "chunk_gated_delta_rule takes key heads up to ", kFlaMaxKeyHeadDim, " wide (chunk_delta_h.py asserts it)"));
  }
  // csrc/causal_conv1d.cpp, causal_conv1d_fwd: its input is a transposed view (channel-last), whose strides
  // must be multiples of 8 -- the conv's channels.
  constexpr int64_t kCausalConv1dStrideMultiple = 8;
  const int64_t conv_channels = delta_rule ? DeltaRuleWidthsOf(spec).conv_channels() : spec.hidden_size();
  if (spec.short_conv_impl() == SHORT_CONV_CAUSAL_CONV1D && conv_channels % kCausalConv1dStrideMultiple != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.short_conv_impl: SHORT_CONV_CAUSAL_CONV1D with ", conv_channels, " conv channels; causal-conv1d "
        "refuses a channel-last input whose strides are not multiples of ", kCausalConv1dStrideMultiple,
        " (transformers then fails): plan the torch fallback"));
  }
  if (spec.layer_head_dims_size() != 0 && spec.layer_head_dims_size() != spec.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("model.layer_head_dims: ", spec.layer_head_dims_size(),
                                                   " entries for num_layers ", spec.num_layers(),
                                                   "; give one per layer, or none"));
  }
  for (int64_t d : spec.layer_head_dims()) {
    ZPLAN_RETURN_IF_ERROR(CheckRange("model.layer_head_dims", d, 1, kMaxHeadDim, "elements per head"));
  }
  ZPLAN_RETURN_IF_ERROR(CheckRange("model.per_layer_input_size", spec.per_layer_input_size(), 0, kMaxHiddenSize,
                                   "hidden_size_per_layer_input; 0 = no per-layer embeddings"));
  if (spec.per_layer_input_size() > 0) {
    // embed_tokens_per_layer looks up every token id (Gemma4TextModel.get_per_layer_inputs).
    ZPLAN_RETURN_IF_ERROR(CheckRange("model.per_layer_input_vocab_size", spec.per_layer_input_vocab_size(),
                                     std::max<int64_t>(1, spec.vocab_size()), kMaxVocabSize,
                                     "vocab_size_per_layer_input, at least vocab_size: every token id is looked up"));
  }
  if (spec.norm_pow_mean_square() && (!spec.norm_weight_in_fp32() || spec.norm_unit_offset())) {
    return absl::InvalidArgumentError(
        "model.norm_pow_mean_square: Gemma4RMSNorm multiplies by its weight in fp32, without 1 +; set "
        "norm_weight_in_fp32 and clear norm_unit_offset");
  }
  if (spec.norm_unit_offset() && !spec.norm_weight_in_fp32()) {
    return absl::InvalidArgumentError(
        "model.norm_unit_offset: set without norm_weight_in_fp32 (Gemma3RMSNorm multiplies in fp32); set both");
  }
  if (spec.qk_norm_over_projection() && !spec.qk_norm()) {
    return absl::InvalidArgumentError("model.qk_norm_over_projection: set without qk_norm; set both or neither");
  }
  if (spec.has_lora()) ZPLAN_RETURN_IF_ERROR(ValidateLora(spec));
  return absl::OkStatus();
}

}  // namespace zplan
