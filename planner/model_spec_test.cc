#include "planner/model_spec.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/block_layout.h"
#include "planner/inventory.h"

namespace zplan {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct ExactCount {
  const char* preset;
  int64_t params;
};

class PresetCountTest : public ::testing::TestWithParam<ExactCount> {};

TEST_P(PresetCountTest, CountsEveryParameterExactly) {
  auto spec = LoadPreset(GetParam().preset);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(CountParameters(*spec), GetParam().params);
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetCountTest,
                         ::testing::Values(ExactCount{"gpt2", 124'439'808},
                                           ExactCount{"qwen3-0.6b", 596'049'920},
                                           ExactCount{"llama3-8b", 8'030'261'248},
                                           ExactCount{"1b", 1'235'814'400},
                                           ExactCount{"qwen-14b", 14'167'290'880}));

class HfCountTest : public ::testing::TestWithParam<ExactCount> {};

TEST_P(HfCountTest, CountsHuggingFaceConfigExactly) {
  auto spec = LoadHfConfig(std::string("configs/hf/") + GetParam().preset + ".json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(CountParameters(*spec), GetParam().params);
}

INSTANTIATE_TEST_SUITE_P(HfConfigs, HfCountTest,
                         ::testing::Values(ExactCount{"gpt2", 124'439'808},
                                           ExactCount{"qwen3-0.6b", 596'049'920},
                                           ExactCount{"llama3-8b", 8'030'261'248},
                                           ExactCount{"qwen2.5-0.5b", 494'032'768}));

// transformers' ViTConfig defaults; the counts are transformers 5.23's
// sum(p.numel()) of ViTForImageClassification built from the same config.
TEST(ModelSpecTest, ReadsViTConfigWithItsDefaults) {
  auto spec = ModelSpecFromHfConfig(R"({"model_type": "vit", "image_size": 256, "num_labels": 2})", "vit.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_vision());
  EXPECT_EQ(spec->vision().patch_size(), 16);
  EXPECT_EQ(spec->vision().num_channels(), 3);
  EXPECT_EQ(VisionTokens(*spec), 257);
  EXPECT_EQ(spec->max_position_embeddings(), 257);
  EXPECT_EQ(spec->position_embedding(), POSITION_LEARNED);
  EXPECT_EQ(spec->norm_type(), NORM_LAYERNORM);
  EXPECT_EQ(spec->ffn_type(), FFN_GELU);
  EXPECT_EQ(spec->vocab_size(), 0);
  EXPECT_EQ(CountParameters(*spec), 85'846'274);
  auto wide = LoadHfConfig("configs/hf/tiny/vit-wide.json");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->vision().num_labels(), 5);  // from id2label
  EXPECT_EQ(wide->residual_dropout(), 0.1);   // hidden_dropout_prob
  EXPECT_EQ(CountParameters(*wide), 2'486'533);
  const std::vector<TensorSpec> params = ParameterInventory(*wide);
  EXPECT_EQ(params.front().name(), "embed_patches.cls_token");
  EXPECT_EQ(params.back().name(), "classifier.bias");
}

TEST(ModelSpecTest, HfConfigReadsGqaHeadDimAndTying) {
  auto spec = LoadHfConfig("configs/hf/qwen3-0.6b.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_kv_heads(), 8);
  EXPECT_EQ(spec->head_dim(), 128);  // wider than 1024 / 16
  EXPECT_TRUE(spec->tie_word_embeddings());
  EXPECT_TRUE(spec->qk_norm());
  EXPECT_EQ(spec->ffn_type(), FFN_SWIGLU);
}

TEST(ModelSpecTest, Gpt2LegacyKeysAndDropout) {
  auto spec = LoadHfConfig("configs/hf/gpt2.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ffn_hidden_size(), 3072);  // n_inner null -> 4 * n_embd
  EXPECT_EQ(spec->norm_type(), NORM_LAYERNORM);
  EXPECT_EQ(spec->position_embedding(), POSITION_LEARNED);
  EXPECT_DOUBLE_EQ(spec->attention_dropout(), 0.1);
  EXPECT_DOUBLE_EQ(spec->residual_dropout(), 0.1);
  EXPECT_DOUBLE_EQ(spec->embedding_dropout(), 0.1);
}

TEST(ModelSpecTest, UnknownPresetListsPresets) {
  auto spec = LoadPreset("llama-9000");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("llama3-8b"), std::string::npos) << spec.status();
  EXPECT_NE(spec.status().message().find("qwen3-0.6b"), std::string::npos);
}

absl::StatusOr<ModelSpec> SpecFromJson(const std::string& text) {
  return ModelSpecFromHfConfig(text, "config.json");
}

absl::Status FromJson(const std::string& text) { return SpecFromJson(text).status(); }

TEST(ModelSpecTest, DropoutDefaultsFollowTransformersConfigs) {
  // GPT2Config defaults every dropout to 0.1; Llama-family configs have only
  // attention_dropout, 0.0 by default.
  auto gpt2 = SpecFromJson(R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 2,
                              "vocab_size": 100, "n_positions": 32, "resid_pdrop": 0.0})");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_DOUBLE_EQ(gpt2->attention_dropout(), 0.1);
  EXPECT_DOUBLE_EQ(gpt2->residual_dropout(), 0.0);
  EXPECT_DOUBLE_EQ(gpt2->embedding_dropout(), 0.1);
  auto llama = SpecFromJson(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100})");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_DOUBLE_EQ(llama->attention_dropout() + llama->residual_dropout() + llama->embedding_dropout(), 0.0);
  absl::Status bad = FromJson(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100, "attention_dropout": "0.1"})");
  EXPECT_NE(bad.message().find("attention_dropout: expected a number"), std::string::npos) << bad;
  bad = FromJson(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100, "attention_dropout": 1.0})");
  EXPECT_NE(bad.message().find("attention_dropout: a probability in [0, 1)"), std::string::npos) << bad;
}

TEST(ModelSpecTest, RejectsHeadsNotDividingHidden) {
  absl::Status status = FromJson(
      R"({"model_type": "llama", "hidden_size": 1000, "num_hidden_layers": 2, "num_attention_heads": 3,
          "intermediate_size": 4000, "vocab_size": 100})");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("num_attention_heads"), std::string::npos) << status;
}

TEST(ModelSpecTest, RejectsKvHeadsNotDividingHeads) {
  absl::Status status = FromJson(
      R"({"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
          "num_key_value_heads": 6, "intermediate_size": 4000, "vocab_size": 100})");
  EXPECT_NE(status.message().find("num_kv_heads"), std::string::npos) << status;
}

TEST(ModelSpecTest, RejectsNonPositiveSizes) {
  absl::Status status = FromJson(
      R"({"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 0, "num_attention_heads": 16,
          "intermediate_size": 4000, "vocab_size": 100})");
  EXPECT_NE(status.message().find("num_layers"), std::string::npos) << status;
}

TEST(ModelSpecTest, RejectsWrongTypeNamingKey) {
  absl::Status status = FromJson("{\n  \"model_type\": \"llama\",\n  \"num_hidden_layers\": \"two\"\n}");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()), "config.json: num_hidden_layers: expected an integer, got string \"two\"");
}

TEST(ModelSpecTest, RejectsMalformedJsonWithLine) {
  absl::Status status = FromJson("{\n  \"hidden_size\": 1024,\n  \"vocab_size\" 5\n}");
  EXPECT_NE(status.message().find("config.json:3:16: malformed JSON: expected : between key:value pair"),
            std::string::npos)
      << status;
}

// GraniteConfig's four multipliers, 1.0 when the config leaves them out; a
// logits_scaling of 0 would divide by zero.
TEST(ModelSpecTest, GraniteReadsItsMultipliers) {
  const std::string shape = R"("model_type": "granite", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "embedding_multiplier": 12.0,
      "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 8.0})"), "granite.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->embedding_multiplier(), 12.0);
  EXPECT_EQ(spec->residual_multiplier(), 0.22);
  EXPECT_EQ(spec->attention_multiplier(), 0.015625);
  EXPECT_EQ(spec->logits_scaling(), 8.0);
  auto defaults = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "granite.json");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->residual_multiplier(), 1.0);
  EXPECT_EQ(defaults->logits_scaling(), 1.0);
  auto zero = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "logits_scaling": 0})"), "granite.json");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("logits_scaling"), std::string::npos) << zero.status();
  // A Llama config has none of them.
  auto llama = ModelSpecFromHfConfig(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})", "llama.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->residual_multiplier(), 0.0);
}

TEST(ModelSpecTest, GptOssReadsSinksBiasedExpertsAndItsGate) {
  const std::string shape = R"("model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "swiglu_limit": 5.0})"), "gpt_oss.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->attention_sinks() && spec->rope_half_split());
  EXPECT_EQ(spec->attention_impl(), ATTENTION_EAGER) << "_supports_sdpa is False";
  EXPECT_TRUE(spec->attention_qkv_bias() && spec->attention_out_bias()) << "attention_bias defaults to true";
  EXPECT_THAT(spec->layer_types(), ElementsAre(LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION));
  EXPECT_EQ(spec->sliding_window(), 128);
  const MoeSpec& moe = spec->moe();
  EXPECT_TRUE(moe.gpt_oss_experts() && moe.router_bias() && moe.router_top_k_then_softmax() &&
              moe.router_top_k_in_working_dtype());
  EXPECT_EQ(moe.swiglu_limit(), 5.0);
  EXPECT_EQ(moe.swiglu_alpha(), 1.702);
  // GptOssExperts' transposed experts with their biases, the router's bias, the sinks.
  std::vector<std::string> names;
  for (const TensorSpec& p : BlockParameters(*spec, 0)) names.push_back(absl::StrCat(p.name(), p.shape().size()));
  EXPECT_THAT(names, ::testing::IsSupersetOf({"layers.0.attn.sinks1", "layers.0.mlp.gate.bias1",
                                              "layers.0.mlp.experts.gate_up_proj3",
                                              "layers.0.mlp.experts.gate_up_proj_bias2",
                                              "layers.0.mlp.experts.down_proj_bias2"}));
  EXPECT_THAT(FromJson(absl::StrCat("{", shape, R"(, "swiglu_limit": 0})")).message(), HasSubstr("swiglu_limit"));
  EXPECT_THAT(FromJson(absl::StrCat("{", shape, R"(, "attn_implementation": "sdpa"})")).message(),
              HasSubstr("SDPA has no sinks"));
}

TEST(ModelSpecTest, OlmoNormsAfterEachHalfAndReadsLayerTypes) {
  const std::string shape = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto olmo2 = ModelSpecFromHfConfig(absl::StrCat(R"({"model_type": "olmo2", )", shape, "}"), "olmo2.json");
  ASSERT_TRUE(olmo2.ok()) << olmo2.status();
  EXPECT_EQ(olmo2->norm_placement(), NORM_PLACEMENT_POST);
  EXPECT_TRUE(olmo2->norm_weight_in_fp32() && olmo2->qk_norm_over_projection() && olmo2->rope_in_fp32());
  EXPECT_TRUE(olmo2->layer_types().empty());
  EXPECT_EQ(olmo2->sliding_window(), 0);
  // Olmo3Config's defaults: a 4096-token window on three layers of every four.
  auto olmo3 = ModelSpecFromHfConfig(absl::StrCat(R"({"model_type": "olmo3", )", shape, "}"), "olmo3.json");
  ASSERT_TRUE(olmo3.ok()) << olmo3.status();
  EXPECT_EQ(olmo3->sliding_window(), 4096);
  EXPECT_THAT(olmo3->layer_types(), ElementsAre(LAYER_SLIDING_ATTENTION, LAYER_SLIDING_ATTENTION,
                                                LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION));
  auto given = ModelSpecFromHfConfig(
      absl::StrCat(R"({"model_type": "olmo3", "sliding_window": null, "layer_types": ["full_attention",
          "sliding_attention", "full_attention", "full_attention"], )", shape, "}"), "olmo3.json");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->sliding_window(), 0);
  EXPECT_THAT(given->layer_types(), ElementsAre(LAYER_FULL_ATTENTION, LAYER_SLIDING_ATTENTION,
                                                LAYER_FULL_ATTENTION, LAYER_FULL_ATTENTION));
  // One per layer, of the kinds modelled.
  for (const char* bad : {R"("layer_types": ["full_attention"], )", R"("layer_types": ["linear_attention",
      "full_attention", "full_attention", "full_attention"], )", R"("layer_types": "full_attention", )"}) {
    auto refused = ModelSpecFromHfConfig(absl::StrCat(R"({"model_type": "olmo3", )", bad, shape, "}"), "olmo3.json");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("olmo3.json: layer_types: "), std::string::npos) << refused.status();
  }
}

TEST(ModelSpecTest, Gemma3TextReadsItsScalesNormsAndLayerPattern) {
  const std::string shape = R"("model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "gemma3.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ffn_type(), FFN_GEGLU) << "hidden_activation defaults to gelu_pytorch_tanh";
  EXPECT_EQ(spec->head_dim(), 256);
  EXPECT_TRUE(spec->tie_word_embeddings() && spec->qk_norm() && spec->norm_unit_offset() &&
              spec->norm_weight_in_fp32());
  EXPECT_EQ(spec->norm_placement(), NORM_PLACEMENT_PRE_AND_POST);
  EXPECT_DOUBLE_EQ(spec->embedding_multiplier(), 8.0) << "sqrt(hidden_size)";
  EXPECT_DOUBLE_EQ(spec->attention_multiplier(), 1.0 / 16) << "query_pre_attn_scalar 256 ** -0.5";
  EXPECT_EQ(spec->sliding_window(), 4096);
  EXPECT_THAT(spec->layer_types(), ElementsAre(LAYER_SLIDING_ATTENTION, LAYER_SLIDING_ATTENTION,
                                               LAYER_SLIDING_ATTENTION, LAYER_SLIDING_ATTENTION,
                                               LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION,
                                               LAYER_SLIDING_ATTENTION));
  // The legacy sliding_window_pattern sets the default layer types; the scalar the scale.
  auto given = ModelSpecFromHfConfig(absl::StrCat(R"({"sliding_window_pattern": 2, "query_pre_attn_scalar": 64,
      "head_dim": 16, "sliding_window": 512, "final_logit_softcapping": null, "attn_logit_softcapping": 50.0, )",
                                                  shape, "}"), "gemma3.json");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_THAT(given->layer_types(), ElementsAre(LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION,
                                                LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION,
                                                LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION,
                                                LAYER_SLIDING_ATTENTION));
  EXPECT_DOUBLE_EQ(given->attention_multiplier(), 0.125);
  EXPECT_EQ(given->sliding_window(), 512);
  for (const char* bad : {R"("final_logit_softcapping": -1, )", R"("use_bidirectional_attention": true, )",
                          R"("hidden_activation": "gelu", )", R"("sliding_window_pattern": 0, )",
                          R"("query_pre_attn_scalar": 0, )"}) {
    auto refused = ModelSpecFromHfConfig(absl::StrCat("{", bad, shape, "}"), "gemma3.json");
    ASSERT_FALSE(refused.ok()) << bad;
    const std::string key(absl::string_view(bad).substr(1, absl::string_view(bad).find('"', 1) - 1));
    EXPECT_NE(refused.status().message().find(absl::StrCat("gemma3.json: ", key, ": ")), std::string::npos)
        << refused.status();
  }
}

TEST(ModelSpecTest, Gemma2SoftcapsAndRunsEagerAttention) {
  const std::string shape = R"("model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "gemma2.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->attention_impl(), ATTENTION_EAGER) << "_supports_sdpa is False: transformers picks eager";
  EXPECT_DOUBLE_EQ(spec->attn_logit_softcapping(), 50.0);
  EXPECT_DOUBLE_EQ(spec->final_logit_softcapping(), 30.0);
  EXPECT_FALSE(spec->qk_norm());
  EXPECT_TRUE(spec->norm_unit_offset() && spec->tie_word_embeddings());
  EXPECT_THAT(spec->layer_types(), ElementsAre(LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION,
                                               LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION));
  auto uncapped = ModelSpecFromHfConfig(
      absl::StrCat(R"({"attn_logit_softcapping": null, "final_logit_softcapping": null, )", shape, "}"),
      "gemma2.json");
  ASSERT_TRUE(uncapped.ok()) << uncapped.status();
  EXPECT_EQ(uncapped->attn_logit_softcapping(), 0);
  EXPECT_EQ(uncapped->final_logit_softcapping(), 0);
  auto sdpa = ModelSpecFromHfConfig(absl::StrCat(R"({"attn_implementation": "sdpa", )", shape, "}"), "gemma2.json");
  ASSERT_FALSE(sdpa.ok());
  EXPECT_NE(sdpa.status().message().find("transformers refuses it for gemma2"), std::string::npos) << sdpa.status();
  // Gemma 3 reads final_logit_softcapping (null by default) and never applies attn_logit_softcapping.
  auto gemma3 = ModelSpecFromHfConfig(R"({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
      "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0})", "gemma3.json");
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_DOUBLE_EQ(gemma3->final_logit_softcapping(), 30.0);
  EXPECT_EQ(gemma3->attn_logit_softcapping(), 0);
  EXPECT_EQ(gemma3->attention_impl(), ATTENTION_SDPA);
}

TEST(ModelSpecTest, MistralSlidesEveryLayerUnlessItsWindowIsNull) {
  const std::string shape = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto v01 = ModelSpecFromHfConfig(absl::StrCat(R"({"model_type": "mistral", )", shape, "}"), "mistral.json");
  ASSERT_TRUE(v01.ok()) << v01.status();
  EXPECT_EQ(v01->sliding_window(), 4096) << "MistralConfig's default";
  EXPECT_TRUE(v01->layer_types().empty()) << "every layer slides";
  auto v03 = ModelSpecFromHfConfig(absl::StrCat(R"({"model_type": "mistral", "sliding_window": null, )", shape, "}"),
                                   "mistral.json");
  ASSERT_TRUE(v03.ok()) << v03.status();
  EXPECT_EQ(v03->sliding_window(), 0);
  for (const char* qwen : {"qwen2", "qwen3"}) {
    auto refused = ModelSpecFromHfConfig(
        absl::StrCat(R"({"model_type": ")", qwen, R"(", "use_sliding_window": true, )", shape, "}"), "qwen.json");
    ASSERT_FALSE(refused.ok()) << qwen;
    EXPECT_NE(refused.status().message().find("qwen.json: use_sliding_window: true is not modelled"),
              std::string::npos)
        << refused.status();
  }
}

TEST(ModelSpecTest, Qwen3_5ReadsItsLinearAttentionLayersAndGatedAttention) {
  const std::string shape = R"("model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  // Qwen3_5TextConfig's defaults: full attention every 4th layer, head_dim 256, a quarter of it rotated,
  // 16 key and 32 value heads of 128, a conv of 4.
  auto d = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "qwen3_5.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->layer_types(), ElementsAre(LAYER_LINEAR_ATTENTION, LAYER_LINEAR_ATTENTION, LAYER_LINEAR_ATTENTION,
                                            LAYER_FULL_ATTENTION, LAYER_LINEAR_ATTENTION));
  EXPECT_EQ(d->head_dim(), 256);
  EXPECT_EQ(d->rotary_dim(), 64);
  EXPECT_TRUE(d->rope_concatenates());
  EXPECT_TRUE(d->rope_tables_per_sequence());
  EXPECT_EQ(d->linear_num_key_heads(), 16);
  EXPECT_EQ(d->linear_num_value_heads(), 32);
  EXPECT_EQ(d->linear_key_head_dim(), 128);
  EXPECT_EQ(d->linear_value_head_dim(), 128);
  EXPECT_EQ(d->conv_kernel_size(), 4);
  EXPECT_EQ(d->linear_attention_impl(), LINEAR_ATTENTION_TORCH);
  EXPECT_TRUE(d->attention_output_gate());
  EXPECT_TRUE(d->qk_norm());
  EXPECT_TRUE(d->norm_unit_offset());
  EXPECT_FALSE(d->tie_word_embeddings());
  // full_attention_interval, or layer_types as given; the widths and the conv from their keys.
  auto v = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "full_attention_interval": 2, "head_dim": 16,
      "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 8, "linear_value_head_dim": 4,
      "linear_conv_kernel_dim": 3})"), "qwen3_5.json");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->layer_types(), ElementsAre(LAYER_LINEAR_ATTENTION, LAYER_FULL_ATTENTION, LAYER_LINEAR_ATTENTION,
                                            LAYER_FULL_ATTENTION, LAYER_LINEAR_ATTENTION));
  EXPECT_EQ(v->linear_num_value_heads(), 6);
  EXPECT_EQ(v->conv_kernel_size(), 3);
  auto sliding = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "layer_types": ["linear_attention",
      "sliding_attention", "full_attention", "linear_attention", "full_attention"]})"), "qwen3_5.json");
  ASSERT_FALSE(sliding.ok());
  EXPECT_NE(sliding.status().message().find("qwen3_5.json: layer_types: \"sliding_attention\" is not modelled in "
                                            "qwen3_5_text; give a list of \"full_attention\" or \"linear_attention\""),
            std::string::npos)
      << sliding.status();
  // Value heads repeat whole key heads.
  auto uneven = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "head_dim": 16, "linear_num_key_heads": 4,
      "linear_num_value_heads": 6})"), "qwen3_5.json");
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("model.linear_num_value_heads: 6 is not a multiple of "
                                           "linear_num_key_heads 4"),
            std::string::npos)
      << uneven.status();
}

TEST(ModelSpecTest, KernelChoicesStandWhereTheirLayersAreAndWithinThePackagesLimits) {
  auto qwen = ModelSpecFromHfConfig(R"({"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
      "full_attention_interval": 2})", "qwen3_5.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  // transformers' torch fallbacks unless a plan says otherwise (--kernels).
  EXPECT_EQ(qwen->linear_attention_impl(), LINEAR_ATTENTION_TORCH);
  EXPECT_EQ(qwen->short_conv_impl(), SHORT_CONV_TORCH);
  auto refusal = [](ModelSpec spec) { return std::string(ValidateModelSpec(spec).message()); };
  ModelSpec fla = *qwen;
  fla.set_linear_attention_impl(LINEAR_ATTENTION_FLA);
  fla.set_short_conv_impl(SHORT_CONV_CAUSAL_CONV1D);
  EXPECT_TRUE(ValidateModelSpec(fla).ok()) << ValidateModelSpec(fla);
  ModelSpec unset = *qwen;
  unset.clear_short_conv_impl();
  EXPECT_THAT(refusal(unset), HasSubstr("model.short_conv_impl: unset for a model with LAYER_CONV or "
                                        "LAYER_LINEAR_ATTENTION layers; give SHORT_CONV_TORCH or "
                                        "SHORT_CONV_CAUSAL_CONV1D"));
  ModelSpec wide = fla;
  wide.set_linear_key_head_dim(512);
  EXPECT_THAT(refusal(wide), HasSubstr("model.linear_key_head_dim: 512 with LINEAR_ATTENTION_FLA; fla's "
                                       "chunk_gated_delta_rule takes key heads up to 256"));
  ModelSpec odd = fla;
  odd.set_linear_num_key_heads(1);
  odd.set_linear_num_value_heads(3);
  odd.set_linear_value_head_dim(127);  // channels 2 x 128 + 3 x 127
  EXPECT_THAT(refusal(odd), HasSubstr("SHORT_CONV_CAUSAL_CONV1D with 637 conv channels; causal-conv1d refuses"));
  auto llama = ModelSpecFromHfConfig(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})", "llama.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->linear_attention_impl(), LINEAR_ATTENTION_IMPL_UNSPECIFIED);
  EXPECT_EQ(llama->short_conv_impl(), SHORT_CONV_IMPL_UNSPECIFIED);
  llama->set_linear_attention_impl(LINEAR_ATTENTION_FLA);
  EXPECT_THAT(refusal(*llama), HasSubstr("model.linear_attention_impl: set for a model without "
                                         "LAYER_LINEAR_ATTENTION layers; leave it unset"));
}

TEST(ModelSpecTest, Lfm2ReadsItsConvLayersAndAdjustsItsMlpWidth) {
  const std::string shape = R"("model_type": "lfm2", "hidden_size": 64, "intermediate_size": 300,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto v = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "layer_types": ["conv", "full_attention", "conv",
      "conv"]})"), "lfm2.json");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->layer_types(), ElementsAre(LAYER_CONV, LAYER_FULL_ATTENTION, LAYER_CONV, LAYER_CONV));
  EXPECT_EQ(v->conv_kernel_size(), 3) << "Lfm2Config's conv_L_cache";
  EXPECT_FALSE(v->conv_bias());
  EXPECT_TRUE(v->tie_word_embeddings());
  EXPECT_TRUE(v->qk_norm());
  // Lfm2MLP: int(2 x 300 / 3) = 200, x 1.0, rounded up to a multiple of 256.
  EXPECT_EQ(v->ffn_hidden_size(), 256);
  // full_attn_idxs without layer_types; block_ff_dim and tie_embedding as the config class takes them;
  // no auto-adjust: the width as given.
  auto idxs = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "full_attn_idxs": [2], "block_ff_dim": 96,
      "block_auto_adjust_ff_dim": false, "tie_embedding": false, "conv_L_cache": 4, "conv_bias": true})"),
                                    "lfm2.json");
  ASSERT_TRUE(idxs.ok()) << idxs.status();
  EXPECT_THAT(idxs->layer_types(), ElementsAre(LAYER_CONV, LAYER_CONV, LAYER_FULL_ATTENTION, LAYER_CONV));
  EXPECT_EQ(idxs->ffn_hidden_size(), 96);
  EXPECT_FALSE(idxs->tie_word_embeddings());
  EXPECT_EQ(idxs->conv_kernel_size(), 4);
  EXPECT_TRUE(idxs->conv_bias());
  // Neither: every layer attends (Lfm2Config.__post_init__). A multiplier of null skips the rounding.
  auto plain = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "block_ffn_dim_multiplier": null})"), "lfm2.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->layer_types(), Each(LAYER_FULL_ATTENTION));
  EXPECT_EQ(plain->ffn_hidden_size(), 200);
  auto bad = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "layer_types": ["conv", "linear_attention", "conv",
      "conv"]})"), "lfm2.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lfm2.json: layer_types: \"linear_attention\" is not modelled in lfm2; give "
                                        "a list of \"full_attention\" or \"conv\""),
            std::string::npos)
      << bad.status();
}

TEST(ModelSpecTest, Gemma4ReadsItsPerLayerShapesAndRefusesWhatItDoesNotModel) {
  const std::string shape = R"("model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  // Gemma4TextConfig.__post_init__: five sliding to one full, the last forced full, global_head_dim
  // (512) on the full ones; per-layer embeddings of 256; Gemma4RMSNorm and v_norm; scale 1.
  auto g = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "gemma4.json");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->layer_types(), ElementsAre(LAYER_SLIDING_ATTENTION, LAYER_SLIDING_ATTENTION, LAYER_SLIDING_ATTENTION,
                                            LAYER_SLIDING_ATTENTION, LAYER_SLIDING_ATTENTION, LAYER_FULL_ATTENTION,
                                            LAYER_FULL_ATTENTION));
  EXPECT_THAT(g->layer_head_dims(), ElementsAre(256, 256, 256, 256, 256, 512, 512));
  EXPECT_EQ(g->sliding_window(), 512);
  EXPECT_EQ(g->per_layer_input_size(), 256);
  EXPECT_TRUE(g->norm_pow_mean_square() && g->norm_weight_in_fp32() && !g->norm_unit_offset() && g->value_norm());
  EXPECT_EQ(g->attention_multiplier(), 1.0);
  EXPECT_EQ(g->ffn_type(), FFN_GEGLU);
  EXPECT_TRUE(g->tie_word_embeddings());
  // A saved config's per_layer_config (keys are layer indices) instead; no per-layer embeddings.
  auto saved = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "head_dim": 16, "hidden_size_per_layer_input": 0,
      "per_layer_config": {"05": {"head_dim": 32}, "6": {"head_dim": 32}}, "num_kv_shared_layers": 0})"),
                                     "gemma4.json");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_THAT(saved->layer_head_dims(), ElementsAre(16, 16, 16, 16, 16, 32, 32));
  EXPECT_EQ(saved->per_layer_input_size(), 0);
  // LoRA: without per-layer embeddings as any model; with them refused.
  EXPECT_TRUE(ApplyLoraConfig(R"({"r": 4, "target_modules": ["q_proj", "v_proj"]})", "adapter_config.json",
                              &*saved).ok());
  const absl::Status lora = ApplyLoraConfig(R"({"r": 4})", "adapter_config.json", &*g);
  EXPECT_NE(lora.message().find("model.lora: LoRA on \"gemma4_text\" with per-layer embeddings "
                                "(hidden_size_per_layer_input 256) is not modelled yet"),
            std::string::npos)
      << lora;
  for (const auto& [extra, message] : std::vector<std::pair<std::string, std::string>>{
           {R"("attention_k_eq_v": true)", "attention_k_eq_v: true is not modelled in gemma4_text"},
           {R"("num_kv_shared_layers": 2)", "num_kv_shared_layers: 2 is not modelled in gemma4_text"},
           {R"("enable_moe_block": true)", "enable_moe_block: true is not modelled in gemma4_text"},
           {R"("per_layer_config": {"5": {"num_key_value_heads": 1}})",
            "per_layer_config: layer 5's \"num_key_value_heads\" is not modelled"},
           {R"("per_layer_config": {"9": {"head_dim": 32}})", "per_layer_config: \"9\": expected a layer index below 7"},
           {R"("vocab_size_per_layer_input": 50)", "model.per_layer_input_vocab_size: 50"}}) {
    auto refused = ModelSpecFromHfConfig(absl::StrCat("{", shape, ", ", extra, "}"), "gemma4.json");
    ASSERT_FALSE(refused.ok()) << extra;
    EXPECT_NE(refused.status().message().find(message), std::string::npos) << refused.status();
  }
}

TEST(ModelSpecTest, GraniteMoeHybridPlansItsDenseAttentionModelsOnly) {
  const std::string shape = R"("model_type": "granitemoehybrid", "hidden_size": 64, "shared_intermediate_size": 96,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 100, "residual_multiplier": 0.22, "logits_scaling": 8)";
  const std::string dense = R"(, "layer_types": ["attention", "attention"], "position_embedding_type": "rope",
      "num_local_experts": 0)";
  auto v = ModelSpecFromHfConfig(absl::StrCat("{", shape, dense, "}"), "granite4.json");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->ffn_hidden_size(), 96) << "shared_mlp's width";
  EXPECT_TRUE(v->fused_gate_up_projection()) << "input_linear [h -> 2f]";
  EXPECT_FALSE(v->mlp_bias());
  EXPECT_TRUE(v->layer_types().empty()) << "every layer attends";
  EXPECT_DOUBLE_EQ(v->residual_multiplier(), 0.22);
  EXPECT_DOUBLE_EQ(v->logits_scaling(), 8);
  // What GraniteMoeHybridConfig builds beyond that is refused by its key.
  for (const auto& [config, message] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "layer_types": ["attention", "mamba"], "position_embedding_type": "rope", "num_local_experts": 0)",
            "layer_types: \"mamba\" is not modelled in granitemoehybrid"},
           {R"(, "position_embedding_type": "rope", "num_local_experts": 0)",
            "layer_types: absent: every layer is a Mamba-2 layer"},
           {R"(, "layer_types": ["attention", "attention"], "num_local_experts": 0)",
            "position_embedding_type: null (absent): layers without positions are not modelled"},
           {R"(, "layer_types": ["attention", "attention"], "position_embedding_type": "rope")",
            "num_local_experts: 8 (absent): mixture-of-experts models are not supported"}}) {
    auto refused = ModelSpecFromHfConfig(absl::StrCat("{", shape, config, "}"), "granite4.json");
    ASSERT_FALSE(refused.ok()) << config;
    EXPECT_NE(refused.status().message().find("granite4.json: " + message), std::string::npos) << refused.status();
  }
}

TEST(ModelSpecTest, SmolLm3LeavesRopeOutOfEveryFourthLayer) {
  const std::string shape = R"("model_type": "smollm3", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "smollm3.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->rope_layers(), ElementsAre(true, true, true, false));
  EXPECT_TRUE(spec->tie_word_embeddings()) << "SmolLM3Config ties by default";
  EXPECT_TRUE(spec->layer_types().empty());
  auto given = ModelSpecFromHfConfig(absl::StrCat(R"({"no_rope_layers": [0, 1, 0, 1], "mlp_bias": true, )", shape,
                                                  "}"), "smollm3.json");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_THAT(given->rope_layers(), ElementsAre(false, true, false, true));
  EXPECT_TRUE(given->mlp_bias());
  for (const char* bad : {R"("no_rope_layers": [1, 1], )", R"("no_rope_layers": [1, 1, 2, 1], )",
                          R"("use_sliding_window": true, "sliding_window": 64, )"}) {
    auto refused = ModelSpecFromHfConfig(absl::StrCat("{", bad, shape, "}"), "smollm3.json");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("smollm3.json: "), std::string::npos) << refused.status();
  }
  // Other families have no such list.
  auto llama = ModelSpecFromHfConfig(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "no_rope_layers": [0, 0]})", "llama.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_TRUE(llama->rope_layers().empty());
}

// Glm4: a norm before and after each half, q/k/v biases by default and none
// on o_proj, one gate_up_proj, RoPE over half of each 128-wide head, interleaved.
TEST(ModelSpecTest, Glm4SandwichesItsHalvesAndRotatesHalfOfEachHead) {
  auto spec = ModelSpecFromHfConfig(R"({"model_type": "glm4", "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100})", "glm4.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->norm_placement(), NORM_PLACEMENT_PRE_AND_POST);
  EXPECT_EQ(spec->head_dim(), 128) << "Glm4Config's head_dim, not hidden / heads";
  EXPECT_EQ(spec->rotary_dim(), 64);
  EXPECT_TRUE(spec->rope_interleaved() && spec->rope_concatenates() && spec->fused_gate_up_projection());
  EXPECT_TRUE(spec->attention_qkv_bias());
  EXPECT_FALSE(spec->attention_out_bias() || spec->mlp_bias() || spec->fused_qkv_projection());
  auto whole = ModelSpecFromHfConfig(R"({"model_type": "glm4", "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 64, "vocab_size": 100, "attention_bias": false,
      "partial_rotary_factor": 1.0})", "glm4.json");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->rotary_dim(), 0);
  EXPECT_FALSE(whole->attention_qkv_bias());
}

TEST(ModelSpecTest, Phi3FusesItsProjectionsAndReadsItsWindow) {
  const std::string shape = R"("model_type": "phi3", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "sliding_window": 2047, "resid_pdrop": 0.1})"),
                                    "phi3.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->fused_qkv_projection() && spec->fused_gate_up_projection() && spec->rope_concatenates());
  EXPECT_EQ(spec->sliding_window(), 2047);
  EXPECT_EQ(spec->residual_dropout(), 0.1);
  EXPECT_EQ(spec->attention_qkv_bias(), false) << "Phi3Attention's projections have no bias";
  auto unwindowed = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "sliding_window": null})"), "phi3.json");
  ASSERT_TRUE(unwindowed.ok()) << unwindowed.status();
  EXPECT_EQ(unwindowed->sliding_window(), 0);
  EXPECT_EQ(spec->rotary_dim(), 0) << "the whole head";
  // Partial RoPE (Phi-4-mini's 0.75), at the top level or in rope_parameters: int(head_dim x factor) dims.
  for (const auto& [partial, dims] : {std::pair{R"(, "partial_rotary_factor": 0.75)", 12},
                                      {R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})",
                                       8}}) {
    auto partly = ModelSpecFromHfConfig(absl::StrCat("{", shape, partial, "}"), "phi3.json");
    ASSERT_TRUE(partly.ok()) << partly.status();
    EXPECT_EQ(partly->rotary_dim(), dims) << partial;
    EXPECT_FALSE(partly->rope_interleaved());
  }
  // A factor that rotates an odd number of dims, or none, is refused by name.
  for (const char* bad : {R"(, "partial_rotary_factor": 0.3125)", R"(, "partial_rotary_factor": 0)"}) {
    auto refused = ModelSpecFromHfConfig(absl::StrCat("{", shape, bad, "}"), "phi3.json");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("phi3.json: partial_rotary_factor: "), std::string::npos)
        << refused.status();
  }
  // LoRA on the fused projections is refused, not planned as three.
  ModelSpec lora = *spec;
  lora.mutable_lora()->set_rank(8);
  lora.mutable_lora()->add_target_modules("qkv_proj");
  const absl::Status refused = ValidateModelSpec(lora);
  EXPECT_NE(refused.message().find("fused qkv_proj and gate_up_proj"), std::string::npos) << refused;
  // Llama's RoPE multiplies in place of concatenating; its projections are separate.
  auto llama = ModelSpecFromHfConfig(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "sliding_window": 16})", "llama.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_FALSE(llama->fused_qkv_projection() || llama->rope_concatenates());
}

TEST(ModelSpecTest, RejectsMixtureOfExperts) {
  absl::Status status = FromJson(
      R"({"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
          "intermediate_size": 4000, "vocab_size": 100, "num_local_experts": 8})");
  EXPECT_NE(status.message().find("mixture-of-experts"), std::string::npos) << status;
}

// Qwen3.5-MoE: every layer a mixture of experts with a gated shared expert,
// no dense MLP (its config has no intermediate_size), not a DeepSpeed leaf.
TEST(ModelSpecTest, Qwen3_5MoeHasExpertsInEveryLayer) {
  const std::string shape = R"("model_type": "qwen3_5_moe_text", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
      "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
      "linear_value_head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 48)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "mlp_only_layers": [0]})"), "qwen3_5_moe.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ffn_hidden_size(), 0);
  EXPECT_EQ(spec->moe().dense_layers_size(), 0) << "Qwen3_5MoeDecoderLayer ignores mlp_only_layers";
  EXPECT_EQ(spec->moe().shared_expert_ffn_hidden_size(), 48);
  EXPECT_TRUE(spec->moe().shared_expert_gate() && spec->moe().renormalize_top_k());
  EXPECT_FALSE(spec->moe().deepspeed_leaf());
  EXPECT_EQ(spec->layer_types(0), LAYER_LINEAR_ATTENTION);
  EXPECT_EQ(spec->layer_types(3), LAYER_FULL_ATTENTION);
  EXPECT_FALSE(spec->moe().router_aux_loss());
  auto aux = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "output_router_logits": true})"), "m.json");
  ASSERT_TRUE(aux.ok()) << aux.status();
  EXPECT_TRUE(aux->moe().router_aux_loss());
  EXPECT_EQ(aux->moe().router_aux_loss_coef(), 0.001) << "Qwen3_5MoeTextConfig's router_aux_loss_coef";
  const absl::Status nan = ModelSpecFromHfConfig(
      absl::StrCat("{", shape, R"(, "output_router_logits": true, "router_aux_loss_coef": "x"})"), "m.json").status();
  EXPECT_NE(nan.message().find("router_aux_loss_coef"), std::string::npos) << nan;
  // A dense model still needs its MLP's width.
  ModelSpec dense = *spec;
  dense.clear_moe();
  EXPECT_NE(ValidateModelSpec(dense).message().find("model.ffn_hidden_size"), std::string::npos);
}

TEST(ModelSpecTest, GraniteMoeSharedAddsAnUngatedSharedMlpAfterTheExperts) {
  const std::string shape = R"("model_type": "granitemoeshared", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 32, "num_local_experts": 4)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "shared_intermediate_size": 48})"), "gms.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->moe().shared_expert_ffn_hidden_size(), 48);
  EXPECT_TRUE(spec->moe().shared_expert_fused_after_experts());
  EXPECT_FALSE(spec->moe().shared_expert_gate()) << "GraniteMoeSharedMLP has no gate";
  EXPECT_TRUE(spec->moe().router_top_k_then_softmax()) << "GraniteMoeSharedTopKRouter";
  EXPECT_FALSE(RecomputeStopsInExperts(*spec, 0)) << "the shared_mlp after the experts saves";
  // Its parameters: the router, the experts, then shared_mlp's input_linear [h -> 2 x 48] and output_linear.
  std::vector<std::string> mlp;
  for (const TensorSpec& t : ParameterInventory(*spec)) {
    if (absl::StartsWith(t.name(), "layers.0.mlp.")) mlp.push_back(absl::StrCat(t.name(), " ", NumElements(t)));
  }
  EXPECT_THAT(mlp, testing::ElementsAre("layers.0.mlp.gate.weight 256", "layers.0.mlp.experts.gate_up_proj 16384",
                                        "layers.0.mlp.experts.down_proj 8192",
                                        "layers.0.mlp.shared_expert.gate_up_proj.weight 6144",
                                        "layers.0.mlp.shared_expert.down_proj.weight 3072"));
  // GraniteMoeSharedConfig's shared_intermediate_size is 0: GraniteMoe's layers.
  auto plain = ModelSpecFromHfConfig(absl::StrCat("{", shape, "}"), "gms.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->moe().shared_expert_ffn_hidden_size(), 0);
  EXPECT_FALSE(plain->moe().shared_expert_fused_after_experts());
  EXPECT_TRUE(RecomputeStopsInExperts(*plain, 0));
  const absl::Status negative =
      ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "shared_intermediate_size": -1})"), "gms.json").status();
  EXPECT_NE(negative.message().find("shared_intermediate_size"), std::string::npos) << negative;
}

// DeepseekV3Config: latent attention (its heads nope + rope wide, RoPE over
// the rope part), dense layers below first_k_dense_replace, the sigmoid
// router over n_group groups, n_shared_experts shared experts after the
// experts, norm_topk_prob true by default.
TEST(ModelSpecTest, DeepseekV3ReadsLatentAttentionGroupsAndSharedExperts) {
  const std::string shape = R"("model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3,
      "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 96, "moe_intermediate_size": 16,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2, "n_group": 4, "topk_group": 2,
      "first_k_dense_replace": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 12,
      "qk_rope_head_dim": 8, "v_head_dim": 10, "head_dim": 8)";
  auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "q_lora_rank": 24})"), "ds.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->head_dim(), 20) << "nope + rope; the config's head_dim is RoPE's";
  EXPECT_EQ(spec->rotary_dim(), 8);
  EXPECT_EQ(spec->num_kv_heads(), 4);
  EXPECT_EQ(spec->latent_attention().v_head_dim(), 10);
  EXPECT_TRUE(spec->latent_attention().rope_interleave()) << "DeepseekV3Config's default";
  EXPECT_THAT(spec->moe().dense_layers(), testing::ElementsAre(true, false, false));
  EXPECT_EQ(spec->moe().shared_expert_ffn_hidden_size(), 32) << "2 experts of 16";
  EXPECT_TRUE(spec->moe().shared_expert_after_experts());
  EXPECT_FALSE(spec->moe().shared_expert_gate());
  EXPECT_TRUE(spec->moe().renormalize_top_k()) << "norm_topk_prob defaults to true";
  EXPECT_TRUE(spec->moe().routing_weights_fp32());
  EXPECT_EQ(spec->moe().router_groups(), 4);
  std::vector<std::string> layer1;
  for (const TensorSpec& t : ParameterInventory(*spec)) {
    if (absl::StartsWith(t.name(), "layers.1.attn.") || absl::StartsWith(t.name(), "layers.1.mlp.")) {
      layer1.push_back(absl::StrCat(t.name(), " ", NumElements(t)));
    }
  }
  EXPECT_THAT(layer1, testing::ElementsAre(
                          "layers.1.attn.q_a_proj.weight 1536", "layers.1.attn.q_a_layernorm.weight 24",
                          "layers.1.attn.q_b_proj.weight 1920", "layers.1.attn.kv_a_proj_with_mqa.weight 1536",
                          "layers.1.attn.kv_a_layernorm.weight 16", "layers.1.attn.kv_b_proj.weight 1408",
                          "layers.1.attn.o_proj.weight 2560", "layers.1.mlp.experts.gate_up_proj 16384",
                          "layers.1.mlp.experts.down_proj 8192", "layers.1.mlp.gate.weight 512",
                          "layers.1.mlp.shared_expert.gate_proj.weight 2048",
                          "layers.1.mlp.shared_expert.up_proj.weight 2048",
                          "layers.1.mlp.shared_expert.down_proj.weight 2048"));
  // q_lora_rank null: one q_proj [h -> heads x 20].
  auto direct = ModelSpecFromHfConfig(absl::StrCat("{", shape, R"(, "q_lora_rank": null})"), "ds.json");
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->latent_attention().q_lora_rank(), 0);
  for (const auto& [given, bad, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"("n_group": 4)", R"("n_group": 3)",
            "n_group: 3: must divide n_routed_experts (8) into groups of at least 2 experts"},
           {R"("topk_group": 2)", R"("topk_group": 5)", "topk_group: 5: must be between 1 and n_group (4)"},
           {R"("head_dim": 8)", R"("num_key_value_heads": 2)",
            "num_key_value_heads: 2: latent attention expands k and v to every head"},
           {R"("qk_rope_head_dim": 8)", R"("qk_rope_head_dim": 7)", "qk_rope_head_dim: must be a positive even width"},
           {R"("v_head_dim": 10)", R"("v_head_dim": 0)", "v_head_dim: must be a positive width"}}) {
    const absl::Status refused =
        ModelSpecFromHfConfig(absl::StrCat("{", absl::StrReplaceAll(shape, {{given, bad}}), "}"), "ds.json").status();
    EXPECT_NE(refused.message().find(message), std::string::npos) << bad << ": " << refused;
  }
}

// A model_type without a family (model_family.h) is refused: the message
// names the field, the value, the supported types and the flag that plans it
// anyway. First-generation "qwen" is one of them.
TEST(ModelSpecTest, RefusesModelTypesWithoutAFamily) {
  for (const char* type : {"bert", "gemma", "phi", "qwen", "glm", "starcoder2"}) {
    const absl::Status status = FromJson(absl::StrCat(R"({"model_type": ")", type, R"(", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})"));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << type;
    EXPECT_EQ(std::string(status.message()),
              absl::StrCat("config.json: model_type: \"", type, "\" is not supported; zplan plans llama, mistral, "
                           "qwen2, qwen3, granite, granitemoehybrid, phi3, olmo2, olmo3, smollm3, glm4, gemma3_text, gemma2, gemma4_text, lfm2, qwen3_5_text, qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3, gpt2, vit. Planning it as one of those is an unvalidated approximation: to "
                           "accept that, add --approximate-as FAMILY (e.g. --approximate-as llama)"));
  }
  const absl::Status missing = FromJson(R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 100})");
  EXPECT_NE(missing.message().find("config.json: model_type: missing; zplan plans llama, mistral"),
            std::string::npos) << missing;
}

constexpr char kStarcoder2[] = R"({"model_type": "starcoder2", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
    "vocab_size": 100, "hidden_act": "gelu", "attention_bias": false})";

TEST(ModelSpecTest, ApproximateAsPlansAnUnsupportedTypeAndSaysSo) {
  auto spec = ModelSpecFromHfConfig(kStarcoder2, "starcoder2.json", "llama");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model_type(), "starcoder2");
  EXPECT_EQ(spec->unvalidated_approximation(),
            "model_type \"starcoder2\" planned as llama: an unvalidated approximation, nothing about \"starcoder2\" was "
            "checked");
  EXPECT_EQ(ModelOriginLine(*spec), spec->unvalidated_approximation());
  // Llama's family: untied by default, gated MLP (the activation it does not model planned as SiLU).
  EXPECT_FALSE(spec->tie_word_embeddings());
  EXPECT_EQ(spec->ffn_type(), FFN_SWIGLU);
  EXPECT_EQ(spec->source(), "Hugging Face config starcoder2.json (model_type \"starcoder2\", planned as llama; hidden_act "
                            "\"gelu\" planned as silu)");
  EXPECT_TRUE(ValidateModelSpec(*spec).ok());
  // The plan's spec without its note is refused (zrun reads plans through ValidateModelSpec).
  ModelSpec unmarked = *spec;
  unmarked.clear_unvalidated_approximation();
  const absl::Status status = ValidateModelSpec(unmarked);
  EXPECT_NE(status.message().find("model.model_type: \"starcoder2\" is not supported (zplan plans llama, mistral, qwen2, "
                                  "qwen3, granite, granitemoehybrid, phi3, olmo2, olmo3, smollm3, glm4, gemma3_text, gemma2, gemma4_text, lfm2, qwen3_5_text, qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3, gpt2, vit)"),
            std::string::npos)
      << status;
  // A supported type is planned as itself; a family must exist.
  const absl::Status own = ModelSpecFromHfConfig(R"({"model_type": "qwen2"})", "qwen2.json", "llama").status();
  EXPECT_NE(own.message().find("--approximate-as: qwen2.json is model_type \"qwen2\", which zplan plans as itself"),
            std::string::npos)
      << own;
  const absl::Status unknown = ModelSpecFromHfConfig(kStarcoder2, "starcoder2.json", "gemma").status();
  EXPECT_NE(unknown.message().find("--approximate-as: \"gemma\" is not a model family; use one of llama, "),
            std::string::npos)
      << unknown;
  // Without the flag, the same config is refused; MoE stays refused with it.
  EXPECT_NE(FromJson(kStarcoder2).message().find("model_type: \"starcoder2\" is not supported"), std::string::npos);
  const absl::Status moe = ModelSpecFromHfConfig(R"({"model_type": "deepseek_v2", "n_routed_experts": 8})", "m.json",
                                                 "mistral").status();
  EXPECT_NE(moe.message().find("n_routed_experts: a mixture of experts of model_type \"deepseek_v2\" is not "
                               "modelled; zplan plans the mixture-of-experts types qwen3_5_moe_text, qwen3_moe, mixtral, "
                               "qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3"),
            std::string::npos)
      << moe;
}

TEST(ModelSpecTest, EverySpecSaysItsModelTypeOrWhereItCameFrom) {
  auto llama = LoadHfConfig("configs/hf/llama3-8b.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model_type(), "llama");
  EXPECT_EQ(ModelOriginLine(*llama), "");
  auto preset = LoadPreset("qwen3-0.6b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->model_type(), "qwen3");
  auto qwen1 = LoadPreset("qwen-14b");
  ASSERT_TRUE(qwen1.ok());
  EXPECT_EQ(qwen1->model_type(), "qwen");
  EXPECT_EQ(ModelOriginLine(*qwen1),
            "model_type \"qwen\" planned as qwen2: an unvalidated approximation, nothing about \"qwen\" was checked");
  auto params = ModelSpecForParams(7'500'000'000);
  ASSERT_TRUE(params.ok());
  EXPECT_EQ(params->model_type(), "");
  EXPECT_EQ(ModelOriginLine(*params).rfind("model: standard shape for --params 7500000000: GPT-3-style blocks", 0),
            0u)
      << ModelOriginLine(*params);
}

// Each family's own quirks, read from its config class's keys only.
TEST(ModelSpecTest, BiasesFollowEachFamilysModelingFile) {
  const std::string dims = R"("hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 100, "attention_bias": true, "mlp_bias": true)";
  auto read = [&](const std::string& type) { return SpecFromJson("{\"model_type\": \"" + type + "\", " + dims + "}"); };
  auto llama = read("llama");  // attention_bias covers o_proj; mlp_bias the MLP
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_TRUE(llama->attention_qkv_bias() && llama->attention_out_bias() && llama->mlp_bias());
  auto mistral = read("mistral");  // MistralAttention and MistralMLP: bias=False, keys ignored
  ASSERT_TRUE(mistral.ok());
  EXPECT_FALSE(mistral->attention_qkv_bias() || mistral->attention_out_bias() || mistral->mlp_bias());
  auto qwen2 = read("qwen2");  // q, k, v always biased, o_proj never
  ASSERT_TRUE(qwen2.ok());
  EXPECT_TRUE(qwen2->attention_qkv_bias());
  EXPECT_FALSE(qwen2->attention_out_bias() || qwen2->mlp_bias());
  auto qwen3 = read("qwen3");  // attention_bias on q, k, v and o; head_dim 128 by default
  ASSERT_TRUE(qwen3.ok());
  EXPECT_TRUE(qwen3->attention_qkv_bias() && qwen3->attention_out_bias());
  EXPECT_FALSE(qwen3->mlp_bias());
  EXPECT_EQ(qwen3->head_dim(), 128);
  const absl::Status gelu = FromJson(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "hidden_act": "gelu"})");
  EXPECT_NE(gelu.message().find("hidden_act: \"gelu\" is not modelled in llama's MLP; use \"silu\", \"swish\" or \"gelu_pytorch_tanh\""),
            std::string::npos)
      << gelu;
}

TEST(ModelSpecTest, MissingHfConfigIsNotFound) {
  EXPECT_EQ(LoadHfConfig("no/such/config.json").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelSpecTest, ParamsShapeIsWithinOneWidthOfRequest) {
  for (int64_t params : {int64_t{125'000'000}, int64_t{1'500'000'000}, int64_t{7'500'000'000},
                         int64_t{128'000'000'000}}) {
    auto spec = ModelSpecForParams(params);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const int64_t count = CountParameters(*spec);
    EXPECT_LE(count, params);
    EXPECT_LT(params - count, spec->hidden_size()) << spec->source();
    EXPECT_GE(spec->vocab_size(), kMinVocabForParams);
    EXPECT_TRUE(ValidateModelSpec(*spec).ok());
  }
}

TEST(ModelSpecTest, ParamsTooSmallIsRejected) {
  EXPECT_EQ(ModelSpecForParams(1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelSpecForParams(-5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelSpecTest, EveryPresetValidates) {
  for (const std::string& name : PresetNames()) {
    auto spec = LoadPreset(name);
    EXPECT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_FALSE(spec->source().empty()) << name;
  }
}

}  // namespace
}  // namespace zplan

namespace zplan {
namespace {

TEST(ModelSpecTest, TrainingFlopsPerTokenIsPalmsFormula) {
  auto spec = LoadPreset("llama3-8b");
  ASSERT_TRUE(spec.ok());
  // Llama-3-8B: per layer q, o 4096^2, k, v 4096 x 1024, gate/up/down 4096 x 14336; head 128256 x 4096.
  const double per_layer = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336;
  const double weights = 32 * per_layer + 128256.0 * 4096;
  const double attention = 12.0 * 32 * 32 * 128 * 8192;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*spec, 8192), 6 * weights + attention);
  EXPECT_NEAR(TrainingFlopsPerToken(*spec, 8192) / 1e9, 57.9, 0.1);
}

// LoRA: PEFT's adapter_config.json. debug-tiny (4 blocks, h 256, q 8 x 32,
// kv 4 x 32) with r 8 on q and v adds per block q: A 8x256 + B 256x8 and v:
// A 8x256 + B 128x8 = 7,168 elements, right after each adapted weight.
TEST(ModelSpecTest, LoraConfigAddsAdaptersAndFreezesTheRest) {
  auto spec = LoadPreset("debug-tiny");
  ASSERT_TRUE(spec.ok());
  const int64_t base = CountParameters(*spec);
  ASSERT_TRUE(ApplyLoraConfig(R"({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16,
                                  "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none",
                                  "modules_to_save": null, "rank_pattern": {}, "fan_in_fan_out": false})",
                              "adapter_config.json", &*spec)
                  .ok());
  EXPECT_EQ(spec->lora().rank(), 8);
  EXPECT_EQ(spec->lora().alpha(), 16);
  const std::vector<TensorSpec> params = ParameterInventory(*spec);
  EXPECT_EQ(CountParameters(*spec), base + 4 * 7168);
  int64_t trainable = 0;
  for (const TensorSpec& t : TrainableParameters(params)) {
    EXPECT_TRUE(IsLoraAdapter(t)) << t.name();
    trainable += NumElements(t);
  }
  EXPECT_EQ(trainable, 4 * 7168);
  // PEFT's module order: the base weight, then lora_A [r, in], then lora_B [out, r].
  int q = 0;
  while (params[q].name() != "layers.0.attn.q_proj.weight") ++q;
  EXPECT_TRUE(params[q].frozen());
  EXPECT_EQ(params[q + 1].name(), "layers.0.attn.q_proj.lora_A.weight");
  EXPECT_EQ(params[q + 1].shape(1), 256);
  EXPECT_EQ(params[q + 2].name(), "layers.0.attn.q_proj.lora_B.weight");
  EXPECT_EQ(params[q + 2].shape(0), 256);
  EXPECT_EQ(params[q + 3].name(), "layers.0.attn.k_proj.weight");
}

TEST(ModelSpecTest, LoraDefaultsAndAllLinear) {
  auto spec = LoadPreset("debug-tiny");
  ASSERT_TRUE(ApplyLoraConfig("{}", "adapter_config.json", &*spec).ok());
  EXPECT_EQ(spec->lora().rank(), kPeftDefaultLoraRank);
  EXPECT_EQ(absl::StrJoin(spec->lora().target_modules(), ","), "q_proj,v_proj");
  ASSERT_TRUE(ApplyLoraConfig(R"({"target_modules": "all-linear"})", "adapter_config.json", &*spec).ok());
  EXPECT_EQ(absl::StrJoin(spec->lora().target_modules(), ","), "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}

TEST(ModelSpecTest, LoraRejectsWhatIsNotModelledByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"peft_type": "IA3"})", "peft_type"},
      {R"({"use_dora": true})", "use_dora"},
      {R"({"bias": "all"})", "bias"},
      {R"({"modules_to_save": ["score"]})", "modules_to_save"},
      {R"({"modules_to_save": ["lm_head", "lm_head"]})", "modules_to_save"},
      {R"({"modules_to_save": "lm_head"})", "modules_to_save"},
      {R"({"rank_pattern": {"q_proj": 16}})", "rank_pattern"},
      {R"({"layers_to_transform": [0, 1]})", "layers_to_transform"},
      {R"({"target_modules": ".*q_proj"})", "target_modules"},
      {R"({"target_modules": ["c_attn"]})", "target_modules"},
      {R"({"target_modules": ["q_proj", "q_proj"]})", "target_modules"},
      {R"({"target_modules": []})", "target_modules"},
      {R"({"target_modules": [3]})", "target_modules"},
      {R"({"r": 0})", "rank"},
      {R"({"r": 100000})", "rank"},
      {R"({"lora_dropout": 1.5})", "dropout"},
      {R"({"r": "8"})", "r"},
  };
  for (const auto& [json, field] : cases) {
    auto spec = LoadPreset("debug-tiny");
    const absl::Status status = ApplyLoraConfig(json, "adapter_config.json", &*spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_NE(status.message().find(field), std::string::npos) << json << ": " << status.message();
    EXPECT_NE(status.message().find("adapter_config.json"), std::string::npos) << status.message();
  }
  // gate_proj exists only in SwiGLU blocks; GPT-2's head is tied.
  auto gpt2 = LoadPreset("gpt2");
  EXPECT_FALSE(ApplyLoraConfig(R"({"target_modules": ["gate_proj"]})", "a.json", &*gpt2).ok());
  const absl::Status tied = ApplyLoraConfig(R"({"modules_to_save": ["lm_head"]})", "a.json", &*gpt2);
  EXPECT_NE(tied.message().find("tied"), std::string::npos) << tied.message();
}

// modules_to_save ["lm_head"]: peft's wrapper keeps the frozen original and
// trains a copy, both [vocab, h] where the head was (debug-tiny: 2048 x 256).
TEST(ModelSpecTest, ModulesToSaveTrainsACopyOfTheHeadBesideItsFrozenOriginal) {
  auto spec = LoadPreset("debug-tiny");
  ASSERT_TRUE(spec.ok());
  const int64_t base = CountParameters(*spec);
  ASSERT_TRUE(ApplyLoraConfig(R"({"modules_to_save": ["lm_head"]})", "adapter_config.json", &*spec).ok());
  EXPECT_EQ(CountParameters(*spec), base + 4 * 7168 + 2048 * 256);
  const std::vector<TensorSpec> params = ParameterInventory(*spec);
  const TensorSpec& original = params[params.size() - 2];
  const TensorSpec& copy = params.back();
  EXPECT_EQ(original.name(), "lm_head.original_module.weight");
  EXPECT_TRUE(original.frozen());
  EXPECT_TRUE(IsUnusedOriginal(original.name()));
  EXPECT_EQ(copy.name(), "lm_head.modules_to_save.default.weight");
  EXPECT_EQ(LmHeadWeightName(*spec), copy.name());
  EXPECT_FALSE(copy.frozen());
  EXPECT_EQ(NumElements(copy), 2048 * 256);
  EXPECT_FALSE(RunsBackward(*spec, original, {}));
  EXPECT_TRUE(RunsBackward(*spec, copy, {}));
  int64_t trainable = 0;
  for (const TensorSpec& t : TrainableParameters(params)) trainable += NumElements(t);
  EXPECT_EQ(trainable, 4 * 7168 + 2048 * 256);
  // The head now keeps the final norm's output for its weight gradient.
  auto plain = LoadPreset("debug-tiny");
  ASSERT_TRUE(ApplyLoraConfig("{}", "adapter_config.json", &*plain).ok());
  auto bytes = [](const std::vector<TensorSpec>& saved) {
    int64_t sum = 0;
    for (const TensorSpec& t : saved) sum += TensorBytes(t);
    return sum;
  };
  EXPECT_EQ(bytes(FinalNormSavedActivations(*spec, 2, 16, DTYPE_BF16, KernelDevice::kCpu)),
            bytes(FinalNormSavedActivations(*plain, 2, 16, DTYPE_BF16, KernelDevice::kCpu)) + 2 * 16 * 256 * 2);
}

// modules_to_save ["embed_tokens"]: the copy comes first, after its frozen
// original; its output requires grad, so block 0 keeps what the others keep.
TEST(ModelSpecTest, ModulesToSaveEmbeddingMakesBlockZeroKeepWhatOthersKeep) {
  auto spec = LoadPreset("debug-tiny");
  ASSERT_TRUE(ApplyLoraConfig(R"({"modules_to_save": ["embed_tokens", "lm_head"]})", "a.json", &*spec).ok());
  const std::vector<TensorSpec> params = ParameterInventory(*spec);
  EXPECT_EQ(params[0].name(), "embed_tokens.original_module.weight");
  EXPECT_TRUE(params[0].frozen());
  EXPECT_EQ(params[1].name(), EmbeddingWeightName(*spec));
  EXPECT_EQ(params[1].name(), "embed_tokens.modules_to_save.default.weight");
  EXPECT_FALSE(params[1].frozen());
  EXPECT_FALSE(RunsBackward(*spec, params[0], {}));
  EXPECT_TRUE(RunsBackward(*spec, params[1], {}));
  EXPECT_TRUE(EmbeddingOutputRequiresGrad(*spec, {}));
  auto bytes = [&](const ModelSpec& m, int layer) {
    int64_t sum = 0;
    for (const TensorSpec& t : BlockSavedActivations(m, 2, 16, DTYPE_BF16, layer, KernelDevice::kCpu)) {
      sum += TensorBytes(t);
    }
    return sum;
  };
  EXPECT_EQ(bytes(*spec, 0), bytes(*spec, 1));
  auto head_only = LoadPreset("debug-tiny");
  ASSERT_TRUE(ApplyLoraConfig(R"({"modules_to_save": ["lm_head"]})", "a.json", &*head_only).ok());
  EXPECT_LT(bytes(*head_only, 0), bytes(*head_only, 1));
}

}  // namespace
}  // namespace zplan
