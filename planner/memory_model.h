// File: memory_model.h
// The memory model's sizes: every byte count one rank's training step needs
// (StepSizes), for a resolved (ModelSpec, RunConfig, GpuSpec), and the host
// memory and model states that follow from them.
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
// StepSizer::Create works out what every part needs once and sizes the ZeRO
// concerns through one file each, named as the executor's files that
// allocate them (docs/zero_concerns.md): zero_partitioning.h (model states,
// construction), zero_buckets.h (reduce buckets, gradient partitions),
// zero_gather.h (stage-3 gathers and prefetch), zero_offload.h (host states,
// staging, pinned buffers), zero_optimizer_step.h (the step's temporaries);
// what DeepSpeed fails on is refused first (zero_refusals.h).
//
// ComputeStepSizes is the one place sizes come from. When each tensor is
// allocated and freed is the step program's (step_program.h), which turns
// StepSizes into one rank's ordered allocations and frees; its evaluators
// give the device peak (StepPeak) and every event (simulator.h).
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(StepSizes sizes, ComputeStepSizes(model, config, gpu));
//   MemoryBreakdown device = StepPeak(sizes);  // step_program.h
#ifndef ZPLAN_PLANNER_MEMORY_MODEL_H_
#define ZPLAN_PLANNER_MEMORY_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/inventory.h"
#include "planner/sharding.h"
#include "planner/step_program.h"  // StepPeak, LiveTensorBytes, FinishDeviceBreakdown for memory_model.h users
#include "planner/step_sizes.h"
#include "planner/zero_buckets.h"        // RankVariant
#include "planner/zero_partitioning.h"   // kMasterBytesPerParam, ... for memory_model.h users
#include "planner/zero_refusals.h"       // Stage3MixesPartitionDtypes for memory_model.h users
#include "proto/gpu.pb.h"
#include "proto/memory.pb.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// kMasterBytesPerParam, kAdamStateBytesPerParam, kOffloadGradBytesPerParam:
// zero_partitioning.h.
inline constexpr int64_t kTokenIdBytes = 8;  // int64 ids and targets

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
  // What distinguishes one rank from another: RankVariant (zero_buckets.h).
  StepSizer() = default;
  StepSizes Shape(int64_t micro_batch, int64_t seq_length) const;
  void Apply(const RankVariant& variant, StepSizes* sizes) const;
  std::vector<RankVariant> variants_;  // distinct ones
  std::vector<int> rank_variant_;      // rank -> index into variants_
  ModelSpec model_;
  ExpertRouting routing_;            // RunConfig.routing
  std::vector<TensorSpec> params_;
  StepSizes base_;                   // fields independent of batch and sequence
  int64_t dtype_bytes_ = 2;
  int working_dtype_ = 0;            // DType of activations
  // Saved block activations = per_token * b*s + per_token_sq * b*s*s (eager
  // probabilities) + per_seq_sq * s*s (a causal mask) + per_seq * s (tables
  // without a batch) + per_batch * b (a conv's padding), fitted from the
  // inventory; the MLP half is linear in b*s.
  struct SavedFit {
    int64_t per_token = 0;
    int64_t per_token_sq = 0;
    int64_t per_seq_sq = 0;
    int64_t per_seq = 0;             // Glm4's per-layer RoPE tables [s, rotary_dim]
    int64_t per_batch = 0;           // a short conv's padded output: kernel - 1 more tokens per sequence
    int64_t constant = 0;            // a mixture of experts' counts per expert
    int64_t mlp_per_token = 0;
    int64_t input_per_token = 0;     // IsBlockInputItself
    int64_t mlp_tail_per_token = 0;   // of that, what the ops after the MLP save (InHalfTail)
    int64_t attn_tail_per_token = 0;  // what the ops after o_proj save
    int64_t mlp_pre_norm_per_token = 0;   // what each half's pre-norm saves (IsPreNormTensor)
    int64_t attn_pre_norm_per_token = 0;
    // The gated delta rule's tensors padded to whole chunks (kDeltaRuleChunks).
    int64_t per_batch_chunk = 0;
    int64_t chunk_constant = 0;
    int64_t one_chunk_per_batch = 0;  // besides, with a single chunk
    int64_t Bytes(int64_t b, int64_t seq) const {
      const int64_t chunks = DeltaRuleChunks(seq);
      return per_token * b * seq + per_token_sq * b * seq * seq + per_seq_sq * seq * seq + per_seq * seq +
             per_batch * b + constant + per_batch_chunk * b * chunks + chunk_constant +
             (chunks == 1 ? one_chunk_per_batch * b : 0);
    }
  };
  // What a layer's kind does not owe to the shape: its fits (fits_), under
  // SDPA's sliding mask too when it slides, its mixer, its parameters. The
  // distinct ones, one per StepSizes::block_kinds entry (base_.block_kind_of
  // maps the layers to them): Shape sizes each once.
  struct LayerStatics {
    int fit = 0;
    int masked_fit = -1;  // -1: never masked
    bool conv = false;        // LayerMixesByConv
    bool delta_rule = false;  // LayerMixesByDeltaRule
    bool moe = false;         // LayerIsMoe
    bool leaf_gradients = false;  // ZeRO-3 reduces the MoE block's gradients after its backward
    bool recompute_stops_in_experts = false;  // RecomputeStopsInExperts
    bool eager_experts = false;   // MoeSpec.experts_impl EXPERTS_EAGER
    int routing_layer = -1;       // its measured routing's layer (RunConfig.routing), -1 balanced or worst
    bool recomputed = false;      // eager experts in a checkpointed block (EagerExpertsShape::recomputed)
    int64_t head_dim = 0;     // HeadDimOf
    int64_t grads_attn = 0, max_attn_grad = 0, gather = 0, gather_kept = 0, gather_held = 0;
    // The MLP half's gradients (elements): all, down_proj's, the largest
    // one, down_proj's weight.
    int64_t mlp_elements = 0, down_elements = 0, largest_mlp = 0, down_weight_elements = 0;
    int64_t down_weight_grad_waiting = 0;  // BlockKind's
    Stage3ExpertReductions reductions;     // max_mlp_grad's and BlockKind::mlp_reduce_pending
    bool tower = false;         // a vision tower's block (TowerSpec, images x tokens rows)
    bool forward_only = false;  // StepSizes::BlockKind::forward_only
    bool operator==(const LayerStatics& o) const {
      return fit == o.fit && masked_fit == o.masked_fit && conv == o.conv && delta_rule == o.delta_rule &&
             moe == o.moe && leaf_gradients == o.leaf_gradients &&
             recompute_stops_in_experts == o.recompute_stops_in_experts && eager_experts == o.eager_experts &&
             routing_layer == o.routing_layer && recomputed == o.recomputed && head_dim == o.head_dim &&
             grads_attn == o.grads_attn && max_attn_grad == o.max_attn_grad &&
             gather == o.gather && gather_kept == o.gather_kept && gather_held == o.gather_held &&
             mlp_elements == o.mlp_elements &&
             down_elements == o.down_elements && largest_mlp == o.largest_mlp &&
             down_weight_elements == o.down_weight_elements && reductions == o.reductions && tower == o.tower && forward_only == o.forward_only;
    }
  };
  // A vision-language model's tower (TowerSpec): its blocks run on
  // micro_batch x images_per_sample images of tower_tokens_ tokens.
  ModelSpec tower_;
  int64_t images_per_sample_ = 0;
  int64_t image_size_ = 0;         // RunConfig.image_size
  int64_t tower_tokens_ = 0;
  bool tower_without_graph_ = false;  // frozen, no checkpointing: its blocks keep nothing, run no backward
  bool tower_down_input_saved_ = false;
  std::vector<SavedFit> fits_;
  std::vector<LayerStatics> kinds_;
  bool down_input_saved_ = false;    // BlockBackwardTransientBytes
  SavePolicy saves_;
  int64_t final_norm_per_token_ = 0; // FinalNormSavedActivations but its output: linear in b*s
  int64_t head_input_per_token_ = 0;  // its output, which the LM head keeps
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

// Stage3MixesPartitionDtypes and every other refusal: zero_refusals.h.

// Sizes for one rank: StepSizer::Create(...)->For(micro_batch, seq_length).
absl::StatusOr<StepSizes> ComputeStepSizes(const ModelSpec& model, const RunConfig& config,
                                           const GpuSpec& gpu);

// Model states per rank on the device and host together (params + grads +
// master + optimizer), steady state: the ZeRO paper's quantity.
int64_t ModelStatesBytes(const StepSizes& sizes);

// Host memory of one rank's process in steady state.
MemoryBreakdown HostPerRank(const StepSizes& sizes);


// Every byte field of `b` times `factor` (e.g. one rank -> one node).
MemoryBreakdown ScaledBreakdown(const MemoryBreakdown& b, int64_t factor);

// Adds the tensor components of `from` into `to` and recomputes peak_bytes
// as its tensors + runtime + allocator (CPU ranks: device tensors are host RAM).
void AddBreakdown(const MemoryBreakdown& from, MemoryBreakdown* to);


// The tensor components of a breakdown, in proto order, with short names
// ("params", "activations", ...); they sum to LiveTensorBytes.
struct NamedBytes {
  const char* name;
  int64_t bytes;
};
std::vector<NamedBytes> TensorComponents(const MemoryBreakdown& breakdown);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_MEMORY_MODEL_H_
