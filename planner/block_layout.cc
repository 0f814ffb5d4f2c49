#include "planner/block_layout.h"

namespace zplan {

// transformers' decoder layers (LlamaDecoderLayer and its copies in Mistral,
// Qwen2 and Qwen3; GPT2Block; ViTLayer) all run pre-norm halves: norm,
// attention, residual add; norm, MLP, residual add. Qwen3Attention normalizes
// q and k per head before RoPE; GPT-2 drops each half's output (resid_pdrop)
// before the add.
std::vector<BlockOp> BlockLayout(const ModelSpec& spec) {
  std::vector<BlockOp> ops = {{BlockOpKind::kNorm, "attn_norm"}, {BlockOpKind::kQkvProjection, "attn"}};
  if (spec.qk_norm()) ops.push_back({BlockOpKind::kQkNorm, "attn"});
  ops.push_back({BlockOpKind::kAttention, "attn"});
  ops.push_back({BlockOpKind::kOutProjection, "attn"});
  if (spec.residual_dropout() > 0) ops.push_back({BlockOpKind::kResidualDropout, "attn"});
  ops.push_back({BlockOpKind::kResidualAdd, ""});
  ops.push_back({BlockOpKind::kNorm, "mlp_norm"});
  ops.push_back({BlockOpKind::kMlp, "mlp"});
  if (spec.residual_dropout() > 0) ops.push_back({BlockOpKind::kResidualDropout, "mlp"});
  ops.push_back({BlockOpKind::kResidualAdd, ""});
  return ops;
}

std::vector<BlockLinear> OpLinears(const ModelSpec& spec, const BlockOp& op) {
  const int64_t h = spec.hidden_size(), f = spec.ffn_hidden_size();
  const int64_t q_width = spec.num_attention_heads() * spec.head_dim();
  const int64_t kv_width = spec.num_kv_heads() * spec.head_dim();
  switch (op.kind) {
    case BlockOpKind::kQkvProjection: {
      const bool bias = spec.attention_qkv_bias();
      return {{"q_proj", h, q_width, bias}, {"k_proj", h, kv_width, bias}, {"v_proj", h, kv_width, bias}};
    }
    case BlockOpKind::kOutProjection: return {{"o_proj", q_width, h, spec.attention_out_bias()}};
    case BlockOpKind::kMlp: {
      std::vector<BlockLinear> linears;
      if (spec.ffn_type() == FFN_SWIGLU) linears.push_back({"gate_proj", h, f, spec.mlp_bias()});
      linears.push_back({"up_proj", h, f, spec.mlp_bias()});
      linears.push_back({"down_proj", f, h, spec.mlp_bias()});
      return linears;
    }
    default: return {};
  }
}

}  // namespace zplan
