#include "planner/model_family.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/json.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// Llama-family configs have one dropout site, attention_dropout (0.0); their
// blocks and embeddings have none.
constexpr DropoutSite kAttentionDropoutOnly = {"attention_dropout", 0.0};
// GPT2Config defaults attn_pdrop, resid_pdrop and embd_pdrop to 0.1.
constexpr double kGpt2DefaultDropout = 0.1;
// GPT2Config's n_inner: None means 4 * n_embd (GPT2Block).
constexpr int64_t kGpt2FfnMultiple = 4;
// MistralConfig's sliding_window (Mistral 7B v0.1's; v0.3 sets null).
constexpr int64_t kMistralDefaultSlidingWindow = 4096;
// Qwen3Config's head_dim default (its heads are wider than hidden / heads).
constexpr int64_t kQwen3DefaultHeadDim = 128;
// Olmo3Config: sliding_window 4096; layer_types "full_attention" where (i + 1) % 4 == 0.
constexpr int64_t kOlmo3DefaultSlidingWindow = 4096;
constexpr int64_t kOlmo3FullAttentionInterval = 4;
// Glm4Config.__post_init__: partial_rotary_factor 0.5 when the config has none.
constexpr double kGlm4PartialRotaryFactor = 0.5;
// Glm4Config's head_dim default.
constexpr int64_t kGlm4DefaultHeadDim = 128;
// Gemma3TextConfig: head_dim 256, query_pre_attn_scalar 256, sliding_window
// 4096, layer_types "full_attention" where (i + 1) % sliding_window_pattern
// == 0, the pattern 6 when the config has none.
constexpr int64_t kGemma3DefaultHeadDim = 256;
constexpr double kGemma3QueryPreAttnScalar = 256;
constexpr int64_t kGemma3DefaultSlidingWindow = 4096;
constexpr int64_t kGemma3SlidingWindowPattern = 6;
// Gemma2Config: layer_types "full_attention" where (i + 1) % 2 == 0, and its softcaps.
constexpr int64_t kGemma2SlidingPattern = 2;
constexpr double kGemma2AttnLogitSoftcap = 50.0;
constexpr double kGemma2FinalLogitSoftcap = 30.0;
// Gemma4TextConfig's sliding_window; Gemma4TextAttention's scaling 1.0, as a scalar^-0.5.
constexpr int64_t kGemma4DefaultSlidingWindow = 512;
constexpr double kGemma4AttentionScalar = 1.0;
// Where BuildFamilies puts qwen3 (after llama, mistral, qwen2).
constexpr size_t kQwen3Entry = 3;
// Qwen3_5TextConfig's head_dim default, and __post_init__'s partial_rotary_factor.
constexpr int64_t kQwen3_5DefaultHeadDim = 256;
constexpr double kQwen3_5PartialRotaryFactor = 0.25;
// Qwen3_5TextConfig.__post_init__: full_attention_interval 4, linear attention between.
constexpr int64_t kQwen3_5FullAttentionInterval = 4;
// The MoE configs' defaults: Qwen3MoeConfig (num_experts 128,
// num_experts_per_tok 8, moe_intermediate_size 768), MixtralConfig
// (num_local_experts 8, num_experts_per_tok 2; its experts are
// intermediate_size wide), Qwen2MoeConfig (num_experts 60, num_experts_per_tok
// 4, moe_intermediate_size 1408, shared_expert_intermediate_size 5632).
constexpr int64_t kQwen3MoeExperts = 128, kQwen3MoeExpertsPerToken = 8, kQwen3MoeExpertFfn = 768;
constexpr int64_t kMixtralExperts = 8, kMixtralExpertsPerToken = 2, kMixtralIntermediate = 14336;
constexpr int64_t kQwen2MoeExperts = 60, kQwen2MoeExpertsPerToken = 4, kQwen2MoeExpertFfn = 1408,
                  kQwen2MoeSharedExpertFfn = 5632;
// Qwen3_5MoeTextConfig: num_experts 256, num_experts_per_tok 8,
// moe_intermediate_size 512, shared_expert_intermediate_size 512.
constexpr int64_t kQwen3_5MoeExperts = 256, kQwen3_5MoeExpertsPerToken = 8, kQwen3_5MoeExpertFfn = 512,
                  kQwen3_5MoeSharedExpertFfn = 512;
// GraniteMoeConfig: num_local_experts 8, num_experts_per_tok 2, its experts intermediate_size (11008) wide.
constexpr int64_t kGraniteMoeExperts = 8, kGraniteMoeExpertsPerToken = 2, kGraniteMoeIntermediate = 11008;
// GptOssConfig: num_local_experts 128, num_experts_per_tok 4, its experts
// intermediate_size (2880) wide, head_dim 64, sliding_window 128 on the
// layers where (i + 1) % 2 != 0.
constexpr int64_t kGptOssExperts = 128, kGptOssExpertsPerToken = 4, kGptOssIntermediate = 2880;
constexpr int64_t kGptOssDefaultHeadDim = 64, kGptOssDefaultSlidingWindow = 128, kGptOssFullAttentionInterval = 2;
// DeepseekV3Config: n_routed_experts 256, num_experts_per_tok 8,
// moe_intermediate_size 2048, n_shared_experts 1, first_k_dense_replace 3,
// n_group 8, topk_group 4, routed_scaling_factor 2.5; q_lora_rank 1536, kv_lora_rank 512,
// qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128.
constexpr int64_t kDeepseekV3Experts = 256, kDeepseekV3ExpertsPerToken = 8, kDeepseekV3ExpertFfn = 2048,
                  kDeepseekV3SharedExperts = 1, kDeepseekV3FirstDenseLayers = 3, kDeepseekV3Groups = 8,
                  kDeepseekV3TopGroups = 4;
constexpr int64_t kDeepseekV3QLoraRank = 1536, kDeepseekV3KvLoraRank = 512, kDeepseekV3QkNopeHeadDim = 128,
                  kDeepseekV3QkRopeHeadDim = 64, kDeepseekV3VHeadDim = 128;
constexpr double kDeepseekV3RoutedScalingFactor = 2.5;
// Where BuildFamilies puts mistral, qwen2 and granite.
constexpr size_t kMistralEntry = 1, kQwen2Entry = 2, kGraniteEntry = 4;
// SmolLM3Config's no_rope_layer_interval: layer i uses RoPE unless (i + 1) % 4 == 0.
constexpr int64_t kSmolLm3NoRopeLayerInterval = 4;

std::vector<ModelFamily> BuildFamilies() {
  std::vector<ModelFamily> families;
  {
    ModelFamily& f = families.emplace_back();
    f.model_type = "llama";
    f.read_from = "models/llama/configuration_llama.py (LlamaConfig), modeling_llama.py (LlamaMLP, LlamaAttention)";
    f.class_sizes = {.vocab = 32000, .hidden = 4096, .intermediate = 11008, .layers = 32, .heads = 32};
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
    f.read_from = "models/mistral/configuration_mistral.py (MistralConfig: sliding_window 4096), modeling_mistral.py "
                  "(MistralMLP, MistralAttention: no bias anywhere, sliding_window on every layer)";
    f.ffn_key = "intermediate_size";
    f.norm = NORM_RMSNORM;
    f.mlp = MlpKind::kGated;
    f.activation_key = "hidden_act";
    f.default_activation = "silu";
    f.position = POSITION_ROPE;
    f.attention_dropout = kAttentionDropoutOnly;
    f.sliding_window_key = "sliding_window";
    f.default_sliding_window = kMistralDefaultSlidingWindow;
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
    // Qwen2Config's sliding layers from max_window_layers on.
    f.unmodelled_keys = {"use_sliding_window"};
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
    f.unmodelled_keys = {"use_sliding_window"};  // as Qwen2's
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
    // Granite 4.0's dense language models: Granite's blocks and multipliers
    // with the MLP's two input projections fused into one.
    ModelFamily f = families.back();
    f.model_type = "granitemoehybrid";
    f.read_from = "models/granitemoehybrid/configuration_granitemoehybrid.py (GraniteMoeHybridConfig: layer_types, "
                  "position_embedding_type, num_local_experts 8, shared_intermediate_size), "
                  "modeling_granitemoehybrid.py (GraniteMoeHybridDecoderLayer without experts: shared_mlp only; "
                  "GraniteMoeHybridMLP: input_linear [h -> 2f] chunked, act(first) x second, output_linear, no "
                  "biases; GraniteMoeHybridAttention as Granite's)";
    f.ffn_key = "shared_intermediate_size";
    f.mlp_bias_key = "";
    f.fused_gate_up = true;
    f.granite_hybrid_layers = true;
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
    f.default_sliding_window = 0;  // Phi3Config's sliding_window: None
    f.partial_rotary = true;
    f.parameterless.half_dropouts = true;  // resid_attn_dropout, resid_mlp_dropout
    families.push_back(f);
  }
  {
    // Llama's projections and MLP (attention_bias on all four, no mlp_bias),
    // norms after each half instead of before, and fp32 where Olmo2's code
    // computes in it.
    ModelFamily f = families.front();
    f.model_type = "olmo2";
    f.read_from = "models/olmo2/configuration_olmo2.py (Olmo2Config), modeling_olmo2.py (Olmo2DecoderLayer: "
                  "post_attention_layernorm and post_feedforward_layernorm after each half; Olmo2RMSNorm: "
                  "(weight * x).to(input_dtype); Olmo2Attention: q_norm and k_norm over the whole projection; "
                  "Olmo2RotaryEmbedding: fp32 cos and sin)";
    f.mlp_bias_key = "";
    f.norm_placement = NORM_PLACEMENT_POST;
    f.norm_weight_in_fp32 = true;
    f.qk_norm = true;
    f.qk_norm_over_projection = true;
    f.rope_in_fp32 = true;
    families.push_back(f);
    // Olmo2's blocks with layer types: three sliding-window layers to one full.
    f.model_type = "olmo3";
    f.read_from = "models/olmo3/configuration_olmo3.py (Olmo3Config: layer_types, sliding_window 4096), "
                  "modeling_olmo3.py (Olmo3Attention: sliding_window on sliding layers; Olmo3Model: a RoPE table "
                  "per layer type, the full and the sliding causal masks)";
    f.sliding_window_key = "sliding_window";
    f.full_attention_interval = kOlmo3FullAttentionInterval;
    f.default_sliding_window = kOlmo3DefaultSlidingWindow;
    f.parameterless.rotary_per_layer_type = true;
    families.push_back(f);
  }
  {
    // Llama's blocks (attention_bias on all four projections, mlp_bias),
    // tied by default, with RoPE left out on every fourth layer.
    ModelFamily f = families.front();
    f.model_type = "smollm3";
    f.read_from = "models/smollm3/configuration_smollm3.py (SmolLM3Config: tie_word_embeddings true, "
                  "no_rope_layers, use_sliding_window), modeling_smollm3.py (SmolLM3Attention: RoPE only where "
                  "use_rope; SmolLM3Model: one RoPE table, the sliding mask only with sliding layers)";
    f.tie_word_embeddings = true;
    f.no_rope_layer_interval = kSmolLm3NoRopeLayerInterval;
    f.unmodelled_keys = {"use_sliding_window"};
    families.push_back(f);
  }
  {
    // Llama's attention with q/k/v biases (attention_bias, default true)
    // and none on o_proj, Phi3's gate_up_proj, a norm before and after each
    // half, and RoPE over half of each head, interleaved.
    ModelFamily f = families.front();
    f.model_type = "glm4";
    f.read_from = "models/glm4/configuration_glm4.py (Glm4Config: attention_bias true, partial_rotary_factor 0.5), "
                  "modeling_glm4.py (Glm4DecoderLayer: input_layernorm, post_self_attn_layernorm, "
                  "post_attention_layernorm, post_mlp_layernorm; Glm4Attention: o_proj without bias; Glm4MLP: "
                  "gate_up_proj; apply_rotary_pos_emb: repeat_interleave, rotate_half on pairs, torch.cat)";
    f.default_head_dim = kGlm4DefaultHeadDim;
    f.qkv_bias = true;
    f.out_bias = OutProjectionBias::kNever;
    f.mlp_bias_key = "";
    f.fused_gate_up = true;
    f.norm_placement = NORM_PLACEMENT_PRE_AND_POST;
    f.partial_rotary = true;
    f.default_partial_rotary_factor = kGlm4PartialRotaryFactor;
    f.rope_interleaved = true;
    families.push_back(f);
  }
  {
    // Llama's projections (attention_bias on all four, no MLP bias), GLM-4's
    // four norms, each zero-centred and in fp32, Qwen3's q/k norms, OLMo 3's
    // layer types, a GELU-gated MLP, a scaled embedding, tied by default.
    ModelFamily f = families.front();
    f.model_type = "gemma3_text";
    f.read_from = "models/gemma3/configuration_gemma3.py (Gemma3TextConfig: hidden_activation, head_dim 256, "
                  "query_pre_attn_scalar, sliding_window 4096, sliding_window_pattern 6, tie_word_embeddings true), "
                  "modeling_gemma3.py (Gemma3RMSNorm: x (1 + weight.float()) in fp32; Gemma3DecoderLayer: "
                  "input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm; "
                  "Gemma3Attention: q_norm and k_norm per head, scaling query_pre_attn_scalar**-0.5; Gemma3MLP; "
                  "Gemma3TextScaledWordEmbedding: x embed_scale, sqrt(hidden_size))";
    f.default_head_dim = kGemma3DefaultHeadDim;
    f.tie_word_embeddings = true;
    f.activation_key = "hidden_activation";
    f.default_activation = "gelu_pytorch_tanh";
    f.mlp_bias_key = "";
    f.qk_norm = true;
    f.norm_placement = NORM_PLACEMENT_PRE_AND_POST;
    f.norm_weight_in_fp32 = true;
    f.norm_unit_offset = true;
    f.sliding_window_key = "sliding_window";
    f.default_sliding_window = kGemma3DefaultSlidingWindow;
    f.full_attention_interval = kGemma3SlidingWindowPattern;
    f.full_attention_interval_key = "sliding_window_pattern";
    f.embedding_scaled_by_sqrt_hidden = true;
    f.attention_scalar_key = "query_pre_attn_scalar";
    f.default_attention_scalar = kGemma3QueryPreAttnScalar;
    // Gemma3ForCausalLM applies final_logit_softcapping (null by default);
    // Gemma3Attention never passes attn_logit_softcapping on. Attention
    // without the causal mask is not modelled.
    f.final_softcap_key = "final_logit_softcapping";
    f.unmodelled_keys = {"use_bidirectional_attention"};
    f.parameterless.rotary_per_layer_type = true;  // Gemma3TextModel.forward: set(layer_types)
    families.push_back(f);
    // Gemma 3's blocks without q/k norms, one sliding layer to one full, eager
    // attention with its scores softcapped, and the logits softcapped.
    f.model_type = "gemma2";
    f.read_from = "models/gemma2/configuration_gemma2.py (Gemma2Config: layer_types sliding where (i + 1) % 2, "
                  "attn_logit_softcapping 50, final_logit_softcapping 30), modeling_gemma2.py (Gemma2RMSNorm, "
                  "Gemma2DecoderLayer's four norms, eager_attention_forward: scores / softcap, tanh, x softcap; "
                  "Gemma2PreTrainedModel: _supports_sdpa = False; Gemma2ForCausalLM: logits / softcap, tanh, "
                  "x softcap)";
    f.qk_norm = false;
    f.full_attention_interval = kGemma2SlidingPattern;
    f.full_attention_interval_key = "";
    f.attn_softcap_key = "attn_logit_softcapping";
    f.default_attn_softcap = kGemma2AttnLogitSoftcap;
    f.default_final_softcap = kGemma2FinalLogitSoftcap;
    f.supports_sdpa = false;
    f.parameterless.rotary_per_layer_type = false;
    families.push_back(f);
    // Gemma 3's blocks with Gemma4RMSNorm (weight init ones, no 1 +), a
    // weightless v_norm, scale 1, wider heads on the full layers and the
    // per-layer embeddings' third half.
    f = families[families.size() - 2];
    f.model_type = "gemma4_text";
    f.read_from = "models/gemma4/configuration_gemma4.py (Gemma4TextConfig: sliding_window 512, layer_types 5 sliding "
                  "to 1 full with the last full, global_head_dim 512 in per_layer_config, "
                  "hidden_size_per_layer_input 256, vocab_size_per_layer_input 262144), modeling_gemma4.py "
                  "(Gemma4RMSNorm: x * torch.pow(mean(x^2) + eps, -0.5) * weight.float(); Gemma4TextAttention: q_norm, "
                  "k_norm, v_norm (no weight), scaling 1.0; Gemma4TextDecoderLayer: four norms, the per-layer input "
                  "gate, projection and post_per_layer_input_norm, layer_scalar; Gemma4TextModel: "
                  "embed_tokens_per_layer, per_layer_model_projection, per_layer_projection_norm)";
    f.norm_unit_offset = false;
    f.attention_scalar_key = "";
    f.default_attention_scalar = kGemma4AttentionScalar;
    f.default_sliding_window = kGemma4DefaultSlidingWindow;
    f.full_attention_interval_key = "";
    f.gemma4_layers = true;
    // Not modelled: bidirectional attention, keys as values, layers reusing
    // another's keys and values, the mixture-of-experts block.
    f.unmodelled_keys = {"use_bidirectional_attention", "attention_k_eq_v", "num_kv_shared_layers",
                         "enable_moe_block"};
    families.push_back(f);
  }
  {
    // Qwen3's attention layers (q_layernorm and k_layernorm per head, no
    // biases) beside gated short-conv layers, SwiGLU, tied embeddings.
    ModelFamily& f = families.emplace_back();
    f.model_type = "lfm2";
    f.read_from = "models/lfm2/configuration_lfm2.py (Lfm2Config: layer_types from full_attn_idxs, conv_L_cache, "
                  "conv_bias, block_ff_dim, tie_embedding), modeling_lfm2.py (Lfm2MLP: block_auto_adjust_ff_dim; "
                  "Lfm2ShortConv with causal_conv1d_fn (its fallback, or causal-conv1d's); Lfm2Attention: "
                  "q_layernorm, k_layernorm, no biases, no dropout; Lfm2DecoderLayer)";
    f.ffn_key = "intermediate_size";
    f.tie_word_embeddings = true;
    f.norm = NORM_RMSNORM;
    f.mlp = MlpKind::kGated;
    f.default_activation = "silu";  // Lfm2MLP calls F.silu: no activation key
    f.qk_norm = true;
    f.position = POSITION_ROPE;
    f.short_conv_layers = true;
    f.parameterless.mlp_activation = false;  // Lfm2MLP: F.silu
  }
  {
    // Qwen3's attention (per-head q/k norms, attention_bias on all four
    // projections) and MLP, with linear attention layers between the full ones.
    ModelFamily f = families[kQwen3Entry];
    ZPLAN_CHECK(f.model_type == "qwen3");
    f.model_type = "qwen3_5_text";
    f.read_from = "models/qwen3_5/configuration_qwen3_5.py (Qwen3_5TextConfig: head_dim 256, partial_rotary_factor "
                  "0.25, layer_types from full_attention_interval 4, linear_* widths), modeling_qwen3_5.py "
                  "(Qwen3_5RMSNorm: x (1 + weight.float()) in fp32; Qwen3_5Attention: q_proj twice as wide, "
                  "q_norm and k_norm per head, attn_output * sigmoid(gate); Qwen3_5GatedDeltaNet with "
                  "causal_conv1d_fn and torch_chunk_gated_delta_rule (their fallbacks, or causal-conv1d's and fla's), "
                  "Qwen3_5RMSNormGated; "
                  "Qwen3_5MLP)";
    f.default_head_dim = kQwen3_5DefaultHeadDim;
    f.unmodelled_keys.clear();  // Qwen3_5TextConfig has no use_sliding_window
    f.partial_rotary = true;
    f.default_partial_rotary_factor = kQwen3_5PartialRotaryFactor;
    f.norm_weight_in_fp32 = true;
    f.norm_unit_offset = true;
    f.full_attention_interval = kQwen3_5FullAttentionInterval;
    f.full_attention_interval_key = "full_attention_interval";
    f.delta_rule_layers = true;
    f.rope_tables_per_sequence = true;  // Qwen3_5TextModel.forward: position_ids expanded to the batch
    families.push_back(f);
    // Its layers with Qwen2-MoE's block in every one: no dense MLP, so no
    // intermediate_size. DeepSpeed 0.19.8's default leaf classes
    // (runtime/zero/leaf_module_config.py, DEFAULT_LEAF_MODULE_CLASSES) do not
    // name Qwen3_5MoeSparseMoeBlock: at ZeRO-3 its experts, router and shared
    // expert are fetched module by module, as in any dense block.
    f.model_type = "qwen3_5_moe_text";
    f.read_from = "models/qwen3_5_moe/configuration_qwen3_5_moe.py (Qwen3_5MoeTextConfig: no intermediate_size), "
                  "modeling_qwen3_5_moe.py (Qwen3_5MoeGatedDeltaNet and Qwen3_5MoeAttention as Qwen3.5's; "
                  "Qwen3_5MoeSparseMoeBlock: shared_expert, gate, experts, shared_expert_gate; "
                  "Qwen3_5MoeTopKRouter: fp32 softmax, top-k always renormalized, cast back); integrations/moe.py";
    f.ffn_key = "";
    f.moe = {"num_experts", kQwen3_5MoeExperts, kQwen3_5MoeExpertsPerToken, "moe_intermediate_size",
             kQwen3_5MoeExpertFfn, "shared_expert_intermediate_size", kQwen3_5MoeSharedExpertFfn,
             /*sparse_step_keys=*/false, /*router_before_experts=*/true, /*routing_weights_fp32=*/false,
             /*renormalizes_always=*/true, /*deepspeed_leaf=*/false};
    f.unmodelled_keys.clear();
    families.push_back(f);
  }
  // The mixtures of experts: their dense models' attention, each MLP a
  // *SparseMoeBlock (or, where the config says, the dense one).
  {
    ModelFamily f = families[kQwen3Entry];
    ZPLAN_CHECK(f.model_type == "qwen3");
    f.model_type = "qwen3_moe";
    f.read_from = "models/qwen3_moe/configuration_qwen3_moe.py (Qwen3MoeConfig), modeling_qwen3_moe.py "
                  "(Qwen3MoeAttention as Qwen3's; Qwen3MoeSparseMoeBlock: experts, then gate; "
                  "Qwen3MoeTopKRouter: fp32 softmax, top-k weights cast back; Qwen3MoeDecoderLayer: dense "
                  "Qwen3MoeMLP on mlp_only_layers and off decoder_sparse_step); integrations/moe.py";
    f.default_head_dim = 0;  // Qwen3MoeAttention: hidden / heads when the config has none
    f.moe = {"num_experts", kQwen3MoeExperts, kQwen3MoeExpertsPerToken, "moe_intermediate_size", kQwen3MoeExpertFfn,
             "", 0, /*sparse_step_keys=*/true, /*router_before_experts=*/false, /*routing_weights_fp32=*/false};
    f.unmodelled_keys = {"use_sliding_window"};
    families.push_back(f);
  }
  {
    ModelFamily f = families[kMistralEntry];
    ZPLAN_CHECK(f.model_type == "mistral");
    f.model_type = "mixtral";
    f.read_from = "models/mixtral/configuration_mixtral.py (MixtralConfig: sliding_window None), "
                  "modeling_mixtral.py (MixtralAttention as Mistral's; MixtralSparseMoeBlock: gate, then experts; "
                  "MixtralTopKRouter: fp32 softmax and top-k weights); integrations/moe.py";
    f.default_sliding_window = 0;
    f.moe = {"num_local_experts", kMixtralExperts, kMixtralExpertsPerToken, "intermediate_size", kMixtralIntermediate,
             "", 0, /*sparse_step_keys=*/false, /*router_before_experts=*/true, /*routing_weights_fp32=*/true,
             /*renormalizes_always=*/true};
    // router_jitter_noise > 0 multiplies the input by a noise tensor in training.
    f.unmodelled_keys = {"router_jitter_noise"};
    families.push_back(f);
  }
  {
    ModelFamily f = families[kQwen2Entry];
    ZPLAN_CHECK(f.model_type == "qwen2");
    f.model_type = "qwen2_moe";
    f.read_from = "models/qwen2_moe/configuration_qwen2_moe.py (Qwen2MoeConfig), modeling_qwen2_moe.py "
                  "(Qwen2MoeAttention: qkv_bias; Qwen2MoeSparseMoeBlock: gate, experts, shared_expert, "
                  "shared_expert_gate); integrations/moe.py";
    f.qkv_bias_key = "qkv_bias";
    f.moe = {"num_experts", kQwen2MoeExperts, kQwen2MoeExpertsPerToken, "moe_intermediate_size",
             kQwen2MoeExpertFfn, "shared_expert_intermediate_size", kQwen2MoeSharedExpertFfn,
             /*sparse_step_keys=*/true, /*router_before_experts=*/true, /*routing_weights_fp32=*/false};
    f.unmodelled_keys = {"use_sliding_window"};
    families.push_back(f);
  }
  {
    // Granite's blocks and multipliers with Mixtral's experts in every
    // layer; DeepSpeed's default leaf classes do not name GraniteMoeMoE.
    ModelFamily f = families[kGraniteEntry];
    ZPLAN_CHECK(f.model_type == "granite");
    f.model_type = "granitemoe";
    f.read_from = "models/granitemoe/configuration_granitemoe.py (GraniteMoeConfig), modeling_granitemoe.py "
                  "(GraniteMoeAttention as Granite's; GraniteMoeMoE: router, then experts; GraniteMoeTopKRouter: "
                  "F.linear(...).float(), topk of the logits, softmax over the k, type_as the input; "
                  "GraniteMoeDecoderLayer: residual + output x residual_multiplier); integrations/moe.py";
    f.ffn_key = "";
    f.moe = {"num_local_experts", kGraniteMoeExperts, kGraniteMoeExpertsPerToken, "intermediate_size",
             kGraniteMoeIntermediate, "", 0, /*sparse_step_keys=*/false, /*router_before_experts=*/true,
             /*routing_weights_fp32=*/false, /*renormalizes_always=*/false, /*deepspeed_leaf=*/false};
    f.moe.top_k_then_softmax = true;
    families.push_back(f);
    // GraniteMoe's layers with a shared_mlp beside the experts where
    // shared_intermediate_size > 0 (0 by default: GraniteMoe's layers).
    f.model_type = "granitemoeshared";
    f.read_from = "models/granitemoeshared/configuration_granitemoeshared.py (GraniteMoeSharedConfig: "
                  "GraniteMoeConfig's keys, shared_intermediate_size 0), modeling_granitemoeshared.py "
                  "(GraniteMoeSharedDecoderLayer: block_sparse_moe(x) + shared_mlp(x); GraniteMoeSharedMLP: "
                  "input_linear [h -> 2 x shared_intermediate_size] chunked, act(first) x second, output_linear, "
                  "no biases); integrations/moe.py";
    f.moe.shared_expert_ffn_key = "shared_intermediate_size";
    f.moe.default_shared_expert_ffn = 0;
    f.moe.shared_mlp_after_experts = true;
    families.push_back(f);
  }
  {
    // Llama's projections, all four with attention_bias (default true),
    // RMSNorm's weight multiply in fp32, one sliding layer to one full, eager
    // attention with a sink per head, RoPE over half the head and GptOssMLP
    // in every layer. DeepSpeed's default leaf classes do not name GptOssMLP.
    ModelFamily f = families.front();
    ZPLAN_CHECK(f.model_type == "llama");
    f.model_type = "gpt_oss";
    f.read_from = "models/gpt_oss/configuration_gpt_oss.py (GptOssConfig: attention_bias true, head_dim 64, "
                  "sliding_window 128, layer_types sliding where (i + 1) % 2, swiglu_alpha 1.702, swiglu_limit 7.0), "
                  "modeling_gpt_oss.py (GptOssRMSNorm: (weight * x).to(input_dtype); GptOssAttention: sinks, "
                  "eager_attention_forward: torch.cat of the sinks, the max subtracted, softmax in the logits' dtype; "
                  "_apply_rotary_emb: halves rotated and joined by torch.cat; GptOssPreTrainedModel: _supports_sdpa "
                  "= False; GptOssTopKRouter: F.linear with bias, topk of the logits, softmax over the k; "
                  "GptOssExperts: [E, h, 2I] gate_up_proj with biases, _apply_gate); integrations/moe.py "
                  "(use_experts_implementation(is_transposed=True, has_bias=True))";
    f.ffn_key = "";
    f.default_head_dim = kGptOssDefaultHeadDim;
    f.qkv_bias = true;
    f.mlp_bias_key = "";
    f.norm_weight_in_fp32 = true;
    f.sliding_window_key = "sliding_window";
    f.default_sliding_window = kGptOssDefaultSlidingWindow;
    f.full_attention_interval = kGptOssFullAttentionInterval;
    f.supports_sdpa = false;
    f.eager_softmax_in_working_dtype = true;
    f.attention_sinks = true;
    f.rope_half_split = true;
    f.moe = {"num_local_experts", kGptOssExperts, kGptOssExpertsPerToken, "intermediate_size", kGptOssIntermediate,
             "", 0, /*sparse_step_keys=*/false, /*router_before_experts=*/true, /*routing_weights_fp32=*/false,
             /*renormalizes_always=*/false, /*deepspeed_leaf=*/false};
    f.moe.top_k_then_softmax = true;
    f.moe.gpt_oss = true;
    families.push_back(f);
  }
  {
    // Llama's decoder layer around DeepseekV3Attention (latent attention)
    // and, from first_k_dense_replace on, DeepseekV3MoE: experts, then the
    // sigmoid router, then shared_experts. DeepSpeed's default leaf classes
    // do not name DeepseekV3MoE.
    ModelFamily f = families.front();
    ZPLAN_CHECK(f.model_type == "llama");
    f.model_type = "deepseek_v3";
    f.read_from = "models/deepseek_v3/configuration_deepseek_v3.py (DeepseekV3Config), modular_deepseek_v3.py "
                  "(DeepseekV3Attention after DeepseekV2Attention: q_a_proj, q_a_layernorm, q_b_proj, "
                  "kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, expand_kv, o_proj; "
                  "apply_rotary_pos_emb_interleave; DeepseekV3TopkRouter; DeepseekV3MoE: experts, gate, "
                  "shared_experts; DeepseekV3DecoderLayer: DeepseekV3MLP below first_k_dense_replace); "
                  "integrations/moe.py";
    f.moe = {"n_routed_experts", kDeepseekV3Experts, kDeepseekV3ExpertsPerToken, "moe_intermediate_size",
             kDeepseekV3ExpertFfn, "", 0, /*sparse_step_keys=*/false, /*router_before_experts=*/false,
             /*routing_weights_fp32=*/true, /*renormalizes_always=*/false, /*deepspeed_leaf=*/false};
    f.moe.shared_experts_count_key = "n_shared_experts";
    f.moe.default_shared_experts = kDeepseekV3SharedExperts;
    f.moe.first_dense_layers_key = "first_k_dense_replace";
    f.moe.default_first_dense_layers = kDeepseekV3FirstDenseLayers;
    f.moe.sigmoid_grouped_router = true;
    f.moe.default_router_groups = kDeepseekV3Groups;
    f.moe.default_router_top_groups = kDeepseekV3TopGroups;
    f.moe.default_routed_scaling_factor = kDeepseekV3RoutedScalingFactor;
    f.moe.default_norm_topk_prob = true;
    f.latent_attention = {kDeepseekV3QLoraRank, kDeepseekV3KvLoraRank, kDeepseekV3QkNopeHeadDim,
                          kDeepseekV3QkRopeHeadDim, kDeepseekV3VHeadDim, /*rope_interleave=*/true};
    // DeepseekV3ForCausalLM adds no auxiliary loss; output_router_logits
    // only records every layer's logits in its outputs (not modelled).
    f.unmodelled_keys = {"output_router_logits"};
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
    // GPT2Model.drop, GPT2Attention.resid_dropout, GPT2MLP.dropout.
    f.parameterless.embedding_dropout = true;
    f.parameterless.attention_output_dropout = true;
    f.parameterless.mlp_output_dropout = true;
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
    f.parameterless.embedding_dropout = true;  // ViTEmbeddings.dropout
    f.parameterless.half_dropouts = true;      // ViTLayer.dropout, after each half
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

std::string MoeModelTypes() {
  std::vector<absl::string_view> types;
  for (const ModelFamily& f : ModelFamilies()) {
    if (!f.moe.experts_key.empty()) types.push_back(f.model_type);
  }
  return absl::StrJoin(types, ", ");
}

std::string SupportedModelTypes() {
  return absl::StrJoin(ModelFamilies(), ", ",
                       [](std::string* out, const ModelFamily& f) { absl::StrAppend(out, f.model_type); });
}

std::optional<FfnType> FfnTypeFor(const ModelFamily& family, absl::string_view activation) {
  if (family.mlp == MlpKind::kGated) {
    // ACT2FN's two names for SiLU; zplan's gated MLP is SwiGLU.
    if (activation == "silu" || activation == "swish") return FFN_SWIGLU;
    if (activation == "gelu_pytorch_tanh") return FFN_GEGLU;
    return std::nullopt;
  }
  if (activation == "gelu_new") return FFN_GELU_NEW;
  if (activation == "gelu" || activation == "gelu_pytorch_tanh") return FFN_GELU;
  return std::nullopt;
}

std::string ModelledActivations(const ModelFamily& family) {
  return family.mlp == MlpKind::kGated ? "\"silu\", \"swish\" or \"gelu_pytorch_tanh\"" : "\"gelu\", \"gelu_pytorch_tanh\" or \"gelu_new\"";
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

const ModelFamily* LanguageModelFamilyOf(const ModelSpec& spec) {
  return FindModelFamily(spec.has_vision_language() ? spec.vision_language().text_model_type() : spec.model_type());
}

ParameterlessModules ParameterlessModulesOf(const ModelSpec& spec) {
  const ModelFamily* family = LanguageModelFamilyOf(spec);
  ParameterlessModules out = (family != nullptr ? *family : ModelFamilies().front()).parameterless;
  if (spec.position_embedding() == POSITION_ROPE) {
    std::set<LayerType> attention_types;
    for (int layer = 0; layer < spec.num_layers(); ++layer) {
      const LayerType type = layer < spec.layer_types_size() ? spec.layer_types(layer) : LAYER_FULL_ATTENTION;
      if (type != LAYER_CONV && type != LAYER_LINEAR_ATTENTION) attention_types.insert(type);
    }
    out.rotary_calls = out.rotary_per_layer_type ? std::max<int>(1, attention_types.size()) : 1;
  }
  return out;
}

}  // namespace zplan
