#include "executor/transformer.h"

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/counting_allocator.h"
#include "gtest/gtest.h"
#include "planner/block_layout.h"
#include "planner/inventory.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/run_config.h"

namespace zplan {
namespace {

struct Batch {
  at::Tensor ids, targets;  // a ViT: images and labels
};

Batch MakeBatch(const ModelSpec& spec, int64_t b, int64_t s) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t vocab = std::max<int64_t>(spec.vocab_size(), 1);
  at::Tensor tokens = at::randint(vocab, {b, s + 1}, gen, at::TensorOptions().dtype(at::kLong));
  return {tokens.narrow(1, 0, s).contiguous(), tokens.narrow(1, 1, s).contiguous()};
}

TEST(TransformerTest, ParametersMatchTheInventory) {
  for (const char* name : {"debug-tiny", "gpt2", "qwen3-0.6b"}) {
    auto spec = LoadPreset(name);
    ASSERT_TRUE(spec.ok());
    if (std::string(name) != "debug-tiny") continue;  // keep the test small; names are shared code
    auto model = Transformer::Create(*spec, at::kFloat, 1, at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(model->CheckAgainstInventory(ParameterInventory(*spec)).ok());
    auto wrong = ParameterInventory(*spec);
    wrong[3].set_shape(0, 7);
    EXPECT_EQ(model->CheckAgainstInventory(wrong).code(), absl::StatusCode::kFailedPrecondition);
  }
}

// The loss of `batch` near `expected_loss` at initialisation, a gradient for
// every parameter, and the same loss and gradients when every block, or
// every 2nd (blocks 0, 2, ... recomputed, the rest not), is checkpointed.
// With dropout the recomputation must replay the forward's masks.
void ExpectCheckpointingMatches(Transformer& model, const Batch& batch, double expected_loss,
                                const std::string& what) {
  at::manual_seed(11);
  at::Tensor loss = model.Loss(batch.ids, batch.targets, {});
  EXPECT_NEAR(loss.item<double>(), expected_loss, 0.3) << what;
  loss.backward();
  std::vector<at::Tensor> grads;
  for (auto& [name, p] : model.mutable_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << what << " " << name;
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0) << what << " " << name;
    grads.push_back(p.grad().clone());
    p.mutable_grad() = at::Tensor();
  }
  // torch's checkpoint, and DeepSpeed's with partitioned (copied) inputs,
  // in contiguous buffers too (one spare).
  DeepSpeedCheckpointing partitioned, contiguous;
  partitioned.set_enabled(true);
  partitioned.set_partition_activations(true);
  contiguous = partitioned;
  contiguous.set_contiguous_memory_optimization(true);
  contiguous.set_number_checkpoints(model.spec().num_layers() + 1);
  for (const Checkpointing& checkpointing : {Checkpointing{1}, Checkpointing{2}, Checkpointing{1, false, partitioned},
                                             Checkpointing{2, false, contiguous}}) {
    const std::string with = absl::StrCat(what, " every ", checkpointing.every, checkpointing.deepspeed.DebugString());
    at::manual_seed(11);
    at::Tensor loss_ckpt = model.Loss(batch.ids, batch.targets, checkpointing);
    EXPECT_DOUBLE_EQ(loss_ckpt.item<double>(), loss.item<double>()) << with;
    loss_ckpt.backward();
    size_t i = 0;
    for (auto& [name, p] : model.mutable_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << with << " " << name;
      EXPECT_TRUE(at::allclose(p.grad(), grads[i++], 1e-5, 1e-6)) << with << " " << name;
      p.mutable_grad() = at::Tensor();
    }
    EXPECT_TRUE(checkpointing.contiguous_buffers.empty()) << with << ": the buffers outlived the backward";
  }
}

// What DeepSpeed's checkpoint keeps after the forward, measured: a copy of
// each checkpointed input in place of the input (partition_activations),
// and in contiguous buffers all number_checkpoints of them, spare ones too.
TEST(TransformerTest, DeepSpeedCheckpointKeepsCopiesAndContiguousBuffers) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  auto spec = LoadPreset("debug-tiny");
  spec->set_num_layers(3);
  auto model = Transformer::Create(*spec, at::kBFloat16, 1, at::kCPU);
  ASSERT_TRUE(model.ok());
  const int64_t b = 2, s = 64, block_input = b * s * spec->hidden_size() * 2;
  const Batch batch = MakeBatch(*spec, b, s);
  auto kept_after_forward = [&](const Checkpointing& checkpointing) {
    const int64_t before = GetCpuMemoryStats().current_bytes;
    at::Tensor loss = model->Loss(batch.ids, batch.targets, checkpointing);
    const int64_t kept = GetCpuMemoryStats().current_bytes - before;
    loss.backward();
    for (auto& [name, p] : model->mutable_parameters()) p.mutable_grad() = at::Tensor();
    return kept;
  };
  DeepSpeedCheckpointing ds;
  ds.set_enabled(true);
  ds.set_partition_activations(true);
  const int64_t torch_kept = kept_after_forward(Checkpointing{2});
  EXPECT_EQ(kept_after_forward(Checkpointing{2, false, ds}), torch_kept);
  ds.set_contiguous_memory_optimization(true);
  ds.set_number_checkpoints(5);  // blocks 0 and 2 checkpointed: three spare
  EXPECT_EQ(kept_after_forward(Checkpointing{2, false, ds}), torch_kept + 3 * block_input);
}

TEST(TransformerTest, LossIsNearLogVocabAtInitAndCheckpointingMatches) {
  for (const double dropout : {0.0, 0.2}) {
    auto spec = LoadPreset("debug-tiny");
    spec->set_attention_dropout(dropout);
    spec->set_residual_dropout(dropout);
    spec->set_embedding_dropout(dropout);
    auto model = Transformer::Create(*spec, at::kFloat, 1, at::kCPU);
    ASSERT_TRUE(model.ok());
    ExpectCheckpointingMatches(*model, MakeBatch(*spec, 2, 32), std::log(2048.0),
                               absl::StrCat("dropout ", dropout));
  }
}

// Mixtures of experts with the auxiliary loss, checkpointed: the router
// logits pass through the checkpoint and their gradient into the recompute
// (which stops in the experts: past Mixtral's fp32 pairs, Granite's
// residual multiplier and GPT-OSS's biases too), or the router would train differently.
TEST(TransformerTest, MoeAuxiliaryLossCheckpointingMatches) {
  const std::string shape = R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 128, "num_experts_per_tok": 2, "output_router_logits": true,
      "router_aux_loss_coef": 0.5)";
  for (const std::string& config :
       {absl::StrCat(R"({"model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 32, )", shape, "}"),
        absl::StrCat(R"({"model_type": "mixtral", "num_local_experts": 8, "intermediate_size": 32, )", shape, "}"),
        absl::StrCat(R"({"model_type": "granitemoe", "num_local_experts": 8, "intermediate_size": 32,
                         "residual_multiplier": 0.5, )", shape, "}"),
        // GraniteMoeShared: its shared_mlp after the experts, recomputed past them.
        absl::StrCat(R"({"model_type": "granitemoeshared", "num_local_experts": 8, "intermediate_size": 32,
                         "shared_intermediate_size": 48, "residual_multiplier": 0.5, )", shape, "}"),
        // GPT-OSS: eager attention with sinks over a sliding and a full layer, its biased experts.
        absl::StrCat(R"({"model_type": "gpt_oss", "num_local_experts": 8, "intermediate_size": 32, "head_dim": 16,
                         "sliding_window": 16, )", shape, "}")}) {
    auto spec = ModelSpecFromHfConfig(config, "moe.json");
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_TRUE(spec->moe().router_aux_loss());
    auto model = Transformer::Create(*spec, at::kFloat, 1, at::kCPU);
    ASSERT_TRUE(model.ok());
    // The cross-entropy near log(vocab), the auxiliary loss 0.5 x about k (load_balancing_loss_func
    // counts the k assignments per token: balanced routing gives k).
    ExpectCheckpointingMatches(*model, MakeBatch(*spec, 2, 32), std::log(128.0) + 0.5 * 2, spec->model_type());
  }
}

// transformers' eager experts (a loop over the experts hit) compute what
// grouped_mm does, and their checkpointed backward, whose recompute stops
// at the MoE's terms (RecomputeStopsAtMoeTerms: the loop's output, Qwen2-MoE's
// unmade gate product, GraniteMoeShared's unmade shared down projection),
// gives the same gradients.
TEST(TransformerTest, EagerExpertsMatchGroupedMmAndCheckpointing) {
  const std::string shape = R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 128, "num_experts_per_tok": 2)";
  for (const std::string& config :
       {absl::StrCat(R"({"model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 32, )", shape),
        absl::StrCat(R"({"model_type": "mixtral", "num_local_experts": 8, "intermediate_size": 32, )", shape),
        absl::StrCat(R"({"model_type": "qwen2_moe", "num_experts": 8, "moe_intermediate_size": 32,
                         "shared_expert_intermediate_size": 48, )", shape),
        absl::StrCat(R"({"model_type": "granitemoeshared", "num_local_experts": 8, "intermediate_size": 32,
                         "shared_intermediate_size": 48, "residual_multiplier": 0.5, )", shape)}) {
    auto grouped_spec = ModelSpecFromHfConfig(config + "}", "moe.json");
    auto eager_spec = ModelSpecFromHfConfig(config + R"(, "_experts_implementation": "eager"})", "moe.json");
    ASSERT_TRUE(grouped_spec.ok()) << grouped_spec.status();
    ASSERT_TRUE(eager_spec.ok()) << eager_spec.status();
    ASSERT_EQ(eager_spec->moe().experts_impl(), EXPERTS_EAGER);
    auto grouped = Transformer::Create(*grouped_spec, at::kFloat, 1, at::kCPU);
    auto eager = Transformer::Create(*eager_spec, at::kFloat, 1, at::kCPU);
    ASSERT_TRUE(grouped.ok() && eager.ok());
    const Batch batch = MakeBatch(*eager_spec, 2, 32);
    at::Tensor grouped_loss = grouped->Loss(batch.ids, batch.targets, {});
    at::Tensor eager_loss = eager->Loss(batch.ids, batch.targets, {});
    EXPECT_NEAR(eager_loss.item<double>(), grouped_loss.item<double>(), 1e-5) << eager_spec->model_type();
    grouped_loss.backward();
    eager_loss.backward();
    for (size_t i = 0; i < eager->parameters().size(); ++i) {
      const auto& [name, p] = eager->mutable_parameters()[i];
      EXPECT_TRUE(at::allclose(p.grad(), grouped->mutable_parameters()[i].second.grad(), 1e-4, 1e-6))
          << eager_spec->model_type() << " " << name;
      p.mutable_grad() = at::Tensor();
    }
    ExpectCheckpointingMatches(*eager, batch, std::log(128.0), eager_spec->model_type());
  }
}

// DeepSeek-V3, small: latent attention with q_a_proj and interleaved RoPE
// (layer 0 dense), and with one q_proj and RoPE over halves; the sigmoid
// router over groups and two shared experts after the experts.
TEST(TransformerTest, DeepseekV3TrainsAndCheckpointingMatches) {
  const std::string shape = R"("model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 128, "intermediate_size": 96, "moe_intermediate_size": 16,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2, "n_group": 4, "topk_group": 2,
      "first_k_dense_replace": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 12, "qk_rope_head_dim": 8,
      "v_head_dim": 10)";
  // In bf16 the fp32 pair weights' product has its own backward in a recompute (RecomputedPairWeighting).
  for (const auto& [variant, dtype] : std::vector<std::pair<std::string, at::ScalarType>>{
           {R"("q_lora_rank": 24)", at::kFloat},
           {R"("q_lora_rank": 24)", at::kBFloat16},
           {R"("q_lora_rank": null, "rope_interleave": false)", at::kFloat}}) {
    auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, ", ", variant, "}"), "deepseek.json");
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto model = Transformer::Create(*spec, dtype, 1, at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectCheckpointingMatches(*model, MakeBatch(*spec, 2, 32), std::log(128.0),
                               absl::StrCat(variant, " ", c10::toString(dtype)));
  }
}

// transformers' ViTForImageClassification, small: 4x4 patches of 16x16
// images (17 tokens), 5 labels, dropout at every site.
constexpr char kVitConfig[] = R"({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "intermediate_size": 128, "image_size": 16, "patch_size": 4, "num_labels": 5,
  "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1})";

Batch MakeImages(const ModelSpec& spec, int64_t b) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const VisionSpec& v = spec.vision();
  return {at::randn({b, v.num_channels(), v.image_size(), v.image_size()}, gen),
          at::randint(v.num_labels(), {b}, gen, at::TensorOptions().dtype(at::kLong))};
}

TEST(TransformerTest, VitTrainsEveryParameterAndCheckpointingMatches) {
  auto spec = ModelSpecFromHfConfig(kVitConfig, "vit.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Transformer::Create(*spec, at::kFloat, 1, at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->CheckAgainstInventory(ParameterInventory(*spec)).ok());
  EXPECT_TRUE(model->CheckAttentionKernel(VisionTokens(*spec)).ok());
  ExpectCheckpointingMatches(*model, MakeImages(*spec, 4), std::log(5.0), "ViT");  // the CLS token and positions too
}

// A tiny llava: a CLIP tower of three blocks over 28 px images (16 patches
// and the CLS row), features from block 1's output, a two-block Llama.
constexpr char kLlavaConfig[] = R"({"model_type": "llava",
  "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 2, "patch_size": 7, "image_size": 28, "hidden_act": "quick_gelu"},
  "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": false},
  "image_token_index": 200, "projector_hidden_act": "gelu", "vision_feature_select_strategy": "default",
  "vision_feature_layer": -2, "tie_word_embeddings": false})";

// llava trains what a gradient reaches: every parameter but the tower's last
// block and post_layernorm (past the selected features), none of a frozen
// tower's; checkpointing every block gives the same loss and gradients.
TEST(TransformerTest, LlavaTrainsWhatReachesTheLoss) {
  auto spec = ModelSpecFromHfConfig(kLlavaConfig, "llava.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const int64_t b = 2, s = 40, images = 16;  // one image per sequence: 16 image tokens
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(200, {b, s}, gen, at::TensorOptions().dtype(at::kLong));
  ids.narrow(1, 0, images).fill_(200);
  const at::Tensor targets = at::randint(200, {b, s}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor pixels = at::randn({b, 3, 28, 28}, gen);
  for (bool frozen_tower : {false, true}) {
    spec->mutable_vision_language()->set_freeze_vision_tower(frozen_tower);
    auto model = Transformer::Create(*spec, at::kFloat, 1, at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(model->CheckAgainstInventory(ParameterInventory(*spec)).ok());
    EXPECT_TRUE(model->CheckAttentionKernel(s).ok());
    std::vector<at::Tensor> grads;
    for (const Checkpointing& checkpointing : {Checkpointing{}, Checkpointing{1}}) {
      const std::string with = absl::StrCat(frozen_tower ? "frozen tower" : "", " every ", checkpointing.every);
      at::Tensor loss = model->Loss(ids, targets, checkpointing, {}, {pixels, {}});
      EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.3) << with;
      loss.backward();
      size_t i = 0;
      for (auto& [name, p] : model->mutable_parameters()) {
        const bool tower = absl::StartsWith(name, "vision_tower.");
        const bool reached = !(tower && (frozen_tower || absl::StartsWith(name, "vision_tower.layers.2.") ||
                                         absl::StrContains(name, kTowerPooledNorm)));
        EXPECT_EQ(p.grad().defined(), reached) << with << " " << name;
        if (!p.grad().defined()) continue;
        if (checkpointing.every == 0) {
          grads.push_back(p.grad().clone());
        } else {
          EXPECT_TRUE(at::allclose(p.grad(), grads[i++], 1e-5, 1e-6)) << with << " " << name;
        }
        p.mutable_grad() = at::Tensor();
      }
    }
  }
}

// A tiny Qwen2.5-VL: two tower blocks (block 1 over whole images, block 0
// within windows of 4 x 4 patches), its merger, a Qwen2 language model.
constexpr char kQwen2_5VlConfig[] = R"({"model_type": "qwen2_5_vl",
  "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "patch_size": 14,
    "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56, "fullatt_block_indexes": [1],
    "out_hidden_size": 64},
  "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": false},
  "vision_start_token_id": 201, "vision_end_token_id": 202, "image_token_id": 200, "video_token_id": 203})";

// Qwen3.5 with its tower (Qwen3-VL's without deepstack: the learned
// position table interpolated to each image, LayerNorm blocks attending over
// whole images) before a language model of one linear-attention layer and
// one full-attention layer.
constexpr char kQwen3_5VlConfig[] = R"({"model_type": "qwen3_5",
  "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "patch_size": 14,
    "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16, "out_hidden_size": 64},
  "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "vocab_size": 256,
    "layer_types": ["linear_attention", "full_attention"], "tie_word_embeddings": false},
  "image_token_id": 200, "video_token_id": 201, "vision_start_token_id": 202, "vision_end_token_id": 203,
  "tie_word_embeddings": false})";

// Qwen3-VL: Qwen3.5's tower with block 0's output through a deepstack
// merger, added to the language model's first layer's image tokens.
constexpr char kQwen3VlConfig[] = R"({"model_type": "qwen3_vl",
  "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "patch_size": 14,
    "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16, "out_hidden_size": 64,
    "deepstack_visual_indexes": [0]},
  "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "tie_word_embeddings": false},
  "image_token_id": 200, "video_token_id": 201, "vision_start_token_id": 202, "vision_end_token_id": 203,
  "tie_word_embeddings": false})";

// A Qwen tower at 168 px (Qwen2.5-VL: 6 x 6 merged rows in windows of 2 x 2;
// Qwen3.5 and Qwen3-VL: the 4 x 4 position table resampled to 12 x 12 patches) gives every
// parameter a gradient, and the same loss and gradients with every block
// checkpointed (the recomputation attends over the same runs of patches).
class QwenTowerTest : public testing::TestWithParam<const char*> {};

TEST_P(QwenTowerTest, TrainsEveryParameterAndCheckpointingMatches) {
  auto spec = ModelSpecFromHfConfig(GetParam(), "config.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Transformer::Create(*spec, at::kFloat, 1, at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->CheckAgainstInventory(ParameterInventory(*spec)).ok());
  EXPECT_TRUE(model->CheckAttentionKernel(64).ok());
  const int64_t b = 2, s = 20, side = 12, tokens = side * side / 4;  // 168 px: 12 x 12 patches, 36 image tokens
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(200, {b, s + tokens}, gen, at::TensorOptions().dtype(at::kLong));
  ids.narrow(1, 0, tokens).fill_(200);
  const at::Tensor targets = at::randint(200, {b, s + tokens}, gen, at::TensorOptions().dtype(at::kLong));
  const ImageInputs images{at::randn({b * side * side, 3 * 2 * 14 * 14}, gen),
                           at::tensor(std::vector<int64_t>{1, side, side}, at::TensorOptions().dtype(at::kLong))
                               .repeat({b, 1})};
  std::vector<at::Tensor> grads;
  for (const Checkpointing& checkpointing : {Checkpointing{}, Checkpointing{1}}) {
    at::Tensor loss = model->Loss(ids, targets, checkpointing, {}, images);
    EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.3);
    loss.backward();
    size_t i = 0;
    for (auto& [name, p] : model->mutable_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << checkpointing.every << " " << name;
      if (checkpointing.every == 0) {
        grads.push_back(p.grad().clone());
      } else {
        EXPECT_TRUE(at::allclose(p.grad(), grads[i++], 1e-5, 1e-6)) << name;
      }
      p.mutable_grad() = at::Tensor();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Towers, QwenTowerTest, testing::Values(kQwen2_5VlConfig, kQwen3_5VlConfig, kQwen3VlConfig));

// Records the order in which AccumulateGrad finishes each parameter's
// gradient: the moments DeepSpeed's (and zrun's) gradient hooks run.
class HookOrder : public torch::autograd::FunctionPostHook {
 public:
  HookOrder(std::vector<std::string>* order, std::string name) : order_(order), name_(std::move(name)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    order_->push_back(name_);
    return outputs;
  }

 private:
  std::vector<std::string>* order_;
  std::string name_;
};

// The blocks' and the head's hooks fire in the order torch's own modules
// give DeepSpeed: reverse parameter order (as the planner assumes:
// zero_buckets.cc, FirstReductionPartByRank), so a linear's bias before its
// weight, but a LayerNorm's weight before its bias (native_layer_norm_backward
// makes both; AccumulateGrad takes them in output order). The order decides
// whether a weight gradient larger than a bucket is still waiting when its
// bias's reduction makes the gradient partition. (The embeddings run ATen's
// own ops in zrun too.)
TEST(TransformerTest, GradientHooksFireInTheOrderOfTorchModules) {
  auto vit = ModelSpecFromHfConfig(kVitConfig, "vit.json");
  ASSERT_TRUE(vit.ok()) << vit.status();
  auto gpt2 = LoadPreset("gpt2");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  gpt2->set_num_layers(2);
  gpt2->set_hidden_size(64);
  gpt2->set_num_attention_heads(4);
  gpt2->set_num_kv_heads(4);
  gpt2->set_head_dim(16);
  gpt2->set_ffn_hidden_size(256);
  gpt2->set_vocab_size(128);
  for (const auto& [spec, batch] : {std::pair{*vit, MakeImages(*vit, 2)}, std::pair{*gpt2, MakeBatch(*gpt2, 2, 8)}}) {
    auto model = Transformer::Create(spec, at::kFloat, 1, at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    auto in_blocks_or_head = [](const std::string& name) { return name.rfind("embed", 0) != 0; };
    std::vector<std::string> order, expected;
    std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
    for (auto it = model->parameters().rbegin(); it != model->parameters().rend(); ++it) {
      const std::string& name = it->first;
      if (!in_blocks_or_head(name)) continue;
      accumulators.push_back(torch::autograd::impl::grad_accumulator(it->second));
      accumulators.back()->add_post_hook(std::make_unique<HookOrder>(&order, name));
      const bool after_its_bias = absl::StrContains(name, "norm.weight") && !expected.empty();
      expected.insert(after_its_bias ? expected.end() - 1 : expected.end(), name);
    }
    for (const Checkpointing& checkpointing : {Checkpointing{}, Checkpointing{.every = 1}}) {
      order.clear();
      model->Loss(batch.ids, batch.targets, checkpointing).backward();
      EXPECT_EQ(absl::StrJoin(order, " "), absl::StrJoin(expected, " "))
          << spec.name() << (checkpointing.every > 0 ? ", checkpointed" : "");
    }
  }
}

TEST(TransformerTest, AttentionKernelMustBeThePlannedOne) {
  auto spec = LoadPreset("debug-tiny");
  auto model = Transformer::Create(*spec, at::kBFloat16, 1, at::kCPU);
  ASSERT_TRUE(model.ok());
  EXPECT_TRUE(model->CheckAttentionKernel(128).ok());
  // With attention dropout the CPU runs (and the plan counts) the math path.
  spec->set_attention_dropout(0.1);
  auto dropout = Transformer::Create(*spec, at::kBFloat16, 1, at::kCPU);
  EXPECT_TRUE(dropout->CheckAttentionKernel(128).ok());
  // A math fallback the plan does not count fails before step 0.
  at::globalContext().setSDPUseFlash(false);
  const absl::Status status = model->CheckAttentionKernel(128);
  at::globalContext().setSDPUseFlash(true);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("math path would materialize"), std::string::npos) << status;
}

// What forward keeps alive until backward, measured exactly, beside the
// planner's inventory: blocks' saved tensors + final norm + fp32 log-probs.
// LoRA cases (planner/inventory.h): frozen base layers, block 0 keeping
// less, and at ZeRO-3 under zero.Init (SavePolicy) every linear keeping its
// input and fp32 adapters.
TEST(TransformerTest, SavedActivationsMatchThePlannerInventory) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  struct Case {
    std::string preset;
    AttentionImpl attention;
    at::ScalarType dtype;
    FfnType ffn = FFN_TYPE_UNSPECIFIED;  // the preset's
    double dropout = 0;                  // at every site
    const char* lora = nullptr;          // a PEFT adapter_config.json
    bool zero3_init = false;             // SavePolicyFor a ZeRO-3 zero.Init run
    bool short_conv = false;             // layer 0 an LFM2 short conv, layer 1 attention with q/k norms
  };
  constexpr char kQv[] = R"({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})";
  constexpr char kAll[] = R"({"r": 4, "lora_dropout": 0.1, "target_modules": "all-linear"})";
  constexpr char kMlp[] = R"({"r": 4, "target_modules": ["up_proj", "down_proj"]})";
  constexpr char kHead[] = R"({"r": 8, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]})";
  constexpr char kEmbed[] = R"({"r": 4, "target_modules": ["up_proj"], "modules_to_save": ["embed_tokens"]})";
  for (const Case& c : std::vector<Case>{{"debug-tiny", ATTENTION_SDPA, at::kFloat},
                                         {"debug-tiny", ATTENTION_EAGER, at::kFloat},
                                         {"debug-tiny", ATTENTION_EAGER, at::kBFloat16},
                                         {"qwen3-0.6b", ATTENTION_SDPA, at::kBFloat16},
                                         {"gpt2", ATTENTION_SDPA, at::kFloat},
                                         {"gpt2", ATTENTION_SDPA, at::kBFloat16, FFN_GELU_NEW},
                                         // CPU dropout: noise masks, SDPA's fp32 math path.
                                         {"gpt2", ATTENTION_SDPA, at::kBFloat16, FFN_GELU_NEW, 0.1},
                                         {"debug-tiny", ATTENTION_SDPA, at::kFloat, FFN_TYPE_UNSPECIFIED, 0.1},
                                         {"debug-tiny", ATTENTION_EAGER, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0.1},
                                         {"gpt2", ATTENTION_EAGER, at::kFloat, FFN_TYPE_UNSPECIFIED, 0.1},
                                         // GPT-2's eager softmax in the working dtype.
                                         {"gpt2", ATTENTION_EAGER, at::kBFloat16},
                                         // LoRA.
                                         {"debug-tiny", ATTENTION_SDPA, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, kQv},
                                         {"debug-tiny", ATTENTION_EAGER, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, kQv},
                                         {"qwen3-0.6b", ATTENTION_SDPA, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, kAll},
                                         {"gpt2", ATTENTION_EAGER, at::kFloat, FFN_TYPE_UNSPECIFIED, 0, kMlp},
                                         // The LM head's trainable copy keeps the final norm's output.
                                         {"debug-tiny", ATTENTION_SDPA, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, kHead},
                                         // The embedding's copy trains: block 0 keeps what the others keep.
                                         {"debug-tiny", ATTENTION_EAGER, at::kFloat, FFN_TYPE_UNSPECIFIED, 0.1, kEmbed},
                                         {"debug-tiny", ATTENTION_SDPA, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, kQv, true},
                                         {"debug-tiny", ATTENTION_SDPA, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, kAll,
                                          true},
                                         // LFM2's conv layers, trained and with adapters on in_proj, out_proj.
                                         {"debug-tiny", ATTENTION_SDPA, at::kBFloat16, FFN_TYPE_UNSPECIFIED, 0, nullptr,
                                          false, true},
                                         {"debug-tiny", ATTENTION_EAGER, at::kFloat, FFN_TYPE_UNSPECIFIED, 0, kAll,
                                          false, true}}) {
    auto spec = LoadPreset(c.preset);
    if (c.ffn != FFN_TYPE_UNSPECIFIED) spec->set_ffn_type(c.ffn);
    spec->set_attention_impl(c.attention);
    spec->set_num_layers(2);
    spec->set_attention_dropout(c.dropout);
    spec->set_residual_dropout(c.dropout);
    spec->set_embedding_dropout(c.dropout);
    if (c.short_conv) {
      spec->add_layer_types(LAYER_CONV);
      spec->add_layer_types(LAYER_FULL_ATTENTION);
      spec->set_conv_kernel_size(3);
      spec->set_short_conv_impl(SHORT_CONV_TORCH);
      spec->set_qk_norm(true);
    }
    if (c.lora != nullptr) {
      ASSERT_TRUE(ApplyLoraConfig(c.lora, "adapter_config.json", &*spec).ok());
    }
    RunConfig config;
    if (c.zero3_init) config.mutable_zero()->set_stage(3);
    const SavePolicy saves = SavePolicyFor(ResolveRunConfig(config));
    auto model = Transformer::Create(*spec, c.dtype, 1, at::kCPU, /*materialize=*/true, saves);
    const int64_t b = 2, s = 64, w = c.dtype == at::kFloat ? 4 : 2;
    const DType dtype = c.dtype == at::kFloat ? DTYPE_FP32 : DTYPE_BF16;
    const Batch batch = MakeBatch(*spec, b, s);
    const int64_t before = GetCpuMemoryStats().current_bytes;
    at::Tensor loss = model->Loss(batch.ids, batch.targets, {});
    const int64_t kept = GetCpuMemoryStats().current_bytes - before;
    int64_t planned = 0;
    for (int layer = 0; layer < spec->num_layers(); ++layer) {
      for (const TensorSpec& t : BlockSavedActivations(*spec, b, s, dtype, layer, KernelDevice::kCpu, saves)) {
        planned += TensorBytes(t);
      }
    }
    for (const TensorSpec& t : FinalNormSavedActivations(*spec, b, s, dtype, KernelDevice::kCpu, saves)) planned += TensorBytes(t);
    for (const TensorSpec& t : EmbeddingSavedActivations(*spec, b, s, dtype, KernelDevice::kCpu)) {
      planned += TensorBytes(t);
    }
    planned += b * s * spec->vocab_size() * 4;                               // log-softmax output
    if (spec->position_embedding() == POSITION_ROPE) planned += 2 * s * spec->head_dim() * w;  // cos, sin
    std::printf("%s attention %d dtype %s dropout %.1f lora %s%s%s: kept %lld bytes, planner %lld (%.2f%%)\n",
                c.preset.c_str(), c.attention, c10::toString(c.dtype), c.dropout, c.lora ? c.lora : "-",
                c.zero3_init ? " zero3-init" : "", c.short_conv ? " short-conv" : "", static_cast<long long>(kept),
                static_cast<long long>(planned),
                100.0 * (kept - planned) / planned);
    // The rest is the loss scalar and nll's total weight.
    EXPECT_NEAR(static_cast<double>(kept) / planned, 1.0, 0.001);
  }
}

// What the planner's inventory has a language model's step save on CPU
// ranks: every block's tensors, the final norm's and the embedding's.
int64_t InventorySavedBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype, const SavePolicy& saves) {
  int64_t bytes = 0;
  for (int layer = 0; layer < spec.num_layers(); ++layer) {
    for (const TensorSpec& t : BlockSavedActivations(spec, b, s, dtype, layer, KernelDevice::kCpu, saves)) {
      bytes += TensorBytes(t);
    }
  }
  for (const TensorSpec& t : FinalNormSavedActivations(spec, b, s, dtype, KernelDevice::kCpu, saves)) {
    bytes += TensorBytes(t);
  }
  for (const TensorSpec& t : EmbeddingSavedActivations(spec, b, s, dtype, KernelDevice::kCpu)) bytes += TensorBytes(t);
  return bytes;
}

// The same for DeepSeek-V3's latent attention (the math path; flash with
// heads of one width) and its MoE layer, in bf16 and fp32.
TEST(TransformerTest, DeepseekV3SavedActivationsMatchThePlannerInventory) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  const std::string shape = R"("model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 128, "intermediate_size": 96, "moe_intermediate_size": 16,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2, "n_group": 4, "topk_group": 2,
      "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8)";
  for (const auto& [heads, dtype] : std::vector<std::pair<std::string, at::ScalarType>>{
           {R"("qk_nope_head_dim": 12, "v_head_dim": 10)", at::kBFloat16},
           {R"("qk_nope_head_dim": 12, "v_head_dim": 10)", at::kFloat},
           {R"("qk_nope_head_dim": 8, "v_head_dim": 16)", at::kBFloat16}}) {
    auto spec = ModelSpecFromHfConfig(absl::StrCat("{", shape, ", ", heads, "}"), "deepseek.json");
    ASSERT_TRUE(spec.ok()) << spec.status();
    const SavePolicy saves = SavePolicyFor(ResolveRunConfig(RunConfig()));
    auto model = Transformer::Create(*spec, dtype, 1, at::kCPU, /*materialize=*/true, saves);
    ASSERT_TRUE(model.ok()) << model.status();
    const int64_t b = 2, s = 64, w = dtype == at::kFloat ? 4 : 2;
    const DType planned_dtype = dtype == at::kFloat ? DTYPE_FP32 : DTYPE_BF16;
    const Batch batch = MakeBatch(*spec, b, s);
    const int64_t before = GetCpuMemoryStats().current_bytes;
    at::Tensor loss = model->Loss(batch.ids, batch.targets, {});
    const int64_t kept = GetCpuMemoryStats().current_bytes - before;
    // The log-softmax, cos and sin; the rest is the loss scalar and nll's total weight.
    const int64_t planned = b * s * spec->vocab_size() * 4 + 2 * s * RotaryDims(*spec) * w +
                            InventorySavedBytes(*spec, b, s, planned_dtype, saves);
    EXPECT_NEAR(static_cast<double>(kept) / planned, 1.0, 0.001) << heads << " " << c10::toString(dtype) << ": kept "
                                                                 << kept << ", planned " << planned;
  }
}

// The same for a ViT: the pixels' working-dtype cast, the blocks, the final
// norm's whole output (the classifier reads its CLS view) and the
// log-softmax of [b, labels] in the logits' dtype.
TEST(TransformerTest, VitSavedActivationsMatchThePlannerInventory) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  struct Case {
    AttentionImpl attention;
    at::ScalarType dtype;
    double dropout;
  };
  for (const Case& c : std::vector<Case>{{ATTENTION_SDPA, at::kFloat, 0},
                                         {ATTENTION_SDPA, at::kBFloat16, 0},
                                         {ATTENTION_EAGER, at::kBFloat16, 0},
                                         {ATTENTION_EAGER, at::kFloat, 0.1},
                                         {ATTENTION_SDPA, at::kBFloat16, 0.1}}) {
    auto spec = ModelSpecFromHfConfig(kVitConfig, "vit.json");
    spec->set_attention_impl(c.attention);
    spec->set_attention_dropout(c.dropout);
    spec->set_residual_dropout(c.dropout);
    spec->set_embedding_dropout(c.dropout);
    auto model = Transformer::Create(*spec, c.dtype, 1, at::kCPU);
    const int64_t b = 4, s = VisionTokens(*spec), w = c.dtype == at::kFloat ? 4 : 2;
    const DType dtype = c.dtype == at::kFloat ? DTYPE_FP32 : DTYPE_BF16;
    const Batch batch = MakeImages(*spec, b);
    const int64_t before = GetCpuMemoryStats().current_bytes;
    at::Tensor loss = model->Loss(batch.ids, batch.targets, {});
    const int64_t kept = GetCpuMemoryStats().current_bytes - before;
    int64_t planned = b * spec->vision().num_labels() * w;  // log-softmax output
    for (int layer = 0; layer < spec->num_layers(); ++layer) {
      for (const TensorSpec& t : BlockSavedActivations(*spec, b, s, dtype, layer, KernelDevice::kCpu, {})) {
        planned += TensorBytes(t);
      }
    }
    for (const TensorSpec& t : FinalNormSavedActivations(*spec, b, s, dtype, KernelDevice::kCpu)) planned += TensorBytes(t);
    for (const TensorSpec& t : EmbeddingSavedActivations(*spec, b, s, dtype, KernelDevice::kCpu)) {
      planned += TensorBytes(t);
    }
    std::printf("ViT attention %d dtype %s dropout %.1f: kept %lld bytes, planner %lld (%.2f%%)\n", c.attention,
                c10::toString(c.dtype), c.dropout, static_cast<long long>(kept), static_cast<long long>(planned),
                100.0 * (kept - planned) / planned);
    EXPECT_NEAR(static_cast<double>(kept) / planned, 1.0, 0.001);
  }
}

// Gemma 4's dense text model: Gemma4RMSNorm everywhere, v_norm, a full
// layer of heads wider than 256 (SDPA repeats k and v), the per-layer
// embeddings (the model's [b, s, layers, p] inputs and each block's third
// half); RoPE tables one pair per layer type, each its heads' width.
TEST(TransformerTest, Gemma4SavedActivationsMatchThePlannerInventory) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  constexpr char kGemma4[] = R"({"model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "global_head_dim": 288, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128,
      "vocab_size": 128, "sliding_window": 128})";
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    auto spec = ModelSpecFromHfConfig(kGemma4, "gemma4.json");
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_EQ(HeadDimOf(*spec, 2), 288);
    auto model = Transformer::Create(*spec, dtype, 1, at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE(model->CheckAgainstInventory(ParameterInventory(*spec)).ok());
    const int64_t b = 2, s = 64, w = dtype == at::kFloat ? 4 : 2;
    const DType planned_dtype = dtype == at::kFloat ? DTYPE_FP32 : DTYPE_BF16;
    const Batch batch = MakeBatch(*spec, b, s);
    const int64_t before = GetCpuMemoryStats().current_bytes;
    at::Tensor loss = model->Loss(batch.ids, batch.targets, {});
    const int64_t kept = GetCpuMemoryStats().current_bytes - before;
    int64_t planned = b * s * spec->vocab_size() * 4 + 2 * s * (16 + 288) * w;  // log-softmax; two RoPE pairs
    // Each norm's multiply keeps its weight's fp32 copy (a cast in bf16), which the planner leaves out.
    for (const auto& [name, param] : model->parameters()) {
      if (dtype != at::kFloat && absl::StrContains(name, "norm")) planned += param.numel() * 4;
    }
    planned += InventorySavedBytes(*spec, b, s, planned_dtype, {});
    std::printf("gemma4_text %s: kept %lld bytes, planner %lld (%.2f%%)\n", c10::toString(dtype),
                static_cast<long long>(kept), static_cast<long long>(planned), 100.0 * (kept - planned) / planned);
    EXPECT_NEAR(static_cast<double>(kept) / planned, 1.0, 0.001);
    loss.backward();
    for (const auto& [name, param] : model->parameters()) EXPECT_TRUE(param.grad().defined()) << name;
  }
}

}  // namespace
}  // namespace zplan
