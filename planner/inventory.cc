#include "planner/inventory.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner/block_layout.h"
#include "planner/eager_experts.h"
#include "planner/vision_tower.h"

namespace zplan {
namespace {

TensorSpec Make(std::string name, std::vector<int64_t> shape, DType dtype, TensorRole role,
                int layer) {
  TensorSpec t;
  t.set_name(std::move(name));
  for (int64_t d : shape) t.add_shape(d);
  t.set_dtype(dtype);
  t.set_role(role);
  t.set_layer(layer);
  return t;
}

TensorSpec Param(std::string name, std::vector<int64_t> shape, int layer) {
  return Make(std::move(name), std::move(shape), DTYPE_FP32, ROLE_PARAMETER, layer);
}

void AddNorm(const ModelSpec& spec, const std::string& prefix, int64_t width, int layer,
             std::vector<TensorSpec>* out) {
  out->push_back(Param(prefix + ".weight", {width}, layer));
  if (spec.norm_type() == NORM_LAYERNORM) out->push_back(Param(prefix + ".bias", {width}, layer));
}

void AddLinear(const std::string& prefix, int64_t in, int64_t out_features, bool bias, int layer,
               std::vector<TensorSpec>* out) {
  out->push_back(Param(prefix + ".weight", {out_features, in}, layer));
  if (bias) out->push_back(Param(prefix + ".bias", {out_features}, layer));
}

// A block linear, with its LoRA adapters when the spec targets it (PEFT's
// LoraLayer: base_layer's weight and bias, then lora_A, then lora_B).
void AddBlockLinear(const ModelSpec& spec, const std::string& prefix, const std::string& module, int64_t in,
                    int64_t out_features, bool bias, int layer, std::vector<TensorSpec>* out) {
  const std::string name = prefix + "." + module;
  AddLinear(name, in, out_features, bias, layer, out);
  if (IsLoraTarget(spec, module)) {
    out->push_back(Param(name + kLoraAName + ".weight", {spec.lora().rank(), in}, layer));
    out->push_back(Param(name + kLoraBName + ".weight", {out_features, spec.lora().rank()}, layer));
  }
}

// The weight a module computes with: its own, or its modules_to_save copy.
std::string WeightOf(const ModelSpec& spec, absl::string_view module) {
  return absl::StrCat(module, SavesModule(spec, module) ? kSavedModuleName : "", ".weight");
}

// A [vocab, h] module's weight, after its frozen original when it is copied.
void AddVocabWeight(const ModelSpec& spec, absl::string_view module, std::vector<TensorSpec>* out) {
  const std::vector<int64_t> shape = {spec.vocab_size(), spec.hidden_size()};
  if (SavesModule(spec, module)) out->push_back(Param(absl::StrCat(module, kOriginalModuleName, ".weight"), shape, -1));
  out->push_back(Param(WeightOf(spec, module), shape, -1));
}

// With LoRA only the adapters and the copies of modules_to_save train.
void MarkFrozen(const ModelSpec& spec, std::vector<TensorSpec>* params) {
  if (!spec.has_lora()) return;
  for (TensorSpec& t : *params) t.set_frozen(!IsLoraAdapter(t) && !absl::StrContains(t.name(), kSavedModuleName));
}

// A vision-language model's parameter of `part`.
TensorSpec Param(std::string name, std::vector<int64_t> shape, ModelPart part, int layer) {
  TensorSpec t = Param(std::move(name), std::move(shape), layer);
  t.set_part(part);
  return t;
}

// Appends a Linear's weight [out, in] and bias [out].
void PartLinear(const std::string& name, int64_t in, int64_t out, bool bias, ModelPart part, int layer,
            std::vector<TensorSpec>* params) {
  params->push_back(Param(name + ".weight", {out, in}, part, layer));
  if (bias) params->push_back(Param(name + ".bias", {out}, part, layer));
}
// Appends a norm's weight [width] and, for nn.LayerNorm, its bias.
void PartNorm(const std::string& name, int64_t width, bool layer_norm, ModelPart part, int layer,
          std::vector<TensorSpec>* params) {
  params->push_back(Param(name + ".weight", {width}, part, layer));
  if (layer_norm) params->push_back(Param(name + ".bias", {width}, part, layer));
}

// The tower's blocks: TowerSpec's BlockParameters, named
// "vision_tower.layers.<i>...." (kVisionTowerPrefix) in block-layout order.
void AppendTowerBlocks(const ModelSpec& spec, std::vector<TensorSpec>* out) {
  const ModelSpec tower = TowerSpec(spec);
  for (int layer = 0; layer < tower.num_layers(); ++layer) {
    for (TensorSpec& t : BlockParameters(tower, layer)) {
      t.set_name(absl::StrCat(kVisionTowerPrefix, t.name()));
      t.set_part(PART_VISION_TOWER);
      out->push_back(std::move(t));
    }
  }
}

// CLIPVisionModel (models/clip/modeling_clip.py: CLIPVisionEmbeddings,
// CLIPEncoderLayer registering k, v, q, out then layer_norm1, mlp,
// layer_norm2) and LlavaMultiModalProjector (modeling_llava.py).
void ClipParameters(const ModelSpec& spec, std::vector<TensorSpec>* out) {
  const VisionLanguageSpec& v = spec.vision_language();
  const int64_t c = v.hidden_size(), p = v.patch_size();
  const std::string tower = "vision_tower.";
  out->push_back(Param(tower + "embeddings.class_embedding", {c}, PART_VISION_TOWER, -1));
  out->push_back(Param(tower + "embeddings.patch_embedding.weight", {c, v.num_channels(), p, p}, PART_VISION_TOWER, -1));
  out->push_back(Param(tower + "embeddings.position_embedding.weight", {v.num_position_embeddings(), c},
                       PART_VISION_TOWER, -1));
  PartNorm(tower + "pre_layrnorm", c, true, PART_VISION_TOWER, -1, out);
  // The blocks as the step sizes them (transformers registers k, v, q,
  // out_proj, layer_norm1, fc1, fc2, layer_norm2: the same tensors).
  AppendTowerBlocks(spec, out);
  PartNorm(tower + kTowerPooledNorm, c, true, PART_VISION_TOWER, -1, out);
  const int64_t h = spec.hidden_size();
  PartLinear("multi_modal_projector.linear_1", c, h, v.projector_bias(), PART_PROJECTOR, -1, out);
  PartLinear("multi_modal_projector.linear_2", h, h, v.projector_bias(), PART_PROJECTOR, -1, out);
}

// Qwen2_5_VisionTransformerPretrainedModel (modeling_qwen2_5_vl.py: the
// block registers norm1 and norm2 before attn and mlp) and
// Qwen3VLVisionModel (modeling_qwen3_vl.py; Qwen3_5VisionModel is it
// without deepstack mergers).
void QwenParameters(const ModelSpec& spec, std::vector<TensorSpec>* out) {
  const VisionLanguageSpec& v = spec.vision_language();
  const bool qwen2_5 = v.tower() == VISION_TOWER_QWEN2_5_VL;
  const int64_t c = v.hidden_size(), p = v.patch_size();
  const int64_t merged = c * v.spatial_merge_size() * v.spatial_merge_size(), o = v.out_hidden_size();
  const std::string tower = "visual.";
  out->push_back(Param(tower + "patch_embed.proj.weight", {c, v.num_channels(), v.temporal_patch_size(), p, p},
                       PART_VISION_TOWER, -1));
  if (!qwen2_5) {
    out->push_back(Param(tower + "patch_embed.proj.bias", {c}, PART_VISION_TOWER, -1));
    out->push_back(Param(tower + "pos_embed.weight", {v.num_position_embeddings(), c}, PART_VISION_TOWER, -1));
  }
  // The blocks as the step sizes them (TowerSpec; transformers registers
  // norm1 and norm2 first, then attn.qkv, attn.proj and the MLP: the same tensors).
  AppendTowerBlocks(spec, out);
  if (qwen2_5) {
    // Qwen2_5_VLPatchMerger: ln_q over C, then mlp.0 [4C -> 4C], GELU, mlp.2 [4C -> O].
    PartNorm(tower + "merger.ln_q", c, false, PART_PROJECTOR, -1, out);
    PartLinear(tower + "merger.mlp.0", merged, merged, true, PART_PROJECTOR, -1, out);
    PartLinear(tower + "merger.mlp.2", merged, o, true, PART_PROJECTOR, -1, out);
    return;
  }
  // Qwen3VLVisionPatchMerger: the merger's norm over C; each deepstack
  // merger's (use_postshuffle_norm) over 4C.
  PartNorm(tower + "merger.norm", c, true, PART_PROJECTOR, -1, out);
  PartLinear(tower + "merger.linear_fc1", merged, merged, true, PART_PROJECTOR, -1, out);
  PartLinear(tower + "merger.linear_fc2", merged, o, true, PART_PROJECTOR, -1, out);
  // The deepstack mergers count with the tower: the Qwen recipe's tune_mm_mlp covers visual.merger alone,
  // its tune_mm_vision all of model.visual (qwen-vl-finetune train_qwen.py, set_model).
  for (int k = 0; k < v.deepstack_blocks_size(); ++k) {
    const std::string m = absl::StrCat(tower, "deepstack_merger_list.", k, ".");
    PartNorm(m + "norm", merged, true, PART_VISION_TOWER, -1, out);
    PartLinear(m + "linear_fc1", merged, merged, true, PART_VISION_TOWER, -1, out);
    PartLinear(m + "linear_fc2", merged, o, true, PART_VISION_TOWER, -1, out);
  }
}

}  // namespace

std::vector<TensorSpec> VisionLanguageParameters(const ModelSpec& spec) {
  std::vector<TensorSpec> out;
  if (!spec.has_vision_language()) return out;
  if (spec.vision_language().tower() == VISION_TOWER_CLIP) {
    ClipParameters(spec, &out);
  } else {
    QwenParameters(spec, &out);
  }
  return out;
}

int64_t VisionTokens(const ModelSpec& spec) {
  if (!spec.has_vision() || spec.vision().patch_size() <= 0) return 0;
  const int64_t side = spec.vision().image_size() / spec.vision().patch_size();
  return side * side + 1;
}

int64_t NumElements(const TensorSpec& tensor) {
  int64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d;
  return n;
}

int64_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DTYPE_FP32:
    case DTYPE_INT32: return 4;
    case DTYPE_BF16:
    case DTYPE_FP16: return 2;
    case DTYPE_INT64: return 8;
    case DTYPE_BOOL: return 1;
    default: return 0;
  }
}

int DeepSpeedLeafBlockOf(const ModelSpec& spec, const TensorSpec& param) {
  return spec.has_moe() && spec.moe().deepspeed_leaf() ? MoeBlockOf(spec, param) : -1;
}

int MoeBlockOf(const ModelSpec& spec, const TensorSpec& param) {
  if (!spec.has_moe()) return -1;
  const int block = StepBlockOf(spec, param);
  if (block < 0) return -1;
  const std::vector<BlockOp> layout = StepBlockLayout(spec, block);
  absl::string_view rest;
  const int op = OpOfParameter(spec, layout, param.name(), &rest);
  return op >= 0 && layout[op].kind == BlockOpKind::kMoe ? block : -1;
}

std::vector<TensorSpec> BlockParameters(const ModelSpec& spec, int layer) {
  std::vector<TensorSpec> out;
  const std::string p = absl::StrCat("layers.", layer);
  for (const BlockOp& op : BlockLayout(spec, layer)) {
    const std::string module = absl::StrCat(op.module, ".");
    if (op.kind == BlockOpKind::kNorm) AddNorm(spec, p + "." + op.module, spec.hidden_size(), layer, &out);
    if (op.kind == BlockOpKind::kQkNorm) {
      // One RMSNorm weight over head_dim each, shared by all heads, or over the whole projection.
      const bool whole = spec.qk_norm_over_projection();
      for (const auto& [norm, heads] : {std::pair{kQNorm, spec.num_attention_heads()}, {kKNorm, spec.num_kv_heads()}}) {
        out.push_back(Param(absl::StrCat(p, ".", module, norm, ".weight"),
                            {(whole ? heads : 1) * HeadDimOf(spec, layer)}, layer));
      }
    }
    if (op.kind == BlockOpKind::kGatedDeltaNet) {
      // Qwen3_5GatedDeltaNet's own parameters, then its submodules': the
      // conv [channels, 1, kernel] (no bias), the gated norm [value dim], the linears.
      const DeltaRuleWidths w = DeltaRuleWidthsOf(spec);
      const std::string m = absl::StrCat(p, ".", module);
      out.push_back(Param(m + kDtBias, {w.value_heads}, layer));
      out.push_back(Param(m + kALog, {w.value_heads}, layer));
      out.push_back(Param(m + kConv1dWeight, {w.conv_channels(), 1, spec.conv_kernel_size()}, layer));
      out.push_back(Param(m + kGatedNormWeight, {w.value_dim}, layer));
    }
    // A mixture of experts' fused experts, before its router or after it
    // (MoeSpec.router_before_experts: the *SparseMoeBlock's module order).
    auto add_experts = [&] {
      const MoeSpec& moe = spec.moe();
      const int64_t e = moe.num_experts(), f = moe.expert_ffn_hidden_size(), h = spec.hidden_size();
      const std::string m = absl::StrCat(p, ".", module);
      if (moe.gpt_oss_experts()) {  // GptOssExperts.__init__'s order and shapes
        out.push_back(Param(m + kExpertsGateUp, {e, h, 2 * f}, layer));
        out.push_back(Param(m + kExpertsGateUpBias, {e, 2 * f}, layer));
        out.push_back(Param(m + kExpertsDown, {e, f, h}, layer));
        out.push_back(Param(m + kExpertsDownBias, {e, h}, layer));
        return;
      }
      out.push_back(Param(m + kExpertsGateUp, {e, 2 * f, h}, layer));
      out.push_back(Param(m + kExpertsDown, {e, h, f}, layer));
    };
    // GptOssAttention's own parameter, before its projections' (named_parameters yields a module's own first).
    if (op.kind == BlockOpKind::kQkvProjection && spec.attention_sinks()) {
      out.push_back(Param(absl::StrCat(p, ".", module, kSinks), {spec.num_attention_heads()}, layer));
    }
    if (op.kind == BlockOpKind::kMoe && !spec.moe().router_before_experts()) add_experts();
    for (const BlockLinear& l : OpLinears(spec, op)) {
      AddBlockLinear(spec, p, module + std::string(l.name), l.in_features, l.out_features, l.bias, layer, &out);
      if (op.kind == BlockOpKind::kMoe && l.name == kRouter && spec.moe().router_before_experts()) add_experts();
      // Latent attention's norms follow the projections they normalize.
      if (op.kind == BlockOpKind::kQkvProjection && (l.name == kQAProj || l.name == kKvAProj)) {
        const bool q = l.name == kQAProj;
        const LatentAttentionSpec& latent = spec.latent_attention();
        AddNorm(spec, absl::StrCat(p, ".", module, q ? kQALayernorm : kKvALayernorm),
                q ? latent.q_lora_rank() : latent.kv_lora_rank(), layer, &out);
      }
      // A short conv's depthwise conv runs between its projections: [h, 1, kernel] (nn.Conv1d, groups=h).
      if (op.kind == BlockOpKind::kShortConv && l.name == "in_proj") {
        const std::string conv = absl::StrCat(p, ".", module, kConv);
        out.push_back(Param(conv + ".weight", {spec.hidden_size(), 1, spec.conv_kernel_size()}, layer));
        if (spec.conv_bias()) out.push_back(Param(conv + ".bias", {spec.hidden_size()}, layer));
      }
    }
  }
  MarkFrozen(spec, &out);
  return out;
}

std::vector<TensorSpec> ParameterInventory(const ModelSpec& spec) {
  // A vision-language model's tower and projector come first (vision_language.h).
  std::vector<TensorSpec> out = VisionLanguageParameters(spec);
  const int64_t h = spec.hidden_size();
  if (spec.vocab_size() > 0) AddVocabWeight(spec, "embed_tokens", &out);
  if (const int64_t p = spec.per_layer_input_size(); p > 0) {
    // Gemma4TextModel's per-layer embeddings, named here as embedding parts
    // (their backward runs with the embedding's, after block 0's), though
    // transformers registers them after the final norm.
    const int64_t width = spec.num_layers() * p;
    out.push_back(Param(absl::StrCat(kPerLayerEmbedding, ".weight"), {spec.per_layer_input_vocab_size(), width}, -1));
    out.push_back(Param(absl::StrCat(kPerLayerModelProjection, ".weight"), {width, h}, -1));
    out.push_back(Param(absl::StrCat(kPerLayerProjectionNorm, ".weight"), {p}, -1));
  }
  if (spec.has_vision()) {
    const VisionSpec& v = spec.vision();
    out.push_back(Param("embed_patches.cls_token", {1, 1, h}, -1));
    out.push_back(Param("embed_patches.position_embeddings", {1, VisionTokens(spec), h}, -1));
    out.push_back(Param("embed_patches.projection.weight", {h, v.num_channels(), v.patch_size(), v.patch_size()}, -1));
    out.push_back(Param("embed_patches.projection.bias", {h}, -1));
  } else if (spec.position_embedding() == POSITION_LEARNED) {
    out.push_back(Param("embed_positions.weight", {spec.max_position_embeddings(), h}, -1));
  }
  for (int layer = 0; layer < spec.num_layers(); ++layer) {
    for (TensorSpec& t : BlockParameters(spec, layer)) out.push_back(std::move(t));
  }
  AddNorm(spec, "final_norm", h, -1, &out);
  if (spec.vocab_size() > 0 && !spec.tie_word_embeddings()) AddVocabWeight(spec, "lm_head", &out);
  if (spec.has_vision()) AddLinear("classifier", h, spec.vision().num_labels(), /*bias=*/true, -1, &out);
  MarkFrozen(spec, &out);
  if (spec.has_vision_language()) {
    // The parts the user freezes; LoRA (language model only) has frozen the
    // language model's base weights above, and the other parts train unless
    // frozen (the oracle's --freeze with --lora-config).
    const VisionLanguageSpec& v = spec.vision_language();
    for (TensorSpec& t : out) {
      switch (t.part()) {
        case PART_VISION_TOWER: t.set_frozen(v.freeze_vision_tower()); break;
        case PART_PROJECTOR: t.set_frozen(v.freeze_projector()); break;
        default: if (!spec.has_lora()) t.set_frozen(v.freeze_language_model());
      }
    }
  }
  return out;
}

namespace {
int TowerBlocks(const ModelSpec& spec) {
  return spec.has_vision_language() ? static_cast<int>(spec.vision_language().num_layers()) : 0;
}
}  // namespace

int StepNumBlocks(const ModelSpec& spec) { return TowerBlocks(spec) + static_cast<int>(spec.num_layers()); }

int StepBlockOf(const ModelSpec& spec, const TensorSpec& tensor) {
  if (tensor.layer() < 0) return -1;
  return tensor.part() == PART_VISION_TOWER ? tensor.layer() : TowerBlocks(spec) + tensor.layer();
}

std::vector<BlockOp> StepBlockLayout(const ModelSpec& spec, int block) {
  const int tower = TowerBlocks(spec);
  return block < tower ? BlockLayout(TowerSpec(spec), block) : BlockLayout(spec, block - tower);
}

std::vector<TensorSpec> TrainableParameters(const std::vector<TensorSpec>& parameters) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : parameters) {
    if (!t.frozen()) out.push_back(t);
  }
  return out;
}

bool BaseWeightsTrain(const ModelSpec& spec) {
  return !spec.has_lora() && !(spec.has_vision_language() && spec.vision_language().freeze_language_model());
}

bool SavesModule(const ModelSpec& spec, absl::string_view module) {
  if (!spec.has_lora()) return false;
  const auto& saved = spec.lora().modules_to_save();
  return std::find(saved.begin(), saved.end(), module) != saved.end();
}

std::string EmbeddingWeightName(const ModelSpec& spec) { return WeightOf(spec, "embed_tokens"); }

std::string LmHeadWeightName(const ModelSpec& spec) {
  return WeightOf(spec, spec.tie_word_embeddings() ? "embed_tokens" : "lm_head");
}

bool EmbeddingOutputRequiresGrad(const ModelSpec& spec, const SavePolicy& saves) {
  // A vision-language model's: the image features scattered into it require
  // grad while the projector or the tower trains.
  const bool images_train = spec.has_vision_language() &&
                            (!spec.vision_language().freeze_projector() || !spec.vision_language().freeze_vision_tower());
  return BaseWeightsTrain(spec) || images_train || SavesModule(spec, "embed_tokens") ||
         saves.embedding_output_requires_grad;
}

bool IsUnusedOriginal(absl::string_view parameter_name) {
  return absl::StrContains(parameter_name, kOriginalModuleName);
}

namespace {

// Which tensors of one block require grad, at each op of its layout, given
// whether its input does (BlockInputRequiresGrad); a LoRA target's output
// always (its adapters train). The one walk that BlockSavedActivations
// (what autograd keeps) and RunsBackward (which modules ZeRO-3 gathers in
// backward) read.
struct OpGradients {
  bool input = false;                    // the tensor the op reads
  bool q = false, k = false, v = false;  // the projections' outputs, from kQkvProjection on
  bool attention = false;                // the attention's output, from kAttention on
  bool gate = false, up = false;         // kMlp: the gated and the up projection's outputs
  bool stream = false;                   // the residual stream after the op: at the end, the block's output
};
std::vector<OpGradients> BlockGradientFlow(const ModelSpec& spec, const std::vector<BlockOp>& layout,
                                           bool input_grad) {
  std::vector<OpGradients> flow;
  bool stream = input_grad;  // the residual stream
  bool current = stream;
  OpGradients at;
  for (const BlockOp& op : layout) {
    at.input = current;
    switch (op.kind) {
      case BlockOpKind::kQkvProjection:
        at.q = current || IsLoraTarget(spec, "q_proj");
        at.k = current || IsLoraTarget(spec, "k_proj");
        at.v = current || IsLoraTarget(spec, "v_proj");
        break;
      case BlockOpKind::kAttention: at.attention = at.q || at.k || at.v; break;
      case BlockOpKind::kShortConv:
        // The conv's products (at.attention) and its output: an adapter
        // makes them require grad where the input does not (LoRA, block 0).
        at.attention = current || IsLoraTarget(spec, "in_proj");
        current = at.attention || IsLoraTarget(spec, "out_proj");
        break;
      case BlockOpKind::kGatedDeltaNet:
        // The conv's and the delta rule's tensors (at.attention) and the output.
        at.attention = current || IsLoraTarget(spec, kInProjQkv) || IsLoraTarget(spec, kInProjZ) ||
                       IsLoraTarget(spec, kInProjB) || IsLoraTarget(spec, kInProjA);
        current = at.attention || IsLoraTarget(spec, kOutProj);
        break;
      case BlockOpKind::kOutProjection:
        at.input = at.attention;
        current = at.attention || IsLoraTarget(spec, "o_proj");
        break;
      case BlockOpKind::kResidualAdd:
        stream = stream || current;
        current = stream;
        break;
      case BlockOpKind::kPerLayerInput:
        // at.gate: the gate's output; at.up: the product, which the trained
        // per-layer inputs make require grad whatever the stream does.
        at.gate = current || IsLoraTarget(spec, kPerLayerInputGate);
        at.up = at.gate || BaseWeightsTrain(spec);
        current = at.up || IsLoraTarget(spec, kPerLayerProjection);
        break;
      case BlockOpKind::kMoe:
        at.up = current || BaseWeightsTrain(spec);
        current = at.up;
        break;
      case BlockOpKind::kMlp:
        at.up = current || IsLoraTarget(spec, "up_proj");
        at.gate = GatedMlp(spec) && (current || IsLoraTarget(spec, "gate_proj"));
        current = at.gate || at.up || IsLoraTarget(spec, kDownProj);
        break;
      default: break;
    }
    at.stream = stream;
    flow.push_back(at);
  }
  return flow;
}

}  // namespace

bool BlockInputRequiresGrad(const ModelSpec& spec, int layer, const SavePolicy& saves) {
  bool grad = EmbeddingOutputRequiresGrad(spec, saves);
  // Once the stream requires grad it does to the end; until then a block without adapters passes none on.
  for (int l = 0; l < layer && !grad; ++l) grad = BlockGradientFlow(spec, BlockLayout(spec, l), grad).back().stream;
  return grad;
}

bool RunsBackward(const ModelSpec& spec, const TensorSpec& param, const SavePolicy& saves) {
  if (IsUnusedOriginal(param.name())) return false;
  if (param.part() != PART_LANGUAGE_MODEL) {
    // A vision-language model's tower and projector: without a graph in the
    // tower only a trained projector; with one, all but what lies past the
    // selected features (llava's last blocks and post_layernorm).
    const VisionLanguageSpec& v = spec.vision_language();
    if (!TowerBuildsGraph(spec, saves)) return param.part() == PART_PROJECTOR && !v.freeze_projector();
    if (param.part() == PART_PROJECTOR) return true;
    return param.layer() < 0 ? !absl::StrContains(param.name(), kTowerPooledNorm)
                             : param.layer() < TowerBlocksWithGradient(v);
  }
  if (BaseWeightsTrain(spec) || !param.frozen()) return true;
  if (absl::StartsWith(param.name(), "embed_")) return false;
  if (param.layer() < 0 || BlockInputRequiresGrad(spec, param.layer(), saves)) return true;
  // A frozen module of a block whose input does not require grad runs
  // backward when its own input does (its output then does too): find its
  // op through the layout.
  const std::vector<BlockOp> layout = BlockLayout(spec, param.layer());
  const std::vector<OpGradients> flow = BlockGradientFlow(spec, layout, false);
  absl::string_view rest;
  const int i = OpOfParameter(spec, layout, param.name(), &rest);
  if (i < 0) return true;
  switch (layout[i].kind) {
    case BlockOpKind::kQkNorm: return absl::StartsWith(rest, kQNorm) ? flow[i].q : flow[i].k;
    case BlockOpKind::kMlp:
      return absl::StartsWith(rest, kDownProj) ? flow[i].gate || flow[i].up : flow[i].input;
    default: return flow[i].input;
  }
}

bool IsLoraTarget(const ModelSpec& spec, absl::string_view module) {
  if (!spec.has_lora()) return false;
  module.remove_prefix(module.rfind('.') == absl::string_view::npos ? 0 : module.rfind('.') + 1);
  for (const std::string& target : spec.lora().target_modules()) {
    if (target == module) return true;
  }
  return false;
}

bool IsLoraAdapter(const TensorSpec& tensor) {
  return absl::StrContains(tensor.name(), kLoraAName) || absl::StrContains(tensor.name(), kLoraBName);
}

int64_t CountParameters(const ModelSpec& spec) {
  int64_t total = 0;
  for (const TensorSpec& t : ParameterInventory(spec)) total += NumElements(t);
  return total;
}

namespace {

// What one norm over the last dimension of `shape` saves (see below) when
// its input requires grad; RMSNorm's `weight * normalized` keeps the
// normalized input only for a weight that trains.
void AppendNormSaved(const ModelSpec& spec, const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                     KernelDevice device, int layer, std::vector<TensorSpec>* out, bool weighted = true) {
  const std::vector<int64_t> rows(shape.begin(), shape.end() - 1);
  auto act = [&](const std::string& suffix, const std::vector<int64_t>& dims, DType t) {
    out->push_back(Make(name + suffix, dims, t, ROLE_ACTIVATION, layer));
  };
  if (spec.norm_type() == NORM_LAYERNORM) {
    // ATen's layer_norm keeps mean and rstd in the input's dtype on the CPU
    // (layer_norm_cpu), in fp32 on CUDA (the accumulate type).
    const DType stats = device == KernelDevice::kCpu ? dtype : DTYPE_FP32;
    act(".input", shape, dtype);
    act(".mean", rows, stats);
    act(".rstd", rows, stats);
  } else {
    act(".input_fp32", shape, DTYPE_FP32);
    if (weighted && BaseWeightsTrain(spec)) act(".normalized", shape, spec.norm_weight_in_fp32() ? DTYPE_FP32 : dtype);
    act(".rstd", rows, DTYPE_FP32);  // HF RMSNorm computes it in fp32
    // Gemma4RMSNorm's torch.pow(mean_squared, -0.5) keeps its input too.
    if (spec.norm_pow_mean_square()) act(".mean_square", rows, DTYPE_FP32);
  }
}

}  // namespace

int64_t DeltaRuleAlignedFp32Bytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype) {
  if (dtype != DTYPE_FP32 || s % kDeltaRuleChunkTokens != 0) return 0;
  const DeltaRuleWidths w = DeltaRuleWidthsOf(spec);
  const int64_t chunks = DeltaRuleChunks(s);
  const int64_t keys = 4 * b * w.value_heads * chunks * kDeltaRuleChunkTokens * w.key_dim;  // [b, hv, padded, dk]
  const bool slice_copies = b >= 2 && w.key_heads != w.value_heads;
  if (chunks >= 2) return 4 * keys - (slice_copies ? keys / chunks : 0);
  return slice_copies ? 2 * keys : 0;
}

namespace {

// Qwen3_5RMSNormGated over [b s hv, dv] (torch in every environment: it is
// a Hub kernel only): its fp32 input, rstd, the normalized input cast back
// (for a weight that trains), z in fp32, silu(z), the weighted normalized
// input.
void AppendGatedNormSaved(const ModelSpec& spec, const std::string& module, int64_t b, int64_t s, DType dtype,
                          int layer, std::vector<TensorSpec>* out) {
  const DeltaRuleWidths w = DeltaRuleWidthsOf(spec);
  const int64_t hv = w.value_heads, dv = w.value_dim;
  auto act = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    out->push_back(Make(module + name, std::move(shape), t, ROLE_ACTIVATION, layer));
  };
  act("norm_input_fp32", {b, s, hv, dv}, DTYPE_FP32);
  act("norm_rstd", {b, s, hv}, DTYPE_FP32);
  if (BaseWeightsTrain(spec)) act("norm_normalized", {b, s, hv, dv}, dtype);  // kept for the weight's gradient
  act("z_fp32", {b, s, hv, dv}, DTYPE_FP32);
  act("z_silu", {b, s, hv, dv}, DTYPE_FP32);
  act("norm_weighted", {b, s, hv, dv}, dtype);
}

// What Qwen3_5GatedDeltaNet keeps between its input projections and
// out_proj, through transformers' torch fallbacks (LINEAR_ATTENTION_TORCH;
// modeling_qwen3_5.py: causal_conv1d_fn, torch_chunk_gated_delta_rule,
// Qwen3_5RMSNormGated), measured with tools/saved_tensors.py
// (docs/family_sources.md): exact in bf16. The chunked tensors are named
// "<module>chunks.*" (kDeltaRuleChunks): their sizes follow the padded
// length, which the fits of memory_model.cc take apart.
void AppendDeltaRuleSaved(const ModelSpec& spec, const std::string& module, int64_t b, int64_t s, DType dtype,
                          int layer, std::vector<TensorSpec>* out) {
  const DeltaRuleWidths w = DeltaRuleWidthsOf(spec);
  const int64_t hv = w.value_heads, dk = w.key_dim, dv = w.value_dim, kernel = spec.conv_kernel_size();
  const int64_t chunks = DeltaRuleChunks(s), padded = chunks * kDeltaRuleChunkTokens;
  const int64_t c = kDeltaRuleChunkTokens;
  auto act = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    out->push_back(Make(module + name, std::move(shape), t, ROLE_ACTIVATION, layer));
  };
  auto chunked = [&](const std::string& name, std::vector<int64_t> shape) {
    act(absl::StrCat(kDeltaRuleChunks, name), std::move(shape), DTYPE_FP32);
  };
  // The conv: its input (in_proj_qkv's output, transposed), its padded
  // output (the fallback's silu keeps a slice of it; causal-conv1d's kernel
  // fuses silu); sigmoid(b); the decay's -exp(A_log) and softplus(a +
  // dt_bias), in fp32.
  act("conv_input", {b, s, w.conv_channels()}, dtype);
  if (spec.short_conv_impl() != SHORT_CONV_CAUSAL_CONV1D) {
    act("conv_output", {b, w.conv_channels(), s + kernel - 1}, dtype);
  }
  act("beta", {b, s, hv}, dtype);
  if (spec.linear_attention_impl() == LINEAR_ATTENTION_FLA) {
    // ChunkGatedDeltaRuleFunction.forward's save_for_backward: q and k
    // l2-normalized in the kernel, unrepeated, with fp32 rstds; v made
    // contiguous by input_guard; g's chunk-local cumsum (fp32); beta (the
    // module's, above); A, the solved intra-chunk matrix [b, s, hv, 64] in
    // k's dtype. w, u, h and v_new are recomputed in backward.
    act("softplus_input", {b, s, hv}, DTYPE_FP32);
    act("softplus", {b, s, hv}, DTYPE_FP32);
    chunked("decay_rate", {2, hv});  // a constant: the fits take it with the chunks'
    for (const char* t : {"q", "k"}) {
      act(absl::StrCat(t, "_normalized"), {b, s, w.key_heads, dk}, dtype);
      act(absl::StrCat(t, "_rstd"), {b, s, w.key_heads}, DTYPE_FP32);
    }
    act("v", {b, s, hv, dv}, dtype);
    act("g_cumsum", {b, s, hv}, DTYPE_FP32);
    act("intra_chunk_solved", {b, s, hv, c}, dtype);
    AppendGatedNormSaved(spec, module, b, s, dtype, layer, out);
    return;
  }
  // In fp32 with as many key heads as value heads (nothing repeats them),
  // one [b, s, hv, dv] more (measured; the value's .to(float32) aliasing).
  if (dtype == DTYPE_FP32 && w.key_heads == hv) act("value_fp32", {b, s, hv, dv}, DTYPE_FP32);
  act("softplus_input", {b, s, hv}, DTYPE_FP32);
  act("softplus", {b, s, hv}, DTYPE_FP32);
  // l2norm of q and k (repeated to the value heads), in fp32: x and 1 / |x|.
  for (const char* t : {"q", "k"}) {
    act(absl::StrCat(t, "_fp32"), {b, hv, s, dk}, DTYPE_FP32);
    act(absl::StrCat(t, "_inv_norm"), {b, hv, s, 1}, DTYPE_FP32);
  }
  chunked("decay_rate", {2, hv});  // exp(A_log.float()) and its negation
  chunked("upper_mask", {c, c});   // strictly_upper_mask, a bool [c, c]
  out->back().set_dtype(DTYPE_BOOL);
  // Padded to whole chunks: beta, v, k, the scaled q, k x beta; the
  // pairwise decay, k_beta kᵀ, q kᵀ, the UT system and the intra-chunk
  // attention [b, hv, chunks, c, c]; three exp tables of the cumulative
  // decay and the chunks' decay; the triangular solves' results; q and k
  // decayed; the recurrent state before each chunk; each chunk's v_new.
  chunked("beta", {b, hv, padded});
  chunked("v", {b, hv, padded, dv});
  chunked("k", {b, hv, padded, dk});
  chunked("q", {b, hv, padded, dk});
  chunked("k_beta", {b, hv, padded, dk});
  for (const char* t : {"pairwise_decay", "k_beta_k", "q_k", "ut_system", "intra_chunk_attn"}) {
    chunked(t, {b, hv, chunks, c, c});
  }
  for (const char* t : {"decay_exp_q", "decay_exp_k_beta", "decay_exp_k"}) chunked(t, {b, hv, padded});
  chunked("chunk_decay", {b, hv, chunks});
  chunked("new_values", {b, hv, padded, dv});
  chunked("k_cumdecay", {b, hv, padded, dk});
  chunked("q_decayed", {b, hv, padded, dk});
  // One chunk: torch's matmul keeps one [b, hv, padded, dk] less (measured; its batch folding of a single chunk).
  if (chunks > 1) chunked("k_decayed", {b, hv, padded, dk});
  chunked("states", {chunks, b, hv, dk, dv});
  if (const int64_t aligned = DeltaRuleAlignedFp32Bytes(spec, b, s, dtype); aligned > 0) {
    act("aligned_fp32_copies", {aligned / 4}, DTYPE_FP32);  // not "chunks.": the fits leave it to StepSizer
  }
  chunked("v_new", {b, hv, padded, dv});
  AppendGatedNormSaved(spec, module, b, s, dtype, layer, out);
}

}  // namespace

DType DropoutSavedDType(DType input, KernelDevice device) {
  return device == KernelDevice::kCpu ? input : DTYPE_BOOL;
}

bool SdpaRunsMath(const ModelSpec& spec, KernelDevice device) {
  return spec.attention_impl() == ATTENTION_SDPA && device == KernelDevice::kCpu && spec.attention_dropout() > 0;
}

bool LatentSdpaRunsMath(const ModelSpec& spec, KernelDevice device) {
  const LatentAttentionSpec& l = spec.latent_attention();
  return spec.has_latent_attention() && device == KernelDevice::kCpu &&
         l.qk_nope_head_dim() + l.qk_rope_head_dim() != l.v_head_dim();
}

bool SdpaSlidingMaskAt(const ModelSpec& spec, int64_t seq_length) {
  return spec.attention_impl() == ATTENTION_SDPA && spec.sliding_window() > 0 && seq_length >= spec.sliding_window();
}

bool SdpaRepeatsKvAt(const ModelSpec& spec, int64_t head_dim, bool masked) {
  const int64_t kv = spec.num_kv_heads();
  return spec.attention_impl() == ATTENTION_SDPA && kv != spec.num_attention_heads() &&
         (masked || head_dim > kSdpaGqaMaxHeadDim);
}

bool SdpaRepeatsKv(const ModelSpec& spec, int layer, bool masked) {
  return SdpaRepeatsKvAt(spec, HeadDimOf(spec, layer), masked);
}

bool LayerSlides(const ModelSpec& spec, int layer) {
  return spec.sliding_window() > 0 &&
         (spec.layer_types().empty() || spec.layer_types(layer) == LAYER_SLIDING_ATTENTION);
}

// What each op of a block (block_layout.h) keeps for backward in
// transformers' implementation, which the executor's block saves too (ATen saves only the inputs a gradient
// formula needs; a shared input is one tensor):
//   RMSNorm      transformers' LlamaRMSNorm (Qwen2/3, Mistral alike): the
//                input upcast to fp32 (x.to(float32) saved by pow and mul;
//                the input itself in fp32), fp32 rstd, the normalized
//                x*rstd cast back to the working dtype (saved by weight*)
//   LayerNorm    input x, fp32 mean and rstd (at::native_layer_norm)
//   q/k/v proj   the norm's output n1 (post-norm blocks: the stream) [b,s,h]
//   qk-norm      Qwen3's RMSNorm over head_dim on q and k, as above (Olmo2:
//                over the whole projection)
//   fp32 weight  Olmo2RMSNorm multiplies by its weight in fp32: the
//                normalized input is kept in fp32
//   RoPE         nothing (multiplies by constant cos/sin); Glm4's per-layer
//                interleaved copies of the tables [s, rotary_dim] x2
//   attention    SDPA: q, k, v (rotated), output, fp32 logsumexp [b,a,s]
//                SDPA's math path (CPU with dropout; attention.cpp
//                _scaled_dot_product_attention_math): q and k scaled and v,
//                all upcast to fp32 and expanded to all heads, the fp32
//                softmax output, dropout noise and dropped probabilities
//                eager (transformers' eager_attention_forward): q, k and v
//                expanded to all heads (repeat_kv), the fp32 softmax output
//                and its cast to the working dtype [b,a,s,s] (GPT-2: one
//                softmax output in the working dtype; with dropout: the
//                dropped probabilities and the mask instead), output
//   o_proj       attention output (the same tensor as above)
//   residual     nothing
//   mlp norm     residual stream h1, rstd; FFN input n2            [b,s,h]
//   post-norm    as a norm, over o_proj's and the MLP's outputs; the MLP
//                reads (and keeps) the residual stream h1
//   SwiGLU       gate, up, silu(gate), silu(gate)*up               [b,s,f] x4
//   GELU MLP     up output, gelu output                            [b,s,f] x2
//   gelu_new     transformers' NewGELUActivation also: 0.5x, tanh, 1+tanh [b,s,f] x3
//   dropout      the mask (DropoutSavedDType) on the attention and MLP
//                outputs before their residual adds; the dropped output
//                itself is saved by nobody
// With frozen weights (LoRA) autograd keeps less (docs/deepspeed_model.md
// row 29): a frozen linear or norm weight keeps none of its input, and a
// tensor that does not require grad is kept by nobody -- block 0's input
// with a frozen embedding, and what derives from it alone. A LoRA target
// keeps x for lora_A (with dropout: the mask and its own dropped x) and
// lora_A's output [b,s,r] for lora_B.
std::vector<TensorSpec> BlockSavedActivations(const ModelSpec& spec, int64_t b, int64_t s, DType dtype, int layer,
                                              KernelDevice device, const SavePolicy& saves) {
  std::vector<TensorSpec> out;
  const std::string p = absl::StrCat("layers.", layer);
  const int64_t h = spec.hidden_size();
  const int64_t a = spec.num_attention_heads();
  const int64_t d = HeadDimOf(spec, layer);
  const int64_t kv = spec.num_kv_heads();
  const int64_t f = spec.ffn_hidden_size();
  auto act = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    out.push_back(Make(p + "." + name, std::move(shape), t, ROLE_ACTIVATION, layer));
  };
  auto norm = [&](const std::string& name, const std::vector<int64_t>& shape) {
    AppendNormSaved(spec, p + "." + name, shape, dtype, device, layer, &out);
  };
  const bool lora = spec.has_lora();
  const DType adapter = saves.adapter_dtype == DTYPE_UNSPECIFIED ? dtype : saves.adapter_dtype;
  // x itself is lora_A's input: same dtype, no dropout.
  const bool adapters_share_input = adapter == dtype && lora && spec.lora().dropout() == 0;
  // A linear's adapters: lora_A's input when it is not x (a dropped copy,
  // and the mask when x requires grad; or x cast to the adapters' dtype)
  // and lora_A's output.
  auto adapters = [&](const std::string& module, int64_t in, bool input_grad) {
    if (!IsLoraTarget(spec, module)) return;
    if (spec.lora().dropout() > 0) {
      if (input_grad) act(module + ".lora_dropout_mask", {b, s, in}, DropoutSavedDType(adapter, device));
      act(module + ".lora_dropped_input", {b, s, in}, adapter);
    } else if (!adapters_share_input) {
      act(module + ".lora_input", {b, s, in}, adapter);
    }
    act(module + kLoraAName + ".output", {b, s, spec.lora().rank()}, adapter);
  };
  // Whether a block linear keeps its input x for backward: a trainable
  // weight's gradient needs it, LinearSaves::kAlways keeps it whenever x
  // requires grad (a frozen layer is not recorded otherwise), and lora_A
  // keeps it when it is its own input.
  auto saves_input = [&](absl::string_view module, bool input_grad) {
    return BaseWeightsTrain(spec) || (saves.linear == LinearSaves::kAlways && input_grad) ||
           (adapters_share_input && IsLoraTarget(spec, module));
  };
  // The block's ops in order (block_layout.h), with which of their tensors
  // require grad.
  const std::vector<BlockOp> layout = BlockLayout(spec, layer);
  const std::vector<OpGradients> flow = BlockGradientFlow(spec, layout, BlockInputRequiresGrad(spec, layer, saves));
  std::string current;  // the norm whose output the next op reads ("": none)
  bool output_kept = false;
  for (size_t i = 0; i < layout.size(); ++i) {
    const BlockOp& op = layout[i];
    const OpGradients& grad = flow[i];
    const bool current_grad = grad.input;
    const bool q_grad = grad.q, k_grad = grad.k, v_grad = grad.v, attention_grad = grad.attention;
    const std::string m = op.module + ".";
    const std::vector<BlockLinear> linears = OpLinears(spec, op);
    // What the op's projections read: a pre-norm's output, or the residual stream itself (post-norm blocks).
    auto read_name = [&] { return current.empty() ? m + "input" : current + ".output"; };
    switch (op.kind) {
      case BlockOpKind::kNorm:
        if (current_grad) norm(op.module, {b, s, h});
        current = op.module;
        break;
      case BlockOpKind::kQkvProjection: {
        if (spec.has_latent_attention()) {
          // DeepseekV3Attention (measured with tools/saved_tensors.py): q_a_proj
          // and kv_a_proj_with_mqa keep x, each norm what a norm keeps, q_b_proj
          // and kv_b_proj their norm's output. kv_a_layernorm reads the first
          // kv_lora_rank of kv_a_proj_with_mqa's output: .to(float32) copies that
          // slice, or in fp32 is the slice itself, a view keeping all of it.
          const LatentAttentionSpec& l = spec.latent_attention();
          if (!current_grad && !BaseWeightsTrain(spec)) break;
          if (BaseWeightsTrain(spec)) act(read_name(), {b, s, h}, dtype);
          if (l.q_lora_rank() > 0) {
            norm(m + kQALayernorm, {b, s, l.q_lora_rank()});
            if (BaseWeightsTrain(spec)) act(m + kQALayernorm + ".output", {b, s, l.q_lora_rank()}, dtype);
          }
          const size_t first = out.size();
          norm(m + kKvALayernorm, {b, s, l.kv_lora_rank()});
          if (dtype == DTYPE_FP32) out[first].set_shape(2, l.kv_lora_rank() + l.qk_rope_head_dim());
          if (BaseWeightsTrain(spec)) act(m + kKvALayernorm + ".output", {b, s, l.kv_lora_rank()}, dtype);
          break;
        }
        bool keeps = false;
        for (const BlockLinear& l : linears) keeps = keeps || saves_input(l.name, current_grad);
        if (keeps) act(read_name(), {b, s, h}, dtype);
        for (const BlockLinear& l : linears) adapters(m + std::string(l.name), l.in_features, current_grad);
        break;
      }
      case BlockOpKind::kQkNorm:
        if (spec.qk_norm_over_projection()) {
          if (q_grad) norm(m + kQNorm, {b, s, a * d});
          if (k_grad) norm(m + kKNorm, {b, s, kv * d});
        } else {
          if (q_grad) {
            const size_t first = out.size();
            norm(m + kQNorm, {b, s, a, d});
            // Qwen3_5Attention's query is a chunk of q_proj's [b, s, a, 2d]
            // output: in fp32, x.to(float32) aliases it, and the norm keeps all of it.
            if (spec.attention_output_gate() && dtype == DTYPE_FP32) out[first].set_shape(3, 2 * d);
          }
          if (k_grad) norm(m + kKNorm, {b, s, kv, d});
        }
        // Gemma 4's v_norm, without a weight.
        if (spec.value_norm() && v_grad) {
          AppendNormSaved(spec, p + "." + m + kVNorm, {b, s, kv, d}, dtype, device, layer, &out, /*weighted=*/false);
        }
        break;
      case BlockOpKind::kAttention: {
        const bool attention_dropout = spec.attention_dropout() > 0;
        if (!attention_grad) {
          // Nothing of the attention is recorded.
        } else if (spec.has_latent_attention()) {
          // q is torch.cat(q_pass, q_rot), k expand_kv's new [b, a, s, nope +
          // rope], v a view of kv_b_proj's [b, s, a, nope + v] output. SDPA's
          // math path (LatentSdpaRunsMath; _scaled_dot_product_attention_math)
          // keeps q x scale, k and v, upcast to fp32, and the fp32 softmax
          // output; a fused kernel (CUDA's efficient one, or flash with heads
          // of one width) q, k, all of kv_b_proj's output, its logsumexp and
          // its output.
          const LatentAttentionSpec& l = spec.latent_attention();
          const int64_t dv = l.v_head_dim();
          if (LatentSdpaRunsMath(spec, device)) {
            act(m + "q_fp32", {b, a, s, d}, DTYPE_FP32);
            act(m + "k_fp32", {b, a, s, d}, DTYPE_FP32);
            act(m + "probs_fp32", {b, a, s, s}, DTYPE_FP32);
            act(m + "v_fp32", {b, a, s, dv}, DTYPE_FP32);
          } else {
            act(m + "q", {b, a, s, d}, dtype);
            act(m + "k", {b, a, s, d}, dtype);
            act(m + "kv", {b, s, a * (l.qk_nope_head_dim() + dv)}, dtype);
            act(m + "logsumexp", {b, a, s}, DTYPE_FP32);
          }
        } else if (spec.attention_impl() == ATTENTION_EAGER && spec.attention_sinks()) {
          // GptOss's eager_attention_forward: the matmuls keep q, k and v
          // expanded to every head; max its int64 indices [b, a, s, 1];
          // softmax in the working dtype its output with the sink column
          // [b, a, s, s + 1], of which the second matmul keeps a view (or,
          // with dropout, the dropped probabilities and dropout's mask).
          const bool scores_grad = q_grad || k_grad;
          if (k_grad) act(m + "q", {b, a, s, d}, dtype);
          if (q_grad) act(m + "k", {b, a, s, d}, dtype);
          if (scores_grad) act(m + "v", {b, a, s, d}, dtype);
          if (scores_grad) act(m + "max_index", {b, a, s, 1}, DTYPE_INT64);
          if (scores_grad || (v_grad && !attention_dropout)) act(m + "probs_softmax", {b, a, s, s + 1}, dtype);
          if (attention_dropout && scores_grad) {
            act(m + "probs_dropout_mask", {b, a, s, s}, DropoutSavedDType(dtype, device));
          }
          if (attention_dropout && v_grad) act(m + "probs_dropped", {b, a, s, s}, dtype);
        } else if (spec.attention_impl() == ATTENTION_EAGER) {
          // The matmuls keep k and v expanded to every query head (repeat_kv
          // for GQA); softmax keeps its output, the second matmul that (GPT-2:
          // softmax in the working dtype) or its cast (an fp32 softmax) or,
          // with dropout, the dropped probabilities (dropout keeps its mask).
          // A matmul keeps each operand only for the other's gradient.
          const bool scores_grad = q_grad || k_grad;
          if (k_grad) act(m + "q", {b, a, s, d}, dtype);
          if (q_grad) act(m + "k", {b, a, s, d}, dtype);
          if (scores_grad) act(m + "v", {b, a, s, d}, dtype);
          const DType softmax_dtype = spec.eager_softmax_in_working_dtype() ? dtype : DTYPE_FP32;
          if (scores_grad) {
            act(m + (softmax_dtype == DTYPE_FP32 ? "probs_fp32" : "probs_softmax"), {b, a, s, s}, softmax_dtype);
          }
          // Gemma 2's softcap, cap x tanh(scores / cap): tanh keeps its output.
          if (scores_grad && spec.attn_logit_softcapping() > 0) act(m + "scores_tanh", {b, a, s, s}, dtype);
          if (attention_dropout && scores_grad) {
            act(m + "probs_dropout_mask", {b, a, s, s}, DropoutSavedDType(dtype, device));
          }
          if (v_grad && attention_dropout) {
            act(m + "probs_dropped", {b, a, s, s}, dtype);
          } else if (v_grad && (dtype != softmax_dtype || !scores_grad)) {
            act(m + (scores_grad ? "probs" : "probs_softmax"), {b, a, s, s}, dtype);
          }
        } else if (SdpaRunsMath(spec, device)) {
          for (const char* name : {"q_fp32", "k_fp32", "v_fp32"}) act(m + name, {b, a, s, d}, DTYPE_FP32);
          act(m + "probs_fp32", {b, a, s, s}, DTYPE_FP32);
          act(m + "probs_dropout_mask", {b, a, s, s}, DropoutSavedDType(DTYPE_FP32, device));
          act(m + "probs_dropped", {b, a, s, s}, DTYPE_FP32);
        } else if (const bool masked = saves.sdpa_sliding_mask && LayerSlides(spec, layer);
                   masked || SdpaRepeatsKv(spec, layer, masked)) {
          // With a mask (or heads wider than 256), sdpa_attention_forward
          // repeats k and v to every query head (use_gqa_in_sdpa is false):
          // the kernel keeps those copies (a view of one key head), and the
          // projections' outputs go. ATen's convert_boolean_attn_mask turns
          // the bool mask into an additive one [b, 1, s, s] in the working
          // dtype, which the kernel keeps.
          act(m + "q", {b, a, s, d}, dtype);
          const bool repeated = SdpaCopiesKv(spec, SdpaRepeatsKv(spec, layer, masked));
          act(m + (repeated ? "k_repeated" : "k"), {b, repeated ? a : kv, s, d}, dtype);
          if (repeated || !spec.fused_qkv_projection()) {
            act(m + (repeated ? "v_repeated" : "v"), {b, repeated ? a : kv, s, d}, dtype);
          } else {
            act(m + "qkv", {b, s, (a + 2 * kv) * d}, dtype);
          }
          if (masked) act(m + "sliding_mask", {b, 1, s, s}, dtype);
          act(m + "logsumexp", {b, a, s}, DTYPE_FP32);
        } else {
          act(m + "q", {b, a, s, d}, dtype);
          act(m + "k", {b, kv, s, d}, dtype);
          // RoPE makes q and k new tensors; v stays a view of its projection's
          // output, which the kernel keeps whole: a fused qkv_proj's all of it.
          if (spec.fused_qkv_projection()) {
            act(m + "qkv", {b, s, (a + 2 * kv) * d}, dtype);
          } else {
            act(m + "v", {b, kv, s, d}, dtype);
          }
          act(m + "logsumexp", {b, a, s}, DTYPE_FP32);
        }
        // Glm4's interleaved cos and sin, made per layer, kept by the multiplies with q and k.
        if (spec.rope_interleaved() && spec.position_embedding() == POSITION_ROPE && (q_grad || k_grad)) {
          const int64_t rotary_dim = RotaryDims(spec);
          act(m + "rope_cos", {s, rotary_dim}, dtype);
          act(m + "rope_sin", {s, rotary_dim}, dtype);
        }
        // SDPA's flash kernel keeps its output itself.
        output_kept = attention_grad && spec.attention_impl() == ATTENTION_SDPA && !SdpaRunsMath(spec, device) &&
                      !LatentSdpaRunsMath(spec, device);
        break;
      }
      case BlockOpKind::kOutProjection: {
        // Qwen3_5Attention: attn_output * sigmoid(gate), then o_proj. The
        // product keeps both factors (sigmoid its output) while the gate
        // (q_proj's) requires grad, o_proj keeps the product.
        const bool gated = spec.attention_output_gate();
        const int64_t dv = ValueHeadDimOf(spec, layer);
        // The attention output: kept by the attention kernel, else by o_proj (or the gate's product).
        const bool output_read = gated ? q_grad : saves_input("o_proj", attention_grad);
        if (output_kept || output_read) act(m + "output", {b, s, a * dv}, dtype);
        // The kernel's output in q's [b, heads, s, d] layout: o_proj (or the gate's product) keeps the contiguous copy besides it.
        if (output_kept && (spec.rope_concatenates() || spec.has_latent_attention()) && output_read) {
          act(m + "output_copy", {b, s, a * dv}, dtype);
        }
        if (gated && attention_grad) act(m + "gate_sigmoid", {b, s, a * dv}, dtype);
        if (gated && saves_input("o_proj", q_grad || attention_grad)) act(m + "gated_output", {b, s, a * dv}, dtype);
        adapters(m + "o_proj", a * dv, attention_grad);
        current.clear();
        break;
      }
      case BlockOpKind::kShortConv: {
        // Lfm2ShortConv.forward (transformers' causal_conv1d_fn fallback,
        // the path without the causal-conv1d kernel): in_proj keeps its
        // input; B x keeps B and x, views of in_proj's [b, s, 3h] output,
        // which keeps it whole (C's product keeps C, a view too); the conv
        // keeps its input B x; the product C y keeps the conv's output, a
        // view of the padded [b, h, s + kernel - 1] F.conv1d made; out_proj
        // keeps the product's contiguous [b, s, h] copy. causal-conv1d's
        // CausalConv1dFn keeps the same input, and its output is unpadded.
        const int64_t conv_length =
            spec.short_conv_impl() == SHORT_CONV_CAUSAL_CONV1D ? s : s + spec.conv_kernel_size() - 1;
        if (saves_input("in_proj", current_grad)) act(read_name(), {b, s, h}, dtype);
        adapters(m + "in_proj", h, current_grad);
        if (attention_grad) {
          act(m + "bcx", {b, s, 3 * h}, dtype);
          act(m + "conv_input", {b, h, s}, dtype);
          act(m + "conv_output", {b, h, conv_length}, dtype);
        }
        if (saves_input("out_proj", attention_grad)) act(m + "output", {b, s, h}, dtype);
        adapters(m + "out_proj", h, attention_grad);
        current.clear();
        break;
      }
      case BlockOpKind::kGatedDeltaNet: {
        bool keeps = false;  // the input projections' input
        for (const BlockLinear& l : linears) keeps = keeps || (l.name != kOutProj && saves_input(l.name, current_grad));
        if (keeps) act(read_name(), {b, s, h}, dtype);
        for (const BlockLinear& l : linears) {
          if (l.name != kOutProj) adapters(m + std::string(l.name), h, current_grad);
        }
        if (attention_grad) AppendDeltaRuleSaved(spec, p + "." + m, b, s, dtype, layer, &out);
        const int64_t values = DeltaRuleWidthsOf(spec).values();
        if (saves_input(kOutProj, attention_grad)) act(m + "output", {b, s, values}, dtype);
        adapters(m + kOutProj, values, attention_grad);
        current.clear();
        break;
      }
      case BlockOpKind::kPerLayerInput: {
        // Gemma4TextDecoderLayer: per_layer_input_gate keeps the stream, the
        // activation its output, the product act and (a view of the model's
        // per-layer inputs, no bytes of its own) the layer's slice,
        // per_layer_projection the product.
        const int64_t ple = spec.per_layer_input_size();
        if (saves_input(kPerLayerInputGate, current_grad)) act(read_name(), {b, s, h}, dtype);
        adapters(m + kPerLayerInputGate, h, current_grad);
        if (grad.gate) act(m + "gate", {b, s, ple}, dtype);
        if (BaseWeightsTrain(spec)) act(m + "act", {b, s, ple}, dtype);  // for the per-layer inputs' gradient
        if (saves_input(kPerLayerProjection, grad.up)) act(m + "product", {b, s, ple}, dtype);
        adapters(m + kPerLayerProjection, ple, grad.up);
        current.clear();
        break;
      }
      case BlockOpKind::kResidualDropout:
        if (current_grad) act(m + "resid_dropout_mask", {b, s, h}, DropoutSavedDType(dtype, device));
        break;
      case BlockOpKind::kResidualScale:  // a product with a Python float saves nothing
        break;
      case BlockOpKind::kResidualAdd:
        current.clear();
        break;
      case BlockOpKind::kMoe: {
        // What a *SparseMoeBlock under grouped_mm keeps (measured with
        // tools/saved_tensors.py; integrations/moe.py,
        // grouped_mm_experts_forward), T = b·s tokens and S = T·k pairs. A
        // frozen block whose input requires grad keeps what the input's
        // gradient needs: not the input of its linears and grouped products.
        if (!current_grad && !BaseWeightsTrain(spec)) break;
        const bool trains = BaseWeightsTrain(spec);
        const MoeSpec& moe = spec.moe();
        const int64_t e = moe.num_experts(), k = moe.experts_per_token(), fe = moe.expert_ffn_hidden_size();
        const int64_t fs = moe.shared_expert_ffn_hidden_size();
        // The router's, the shared expert's and its gate's input: their
        // linears (F.linear, which zero.Init's memory_efficient_linear
        // replaces for good: LinearSaves::kAlways).
        if (moe.router_sigmoid_grouped()) {
          // DeepseekV3TopkRouter's F.linear of x and the weight, both cast to
          // fp32: each copy kept for the other's gradient (in fp32 the casts
          // are x and the parameter themselves). The shared experts keep x
          // itself, to their backward (the half's first: its tail), unless the
          // router keeps it too.
          const bool router_keeps_x = saves_input(kRouter, current_grad);
          const bool shared_keeps_x = fs > 0 && saves_input(kSharedExpert, current_grad);
          if (dtype != DTYPE_FP32) {
            if (router_keeps_x) act(m + "router.input_fp32", {b, s, h}, DTYPE_FP32);
            if (current_grad) act(m + "router.weight_fp32", {e, h}, DTYPE_FP32);
            if (shared_keeps_x) act(m + kSharedMlp + "input", {b, s, h}, dtype);
          } else if (router_keeps_x || shared_keeps_x) {
            act(router_keeps_x ? read_name() : m + kSharedMlp + "input", {b, s, h}, dtype);
          }
        } else if (saves_input(kRouter, current_grad)) {
          act(read_name(), {b, s, h}, dtype);
        }
        if (fs > 0) {
          // The shared expert first (Qwen2MoeSparseMoeBlock.forward), or
          // GraniteMoeSharedMLP after the experts: a gated MLP, its gate and
          // up one [b, s, 2 f_s] output (silu's input and up, views of it).
          const std::string se = m + (SharedExpertAfterExperts(moe) ? kSharedMlp : kSharedExpert);
          if (moe.shared_expert_fused_after_experts()) {
            act(se + "gate_up", {b, s, 2 * fs}, dtype);
          } else {
            act(se + "gate", {b, s, fs}, dtype);
            act(se + "up", {b, s, fs}, dtype);
          }
          act(se + "act", {b, s, fs}, dtype);
          if (saves_input(kDownProj, current_grad)) act(se + "product", {b, s, fs}, dtype);
        }
        // The router: softmax's fp32 output, top-k's indices, and the
        // renormalization's sum and quotient; GraniteMoe's top-k indices and
        // the softmax over them (fp32).
        if (moe.router_top_k_then_softmax()) {
          act(m + "router.top_k_indices", {b, s, k}, DTYPE_INT64);
          act(m + "router.top_k_softmax", {b, s, k}, moe.router_top_k_in_working_dtype() ? dtype : DTYPE_FP32);
        } else {
          act(m + "router.probs", {b, s, e}, DTYPE_FP32);
          act(m + "router.top_k_indices", {b, s, k}, DTYPE_INT64);
        }
        if (moe.renormalize_top_k()) {
          act(m + "router.top_k_sum", {b, s, 1}, DTYPE_FP32);
          act(m + "router.top_k_weights", {b, s, k}, DTYPE_FP32);
        }
        if (moe.experts_impl() == EXPERTS_EAGER) {
          // The eager loop's (eager_experts.h), per pair whatever the
          // routing: where's two indices, the gathered row, gate_up's output,
          // the activation, the product, the weight, down's output and the
          // weighted row index_add_ keeps (a cast of the fp32 product with
          // fp32 pair weights). Refused with frozen experts (RefuseMoeStep).
          act(m + "experts.where_indices", {b, s, k, 2}, DTYPE_INT64);
          act(m + "experts.gathered", {b, s, k, h}, dtype);
          act(m + "experts.gate_up", {b, s, k, 2 * fe}, dtype);
          act(m + "experts.act", {b, s, k, fe}, dtype);
          act(m + "experts.product", {b, s, k, fe}, dtype);
          act(m + "experts.pair_weights", {b, s, k}, moe.routing_weights_fp32() ? DTYPE_FP32 : dtype);
          act(m + "experts.down", {b, s, k, h}, dtype);
          act(m + "experts.weighted", {b, s, k, h}, dtype);
        } else {
          // The experts: the pairs' gather indices (perm // k, perm), the
          // cumulative counts per expert, the gathered tokens, gate_up's output
          // (silu's input and up, views of it), the activation, the product
          // (down's input), the pair weights, down's output (the weighting's)
          // and the inverse permutation.
          act(m + "experts.token_index", {b, s, k}, DTYPE_INT64);
          act(m + "experts.pair_index", {b, s, k}, DTYPE_INT64);
          // GPT-OSS's biases are gathered per pair by the sorted expert ids.
          if (moe.gpt_oss_experts() && trains) act(m + "experts.expert_ids", {b, s, k}, DTYPE_INT64);
          act(m + "experts.offsets", {e}, DTYPE_INT32);
          if (trains) act(m + "experts.gathered", {b, s, k, h}, dtype);
          act(m + "experts.gate_up", {b, s, k, 2 * fe}, dtype);
          if (moe.gpt_oss_experts()) {
            // GptOssExperts._apply_gate: the clamps keep gate_up (as views),
            // sigmoid its output, the products their factors: the clamped
            // gate, the sigmoid, up + 1 and gate x sigmoid.
            for (const char* name : {"gate_clamped", "gate_sigmoid", "up_plus_one", "glu"}) {
              act(m + "experts." + name, {b, s, k, fe}, dtype);
            }
          } else {
            act(m + "experts.act", {b, s, k, fe}, dtype);
        }
        if (trains) act(m + "experts.product", {b, s, k, fe}, dtype);
        act(m + "experts.pair_weights", {b, s, k}, moe.routing_weights_fp32() ? DTYPE_FP32 : dtype);
        act(m + "experts.down", {b, s, k, h}, dtype);
        act(m + "experts.inverse_index", {b, s, k}, DTYPE_INT64);
        }
        if (moe.shared_expert_gate()) {
          act(m + "shared_expert_gate.sigmoid", {b, s, 1}, dtype);
          act(m + "shared_expert.output", {b, s, h}, dtype);
        }
        current.clear();
        break;
      }
      case BlockOpKind::kMlp: {
        const bool input_grad = current_grad;
        bool keeps = false;  // the projections of the MLP's input: all but down_proj
        for (const BlockLinear& l : linears) {
          keeps = keeps || (l.name != "down_proj" && saves_input(l.name, input_grad));
        }
        if (keeps) act(read_name(), {b, s, h}, dtype);
        const bool up_grad = grad.up, gate_grad = grad.gate;
        if (GatedMlp(spec)) {
          adapters(m + "gate_proj", h, input_grad);
          adapters(m + "up_proj", h, input_grad);
          if (gate_grad && spec.fused_gate_up_projection()) {
            act(m + "gate_up", {b, s, 2 * f}, dtype);  // gate and up: views of one output, kept whole
          } else if (gate_grad) {
            act(m + "gate", {b, s, f}, dtype);  // silu's input
            act(m + "up", {b, s, f}, dtype);    // the product's, for silu(gate)'s gradient
          }
          if (up_grad) act(m + "act", {b, s, f}, dtype);     // the product's, for up's gradient
          if (saves_input("down_proj", gate_grad || up_grad)) act(m + "product", {b, s, f}, dtype);
        } else {
          adapters(m + "up_proj", h, input_grad);
          if (up_grad) {
            act(m + "up", {b, s, f}, dtype);
            if (spec.ffn_type() == FFN_QUICK_GELU) {
              // QuickGELUActivation, input * sigmoid(1.702 * input): sigmoid
              // keeps its output, the product both factors (x is up's).
              act(m + "quick_gelu_sigmoid", {b, s, f}, dtype);
            }
            if (spec.ffn_type() == FFN_GELU_NEW) {
              // 0.5 * x * (1 + tanh(c * (x + 0.044715 * x^3))): pow saves x,
              // tanh its output t, the product both factors 0.5x and 1 + t.
              act(m + "gelu_half_input", {b, s, f}, dtype);
              act(m + "gelu_tanh", {b, s, f}, dtype);
              act(m + "gelu_one_plus_tanh", {b, s, f}, dtype);
            }
          }
          if (saves_input("down_proj", up_grad)) act(m + "act", {b, s, f}, dtype);
        }
        adapters(m + "down_proj", f, gate_grad || up_grad);
        current.clear();
        break;
      }
    }
  }
  return out;
}

std::vector<TensorSpec> FinalNormSavedActivations(const ModelSpec& spec, int64_t b, int64_t s, DType dtype,
                                                  KernelDevice device,
                                                  const SavePolicy& saves) {
  std::vector<TensorSpec> out;
  const int64_t h = spec.hidden_size();
  AppendNormSaved(spec, "final_norm", {b, s, h}, dtype, device, -1, &out);
  // The LM head keeps its input for its own gradient, or always (LinearSaves).
  if (!saves.fused_loss &&
      (BaseWeightsTrain(spec) || SavesModule(spec, "lm_head") || saves.linear == LinearSaves::kAlways)) {
    out.push_back(Make(kFinalNormOutput, {b, s, h}, dtype, ROLE_ACTIVATION, -1));
  }
  return out;
}

bool TowerBuildsGraph(const ModelSpec& spec, const SavePolicy& saves) {
  return !spec.vision_language().freeze_vision_tower() || saves.embedding_output_requires_grad;
}

std::vector<TensorSpec> VisionLanguageSavedActivations(const ModelSpec& spec, int64_t b, int64_t s, int64_t images,
                                                       int64_t image_size, DType dtype, KernelDevice device,
                                                       const SavePolicy& saves) {
  std::vector<TensorSpec> out;
  const VisionLanguageSpec& v = spec.vision_language();
  const ModelSpec tower = TowerSpec(spec);
  const int64_t c = v.hidden_size(), h = spec.hidden_size(), tokens = TowerTokensPerImage(v, image_size);
  const int64_t rows = images * tokens, features = images * ImageTokensPerImage(v, image_size);
  const bool tower_trains = !v.freeze_vision_tower(), projector_trains = !v.freeze_projector();
  const bool tower_graph = TowerBuildsGraph(spec, saves);
  auto act = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    out.push_back(Make(name, std::move(shape), t, ROLE_ACTIVATION, -1));
  };
  // The patch conv keeps its input, the pixels cast to the working dtype,
  // for its weight's gradient (in fp32 the batch's own pixels).
  const bool pixel_copy = tower_trains && dtype != DTYPE_FP32;
  // The projector's two linears with the activation between (llava's
  // LlavaMultiModalProjector; Qwen2_5_VLPatchMerger's mlp, on the merged
  // rows), each input kept for a gradient: `in` wide into the first, `mid`
  // wide after it.
  auto projector = [&](int64_t projector_rows, int64_t in, int64_t mid) {
    if (projector_trains) act("projector.linear_1.input", {projector_rows, in}, dtype);
    if (projector_trains || tower_graph) act("projector.act.input", {projector_rows, mid}, dtype);
    if (projector_trains) act("projector.linear_2.input", {projector_rows, mid}, dtype);
  };
  if (v.tower() == VISION_TOWER_CLIP) {
    if (tower_graph) {
      if (pixel_copy) {
        act("tower.embeddings.pixels", {images, v.num_channels(), v.tower_image_size(), v.tower_image_size()}, dtype);
      }
      AppendNormSaved(tower, "tower.pre_layrnorm", {images, tokens, c}, dtype, device, -1, &out);
      // post_layernorm(last_hidden_state[:, 0, :]): its saved input is a view of the last block's output.
      AppendNormSaved(tower, "tower_tail.post_layernorm", {images, c}, dtype, device, -1, &out);
      out[out.size() - 3] = Make("tower_tail.post_layernorm.input", {images, tokens, c}, dtype, ROLE_ACTIVATION, -1);
    }
    // linear_1's input is reshaped from the strided select: a copy.
    projector(features, c, h);
  } else {
    const bool qwen2_5 = v.tower() == VISION_TOWER_QWEN2_5_VL;
    const int64_t patch_pixels = v.num_channels() * v.temporal_patch_size() * v.patch_size() * v.patch_size();
    const int64_t merged = c * v.spatial_merge_size() * v.spatial_merge_size();
    if (tower_graph) {
      if (pixel_copy) act("tower.patch_embed.pixels", {rows, patch_pixels}, dtype);
      // Qwen2.5-VL's windows' order (an index into the merged rows); RoPE's
      // cos and sin [rows, head_dim] in fp32, which every block's rotations keep.
      if (qwen2_5) act("tower.window_index", {features}, DTYPE_INT64);
      act("tower.rope_cos", {rows, c / v.num_heads()}, DTYPE_FP32);
      act("tower.rope_sin", {rows, c / v.num_heads()}, DTYPE_FP32);
    }
    if (!qwen2_5 && tower_trains) {
      // Qwen3VLVisionModel.fast_pos_embed_interpolate: pos_embed(indices)
      // keeps the indices [rows, 4], the product with the bilinear weights
      // keeps the fp32 weights [rows, 4, 1].
      act("tower.pos_embed.indices", {rows, 4}, DTYPE_INT64);
      act("tower.pos_embed.weights", {rows, 4, 1}, DTYPE_FP32);
    }
    if (qwen2_5) {
      // Qwen2_5_VLPatchMerger: ln_q (an RMSNorm over C: its fp32 input and
      // statistics for the input's gradient, the normalized input for its
      // weight's), the mlp on merged rows, then the windows' order undone.
      if (tower_graph) {
        act("projector.ln_q.input_fp32", {rows, c}, DTYPE_FP32);
        act("projector.ln_q.rstd", {rows, 1}, DTYPE_FP32);
      }
      if (projector_trains) act("projector.ln_q.normalized", {rows, c}, dtype);
      projector(features, merged, merged);
      if (tower_graph || projector_trains) act("projector.reverse_indices", {features}, DTYPE_INT64);
    } else {
      // Qwen3VLVisionPatchMerger: a LayerNorm over C on the last block's
      // output (which it keeps), then linear_fc1, GELU, linear_fc2 on the
      // merged rows.
      if (tower_graph || projector_trains) AppendNormSaved(tower, "projector.norm", {rows, c}, dtype, device, -1, &out);
      projector(features, merged, merged);
      // Each deepstack merger (the tower's: use_postshuffle_norm) on a
      // block's output viewed merged: its LayerNorm over 4C keeps that view
      // (the next block's norm keeps the storage) and its statistics, then
      // as the merger; and its output, copied for the language model, until
      // the language model's forward ends.
      for (int k = 0; k < v.deepstack_blocks_size(); ++k) {
        const std::string m = absl::StrCat("tower.deepstack.", k);
        if (tower_graph) {
          const DType stats = device == KernelDevice::kCpu ? dtype : DTYPE_FP32;
          act(m + ".norm.mean", {features}, stats);
          act(m + ".norm.rstd", {features}, stats);
        }
        if (tower_trains) act(m + ".linear_fc1.input", {features, merged}, dtype);
        if (tower_graph) act(m + ".act.input", {features, merged}, dtype);
        if (tower_trains) act(m + ".linear_fc2.input", {features, merged}, dtype);
        act(absl::StrCat("tower_tail.deepstack_embeds.", k), {features, h}, dtype);
      }
    }
  }
  act("image_mask", {b, s, 1}, DTYPE_BOOL);
  return out;
}

std::vector<TensorSpec> EmbeddingSavedActivations(const ModelSpec& spec, int64_t b, int64_t s, DType dtype,
                                                  KernelDevice device, const SavePolicy& saves) {
  std::vector<TensorSpec> out;
  if (spec.has_vision() && BaseWeightsTrain(spec) && dtype != DTYPE_FP32) {
    const VisionSpec& v = spec.vision();
    out.push_back(Make("embed_patches.pixels", {b, v.num_channels(), v.image_size(), v.image_size()}, dtype,
                       ROLE_ACTIVATION, -1));
  }
  if (const int64_t p = spec.per_layer_input_size(); p > 0) {
    // Gemma4TextModel.project_per_layer_inputs: per_layer_model_projection
    // keeps the embedding's output, per_layer_projection_norm (over p) its
    // tensors; the per-layer inputs [b, s, layers, p] the layers' products
    // keep slices of. Trained or frozen alike, BaseWeightsTrain aside.
    const int64_t layers = spec.num_layers();
    if (BaseWeightsTrain(spec)) {
      // In fp32 that input is block 0's, which its first norm keeps (x.to(float32) aliases it).
      if (dtype != DTYPE_FP32) {
        out.push_back(Make(absl::StrCat(kPerLayerModelProjection, ".input"), {b, s, spec.hidden_size()}, dtype,
                           ROLE_ACTIVATION, -1));
      }
      AppendNormSaved(spec, kPerLayerProjectionNorm, {b, s, layers, p}, dtype, device, -1, &out);
    }
    out.push_back(Make(kPerLayerInputs, {b, s, layers, p}, dtype, ROLE_ACTIVATION, -1));
  }
  // Dropout keeps its mask only when its input requires grad.
  if (spec.embedding_dropout() > 0 && EmbeddingOutputRequiresGrad(spec, saves)) {
    out.push_back(Make("embed.dropout_mask", {b, s, spec.hidden_size()}, DropoutSavedDType(dtype, device),
                       ROLE_ACTIVATION, -1));
  }
  return out;
}

int64_t RmsNormBackwardTransientBytes(const ModelSpec& spec, int64_t elements, DType dtype, bool weight_trains) {
  if (spec.norm_type() != NORM_RMSNORM) return 0;
  constexpr int64_t kFp32TemporariesAtPeak = 5;
  const DType normalized = spec.norm_weight_in_fp32() ? DTYPE_FP32 : dtype;
  return elements * (kFp32TemporariesAtPeak * DTypeBytes(DTYPE_FP32) - (weight_trains ? DTypeBytes(normalized) : 0));
}

int64_t LatentAttentionForwardBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype, KernelDevice device,
                                    bool grad) {
  // DeepseekV3Attention.forward's locals to its end, none saved: q_b_proj's
  // output (q_pass a view of it), the query torch.cat makes, expand_kv's
  // key and kv_b_proj's output (the value a view of it), kv_a_proj's
  // output and the rotated rope parts of q and k.
  const LatentAttentionSpec& l = spec.latent_attention();
  const int64_t w = DTypeBytes(dtype), a = spec.num_attention_heads(), rows = b * s;
  const int64_t qk = l.qk_nope_head_dim() + l.qk_rope_head_dim(), rope = l.qk_rope_head_dim();
  int64_t bytes = rows * w * (3 * a * qk + a * (l.qk_nope_head_dim() + l.v_head_dim()) + l.kv_lora_rank() + rope +
                              a * rope + rope);
  if (!LatentSdpaRunsMath(spec, device)) return bytes;  // a fused kernel keeps q, k and v (saved)
  // SDPA's math path at _safe_softmax: the fp32 scores, its bool mask of
  // them and the causal mask [s, s] made fp32 (convert_boolean_attn_mask),
  // beside 16-bit inputs' fp32 copies of q and k (unscaled; the scaled
  // ones are saved). Without a graph also the softmax's output and the
  // scaled copies and v's.
  const int64_t scores = b * a * s * s;
  bytes += scores * 4 + scores + s * s * 4 + (w < 4 ? 2 * rows * a * qk * 4 : 0);
  if (!grad) bytes += scores * 4 + rows * a * (2 * qk + l.v_head_dim()) * 4;
  return bytes;
}

int64_t BlockForwardTransientBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype, KernelDevice device) {
  // Pre-softmax scores coexist with the probabilities until softmax returns.
  const int64_t scores = b * spec.num_attention_heads() * s * s;
  if (spec.has_latent_attention()) return LatentAttentionForwardBytes(spec, b, s, dtype, device, /*grad=*/true);
  if (SdpaRunsMath(spec, device)) return scores * 4;
  if (spec.attention_impl() == ATTENTION_EAGER && spec.attention_sinks()) {
    // GptOss's eager_attention_forward at its widest (the subtraction, then
    // the softmax): the masked scores (attn_weights, a local until the
    // dropout's result replaces it), the max-subtracted logits with the sink
    // column (combined_logits, a local to the function's end) and max's
    // values [b, a, s, 1], beside the kept softmax output.
    return (scores + SinkScores(spec, b, s) + b * spec.num_attention_heads() * s) * DTypeBytes(dtype);
  }
  if (spec.attention_impl() == ATTENTION_EAGER) return scores * DTypeBytes(dtype);
  return 0;
}

BlockBackwardTransients BlockBackwardTransientBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype,
                                                    KernelDevice device, bool down_input_saved, int64_t head_dim) {
  const int64_t w = DTypeBytes(dtype);
  const int64_t bs = b * s;
  // Gradient w.r.t. the half's output and input are both alive at its end.
  const int64_t residual_grads = 2 * bs * spec.hidden_size() * w;
  BlockBackwardTransients t;
  // FFN: down_proj's input gradient, then, beside it, the gradients of the
  // activation's inputs (SwiGLU's product and gelu_new's 0.5x * (1 + tanh):
  // two; GELU: one). By then down_proj's saved input is freed.
  const int64_t branches = spec.ffn_type() == FFN_GELU ? 1 : 2;
  t.mlp_bytes = (1 + branches - (down_input_saved ? 1 : 0)) * bs * spec.ffn_hidden_size() * w;
  const int64_t scores = b * spec.num_attention_heads() * s * s;
  // At the half's end: the gradients of q, k, v.
  const int64_t qkv_end = residual_grads + bs * (spec.num_attention_heads() + 2 * spec.num_kv_heads()) * head_dim * w;
  if (spec.has_latent_attention()) {
    // q and k are nope + rope wide, v v_head_dim. On the CPU the math path
    // peaks in softmax's backward: the fp32 gradients of the probabilities
    // and of the scores, the second matmul's saved fp32 v and the output's
    // gradient upcast to fp32 (each [b, a, s, v]) freed by then (measured in
    // the oracle's allocation trace).
    const LatentAttentionSpec& l = spec.latent_attention();
    const int64_t a = spec.num_attention_heads(), dv = l.v_head_dim();
    const int64_t latent_end = residual_grads + bs * a * (2 * head_dim + dv) * w;
    t.attention_bytes =
        LatentSdpaRunsMath(spec, device) ? std::max(2 * scores * 4 - 2 * bs * a * dv * 4, latent_end) : latent_end;
  } else if (SdpaRunsMath(spec, device)) {
    // The math path (attention.cpp, _scaled_dot_product_attention_math)
    // peaks in its second matmul's backward, before softmax's: the fp32
    // gradients of the dropped probabilities [b,a,s,s] and of v (expanded
    // to every head), beside the output's gradient upcast to fp32, whose
    // 16-bit original is then freed. The saved tensors go after it.
    const int64_t heads_tokens = bs * spec.num_attention_heads() * head_dim;
    t.attention_bytes = std::max(scores * 4 + heads_tokens * 4 + (w < 4 ? heads_tokens * (4 - w) : 0), qkv_end);
  } else if (spec.attention_impl() == ATTENTION_EAGER && spec.attention_sinks()) {
    // With sinks: softmax's backward, its output gradient (the slice's,
    // [b, a, s, s + 1]) and input gradient beside its saved output; then,
    // that output freed, max's (value_selecting_reduction_backward: zeros of
    // that shape scattered into), where CPU's 16-bit scatter makes an fp32
    // copy of the whole, beside softmax's input gradient (measured in the
    // oracle's allocation trace).
    // By then o_proj's backward has freed its saved input, and the second
    // matmul's v its repeated v for v's gradient: one [b, s, a d] less.
    const int64_t sink_scores = SinkScores(spec, b, s);
    const int64_t cpu_copy = device == KernelDevice::kCpu && w < 4 ? sink_scores * 4 : 0;
    t.attention_bytes = std::max(2 * sink_scores * w, sink_scores * w + cpu_copy) -
                        bs * spec.num_attention_heads() * head_dim * w;
  } else if (spec.attention_impl() == ATTENTION_EAGER) {
    t.attention_bytes = residual_grads + 2 * scores * w;
  } else {
    t.attention_bytes = qkv_end;
  }
  // q_norm's backward, beside q's gradient and the half's input gradient:
  // RMSNorm's fp32 temporaries over q (Gemma 4's full layers: wider than the
  // hidden state). Autograd runs the later-made paths first: by then SDPA's
  // saved q, k, v, logsumexp and output are freed, and v's and k's paths
  // (their norms' saved tensors, their gradients) are done.
  if (spec.qk_norm() && spec.attention_impl() == ATTENTION_SDPA && !SdpaRunsMath(spec, device)) {
    const int64_t a = spec.num_attention_heads(), kv = spec.num_kv_heads(), d = head_dim;
    const int64_t kv_saved = SdpaCopiesKv(spec, SdpaRepeatsKvAt(spec, d, /*masked=*/false)) ? a : kv;
    const int64_t sdpa_saved = bs * ((2 * a + 2 * kv_saved) * d * w + 4 * a);
    const int64_t stats = spec.norm_pow_mean_square() ? 8 : 4;  // per row, fp32
    const int64_t normalized = !BaseWeightsTrain(spec) ? 0 : spec.norm_weight_in_fp32() ? 4 : w;  // the weight's gradient
    const int64_t k_norm_saved = bs * kv * ((4 + normalized) * d + stats);
    const int64_t v_norm_saved = spec.value_norm() ? bs * kv * (4 * d + stats) : 0;
    const int64_t q_path = residual_grads + bs * spec.hidden_size() * w + bs * a * d * w;
    t.qk_norm_bytes = q_path + RmsNormBackwardTransientBytes(spec, bs * a * d, dtype, BaseWeightsTrain(spec)) -
                      sdpa_saved - k_norm_saved - v_norm_saved;
  }
  return t;
}

MoeTransients MoeTransientBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype,
                                const std::vector<int64_t>& pairs_per_expert, bool recomputed) {
  const MoeSpec& moe = spec.moe();
  const int64_t w = DTypeBytes(dtype), h = spec.hidden_size(), tokens = b * s;
  const int64_t e = moe.num_experts(), k = moe.experts_per_token(), f = moe.expert_ffn_hidden_size();
  const int64_t pairs = tokens * k, fs = moe.shared_expert_ffn_hidden_size();
  // The weighted pairs' dtype: the pair weights' (fp32 ones promote the product).
  const int64_t weighted = moe.routing_weights_fp32() ? 4 : w;
  // Beside them to the end of the block's forward: the router logits (the
  // forward's `_`; GraniteMoe's cast to fp32), the sorted expert ids
  // (int64), histc's float copy of them, the counts per expert (fp32) and,
  // cast from fp32, the top-k weights.
  const int64_t logits = tokens * e * RouterLogitsBytes(moe, w);
  MoeTransients t;
  t.weighted_pairs_bytes = pairs * h * weighted;
  t.pair_ffn_bytes = pairs * f * w;
  if (moe.gpt_oss_experts()) {
    // GptOssMLP's logits (its `_`), histc's float copy and the counts; the
    // sorted ids and the top-k softmax are kept (saved), and the down
    // bias's per-pair copy [S, h] (selected_biases) lives to the end of
    // grouped_mm_experts_forward beside the weighted pairs and their copy.
    const int64_t routing = logits + pairs * 4 + e * 4;
    t.forward_bytes = 3 * pairs * h * w + routing;
    t.recompute_bytes = t.forward_bytes - t.weighted_pairs_bytes + pairs * 8;
    // Under no_grad the gathered tokens and the biases' copies are locals
    // alive to the function's end: at the gate's last product the gathered
    // tokens, gate_up's bias copy and output and five [S, I] (the clamped
    // gate and up, up + 1, the glu, the product); at the reordering five
    // [S, h] (gathered, down's bias copy and output, the weighted pairs and
    // their copy) and the inverse index. Beside them the router's logits,
    // top-k indices and softmax, the sorted ids and perm, the pair weights,
    // histc's copy, the counts and offsets.
    const int64_t chain = std::max(pairs * (h + 9 * f) * w, pairs * (5 * h * w + 8));
    t.nograd_bytes = chain + logits + tokens * k * (8 + w) + pairs * (16 + w + 4) + e * 8;
    t.backward_bytes = 3 * pairs * h * w;
    return t;
  }
  // The top-k weights cast from fp32 to the working dtype (Mixtral's stay fp32).
  const int64_t cast_weights = moe.routing_weights_fp32() ? 0 : tokens * k * w;
  const bool eager = moe.experts_impl() == EXPERTS_EAGER;
  EagerExpertsBytes loop;
  if (eager) {
    // GraniteMoeShared's shared_mlp reads the unflattened input, another node than the loop's flat view.
    const bool input_grad_exists = fs > 0 && !SharedExpertAfterExperts(moe);
    loop = EagerExpertsAllocations(pairs_per_expert, {tokens, h, f, k, w, weighted, recomputed, input_grad_exists});
  }
  const int64_t routing = eager ? logits + cast_weights : logits + pairs * (8 + 4) + e * 4 + cast_weights;
  // The eager loop's widest moment is its last expert's, with its output
  // beside it and the decoder layer's `residual` (the MLP half's input, alive
  // to the half's add; read from the oracle's traces of checkpointed rows).
  // In fp32 the pre-norm's upcast is the residual itself, which it saves.
  const int64_t residual = dtype == DTYPE_FP32 ? 0 : tokens * h * w;
  t.forward_bytes = eager ? loop.forward_peak - loop.saved + routing + residual : 2 * pairs * h * weighted + routing;
  // Granite's residual_multiplier scales the MLP half's output gradient into
  // a new [T, h] (a product with a Python float saves nothing, so it runs
  // before a checkpointed layer's recompute); every index_add_ of the eager
  // loop reads it: alive through the recompute and the loop's backward.
  const int64_t scaled_output_grad = eager && spec.residual_multiplier() != 0 ? tokens * h * w : 0;
  t.recompute_bytes =
      eager ? t.forward_bytes + scaled_output_grad : t.forward_bytes - t.weighted_pairs_bytes + pairs * 8;
  // Under no_grad each pair tensor lives until the next is made: gathered
  // and gate_up, gate_up with the activation and product, down and the
  // weighted pairs, the weighted pairs and their reordered copy; the
  // indices (perm, perm // k, the inverse) throughout. A shared expert runs
  // first (three f_s-wide tensors), its output kept through the experts.
  const int64_t chain = std::max({pairs * (h + 2 * f) * w, pairs * 4 * f * w, pairs * h * (w + weighted),
                                  2 * pairs * h * weighted});
  // (The others' fp32 softmax over the experts beside their logits.)
  const int64_t probs = moe.router_top_k_then_softmax() ? 0 : tokens * e * 4;
  const int64_t experts =
      eager ? loop.nograd_peak + routing + probs + tokens * k * 8 : chain + routing + 3 * pairs * 8 + probs + tokens * k * 8;
  // A shared MLP after them (GraniteMoeSharedMLP, DeepseekV3MoE's
  // shared_experts) runs beside their output: gate and up [T, 2 f_s] with
  // the activation and product, then the product and its down projection's
  // output.
  const int64_t shared_nograd = SharedExpertAfterExperts(moe)
                                    ? tokens * w * (h + 3 * fs + std::max(fs, h))
                                    : std::max(3 * tokens * fs * w, tokens * h * w + experts);
  t.nograd_bytes = fs > 0 ? std::max(experts, shared_nograd) : experts;
  // Backward, at its start: the output gradient expanded to the pairs (a
  // copy), the zeros it is scattered into in pair order and the scatter's
  // result. fp32 pairs in a 16-bit model then cast down's output gradient
  // back to its dtype beside them, while down's saved output is held.
  // The eager loop's, its gradient buffers (the banks' gradients) included.
  t.backward_bytes = eager ? loop.backward_peak + scaled_output_grad : 3 * pairs * h * weighted;
  t.past_down_hook_bytes = loop.past_down_hook_peak + scaled_output_grad;
  t.backward_cast_bytes = !eager && weighted != w ? pairs * h * w : 0;
  // A shared expert's backward runs last (its ops were recorded first): the
  // gradient of its output waits through the experts'; GraniteMoeShared's
  // runs first, and the gradient of its input waits.
  if (fs > 0) {
    t.backward_bytes += tokens * h * w;
    if (eager) t.past_down_hook_bytes += tokens * h * w;
  }
  return t;
}

MixerTransients ShortConvTransientBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype) {
  const int64_t w = DTypeBytes(dtype);
  const int64_t bsh = b * s * spec.hidden_size() * w;
  const int64_t padding = b * spec.hidden_size() * (spec.conv_kernel_size() - 1) * w;  // per side of the conv
  MixerTransients t;
  if (spec.short_conv_impl() == SHORT_CONV_CAUSAL_CONV1D) {
    // CausalConv1dFn writes its output in B x's channel-last layout, so C y
    // is one too and out_proj's contiguous input is the product itself:
    // forward, out_proj's output; backward, C's and the conv output's
    // gradients and dx (causal_conv1d_bwd_function), the conv's saved
    // output freed; under no_grad the norm's output, in_proj's [b, s, 3h],
    // B x, the conv's output, then C y and out_proj's output.
    t.forward_bytes = bsh;
    t.nograd_bytes = 7 * bsh;
    t.backward_bytes = 2 * bsh;
    return t;
  }
  // The conv's own temporaries (2 bsh + padding) less out_proj's saved input, which comes after.
  t.forward_bytes = bsh + padding;
  // The norm's output, in_proj's [b, s, 3h], B x, the conv's output and its temporaries.
  t.nograd_bytes = 8 * bsh + 2 * padding;
  // C's gradient, the padded output's, the conv's input gradient and its temporaries.
  t.backward_bytes = 3 * bsh + padding;
  return t;
}

namespace {

// fla's chunk_gated_delta_rule (LINEAR_ATTENTION_FLA), read from fla 0.6.0's
// source (chunk.py) and measured on CPU ranks with its kernel launches
// emptied (tools/shadow_kernels/): the same moments around the module's
// torch ops as the fallback's below (the gated norm's product and multiply,
// Qwen3_5RMSNormGated being torch in every environment), and the kernel's
// own: forward in chunk_fwd_o, beside w, u, h [b, chunks, hv, dk, dv],
// v_new and input_guard's contiguous q and k; backward in
// prepare_wy_repr_bwd, beside the recomputed w, u, h, v_new and dh, dq, dk,
// dw, dg (chunk_bwd_dqkwg: per value head, summed to the key heads), and in
// chunk_bwd_dqkwg itself.
MixerTransients FlaDeltaRuleTransientBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype) {
  MixerTransients t;
  const DeltaRuleWidths widths = DeltaRuleWidthsOf(spec);
  const int64_t w = DTypeBytes(dtype), hv = widths.value_heads, tokens = b * s;
  const bool fp32 = dtype == DTYPE_FP32;
  const int64_t val = tokens * hv * widths.value_dim * w, val32 = 4 * tokens * hv * widths.value_dim;
  const int64_t head = tokens * hv * w, head32 = 4 * tokens * hv, conv = tokens * widths.conv_channels() * w;
  const int64_t qk = tokens * widths.keys() * w;           // q or k, unrepeated
  const int64_t wk = tokens * hv * widths.key_dim * w;     // a key-wide tensor per value head
  const int64_t state = b * DeltaRuleChunks(s) * hv * widths.key_dim * widths.value_dim * w;  // h or dh
  // chunk_bwd_dqkwg's dg: one fp32 [b, s, hv] per block of 64 key elements (its tiling on an H100).
  const int64_t dg_blocks = (widths.key_dim + 63) / 64 * head32;

  // Forward: the module's locals dead at its end (z, a, b, the conv's output, g), less the gated norm's
  // tensors, saved after the kernel.
  const int64_t dead = fp32 ? 2 * head + head32 + conv : val + 2 * head + conv + head32;
  const int64_t later = fp32 ? 5 * val32 + head32 : 3 * val32 + 3 * val + head32;
  t.forward_bytes = std::max(fp32 ? dead + head32 : dead + head32 + 2 * val32,  // the gated norm's product
                             dead + 2 * qk + wk + 3 * val + state - later);    // chunk_fwd_o
  // Backward: the gated norm's (out_proj's input gradient; the gated multiply), then the kernel's with
  // z's gradient and the output's standing where the norm's saved tensors and out_proj's input were.
  const int64_t base = 2 * val - (3 * val32 + 3 * val + head32);
  const int64_t dqkwg = base + 4 * wk + 3 * val + 2 * state + dg_blocks + (hv != widths.key_heads ? qk : 0);
  const int64_t wy = base + 3 * wk + 4 * val + 2 * state + 2 * qk + head + 2 * head32 +
                     (hv != widths.key_heads ? qk : 0);
  t.backward_bytes = std::max({val, (fp32 ? 2 : 3) * val32, dqkwg, wy});
  // Under no_grad, beside the norm's output: the module's locals, then the kernel's tensors at
  // chunk_fwd_o (nothing kept for backward, but alive until it returns).
  const int64_t module = val + 3 * head + conv + head32;
  const int64_t solved = tokens * hv * kDeltaRuleChunkTokens * w;  // A
  const int64_t kernel = 4 * qk + 8 * tokens * widths.key_heads + val + head32 + solved + wk + 3 * val + state;
  t.nograd_bytes = tokens * spec.hidden_size() * w +
                   std::max(module + 2 * val + head32 + 3 * val32, module + kernel);
  return t;
}

}  // namespace

// Each pass peaks at one of a few moments, each a sum of the tensors alive
// there (measured to the byte with the counting allocator over 600 shapes,
// bf16 and fp32, 1 to 10 chunks, Hk != Hv and dk != dv; docs/family_sources.md):
// the gated norm's product, the last chunk's output and state update, the
// reshape of the chunks' output; in backward the gated norm's multiply,
// the second chunk processed (CopySlices and SelectBackward add each
// chunk's whole-size gradients into one buffer per tensor: linear in the
// chunks) and the triangular solves'. Without the weight gradients, which
// the step counts itself (a kept gradient, or one on its way to a bucket).
MixerTransients DeltaRuleTransientBytes(const ModelSpec& spec, int64_t b, int64_t s, DType dtype) {
  MixerTransients t;
  if (spec.linear_num_value_heads() == 0) return t;
  if (spec.linear_attention_impl() == LINEAR_ATTENTION_FLA) return FlaDeltaRuleTransientBytes(spec, b, s, dtype);
  const DeltaRuleWidths widths = DeltaRuleWidthsOf(spec);
  const int64_t w = DTypeBytes(dtype), hv = widths.value_heads, dk = widths.key_dim, dv = widths.value_dim;
  const int64_t c = kDeltaRuleChunkTokens, chunks = DeltaRuleChunks(s), tokens = b * s, padded = b * chunks * c;
  const bool fp32 = dtype == DTYPE_FP32, repeats = widths.key_heads != hv;
  // Per token: the value width in the working dtype and in fp32, a value head in fp32 and in the working dtype, the conv.
  const int64_t val = tokens * hv * dv * w, val32 = 4 * tokens * hv * dv, head32 = 4 * tokens * hv,
                head = tokens * hv * w, conv = tokens * widths.conv_channels() * w;
  // Padded to whole chunks (fp32): the values, the keys, the chunks' tables, a decay table.
  const int64_t pv = 4 * padded * hv * dv, pk = 4 * padded * hv * dk, pc = 4 * padded * hv * c, pd = 4 * padded * hv;
  // One chunk's values, keys and table; one recurrent state; the chunks' decay; one per head.
  const int64_t cv = 4 * b * hv * c * dv, ck = 4 * b * hv * c * dk, c64 = 4 * b * hv * c * c;
  const int64_t state = 4 * b * hv * dk * dv, decay = 4 * b * hv * chunks, per_head = 4 * b * hv;
  // fp32 with whole chunks: .to(fp32) aliases transposed views; with repeated key heads and a batch the
  // chunk matmuls copy their q and k slices.
  const bool aligned32 = fp32 && s % c == 0, copies = aligned32 && b >= 2 && repeats;

  // Forward, beyond what it saves: the module's locals dead at its end (z, a, b, the conv's output, g),
  // less the gated norm's tensors, saved after the loop.
  const int64_t dead = fp32 ? 2 * head + head32 + (repeats ? conv : 0) : val + 2 * head + conv + head32;
  const int64_t later = fp32 ? 5 * val32 + head32 : 3 * val32 + 3 * val + head32;
  int64_t loop = dead + 2 * pd + 2 * pv + pk - later;  // the padded decays, v x beta, the output, k x beta decayed
  if (chunks == 1) loop += 2 * pk + pd + per_head;      // only the discarded last state reads the decayed q, k
  if (copies && chunks >= 2) loop += 2 * pk;
  t.forward_bytes = std::max({fp32 ? dead + tokens * spec.hidden_size() * w : 0,
                              fp32 ? dead + head32 : dead + head32 + 2 * val32,  // the gated norm's product
                              loop + 3 * cv, loop + cv + 3 * state + (copies ? ck : 0), loop + cv + pv});

  // Backward: after the gated norm's, z's gradient stands where the norm's saved tensors (its fp32
  // input, z and silu(z) in fp32; the normalized, weighted and gated ones in the working dtype; rstd)
  // were.
  const int64_t normed = val - (3 * val32 + 3 * val + head32);
  // out_proj's input gradient; the gated multiply.
  int64_t peak = std::max(val, (fp32 ? 2 : 3) * val32);
  auto moment = [&](int64_t bytes) { peak = std::max(peak, bytes); };
  int64_t loop_adjust = 0, solve_adjust = 0;
  if (aligned32 && (chunks >= 2 || copies)) solve_adjust -= pk;
  if (copies && chunks >= 2) {
    loop_adjust = chunks >= 3 ? -2 * ck : 2 * pk - 2 * ck;
    solve_adjust += 2 * ck;
  }
  if (chunks >= 3) {  // the second chunk processed, beside the last one's whole-size gradients
    for (int64_t m : {3 * pv + pc + 3 * pk + 2 * cv + decay, 2 * pv + 2 * pc + 3 * pk + c64 + decay,
                      2 * pv + pc + 4 * pk + ck - cv + decay, 2 * pv + pc + 3 * pk + 2 * state + per_head}) {
      moment(normed + m + loop_adjust);
    }
  } else if (chunks == 2) {
    for (int64_t m : {3 * pv + pc + pk + cv + decay - state, pv + pc + pk + c64 + 2 * cv + decay - state,
                      2 * pv + pc + pk + state + per_head}) {
      moment(normed + m + loop_adjust);
    }
  } else {
    for (int64_t m : {2 * pv + cv, pv + cv + c64, pv + pk + ck}) moment(normed + m);
  }
  // The triangular solves' backward, once the chunks' v_new and states are gone.
  const int64_t solved = chunks >= 2 ? -pd - decay - chunks * state : pk - state;
  moment(normed + 2 * pc + 2 * pk + solved + solve_adjust);
  moment(normed + pv + 3 * pc + solved + solve_adjust);
  t.backward_bytes = peak;

  // Under no_grad, beside the norm's output: every local of the chunk function at the loop.
  const int64_t module = val + 3 * head + conv + head32;
  const int64_t locals = module + 4 * pv + 3 * pd + c * c + 3 * pc + 5 * pk + decay + state;
  t.nograd_bytes = tokens * spec.hidden_size() * w +
                   std::max({module + 2 * val + head32 + 3 * val32, locals + 4 * cv, locals + 2 * cv + 3 * state,
                             copies ? locals + 2 * cv + 2 * state + ck : 0, locals - state + 2 * cv + pv,
                             locals + pk + pd - decay, module + 2 * pv + 3 * pk + 3 * pd + c * c + 4 * pc});
  return t;
}

double TrainingFlopsPerToken(const ModelSpec& spec, int64_t seq_length) {
  double matmul_weights = static_cast<double>(spec.vocab_size()) * spec.hidden_size();  // LM head
  for (int layer = 0; layer < spec.num_layers(); ++layer) {
    for (const TensorSpec& t : BlockParameters(spec, layer)) {
      if (t.shape_size() == 2) matmul_weights += static_cast<double>(NumElements(t));
    }
  }
  return 6 * matmul_weights + 12.0 * spec.num_layers() * spec.num_attention_heads() * spec.head_dim() * seq_length;
}

}  // namespace zplan
