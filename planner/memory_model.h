// File: memory_model.h
// The closed-form memory model: per-rank device and host bytes, by component,
// for one training step of a resolved (ModelSpec, RunConfig, GpuSpec).
//
// What it models (DESIGN §3) is what zrun's engine does, which follows
// DeepSpeed's semantics:
//   * model states (ZeRO paper §5): working-dtype params 2Ψ, grads 2Ψ, fp32
//     master 4Ψ and Adam m, v 8Ψ, sharded per stage (padding per sharding.h);
//     on the host with offload_optimizer / offload_param;
//   * activations from the inventory's per-block saved tensors (only block
//     inputs with checkpointing, plus one block recomputed in backward);
//   * logits and loss: b·s·V in the working dtype, the fp32 upcast,
//     log-softmax output and its gradient;
//   * buffers: stage-2/3 reduce buckets (x2 with overlap_comm), stage-3
//     gathered layers with prefetch (capped by max_live_parameters);
//   * temporaries: backward gradient temporaries, post-backward reduce
//     buckets (stages 0/1), the fp32 gradient upcast of the optimizer step;
//   * the cuBLAS workspace (a caching-allocator block, counted with the
//     buffers) and runtime outside the allocator (CUDA context, NCCL), from
//     the GPU catalog; what the caching allocator holds reserved beyond the
//     tensors comes from replaying the step (allocator_replay.h).
//
// The closed form evaluates the handful of moments where a step can peak
// (end of forward, inside the loss, first and last backward block, embedding
// backward, reduction, optimizer step) and returns the largest. The step
// simulator (simulator.h) replays every allocation and must agree with it
// exactly; both read the same StepSizes.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(StepSizes sizes, ComputeStepSizes(model, config, gpu));
//   MemoryBreakdown device = ClosedFormDevicePeak(sizes);
#ifndef ZPLAN_PLANNER_MEMORY_MODEL_H_
#define ZPLAN_PLANNER_MEMORY_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/inventory.h"
#include "planner/sharding.h"
#include "proto/gpu.pb.h"
#include "proto/memory.pb.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// Bytes per parameter of mixed-precision Adam beyond the working copy (ZeRO
// paper K = 12): fp32 master 4 + momentum 4 + variance 4.
inline constexpr int64_t kMasterBytesPerParam = 4;
inline constexpr int64_t kAdamStateBytesPerParam = 8;  // m + v, fp32
// DeepSpeed's CPU Adam keeps an fp32 gradient partition beside master, m, v.
inline constexpr int64_t kOffloadGradBytesPerParam = 4;
inline constexpr int64_t kTokenIdBytes = 8;  // int64 ids and targets

// Every size a step needs, in bytes unless named otherwise; one rank.
struct StepSizes {
  // Configuration.
  int stage = 0;
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;
  int num_layers = 0;
  int64_t grad_accum = 1;
  bool mixed = true;                 // bf16/fp16 with fp32 master
  bool checkpointing = false;
  int checkpoint_every = 1;          // with checkpointing: blocks 0, k, 2k, ... (RunConfig)
  bool Checkpointed(int layer) const { return checkpointing && layer % checkpoint_every == 0; }
  int NumCheckpointed() const { return checkpointing ? (num_layers + checkpoint_every - 1) / checkpoint_every : 0; }
  // What a checkpointed block keeps of its input, in copies of b·s·h on the
  // device after its forward: 1 as torch.utils.checkpoint; 0 when it went to
  // the host (transformers' offload: save_on_cpu). deepspeed.checkpointing.
  // checkpoint with partition_activations keeps a copy made before the block
  // runs (checkpointing.py, partition_activations) and releases the input
  // after it (get_partitioned_activations_for_backward).
  int checkpoint_kept_inputs = 1;
  bool checkpoint_copy_on_device = false;  // DeepSpeed's copy: +1 while the block runs
  bool checkpoint_copy_on_host = false;    // offloaded: +1 once brought back for the backward
  // DeepSpeed's contiguous_memory_optimization: the copies go into this many
  // buffers (number_checkpoints), all allocated at the first checkpointed
  // block; the spare ones go at the first checkpointed backward.
  int checkpoint_slots = 0;
  // The host copies, and whether pinned (transformers' save_on_cpu) or
  // pageable (DeepSpeed's .cpu() copies and contiguous buffers).
  int host_checkpoint_blocks = 0;
  bool host_checkpoint_pinned = false;
  bool offload_optimizer = false;
  bool offload_param = false;
  bool pin_memory = true;
  bool tied = false;
  // The model ends in a head with logits and a cross-entropy loss: an LM
  // head over the vocabulary, or a ViT's classifier on its CLS token.
  bool has_head = true;
  bool cpu_ranks = false;            // device tensors live in host RAM
  // Stage 0, and stage 1 without overlap_comm, without accumulation
  // allocate gradients during backward and keep them; otherwise produced
  // gradients are temporaries (moved into a bucket or added into the
  // resident gradient).
  bool grads_kept_on_production = false;
  // Stage 1 without overlap_comm moves the kept (or accumulated) gradients
  // into the IPG bucket in parameter order after backward
  // (stage_1_and_2.py, reduce_gradients), freeing each; these bytes of them
  // are gone when the first full bucket makes the partition.
  int64_t epilogue_moved_grads = 0;
  ShardLayout shards;

  // Resident for the whole step (device).
  int64_t params_resident = 0;       // full, or stage-3 shard + persistent
  int64_t grads_resident = 0;        // stage-2/3 shard; stage-0/1 full with accumulation
  int64_t master_resident = 0;
  int64_t optimizer_resident = 0;
  int64_t buckets_resident = 0;      // stage-3 reduce buckets
  // Stages 1/2 with optimizer offload (stage_1_and_2.py, __init__): a device
  // gradient staging buffer the size of the largest parameter
  // (temp_grad_buffer_for_gpu_offload); its host twin and a working-dtype
  // copy of the partition are host_offload_staging.
  int64_t offload_staging_resident = 0;
  // Of the reduce buckets (resident or IPG), the bytes ever written: a
  // bucket larger than the model's gradients is never filled, and unwritten
  // pages take no host RAM.
  int64_t buckets_touched = 0;

  // Stages 1/2 (DeepSpeed stage_1_and_2.py). The IPG reduce buckets exist
  // from the first gradient hook of a backward (setup_buckets) to its end
  // (_release_ipg_buffers). The gradient partition (copy_grads_in_partition)
  // appears at the first bucket reduction -- in backward part
  // grad_partition_from: num_layers the final norm, a block index, -1 the
  // embedding, kAtEpilogue after backward when none reaches the rank, or
  // kBeforeForward when accumulation carries it over -- and lives into the
  // step until its flattened fp32 copy exists (_release_preflattened_grad_buffers).
  // Both depend on the rank (sharding.h, FlatPartition).
  static constexpr int kAtEpilogue = -2;
  int64_t ipg_buckets = 0;
  int64_t grad_partition = 0;
  int grad_partition_from = kAtEpilogue;
  bool grad_partition_at_attention = false;  // in that block's attention half, not its MLP's
  // In its MLP half at down_proj's hook, past a GELU MLP's widest moment:
  // down_proj's saved input is freed by then, its weight gradient not yet.
  bool grad_partition_at_down_proj_hook = false;
  int kBeforeForward() const { return num_layers + 1; }

  // The backward part whose gradient hook fires first, where the IPG
  // buckets appear: kHeadPart the LM head (untied, trainable), num_layers the
  // final norm, a block index (its attention half when ipg_at_attention),
  // -1 the embedding; kNoGradients when nothing trains.
  static constexpr int kNoGradients = -3;
  int ipg_from = kNoGradients;
  bool ipg_at_attention = false;
  int kHeadPart() const { return num_layers + 1; }

  // Per block.
  int64_t block_saved = 0;           // tensors saved for backward, no checkpointing
  int64_t block_saved_mlp = 0;       // of which the MLP half's (freed first in backward)
  // With LoRA block 0's input does not require grad (the embedding is
  // frozen), so it keeps this much less than the others (inventory.h), of
  // which block0_saved_mlp_less in its MLP half.
  int64_t block0_saved_less = 0;
  int64_t block0_saved_mlp_less = 0;
  // Of block_saved (block 0's), the block's input itself (IsBlockInputItself):
  // a checkpointed block's recompute saves the input on the device (kept, or
  // brought back from the host) and allocates this no second time.
  int64_t block_saved_input = 0;
  int64_t block0_saved_input = 0;
  int64_t RecomputeReusedInput(int layer) const { return layer == 0 ? block0_saved_input : block_saved_input; }
  int64_t block_input = 0;           // b·s·h in the working dtype
  int64_t block_fwd_transient = 0;   // extra inside forward with grad
  int64_t block_nograd_peak = 0;     // checkpointed forward: live intermediates
  int64_t block_bwd_mlp_transient = 0;   // MLP half's backward temporaries
  int64_t block_bwd_attn_transient = 0;  // attention half's
  int64_t block_grads = 0;           // all block parameters, working dtype
  int64_t block_grads_mlp = 0;       // of which the MLP half's
  int64_t block_grads_down = 0;      // of those down_proj's: made beside its input gradient, the half's widest moment
  int64_t block_max_mlp_grad = 0;    // largest single parameter of each half
  int64_t block_max_attn_grad = 0;
  // Stages 1/2 (reduced in the hooks): down_proj's weight gradient when it is
  // larger than a reduce bucket. Its hook comes after its bias's (autograd
  // finishes a linear's bias gradient first), and it waits, whole, for the
  // next reduction (stage_1_and_2.py, extra_large_param_to_reduce), through
  // the activation's backward: the half's widest moment.
  int64_t block_down_weight_grad_waiting = 0;
  // The MLP's residual-dropout mask (block0_: block 0's), freed with its
  // backward before the activation's backward (the widest moment).
  int64_t block_mlp_dropout_saved = 0;
  int64_t block0_mlp_dropout_saved = 0;
  // The MLP half's activation-gradient temporaries past down_proj's hooks:
  // the transient, less the mask freed by then.
  int64_t MlpTransientPastDownProjHooks(int layer) const {
    const int64_t mask = layer == 0 ? block0_mlp_dropout_saved : block_mlp_dropout_saved;
    return block_bwd_mlp_transient - std::min(mask, block_bwd_mlp_transient);
  }
  int64_t block_gather = 0;          // stage 3: gathered block + prefetch
  // Stage 3 (sharding.h, Stage3Retention): gathered parameters DeepSpeed
  // keeps from their forward to their backward -- blocks gather_kept_from
  // onwards whole (gather_kept_block bytes each) and gather_kept_partial bytes
  // of the block before; the embedding through the whole step when
  // embed_kept; the LM head from its forward to its backward when head_kept.
  int gather_kept_from = 0;
  int64_t gather_kept_block = 0;
  int64_t gather_kept_partial = 0;
  bool embed_kept = false;
  bool head_kept = false;

  // Model ends.
  int64_t rope_tables = 0;           // RoPE cos/sin tables, to the end of backward
  int64_t step_batch = 0;            // ids + targets (a ViT: pixels + labels), through the step
  int64_t embed_saved = 0;           // the embedding dropout's mask: to the embedding's backward
  bool embed_backward = true;        // the embeddings run a backward (not when frozen)
  // Eager attention's additive causal mask [b,1,s,s] (transformers'
  // eager_mask): from the embedding to the final norm, or with checkpointing
  // (a checkpointed block's input) to block 0's backward.
  int64_t attention_mask = 0;
  int64_t act_grad = 0;              // gradient carried between blocks, b·s·h
  int64_t final_norm_saved = 0;
  int64_t final_norm_grads = 0;
  int64_t head_grad = 0;             // V·h (the tied embedding's, or lm_head's)
  int64_t embed_grad = 0;            // V·h: the embedding's contribution
  int64_t pos_grad = 0;              // learned positions
  int64_t embed_gather = 0;          // stage 3: the embedding (and learned positions) gathered
  int64_t head_gather = 0;           // stage 3: the head gathered (a tied one is the embedding)
  int64_t logits_working = 0;        // b·s·V in the working dtype (a ViT: b·labels)
  int64_t logits_fp32 = 0;           // b·s·V·4
  // Liger's fused linear cross-entropy (RunConfig.loss;
  // liger_kernel/ops/fused_linear_cross_entropy.py,
  // fused_linear_cross_entropy_forward) in place of the logits: from the
  // loss forward to its backward, its input gradient (act_grad) and the
  // head's weight gradient (head_grad) exist; during the forward also the
  // final norm's output, the labels, the fp32 per-token losses and, one
  // chunk of tokens at a time, the chunk's logits and the temporaries of its
  // weight-gradient product.
  bool fused_loss = false;
  int64_t loss_labels = 0;           // padded + shifted int64 labels, the non-ignored mask
  int64_t loss_rows = 0;             // loss_1d: fp32 [b·s]
  int64_t loss_chunk = 0;            // [chunk, V] logits, working dtype
  int64_t loss_chunk_temps = 0;      // beside them, at the widest moment of a chunk

  // After backward and in the step.
  int64_t reduce_temp = 0;           // stage 0 reduce bucket
  int64_t step_upcast = 0;           // stages 0/3: fp32 gradient upcast per sub-group
  // Stage 0 in mixed precision (DeepSpeed's FP16_Optimizer.step,
  // runtime/fp16/fused_optimizer.py): every gradient upcast to fp32, all
  // alive while _flatten_dense_tensors makes step_upcast of them; then the
  // gradients are set to None before the optimizer steps.
  int64_t step_grad_copies = 0;
  // Stages 1/2 (stage_1_and_2.py, step): each gradient piece of the
  // partition copied to fp64 for the norm (get_grad_norm_direct), the
  // partition flattened in the working dtype and upcast to fp32.
  int64_t step_norm_copy = 0;
  int64_t step_flat_grads = 0;       // the working-dtype flat copy (mixed precision)
  int64_t step_fp32_grads = 0;
  // What the Adam implementation allocates beside the stepped fp32 tensor
  // (the flat partition, or one stage-3 sub-group).
  int64_t step_optimizer_temps = 0;

  // CUDA ranks: one cuBLAS(Lt) workspace, allocated through the caching
  // allocator at the first matmul and kept (the catalog's size).
  int64_t cublas_workspace = 0;
  // Runtime outside the allocator (CUDA context, NCCL), from the catalog.
  int64_t runtime = 0;
  // What the caching allocator holds reserved but free at the peak: 0 here,
  // set by WithAllocatorCache (allocator_replay.h), which replays the step.
  int64_t allocator_cached = 0;

  // Host, per rank.
  int64_t host_process = 0;
  int64_t host_params = 0;           // offload_param shard
  int64_t host_grads = 0;            // offload_optimizer fp32 grads
  int64_t host_master = 0;
  int64_t host_optimizer = 0;
  int64_t host_offload_staging = 0;  // temp_grad_buffer_for_cpu_offload + param_buffer_of_bit16_for_cpu_offload_groups
  // Stage 2 with offload and accumulation: every parameter touching the
  // rank's partition, whole, in the working dtype (stage_1_and_2.py,
  // async_accumulate_grad_in_cpu_via_gpu: accumulated_grads_in_cpu), and
  // those blocks rounded up to powers of two when pinned (0 otherwise).
  int64_t host_grad_accumulation = 0;
  int64_t host_grad_accumulation_pinned = 0;
  // Checkpoint offload: the checkpointed blocks' inputs on the host at the
  // end of the forward, and those as pinned blocks (each a power of two).
  int64_t host_checkpoints = 0;
  int64_t host_checkpoints_pinned = 0;
  // Page-locked blocks as allocated (each rounded up to a power of two), and
  // what that rounding adds: the host breakdown's allocator component.
  int64_t host_pinned = 0;
  int64_t host_pinned_rounding = 0;
  int64_t host_init_per_rank = 0;    // model construction peak tensors
  int64_t construction = 0;          // zrun's construction peak, device and host (Plan field)
};

// Tokens per chunk of Liger's fused linear cross-entropy
// (fused_linear_cross_entropy_forward, chunk_mem_const 1): the next power of
// two of tokens / ceil(vocab / hidden), at most `tokens`, so one chunk's
// logits are about tokens x hidden elements. zrun chunks the same way.
int64_t FusedLossChunkTokens(int64_t tokens, int64_t vocab, int64_t hidden);

// Computes StepSizes for many micro-batches and sequence lengths of one
// (model, config, GPU): the inventory, sharding and the activation scaling
// are worked out once in Create; For() is arithmetic only, which is what
// max-batch searches and sweeps run in their inner loop.
class StepSizer {
 public:
  // kInvalidArgument when the combination is impossible (e.g.
  // offload_optimizer at stage 0). Inputs must be resolved and validated.
  static absl::StatusOr<StepSizer> Create(const ModelSpec& model, const RunConfig& config,
                                          const GpuSpec& gpu);

  // The rank whose peak is the largest (the first of equals). Ranks differ
  // only at stages 1/2, where each has its own gradient partition.
  StepSizes For(int64_t micro_batch, int64_t seq_length) const;
  StepSizes ForRank(int64_t micro_batch, int64_t seq_length, int64_t rank) const;

  // The model's ParameterInventory, built once per sizer.
  const std::vector<TensorSpec>& parameters() const { return params_; }

 private:
  // What distinguishes one rank from another (stages 1/2).
  struct RankVariant {
    int64_t grad_partition = 0;
    int grad_partition_from = StepSizes::kAtEpilogue;
    bool grad_partition_at_attention = false;
    bool grad_partition_at_down_proj_hook = false;
    int64_t step_norm_copy = 0;
    int64_t host_grad_accumulation = 0;
    int64_t host_grad_accumulation_pinned = 0;
    bool operator==(const RankVariant& o) const {
      return grad_partition == o.grad_partition && grad_partition_from == o.grad_partition_from &&
             grad_partition_at_attention == o.grad_partition_at_attention &&
             grad_partition_at_down_proj_hook == o.grad_partition_at_down_proj_hook &&
             step_norm_copy == o.step_norm_copy && host_grad_accumulation == o.host_grad_accumulation &&
             host_grad_accumulation_pinned == o.host_grad_accumulation_pinned;
    }
  };
  StepSizer() = default;
  StepSizes Shape(int64_t micro_batch, int64_t seq_length) const;
  void Apply(const RankVariant& variant, StepSizes* sizes) const;
  std::vector<RankVariant> variants_;  // distinct ones
  std::vector<int> rank_variant_;      // rank -> index into variants_
  ModelSpec model_;
  std::vector<TensorSpec> params_;
  StepSizes base_;                   // fields independent of batch and sequence
  int64_t dtype_bytes_ = 2;
  int working_dtype_ = 0;            // DType of activations
  // Saved block activations = per_token * b*s + per_token_sq * b*s*s (eager
  // probabilities) + per_seq_sq * s*s (causal mask), fitted from the
  // inventory; the MLP half is linear in b*s. Blocks 1.. and block 0.
  struct SavedFit {
    int64_t per_token = 0;
    int64_t per_token_sq = 0;
    int64_t per_seq_sq = 0;
    int64_t mlp_per_token = 0;
    int64_t input_per_token = 0;     // IsBlockInputItself
    int64_t mlp_dropout_per_token = 0;  // the MLP's residual-dropout mask
    int64_t Bytes(int64_t b, int64_t seq) const {
      return per_token * b * seq + per_token_sq * b * seq * seq + per_seq_sq * seq * seq;
    }
  };
  SavedFit saved_, saved_block0_;
  bool down_input_saved_ = false;    // BlockBackwardTransientBytes
  SavePolicy saves_;
  int64_t final_norm_per_token_ = 0; // FinalNormSavedActivations: linear in b*s
};

// What DeepSpeed and transformers make autograd keep for this run: under
// zero.Init (stage 3) with memory_efficient_linear every linear keeps its
// input (LinearFunctionForZeroStage3), and LoRA adapters stay fp32 (peft
// makes them fp32; the engine casts only a model zero.Init did not build:
// engine.py, _cast_module_mixed_precision); with activation checkpointing
// the embedding's output requires grad (modeling_utils.py,
// _activation_checkpointing_enable: enable_input_require_grads). `config`
// must be resolved.
SavePolicy SavePolicyFor(const RunConfig& config);

// True where DeepSpeed cannot start: ZeRO-3 under zero.Init in bf16/fp16
// partitions peft's fp32 adapters (SavePolicyFor) with a modules_to_save
// copy in the working dtype, and stage3.py's
// _create_fp16_partitions_with_defragmentation asserts one dtype (DeepSpeed
// 0.19.8). StepSizer::Create refuses it; the stage grid leaves the row out.
bool Stage3MixesPartitionDtypes(const ModelSpec& model, const RunConfig& config);

// Sizes for one rank: StepSizer::Create(...)->For(micro_batch, seq_length).
absl::StatusOr<StepSizes> ComputeStepSizes(const ModelSpec& model, const RunConfig& config,
                                           const GpuSpec& gpu);

// The device breakdown at the step's peak, with peak_event set. Runtime and
// the allocator's cached bytes (allocator_cached) are included in peak_bytes.
MemoryBreakdown ClosedFormDevicePeak(const StepSizes& sizes);

// ClosedFormDevicePeak(sizes).peak_bytes() without building the breakdown.
int64_t ClosedFormPeakBytes(const StepSizes& sizes);

// Model states per rank on the device and host together (params + grads +
// master + optimizer), steady state: the ZeRO paper's quantity.
int64_t ModelStatesBytes(const StepSizes& sizes);

// Host memory of one rank's process in steady state.
MemoryBreakdown HostPerRank(const StepSizes& sizes);

// Adds the runtime and the allocator's cached bytes to a breakdown of tensor bytes and
// sets peak_bytes to the total.
void FinishDeviceBreakdown(const StepSizes& sizes, MemoryBreakdown* breakdown);

// Every byte field of `b` times `factor` (e.g. one rank -> one node).
MemoryBreakdown ScaledBreakdown(const MemoryBreakdown& b, int64_t factor);

// Adds the tensor components of `from` into `to` and recomputes peak_bytes
// as its tensors + runtime + allocator (CPU ranks: device tensors are host RAM).
void AddBreakdown(const MemoryBreakdown& from, MemoryBreakdown* to);

// Sum of the tensor components (everything except runtime and allocator).
int64_t LiveTensorBytes(const MemoryBreakdown& breakdown);

// The tensor components of a breakdown, in proto order, with short names
// ("params", "activations", ...); they sum to LiveTensorBytes.
struct NamedBytes {
  const char* name;
  int64_t bytes;
};
std::vector<NamedBytes> TensorComponents(const MemoryBreakdown& breakdown);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_MEMORY_MODEL_H_
