// File: block_layout.h
// What one transformer block of a ModelSpec runs, in forward order: the one
// description of a block that the parameter inventory and the saved-activation
// rules (inventory.h), the gradient-hook order (the reverse of that parameter
// order: zero_buckets.h) and zrun's model builder (executor/transformer.h)
// all walk. A family's entry (model_family.h) sets the spec fields the layout
// reads; each op kind's rules -- the parameters it owns, what transformers'
// implementation of it saves for backward, how zrun runs it -- are written
// once per kind, so a family built from these ops is a description only.
//
// Every op reads "the current tensor" and most replace it: at the start of a
// half that is the residual stream; a norm, a projection or the MLP replaces
// it with its output; a residual add adds it to the stream and makes the sum
// current again.
//
// Example (Qwen3, transformers' Qwen3DecoderLayer):
//   attn_norm  qkv_projection(attn)  qk_norm(attn)  attention(attn)
//   out_projection(attn)  residual_add  mlp_norm  mlp(mlp)  residual_add
#ifndef ZPLAN_PLANNER_BLOCK_LAYOUT_H_
#define ZPLAN_PLANNER_BLOCK_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/inventory.pb.h"
#include "proto/model.pb.h"

namespace zplan {

enum class BlockOpKind {
  kNorm,             // spec.norm_type over the hidden width: "<module>.weight" (+ ".bias")
  kQkvProjection,    // "<module>.q_proj", k_proj, v_proj of the current tensor (biases: attention_qkv_bias);
                     // latent attention's q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
                     // kv_a_layernorm, kv_b_proj
  kQkNorm,           // "<module>.q_norm", k_norm: an RMSNorm over head_dim on q and on k
  kAttention,        // RoPE (position_embedding), then SDPA or eager attention (attention_impl)
  kOutProjection,    // "<module>.o_proj" of the attention output (attention_out_bias)
  kResidualDropout,  // dropout on the current tensor (residual_dropout); its mask is "<module>.resid_dropout_mask"
  kResidualScale,    // current x residual_multiplier (Granite): a new tensor, nothing saved
  kResidualAdd,      // stream + current; ends a half
  kMlp,              // "<module>.gate_proj" (SwiGLU), up_proj, the activation, down_proj (ffn_type, mlp_bias)
  // LFM2's gated short convolution (LAYER_CONV): "<module>.in_proj" to B, C
  // and x, B x, "<module>.conv" (depthwise over conv_kernel_size tokens,
  // causal), C x, "<module>.out_proj" (all with conv_bias).
  kShortConv,
  // Qwen3.5's Gated DeltaNet (LAYER_LINEAR_ATTENTION, Qwen3_5GatedDeltaNet):
  // "<module>.in_proj_qkv", in_proj_z, in_proj_b, in_proj_a of the current
  // tensor, "<module>.conv1d" (depthwise, causal, silu) over q, k, v, the
  // gated delta rule (linear_attention_impl), "<module>.norm" gated by z,
  // "<module>.out_proj"; its own "<module>.dt_bias" and "A_log" [value heads].
  kGatedDeltaNet,
  // Gemma 4's per-layer input (ModelSpec.per_layer_input_size p):
  // "<module>.per_layer_input_gate" [h -> p] of the current tensor, the
  // activation (ffn_type's), times the layer's [b, s, p] slice of the
  // model's per-layer inputs, "<module>.per_layer_projection" [p -> h].
  kPerLayerInput,
  // A mixture-of-experts MLP (MoeSpec; transformers' *SparseMoeBlock under
  // grouped_mm): the router "<module>.gate" [h -> E], its softmax and top
  // k, the token-expert pairs sorted by expert and gathered, the experts'
  // fused "<module>.experts.gate_up_proj" [E, 2I, h] and
  // "<module>.experts.down_proj" [E, h, I] as grouped products, the pairs
  // weighted and summed back per token; and a shared expert, a gated MLP
  // "<module>.shared_expert.*" every token runs, scaled by
  // sigmoid("<module>.shared_expert_gate"), or GraniteMoeShared's after the
  // experts with its gate and up fused ("<module>.shared_expert.gate_up_proj"
  // [h -> 2 f_s], MoeSpec.shared_expert_fused_after_experts), or DeepSeek-V3's
  // after them unfused and ungated (MoeSpec.shared_expert_after_experts, its
  // sigmoid router over groups: router_sigmoid_grouped). GPT-OSS's experts
  // (MoeSpec.gpt_oss_experts) are transposed, with biases and a clamped gate.
  kMoe,
};

struct BlockOp {
  BlockOpKind kind;
  std::string module;  // the parameter and activation names' prefix within the block, e.g. "attn_norm", "mlp"
  int layer = -1;      // the layer it is of
};

// Layer `layer`'s ops in forward order. Blocks differ only in the op that
// mixes tokens (LayerMixesByConv: a short convolution in place of the
// attention ops); everything else is alike.
std::vector<BlockOp> BlockLayout(const ModelSpec& spec, int layer);

// Whether layer `layer`'s MLP is a mixture of experts (kMoe).
inline bool LayerIsMoe(const ModelSpec& spec, int layer) {
  return spec.has_moe() && !(layer < spec.moe().dense_layers_size() && spec.moe().dense_layers(layer));
}

// How many layers are mixtures of experts.
inline int NumMoeLayers(const ModelSpec& spec) {
  int n = 0;
  for (int layer = 0; layer < spec.num_layers(); ++layer) n += LayerIsMoe(spec, layer) ? 1 : 0;
  return n;
}

// No op after the MLP half saves a tensor: pre-norms, no residual dropout,
// no per-layer input after it.
inline bool NothingSavesPastTheMlp(const ModelSpec& spec) {
  return spec.norm_placement() == NORM_PLACEMENT_PRE && spec.residual_dropout() == 0 &&
         spec.per_layer_input_size() == 0;
}

// Whether a checkpointed layer's recompute (torch's non-reentrant
// checkpoint, which stops at the last tensor the block saves) ends inside
// its mixture of experts, at the weighted pairs' reordering (its inverse
// index saved; nothing after it saves: .to, view, sum, Granite's product
// with a Python float, the residual add), and whether the backward reaches
// it only past those ops: a MoE layer without a shared expert (Qwen2-MoE's
// gate product and GraniteMoeShared's shared_mlp are recorded last, saving
// their inputs). The eager experts' loop saves up to its last index_add_,
// whose backward, reached first, needs no copy of the output gradient.
inline bool RecomputeStopsInExperts(const ModelSpec& spec, int layer) {
  return LayerIsMoe(spec, layer) && spec.moe().shared_expert_ffn_hidden_size() == 0 &&
         spec.moe().experts_impl() != EXPERTS_EAGER && NothingSavesPastTheMlp(spec);
}

// An eager experts' layer whose recompute stops at the last tensor its MoE
// saves (the loop's last index_add_'s, Qwen2-MoE's gate product's,
// GraniteMoeShared's shared_mlp's), its output never made: the backward
// reaches its terms past the sums and the residual add, which save nothing.
// (The planner's eager recompute counts the loop's moments, none past it.)
inline bool RecomputeStopsAtMoeTerms(const ModelSpec& spec, int layer) {
  return LayerIsMoe(spec, layer) && spec.moe().experts_impl() == EXPERTS_EAGER && NothingSavesPastTheMlp(spec);
}

// kMoe's fused expert parameters, within its module, and their shapes.
inline constexpr char kExpertsGateUp[] = "experts.gate_up_proj";  // [E, 2I, h]; GPT-OSS's [E, h, 2I]
inline constexpr char kExpertsDown[] = "experts.down_proj";       // [E, h, I]; GPT-OSS's [E, I, h]
inline constexpr char kExpertsGateUpBias[] = "experts.gate_up_proj_bias";  // [E, 2I] (MoeSpec.gpt_oss_experts)
inline constexpr char kExpertsDownBias[] = "experts.down_proj_bias";       // [E, h]
inline constexpr char kRouter[] = "gate";                         // Linear(h -> E), a bias with router_bias
// The attention's sinks [heads] (ModelSpec.attention_sinks), "<module>.sinks".
inline constexpr char kSinks[] = "sinks";
inline constexpr char kSharedExpert[] = "shared_expert.";         // its gate_proj, up_proj, down_proj
inline constexpr char kSharedExpertGate[] = "shared_expert_gate"; // Linear(h -> 1), no bias
inline constexpr char kSharedExpertGateUp[] = "shared_expert.gate_up_proj";  // GraniteMoeSharedMLP.input_linear
// What GraniteMoeSharedMLP saves, "<module>.shared_mlp.*": the tail of its half (InHalfTail).
inline constexpr char kSharedMlp[] = "shared_mlp.";

// Whether the MoE block's shared expert runs after its experts
// (GraniteMoeShared's shared_mlp, DeepSeek-V3's shared_experts), saving the
// tail of its half; false: before them, or none.
inline bool SharedExpertAfterExperts(const MoeSpec& moe) {
  return moe.shared_expert_fused_after_experts() || moe.shared_expert_after_experts();
}

// DeepseekV3Attention's modules (ModelSpec.latent_attention), within kQkvProjection's.
inline constexpr char kQAProj[] = "q_a_proj";
inline constexpr char kQALayernorm[] = "q_a_layernorm";
inline constexpr char kQBProj[] = "q_b_proj";
inline constexpr char kKvAProj[] = "kv_a_proj_with_mqa";
inline constexpr char kKvALayernorm[] = "kv_a_layernorm";
inline constexpr char kKvBProj[] = "kv_b_proj";

// Whether layer `layer` is a LAYER_CONV one.
inline bool LayerMixesByConv(const ModelSpec& spec, int layer) {
  return layer < spec.layer_types_size() && spec.layer_types(layer) == LAYER_CONV;
}
// Whether layer `layer` is a LAYER_LINEAR_ATTENTION one.
inline bool LayerMixesByDeltaRule(const ModelSpec& spec, int layer) {
  return layer < spec.layer_types_size() && spec.layer_types(layer) == LAYER_LINEAR_ATTENTION;
}
// Whether layer `layer` attends (softmax attention, full or sliding).
inline bool LayerAttends(const ModelSpec& spec, int layer) {
  return !LayerMixesByConv(spec, layer) && !LayerMixesByDeltaRule(spec, layer);
}

// Layer `layer`'s head width: layer_head_dims' entry, or head_dim (also
// for layer -1, outside the blocks).
inline int64_t HeadDimOf(const ModelSpec& spec, int layer) {
  return layer >= 0 && layer < spec.layer_head_dims_size() ? spec.layer_head_dims(layer) : spec.head_dim();
}

// The dims of each head RoPE rotates: rotary_dim, or the whole head when 0.
inline int64_t RotaryDims(const ModelSpec& spec, int layer = -1) {
  return spec.rotary_dim() > 0 ? spec.rotary_dim() : HeadDimOf(spec, layer);
}

// The attention output's width per head: v_head_dim under latent attention, else the layer's head width.
inline int64_t ValueHeadDimOf(const ModelSpec& spec, int layer) {
  return spec.has_latent_attention() ? spec.latent_attention().v_head_dim() : HeadDimOf(spec, layer);
}

// A linear an op owns: its name within the op's module, its widths and
// whether it has a bias.
struct BlockLinear {
  absl::string_view name;  // "q_proj"
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = false;
};
// The linears of an op, in module order (empty for an op without any), e.g.
// q_proj [h -> heads x head_dim], k_proj and v_proj [h -> kv_heads x head_dim]
// for kQkvProjection (one qkv_proj when fused). The spec must be resolved (ResolveModelSpec).
std::vector<BlockLinear> OpLinears(const ModelSpec& spec, const BlockOp& op);

// Whether the MLP is gated, down(act(gate) * up): SwiGLU or GeGLU, whose
// activations save the same (their input) and differ in nothing else.
inline bool GatedMlp(const ModelSpec& spec) {
  return spec.ffn_type() == FFN_SWIGLU || spec.ffn_type() == FFN_GEGLU;
}

// kPerLayerInput's linears (Gemma4TextDecoderLayer's names).
inline constexpr char kPerLayerInputGate[] = "per_layer_input_gate";
inline constexpr char kPerLayerProjection[] = "per_layer_projection";
// A vision-language model's tower blocks' tensors are named as a language
// model's with this prefix: "vision_tower.layers.<i>.<module>..." (inventory.h).
inline constexpr char kVisionTowerPrefix[] = "vision_tower.";
// The MLP's last linear, whose gradient hooks are the first of a block's backward.
inline constexpr char kDownProj[] = "down_proj";
// The fused projections (ModelSpec.fused_qkv_projection, fused_gate_up_projection).
inline constexpr char kQkvProj[] = "qkv_proj";
inline constexpr char kGateUpProj[] = "gate_up_proj";
// kQkNorm's two norms, "<module>.q_norm" and "<module>.k_norm".
inline constexpr char kQNorm[] = "q_norm";
inline constexpr char kKNorm[] = "k_norm";
inline constexpr char kVNorm[] = "v_norm";  // ModelSpec.value_norm: no weight
// kShortConv's depthwise conv, "<module>.conv.weight" [h, 1, conv_kernel_size].
inline constexpr char kConv[] = "conv";
// kGatedDeltaNet's parameters as Qwen3_5GatedDeltaNet.__init__ names them:
// its linears (no biases) in the order forward applies them, its depthwise
// conv, its own two vectors and the gated norm's weight.
inline constexpr char kInProjQkv[] = "in_proj_qkv";  // [h -> 2 Hk dk + Hv dv]
inline constexpr char kInProjZ[] = "in_proj_z";      // [h -> Hv dv]
inline constexpr char kInProjB[] = "in_proj_b";      // [h -> Hv]
inline constexpr char kInProjA[] = "in_proj_a";      // [h -> Hv]
inline constexpr char kOutProj[] = "out_proj";       // [Hv dv -> h]
inline constexpr char kConv1dWeight[] = "conv1d.weight";   // [2 Hk dk + Hv dv, 1, conv_kernel_size]
inline constexpr char kDtBias[] = "dt_bias";               // [Hv]
inline constexpr char kALog[] = "A_log";                   // [Hv]
inline constexpr char kGatedNormWeight[] = "norm.weight";  // [dv]

// kGatedDeltaNet's widths: q and k over the key heads, v over the value
// heads, all three through the conv (Qwen3_5GatedDeltaNet.__init__'s conv_dim).
struct DeltaRuleWidths {
  int64_t key_heads, value_heads, key_dim, value_dim;
  int64_t keys() const { return key_heads * key_dim; }
  int64_t values() const { return value_heads * value_dim; }
  int64_t conv_channels() const { return 2 * keys() + values(); }
};
inline DeltaRuleWidths DeltaRuleWidthsOf(const ModelSpec& spec) {
  return {spec.linear_num_key_heads(), spec.linear_num_value_heads(), spec.linear_key_head_dim(),
          spec.linear_value_head_dim()};
}

// The index in `layout` of the op that owns a block parameter named
// "layers.<i>.<module>.<rest>", and `rest`: the op of that module, or where
// ops share one (attn), the op whose linear or norm `rest` names. -1
// outside the blocks.
int OpOfParameter(const ModelSpec& spec, const std::vector<BlockOp>& layout, absl::string_view name,
                  absl::string_view* rest);

// Where a block tensor (a parameter or saved activation named
// "layers.<i>.<module>...") sits in `layout`, found by its module:
// InMlpHalf: after the first residual add, in the half whose backward runs
// first (and frees what it saved first); IsDownProjTensor: down_proj's
// weight, bias or adapters. Both false outside the blocks.
bool InMlpHalf(const std::vector<BlockOp>& layout, const TensorSpec& tensor);
bool IsDownProjTensor(const std::vector<BlockOp>& layout, const TensorSpec& tensor);
// Whether a saved tensor is an op's after its half's output (o_proj's, the
// MLP's) -- the residual dropout's mask, a post-norm's: their backward runs
// first in the half, before the attention's or the MLP's.
bool InHalfTail(const std::vector<BlockOp>& layout, const TensorSpec& saved);
// Whether a saved tensor is a pre-norm's (a norm before its half's
// attention, conv or MLP): its backward runs last in the half, once the
// half's other saved tensors are freed.
bool IsPreNormTensor(const std::vector<BlockOp>& layout, const TensorSpec& saved);
// Whether a saved tensor is the block's input itself, not a copy: the first
// op's saved input in the working dtype (LayerNorm keeps its input;
// RMSNorm's fp32 upcast is a no-op on fp32 input; a post-norm block's q/k/v
// projections keep it). A checkpointed block's
// recompute saves the input it kept, so it allocates this tensor no second time.
bool IsBlockInputItself(const std::vector<BlockOp>& layout, const TensorSpec& saved, DType dtype);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_BLOCK_LAYOUT_H_
