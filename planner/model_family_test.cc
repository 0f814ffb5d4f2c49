#include "planner/model_family.h"

#include <set>
#include <string>

#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/model_spec.h"
#include "planner/proto_io.h"

namespace zplan {
namespace {

using ::testing::ElementsAre;

TEST(ModelFamilyTest, OneEntryPerSupportedModelType) {
  EXPECT_EQ(SupportedModelTypes(), "llama, mistral, qwen2, qwen3, granite, granitemoehybrid, phi3, olmo2, olmo3, smollm3, glm4, gemma3_text, gemma2, gemma4_text, lfm2, qwen3_5_text, qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3, gpt2, vit");
  std::set<std::string> types;
  for (const ModelFamily& f : ModelFamilies()) {
    EXPECT_TRUE(types.insert(std::string(f.model_type)).second) << f.model_type;
    EXPECT_EQ(FindModelFamily(f.model_type), &f);
    // gemma3_text's files are models/gemma3/'s.
    const std::string folder(absl::StripSuffix(f.model_type, "_text"));
    EXPECT_NE(f.read_from.find("models/" + folder + "/"), std::string::npos) << f.model_type;
    EXPECT_NE(f.norm, NORM_TYPE_UNSPECIFIED) << f.model_type;
    EXPECT_NE(f.position, POSITION_EMBEDDING_UNSPECIFIED) << f.model_type;
    // Only a family whose every layer is a mixture of experts has no dense MLP width.
    EXPECT_TRUE(!f.ffn_key.empty() || (!f.moe.experts_key.empty() && !f.moe.sparse_step_keys)) << f.model_type;
    EXPECT_TRUE(FfnTypeFor(f, f.default_activation).has_value()) << f.model_type << ": its own default";
  }
  for (const char* unsupported : {"qwen", "qwen3_5", "bert", "gemma", "phi", "starcoder2", "deepseek_v2", "gpt_oss_x", ""}) {
    EXPECT_EQ(FindModelFamily(unsupported), nullptr) << unsupported;
  }
}

// What each entry says, against transformers 5.23's classes.
TEST(ModelFamilyTest, EntriesRestateTransformersDefaults) {
  const ModelFamily& llama = *FindModelFamily("llama");
  EXPECT_FALSE(llama.tie_word_embeddings);
  EXPECT_EQ(llama.qkv_bias_key, "attention_bias");
  EXPECT_EQ(llama.out_bias, OutProjectionBias::kAsQkv);
  EXPECT_EQ(llama.mlp_bias_key, "mlp_bias");
  EXPECT_EQ(llama.mlp, MlpKind::kGated);
  const ModelFamily& mistral = *FindModelFamily("mistral");
  EXPECT_TRUE(mistral.qkv_bias_key.empty() && !mistral.qkv_bias) << "MistralAttention: bias=False, no key";
  EXPECT_EQ(mistral.out_bias, OutProjectionBias::kNever);
  const ModelFamily& qwen2 = *FindModelFamily("qwen2");
  EXPECT_TRUE(qwen2.qkv_bias_key.empty() && qwen2.qkv_bias) << "Qwen2Attention: q, k, v bias=True";
  EXPECT_EQ(qwen2.out_bias, OutProjectionBias::kNever);
  const ModelFamily& qwen3 = *FindModelFamily("qwen3");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.default_head_dim, 128);
  EXPECT_EQ(qwen3.out_bias, OutProjectionBias::kAsQkv);
  const ModelFamily& qwen3_5_moe = *FindModelFamily("qwen3_5_moe_text");
  EXPECT_TRUE(qwen3_5_moe.delta_rule_layers);
  EXPECT_EQ(qwen3_5_moe.moe.shared_expert_ffn_key, "shared_expert_intermediate_size");
  EXPECT_TRUE(qwen3_5_moe.moe.renormalizes_always) << "Qwen3_5MoeTopKRouter: no norm_topk_prob";
  EXPECT_FALSE(qwen3_5_moe.moe.deepspeed_leaf) << "not in DeepSpeed 0.19.8's DEFAULT_LEAF_MODULE_CLASSES";
  EXPECT_TRUE(FindModelFamily("qwen3_moe")->moe.deepspeed_leaf);
  const ModelFamily& granitemoe = *FindModelFamily("granitemoe");
  EXPECT_TRUE(granitemoe.granite_multipliers);
  EXPECT_TRUE(granitemoe.moe.top_k_then_softmax) << "GraniteMoeTopKRouter";
  EXPECT_EQ(granitemoe.moe.expert_ffn_key, "intermediate_size");
  EXPECT_FALSE(granitemoe.moe.deepspeed_leaf) << "GraniteMoeMoE is not a default leaf class";
  const ModelFamily& granitemoeshared = *FindModelFamily("granitemoeshared");
  EXPECT_EQ(granitemoeshared.moe.shared_expert_ffn_key, "shared_intermediate_size");
  EXPECT_EQ(granitemoeshared.moe.default_shared_expert_ffn, 0) << "GraniteMoeSharedConfig: no shared_mlp by default";
  EXPECT_TRUE(granitemoeshared.moe.shared_mlp_after_experts && granitemoeshared.granite_multipliers);
  EXPECT_FALSE(granitemoeshared.moe.deepspeed_leaf) << "GraniteMoeSharedMoE is not a default leaf class";
  const ModelFamily& gpt_oss = *FindModelFamily("gpt_oss");
  EXPECT_TRUE(gpt_oss.attention_sinks) << "GptOssAttention.sinks";
  EXPECT_TRUE(gpt_oss.rope_half_split) << "_apply_rotary_emb";
  EXPECT_FALSE(gpt_oss.supports_sdpa) << "GptOssPreTrainedModel: _supports_sdpa = False";
  EXPECT_TRUE(gpt_oss.qkv_bias) << "GptOssConfig: attention_bias true";
  EXPECT_TRUE(gpt_oss.moe.gpt_oss && gpt_oss.moe.top_k_then_softmax) << "GptOssTopKRouter, GptOssExperts";
  EXPECT_FALSE(gpt_oss.moe.deepspeed_leaf) << "GptOssMLP is not a default leaf class";
  const ModelFamily& gpt2 = *FindModelFamily("gpt2");
  EXPECT_TRUE(gpt2.gpt2_key_names);
  EXPECT_TRUE(gpt2.tie_word_embeddings);
  EXPECT_EQ(gpt2.norm, NORM_LAYERNORM);
  EXPECT_EQ(gpt2.position, POSITION_LEARNED);
  EXPECT_EQ(gpt2.activation_key, "activation_function");
  EXPECT_EQ(FfnTypeFor(gpt2, gpt2.default_activation), FFN_GELU_NEW);
  EXPECT_EQ(gpt2.ffn_default_multiple, 4);
  EXPECT_DOUBLE_EQ(gpt2.residual_dropout.default_p, 0.1);
  EXPECT_EQ(gpt2.embedding_dropout.key, "embd_pdrop");
  EXPECT_TRUE(gpt2.eager_softmax_in_working_dtype);
  const ModelFamily& vit = *FindModelFamily("vit");
  EXPECT_TRUE(vit.vision);
  EXPECT_EQ(vit.qkv_bias_key, "qkv_bias");
  EXPECT_EQ(vit.residual_dropout.key, "hidden_dropout_prob");
  EXPECT_FALSE(vit.eager_softmax_in_working_dtype) << "ViT's eager softmax runs in fp32";
  const ModelFamily& phi3 = *FindModelFamily("phi3");
  EXPECT_TRUE(phi3.fused_qkv && phi3.fused_gate_up && phi3.partial_rotary);
  EXPECT_EQ(phi3.residual_dropout.key, "resid_pdrop") << "Phi3DecoderLayer's resid_attn_dropout, resid_mlp_dropout";
  EXPECT_EQ(phi3.sliding_window_key, "sliding_window");
  for (const char* olmo : {"olmo2", "olmo3"}) {
    const ModelFamily& f = *FindModelFamily(olmo);
    EXPECT_EQ(f.norm_placement, NORM_PLACEMENT_POST) << olmo;
    EXPECT_TRUE(f.norm_weight_in_fp32 && f.qk_norm && f.qk_norm_over_projection && f.rope_in_fp32) << olmo;
    EXPECT_EQ(f.qkv_bias_key, "attention_bias") << olmo << ": q, k, v and o_proj alike";
    EXPECT_TRUE(f.mlp_bias_key.empty()) << olmo << ": Olmo2MLP has no bias";
  }
  EXPECT_EQ(FindModelFamily("olmo2")->full_attention_interval, 0);
  EXPECT_EQ(FindModelFamily("olmo3")->full_attention_interval, 4);
  EXPECT_EQ(FindModelFamily("olmo3")->default_sliding_window, 4096);
  const ModelFamily& glm4 = *FindModelFamily("glm4");
  EXPECT_EQ(glm4.norm_placement, NORM_PLACEMENT_PRE_AND_POST);
  EXPECT_TRUE(glm4.qkv_bias && glm4.fused_gate_up && glm4.partial_rotary && glm4.rope_interleaved);
  EXPECT_EQ(glm4.out_bias, OutProjectionBias::kNever);
  EXPECT_DOUBLE_EQ(glm4.default_partial_rotary_factor, 0.5);
  EXPECT_EQ(glm4.default_head_dim, 128);
  const ModelFamily& smollm3 = *FindModelFamily("smollm3");
  EXPECT_TRUE(smollm3.tie_word_embeddings);
  EXPECT_EQ(smollm3.no_rope_layer_interval, 4);
  EXPECT_THAT(smollm3.unmodelled_keys, ElementsAre("use_sliding_window"));
  EXPECT_EQ(smollm3.mlp_bias_key, "mlp_bias");
  const ModelFamily& gemma3 = *FindModelFamily("gemma3_text");
  EXPECT_EQ(gemma3.activation_key, "hidden_activation") << "Gemma3TextConfig has no hidden_act";
  EXPECT_EQ(FfnTypeFor(gemma3, gemma3.default_activation), FFN_GEGLU);
  EXPECT_EQ(gemma3.norm_placement, NORM_PLACEMENT_PRE_AND_POST);
  EXPECT_TRUE(gemma3.norm_weight_in_fp32 && gemma3.norm_unit_offset && gemma3.qk_norm && gemma3.tie_word_embeddings);
  EXPECT_FALSE(gemma3.qk_norm_over_projection) << "Gemma3Attention normalizes per head";
  EXPECT_EQ(gemma3.full_attention_interval, 6);
  EXPECT_EQ(gemma3.full_attention_interval_key, "sliding_window_pattern");
  EXPECT_EQ(gemma3.default_head_dim, 256);
  EXPECT_TRUE(gemma3.embedding_scaled_by_sqrt_hidden);
  EXPECT_EQ(gemma3.attention_scalar_key, "query_pre_attn_scalar");
  EXPECT_THAT(gemma3.unmodelled_keys, ElementsAre("use_bidirectional_attention"));
  EXPECT_EQ(gemma3.final_softcap_key, "final_logit_softcapping");
  EXPECT_TRUE(gemma3.attn_softcap_key.empty()) << "Gemma3Attention never passes it to the attention";
  const ModelFamily& lfm2 = *FindModelFamily("lfm2");
  EXPECT_TRUE(lfm2.short_conv_layers);
  EXPECT_TRUE(lfm2.qk_norm) << "Lfm2Attention's q_layernorm and k_layernorm";
  EXPECT_TRUE(lfm2.tie_word_embeddings);
  EXPECT_TRUE(lfm2.activation_key.empty()) << "Lfm2MLP calls F.silu";
  const ModelFamily& gemma2 = *FindModelFamily("gemma2");
  EXPECT_FALSE(gemma2.supports_sdpa);
  EXPECT_FALSE(gemma2.qk_norm);
  EXPECT_EQ(gemma2.full_attention_interval, 2);
  EXPECT_DOUBLE_EQ(gemma2.default_attn_softcap, 50.0);
  EXPECT_DOUBLE_EQ(gemma2.default_final_softcap, 30.0);
  for (const ModelFamily& f : ModelFamilies()) {
    if (f.model_type == "gpt2" || f.model_type == "vit") continue;
    // Lfm2Attention passes dropout=0.0 whatever the config says.
    EXPECT_EQ(f.attention_dropout.key, f.model_type == "lfm2" ? "" : "attention_dropout") << f.model_type;
    EXPECT_TRUE(f.embedding_dropout.key.empty()) << f.model_type;
    if (f.model_type != "phi3") {
      EXPECT_TRUE(f.residual_dropout.key.empty()) << f.model_type;
    }
    if (!f.norm_unit_offset && !f.gemma4_layers) {
      EXPECT_EQ(f.default_activation, "silu") << f.model_type;
    }
    EXPECT_EQ(f.norm, NORM_RMSNORM) << f.model_type;
  }
}

TEST(ModelFamilyTest, ActivationsByMlpKind) {
  const ModelFamily& llama = *FindModelFamily("llama");
  EXPECT_EQ(FfnTypeFor(llama, "swish"), FFN_SWIGLU);
  EXPECT_EQ(FfnTypeFor(llama, "gelu_pytorch_tanh"), FFN_GEGLU);
  EXPECT_FALSE(FfnTypeFor(llama, "gelu").has_value()) << "a gated exact GELU is not modelled";
  const ModelFamily& vit = *FindModelFamily("vit");
  EXPECT_EQ(FfnTypeFor(vit, "gelu_pytorch_tanh"), FFN_GELU);
  EXPECT_FALSE(FfnTypeFor(vit, "silu").has_value());
  EXPECT_EQ(ModelledActivations(vit), "\"gelu\", \"gelu_pytorch_tanh\" or \"gelu_new\"");
}

TEST(ModelFamilyTest, ApproximationNoteNamesTypeAndFamily) {
  EXPECT_EQ(ApproximationNote("starcoder2", "llama"),
            "model_type \"starcoder2\" planned as llama: an unvalidated approximation, nothing about \"starcoder2\" was "
            "checked");
  EXPECT_EQ(ApproximationNote("", "gpt2"),
            "a config.json without model_type planned as gpt2: an unvalidated approximation, nothing about its model "
            "was checked");
  EXPECT_EQ(ApproximationNote("a\nb", "llama").find('\n'), std::string::npos) << "one line";
}

// A config of each family resolves exactly as it did before the table
// (the ModelSpec zplan 1cdc6c5 planned, model_type aside).
struct Resolved {
  const char* config;
  const char* model;  // ModelSpec text
};

class ResolvesAsBeforeTest : public ::testing::TestWithParam<Resolved> {};

TEST_P(ResolvesAsBeforeTest, SameModelSpec) {
  auto spec = LoadHfConfig(GetParam().config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ModelSpec before;
  ASSERT_TRUE(ParseProto(GetParam().model, ProtoFormat::kText, "before", &before).ok());
  EXPECT_NE(spec->model_type(), "");
  EXPECT_EQ(spec->unvalidated_approximation(), "");
  ModelSpec now = *spec;
  now.clear_model_type();
  EXPECT_EQ(now.SerializeAsString(), before.SerializeAsString()) << now.DebugString();
  EXPECT_NE(FindModelFamily(spec->model_type()), nullptr);
}

INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, ResolvesAsBeforeTest,
    ::testing::Values(
        Resolved{"configs/hf/tiny/llama.json", R"pb(
          name: "configs/hf/tiny/llama.json" num_layers: 2 hidden_size: 128 num_attention_heads: 4 num_kv_heads: 2
          head_dim: 32 ffn_hidden_size: 352 ffn_type: FFN_SWIGLU vocab_size: 2048 norm_type: NORM_RMSNORM
          attention_impl: ATTENTION_SDPA position_embedding: POSITION_ROPE
          source: "Hugging Face config configs/hf/tiny/llama.json (model_type \"llama\")")pb"},
        Resolved{"configs/hf/tiny/mistral.json", R"pb(
          name: "configs/hf/tiny/mistral.json" num_layers: 3 hidden_size: 192 num_attention_heads: 6 num_kv_heads: 2
          head_dim: 32 ffn_hidden_size: 512 ffn_type: FFN_SWIGLU vocab_size: 2048 norm_type: NORM_RMSNORM
          attention_impl: ATTENTION_SDPA position_embedding: POSITION_ROPE
          source: "Hugging Face config configs/hf/tiny/mistral.json (model_type \"mistral\")")pb"},
        Resolved{"configs/hf/tiny/qwen2.json", R"pb(
          name: "configs/hf/tiny/qwen2.json" num_layers: 2 hidden_size: 128 num_attention_heads: 4 num_kv_heads: 2
          head_dim: 32 ffn_hidden_size: 384 ffn_type: FFN_SWIGLU vocab_size: 3072 tie_word_embeddings: true
          norm_type: NORM_RMSNORM attention_impl: ATTENTION_SDPA position_embedding: POSITION_ROPE
          attention_qkv_bias: true
          source: "Hugging Face config configs/hf/tiny/qwen2.json (model_type \"qwen2\")")pb"},
        Resolved{"configs/hf/tiny/qwen3.json", R"pb(
          name: "configs/hf/tiny/qwen3.json" num_layers: 2 hidden_size: 128 num_attention_heads: 4 num_kv_heads: 2
          head_dim: 32 ffn_hidden_size: 384 ffn_type: FFN_SWIGLU vocab_size: 2048 tie_word_embeddings: true
          norm_type: NORM_RMSNORM attention_impl: ATTENTION_SDPA position_embedding: POSITION_ROPE qk_norm: true
          source: "Hugging Face config configs/hf/tiny/qwen3.json (model_type \"qwen3\")")pb"},
        Resolved{"configs/hf/tiny/gpt2-dropout.json", R"pb(
          name: "configs/hf/tiny/gpt2-dropout.json" num_layers: 2 hidden_size: 128 num_attention_heads: 4
          num_kv_heads: 4 head_dim: 32 ffn_hidden_size: 512 ffn_type: FFN_GELU_NEW vocab_size: 2048
          tie_word_embeddings: true norm_type: NORM_LAYERNORM attention_impl: ATTENTION_SDPA attention_dropout: 0.1
          position_embedding: POSITION_LEARNED max_position_embeddings: 1024 attention_qkv_bias: true
          attention_out_bias: true mlp_bias: true
          source: "Hugging Face config configs/hf/tiny/gpt2-dropout.json (model_type \"gpt2\")"
          residual_dropout: 0.1 embedding_dropout: 0.1 eager_softmax_in_working_dtype: true)pb"},
        Resolved{"configs/hf/tiny/vit.json", R"pb(
          name: "configs/hf/tiny/vit.json" num_layers: 2 hidden_size: 128 num_attention_heads: 4 num_kv_heads: 4
          head_dim: 32 ffn_hidden_size: 512 ffn_type: FFN_GELU norm_type: NORM_LAYERNORM
          attention_impl: ATTENTION_SDPA position_embedding: POSITION_LEARNED max_position_embeddings: 65
          attention_qkv_bias: true attention_out_bias: true mlp_bias: true
          source: "Hugging Face config configs/hf/tiny/vit.json (model_type \"vit\", ViTForImageClassification)"
          vision { image_size: 64 patch_size: 8 num_channels: 3 num_labels: 10 })pb"}),
    [](const ::testing::TestParamInfo<Resolved>& info) {
      std::string name = std::string(info.param.config).substr(std::string("configs/hf/tiny/").size());
      name = name.substr(0, name.find('.'));
      for (char& c : name) c = c == '-' ? '_' : c;
      return name;
    });

// Each preset is a shape of its model_type's family: what the family fixes
// (norm, MLP kind, positions, qk-norm, the softmax's dtype, the biases of a
// config that leaves them at their defaults) agrees with the preset's fields.
TEST(ModelFamilyTest, PresetsAgreeWithTheirFamily) {
  for (const std::string& name : PresetNames()) {
    auto spec = LoadPreset(name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    const ModelFamily* family = FindModelFamily(spec->model_type());
    if (family == nullptr) {
      // An unsupported model_type must say which family it is planned as.
      const std::string prefix = "model_type \"" + spec->model_type() + "\" planned as ";
      ASSERT_EQ(spec->unvalidated_approximation().rfind(prefix, 0), 0u) << name;
      const std::string as = spec->unvalidated_approximation().substr(prefix.size());
      family = FindModelFamily(as.substr(0, as.find(':')));
      ASSERT_NE(family, nullptr) << name << ": " << spec->unvalidated_approximation();
      EXPECT_EQ(spec->unvalidated_approximation(), ApproximationNote(spec->model_type(), family->model_type));
    } else {
      EXPECT_EQ(spec->unvalidated_approximation(), "") << name;
    }
    EXPECT_EQ(spec->norm_type(), family->norm) << name;
    EXPECT_EQ(spec->ffn_type() == FFN_SWIGLU, family->mlp == MlpKind::kGated) << name;
    EXPECT_EQ(spec->position_embedding(), family->position) << name;
    EXPECT_EQ(spec->qk_norm(), family->qk_norm) << name;
    EXPECT_EQ(spec->eager_softmax_in_working_dtype(), family->eager_softmax_in_working_dtype) << name;
    EXPECT_EQ(spec->has_vision(), family->vision) << name;
    EXPECT_EQ(spec->attention_qkv_bias(), family->qkv_bias) << name;
    EXPECT_EQ(spec->attention_out_bias(), family->out_bias == OutProjectionBias::kAlways) << name;
    EXPECT_EQ(spec->mlp_bias(), family->mlp_bias) << name;
  }
}

}  // namespace
}  // namespace zplan
