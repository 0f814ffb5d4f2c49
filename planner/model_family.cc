#include "planner/model_family.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/json.h"

namespace zplan {
namespace {

// Llama-family configs have one dropout site, attention_dropout (0.0); their
// blocks and embeddings have none.
constexpr DropoutSite kAttentionDropoutOnly = {"attention_dropout", 0.0};
// GPT2Config defaults attn_pdrop, resid_pdrop and embd_pdrop to 0.1.
constexpr double kGpt2DefaultDropout = 0.1;
// GPT2Config's n_inner: None means 4 * n_embd (GPT2Block).
constexpr int64_t kGpt2FfnMultiple = 4;
// Qwen3Config's head_dim default (its heads are wider than hidden / heads).
constexpr int64_t kQwen3DefaultHeadDim = 128;

std::vector<ModelFamily> BuildFamilies() {
  std::vector<ModelFamily> families;
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "llama";
    f.read_from = "models/llama/configuration_llama.py (LlamaConfig), modeling_llama.py (LlamaMLP, LlamaAttention)";
    f.ffn_key = "intermediate_size";
    f.norm = NORM_RMSNORM;
    f.mlp = MlpKind::kGated;
    f.activation_key = "hidden_act";
    f.default_activation = "silu";
    f.qkv_bias_key = "attention_bias";  // q, k, v and o_proj alike
    f.out_bias = OutProjectionBias::kAsQkv;
    f.mlp_bias_key = "mlp_bias";
    f.position = POSITION_ROPE;
    f.attention_dropout = kAttentionDropoutOnly;
  }
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "mistral";
    f.read_from = "models/mistral/configuration_mistral.py (MistralConfig), modeling_mistral.py (MistralMLP, "
                  "MistralAttention: no bias anywhere)";
    f.ffn_key = "intermediate_size";
    f.norm = NORM_RMSNORM;
    f.mlp = MlpKind::kGated;
    f.activation_key = "hidden_act";
    f.default_activation = "silu";
    f.position = POSITION_ROPE;
    f.attention_dropout = kAttentionDropoutOnly;
  }
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "qwen2";
    f.read_from = "models/qwen2/configuration_qwen2.py (Qwen2Config), modeling_qwen2.py (Qwen2MLP, Qwen2Attention: "
                  "bias on q, k, v only)";
    f.ffn_key = "intermediate_size";
    f.norm = NORM_RMSNORM;
    f.mlp = MlpKind::kGated;
    f.activation_key = "hidden_act";
    f.default_activation = "silu";
    f.qkv_bias = true;
    f.position = POSITION_ROPE;
    f.attention_dropout = kAttentionDropoutOnly;
  }
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "qwen3";
    f.read_from = "models/qwen3/configuration_qwen3.py (Qwen3Config), modeling_qwen3.py (Qwen3MLP, Qwen3Attention: "
                  "q_norm and k_norm)";
    f.ffn_key = "intermediate_size";
    f.default_head_dim = kQwen3DefaultHeadDim;
    f.norm = NORM_RMSNORM;
    f.mlp = MlpKind::kGated;
    f.activation_key = "hidden_act";
    f.default_activation = "silu";
    f.qkv_bias_key = "attention_bias";  // q, k, v and o_proj alike
    f.out_bias = OutProjectionBias::kAsQkv;
    f.qk_norm = true;
    f.position = POSITION_ROPE;
    f.attention_dropout = kAttentionDropoutOnly;
  }
  {
    // Llama's blocks, with four multipliers its modeling file applies.
    ModelFamily f = families.front();
    f.model_type = "granite";
    f.read_from = "models/granite/configuration_granite.py (GraniteConfig), modeling_granite.py (GraniteModel: "
                  "embeddings x embedding_multiplier; GraniteDecoderLayer: residual + output x residual_multiplier; "
                  "GraniteAttention: scaling = attention_multiplier; GraniteForCausalLM: logits / logits_scaling)";
    f.granite_multipliers = true;
    families.push_back(f);
  }
  {
    // Mistral's blocks (no bias anywhere), with the projections fused, RoPE
    // joined by torch.cat, dropout before each residual add and a window.
    ModelFamily f = families[1];
    f.model_type = "phi3";
    f.read_from = "models/phi3/configuration_phi3.py (Phi3Config), modeling_phi3.py (Phi3Attention: one qkv_proj, "
                  "o_proj registered first, no biases; Phi3MLP: one gate_up_proj, chunked; Phi3DecoderLayer: "
                  "resid_pdrop dropout before each residual add)";
    f.residual_dropout = {"resid_pdrop", 0.0};
    f.fused_qkv = true;
    f.fused_gate_up = true;
    f.sliding_window_key = "sliding_window";
    f.partial_rotary = true;
    families.push_back(f);
  }
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "gpt2";
    f.read_from = "models/gpt2/configuration_gpt2.py (GPT2Config), modeling_gpt2.py (GPT2Attention, GPT2MLP: Conv1D "
                  "with biases, eager softmax in the working dtype)";
    f.gpt2_key_names = true;
    f.ffn_key = "n_inner";
    f.ffn_default_multiple = kGpt2FfnMultiple;
    f.tie_word_embeddings = true;
    f.norm = NORM_LAYERNORM;
    f.mlp = MlpKind::kPlain;
    f.activation_key = "activation_function";
    f.default_activation = "gelu_new";
    f.qkv_bias = true;
    f.out_bias = OutProjectionBias::kAlways;
    f.mlp_bias = true;
    f.position = POSITION_LEARNED;
    f.attention_dropout = {"attn_pdrop", kGpt2DefaultDropout};
    f.residual_dropout = {"resid_pdrop", kGpt2DefaultDropout};
    f.embedding_dropout = {"embd_pdrop", kGpt2DefaultDropout};
    f.eager_softmax_in_working_dtype = true;
  }
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "vit";
    f.read_from = "models/vit/configuration_vit.py (ViTConfig), modeling_vit.py (ViTForImageClassification)";
    f.vision = true;
    f.ffn_key = "intermediate_size";
    f.norm = NORM_LAYERNORM;
    f.mlp = MlpKind::kPlain;
    f.activation_key = "hidden_act";
    f.default_activation = "gelu";
    f.qkv_bias_key = "qkv_bias";
    f.qkv_bias = true;
    f.out_bias = OutProjectionBias::kAlways;
    f.mlp_bias = true;
    f.position = POSITION_LEARNED;  // one per token of the image
    // ViTLayer's dropout after attention and after the MLP, and ViTEmbeddings', share one key.
    f.attention_dropout = {"attention_probs_dropout_prob", 0.0};
    f.residual_dropout = {"hidden_dropout_prob", 0.0};
    f.embedding_dropout = {"hidden_dropout_prob", 0.0};
  }
  return families;
}

}  // namespace

const std::vector<ModelFamily>& ModelFamilies() {
  static const std::vector<ModelFamily>* const families = new std::vector<ModelFamily>(BuildFamilies());
  return *families;
}

const ModelFamily* FindModelFamily(absl::string_view model_type) {
  for (const ModelFamily& family : ModelFamilies()) {
    if (family.model_type == model_type) return &family;
  }
  return nullptr;
}

std::string SupportedModelTypes() {
  return absl::StrJoin(ModelFamilies(), ", ",
                       [](std::string* out, const ModelFamily& f) { absl::StrAppend(out, f.model_type); });
}

std::optional<FfnType> FfnTypeFor(const ModelFamily& family, absl::string_view activation) {
  if (family.mlp == MlpKind::kGated) {
    // ACT2FN's two names for SiLU; zplan's gated MLP is SwiGLU.
    if (activation == "silu" || activation == "swish") return FFN_SWIGLU;
    return std::nullopt;
  }
  if (activation == "gelu_new") return FFN_GELU_NEW;
  if (activation == "gelu" || activation == "gelu_pytorch_tanh") return FFN_GELU;
  return std::nullopt;
}

std::string ModelledActivations(const ModelFamily& family) {
  return family.mlp == MlpKind::kGated ? "\"silu\" or \"swish\"" : "\"gelu\", \"gelu_pytorch_tanh\" or \"gelu_new\"";
}

std::string ApproximationNote(absl::string_view model_type, absl::string_view family) {
  if (model_type.empty()) {
    return absl::StrCat("a config.json without model_type planned as ", family,
                        ": an unvalidated approximation, nothing about its model was checked");
  }
  const std::string quoted = QuoteInput(model_type);
  return absl::StrCat("model_type ", quoted, " planned as ", family, ": an unvalidated approximation, nothing about ",
                      quoted, " was checked");
}

}  // namespace zplan
