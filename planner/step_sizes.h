// File: step_sizes.h
// StepSizes: every byte count and order fact one rank's training step needs,
// computed by ComputeStepSizes / StepSizer (memory_model.h), the one place
// sizes come from, and read by the step program (step_program.h), which
// says when each tensor is allocated and freed.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(StepSizes sizes, ComputeStepSizes(model, config, gpu));
//   int64_t bytes = StepPeakBytes(sizes);
#ifndef ZPLAN_PLANNER_STEP_SIZES_H_
#define ZPLAN_PLANNER_STEP_SIZES_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "planner/sharding.h"

namespace zplan {

// cuBLAS handles are per thread (aten/src/ATen/cuda/CublasHandlePool.cpp,
// getCurrentCUDABlasHandle), each with its own workspace, and a CUDA
// backward runs on the autograd engine's device thread
// (torch/csrc/autograd/engine.cpp): the forward's matmuls make one, the
// backward's another. Both seen, 32 MiB each and kept, in every DeepSpeed
// history of the H100 matrix (docs/gpu_traces).
inline constexpr int kCublasWorkspaces = 2;

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
  // Where in block grad_partition_from's backward the partition appears.
  enum class PartitionMoment {
    kBlockStart,    // before its MLP half's widest moment
    // In its MLP half at down_proj's hook, past a GELU MLP's widest moment:
    // down_proj's saved input is freed by then, its weight gradient not yet.
    kDownProjHook,
    // In its MLP half at a hook past the MLP's widest moment (gate's, up's),
    // so before its pre-norm's backward, which runs beside it.
    kMlpPreNorm,
    kAttention,  // in its attention half
    // In its attention half at a hook before q_norm's backward (past SDPA's moment).
    kQkNorm,
  };
  PartitionMoment grad_partition_moment = PartitionMoment::kBlockStart;
  int kBeforeForward() const { return num_layers + 1; }

  // The backward part whose gradient hook fires first, where the IPG
  // buckets appear: kHeadPart the LM head (untied, trainable), num_layers the
  // final norm, a block index (its attention half when ipg_at_attention),
  // -1 the embedding; kNoGradients when nothing trains.
  static constexpr int kNoGradients = -3;
  int ipg_from = kNoGradients;
  bool ipg_at_attention = false;
  int kHeadPart() const { return num_layers + 1; }

  // Per block. What may differ from layer to layer -- block 0, whose input
  // needs no gradient with a frozen embedding (LoRA: it keeps less, inventory.h);
  // a short conv where others attend (block_layout.h, LayerMixesByConv); a
  // sliding layer past the window under SDPA (inventory.h, SdpaSlidingMaskAt:
  // it keeps the additive mask and k and v repeated to every head); stage 3's
  // gathers of blocks of other sizes -- is a BlockKind, one per kind of
  // layer (StepSizer finds the kinds once per model): Block(i).
  // A vision-language model's tower blocks come first (the first
  // tower_layers of num_layers), then the language model's: each kind is of
  // one stack, sized with its rows (memory_model.h).
  struct BlockKind {
    int64_t input = 0;          // the block's input: rows x its hidden width, working dtype
    int64_t saved = 0;          // tensors saved for backward, no checkpointing
    int64_t saved_mlp = 0;      // of which the MLP half's (freed first in backward)
    // Of saved, the block's input itself (IsBlockInputItself): a
    // checkpointed block's recompute saves the input on the device (kept, or
    // brought back from the host) and allocates this no second time.
    int64_t saved_input = 0;
    // Of each half's saved tensors, what the ops after its output save: the
    // residual dropout's mask, a post-norm's input and statistics
    // (block_layout.h, InHalfTail). Their backward runs first in the half,
    // so it is freed before the MLP's or attention's gradients.
    int64_t mlp_tail_saved = 0;
    int64_t attn_tail_saved = 0;
    // Each half's pre-norm's backward (IsPreNormTensor), the half's last:
    // what the norm saved beside transformers' RMSNorm backward temporaries
    // (RmsNormBackwardTransientBytes), once the rest of the half's saved
    // tensors are freed; 0 for LayerNorm (one kernel) or a norm without a backward.
    int64_t mlp_pre_norm_bwd = 0;
    int64_t attn_pre_norm_bwd = 0;
    int64_t fwd_transient = 0;       // extra inside forward with grad
    // A mixture of experts' (kMoe) temporaries at its forward's widest,
    // beside all the block saves: the weighted pairs and their reordered copy.
    int64_t mlp_fwd_transient = 0;
    // A checkpointed block whose backward reaches a saved tensor only past
    // its last ops: torch's non-reentrant checkpoint (transformers') recomputes
    // at that first unpack, with what those ops made alive -- a mixture of
    // experts' output gradient copied to the pairs (ViewBackward's reshape of
    // SumBackward's expand), kept into its backward.
    int64_t recompute_pending_grad = 0;
    // mlp_fwd_transient in that recompute: stopped before the reordered copy.
    int64_t recompute_mlp_fwd_transient = 0;
    // The auxiliary loss (MoeSpec.router_aux_loss): the router's logits
    // [tokens, E], working dtype, kept from the block's forward to the loss;
    // as many bytes (the loss's softmax of them, then its gradient) stay to
    // the block's MoE backward. A checkpointed block keeps them too.
    int64_t aux_router_logits = 0;
    int64_t nograd_peak = 0;         // checkpointed forward: live intermediates
    int64_t bwd_attn_transient = 0;  // the attention (or conv) half's backward temporaries
    // Later in that half, once they are freed and the hooks of o_proj and the
    // k and v paths have run: q_norm's backward (BlockBackwardTransients::qk_norm_bytes; 0: none).
    int64_t bwd_qk_norm_transient = 0;
    int64_t grads_attn = 0;          // that half's trainable parameters, working dtype
    int64_t max_attn_grad = 0;       // its largest single parameter
    int64_t gather = 0;              // stage 3: the gathered block + prefetch
    int64_t gather_kept = 0;         // stage 3: its partitioned parameters, when kept whole
    int64_t gather_held = 0;         // stage 3: its expert banks, held by saved views (Stage3BlockGathers::held)
    // ZeRO-1 with overlap_comm (zero_buckets.h, RankVariant): each half's
    // gradients larger than a bucket and outside the rank's partition,
    // kept from the half's backward to the epilogue.
    int64_t retained_mlp = 0;
    int64_t retained_attn = 0;
    int64_t bwd_mlp_transient = 0;   // the MLP half's backward temporaries
    // Of those, the gradient of the MLP's output that ops after it made, alive
    // at a plain MLP's widest moment (inside down_proj's backward), gone once
    // down_proj's hooks run.
    int64_t mlp_output_grad = 0;
    int64_t grads_mlp = 0;       // the MLP half's trainable parameters, working dtype
    int64_t grads_down = 0;      // of those down_proj's: made beside its input gradient, the half's widest moment
    int64_t max_mlp_grad = 0;    // largest single parameter of the MLP half, past that moment
    // Stages 1/2 (reduced in the hooks): down_proj's weight gradient when it is
    // larger than a reduce bucket. Its hook comes after its bias's (autograd
    // finishes a linear's bias gradient first), and it waits, whole, for the
    // next reduction (stage_1_and_2.py, extra_large_param_to_reduce), through
    // the activation's backward: the half's widest moment.
    int64_t down_weight_grad_waiting = 0;
    // Stage 3 (zero_buckets.h, Stage3ExpertReductions): a mixture of
    // experts' reduction at the router's hook, once the experts' saved
    // tensors are freed: the bank's gradients waiting for it and its copies.
    int64_t mlp_reduce_pending = 0;
    // Where the gradient partition appears at down_proj's hook
    // (PartitionMoment::kDownProjHook): the half's temporaries after it, a
    // GELU MLP's activation backward, a mixture of experts' gate_up_proj
    // gradient beyond the pair tensors its backward has freed.
    int64_t mlp_past_down_hook = 0;
    // transformers' RMSNorm backward at the start of each half's backward,
    // a post-norm's (RmsNormBackwardTransientBytes; 0 for norms before the halves).
    int64_t post_norm_bwd_transient = 0;
    // GraniteMoeShared's shared_mlp, after the experts: its backward runs
    // first in the MLP half, beside all the half saved (what the shared_mlp
    // saved is its tail, freed before the experts' backward).
    int64_t mlp_tail_bwd_transient = 0;
    // Beside bwd_mlp_transient unless the block was recomputed whole
    // (MoeTransients::backward_cast_bytes).
    int64_t mlp_bwd_cast = 0;
    // Its weight gradients (in grads_mlp), output_linear's [h, f_s] made
    // before that moment, input_linear's [2 f_s, h] after it: kept ones
    // (grads_kept_on_production) stay from then on.
    int64_t grads_mlp_tail_out = 0;
    int64_t grads_mlp_tail_in = 0;
    // The eager experts' loop (eager_experts.h) makes the expert banks'
    // gradients as it frees what it saved: bwd_mlp_transient is its widest
    // moment with them, and kept ones (grads_kept_on_production) are counted
    // from the end of the half, once what it saved is freed.
    bool mlp_grads_after_saved = false;
    // A tower block past the one whose output feeds the projector (llava's
    // vision_feature_layer -2): it runs forward, keeps what it saved until
    // the language model's forward ends, and runs no backward.
    bool forward_only = false;
  };
  std::vector<BlockKind> block_kinds;
  std::vector<int> block_kind_of;      // per layer, its index in block_kinds
  const BlockKind& Block(int layer) const { return block_kinds[block_kind_of[layer]]; }
  // The smallest p with block_kind_of[i] == block_kind_of[i + p] for every
  // i >= 1 (block 0 is cut apart when it differs).
  int block_period = 1;
  // Stage 3 (sharding.h, Stage3Retention): gathered parameters DeepSpeed
  // keeps from their forward to their backward -- blocks gather_kept_from
  // onwards whole (Block(i).gather_kept bytes each) and gather_kept_partial
  // bytes of the block before (of its expert banks, gather_held_partial
  // bytes are not kept: held by their views, BlockKind::gather_held); the
  // embedding through the whole step when embed_kept; the LM head from its
  // forward to its backward when head_kept.
  int gather_kept_from = 0;
  int64_t gather_kept_partial = 0;
  int64_t gather_held_partial = 0;
  bool embed_kept = false;
  bool head_kept = false;

  // A vision-language model (llava: vision_language.h). Forward: the
  // token embedding, the tower (its embeddings, then blocks
  // [0, tower_layers)), the projector, the image features scattered into
  // the embeddings, the language model. Backward: the language model, the
  // scatter's, the projector's, the tower's, last the token embedding's
  // (autograd runs the later-made nodes first), whose gradient of its output
  // waits through the tower's.
  int tower_layers = 0;
  // The patch conv's input (the pixels in the working dtype) and
  // pre_layrnorm's input and statistics: to the tower embeddings' backward.
  int64_t tower_embed_saved = 0;
  // post_layernorm's on the CLS token, which keeps the last block's output
  // (its storage): with the forward-only blocks' saved tensors, to the end
  // of the language model's forward.
  int64_t tower_tail_saved = 0;
  // linear_1's input (a copy of the selected features), the activation's
  // and linear_2's inputs: to the projector's backward.
  int64_t projector_saved = 0;
  int64_t image_mask = 0;            // masked_scatter's bool mask [b, s, 1], to its backward
  int64_t image_features_grad = 0;   // masked_scatter's gradient of the image features [tokens, h]
  // The projector's backward at its widest: its input gradients beside
  // one weight gradient.
  int64_t projector_bwd_transient = 0;
  int64_t projector_grads = 0;       // its trainable parameters, working dtype
  // The gradient carried between tower blocks, images x tokens x C: from
  // the feature select's backward (SliceBackward's zeros) to the embeddings'.
  int64_t tower_act_grad = 0;
  int64_t tower_embed_grads = 0;     // patch conv, CLS, positions, pre_layrnorm

  // Model ends.
  int64_t rope_tables = 0;           // RoPE cos/sin tables, to the end of backward
  // No op keeps the tables (Glm4 multiplies by per-layer copies): they go
  // with the forward's locals, or with checkpointing (a checkpointed block's
  // inputs) at block 0's backward, as the eager mask.
  bool rope_tables_unsaved = false;
  // Of rope_tables, with layer types, the pair of the type whose first layer
  // is rope_late_pair_layer (> 0): what keeps it (its multiplies, or with
  // checkpointing that layer's checkpoint) lets go once that layer's
  // backward is done.
  int64_t rope_late_pair = 0;
  int rope_late_pair_layer = -1;
  int64_t step_batch = 0;            // ids + targets (a ViT: pixels + labels), through the step
  int64_t embed_saved = 0;           // the embedding dropout's mask: to the embedding's backward
  bool embed_backward = true;        // the embeddings run a backward (not when frozen)
  // Eager attention's additive causal mask [b,1,s,s] (transformers'
  // eager_mask): from the embedding to the final norm, or with checkpointing
  // (a checkpointed block's input) to block 0's backward.
  int64_t attention_mask = 0;
  int64_t act_grad = 0;              // gradient carried between blocks, b·s·h
  int64_t final_norm_saved = 0;     // what the norm itself keeps for its backward
  int64_t head_input_saved = 0;     // its output, kept by the LM head (classifier) to the end of that backward
  int64_t final_norm_grads = 0;
  // transformers' RMSNorm backward: its fp32 temporaries at their widest,
  // net of the normalized input freed by then (RmsNormBackwardTransientBytes):
  // the final norm's (0: LayerNorm).
  int64_t final_norm_bwd_transient = 0;
  int64_t head_grad = 0;             // V·h (the tied embedding's, or lm_head's)
  int64_t retained_head = 0;         // of that, kept to the epilogue (BlockKind::retained_mlp)
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
  // GraniteForCausalLM's logits / logits_scaling: a second logits tensor in
  // the forward (the first dies), and in the backward a second logits
  // gradient (the first dies); nothing saved.
  bool logits_scaled = false;
  // Gemma's final_logit_softcapping, cap x tanh(logits / cap): in the forward
  // the division and the product are new logits (each predecessor dies) and
  // tanh's output is kept until its backward; in the backward the gradient
  // goes through three new tensors the same way.
  bool logits_softcapped = false;
  // The auxiliary loss (transformers' load_balancing_loss_func, after the
  // cross-entropy; BlockKind::aux_router_logits): a loop over the MoE
  // layers, each a softmax of its logits kept for backward
  // (aux_loss_softmaxes, all of them at the loop's end, the logits then
  // freed), top-k's values and indices kept to the next layer's
  // (aux_loss_top_k) and, in a 16-bit model, an fp32 copy of the softmax
  // summed over tokens (aux_loss_float_copy). Its backward runs first: per
  // layer the softmax's gradient (a cast of the fp32 sum's gradient before
  // it in a 16-bit model: aux_loss_backward_transient beside it) replaces
  // its saved output.
  int64_t aux_loss_softmaxes = 0;
  int64_t aux_loss_top_k = 0;
  int64_t aux_loss_float_copy = 0;
  int64_t aux_loss_backward_transient = 0;
  int64_t loss_labels = 0;           // padded + shifted int64 labels, the non-ignored mask
  int64_t loss_rows = 0;             // loss_1d: fp32 [b·s]
  int64_t loss_chunk = 0;            // [chunk, V] logits, working dtype
  int64_t loss_chunk_temps = 0;      // beside them, at the widest moment of a chunk

  // After backward and in the step.
  int64_t reduce_temp = 0;           // stage 0 reduce bucket
  int64_t step_upcast = 0;           // fp32 gradients: a stage-3 sub-group, stage 0's flat copy
  // Stage 0 in mixed precision (DeepSpeed's FP16_Optimizer.step,
  // runtime/fp16/fused_optimizer.py): every gradient upcast to fp32, all
  // alive while _flatten_dense_tensors makes step_upcast of them; then the
  // gradients are set to None before the optimizer steps. With
  // step_per_parameter (FP16_UnfusedOptimizer.step) they are the masters'
  // fp32 gradients instead, alive with the working-dtype ones through the
  // step.
  int64_t step_grad_copies = 0;
  // Stage 0 outside FP16_Optimizer (fp32, or a torch optimizer in mixed
  // precision): the optimizer steps each parameter, with
  // step_optimizer_temps for the widest one.
  bool step_per_parameter = false;
  // The norm's copy of one gradient: at stages 1/2 (stage_1_and_2.py, step)
  // each gradient piece of the partition in fp64 (get_grad_norm_direct), the
  // partition then flattened in the working dtype and upcast to fp32; at
  // stage 0 with step_per_parameter in mixed precision each gradient in
  // fp32 (utils.py, get_weight_norm).
  int64_t step_norm_copy = 0;
  int64_t step_flat_grads = 0;       // the working-dtype flat copy (mixed precision)
  // Stages 1/2 with optimizer offload, at the accumulation boundary: each
  // parameter's piece of the partition copied to fp64 for its norm as its
  // bucket is reduced (stage_1_and_2.py, copy_grads_in_partition ->
  // set_norm_for_param_grad_in_gpu), one at a time: the highest, at the
  // reduction that carries it (per rank: zero_buckets.h, RankVariant).
  struct OffloadNormCopy {
    int64_t bytes = 0;
    int at = kAtEpilogue;       // the part, as grad_partition_from (kAtEpilogue: the epilogue's)
    bool at_attention = false;  // in that block's attention half
    bool at_widest = false;     // at the half's widest moment, else after it
    int64_t gone_bytes = 0;     // in the epilogue: the kept gradients gone by then
    bool operator==(const OffloadNormCopy& o) const {
      return bytes == o.bytes && at == o.at && at_attention == o.at_attention && at_widest == o.at_widest &&
             gone_bytes == o.gone_bytes;
    }
  };
  OffloadNormCopy offload_norm_copy;
  int64_t step_fp32_grads = 0;
  // What the Adam implementation allocates beside the stepped fp32 tensor
  // (the flat partition, one stage-3 sub-group, or stage 0's parameters).
  int64_t step_optimizer_temps = 0;

  // CUDA ranks: the catalog's size of one cuBLAS(Lt) workspace, allocated
  // through the caching allocator at a handle's first matmul and kept; there
  // are kCublasWorkspaces of them.
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

}  // namespace zplan

#endif  // ZPLAN_PLANNER_STEP_SIZES_H_
