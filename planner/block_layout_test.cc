#include "planner/block_layout.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"

namespace zplan {
namespace {

using ::testing::ElementsAre;

// A small GQA decoder: 64 wide, 4 heads of 16, 2 kv heads, FFN 128.
ModelSpec Decoder() {
  ModelSpec spec;
  spec.set_num_layers(2);
  spec.set_hidden_size(64);
  spec.set_num_attention_heads(4);
  spec.set_num_kv_heads(2);
  spec.set_ffn_hidden_size(128);
  spec.set_vocab_size(100);
  return ResolveModelSpec(spec);
}

std::vector<std::string> Ops(const ModelSpec& spec, int layer = 1) {
  std::vector<std::string> ops;
  for (const BlockOp& op : BlockLayout(spec, layer)) {
    static const char* const kNames[] = {"norm",       "qkv",          "qk_norm",      "attention", "o_proj",
                                         "resid_drop", "resid_scale", "residual_add", "mlp",       "short_conv",
                                         "gated_delta_net"};
    ops.push_back(std::string(kNames[static_cast<int>(op.kind)]) + (op.module.empty() ? "" : ":" + op.module));
  }
  return ops;
}

TEST(BlockLayoutTest, LlamaRunsTwoPreNormHalves) {
  EXPECT_THAT(Ops(Decoder()), ElementsAre("norm:attn_norm", "qkv:attn", "attention:attn", "o_proj:attn",
                                          "residual_add", "norm:mlp_norm", "mlp:mlp", "residual_add"));
}

TEST(BlockLayoutTest, QkNormAndResidualDropoutAreOps) {
  ModelSpec spec = Decoder();
  spec.set_qk_norm(true);
  spec.set_residual_dropout(0.1);
  EXPECT_THAT(Ops(spec), ElementsAre("norm:attn_norm", "qkv:attn", "qk_norm:attn", "attention:attn", "o_proj:attn",
                                     "resid_drop:attn", "residual_add", "norm:mlp_norm", "mlp:mlp", "resid_drop:mlp",
                                     "residual_add"));
}

// GraniteDecoderLayer: residual + output x residual_multiplier in each half.
TEST(BlockLayoutTest, GraniteScalesEachHalfBeforeItsAdd) {
  ModelSpec spec = Decoder();
  spec.set_residual_multiplier(0.22);
  EXPECT_THAT(Ops(spec), ElementsAre("norm:attn_norm", "qkv:attn", "attention:attn", "o_proj:attn",
                                     "resid_scale:attn", "residual_add", "norm:mlp_norm", "mlp:mlp",
                                     "resid_scale:mlp", "residual_add"));
}

// Qwen3.5: a linear attention layer runs its Gated DeltaNet (transformers' parameter order: its own dt_bias and
// A_log, the conv, the gated norm, out_proj, then the input projections); a full layer's q_proj also makes the gate.
TEST(BlockLayoutTest, LinearAttentionLayersRunAGatedDeltaNet) {
  ModelSpec spec = Decoder();
  spec.add_layer_types(LAYER_LINEAR_ATTENTION);
  spec.add_layer_types(LAYER_FULL_ATTENTION);
  spec.set_conv_kernel_size(4);
  spec.set_linear_num_key_heads(2);
  spec.set_linear_num_value_heads(4);
  spec.set_linear_key_head_dim(8);
  spec.set_linear_value_head_dim(16);
  spec.set_attention_output_gate(true);
  EXPECT_THAT(Ops(spec, 0), ElementsAre("norm:attn_norm", "gated_delta_net:linear_attn", "residual_add",
                                        "norm:mlp_norm", "mlp:mlp", "residual_add"));
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const TensorSpec& t : BlockParameters(spec, 0)) {
    names.push_back(t.name());
    sizes.push_back(NumElements(t));
  }
  EXPECT_THAT(names, ElementsAre("layers.0.attn_norm.weight", "layers.0.linear_attn.dt_bias",
                                 "layers.0.linear_attn.A_log", "layers.0.linear_attn.conv1d.weight",
                                 "layers.0.linear_attn.norm.weight", "layers.0.linear_attn.out_proj.weight",
                                 "layers.0.linear_attn.in_proj_qkv.weight", "layers.0.linear_attn.in_proj_z.weight",
                                 "layers.0.linear_attn.in_proj_b.weight", "layers.0.linear_attn.in_proj_a.weight",
                                 "layers.0.mlp_norm.weight", "layers.0.mlp.gate_proj.weight",
                                 "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight"));
  // q and k over 2 heads of 8, v over 4 of 16: 96 conv channels.
  EXPECT_THAT(std::vector<int64_t>(sizes.begin() + 1, sizes.begin() + 10),
              ElementsAre(4, 4, 96 * 4, 16, 64 * 64, 96 * 64, 64 * 64, 4 * 64, 4 * 64));
  const std::vector<BlockLinear> q = OpLinears(spec, BlockLayout(spec, 1)[1]);
  EXPECT_EQ(q[0].out_features, 2 * spec.num_attention_heads() * spec.head_dim());
}

// LFM2: a conv layer runs its short conv where an attention layer attends; the MLP half is alike.
TEST(BlockLayoutTest, ConvLayersRunAShortConvWhereOthersAttend) {
  ModelSpec spec = Decoder();
  spec.add_layer_types(LAYER_FULL_ATTENTION);
  spec.add_layer_types(LAYER_CONV);
  spec.set_conv_kernel_size(3);
  EXPECT_THAT(Ops(spec, 0), ElementsAre("norm:attn_norm", "qkv:attn", "attention:attn", "o_proj:attn",
                                        "residual_add", "norm:mlp_norm", "mlp:mlp", "residual_add"));
  EXPECT_THAT(Ops(spec, 1), ElementsAre("norm:attn_norm", "short_conv:conv", "residual_add", "norm:mlp_norm",
                                        "mlp:mlp", "residual_add"));
  const std::vector<BlockOp> conv = BlockLayout(spec, 1);
  const std::vector<BlockLinear> linears = OpLinears(spec, conv[1]);
  ASSERT_EQ(linears.size(), 2u);
  EXPECT_EQ(linears[0].name, "in_proj");
  EXPECT_EQ(linears[0].out_features, 3 * 64);  // B, C and x
  EXPECT_EQ(linears[1].name, "out_proj");
  std::vector<std::string> names;
  for (const TensorSpec& t : BlockParameters(spec, 1)) names.push_back(t.name());
  EXPECT_THAT(names, ElementsAre("layers.1.attn_norm.weight", "layers.1.conv.in_proj.weight",
                                 "layers.1.conv.conv.weight", "layers.1.conv.out_proj.weight",
                                 "layers.1.mlp_norm.weight", "layers.1.mlp.gate_proj.weight",
                                 "layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight"));
  TensorSpec out_proj;
  out_proj.set_name("layers.1.conv.out_proj.weight");
  EXPECT_FALSE(InMlpHalf(conv, out_proj));
  TensorSpec bcx;
  bcx.set_name("layers.1.conv.bcx");
  EXPECT_FALSE(InHalfTail(conv, bcx));
}

TEST(BlockLayoutTest, LinearWidthsFollowTheHeads) {
  const ModelSpec spec = Decoder();
  const std::vector<BlockOp> ops = BlockLayout(spec, 1);
  const std::vector<BlockLinear> qkv = OpLinears(spec, ops[1]);
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_EQ(qkv[0].out_features, 64);  // 4 heads x 16
  EXPECT_EQ(qkv[1].out_features, 32);  // 2 kv heads x 16
  EXPECT_EQ(qkv[2].in_features, 64);
  const std::vector<BlockLinear> mlp = OpLinears(spec, ops[6]);
  ASSERT_EQ(mlp.size(), 3u);
  EXPECT_EQ(mlp[2].name, "down_proj");
  EXPECT_EQ(mlp[2].in_features, 128);
}

TEST(BlockLayoutTest, FusedProjectionsAreOneLinearEach) {
  ModelSpec spec = Decoder();
  spec.set_fused_qkv_projection(true);
  spec.set_fused_gate_up_projection(true);
  const std::vector<BlockOp> ops = BlockLayout(spec, 1);
  const std::vector<BlockLinear> qkv = OpLinears(spec, ops[1]);
  ASSERT_EQ(qkv.size(), 1u);
  EXPECT_EQ(qkv[0].name, kQkvProj);
  EXPECT_EQ(qkv[0].out_features, 64 + 2 * 32);  // q, k and v of Phi3Attention's qkv_proj
  const std::vector<BlockLinear> mlp = OpLinears(spec, ops[6]);
  ASSERT_EQ(mlp.size(), 2u);
  EXPECT_EQ(mlp[0].name, kGateUpProj);
  EXPECT_EQ(mlp[0].out_features, 2 * 128);
  absl::string_view rest;
  EXPECT_EQ(OpOfParameter(spec, ops, "layers.1.attn.qkv_proj.weight", &rest), 1);
  EXPECT_EQ(OpOfParameter(spec, ops, "layers.1.mlp.gate_up_proj.weight", &rest), 6);
}

// The inventory's block parameters are the layout's, op by op.
TEST(BlockLayoutTest, BlockParametersWalkTheLayout) {
  ModelSpec spec = Decoder();
  spec.set_qk_norm(true);
  std::vector<std::string> names;
  for (const TensorSpec& t : BlockParameters(spec, 1)) names.push_back(t.name());
  EXPECT_THAT(names, ElementsAre("layers.1.attn_norm.weight", "layers.1.attn.q_proj.weight",
                                 "layers.1.attn.k_proj.weight", "layers.1.attn.v_proj.weight",
                                 "layers.1.attn.q_norm.weight", "layers.1.attn.k_norm.weight",
                                 "layers.1.attn.o_proj.weight", "layers.1.mlp_norm.weight",
                                 "layers.1.mlp.gate_proj.weight", "layers.1.mlp.up_proj.weight",
                                 "layers.1.mlp.down_proj.weight"));
}

// What LoRA may target is the layout's linears: a GELU MLP has no gate_proj.
TEST(BlockLayoutTest, LoraTargetsAreTheLayoutsLinears) {
  ModelSpec spec = Decoder();
  EXPECT_THAT(LoraTargetNames(spec),
              ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"));
  spec.set_ffn_type(FFN_GELU);
  EXPECT_THAT(LoraTargetNames(spec), ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"));
}

TensorSpec Named(const std::string& name, DType dtype = DTYPE_FP32) {
  TensorSpec t;
  t.set_name(name);
  t.set_dtype(dtype);
  return t;
}

// The halves and down_proj are found through the layout, by module.
TEST(BlockLayoutTest, TensorsFindTheirOp) {
  const std::vector<BlockOp> layout = BlockLayout(Decoder(), 1);
  EXPECT_FALSE(InMlpHalf(layout, Named("layers.3.attn_norm.weight")));
  EXPECT_FALSE(InMlpHalf(layout, Named("layers.3.attn.o_proj.lora_A.weight")));
  EXPECT_TRUE(InMlpHalf(layout, Named("layers.3.mlp_norm.rstd")));
  EXPECT_TRUE(InMlpHalf(layout, Named("layers.3.mlp.up_proj.weight")));
  EXPECT_FALSE(InMlpHalf(layout, Named("final_norm.weight")));
  EXPECT_TRUE(IsDownProjTensor(layout, Named("layers.0.mlp.down_proj.bias")));
  EXPECT_TRUE(IsDownProjTensor(layout, Named("layers.0.mlp.down_proj.lora_B.weight")));
  EXPECT_FALSE(IsDownProjTensor(layout, Named("layers.0.mlp.up_proj.weight")));
  EXPECT_TRUE(IsBlockInputItself(layout, Named("layers.1.attn_norm.input_fp32"), DTYPE_FP32));
  EXPECT_FALSE(IsBlockInputItself(layout, Named("layers.1.attn_norm.input_fp32"), DTYPE_BF16));
  EXPECT_FALSE(IsBlockInputItself(layout, Named("layers.1.mlp_norm.input_fp32"), DTYPE_FP32));
}

// Olmo2DecoderLayer: no norm before either half, one after each (before the
// add); q/k/v and the MLP read the residual stream, which q_proj keeps.
TEST(BlockLayoutTest, PostNormBlocksNormalizeEachHalfsOutput) {
  ModelSpec spec = Decoder();
  spec.set_norm_placement(NORM_PLACEMENT_POST);
  spec.set_qk_norm(true);
  spec.set_qk_norm_over_projection(true);
  EXPECT_THAT(Ops(spec), ElementsAre("qkv:attn", "qk_norm:attn", "attention:attn", "o_proj:attn",
                                     "norm:attn_post_norm", "residual_add", "mlp:mlp", "norm:mlp_post_norm",
                                     "residual_add"));
  std::vector<std::string> shapes;
  for (const TensorSpec& t : BlockParameters(spec, 0)) {
    if (t.name().find("_norm") != std::string::npos) shapes.push_back(t.name() + " " + std::to_string(t.shape(0)));
  }
  EXPECT_THAT(shapes, ElementsAre("layers.0.attn.q_norm.weight 64", "layers.0.attn.k_norm.weight 32",
                                  "layers.0.attn_post_norm.weight 64", "layers.0.mlp_post_norm.weight 64"));
  const std::vector<BlockOp> layout = BlockLayout(spec, 1);
  EXPECT_TRUE(IsBlockInputItself(layout, Named("layers.1.attn.input", DTYPE_BF16), DTYPE_BF16));
  EXPECT_FALSE(IsBlockInputItself(layout, Named("layers.1.mlp.input", DTYPE_BF16), DTYPE_BF16));
  // What a half's post-norm (or residual dropout) keeps is freed first in its backward.
  EXPECT_TRUE(InHalfTail(layout, Named("layers.1.attn_post_norm.normalized")));
  EXPECT_TRUE(InHalfTail(layout, Named("layers.1.mlp_post_norm.input_fp32")));
  EXPECT_FALSE(InHalfTail(layout, Named("layers.1.mlp.gate")));
  EXPECT_FALSE(InHalfTail(layout, Named("layers.1.attn.q_norm.input_fp32")));
  EXPECT_FALSE(InHalfTail(BlockLayout(Decoder(), 1), Named("layers.1.mlp_norm.input_fp32")));
  spec.set_residual_dropout(0.1);
  EXPECT_TRUE(InHalfTail(BlockLayout(spec, 1), Named("layers.1.mlp.resid_dropout_mask")));
}

// Glm4DecoderLayer: a norm before each half and one after it.
TEST(BlockLayoutTest, SandwichBlocksNormalizeBothEnds) {
  ModelSpec spec = Decoder();
  spec.set_norm_placement(NORM_PLACEMENT_PRE_AND_POST);
  EXPECT_THAT(Ops(spec), ElementsAre("norm:attn_norm", "qkv:attn", "attention:attn", "o_proj:attn",
                                     "norm:attn_post_norm", "residual_add", "norm:mlp_norm", "mlp:mlp",
                                     "norm:mlp_post_norm", "residual_add"));
  const std::vector<BlockOp> layout = BlockLayout(spec, 1);
  EXPECT_TRUE(IsBlockInputItself(layout, Named("layers.1.attn_norm.input_fp32"), DTYPE_FP32));
  EXPECT_TRUE(InHalfTail(layout, Named("layers.1.attn_post_norm.rstd")));
  EXPECT_FALSE(InHalfTail(layout, Named("layers.1.mlp_norm.rstd")));
}

// Under LoRA a frozen module of block 0 runs backward (and ZeRO-3 gathers it
// again) only when its input requires grad, which the layout's walk follows
// from the adapters: q_proj's make q (and q_norm) need it, up_proj's the MLP's end.
TEST(BlockLayoutTest, FrozenModulesOfBlockZeroRunBackwardFromTheirInput) {
  ModelSpec spec = Decoder();
  spec.set_qk_norm(true);
  spec.mutable_lora()->set_rank(4);
  auto runs = [&](const std::string& name) {
    TensorSpec t = Named("layers.0." + name);
    t.set_layer(0);
    t.set_frozen(true);
    return RunsBackward(spec, t, SavePolicy{});
  };
  spec.mutable_lora()->add_target_modules("q_proj");
  EXPECT_FALSE(runs("attn_norm.weight"));
  EXPECT_FALSE(runs("attn.q_proj.weight"));
  EXPECT_TRUE(runs("attn.q_norm.weight"));
  EXPECT_FALSE(runs("attn.k_norm.weight"));
  EXPECT_TRUE(runs("attn.o_proj.weight"));
  EXPECT_TRUE(runs("mlp_norm.weight"));
  spec.mutable_lora()->set_target_modules(0, "up_proj");
  EXPECT_FALSE(runs("attn.q_norm.weight"));
  EXPECT_FALSE(runs("attn.o_proj.weight"));
  EXPECT_FALSE(runs("mlp_norm.weight"));
  EXPECT_FALSE(runs("mlp.gate_proj.weight"));
  EXPECT_TRUE(runs("mlp.down_proj.weight"));
}

}  // namespace
}  // namespace zplan
