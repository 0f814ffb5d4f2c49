#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner/gpu_catalog.h"
#include "planner/inventory.h"
#include "planner/run_config.h"
#include "planner/status_macros.h"
#include "planner/units.h"

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

// Fp32 temporaries per stepped element an Adam implementation allocates:
// torch.optim.AdamW's for-loop (_single_tensor_adamw: sqrt, then the
// division, both alive), its foreach path (_multi_tensor_adamw: one sqrt
// list, the rest in place), none for the fused kernels and DeepSpeed's
// FusedAdam / CPU Adam. torch picks foreach by default only when every
// tensor is on CUDA (optim/optimizer.py, _default_to_fused_or_foreach).
int64_t AdamTemporariesPerElement(AdamImplementation impl, bool cpu_tensors) {
  switch (impl) {
    case ADAM_IMPL_TORCH: return cpu_tensors ? 2 : 1;
    case ADAM_IMPL_TORCH_FOREACH: return 1;
    default: return 0;
  }
}

// Per rank, the backward part (StepSizes::grad_partition_from) of the first
// stage-2 bucket reduction that carries one of its parameters
// (stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads: a
// gradient that would overflow a non-empty bucket reduces it first, one
// larger than the bucket fills it alone; the epilogue reduces the rest).
// Gradient hooks fire in reverse parameter order, a tied embedding's last.
// `gelu_mlp`: the MLP's widest moment comes before down_proj's hooks (a GELU
// MLP whose down_proj keeps its input: BlockBackwardTransientBytes), and
// there the partition misses down_proj's weight gradient if that went into
// the bucket; one larger than the bucket waits beside the partition through
// the activation's backward (StepSizes::block_down_weight_grad_waiting).
struct PartitionStart {
  int part = StepSizes::kAtEpilogue;
  bool at_attention = false;       // a block's attention half
  bool at_down_proj_hook = false;  // StepSizes::grad_partition_at_down_proj_hook
};
std::vector<PartitionStart> FirstReductionPartByRank(const std::vector<TensorSpec>& params,
                                                     const std::vector<FlatPartition>& partitions, int num_layers,
                                                     int64_t bucket_elements, bool gelu_mlp) {
  std::vector<PartitionStart> from(partitions.size());
  std::vector<bool> seen(partitions.size(), false);
  // A reduction of the bucket holding parameters [lo, hi] at parameter i's
  // hook. The step program's moment of an attention half is its first
  // gradient's (the widest point), so a partition made at a later hook of
  // the half counts from the next half; an MLP half's comes after
  // down_proj's hooks (BlockBackwardTransientBytes), which count for it.
  auto reduce = [&](int lo, int hi, int i) {
    const TensorSpec& t = params[i];
    PartitionStart start;
    start.part = t.layer() >= 0 ? t.layer() : t.name().rfind("embed", 0) == 0 ? -1 : num_layers;
    start.at_attention = t.layer() >= 0 && !IsMlpTensor(t);
    start.at_down_proj_hook = gelu_mlp && IsDownProjTensor(t);
    const bool first_of_half = i + 1 == static_cast<int>(params.size()) || params[i + 1].layer() != t.layer() ||
                               IsMlpTensor(params[i + 1]) != IsMlpTensor(t);
    const bool before_moment = first_of_half || IsDownProjTensor(t);
    if (t.layer() >= 0 && !before_moment) {
      if (!start.at_attention) {
        start.at_attention = true;
      } else {
        start.part = t.layer() - 1;  // the previous block's MLP half, or the embedding (-1)
        start.at_attention = false;
      }
    }
    for (size_t r = 0; r < partitions.size(); ++r) {
      const FlatPartition& p = partitions[r];
      if (!seen[r] && p.first_param >= 0 && p.first_param <= hi && p.last_param >= lo) {
        seen[r] = true;
        from[r] = start;
      }
    }
  };
  int64_t fill = 0;
  int hi = static_cast<int>(params.size()) - 1;
  for (int i = hi; i >= 0; --i) {
    const int64_t numel = NumElements(params[i]);
    if (fill > 0 && fill + numel > bucket_elements) {
      reduce(i + 1, hi, i);
      fill = 0;
      hi = i;
    }
    fill += numel;
  }
  return from;  // the rest: at the epilogue
}

KernelDevice KernelDeviceOf(const StepSizes& s) { return s.cpu_ranks ? KernelDevice::kCpu : KernelDevice::kCuda; }

}  // namespace

// The most tensor bytes (device and host together) a rank holds while zrun
// builds its model and puts the parameters in place, before any optimizer
// state (executor/zero_engine.h). With zero.Init at stage 3 each parameter
// exists whole (fp32, on the host) only while its chunk is taken: the owned
// chunks, the persistent parameters made so far and the one being made (and
// the one-element placeholders of all).
// Otherwise the whole model is built (each parameter fp32, then its working
// copy) and then copied into the flat buffer or the stage-3 chunks while
// still whole.
int64_t ConstructionPeakBytes(const std::vector<TensorSpec>& params, const ShardLayout& sh, const ZeroConfig& zero,
                              int stage, int64_t w) {
  int64_t built = 0, peak = 0;
  if (stage == 3 && zero.zero_init()) {
    // On one rank without parameter offload the chunks are the parameters.
    const bool unpartitioned = sh.world_size == 1 && zero.offload_param() != OFFLOAD_CPU;
    // The chunks, and every parameter's placeholder (one element, Transformer::Create).
    const int64_t chunks = sh.stage3_chunk_elements * w + static_cast<int64_t>(params.size()) * w;
    for (const TensorSpec& t : params) {
      const int64_t n = NumElements(t);
      const bool kept_whole = !unpartitioned && n <= zero.stage3_param_persistence_threshold();
      peak = std::max(peak, chunks + built + n * 4 + (kept_whole ? n * w : 0));
      if (kept_whole) built += n * w;
    }
    return peak;
  }
  for (const TensorSpec& t : params) {
    const int64_t n = NumElements(t);
    peak = std::max(peak, built + n * 4 + n * w);
    built += n * w;
  }
  // The flat buffer holds the trainable parameters; frozen ones stay where they were built.
  const int64_t copy = stage == 3 ? sh.stage3_chunk_elements : stage == 0 ? sh.trainable_elements
                                                                          : sh.flat_padded_elements;
  return std::max(peak, built + copy * w);
}

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

bool Stage3MixesPartitionDtypes(const ModelSpec& model, const RunConfig& config) {
  return model.has_lora() && !model.lora().modules_to_save().empty() && config.zero().stage() == 3 &&
         config.zero().zero_init() && config.precision() != PRECISION_FP32;
}

absl::StatusOr<StepSizer> StepSizer::Create(const ModelSpec& model, const RunConfig& config,
                                            const GpuSpec& gpu) {
  StepSizer sizer;
  sizer.model_ = model;
  StepSizes& s = sizer.base_;
  const ZeroConfig& zero = config.zero();
  s.stage = zero.stage();
  s.world_size = WorldSize(config);
  s.ranks_per_node = config.cluster().gpus_per_node();
  s.num_layers = static_cast<int>(model.num_layers());
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
  const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
  const bool ds_function = s.checkpointing && ds.enabled();
  const int checkpointed = s.NumCheckpointed();
  if (ds_function && (ds.partition_activations() || ds.cpu_checkpointing()) &&
      model.attention_impl() == ATTENTION_EAGER && !model.has_vision()) {
    return absl::InvalidArgumentError(
        "deepspeed_checkpointing: with partition_activations or cpu_checkpointing DeepSpeed's checkpoint empties "
        "every floating-point argument after the block's forward (get_partitioned_activations_for_backward), and "
        "eager attention's mask is one tensor passed to every block, so the next block gets an empty mask; use "
        "sdpa attention or transformers' checkpointing");
  }
  if (ds_function && ds.partition_activations() &&
      (model.has_vision() || model.position_embedding() == POSITION_LEARNED)) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.partition_activations: transformers' GPT-2 and ViT blocks take their mask (and "
        "cache) as positional arguments, and DeepSpeed's partitioned checkpoint hands the recomputation one more "
        "than it was given (checkpointing.py, merge_tensors: a TypeError in the first backward); set it false, or "
        "checkpoint through torch (--checkpoint-function torch)");
  }
  if (ds_function && ds.cpu_checkpointing() && !ds.partition_activations() && !s.cpu_ranks) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.cpu_checkpointing: without partition_activations DeepSpeed offloads through its "
        "asynchronous engine (offload_activations.py), which zplan does not model; DeepSpeed documents "
        "cpu_checkpointing as working only with partition_activations (checkpointing.py, configure): set it true");
  }
  if (ds_function && ds.contiguous_memory_optimization() && ds.number_checkpoints() < checkpointed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_checkpointing.number_checkpoints: ", ds.number_checkpoints(), " buffers for ", checkpointed,
        " checkpointed blocks (DeepSpeed fails with an IndexError at the next); set it to at least ", checkpointed));
  }
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
  if (s.offload_optimizer && s.stage == 0) {
    return absl::InvalidArgumentError(
        "zero.offload_optimizer (--offload-optimizer): optimizer offload needs ZeRO stage >= 1");
  }
  s.fused_loss = config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR;
  if (s.fused_loss) {
    if (model.has_vision() || model.vocab_size() == 0) {
      return absl::InvalidArgumentError(
          "loss (--loss liger-fused): Liger's fused linear cross-entropy replaces a language model's LM head and "
          "loss; this model has none; drop --loss");
    }
    if (model.has_lora()) {
      return absl::InvalidArgumentError(
          "loss (--loss liger-fused): the fused loss with LoRA is not modelled yet; drop --loss or the LoRA config");
    }
  }
  if (Stage3MixesPartitionDtypes(model, config)) {
    return absl::InvalidArgumentError(
        "model.lora.modules_to_save: at ZeRO-3 with zero.Init and bf16/fp16, DeepSpeed's partition of peft's "
        "fp32 adapters and the modules' copies fails (one dtype per partition); use fp32, or stage <= 2");
  }
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
  const int64_t total = sh.total_elements;
  const int64_t trained = sh.trainable_elements;
  // Elements of the optimizer partition this rank owns.
  const int64_t owned = s.stage == 0 ? trained
                        : s.stage == 3 ? sh.stage3_grad_shard_elements
                                       : sh.flat_shard_elements;

  // Parameters.
  if (s.stage < 3) {
    s.params_resident = total * w;
  } else {
    // This rank's chunk of every parameter (the optimizer's contiguous
    // working copy), and small persistent ones also whole. On one rank the
    // chunk is the parameter: nothing is ever gathered.
    s.params_resident = s.world_size > 1 ? sh.stage3_persistent_elements * w : 0;
    if (!s.offload_param) s.params_resident += sh.stage3_chunk_elements * w;
  }
  // Gradients: the stage-3 partition; per-parameter accumulation at stages
  // 0/1 (stage 2's partition is grad_partition, below).
  if (s.stage == 3) {
    s.grads_resident = s.offload_optimizer ? 0 : owned * w;
  } else if (s.stage <= 1 && s.grad_accum > 1) {
    s.grads_resident = trained * w;  // accumulated across micro-steps
  }
  // Master and Adam states.
  if (!s.offload_optimizer) {
    s.master_resident = KeepsFp32Master(s.stage, s.mixed, false) ? owned * kMasterBytesPerParam : 0;
    s.optimizer_resident = owned * kAdamStateBytesPerParam;
  }
  // DeepSpeed's contiguous-gradients reduce buckets: made per backward at
  // stages 1/2 (stage_1_and_2.py, setup_buckets; a second one with
  // overlap_comm), at initialize at stage 3, one per gradient dtype
  // (stage3.py, DeepSpeedZeroOptimizer_Stage3.__init__: ipg_buckets).
  if (s.stage >= 1 && zero.contiguous_gradients()) {
    const int64_t buckets = zero.overlap_comm() && s.stage < 3 ? 2 : 1;
    (s.stage == 3 ? s.buckets_resident : s.ipg_buckets) = zero.reduce_bucket_elements() * w * buckets;
    s.buckets_touched = std::min(zero.reduce_bucket_elements(), trained) * w * buckets;
    if (stage1_epilogue) {
      // The gradients that fill the bucket before the first reduction
      // (reduce_independent_p_g_buckets_and_remove_grads reduces when the
      // next one would overflow it).
      int64_t moved = 0;
      for (const TensorSpec& t : trainable) {
        if (moved + NumElements(t) > zero.reduce_bucket_elements()) break;
        moved += NumElements(t);
      }
      s.epilogue_moved_grads = moved * w;
    }
  }
  const bool host_accumulation = s.stage == 2 && s.offload_optimizer && s.grad_accum > 1;
  if (((s.stage == 1 || s.stage == 2) && !s.offload_optimizer) || host_accumulation) {
    const std::vector<FlatPartition> partitions = FlatPartitionsByRank(trainable, s.world_size);
    std::vector<PartitionStart> from(partitions.size());
    if (s.stage == 2 && s.grad_accum > 1) {
      from.assign(partitions.size(), PartitionStart{s.kBeforeForward()});
    } else if (stage1_epilogue) {
      from.assign(partitions.size(), PartitionStart{StepSizes::kAtEpilogue});
    } else {
      // Every down_proj keeps its input unless LoRA freezes it.
      from = FirstReductionPartByRank(trainable, partitions, s.num_layers, zero.reduce_bucket_elements(),
                                      model.ffn_type() == FFN_GELU && !model.has_lora());
    }
    for (size_t r = 0; r < partitions.size(); ++r) {
      RankVariant v;
      if (host_accumulation) {
        // One host buffer per parameter, pinned as its own block (memory_model.h).
        for (int i = partitions[r].first_param; i >= 0 && i <= partitions[r].last_param; ++i) {
          const int64_t bytes = NumElements(trainable[i]) * w;
          v.host_grad_accumulation += bytes;
          if (s.pin_memory && !s.cpu_ranks) v.host_grad_accumulation_pinned += RoundUpToPowerOfTwo(bytes);
        }
      } else {
        v.grad_partition = partitions[r].params_elements * w;
        v.grad_partition_from = from[r].part;
        v.grad_partition_at_attention = from[r].at_attention;
        v.grad_partition_at_down_proj_hook = from[r].at_down_proj_hook;
        v.step_norm_copy = partitions[r].max_piece_elements * 8;  // get_norm_dtype(): fp64
      }
      auto it = std::find(sizer.variants_.begin(), sizer.variants_.end(), v);
      sizer.rank_variant_.push_back(static_cast<int>(it - sizer.variants_.begin()));
      if (it == sizer.variants_.end()) sizer.variants_.push_back(v);
    }
  }

  // The first gradient of backward (hooks fire in reverse parameter order, a
  // tied embedding's last) brings the IPG buckets.
  if (!trainable.empty()) {
    const TensorSpec& first = trainable.back();
    s.ipg_from = first.layer() >= 0                          ? first.layer()
                 : absl::StartsWith(first.name(), "lm_head") || absl::StartsWith(first.name(), "classifier")
                     ? s.kHeadPart()
                 : absl::StartsWith(first.name(), "final_norm") ? s.num_layers
                                                                : -1;
    s.ipg_at_attention = first.layer() >= 0 && !IsMlpTensor(first);
  }

  // Blocks: gradients of the trainable parameters, gathers of all.
  const std::vector<TensorSpec> block_params = BlockParameters(model, 0);
  int64_t block_param_elements = 0, mlp_elements = 0, down_elements = 0, largest_mlp = 0, largest_attn = 0;
  int64_t down_weight_elements = 0;
  for (const TensorSpec& t : block_params) {
    if (t.frozen()) continue;
    block_param_elements += NumElements(t);
    if (IsMlpTensor(t)) {
      mlp_elements += NumElements(t);
      if (IsDownProjTensor(t)) down_elements += NumElements(t);
      if (IsDownProjTensor(t) && t.shape_size() == 2) down_weight_elements = NumElements(t);
      largest_mlp = std::max(largest_mlp, NumElements(t));
    } else {
      largest_attn = std::max(largest_attn, NumElements(t));
    }
  }
  const KernelDevice device = KernelDeviceOf(s);
  sizer.saves_ = SavePolicyFor(config);
  const SavePolicy& saves = sizer.saves_;
  // Saved activations = X*b*s + Y*b*s*s (eager probabilities) + Z*s*s (the
  // causal mask): fit the three terms from the inventory, check a fourth point.
  auto fit = [&](int layer) {
    auto saved = [&](int64_t b, int64_t seq) {
      return SumBytes(BlockSavedActivations(model, b, seq, dtype, layer, device, saves));
    };
    SavedFit f;
    const int64_t f11 = saved(1, 1), f12 = saved(1, 2), f21 = saved(2, 1);
    f.per_seq_sq = 2 * f11 - f21;
    f.per_token_sq = (f12 - 2 * f.per_seq_sq - 2 * f11) / 2;
    f.per_token = f11 - f.per_seq_sq - f.per_token_sq;
    ZPLAN_CHECK(saved(3, 5) == f.Bytes(3, 5));
    for (const TensorSpec& t : BlockSavedActivations(model, 1, 1, dtype, layer, device, saves)) {
      if (IsMlpTensor(t)) f.mlp_per_token += TensorBytes(t);
      if (IsBlockInputItself(t, dtype)) f.input_per_token += TensorBytes(t);
      if (absl::EndsWith(t.name(), ".mlp.resid_dropout_mask")) f.mlp_dropout_per_token += TensorBytes(t);
    }
    return f;
  };
  sizer.saved_ = fit(1);
  sizer.saved_block0_ = fit(0);
  // Whether down_proj keeps its input (the FFN product or activation).
  const std::string down_input = model.ffn_type() == FFN_SWIGLU ? ".mlp.product" : ".mlp.act";
  for (const TensorSpec& t : BlockSavedActivations(model, 1, 1, dtype, 1, device, saves)) {
    sizer.down_input_saved_ = sizer.down_input_saved_ || absl::EndsWith(t.name(), down_input);
  }
  sizer.final_norm_per_token_ = SumBytes(FinalNormSavedActivations(model, 1, 1, dtype, device, saves));
  s.block_grads = block_param_elements * w;
  s.block_grads_mlp = mlp_elements * w;
  s.block_grads_down = down_elements * w;
  s.block_max_mlp_grad = largest_mlp * w;
  const bool reduced_in_hooks = (s.stage == 1 || s.stage == 2) && !stage1_epilogue;
  if (reduced_in_hooks && zero.contiguous_gradients() && down_weight_elements > zero.reduce_bucket_elements()) {
    s.block_down_weight_grad_waiting = down_weight_elements * w;
  }
  s.block_max_attn_grad = largest_attn * w;
  if (s.stage == 3 && s.world_size > 1) {
    int64_t partitioned = 0;
    for (const TensorSpec& t : block_params) {
      if (NumElements(t) > zero.stage3_param_persistence_threshold()) partitioned += NumElements(t);
    }
    // The block being computed plus the next one's parameters prefetched in
    // order while fewer than min(prefetch bucket, live cap - gathered) are
    // in flight (DeepSpeed's PartitionedParameterCoordinator; the parameter
    // that crosses the limit is included).
    const int64_t limit = std::min(zero.stage3_prefetch_bucket_elements(),
                                   zero.stage3_max_live_parameters() - partitioned);
    int64_t prefetched = 0;
    for (const TensorSpec& t : block_params) {
      if (prefetched >= limit) break;
      if (NumElements(t) > zero.stage3_param_persistence_threshold()) prefetched += NumElements(t);
    }
    s.block_gather = (partitioned + prefetched) * w;
    s.gather_kept_block = partitioned * w;
    // Kept parameters (sharding.h): the later the block, the nearer its
    // backward, so blocks from some index on are kept whole (the step
    // program's groups rely on it; the simulator test checks it).
    std::vector<bool> runs_backward;
    for (const TensorSpec& t : params) runs_backward.push_back(RunsBackward(model, t, saves));
    const Stage3Retention retention = Stage3RetentionOf(params, s.tied, zero, runs_backward);
    std::vector<int64_t> kept(s.num_layers, 0);
    for (size_t j = 0; j < params.size(); ++j) {
      const TensorSpec& t = params[j];
      if (t.layer() >= 0 && retention.kept_after_forward[j] && NumElements(t) > zero.stage3_param_persistence_threshold()) {
        kept[t.layer()] += NumElements(t) * w;
      }
    }
    int from = s.num_layers;
    while (from > 0 && kept[from - 1] == s.gather_kept_block) --from;
    s.gather_kept_from = from;
    s.gather_kept_partial = from > 0 ? kept[from - 1] : 0;
    s.embed_kept = retention.embedding_kept;
    s.head_kept = retention.head_kept;
  }

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
    // (inventory.h); at stage 3 the partitioned ones are gathered together.
    for (const TensorSpec& t : params) {
      if (t.layer() >= 0 || absl::StartsWith(t.name(), "final_norm")) continue;
      const int64_t bytes = NumElements(t) * w;
      const bool head = absl::StartsWith(t.name(), "classifier");
      if (!t.frozen()) (head ? s.head_grad : absl::StrContains(t.name(), "position") ? s.pos_grad : s.embed_grad) += bytes;
      if (s.stage == 3 && s.world_size > 1 && NumElements(t) > zero.stage3_param_persistence_threshold()) {
        (head ? s.head_gather : s.embed_gather) += bytes;
      }
    }
  } else if (s.has_head) {
    if (trains(s.tied ? "embed_tokens" : "lm_head")) s.head_grad = vocab * h * w;
    if (trains("embed_tokens")) s.embed_grad = vocab * h * w;
    if (s.stage == 3 && s.world_size > 1 && vocab * h > zero.stage3_param_persistence_threshold()) {
      s.embed_gather = s.head_gather = vocab * h * w;
    }
    // Learned positions (GPT-2's wpe) are gathered, and kept, with it.
    const int64_t positions =
        model.position_embedding() == POSITION_LEARNED ? model.max_position_embeddings() * h : 0;
    if (s.stage == 3 && s.world_size > 1 && positions > zero.stage3_param_persistence_threshold()) {
      s.embed_gather += positions * w;
    }
  }
  if (trains("embed_positions")) s.pos_grad = model.max_position_embeddings() * h * w;
  // A frozen embedding (LoRA) runs no backward: nothing is gathered for it.
  // (A modules_to_save embedding's copy follows its original.)
  const size_t embedding = !params.empty() && IsUnusedOriginal(params.front().name()) ? 1 : 0;
  s.embed_backward = (s.has_head || model.position_embedding() == POSITION_LEARNED) && embedding < params.size() &&
                     RunsBackward(model, params[embedding], saves);

  // Stage 0 reduces gradients after backward through one flat bucket.
  if (s.stage == 0) s.reduce_temp = std::min(zero.reduce_bucket_elements(), trained) * w;
  const int64_t adam_temps = AdamTemporariesPerElement(config.optimizer().implementation(), s.cpu_ranks);
  if (s.offload_optimizer) {
    // Nothing on the device: CPU Adam steps the host partition.
  } else if (s.stage == 1 || s.stage == 2) {
    const int64_t shard = sh.flat_shard_elements;
    s.step_flat_grads = s.mixed ? shard * w : 0;                   // fp32: the flat copy is the fp32 one
    s.step_fp32_grads = shard * 4;
    s.step_optimizer_temps = adam_temps * shard * 4;
  } else {
    // Stages 0/3 take this rank's gradients as contiguous fp32 one sub-group
    // at a time: an upcast (mixed precision), or at stage 0 a gather from
    // the per-parameter gradients (fp32 too).
    const int64_t sub_group = std::min(zero.sub_group_elements(), owned);
    if (s.stage == 0 && s.mixed) {
      // FP16_Optimizer flattens every gradient at once (no sub-groups).
      s.step_grad_copies = s.step_upcast = trained * 4;
    } else if (s.mixed || s.stage == 0) {
      s.step_upcast = sub_group * 4;
    }
    if (s.stage == 3) s.step_optimizer_temps = adam_temps * sub_group * 4;
  }

  if (!s.cpu_ranks) {
    // The cuBLAS workspace is a caching-allocator block (CublasHandlePool.cpp,
    // getCurrentCUDABlasHandle -> setWorkspace), so it counts in peak
    // allocated, with the buffers; the rest is outside the allocator.
    s.cublas_workspace = gpu.cublas_workspace_bytes();
    // A one-rank job creates its NCCL communicator too: DeepSpeed's engine
    // broadcasts the model (engine.py, _broadcast_model) and reduces
    // gradients whatever the world size, as zrun does (measured on an H100:
    // configs/gpus/catalog.textproto).
    s.runtime = gpu.cuda_context_bytes() + gpu.nccl_bytes_per_communicator();
  }

  // Host.
  s.host_process = gpu.host_process_bytes();
  if (s.offload_optimizer) {
    s.host_master = owned * kMasterBytesPerParam;
    s.host_optimizer = owned * kAdamStateBytesPerParam;
    s.host_grads = owned * kOffloadGradBytesPerParam;
    // Stage 3 reduces into a working-dtype partition on the host first
    // (stage3.py, grad_partitions_flat_buffer on the offload device), upcast
    // into the fp32 gradients at the accumulation boundary.
    if (s.stage == 3) s.host_grads += owned * w;
  }
  if (s.offload_param) s.host_params = sh.stage3_chunk_elements * w;
  int64_t largest = 0;  // trainable: the offload staging buffers hold gradients
  for (const TensorSpec& t : trainable) largest = std::max(largest, NumElements(t));
  if (s.offload_optimizer && s.stage <= 2) {
    s.offload_staging_resident = largest * w;
    s.host_offload_staging = largest * w + sh.flat_shard_elements * w;
  }
  // Page-locked buffers (CUDA ranks with pin_memory): those DeepSpeed pins,
  // each its own CachingHostAllocator block, rounded up to a power of two
  // (ATen/core/CachingHostAllocator.h, allocate: PowerOf2Ceil). CPU Adam's
  // states are plain host tensors (ops/adam/cpu_adam.py, step: zeros_like),
  // and so is stage 3's fp32 partition (stage3.py, _create_fp32_partitions).
  if (s.pin_memory && !s.cpu_ranks) {
    std::vector<int64_t> pinned;
    if (s.offload_optimizer && s.stage <= 2) {
      // stage_1_and_2.py, __init__ and initialize_optimizer_states: the fp32
      // partition and its gradient, the bit16 copy, the gradient staging buffer.
      pinned = {s.host_master, s.host_grads, sh.flat_shard_elements * w, largest * w};
    } else if (s.offload_optimizer) {
      // stage3.py: grad_partitions_flat_buffer (_setup_for_real_optimizer),
      // and each sub-group's fp32 gradient (initialize_optimizer_states).
      pinned.push_back(owned * w);
      const int64_t sub_group = std::max<int64_t>(1, zero.sub_group_elements());
      for (int64_t begin = 0; begin < owned; begin += sub_group) {
        pinned.push_back(std::min(sub_group, owned - begin) * kOffloadGradBytesPerParam);
      }
    }
    // stage3.py, _create_fp16_partitions_with_defragmentation: param_groups_fp16_flat_cpu_memory.
    if (s.offload_param) pinned.push_back(s.host_params);
    for (const int64_t bytes : pinned) {
      const int64_t block = RoundUpToPowerOfTwo(bytes);
      s.host_pinned += block;
      s.host_pinned_rounding += block - bytes;
    }
  }
  s.construction = ConstructionPeakBytes(params, sh, zero, s.stage, w);
  // Without zero.Init every local rank first builds the whole fp32 model.
  const bool sharded_init = s.stage == 3 && zero.zero_init();
  s.host_init_per_rank =
      (sharded_init ? sh.stage3_shard_elements + sh.stage3_persistent_elements : total) * 4;
  return sizer;
}

void StepSizer::Apply(const RankVariant& v, StepSizes* s) const {
  s->grad_partition = v.grad_partition;
  s->grad_partition_from = v.grad_partition_from;
  s->grad_partition_at_attention = v.grad_partition_at_attention;
  s->grad_partition_at_down_proj_hook = v.grad_partition_at_down_proj_hook;
  s->step_norm_copy = v.step_norm_copy;
  s->host_grad_accumulation = v.host_grad_accumulation;
  s->host_grad_accumulation_pinned = v.host_grad_accumulation_pinned;
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
  s.block_saved = saved_.Bytes(b, seq);
  s.block_saved_mlp = saved_.mlp_per_token * tokens;
  s.block0_saved_less = s.block_saved - saved_block0_.Bytes(b, seq);
  s.block0_saved_mlp_less = s.block_saved_mlp - saved_block0_.mlp_per_token * tokens;
  s.block_saved_input = saved_.input_per_token * tokens;
  s.block0_saved_input = saved_block0_.input_per_token * tokens;
  s.block_mlp_dropout_saved = saved_.mlp_dropout_per_token * tokens;
  s.block0_mlp_dropout_saved = saved_block0_.mlp_dropout_per_token * tokens;
  s.block_input = tokens * h * w;
  s.host_checkpoints = s.host_checkpoint_blocks * s.block_input;
  if (s.host_checkpoint_pinned) {
    s.host_checkpoints_pinned = s.host_checkpoint_blocks * RoundUpToPowerOfTwo(s.block_input);
  }
  const KernelDevice device = KernelDeviceOf(s);
  s.block_fwd_transient = BlockForwardTransientBytes(model, b, seq, dtype, device);
  // Under no_grad a block frees each intermediate after its last use; the FFN
  // branch (gate, up and their product, or up and GELU) is the widest point.
  // (NewGELUActivation: x, 0.5x, tanh and 1 + tanh, then the product.)
  const int64_t ffn_branches = model.ffn_type() == FFN_SWIGLU ? 3 : model.ffn_type() == FFN_GELU_NEW ? 4 : 2;
  const int64_t ffn_live = ffn_branches * tokens * model.ffn_hidden_size() * w;
  // Eager: the scores (working dtype) and softmax's fp32 output, or that and
  // its cast; with dropout the cast, the mask and the dropped probabilities.
  // SDPA's math path: fp32 q, k, v, then probabilities, mask and dropped.
  const int64_t scores = b * model.num_attention_heads() * seq * seq;
  int64_t attn_live = tokens * (model.num_attention_heads() + 2 * model.num_kv_heads()) * model.head_dim() * w;
  if (SdpaRunsMath(model, device)) {
    attn_live += 3 * tokens * model.num_attention_heads() * model.head_dim() * 4 + 3 * scores * 4;
  } else if (model.attention_impl() == ATTENTION_EAGER) {
    const int64_t softmax = model.eager_softmax_in_working_dtype() ? w : 4;
    const int64_t dropped = model.attention_dropout() > 0 ? w + DTypeBytes(DropoutSavedDType(dtype, device)) : 0;
    attn_live += scores * std::max(w + softmax, w + dropped);
  }
  s.block_nograd_peak = s.block_input + std::max(ffn_live, attn_live);
  const BlockBackwardTransients bwd = BlockBackwardTransientBytes(model, b, seq, dtype, device, down_input_saved_);
  s.block_bwd_mlp_transient = bwd.mlp_bytes;
  // A weight gradient bound for a reduce bucket (stages 1-3) lives beside
  // its linear's input gradient (down_proj: the FFN-wide one, and with
  // residual dropout the dropped output's gradient, less the mask freed
  // before it), not beside the half's widest moment: it adds only what
  // exceeds that.
  const int64_t dropout_grad =
      model.residual_dropout() > 0 ? tokens * h * (w - DTypeBytes(DropoutSavedDType(dtype, device))) : 0;
  s.block_max_mlp_grad = std::max<int64_t>(
      0, tokens * model.ffn_hidden_size() * w + dropout_grad + base_.block_max_mlp_grad - bwd.mlp_bytes);
  s.block_bwd_attn_transient = bwd.attention_bytes;
  if (model.has_vision()) {
    // fp32 pixels and int64 labels (ViT has no mask: it attends everywhere).
    const VisionSpec& v = model.vision();
    s.step_batch = b * (v.num_channels() * v.image_size() * v.image_size() * 4 + kTokenIdBytes);
  } else {
    s.step_batch = 2 * tokens * kTokenIdBytes;
    // cos and sin [s, head_dim] in the working dtype, shared by every layer.
    if (model.position_embedding() == POSITION_ROPE) s.rope_tables = 2 * seq * model.head_dim() * w;
    if (model.attention_impl() == ATTENTION_EAGER) s.attention_mask = tokens * seq * w;
  }
  s.act_grad = tokens * h * w;
  s.final_norm_saved = final_norm_per_token_ * tokens;
  s.embed_saved = SumBytes(EmbeddingSavedActivations(model, b, seq, dtype, device, saves_));
  // A ViT classifies each image once, from its CLS token.
  const int64_t logit_rows = model.has_vision() ? b : tokens;
  const int64_t classes = model.has_vision() ? model.vision().num_labels() : model.vocab_size();
  s.logits_working = logit_rows * classes * w;
  s.logits_fp32 = logit_rows * classes * 4;
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
