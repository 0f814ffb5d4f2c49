#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner/block_layout.h"
#include "planner/eager_experts.h"
#include "planner/expert_routing.h"
#include "planner/gpu_catalog.h"
#include "planner/limits.h"
#include "planner/model_family.h"
#include "planner/inventory.h"
#include "planner/run_config.h"
#include "planner/status_macros.h"
#include "planner/units.h"
#include "planner/vision_language.h"
#include "planner/vision_tower.h"
#include "planner/zero_buckets.h"
#include "planner/zero_gather.h"
#include "planner/zero_offload.h"
#include "planner/zero_optimizer_step.h"
#include "planner/zero_partitioning.h"
#include "planner/zero_refusals.h"

namespace zplan {
namespace {

DType WorkingDtype(Precision precision) {
  switch (precision) {
    case PRECISION_FP16: return DTYPE_FP16;
    case PRECISION_FP32: return DTYPE_FP32;
    default: return DTYPE_BF16;
  }
}

int64_t SumBytes(const std::vector<TensorSpec>& tensors) {
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += TensorBytes(t);
  return total;
}


// A mixture of experts' MLP half at its weight gradients, beyond what it
// saved (elements, `w` bytes each): down_proj's [E, h, I]
// beside its input gradient (the pairs' [S, I], pair_ffn bytes); gate_up_proj's [E, 2I, h]
// once the pair tensors after it are freed (the activation, the product,
// gate_up's output, less its own input gradients). Under ZeRO-3 DeepSpeed
// makes the block a leaf (parameter_offload.py, _register_deepspeed_module:
// its default leaf_module classes) and reduces its parameters' gradients
// after its backward: down_proj's waits beside gate_up_proj's.
// This is the second of those (0 where the freed pair tensors outweigh it).
int64_t MoeGateUpGradientBytes(int64_t pair_ffn, int64_t down_elements, int64_t gate_up_elements, bool leaf_gradients,
                               int64_t w) {
  return std::max<int64_t>(0, gate_up_elements * w + (leaf_gradients ? down_elements * w : 0) - 2 * pair_ffn);
}

// A BlockKind's fields, to find equal kinds.
auto BlockKindTie(const StepSizes::BlockKind& k) {
  return std::tie(k.input, k.saved, k.saved_mlp, k.saved_input, k.mlp_tail_saved, k.attn_tail_saved, k.mlp_pre_norm_bwd,
                  k.attn_pre_norm_bwd, k.fwd_transient, k.mlp_fwd_transient, k.recompute_pending_grad,
                  k.recompute_mlp_fwd_transient, k.aux_router_logits, k.nograd_peak, k.bwd_attn_transient,
                  k.bwd_qk_norm_transient, k.grads_attn, k.max_attn_grad, k.gather, k.gather_kept, k.gather_held,
                  k.retained_mlp, k.retained_attn, k.bwd_mlp_transient, k.mlp_output_grad, k.grads_mlp, k.grads_down,
                  k.max_mlp_grad, k.down_weight_grad_waiting, k.mlp_reduce_pending, k.mlp_past_down_hook,
                  k.post_norm_bwd_transient, k.mlp_tail_bwd_transient, k.grads_mlp_tail_out, k.grads_mlp_tail_in,
                  k.mlp_grads_after_saved, k.forward_only);
}

// The distinct values of `layers` into `distinct`, each layer's index there
// into `index_of`; the indices' period from block 1 on, or with a tower of
// `tower_layers` blocks (the step program cuts the stacks apart) the lcm of
// the tower's from its block 1 up to its forward-only blocks (from
// `forward_only_from`) and the language model's from its block 1.
template <typename T, typename Same>
int DistinctKinds(const std::vector<T>& layers, const Same& same, std::vector<T>* distinct,
                  std::vector<int>* index_of, int tower_layers = 0, int forward_only_from = 0) {
  distinct->clear();
  index_of->assign(layers.size(), 0);
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    auto it = std::find_if(distinct->begin(), distinct->end(), [&](const T& o) { return same(o, layers[layer]); });
    (*index_of)[layer] = static_cast<int>(it - distinct->begin());
    if (it == distinct->end()) distinct->push_back(layers[layer]);
  }
  // The smallest period of the indices over [lo, hi).
  auto period_of = [&](int lo, int hi) {
    auto repeats_every = [&](int p) {
      for (int i = lo; i + p < hi; ++i) {
        if ((*index_of)[i] != (*index_of)[i + p]) return false;
      }
      return true;
    };
    int period = 1;
    while (period < hi - lo && !repeats_every(period)) ++period;
    return period;
  };
  const int n = static_cast<int>(layers.size());
  if (tower_layers == 0) return period_of(1, n);
  return std::lcm(period_of(1, std::max(1, forward_only_from)), period_of(tower_layers + 1, n));
}

// What of a vision-language model's training zplan does not plan yet, by
// name, and images its tower does not take.
absl::Status RefuseVisionLanguageStep(const ModelSpec& model, const RunConfig& config) {
  const VisionLanguageSpec& v = model.vision_language();
  auto refuse = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("vision-language model: ", what));
  };
  if (v.tower() == VISION_TOWER_CLIP) {
    if (config.image_size() != 0 && config.image_size() != v.tower_image_size()) {
      return refuse(absl::StrCat("image_size (--image-size): ", config.image_size(), ", but llava's CLIP tower takes ",
                                 v.tower_image_size(), " pixels only (its position table is fixed to it and "
                                 "LlavaProcessor resizes to it); leave --image-size out"));
    }
  } else {
    const int64_t factor = v.patch_size() * v.spatial_merge_size();
    if (config.image_size() <= 0 || config.image_size() % factor != 0 || config.image_size() > kMaxImageSize) {
      return refuse(absl::StrCat("image_size (--image-size): ", config.image_size(), "; ", model.model_type(),
                                 " takes square images whose side is a multiple of patch_size x spatial_merge_size = ",
                                 factor, " (smart_resize) up to ", kMaxImageSize, ", e.g. --image-size ", 16 * factor));
    }
  }
  const int64_t images = std::max<int64_t>(1, config.images_per_sample());
  const int64_t per_image = ImageTokensPerImage(v, config.image_size());
  if (config.images_per_sample() < 0 || images * per_image > config.seq_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_length (--seq): ", config.seq_length(), " positions cannot hold ", images, " image(s) of ", per_image,
        " image tokens each (images_per_sample, --images-per-sample); give --seq ", images * per_image,
        " or more, or fewer images"));
  }
  if (v.tower() != VISION_TOWER_CLIP && model.attention_impl() == ATTENTION_EAGER) {
    return refuse("--attention eager: a Qwen tower's eager attention (a [heads, n, n] product per window) is not "
                  "planned; use SDPA");
  }
  if (config.activation_checkpointing() && (CheckpointEveryNLayers(config) != 1 || config.checkpoint_offload() ||
                                            config.deepspeed_checkpointing().enabled())) {
    return refuse("activation checkpointing is planned for every block, on the device, through torch's "
                  "checkpoint; drop --checkpoint-every, --checkpoint-offload or DeepSpeed's checkpointing");
  }
  if (config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR) {
    return refuse("--loss liger-fused is not planned for vision-language models; use the full logits");
  }
  if (config.zero().stage() == 3 && model.has_lora() && (!v.freeze_vision_tower() || !v.freeze_projector())) {
    return refuse("ZeRO-3 with LoRA and a part trained in full fails in DeepSpeed (stage3.py, "
                  "_create_fp16_partitions_with_defragmentation: fp32 adapters and bf16 partitions in one group, "
                  "docs/vlm_oracle.md); freeze the vision tower and the projector too, or use ZeRO-2");
  }
  return absl::OkStatus();
}

// What of a mixture of experts' training zplan does not plan, by name
// (batched_mm with what its weight copies would take, the eager experts of
// the types not measured).
absl::Status RefuseMoeStep(const ModelSpec& model, const RunConfig& config) {
  const MoeSpec& moe = model.moe();
  if (moe.router_aux_loss() && config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR) {
    return absl::InvalidArgumentError(
        "output_router_logits: the auxiliary load-balancing loss beside Liger's fused cross-entropy is not planned; "
        "use --loss full, or set output_router_logits to false");
  }
  if (moe.experts_impl() == EXPERTS_EAGER) {
    // The loop measured is Qwen3MoeExperts.forward and its copies
    // (eager_experts.h); GPT-OSS's (biases, clamps) and DeepSeek-V3's MoE are
    // not, and nor are frozen experts (LoRA) under it.
    auto refuse = [](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("_experts_implementation: \"eager\" ", why,
                                                     "; use \"grouped_mm\", transformers' default (leave the key out)"));
    };
    if (moe.gpt_oss_experts()) return refuse("with GptOssExperts' own loop (biases, clamps) is not planned yet");
    if (moe.router_sigmoid_grouped()) return refuse("with DeepSeek-V3's MoE is not planned yet");
    if (model.has_lora()) return refuse("with LoRA (frozen experts) is not planned yet");
  }
  if (moe.experts_impl() == EXPERTS_BATCHED_MM) {
    // batched_mm_experts_forward (integrations/moe.py) gathers each pair's
    // expert weights, gate_up [2I, h] and down [h, I], and autograd keeps both.
    const int64_t pairs = config.micro_batch_size() * config.seq_length() * moe.experts_per_token();
    const int64_t per_layer =
        pairs * 3 * moe.expert_ffn_hidden_size() * model.hidden_size() * DTypeBytes(WorkingDtype(config.precision()));
    const int moe_layers = NumMoeLayers(model);
    return absl::InvalidArgumentError(absl::StrCat(
        "_experts_implementation: \"batched_mm\" keeps a copy of every token-expert pair's expert weights for "
        "backward: ", FormatBytes(per_layer), " per MoE layer at micro-batch ", config.micro_batch_size(), " x seq ",
        config.seq_length(), ", ", FormatBytes(per_layer * moe_layers), " over the ", moe_layers,
        " MoE layers; it is transformers' decoding path and is not planned for training: use \"grouped_mm\", "
        "the default (leave the key out)"));
  }
  return absl::OkStatus();
}

}  // namespace

SavePolicy SavePolicyFor(const RunConfig& config) {
  const ZeroConfig& zero = config.zero();
  SavePolicy saves;
  saves.embedding_output_requires_grad = config.activation_checkpointing();
  saves.fused_loss = config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR;
  if (zero.stage() == 3 && zero.zero_init()) {
    if (zero.memory_efficient_linear()) saves.linear = LinearSaves::kAlways;
    saves.adapter_dtype = DTYPE_FP32;
  }
  return saves;
}

absl::StatusOr<StepSizer> StepSizer::Create(const ModelSpec& model, const RunConfig& config,
                                            const GpuSpec& gpu) {
  StepSizer sizer;
  sizer.model_ = model;
  sizer.routing_ = config.routing();
  StepSizes& s = sizer.base_;
  const ZeroConfig& zero = config.zero();
  s.stage = zero.stage();
  s.world_size = WorldSize(config);
  s.ranks_per_node = config.cluster().gpus_per_node();
  s.num_layers = StepNumBlocks(model);
  ZPLAN_RETURN_IF_ERROR(ValidateRouting(config.routing(), model));
  if (model.has_moe()) ZPLAN_RETURN_IF_ERROR(RefuseMoeStep(model, config));
  if (model.has_vision_language()) {
    ZPLAN_RETURN_IF_ERROR(RefuseVisionLanguageStep(model, config));
    const VisionLanguageSpec& v = model.vision_language();
    sizer.tower_ = TowerSpec(model);
    s.tower_layers = static_cast<int>(v.num_layers());
    sizer.images_per_sample_ = std::max<int64_t>(1, config.images_per_sample());
    sizer.image_size_ = config.image_size();
    sizer.tower_tokens_ = TowerTokensPerImage(v, config.image_size());
  }
  s.grad_accum = config.gradient_accumulation_steps();
  s.mixed = config.precision() != PRECISION_FP32;
  s.checkpointing = config.activation_checkpointing();
  s.checkpoint_every = CheckpointEveryNLayers(config);
  s.offload_optimizer = zero.offload_optimizer() == OFFLOAD_CPU;
  s.offload_param = zero.offload_param() == OFFLOAD_CPU;
  s.pin_memory = zero.pin_memory();
  s.tied = model.tie_word_embeddings();
  s.has_head = model.vocab_size() > 0 || model.has_vision();
  s.cpu_ranks = gpu.key() == kCpuDevice;
  ZPLAN_RETURN_IF_ERROR(RefuseStep(model, config, s));  // zero_refusals.h: what DeepSpeed fails on
  // LoRA on a hybrid model whose first block has no adapter (linear attention or a short conv, when only
  // attention projections are targeted) and no checkpointing: the blocks before the first adapted one
  // keep no gradient and run no backward, which the step program does not describe yet.
  if (model.has_lora() && model.num_layers() > 1 && !BlockInputRequiresGrad(model, 1, SavePolicyFor(config))) {
    const LayerType first = model.layer_types_size() > 0 ? model.layer_types(0) : LAYER_FULL_ATTENTION;
    return absl::InvalidArgumentError(absl::StrCat(
        "model.lora.target_modules: block 0 (", LayerType_Name(first), ") has no adapter, so the blocks before the "
        "first adapted one run no backward, which zplan does not plan yet; target their projections too (e.g. "
        "\"all-linear\") or plan with --checkpointing true"));
  }
  const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
  const bool ds_function = s.checkpointing && ds.enabled();
  const int checkpointed = s.NumCheckpointed();
  // On CPU ranks host memory is device memory: save_on_cpu's copy and
  // cpu_checkpointing's take the place of the original, and DeepSpeed's CPU
  // accelerator is synchronized (no offload engine).
  s.checkpoint_copy_on_host =
      s.checkpointing && !s.cpu_ranks && (ds_function ? ds.cpu_checkpointing() : config.checkpoint_offload());
  if (ds_function && ds.partition_activations()) {
    s.checkpoint_copy_on_device = !s.checkpoint_copy_on_host;
    s.checkpoint_kept_inputs = s.checkpoint_copy_on_device ? 1 : 0;
    if (ds.contiguous_memory_optimization() && s.checkpoint_copy_on_device) {
      s.checkpoint_slots = ds.number_checkpoints();
    }
  } else if (s.checkpoint_copy_on_host) {
    s.checkpoint_kept_inputs = 0;
  }
  if (s.checkpoint_copy_on_host) {
    // DeepSpeed's .cpu() copies and buffers are pageable.
    s.host_checkpoint_pinned = !ds_function;
    s.host_checkpoint_blocks =
        ds_function && ds.contiguous_memory_optimization() ? ds.number_checkpoints() : checkpointed;
  }
  s.fused_loss = config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR;
  s.logits_scaled = model.logits_scaling() != 0;
  s.logits_softcapped = model.final_logit_softcapping() > 0;
  // Stage 1 reduces in its gradient hooks only with overlap_comm, and then
  // only at the accumulation boundary (stage_1_and_2.py, process_gradients);
  // without it the gradients stay until reduce_gradients after backward.
  const bool stage1_epilogue = s.stage == 1 && !zero.overlap_comm();
  s.grads_kept_on_production = (s.stage == 0 || stage1_epilogue) && s.grad_accum == 1;

  const DType dtype = WorkingDtype(config.precision());
  const int64_t w = DTypeBytes(dtype);
  sizer.dtype_bytes_ = w;
  sizer.working_dtype_ = dtype;
  const int64_t h = model.hidden_size();
  const int64_t vocab = model.vocab_size();

  sizer.params_ = ParameterInventory(model);
  const std::vector<TensorSpec>& params = sizer.params_;
  // What the optimizer holds: frozen parameters have no gradient, master
  // copy or state (sharding.h).
  const std::vector<TensorSpec> trainable = TrainableParameters(params);
  s.shards = ComputeShardLayout(params, s.world_size, zero.stage3_param_persistence_threshold());
  const ShardLayout& sh = s.shards;
  const int64_t trained = sh.trainable_elements;
  // Elements of the optimizer partition this rank owns.
  const int64_t owned = s.stage == 0 ? trained
                        : s.stage == 3 ? sh.stage3_grad_shard_elements
                                       : sh.flat_shard_elements;

  // The ZeRO concerns, each in its file (zero_partitioning.h lists them).
  sizer.saves_ = SavePolicyFor(config);
  const SavePolicy& saves = sizer.saves_;
  const int64_t adapter_w = saves.adapter_dtype == DTYPE_UNSPECIFIED ? w : DTypeBytes(saves.adapter_dtype);
  const ZeroSizingInputs zero_in{model, config, params, trainable, w, adapter_w, owned, stage1_epilogue};
  SizeModelStates(zero_in, &s);
  SizeReduceBuckets(zero_in, &s);
  SizeGradPartitions(zero_in, s, &sizer.variants_, &sizer.rank_variant_);

  // Blocks: gradients of the trainable parameters, gathers of all. A
  // vision-language model's tower blocks come first (StepBlockOf), each
  // block sized by its own stack's spec.
  const int layers = s.num_layers;
  const int tower_layers = s.tower_layers;
  std::vector<LayerStatics> statics(layers);
  for (const TensorSpec& t : trainable) {
    const int block = StepBlockOf(model, t);
    if (block < 0) continue;
    const std::vector<BlockOp> layout = StepBlockLayout(model, block);
    LayerStatics& layer = statics[block];
    const int64_t elements = NumElements(t);
    if (!InMlpHalf(layout, t)) {
      layer.grads_attn += elements * w;
      layer.max_attn_grad = std::max(layer.max_attn_grad, elements * w);
    } else {
      layer.mlp_elements += elements;
      if (IsDownProjTensor(layout, t)) layer.down_elements += elements;
      if (IsDownProjTensor(layout, t) && t.shape_size() == 2) layer.down_weight_elements = elements;
      layer.largest_mlp = std::max(layer.largest_mlp, elements);
    }
  }
  for (LayerStatics& l : statics) l.down_weight_grad_waiting = DownWeightGradWaitingBytes(zero_in, s, l.down_weight_elements);
  // Stage 3's reductions of expert banks: the bucket's phase drifts from
  // layer to layer, so every MoE layer takes those of the last, the first
  // in backward, where the most is alive.
  const std::vector<Stage3ExpertReductions> reductions = SizeStage3Reductions(zero_in, s);
  for (int block = static_cast<int>(reductions.size()) - 1; block >= tower_layers; --block) {
    if (!LayerIsMoe(model, block - tower_layers)) continue;
    for (int other = tower_layers; other < layers; ++other) statics[other].reductions = reductions[block];
    break;
  }
  const KernelDevice device = KernelDeviceOf(s);
  sizer.tower_without_graph_ = tower_layers > 0 && !TowerBuildsGraph(model, saves);
  // A block's stack: the tower's spec and its rows (images, tokens per
  // image), or the language model's.
  auto spec_of = [&](int block) -> const ModelSpec& { return block < tower_layers ? sizer.tower_ : model; };
  auto local = [&](int block) { return block < tower_layers ? block : block - tower_layers; };
  auto saved_tensors = [&](int block, int64_t b, int64_t seq, const SavePolicy& policy) {
    if (block < tower_layers) {
      return BlockSavedActivations(sizer.tower_, b * sizer.images_per_sample_, sizer.tower_tokens_, dtype, block,
                                   device, policy);
    }
    return BlockSavedActivations(model, b, seq, dtype, block - tower_layers, device, policy);
  };
  // Saved activations = X*b*s + Y*b*s*s (eager probabilities) + Z*s*s (the
  // causal mask) + W*s (tables without a batch) + V*b (a conv's padding; a
  // tower block's all): fit the five terms from the inventory, check a
  // seventh point. The gated delta rule's chunked tensors
  // (kDeltaRuleChunks) apart: P*b*chunks + R, and with one chunk E*b more.
  auto fit = [&](int block, const SavePolicy& saves) {
    const std::vector<BlockOp> layout = StepBlockLayout(model, block);
    auto saved_where = [&](int64_t b, int64_t seq, bool chunked) {
      int64_t bytes = 0;
      for (const TensorSpec& t : saved_tensors(block, b, seq, saves)) {
        if (absl::StrContains(t.name(), kDeltaRuleChunks) == chunked) bytes += TensorBytes(t);
      }
      return bytes;
    };
    auto saved = [&](int64_t b, int64_t seq) { return saved_where(b, seq, false); };
    SavedFit f;
    constexpr int64_t kTwoChunks = kDeltaRuleChunkTokens + 1;
    const int64_t one = saved_where(1, kTwoChunks, true), two = saved_where(2, kTwoChunks, true);
    f.per_batch_chunk = (two - one) / 2;
    f.chunk_constant = one - 2 * f.per_batch_chunk;
    f.one_chunk_per_batch = saved_where(1, 1, true) - f.per_batch_chunk - f.chunk_constant;
    // g(s) = f(2, s) - f(1, s) = X s + Y s^2 + V.
    const int64_t f11 = saved(1, 1), f12 = saved(1, 2), f13 = saved(1, 3);
    const int64_t g1 = saved(2, 1) - f11, g2 = saved(2, 2) - f12, g3 = saved(2, 3) - f13;
    f.per_token_sq = (g3 - 2 * g2 + g1) / 2;
    f.per_token = g2 - g1 - 3 * f.per_token_sq;
    f.per_batch = g1 - f.per_token - f.per_token_sq;
    // f(1, s) - X s - Y s^2 - V = Z s^2 + W s + C.
    const int64_t r1 = f11 - f.per_token - f.per_token_sq - f.per_batch;
    const int64_t r2 = f12 - 2 * f.per_token - 4 * f.per_token_sq - f.per_batch;
    const int64_t r3 = f13 - 3 * f.per_token - 9 * f.per_token_sq - f.per_batch;
    f.per_seq_sq = (r3 - 2 * r2 + r1) / 2;
    f.per_seq = r2 - r1 - 3 * f.per_seq_sq;
    f.constant = r1 - f.per_seq_sq - f.per_seq;
    ZPLAN_CHECK(saved(3, 5) + saved_where(3, 5, true) == f.Bytes(3, 5));
    ZPLAN_CHECK(saved(3, 200) + saved_where(3, 200, true) == f.Bytes(3, 200));
    // The halves' shares, linear in the rows: per token of a language
    // model's block, per sample of a tower's (two rows less one: no constant).
    for (int64_t rows : {2, 1}) {
      const int64_t sign = rows == 2 ? 1 : -1;
      for (const TensorSpec& t : saved_tensors(block, rows, 1, saves)) {
        const int64_t bytes = sign * TensorBytes(t);
        if (InMlpHalf(layout, t)) f.mlp_per_token += bytes;
        if (IsBlockInputItself(layout, t, dtype)) f.input_per_token += bytes;
        if (InHalfTail(layout, t)) (InMlpHalf(layout, t) ? f.mlp_tail_per_token : f.attn_tail_per_token) += bytes;
        if (IsPreNormTensor(layout, t)) {
          (InMlpHalf(layout, t) ? f.mlp_pre_norm_per_token : f.attn_pre_norm_per_token) += bytes;
        }
      }
    }
    return f;
  };
  // A layer's saved tensors depend on it only through its stack, being
  // block 0, whether its input requires grad, its mixer and whether it
  // slides (under the mask): one fit per such signature.
  std::map<std::tuple<bool, bool, bool, int, bool, bool, int64_t, bool>, int> fit_of;
  auto fit_index = [&](int block, bool masked) {
    const ModelSpec& m = spec_of(block);
    const int layer = local(block);
    const auto key = std::make_tuple(block < tower_layers, layer == 0, BlockInputRequiresGrad(m, layer, saves),
                                     m.layer_types_size() > layer ? m.layer_types(layer) : 0, LayerSlides(m, layer),
                                     masked, HeadDimOf(m, layer), LayerIsMoe(m, layer));
    auto [it, inserted] = fit_of.try_emplace(key, static_cast<int>(sizer.fits_.size()));
    if (inserted) {
      SavePolicy policy = saves;
      policy.sdpa_sliding_mask = masked;
      sizer.fits_.push_back(fit(block, policy));
    }
    return it->second;
  };
  const int tower_with_gradient = tower_layers > 0 ? TowerBlocksWithGradient(model.vision_language()) : 0;
  for (int block = 0; block < layers; ++block) {
    const ModelSpec& m = spec_of(block);
    const int layer = local(block);
    LayerStatics& l = statics[block];
    l.tower = block < tower_layers;
    l.forward_only = l.tower && (sizer.tower_without_graph_ || block >= tower_with_gradient);
    l.conv = LayerMixesByConv(m, layer);
    l.delta_rule = LayerMixesByDeltaRule(m, layer);
    l.moe = LayerIsMoe(m, layer);
    l.recompute_stops_in_experts = RecomputeStopsInExperts(m, layer);
    l.eager_experts = l.moe && m.moe().experts_impl() == EXPERTS_EAGER;
    if (l.eager_experts && config.routing().kind() == ExpertRouting::ROUTING_MEASURED) l.routing_layer = layer;
    l.recomputed = l.eager_experts && s.Checkpointed(block);
    l.leaf_gradients = l.moe && s.stage == 3 && m.moe().deepspeed_leaf();
    l.head_dim = HeadDimOf(m, layer);
    l.fit = fit_index(block, false);
    if (LayerSlides(m, layer) && m.attention_impl() == ATTENTION_SDPA) l.masked_fit = fit_index(block, true);
  }
  // Whether down_proj keeps its input (the FFN product or activation).
  auto down_input_saved = [&](const ModelSpec& m) {
    const std::string down_input = GatedMlp(m) ? ".mlp.product" : ".mlp.act";
    bool kept = false;
    const int layer = std::min<int>(1, m.num_layers() - 1);
    for (const TensorSpec& t : BlockSavedActivations(m, 1, 1, dtype, layer, device, saves)) {
      kept = kept || absl::EndsWith(t.name(), down_input);
    }
    return kept;
  };
  sizer.down_input_saved_ = down_input_saved(model);
  if (tower_layers > 0) sizer.tower_down_input_saved_ = down_input_saved(sizer.tower_);
  for (const TensorSpec& t : FinalNormSavedActivations(model, 1, 1, dtype, device, saves)) {
    (t.name() == kFinalNormOutput ? sizer.head_input_per_token_ : sizer.final_norm_per_token_) += TensorBytes(t);
  }
  Stage3BlockGathers gathers;
  SizeStage3Gathers(zero_in, saves, &gathers, &s);
  for (int layer = 0; layer < static_cast<int>(gathers.gather.size()); ++layer) {
    statics[layer].gather = gathers.gather[layer];
    statics[layer].gather_kept = gathers.kept[layer];
    statics[layer].gather_held = gathers.held[layer];
  }
  int forward_only_from = tower_layers;
  while (forward_only_from > 0 && statics[forward_only_from - 1].forward_only) --forward_only_from;
  s.block_period = DistinctKinds(statics, std::equal_to<LayerStatics>(), &sizer.kinds_, &s.block_kind_of,
                                 tower_layers, forward_only_from);

  // Model ends: gradients of what trains (LoRA: nothing here).
  auto trains = [&](absl::string_view prefix) {
    for (const TensorSpec& t : trainable) {
      if (t.layer() < 0 && absl::StartsWith(t.name(), prefix)) return true;
    }
    return false;
  };
  if (trains("final_norm")) s.final_norm_grads = (model.norm_type() == NORM_LAYERNORM ? 2 : 1) * h * w;
  if (model.has_vision()) {
    // The patch projection and CLS token, the positions and the classifier
    // (inventory.h); their stage-3 gathers are zero_gather.h's.
    for (const TensorSpec& t : params) {
      if (t.layer() >= 0 || absl::StartsWith(t.name(), "final_norm")) continue;
      const int64_t bytes = NumElements(t) * w;
      const bool head = absl::StartsWith(t.name(), "classifier");
      if (!t.frozen()) (head ? s.head_grad : absl::StrContains(t.name(), "position") ? s.pos_grad : s.embed_grad) += bytes;
    }
  } else if (s.has_head) {
    if (trains(s.tied ? "embed_tokens" : "lm_head")) s.head_grad = vocab * h * w;
    if (trains("embed_tokens")) s.embed_grad = vocab * h * w;
  }
  if (trains("embed_positions")) s.pos_grad = model.max_position_embeddings() * h * w;
  if (model.has_vision_language()) {
    // The tower's embeddings and the projector; post_layernorm gets no gradient.
    for (const TensorSpec& t : trainable) {
      if (t.layer() >= 0 || t.part() == PART_LANGUAGE_MODEL) continue;
      if (t.part() == PART_PROJECTOR) s.projector_grads += NumElements(t) * w;
      if (t.part() == PART_VISION_TOWER && !absl::StrContains(t.name(), kTowerPooledNorm)) {
        s.tower_embed_grads += NumElements(t) * w;
      }
    }
  }
  // A frozen embedding (LoRA) runs no backward: nothing is gathered for it.
  // (A modules_to_save embedding's copy follows its original.)
  size_t embedding = 0;
  while (embedding < params.size() && params[embedding].part() != PART_LANGUAGE_MODEL) ++embedding;
  if (embedding < params.size() && IsUnusedOriginal(params[embedding].name())) ++embedding;
  s.embed_backward = (s.has_head || model.position_embedding() == POSITION_LEARNED) && embedding < params.size() &&
                     RunsBackward(model, params[embedding], saves);

  SizeOptimizerStep(zero_in, &s);

  if (!s.cpu_ranks) {
    // The cuBLAS workspaces are caching-allocator blocks (CublasHandlePool.cpp,
    // getCurrentCUDABlasHandle -> setWorkspace; kCublasWorkspaces), so they
    // count in peak allocated, with the buffers; the rest is outside the allocator.
    s.cublas_workspace = gpu.cublas_workspace_bytes();
    // A one-rank job creates its NCCL communicator too: DeepSpeed's engine
    // broadcasts the model (engine.py, _broadcast_model) and reduces
    // gradients whatever the world size, as zrun does (measured on an H100:
    // configs/gpus/catalog.textproto).
    s.runtime = gpu.cuda_context_bytes() + gpu.nccl_bytes_per_communicator();
  }

  // Host.
  s.host_process = gpu.host_process_bytes();
  SizeOffload(zero_in, &s);
  SizeConstruction(zero_in, &s);
  return sizer;
}

void StepSizer::Apply(const RankVariant& v, StepSizes* s) const {
  s->grad_partition = v.grad_partition;
  s->grad_partition_from = v.grad_partition_from;
  s->grad_partition_moment = v.grad_partition_moment;
  s->step_norm_copy = v.step_norm_copy;
  s->host_grad_accumulation = v.host_grad_accumulation;
  s->host_grad_accumulation_pinned = v.host_grad_accumulation_pinned;
  s->retained_head = v.retained_head;
  s->offload_norm_copy = v.offload_norm_copy;
  if (!v.retained_mlp.empty()) {
    std::vector<StepSizes::BlockKind> kinds;
    for (int layer = 0; layer < s->num_layers; ++layer) {
      kinds.push_back(s->Block(layer));
      kinds.back().retained_mlp = v.retained_mlp[layer];
      kinds.back().retained_attn = v.retained_attn[layer];
    }
    auto same = [](const StepSizes::BlockKind& a, const StepSizes::BlockKind& b) {
      return BlockKindTie(a) == BlockKindTie(b);
    };
    int forward_only_from = s->tower_layers;
    while (forward_only_from > 0 && kinds[forward_only_from - 1].forward_only) --forward_only_from;
    s->block_period = DistinctKinds(kinds, same, &s->block_kinds, &s->block_kind_of, s->tower_layers, forward_only_from);
  }
}

StepSizes StepSizer::For(int64_t b, int64_t seq) const {
  StepSizes s = Shape(b, seq);
  if (variants_.size() <= 1) {
    if (!variants_.empty()) Apply(variants_.front(), &s);
    return s;
  }
  StepSizes best = s;
  int64_t best_peak = -1;
  for (const RankVariant& v : variants_) {
    Apply(v, &s);
    const int64_t peak = StepPeakBytes(s);
    if (peak > best_peak) {
      best_peak = peak;
      best = s;
    }
  }
  return best;
}

StepSizes StepSizer::ForRank(int64_t b, int64_t seq, int64_t rank) const {
  StepSizes s = Shape(b, seq);
  if (!variants_.empty()) Apply(variants_[rank_variant_.at(rank)], &s);
  return s;
}

StepSizes StepSizer::Shape(int64_t b, int64_t seq) const {
  StepSizes s = base_;
  const ModelSpec& model = model_;
  const DType dtype = static_cast<DType>(working_dtype_);
  const int64_t w = dtype_bytes_;
  const int64_t h = model.hidden_size();
  const int64_t tokens = b * seq;
  const KernelDevice device = KernelDeviceOf(s);
  const bool masked = SdpaSlidingMaskAt(model, seq);
  const int64_t images = b * images_per_sample_;
  // A stack's sizes that do not depend on the layer: its spec and rows
  // (the language model's b x s, the tower's images x tokens per image).
  struct Stack {
    const ModelSpec* spec;
    int64_t b, seq;
    bool down_input_saved;
    int64_t fwd_transient, pre_norm_transient, ffn_live;
    MixerTransients conv, delta_rule;
    MoeTransients moe;
  };
  auto stack = [&](const ModelSpec& m, int64_t rows_b, int64_t rows_seq, bool down_saved) {
    Stack st{&m, rows_b, rows_seq, down_saved};
    // Under no_grad a block frees each intermediate after its last use; the FFN
    // branch (gate, up and their product, or up and GELU) is the widest point.
    // (NewGELUActivation: x, 0.5x, tanh and 1 + tanh, then the product;
    // QuickGELUActivation: x, the sigmoid, the product.) A fused
    // gate_up_proj's output stays whole until down_proj: 2f beside the
    // activation and the product.
    const int64_t ffn_branches = GatedMlp(m) ? (m.fused_gate_up_projection() ? 4 : 3)
                                 : m.ffn_type() == FFN_GELU_NEW   ? 4
                                 : m.ffn_type() == FFN_QUICK_GELU ? 3
                                                                  : 2;
    st.ffn_live = ffn_branches * rows_b * rows_seq * m.ffn_hidden_size() * w;
    st.fwd_transient = BlockForwardTransientBytes(m, rows_b, rows_seq, dtype, device);
    st.pre_norm_transient =
        RmsNormBackwardTransientBytes(m, rows_b * rows_seq * m.hidden_size(), dtype, BaseWeightsTrain(m));
    st.conv = ShortConvTransientBytes(m, rows_b, rows_seq, dtype);
    st.delta_rule = DeltaRuleTransientBytes(m, rows_b, rows_seq, dtype);
    // (The eager experts' depend on each layer's routing: per kind, below.)
    if (m.has_moe() && m.moe().experts_impl() != EXPERTS_EAGER) st.moe = MoeTransientBytes(m, rows_b, rows_seq, dtype);
    return st;
  };
  const Stack language = stack(model, b, seq, down_input_saved_);
  const Stack tower = s.tower_layers > 0 ? stack(tower_, images, tower_tokens_, tower_down_input_saved_) : language;
  // An attention layer's live tensors with heads `d` wide (Gemma 4's full
  // layers are wider), where SDPA gets the sliding mask or not.
  struct AttentionSizes {
    int64_t live = 0, fwd_transient = 0, bwd_transient = 0, bwd_qk_norm_transient = 0;
  };
  auto attention_sizes = [&](const Stack& st, int64_t d, bool masked_here) {
    const ModelSpec& m = *st.spec;
    const int64_t rows = st.b * st.seq, scores = st.b * m.num_attention_heads() * st.seq * st.seq;
    AttentionSizes z;
    const int64_t a = m.num_attention_heads(), kv = m.num_kv_heads();
    // Eager: the scores (working dtype) and softmax's fp32 output, or that and
    // its cast; with dropout the cast, the mask and the dropped probabilities.
    // SDPA's math path: fp32 q, k, v, then probabilities, mask and dropped.
    z.live = rows * (a + 2 * kv) * d * w;
    if (m.has_latent_attention()) {
      z.live = LatentAttentionForwardBytes(m, st.b, st.seq, dtype, device, /*grad=*/false);
    } else if (SdpaRunsMath(m, device)) {
      z.live += 3 * rows * a * d * 4 + 3 * scores * 4;
    } else if (m.attention_impl() == ATTENTION_EAGER && m.attention_sinks()) {
      // k and v repeated to every head, the masked scores, the subtracted
      // logits and the softmax with the sink column, max's values and indices.
      z.live += (a != kv ? 2 * rows * a * d * w : 0) + scores * w + 2 * SinkScores(m, st.b, st.seq) * w +
                st.b * a * st.seq * (w + 8);
    } else if (m.attention_impl() == ATTENTION_EAGER) {
      const int64_t softmax = m.eager_softmax_in_working_dtype() ? w : 4;
      const int64_t dropped = m.attention_dropout() > 0 ? w + DTypeBytes(DropoutSavedDType(dtype, device)) : 0;
      z.live += scores * std::max(w + softmax, w + dropped);
    }
    // Where SDPA repeats k and v to every head (SdpaRepeatsKvAt): the copies
    // beside the unrepeated ones while the attention module runs (a view of
    // one key head: SdpaCopiesKv), and their gradients in backward; under
    // no_grad also the mask.
    const bool repeats = SdpaRepeatsKvAt(m, d, masked_here), copies = SdpaCopiesKv(m, repeats);
    const int64_t unrepeated = 2 * rows * kv * d * w, repeated = 2 * rows * a * d * w;
    z.fwd_transient = st.fwd_transient + (copies ? unrepeated : 0);
    z.live += (copies ? repeated : 0) + (masked_here ? st.b * st.seq * st.seq * w : 0);
    const BlockBackwardTransients bwd = BlockBackwardTransientBytes(m, st.b, st.seq, dtype, device, st.down_input_saved, d);
    z.bwd_transient = bwd.attention_bytes + (repeats ? repeated - unrepeated : 0);
    // By q_norm's backward SDPA's saved tensors are freed, under the mask its copies and the mask too.
    const bool copies_unmasked = SdpaCopiesKv(m, SdpaRepeatsKvAt(m, d, /*masked=*/false));
    const int64_t masked_saved =
        (masked_here ? st.b * st.seq * st.seq * w : 0) + (copies && !copies_unmasked ? repeated - unrepeated : 0);
    z.bwd_qk_norm_transient = bwd.qk_norm_bytes > 0 ? std::max<int64_t>(0, bwd.qk_norm_bytes - masked_saved) : 0;
    return z;
  };
  s.block_kinds.resize(kinds_.size());
  bool any_masked = false;
  for (size_t kind = 0; kind < kinds_.size(); ++kind) {
    const LayerStatics& l = kinds_[kind];
    const Stack& st = l.tower ? tower : language;
    const ModelSpec& m = *st.spec;
    const int64_t rows = st.b * st.seq, width = m.hidden_size();
    const bool masked_here = !l.tower && masked && l.masked_fit >= 0;
    any_masked = any_masked || masked_here;
    const SavedFit& f = fits_[masked_here ? l.masked_fit : l.fit];
    StepSizes::BlockKind& k = s.block_kinds[kind];
    k = StepSizes::BlockKind();
    k.input = rows * width * w;
    k.forward_only = l.forward_only;
    const int64_t nograd_ffn = k.input + st.ffn_live;
    if (l.tower && tower_without_graph_) {
      // No graph: the block keeps nothing; its intermediates come and go.
      k.nograd_peak = std::max(nograd_ffn, k.input + attention_sizes(st, l.head_dim, false).live);
      continue;
    }
    // Per token of a language model's block; per sample of a tower's (its fit is all per_batch).
    const int64_t per = l.tower ? 1 : tokens;
    k.saved = f.Bytes(b, seq);
    // The delta rule's copies at a multiple of its chunk in fp32 (none where it saves nothing).
    if (l.delta_rule && f.per_batch_chunk > 0) k.saved += DeltaRuleAlignedFp32Bytes(m, b, seq, dtype);
    const int64_t scale = l.tower ? b : 1;
    k.saved_mlp = f.mlp_per_token * per * scale;
    k.saved_input = f.input_per_token * per * scale;
    k.mlp_tail_saved = f.mlp_tail_per_token * per * scale;
    k.attn_tail_saved = f.attn_tail_per_token * per * scale;
    // A pre-norm's backward runs beside what it saved, once the rest of its half's saved tensors are freed.
    auto pre_norm_backward = [&](int64_t saved_per_token) {
      return saved_per_token > 0 ? saved_per_token * per * scale + st.pre_norm_transient : 0;
    };
    k.mlp_pre_norm_bwd = pre_norm_backward(f.mlp_pre_norm_per_token);
    k.attn_pre_norm_bwd = pre_norm_backward(f.attn_pre_norm_per_token);
    // A mixture of experts' MLP in place of the dense one (its no_grad chain for the FFN's).
    const MoeTransients moe =
        l.eager_experts ? MoeTransientBytes(m, st.b, st.seq, dtype,
                                            PairsPerExpert(routing_, l.routing_layer, rows, m.moe().num_experts(),
                                                           m.moe().experts_per_token()),
                                            l.recomputed)
                        : st.moe;
    const int64_t ffn_live = l.moe ? moe.nograd_bytes : st.ffn_live;
    if (l.moe) {
      k.mlp_fwd_transient = moe.forward_bytes;
      k.recompute_mlp_fwd_transient = l.eager_experts ? moe.recompute_bytes : moe.forward_bytes;
      // The pairs' output gradient, made before the recompute, which stops short of the reordered copy.
      if (l.recompute_stops_in_experts) {
        k.recompute_pending_grad = moe.weighted_pairs_bytes;
        k.recompute_mlp_fwd_transient = moe.recompute_bytes;
      }
      // A shared MLP after the experts (GraniteMoeSharedMLP, DeepseekV3MoE's
      // shared_experts), its backward first: at its mul's, the product's
      // gradient and the activation's and up's, [T, f_s] each, the product
      // freed (InHalfTail: its saved tensors), beside the half's output
      // gradient (Granite's times residual_multiplier), which the experts'
      // backward takes next; its down projection's weight gradient is there
      // only where gradients are kept (grads_mlp_tail_out).
      if (SharedExpertAfterExperts(m.moe())) {
        const int64_t fs = m.moe().shared_expert_ffn_hidden_size();
        k.mlp_tail_bwd_transient = (2 * fs + width) * rows * w;
        if (BaseWeightsTrain(m)) {
          k.grads_mlp_tail_out = width * fs * w;
          k.grads_mlp_tail_in = 2 * fs * width * w;
        }
      }
      if (m.moe().router_aux_loss()) k.aux_router_logits = rows * m.moe().num_experts() * RouterLogitsBytes(m.moe(), w);
      k.mlp_bwd_cast = moe.backward_cast_bytes;
    }
    if (l.conv || l.delta_rule) {
      const MixerTransients& mixer = l.conv ? st.conv : st.delta_rule;
      k.fwd_transient = mixer.forward_bytes;
      k.nograd_peak = k.input + std::max(ffn_live, mixer.nograd_bytes);
      k.bwd_attn_transient = mixer.backward_bytes;
    } else {
      const AttentionSizes z = attention_sizes(st, l.head_dim, masked_here);
      k.fwd_transient = z.fwd_transient;
      k.nograd_peak = k.input + std::max(ffn_live, z.live);
      k.bwd_attn_transient = z.bwd_transient;
      k.bwd_qk_norm_transient = z.bwd_qk_norm_transient;
    }
    k.grads_attn = l.grads_attn;
    k.max_attn_grad = l.max_attn_grad;
    k.gather = l.gather;
    k.gather_kept = l.gather_kept;
    k.gather_held = l.gather_held;
    // The gradient of the MLP's output, which ops after it make (a residual
    // dropout's, a post-norm's), lives until down_proj's backward has run: a
    // plain MLP's widest moment is inside that backward (docs/deepspeed_model.md
    // row 41), a gated one's after it.
    const int64_t output_grad = k.mlp_tail_saved > 0 ? rows * width * w : 0;
    k.mlp_output_grad = GatedMlp(m) ? 0 : output_grad;
    k.bwd_mlp_transient =
        (l.moe ? moe.backward_bytes
               : BlockBackwardTransientBytes(m, st.b, st.seq, dtype, device, st.down_input_saved, m.head_dim())
                     .mlp_bytes) +
        k.mlp_output_grad;
    k.grads_mlp = l.mlp_elements * w;
    k.grads_down = l.down_elements * w;
    // The eager loop makes both banks' gradients as it goes (its accumulation
    // buffers), in its moments; kept ones stay once it is done.
    if (l.eager_experts) {
      k.mlp_grads_after_saved = true;
      k.grads_down = 0;
    } else if (l.moe && s.grads_kept_on_production) {
      // Kept gradients (the step program's kept_down beside the transient):
      // the experts' down_proj gradient comes once the first temporaries are
      // gone, beside its pairs' input gradient [S, I].
      k.bwd_mlp_transient = std::max(k.bwd_mlp_transient - k.grads_down, moe.pair_ffn_bytes);
    }
    // A weight gradient bound for a reduce bucket (stages 1-3) is made beside
    // its linear's input gradient (down_proj: the FFN-wide one, and the
    // gradient of its output when ops after the MLP made one: a residual
    // dropout's, a post-norm's), not beside the half's widest moment: it adds
    // only what exceeds that.
    // ZeRO-3's reduction that an expert bank larger than a bucket brings
    // stands beside it, at gate_up_proj's moment (Stage3ExpertReductions).
    const int64_t gate_up_moment =
        l.moe ? MoeGateUpGradientBytes(moe.pair_ffn_bytes, l.down_elements, l.largest_mlp, l.leaf_gradients, w) : 0;
    // (The eager loop's are in its moments; their hooks run once it has freed what it saved.)
    k.max_mlp_grad = l.eager_experts ? 0 : std::max<int64_t>(
        0, (l.moe ? std::max(l.down_elements * w + moe.pair_ffn_bytes, gate_up_moment + l.reductions.copy)
                  : rows * m.ffn_hidden_size() * w + output_grad + l.largest_mlp * w) -
               k.bwd_mlp_transient);
    k.down_weight_grad_waiting = l.down_weight_grad_waiting;
    k.mlp_reduce_pending = l.moe ? l.reductions.pending : 0;
    // Past down_proj's hook: a dense MLP's activation backward; the experts' gate_up_proj gradient.
    // The eager loop's: what is live past the down bank's hook above the
    // half once all it saved is freed, the router's saved tensors included.
    k.mlp_past_down_hook =
        l.eager_experts ? std::max<int64_t>(0, moe.past_down_hook_bytes + k.saved_mlp - k.mlp_tail_saved)
        : l.moe         ? gate_up_moment
                        : k.bwd_mlp_transient - k.mlp_output_grad;
    if (m.norm_placement() != NORM_PLACEMENT_PRE) {
      k.post_norm_bwd_transient = RmsNormBackwardTransientBytes(m, rows * width, dtype, BaseWeightsTrain(m));
    }
  }
  // Checkpoints on the host: the language model's blocks (a vision-language
  // model's are refused: RefuseVisionLanguageStep).
  const int64_t block_input = tokens * h * w;
  s.host_checkpoints = s.host_checkpoint_blocks * block_input;
  if (s.host_checkpoint_pinned) s.host_checkpoints_pinned = s.host_checkpoint_blocks * RoundUpToPowerOfTwo(block_input);
  if (model.has_vision()) {
    // fp32 pixels and int64 labels (ViT has no mask: it attends everywhere).
    const VisionSpec& v = model.vision();
    s.step_batch = b * (v.num_channels() * v.image_size() * v.image_size() * 4 + kTokenIdBytes);
  } else {
    s.step_batch = 2 * tokens * kTokenIdBytes;
    // cos and sin [s, head_dim] in the working dtype (Olmo2: fp32), shared
    // by every layer, or with attention layer types by every layer of one
    // type (LFM2's conv layers take none: one pair).
    std::set<int> layer_types(model.layer_types().begin(), model.layer_types().end());
    layer_types.erase(LAYER_CONV);
    layer_types.erase(LAYER_LINEAR_ATTENTION);
    // A model whose rotary embedding runs once (Gemma2Model, GptOssModel) has one pair whatever its types.
    const int64_t rope_pairs =
        ParameterlessModulesOf(model).rotary_per_layer_type ? std::max<int64_t>(1, layer_types.size()) : 1;
    if (model.position_embedding() == POSITION_ROPE) {
      // A pair as wide as its layers' rotated dims (Gemma 4's full layers: their wider heads; GPT-OSS's
      // tables cover half the head).
      auto pair = [&](int layer) {
        return 2 * (model.rope_tables_per_sequence() ? b : 1) * seq * RotaryDims(model, layer) /
               (model.rope_half_split() ? 2 : 1) * (model.rope_in_fp32() ? 4 : w);
      };
      s.rope_tables = pair(0);
      s.rope_tables_unsaved = model.rope_interleaved();
      for (int layer = 1; layer < model.num_layers() && rope_pairs > 1; ++layer) {
        if (model.layer_types(layer) != model.layer_types(0)) {  // no conv layers here: rope_pairs > 1
          s.rope_late_pair = pair(layer);
          s.rope_late_pair_layer = layer;
          s.rope_tables += s.rope_late_pair;
          break;
        }
      }
    }
    // Eager's additive causal mask [b, 1, s, s]; with attention layer types
    // both the full and the sliding one (Olmo3Model.forward's
    // causal_mask_mapping), with conv layers the full one (Lfm2Model's conv
    // layers get none without padding).
    const bool other_mixers = std::any_of(model.layer_types().begin(), model.layer_types().end(),
                                          [](int type) { return type == LAYER_CONV || type == LAYER_LINEAR_ATTENTION; });
    const int64_t masks = model.layer_types().empty() || other_mixers ? 1 : 2;
    if (model.attention_impl() == ATTENTION_EAGER) s.attention_mask = masks * tokens * seq * w;
    // SDPA past the window: the sliding one, bool [s, s] expanded to the batch (masking_utils.py, sdpa_mask).
    if (any_masked) s.attention_mask = seq * seq;
  }
  if (model.has_vision_language()) {
    const VisionLanguageSpec& v = model.vision_language();
    const int64_t c = v.hidden_size(), rows = images * tower_tokens_;
    const int64_t features = images * ImageTokensPerImage(v, image_size_);
    // The batch's fp32 pixels: llava's [images, channels, side, side];
    // Qwen's patchified [rows, channels x frames x patch^2], with the grid
    // sizes int64 [images, 3] and the token types int64 [b, s].
    if (v.tower() == VISION_TOWER_CLIP) {
      s.step_batch += images * v.num_channels() * v.tower_image_size() * v.tower_image_size() * 4;
    } else {
      s.step_batch += rows * v.num_channels() * v.temporal_patch_size() * v.patch_size() * v.patch_size() * 4 +
                      images * 3 * kTokenIdBytes + tokens * kTokenIdBytes;
    }
    for (const TensorSpec& t : VisionLanguageSavedActivations(model, b, seq, images, image_size_, dtype, device,
                                                              saves_)) {
      const absl::string_view name = t.name();
      (absl::StartsWith(name, "tower_tail.")  ? s.tower_tail_saved
       : absl::StartsWith(name, "tower.")     ? s.tower_embed_saved
       : absl::StartsWith(name, "projector.") ? s.projector_saved
                                              : s.image_mask) += TensorBytes(t);
    }
    const bool tower_graph = !tower_without_graph_;
    if (!v.freeze_projector() || tower_graph) {
      s.image_features_grad = features * h * w;
      // The projector's last linear: its input gradient beside the incoming
      // one, and its weight's (llava's [h, h] or [h, C]; Qwen's merger on
      // the merged rows, [4C, 4C] or [O, 4C]).
      const int64_t merged = v.tower() == VISION_TOWER_CLIP ? h : c * v.spatial_merge_size() * v.spatial_merge_size();
      const int64_t widest_weight = v.tower() == VISION_TOWER_CLIP ? std::max(h * h, c * h) : merged * std::max(merged, h);
      s.projector_bwd_transient = features * merged * w + (v.freeze_projector() ? 0 : widest_weight * w);
    }
    if (tower_graph) s.tower_act_grad = rows * c * w;
  }
  s.act_grad = tokens * h * w;
  s.final_norm_saved = final_norm_per_token_ * tokens;
  s.head_input_saved = head_input_per_token_ * tokens;
  s.final_norm_bwd_transient = RmsNormBackwardTransientBytes(model, tokens * h, dtype, base_.final_norm_grads > 0);
  s.embed_saved = SumBytes(EmbeddingSavedActivations(model, b, seq, dtype, device, saves_));
  // A ViT classifies each image once, from its CLS token.
  const int64_t logit_rows = model.has_vision() ? b : tokens;
  const int64_t classes = model.has_vision() ? model.vision().num_labels() : model.vocab_size();
  s.logits_working = logit_rows * classes * w;
  s.logits_fp32 = logit_rows * classes * 4;
  if (model.has_moe() && model.moe().router_aux_loss()) {
    // load_balancing_loss_func (modeling_qwen3_moe.py and its copies), no
    // attention mask: per MoE layer softmax(logits) [tokens, E], topk of it,
    // histc of the indices, routing_weights.float().sum(0).
    // The softmax is in the logits' dtype; .float() copies only 16-bit logits.
    const int64_t e = model.moe().num_experts(), k = model.moe().experts_per_token();
    const int64_t lw = RouterLogitsBytes(model.moe(), w);
    const int moe_layers = NumMoeLayers(model);
    s.aux_loss_softmaxes = moe_layers * tokens * e * lw;
    s.aux_loss_top_k = tokens * k * (lw + 8);
    s.aux_loss_float_copy = lw != 4 ? tokens * e * 4 : 0;
    s.aux_loss_backward_transient = (lw != 4 ? 2 : 1) * tokens * e * lw;
  }
  if (s.fused_loss) {
    const int64_t v = model.vocab_size(), chunk = FusedLossChunkTokens(tokens, v, h);
    // LigerForCausalLMLoss pads the labels by one and copies them shifted;
    // the forward keeps the non-ignored mask (bool) through its chunks.
    s.loss_labels = b * (seq + 1) * kTokenIdBytes + tokens * kTokenIdBytes + tokens;
    s.loss_rows = tokens * 4;
    s.loss_chunk = chunk * v * w;
    // The weight gradient grad_logits^T x_chunk. CUDA: 16-bit dtypes addmm
    // into grad_weight in place; fp32 takes the fallback's fp32 product. CPU
    // (no out= paths): the input-gradient product [chunk, h], then the
    // fallback's product and its fp32 copy, and in 16-bit dtypes the in-place
    // add's fp32 copies of grad_weight and of the sum (ATen's CPU
    // TensorIterator casts through temporaries) beside that copy.
    const int64_t vh = v * h;
    if (device == KernelDevice::kCuda) {
      s.loss_chunk_temps = s.mixed ? 0 : vh * 4;
    } else {
      s.loss_chunk_temps = std::max(chunk * h * w, s.mixed ? 3 * vh * 4 : vh * 4);
    }
  }
  return s;
}

int64_t FusedLossChunkTokens(int64_t tokens, int64_t vocab, int64_t hidden) {
  const int64_t inc_factor = (vocab + hidden - 1) / hidden;
  return std::min(tokens, RoundUpToPowerOfTwo((tokens + inc_factor - 1) / inc_factor));
}

absl::StatusOr<StepSizes> ComputeStepSizes(const ModelSpec& model, const RunConfig& config,
                                           const GpuSpec& gpu) {
  ZPLAN_ASSIGN_OR_RETURN(StepSizer sizer, StepSizer::Create(model, config, gpu));
  return sizer.For(config.micro_batch_size(), config.seq_length());
}

std::vector<NamedBytes> TensorComponents(const MemoryBreakdown& b) {
  return {{"params", b.params_bytes()},
          {"grads", b.grads_bytes()},
          {"master params", b.master_params_bytes()},
          {"optimizer states", b.optimizer_states_bytes()},
          {"activations", b.activations_bytes()},
          {"logits", b.logits_bytes()},
          {"buffers", b.buffers_bytes()},
          {"temporaries", b.temporaries_bytes()}};
}

MemoryBreakdown ScaledBreakdown(const MemoryBreakdown& b, int64_t factor) {
  MemoryBreakdown out = b;
  const auto* descriptor = out.GetDescriptor();
  const auto* reflection = out.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const auto* field = descriptor->field(i);
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT64) {
      reflection->SetInt64(&out, field, reflection->GetInt64(out, field) * factor);
    }
  }
  return out;
}

void AddBreakdown(const MemoryBreakdown& from, MemoryBreakdown* to) {
  to->set_params_bytes(to->params_bytes() + from.params_bytes());
  to->set_grads_bytes(to->grads_bytes() + from.grads_bytes());
  to->set_master_params_bytes(to->master_params_bytes() + from.master_params_bytes());
  to->set_optimizer_states_bytes(to->optimizer_states_bytes() + from.optimizer_states_bytes());
  to->set_activations_bytes(to->activations_bytes() + from.activations_bytes());
  to->set_logits_bytes(to->logits_bytes() + from.logits_bytes());
  to->set_buffers_bytes(to->buffers_bytes() + from.buffers_bytes());
  to->set_temporaries_bytes(to->temporaries_bytes() + from.temporaries_bytes());
  to->set_peak_bytes(LiveTensorBytes(*to) + to->runtime_bytes() + to->allocator_bytes());
}

int64_t ModelStatesBytes(const StepSizes& s) {
  const int64_t w = s.mixed ? 2 : 4;
  const ShardLayout& sh = s.shards;
  const int64_t owned = s.stage == 0 ? sh.trainable_elements
                        : s.stage == 3 ? sh.stage3_grad_shard_elements
                                       : sh.flat_shard_elements;
  const int64_t params = s.stage < 3 ? sh.total_elements * w
                                     : (sh.stage3_shard_elements + sh.stage3_persistent_elements) * w;
  const int64_t grads = (s.stage < 2 ? sh.trainable_elements : owned) * w;
  const int64_t master = s.mixed ? owned * kMasterBytesPerParam : 0;
  return params + grads + master + owned * kAdamStateBytesPerParam;
}

MemoryBreakdown HostPerRank(const StepSizes& s) {
  MemoryBreakdown b;
  b.set_params_bytes(s.host_params);
  b.set_grads_bytes(s.host_grads + s.host_grad_accumulation);
  b.set_master_params_bytes(s.host_master);
  b.set_optimizer_states_bytes(s.host_optimizer);
  b.set_buffers_bytes(s.host_offload_staging);
  b.set_runtime_bytes(s.host_process);
  b.set_activations_bytes(s.host_checkpoints);
  b.set_pinned_bytes(s.host_pinned + s.host_grad_accumulation_pinned + s.host_checkpoints_pinned);
  const int64_t accumulation_rounding =
      s.host_grad_accumulation_pinned > 0 ? s.host_grad_accumulation_pinned - s.host_grad_accumulation : 0;
  const int64_t checkpoints_rounding = s.host_checkpoint_pinned ? s.host_checkpoints_pinned - s.host_checkpoints : 0;
  b.set_allocator_bytes(s.host_pinned_rounding + accumulation_rounding + checkpoints_rounding);
  b.set_peak_bytes(LiveTensorBytes(b) + b.runtime_bytes() + b.allocator_bytes());
  b.set_peak_event("steady state");
  return b;
}

}  // namespace zplan
