#include "planner/block_layout.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zplan {

// transformers' decoder layers (LlamaDecoderLayer and its copies in Mistral,
// Qwen2 and Qwen3; GPT2Block; ViTLayer) all run pre-norm halves: norm,
// attention, residual add; norm, MLP, residual add. Qwen3Attention normalizes
// q and k per head before RoPE; GPT-2 drops each half's output (resid_pdrop)
// before the add; GraniteDecoderLayer scales it (residual + x * residual_multiplier);
// Phi3DecoderLayer runs Llama's halves with one qkv_proj and one gate_up_proj;
// Olmo2DecoderLayer normalizes each half's output instead of its input;
// Glm4DecoderLayer both, and Gemma4TextDecoderLayer ends with a third half
// for its per-layer input. Lfm2DecoderLayer's conv layers run
// Lfm2ShortConv where the others attend, Qwen3_5DecoderLayer's linear
// attention layers Qwen3_5GatedDeltaNet.
std::vector<BlockOp> BlockLayout(const ModelSpec& spec, int layer) {
  const bool pre = spec.norm_placement() != NORM_PLACEMENT_POST;
  const bool post = spec.norm_placement() != NORM_PLACEMENT_PRE;
  std::vector<BlockOp> ops;
  // Each half's norm before it or, post-norm, after it (before the dropout and add).
  auto half_end = [&](const std::string& half, const char* post_norm) {
    if (post) ops.push_back({BlockOpKind::kNorm, post_norm});
    if (spec.residual_dropout() > 0) ops.push_back({BlockOpKind::kResidualDropout, half});
    if (spec.residual_multiplier() != 0) ops.push_back({BlockOpKind::kResidualScale, half});
    ops.push_back({BlockOpKind::kResidualAdd, ""});
  };
  if (pre) ops.push_back({BlockOpKind::kNorm, "attn_norm"});
  if (LayerMixesByConv(spec, layer)) {
    ops.push_back({BlockOpKind::kShortConv, "conv"});
    half_end("conv", "attn_post_norm");
  } else if (LayerMixesByDeltaRule(spec, layer)) {
    ops.push_back({BlockOpKind::kGatedDeltaNet, "linear_attn"});
    half_end("linear_attn", "attn_post_norm");
  } else {
    ops.push_back({BlockOpKind::kQkvProjection, "attn"});
    if (spec.qk_norm()) ops.push_back({BlockOpKind::kQkNorm, "attn"});
    ops.push_back({BlockOpKind::kAttention, "attn"});
    ops.push_back({BlockOpKind::kOutProjection, "attn"});
    half_end("attn", "attn_post_norm");
  }
  if (pre) ops.push_back({BlockOpKind::kNorm, "mlp_norm"});
  ops.push_back({LayerIsMoe(spec, layer) ? BlockOpKind::kMoe : BlockOpKind::kMlp, "mlp"});
  half_end("mlp", "mlp_post_norm");
  if (spec.per_layer_input_size() > 0) {
    // Gemma4TextDecoderLayer's third half: no norm before, post_per_layer_input_norm after.
    ops.push_back({BlockOpKind::kPerLayerInput, "per_layer"});
    ops.push_back({BlockOpKind::kNorm, "per_layer_norm"});
    ops.push_back({BlockOpKind::kResidualAdd, ""});
  }
  for (BlockOp& op : ops) op.layer = layer;
  return ops;
}

std::vector<BlockLinear> OpLinears(const ModelSpec& spec, const BlockOp& op) {
  const int64_t h = spec.hidden_size(), f = spec.ffn_hidden_size(), d = HeadDimOf(spec, op.layer);
  const int64_t q_width = spec.num_attention_heads() * d;
  const int64_t kv_width = spec.num_kv_heads() * d;
  switch (op.kind) {
    case BlockOpKind::kQkvProjection: {
      const bool bias = spec.attention_qkv_bias();
      if (spec.has_latent_attention()) {
        // DeepseekV2Attention.__init__'s order (its norms between: BlockParameters).
        const LatentAttentionSpec& l = spec.latent_attention();
        const int64_t heads = spec.num_attention_heads(), kv_rank = l.kv_lora_rank();
        std::vector<BlockLinear> linears;
        if (l.q_lora_rank() == 0) {
          linears.push_back({"q_proj", h, q_width, false});
        } else {
          linears.push_back({kQAProj, h, l.q_lora_rank(), bias});
          linears.push_back({kQBProj, l.q_lora_rank(), q_width, false});
        }
        linears.push_back({kKvAProj, h, kv_rank + l.qk_rope_head_dim(), bias});
        linears.push_back({kKvBProj, kv_rank, heads * (l.qk_nope_head_dim() + l.v_head_dim()), false});
        return linears;
      }
      if (spec.fused_qkv_projection()) return {{kQkvProj, h, q_width + 2 * kv_width, bias}};
      // Qwen3_5Attention's q_proj also makes the gate, head by head.
      const int64_t q_out = spec.attention_output_gate() ? 2 * q_width : q_width;
      return {{"q_proj", h, q_out, bias}, {"k_proj", h, kv_width, bias}, {"v_proj", h, kv_width, bias}};
    }
    case BlockOpKind::kGatedDeltaNet: {
      // Module order (Qwen3_5GatedDeltaNet.__init__): out_proj before the input projections.
      const DeltaRuleWidths w = DeltaRuleWidthsOf(spec);
      return {{kOutProj, w.values(), h, false},
              {kInProjQkv, h, w.conv_channels(), false},
              {kInProjZ, h, w.values(), false},
              {kInProjB, h, w.value_heads, false},
              {kInProjA, h, w.value_heads, false}};
    }
    case BlockOpKind::kOutProjection:
      return {{"o_proj", spec.num_attention_heads() * ValueHeadDimOf(spec, op.layer), h, spec.attention_out_bias()}};
    case BlockOpKind::kShortConv: return {{"in_proj", h, 3 * h, spec.conv_bias()}, {"out_proj", h, h, spec.conv_bias()}};
    case BlockOpKind::kPerLayerInput: {
      const int64_t p = spec.per_layer_input_size();
      return {{kPerLayerInputGate, h, p, false}, {kPerLayerProjection, p, h, false}};
    }
    case BlockOpKind::kMlp: {
      std::vector<BlockLinear> linears;
      if (GatedMlp(spec) && spec.fused_gate_up_projection()) {
        linears.push_back({kGateUpProj, h, 2 * f, spec.mlp_bias()});
      } else {
        if (GatedMlp(spec)) linears.push_back({"gate_proj", h, f, spec.mlp_bias()});
        linears.push_back({"up_proj", h, f, spec.mlp_bias()});
      }
      linears.push_back({kDownProj, f, h, spec.mlp_bias()});
      return linears;
    }
    case BlockOpKind::kMoe: {
      // The router and the shared expert; the fused experts are no linears (BlockParameters).
      const MoeSpec& moe = spec.moe();
      std::vector<BlockLinear> linears = {{kRouter, h, moe.num_experts(), moe.router_bias()}};
      if (const int64_t fs = moe.shared_expert_ffn_hidden_size(); fs > 0 && moe.shared_expert_fused_after_experts()) {
        linears.push_back({kSharedExpertGateUp, h, 2 * fs, false});
        linears.push_back({"shared_expert.down_proj", fs, h, false});
      } else if (fs > 0) {
        linears.push_back({"shared_expert.gate_proj", h, fs, false});
        linears.push_back({"shared_expert.up_proj", h, fs, false});
        linears.push_back({"shared_expert.down_proj", fs, h, false});
        if (moe.shared_expert_gate()) linears.push_back({kSharedExpertGate, h, 1, false});
      }
      return linears;
    }
    default: return {};
  }
}

namespace {

// The module of a block tensor's name and what follows it: "attn" and
// "q_proj.weight" of "layers.3.attn.q_proj.weight"; an empty module outside
// the blocks.
absl::string_view ModuleOf(absl::string_view name, absl::string_view* rest) {
  absl::ConsumePrefix(&name, kVisionTowerPrefix);
  if (!absl::ConsumePrefix(&name, "layers.")) return "";
  const size_t layer_end = name.find('.');
  if (layer_end == absl::string_view::npos) return "";
  name.remove_prefix(layer_end + 1);
  const size_t module_end = name.find('.');
  *rest = module_end == absl::string_view::npos ? "" : name.substr(module_end + 1);
  return name.substr(0, module_end);
}

}  // namespace

int OpOfParameter(const ModelSpec& spec, const std::vector<BlockOp>& layout, absl::string_view name,
                  absl::string_view* rest) {
  const absl::string_view module = ModuleOf(name, rest);
  auto names = [&](absl::string_view part) { return absl::StartsWith(*rest, absl::StrCat(part, ".")); };
  int first = -1;
  for (size_t i = 0; i < layout.size(); ++i) {
    const BlockOp& op = layout[i];
    if (module.empty() || op.module != module) continue;
    if (first < 0) first = static_cast<int>(i);
    if (op.kind == BlockOpKind::kQkNorm && (names(kQNorm) || names(kKNorm))) return static_cast<int>(i);
    for (const BlockLinear& linear : OpLinears(spec, op)) {
      if (names(linear.name)) return static_cast<int>(i);
    }
  }
  return first;
}

bool InMlpHalf(const std::vector<BlockOp>& layout, const TensorSpec& tensor) {
  absl::string_view rest;
  const absl::string_view module = ModuleOf(tensor.name(), &rest);
  bool after_add = false;
  for (const BlockOp& op : layout) {
    if (op.kind == BlockOpKind::kResidualAdd) after_add = true;
    if (!module.empty() && op.module == module) return after_add;
  }
  return false;
}

bool IsDownProjTensor(const std::vector<BlockOp>& layout, const TensorSpec& tensor) {
  absl::string_view rest;
  const absl::string_view module = ModuleOf(tensor.name(), &rest);
  for (const BlockOp& op : layout) {
    if (op.kind == BlockOpKind::kMlp && op.module == module) return absl::StartsWith(rest, absl::StrCat(kDownProj, "."));
    // The experts' down projection: its gradient comes first in the MoE's backward.
    if (op.kind == BlockOpKind::kMoe && op.module == module) return rest == kExpertsDown;
  }
  return false;
}

bool InHalfTail(const std::vector<BlockOp>& layout, const TensorSpec& saved) {
  absl::string_view rest;
  const absl::string_view module = ModuleOf(saved.name(), &rest);
  bool tail = false;  // past the half's output, before its residual add
  for (const BlockOp& op : layout) {
    // Gemma 4's per-layer-input half comes after the MLP's: its backward runs first, all of it.
    if (op.kind == BlockOpKind::kPerLayerInput) tail = true;
    // GraniteMoeShared's shared_mlp runs after the experts.
    if (op.kind == BlockOpKind::kMoe && op.module == module && absl::StartsWith(rest, kSharedMlp)) return true;
    if (tail && op.module == module) {
      if (op.kind == BlockOpKind::kNorm || op.kind == BlockOpKind::kPerLayerInput) return true;
      // The dropout shares its half's module: its tensor is the mask.
      if (op.kind == BlockOpKind::kResidualDropout && rest == "resid_dropout_mask") return true;
    }
    if (op.kind == BlockOpKind::kOutProjection || op.kind == BlockOpKind::kShortConv ||
        op.kind == BlockOpKind::kGatedDeltaNet || op.kind == BlockOpKind::kMlp || op.kind == BlockOpKind::kMoe) {
      tail = true;
    }
    if (op.kind == BlockOpKind::kResidualAdd) tail = false;
  }
  return false;
}

bool IsPreNormTensor(const std::vector<BlockOp>& layout, const TensorSpec& saved) {
  absl::string_view rest;
  const absl::string_view module = ModuleOf(saved.name(), &rest);
  bool before_main = true;  // before the half's attention, conv or MLP
  for (const BlockOp& op : layout) {
    // Its ".output" is what the projections after it keep.
    if (op.kind == BlockOpKind::kNorm && before_main && op.module == module) return rest != "output";
    if (op.kind == BlockOpKind::kQkvProjection || op.kind == BlockOpKind::kShortConv ||
        op.kind == BlockOpKind::kGatedDeltaNet || op.kind == BlockOpKind::kMlp || op.kind == BlockOpKind::kMoe ||
        op.kind == BlockOpKind::kPerLayerInput) {
      before_main = false;
    }
    if (op.kind == BlockOpKind::kResidualAdd) before_main = true;
  }
  return false;
}

bool IsBlockInputItself(const std::vector<BlockOp>& layout, const TensorSpec& saved, DType dtype) {
  absl::string_view rest;
  const absl::string_view module = ModuleOf(saved.name(), &rest);
  return saved.dtype() == dtype && !layout.empty() && layout.front().module == module &&
         (rest == "input" || rest == "input_fp32");
}

}  // namespace zplan
