// File: model_family.h
// The transformers model types zplan plans, as data: one ModelFamily per
// config.json model_type -- llama, mistral, qwen2, qwen3, granite,
// granitemoehybrid (its dense attention-only models), phi3, olmo2, olmo3,
// smollm3, glm4, gemma3_text, gemma2, gemma4_text, lfm2, qwen3_5_text, the
// mixtures of experts qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe,
// granitemoe, granitemoeshared, gpt_oss and deepseek_v3, gpt2, vit -- holding what that
// type's config class and modeling file give it: the keys its config.json
// uses and the defaults of those it may leave out, the norm and where it
// sits, the MLP, which projections have biases, qk-norm, the position
// embedding, the dropout sites, the dtype of eager attention's softmax,
// Granite's multipliers, Phi3's fused projections and sliding window, OLMo's
// layer types, SmolLM3's layers without RoPE, GLM-4's partial interleaved
// RoPE, Gemma's zero-centred norms, GeGLU, scales and softcapping, Gemma 4's
// per-layer head widths and embeddings, LFM2's
// short-conv layers, Qwen3.5's Gated DeltaNet layers and gated attention,
// GPT-OSS's attention sinks and biased experts, GraniteMoeShared's shared_mlp,
// DeepSeek-V3's latent attention, sigmoid router and dense first layers, and
// the transformers source (5.23.0, planner/version.h)
// it was read from.
// ModelSpecFromHfConfig (model_spec.h) reads every config.json through its
// model_type's entry.
//
// Any other model_type (bert, starcoder2, first-generation qwen, ...)
// is not supported: nothing here describes it. Planning it as one of these
// families anyway is an unvalidated approximation; a plan that is one says so
// in ModelSpec.unvalidated_approximation (ApproximationNote), which zplan and
// zrun print.
//
// Example:
//   const ModelFamily* qwen2 = FindModelFamily("qwen2");
//   qwen2->qkv_bias;                   // true: Qwen2Attention's q/k/v always have one
//   FindModelFamily("starcoder2");     // nullptr
//   ApproximationNote("starcoder2", "llama");
//     // model_type "starcoder2" planned as llama: an unvalidated approximation, nothing about "starcoder2" was checked
#ifndef ZPLAN_PLANNER_MODEL_FAMILY_H_
#define ZPLAN_PLANNER_MODEL_FAMILY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/model.pb.h"

namespace zplan {

// How a family's MLP is built.
enum class MlpKind {
  kGated,  // down(act(gate(x)) * up(x)): LlamaMLP and its copies in Mistral, Qwen2, Qwen3
  kPlain,  // fc2(act(fc1(x))): GPT2MLP, ViTIntermediate + ViTOutput
};

// Whether the attention output projection (o_proj, c_proj) has a bias.
enum class OutProjectionBias {
  kNever,   // bias=False whatever the config says
  kAlways,  // bias=True (GPT-2's Conv1D, ViT's o_proj)
  kAsQkv,   // the q/k/v bias's key covers it too (Llama's and Qwen3's attention_bias)
};

// A dropout site: the config key that sets its probability and the config
// class's default. An empty key: the family has no such site (p = 0).
struct DropoutSite {
  absl::string_view key;
  double default_p = 0;
};

// The modules a family's forward calls that own no parameter. DeepSpeed's
// ZeRO-3 coordinator fetches at each of them as at any module, and every
// fetch prefetches (Stage3RetentionOf, sharding.h); the containers (the
// model, each layer, its attention, MLP or conv) follow from the parameter
// names. rotary_calls is the model's: ParameterlessModulesOf sets it.
struct ParameterlessModules {
  int rotary_calls = 0;                   // the rotary embedding, after the embeddings (forward only)
  bool rotary_per_layer_type = false;     // called once per distinct layer type (Gemma 3, OLMo 3)
  bool embedding_dropout = false;         // after the embeddings (GPT-2's drop, ViT's embeddings.dropout)
  bool mlp_activation = true;             // after the MLP's first projection (LFM2 calls F.silu)
  bool attention_output_dropout = false;  // inside the attention, after its output projection (GPT-2)
  bool mlp_output_dropout = false;        // inside the MLP, after its last projection (GPT-2)
  bool half_dropouts = false;             // in the layer after each half (Phi3, ViT)
};

struct ModelFamily {
  absl::string_view model_type;  // config.json's model_type, e.g. "llama"
  absl::string_view read_from;   // the transformers files (models/<type>/...) this entry restates
  // ViTForImageClassification: an image model (VisionSpec, no vocabulary)
  // whose image and patch sizes the ViT reader takes; the others are causal LMs.
  bool vision = false;
  // GPT2Config's names (its attribute_map): n_layer, n_embd, n_head,
  // n_positions, each overridden by the modern name when both are given.
  bool gpt2_key_names = false;
  absl::string_view ffn_key;         // the FFN width: "intermediate_size", GPT-2's "n_inner"; empty: no dense MLP
  int64_t ffn_default_multiple = 0;  // > 0: absent or null means this x hidden (GPT-2: 4); 0: required
  int64_t default_head_dim = 0;      // head_dim when the config has none; 0: hidden / heads
  // The config class's sizes, for a vision-language model's text_config,
  // which transformers saves without the keys left at their defaults
  // (llava-1.5's holds vocab_size and max_position_embeddings alone); all 0:
  // such a text_config must name them.
  struct Sizes {
    int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0;
  } class_sizes;
  bool tie_word_embeddings = false;  // the config class's default
  NormType norm = NORM_TYPE_UNSPECIFIED;
  MlpKind mlp = MlpKind::kGated;
  absl::string_view activation_key;      // "hidden_act", GPT-2's "activation_function"
  absl::string_view default_activation;  // the config class's default, e.g. "silu"
  // The q/k/v bias: read from qkv_bias_key (qkv_bias when absent); an empty
  // key means the modeling file fixes it to qkv_bias.
  absl::string_view qkv_bias_key;
  bool qkv_bias = false;
  OutProjectionBias out_bias = OutProjectionBias::kNever;
  absl::string_view mlp_bias_key;  // as qkv_bias_key, for every MLP projection
  bool mlp_bias = false;
  bool qk_norm = false;  // an RMSNorm over head_dim on q and on k (Qwen3)
  PositionEmbedding position = POSITION_EMBEDDING_UNSPECIFIED;
  DropoutSite attention_dropout;  // on the attention probabilities
  DropoutSite residual_dropout;   // on each attention and MLP output before the residual add
  DropoutSite embedding_dropout;  // on the embedding output
  // Eager attention's softmax in the working dtype (GPT-2); false: in fp32,
  // cast back (softmax(..., dtype=torch.float32).to(query.dtype)).
  bool eager_softmax_in_working_dtype = false;
  // GraniteConfig's embedding_multiplier, residual_multiplier,
  // logits_scaling and attention_multiplier (each 1.0 by default), applied
  // by its modeling file whatever their values.
  bool granite_multipliers = false;
  // Phi3's fused qkv_proj and gate_up_proj (ModelSpec's fields of those names).
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // The config key of a window every layer's attention slides (Phi3's
  // sliding_window; null: none); empty: the family has none.
  absl::string_view sliding_window_key;
  // Its apply_rotary_pos_emb rotates partial_rotary_factor of each head and
  // concatenates the rest (ModelSpec.rope_concatenates, rotary_dim), read
  // from the top level or rope_parameters, default_partial_rotary_factor
  // when absent; rope_interleaved as Glm4's.
  bool partial_rotary = false;
  double default_partial_rotary_factor = 1.0;
  bool rope_interleaved = false;
  // Olmo2's block: norms after attention and MLP (NormPlacement), RMSNorm's
  // weight multiply in fp32, q_norm and k_norm over the whole projection,
  // RoPE in fp32 (ModelSpec's fields of those names).
  NormPlacement norm_placement = NORM_PLACEMENT_PRE;
  bool norm_weight_in_fp32 = false;
  bool qk_norm_over_projection = false;
  bool rope_in_fp32 = false;
  // > 0: the config has layer_types (ModelSpec.layer_types), by default
  // "full_attention" every this many layers and "sliding_attention" between
  // (Olmo3Config.__post_init__: (i + 1) % 4 != 0 slides; "linear_attention"
  // with delta_rule_layers), with sliding_window_key's window defaulting to
  // default_sliding_window.
  int64_t full_attention_interval = 0;
  int64_t default_sliding_window = 0;
  // > 0: the config has no_rope_layers (ModelSpec.rope_layers), by default
  // RoPE on every layer but each this-many-th (SmolLM3Config.__post_init__).
  int64_t no_rope_layer_interval = 0;
  // A legacy config key that sets full_attention_interval when layer_types
  // is absent (Gemma3TextConfig.__post_init__'s sliding_window_pattern); empty: none.
  absl::string_view full_attention_interval_key;
  // Gemma's RMSNorm: normalized x (1 + weight) in fp32 (ModelSpec.norm_unit_offset).
  bool norm_unit_offset = false;
  // Gemma's embedding times sqrt(hidden_size) (an embedding_multiplier) and
  // attention scale attention_scalar_key^-0.5 (an attention_multiplier),
  // default_attention_scalar when absent; with an empty key that one
  // (Gemma4TextAttention's scaling 1.0: 1^-0.5), or without one head_dim^-0.5.
  bool embedding_scaled_by_sqrt_hidden = false;
  absl::string_view attention_scalar_key;
  double default_attention_scalar = 0;
  // Gemma 2's softcapping (ModelSpec's fields of those names): the config
  // keys and their defaults (0: null, none); an empty key, none.
  absl::string_view attn_softcap_key;
  double default_attn_softcap = 0;
  absl::string_view final_softcap_key;
  double default_final_softcap = 0;
  // transformers' attention implementations for the class: false where
  // _supports_sdpa is False (Gemma2: eager unless asked otherwise, and an
  // explicit "sdpa" raises).
  bool supports_sdpa = true;
  // Lfm2Config's layers: layer_types of "full_attention" and "conv"
  // (LAYER_CONV), by default full_attn_idxs' layers attend and the others
  // convolve (every layer attends when neither is given), with conv_L_cache
  // and conv_bias; and Lfm2MLP's width, adjusted from intermediate_size (or
  // block_ff_dim) by block_auto_adjust_ff_dim, block_ffn_dim_multiplier and
  // block_multiple_of.
  bool short_conv_layers = false;
  // Qwen3_5TextConfig's layers: "linear_attention" (LAYER_LINEAR_ATTENTION)
  // between the full_attention_interval's full ones; the Gated DeltaNet's
  // linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
  // linear_value_head_dim and linear_conv_kernel_dim; and the full layers'
  // gated attention (ModelSpec.attention_output_gate).
  bool delta_rule_layers = false;
  // Qwen3.5's RoPE tables, one per sequence (ModelSpec.rope_tables_per_sequence).
  bool rope_tables_per_sequence = false;
  // Gemma4TextConfig's layers: per-layer head widths (per_layer_config, or
  // global_head_dim on the full layers: ModelSpec.layer_head_dims), the
  // per-layer embeddings (hidden_size_per_layer_input,
  // vocab_size_per_layer_input), the last layer forced to full attention,
  // Gemma4RMSNorm (norm_pow_mean_square) and v_norm.
  bool gemma4_layers = false;
  // GraniteMoeHybridConfig's layers, of which zplan plans the attention-only,
  // dense ones: layer_types all "attention" (absent: every layer a Mamba-2
  // layer), position_embedding_type "rope" (null: no positions at all) and
  // num_local_experts 0 (absent: 8); anything else is refused by its key.
  bool granite_hybrid_layers = false;
  // A mixture-of-experts family's config keys (MoeSpec) and its config
  // class's defaults; experts_key empty: a dense family.
  struct MoeKeys {
    absl::string_view experts_key;          // "num_experts"; Mixtral's "num_local_experts"
    int64_t default_experts = 0;
    int64_t default_experts_per_token = 0;  // num_experts_per_tok
    absl::string_view expert_ffn_key;       // "moe_intermediate_size"; Mixtral's "intermediate_size"
    int64_t default_expert_ffn = 0;
    // "shared_expert_intermediate_size" (Qwen2-MoE), gated by
    // shared_expert_gate; empty: no shared expert.
    absl::string_view shared_expert_ffn_key;
    int64_t default_shared_expert_ffn = 0;
    // decoder_sparse_step and mlp_only_layers pick the dense layers
    // ((i + 1) % step != 0 or i listed); false: every layer is MoE.
    bool sparse_step_keys = false;
    bool router_before_experts = false;
    bool routing_weights_fp32 = false;
    // Whether the top-k weights are renormalized: always (Mixtral), or as
    // norm_topk_prob says (false when absent).
    bool renormalizes_always = false;
    // MoeSpec.deepspeed_leaf: the block is one of DeepSpeed's default leaf classes.
    bool deepspeed_leaf = true;
    // router_aux_loss_coef's default (MoeSpec.router_aux_loss_coef), used
    // where output_router_logits is true: 0.001 in every config class here.
    double default_router_aux_loss_coef = 0.001;
    bool top_k_then_softmax = false;  // MoeSpec.router_top_k_then_softmax (GraniteMoe)
    // GptOssMLP: its router's bias and top k in the working dtype, and
    // GptOssExperts' layout, biases and clamped SwiGLU (MoeSpec.gpt_oss_experts,
    // swiglu_limit and swiglu_alpha, read from the config's keys of those
    // names with GptOssConfig's defaults).
    bool gpt_oss = false;
    // GraniteMoeShared's "shared_intermediate_size": an ungated shared_mlp
    // after the experts (MoeSpec.shared_expert_fused_after_experts).
    bool shared_mlp_after_experts = false;
    // DeepseekV3Config's "n_shared_experts": shared_experts, a gated MLP
    // this many experts wide, after the experts
    // (MoeSpec.shared_expert_after_experts); empty: none.
    absl::string_view shared_experts_count_key;
    int64_t default_shared_experts = 0;
    // "first_k_dense_replace": the first this many layers keep a dense MLP; empty: none.
    absl::string_view first_dense_layers_key;
    int64_t default_first_dense_layers = 0;
    // DeepseekV3TopkRouter (MoeSpec.router_sigmoid_grouped), its n_group
    // and topk_group defaults.
    bool sigmoid_grouped_router = false;
    int64_t default_router_groups = 0, default_router_top_groups = 0;
    double default_routed_scaling_factor = 1.0;
    // norm_topk_prob's default where the config leaves it out.
    bool default_norm_topk_prob = false;
  } moe;
  // DeepseekV3Attention's latent attention (ModelSpec.latent_attention):
  // the config class's defaults of q_lora_rank (null: 0, one q_proj),
  // kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim, and
  // rope_interleave's; kv_lora_rank 0: the family has none.
  struct LatentDefaults {
    int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
    bool rope_interleave = false;
  } latent_attention;
  // GptOssAttention's sinks and GptOss's RoPE over half the head
  // (ModelSpec.attention_sinks, rope_half_split).
  bool attention_sinks = false;
  bool rope_half_split = false;
  // Config keys whose value, unless absent, null or false, builds what zplan
  // does not model, refused by name (SmolLM3's use_sliding_window, Gemma 3's
  // final_logit_softcapping).
  std::vector<absl::string_view> unmodelled_keys;
  ParameterlessModules parameterless;
};

// Every family, in the order above.
const std::vector<ModelFamily>& ModelFamilies();

// The entry for a model_type; nullptr when zplan has none.
const ModelFamily* FindModelFamily(absl::string_view model_type);

// "llama, mistral, qwen2, qwen3, granite, granitemoehybrid, phi3, olmo2, olmo3, smollm3, glm4, gemma3_text, gemma2,
// gemma4_text, lfm2, qwen3_5_text, qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3, gpt2, vit".
std::string SupportedModelTypes();

// The families with experts (MoeKeys), e.g. "qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3".
std::string MoeModelTypes();

// The FFN a family builds with `activation` (an ACT2FN name): kGated with
// "silu" or "swish" is FFN_SWIGLU, with "gelu_pytorch_tanh" FFN_GEGLU; kPlain
// with "gelu_new" FFN_GELU_NEW (its tanh formula in separate ops), "gelu" or
// "gelu_pytorch_tanh" FFN_GELU (one op that keeps its input). nullopt for an
// activation zplan does not model.
std::optional<FfnType> FfnTypeFor(const ModelFamily& family, absl::string_view activation);
// The activations FfnTypeFor accepts for the family, quoted, for messages.
std::string ModelledActivations(const ModelFamily& family);

// The family of the spec's language model: its model_type's, or a
// vision-language model's text family (VisionLanguageSpec.text_model_type);
// nullptr when zplan has none.
const ModelFamily* LanguageModelFamilyOf(const ModelSpec& spec);

// The model's parameterless module calls: its family's (Llama's for a
// model_type without one), with rotary_calls counted for its layers.
ParameterlessModules ParameterlessModulesOf(const ModelSpec& spec);

// The line a plan of `model_type` planned as `family` records in
// ModelSpec.unvalidated_approximation, e.g. `model_type "gemma2" planned as
// llama: an unvalidated approximation, nothing about "gemma2" was checked`
// (an empty model_type: a config.json without one).
std::string ApproximationNote(absl::string_view model_type, absl::string_view family);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_MODEL_FAMILY_H_
