// File: zero_engine.h
// ZeRO data parallelism with DeepSpeed's semantics, over a Transformer and a
// Collectives (DESIGN §4). It owns the parameter layout, gradient reduction
// and the optimizer, and allocates exactly what the planner's memory model
// (planner/memory_model.h) accounts for:
//   stage 0  parameters in one flat padded buffer; gradients per parameter,
//            all-reduced after backward through one reduce_bucket_size bucket;
//            fp32 master and Adam states for every element.
//   stage 1  as stage 0, but master and Adam states only for this rank's
//            shard of the flat buffer (sharding.h's padding rule); gradients
//            accumulate as .grad until the accumulation boundary, whose
//            backward reduces them as stage 2 does with overlap_comm, or
//            (its default) after which they go through the IPG bucket in
//            parameter order; updated shards are all-gathered back into the
//            flat parameters.
//   stage 2  as stage 1, but gradients leave every backward as they are
//            produced: each is copied into an IPG bucket, its .grad freed,
//            and full buckets are reduced into the partition, made at the
//            first reduction. The buckets (two with overlap_comm) exist from a
//            backward's first gradient to its end. The step (stages 1/2)
//            takes fp64 copies of each gradient piece for the norm, flattens
//            the partition and upcasts it to fp32, releases the partition
//            and steps the whole shard (DeepSpeed stage_1_and_2.py).
//   offload_optimizer=cpu  master, Adam states and an fp32 gradient shard live
//            on the host; Adam (at::_fused_adamw_) runs on the CPU and the
//            updated shard is copied back.
//   stage 3  as stage 2 (its buckets made once, in Create), and each parameter is partitioned on its own
//            (ceil(numel / N) elements per rank, sharding.h) except those of
//            at most stage3_param_persistence_threshold elements, which stay
//            whole; a part (embedding, block, head) is all-gathered before its
//            forward and backward and released after, with the next block
//            prefetched when it fits stage3_prefetch_bucket_size and
//            stage3_max_live_parameters. offload_param=cpu keeps the
//            partitions on the host. Over a model built without values
//            (Transformer::Create's `materialize`), each parameter is
//            created whole, on the host in fp32, only while its chunk is
//            taken (zero.Init), so no rank ever holds the whole model.
//            Frozen parameters (LoRA's base model) are partitioned and
//            gathered with the rest, from a buffer of their own, and have no
//            gradient or optimizer state; the trainable ones (LoRA's fp32
//            adapters) reduce through buckets and a gradient partition in the
//            working dtype, DeepSpeed's communication and accumulation dtype.
// Mixed precision keeps working-dtype parameters and gradients and fp32
// master weights; fp16 adds dynamic loss scaling; fp32 updates the
// parameters directly. Gradients are averaged over ranks and accumulation
// steps. Stage 3 upcasts gradients one sub_group_size chunk at a time; stage
// 0 flattens them all (FlattenGradsFp32, DeepSpeed's FusedAdam in mixed
// precision) or steps each parameter (StepEachParameter: fp32, or a torch
// Adam in mixed precision).
// Adam is the configured implementation's (fused, or torch's for-loop /
// foreach with their temporaries).
//
// One class, its members in one file per ZeRO concern, each named as the
// planner file that sizes it (docs/zero_concerns.md): zero_partitioning.cc
// (ownership, parameters in place, model states), zero_buckets.cc (gradient
// hooks, IPG buckets, reduction, gradient partitions), zero_gather.cc (the
// stage-3 gather coordinator and prefetch), zero_offload.cc (host buffers,
// staging, offloaded gradients), zero_optimizer_step.cc (norm, loss scale,
// Adam); zero_engine.cc builds the engine and saves and loads checkpoints.
// What DeepSpeed refuses is refused first (planner/zero_refusals.h).
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(auto engine, ZeroEngine::Create(&model, comm.get(), config));
//   for (micro...) { (loss * engine->loss_scale()).backward(); ZPLAN_RETURN_IF_ERROR(engine->AfterBackward()); }
//   ZPLAN_ASSIGN_OR_RETURN(StepResult r, engine->Step(lr));
#ifndef ZPLAN_EXECUTOR_ZERO_ENGINE_H_
#define ZPLAN_EXECUTOR_ZERO_ENGINE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/collectives.h"
#include "executor/counting_allocator.h"
#include "executor/transformer.h"
#include "planner/sharding.h"
#include "proto/checkpoint.pb.h"
#include "proto/run_config.pb.h"

namespace torch::autograd {
struct Node;
}

namespace zplan {

struct StepResult {
  double grad_norm = 0;      // global L2 norm before clipping (unscaled)
  bool skipped = false;      // fp16 overflow: no update, loss scale lowered
};

class ZeroEngine {
 public:
  // `config` must be resolved (ResolveRunConfig). kInvalidArgument for
  // impossible combinations.
  static absl::StatusOr<std::unique_ptr<ZeroEngine>> Create(Transformer* model, Collectives* comm,
                                                            const RunConfig& config);
  ~ZeroEngine();

  // Multiply the loss by this before backward (fp16 loss scale / accumulation).
  double loss_scale() const;

  // After each micro-step's backward: stage 2 flushes its last bucket; on the
  // last micro-step of the window stages 0/1 reduce their gradients.
  absl::Status AfterBackward(bool last_micro_step);

  // Clip, update, and make every rank's parameters current again.
  absl::StatusOr<StepResult> Step(double learning_rate);

  // This rank's optimizer state and working weights (copied to the host),
  // with the parameter slices they cover; step/losses are the caller's.
  CheckpointShard SaveState() const;
  // Restores SaveState()'s output; kFailedPrecondition when it was written
  // for another world size, stage, model or precision.
  absl::Status LoadState(const CheckpointShard& shard);

  // The device's peak tensor bytes from the start of the process until the
  // parameters were in place, before the optimizer's state (the model's
  // construction; peak allocated on CUDA, counted tensors on CPU ranks).
  int64_t construction_peak_bytes() const { return construction_peak_bytes_; }

  // Stage-3 gather/release callbacks for Transformer::Loss (inactive below stage 3).
  const BlockHooks& hooks() const { return hooks_; }

  // Gradient hooks of stages 1-3 (public for the hook object; not part of the API).
  void OnGradReady(size_t slot);

 private:
  struct Slot {
    std::string name;
    at::Tensor param;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t flat_offset = 0;  // stages 0-2: into the flat parameter buffer
    // The parameter-local elements [own_lo, own_hi) this rank owns, stored at
    // own_dst in the owned buffers (master, Adam states, gradient shard).
    int64_t own_lo = 0, own_hi = 0, own_dst = 0;
    // Stage 3.
    bool frozen = false;      // no gradient: its chunk is in frozen_shards_
    int64_t shard_numel = 0;  // ceil(numel / world)
    bool persistent = false;  // kept whole on every rank
    bool gathered = false;
    // The block of the DeepSpeed leaf module it is in (inventory.h,
    // DeepSpeedLeafBlockOf): its gradient waits for the leaf's others; -1: none.
    int leaf = -1;
    // Stage 2 with offload and accumulation: the whole gradient in the
    // working dtype on the host, made at its first reduction
    // (stage_1_and_2.py, async_accumulate_grad_in_cpu_via_gpu: accumulated_grads_in_cpu).
    at::Tensor host_accumulated;
  };
  struct Segment {            // a gradient's place in a bucket
    size_t slot;
    int64_t bucket_offset;    // stage 3: -1 where it stays its own .grad
  };

  ZeroEngine() = default;
  // Create's steps, in this order (each in its concern's file).
  // Who owns what: own_lo/own_hi/own_dst of every slot, owned_begin_,
  // owned_numel_; stage 3 adds the frozen chunks' elements to *frozen_numel.
  void AssignOwnership(int64_t total, int world, int rank, int64_t* frozen_numel);
  // The AccumulateGrad post-hooks (GradReadyHook, or GradKeptHook at stage 0).
  void RegisterGradHooks();
  // The flat parameter buffer (stages 0-2), or the stage-3 chunks with the
  // parts, the retention and everything released; allocates under the
  // caller's memory tag.
  void PlaceParameters(int64_t total, int world, const at::TensorOptions& options, bool pin, int64_t frozen_numel,
                       int num_layers);
  // Master weights and Adam states (and the offloaded fp32 gradients), each
  // under its component, set through `tag`.
  void AllocateModelStates(std::optional<ScopedMemoryTag>& tag, bool pin);
  // Stages 1/2 with optimizer offload: DeepSpeed's staging buffers.
  void AllocateOffloadBuffers(std::optional<ScopedMemoryTag>& tag, bool pin, const at::TensorOptions& options);
  // Stage 3: hooks_ (gather with prefetch before a part, release after).
  void InstallGatherHooks(int num_layers);
  // A zeroed host buffer; `pinned`: allocated page-locked (one CachingHostAllocator
  // block, rounded up to a power of two), not a pinned copy of a pageable one.
  static at::Tensor HostZeros(int64_t numel, at::ScalarType dtype, bool pinned);
  // Stages 1/2: the IPG buckets, made at a backward's first gradient and
  // released after it (stage 3 keeps them from Create).
  void AllocateBuckets();
  void EnsureGradPartition();
  // Copies a gradient into the current bucket (reducing the bucket first
  // when it would overflow) and drops the parameter's .grad.
  void ReduceThroughBucket(size_t slot);
  absl::Status ReduceBucket(at::Tensor& bucket, const std::vector<Segment>& segments, int64_t fill);
  absl::Status FlushBucket();
  // Stage 3: the bucket's gradients reduce-scattered together (see the .cc).
  absl::Status ReduceScatterBucket();
  // Adds this rank's part of a reduced gradient of `slot` to the owned
  // gradient buffer: at stages 1/2 the summed full gradient (averaged here,
  // consumed), at stage 3 this rank's piece, already averaged.
  void AccumulateOwned(Slot& slot, const at::Tensor& grad);
  // With optimizer offload: an averaged gradient of `slot` (as AccumulateOwned
  // takes it) into the host gradients, by non_blocking copies on the current
  // stream (see the .cc).
  void OffloadGrad(Slot& slot, const at::Tensor& grad);
  // AfterBackward before the micro-step count moves on.
  absl::Status FinishBackward(bool last_micro_step);
  absl::Status Gather(int part);
  absl::Status GatherSlot(size_t index);
  // Stage 3: the buffer holding the slot's chunk.
  const at::Tensor& ShardsOf(const Slot& slot) const { return slot.frozen ? frozen_shards_ : flat_shards_; }
  enum ReleasePoint { kAfterForward, kAfterBackward, kReleaseAll };
  void Release(int part, ReleasePoint point);
  absl::Status GatherWithPrefetch(int part, int next);
  absl::Status RefreshPersistent();
  // Sum of squares of this rank's owned gradient elements, [1] fp32, from
  // the gradients reduced in backward (stages 1-3: grad_shard_ / host_grads_).
  at::Tensor OwnedGradSquaredNorm();
  // One AdamW update of fp32 `weights` by the configured implementation,
  // with the gradient multiplied by `grad_multiplier` (unscaling, clipping).
  // Returns torch's `denom` (undefined for the fused kernels), which a
  // caller stepping a list of tensors keeps as torch does.
  at::Tensor AdamWUpdate(at::Tensor weights, at::Tensor grad, at::Tensor exp_avg, at::Tensor exp_avg_sq, double lr,
                         double grad_multiplier);
  // Stages 1/2 without offload: the step works on the device gradient
  // partition (fp64 norm pieces, flatten and fp32 upcast, one Adam call).
  bool StepsGradPartition() const { return (stage_ == 1 || stage_ == 2) && !offload_; }
  // The fp32 gradient of owned elements [begin, end) (stages 1-3: a
  // temporary, or a view of host_grads_).
  at::Tensor OwnedGradFp32(int64_t begin, int64_t end);
  // Stage 0 in mixed precision (DeepSpeed's FP16_Optimizer.step,
  // runtime/fp16/fused_optimizer.py): every gradient upcast to fp32 (all
  // alive), flattened into one tensor, then the gradients set to None.
  at::Tensor FlattenGradsFp32();
  // Stage 0 stepping each parameter (StepsEachParameter,
  // planner/zero_optimizer_step.h): the squared norm, read one gradient at
  // a time (an fp32 copy in mixed precision: utils.py, get_weight_norm),
  // then each slot's fp32 gradient in *grads (mixed precision: a copy for
  // its master, all alive beside the working-dtype ones; fp32: the
  // gradient itself, undefined where there is none).
  at::Tensor EachParameterGradsFp32(std::vector<at::Tensor>* grads);
  // Adam over the slots one tensor at a time, then each fp32 gradient
  // dropped as its master is copied back (FP16_UnfusedOptimizer.step).
  void StepEachParameter(std::vector<at::Tensor>& grads, double lr, double grad_multiplier);

  Transformer* model_ = nullptr;
  Collectives* comm_ = nullptr;
  RunConfig config_;
  int stage_ = 0;
  bool mixed_ = true;
  bool fp16_ = false;
  bool offload_ = false;
  bool pin_memory_ = false;     // offloaded host buffers are page-locked
  at::Device device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;  // the trainable parameters'
  // Gradient buckets and partitions: the working dtype (DeepSpeed's
  // communication_data_type and gradient_accumulation_dtype).
  at::ScalarType grad_dtype_ = at::kFloat;
  // Trainable parameters (stage 3: every parameter, in inventory order).
  std::vector<Slot> slots_;
  at::Tensor flat_params_;      // stages 0-2: [padded] working dtype; parameters are views
  at::Tensor flat_shards_;      // stage 3: [owned] trainable chunks (host with offload_param)
  at::Tensor frozen_shards_;    // stage 3: the frozen parameters' chunks, in their dtype
  std::vector<std::vector<size_t>> parts_;  // stage 3: slots of part p at index p + 1
  bool tied_head_ = false;      // stage 3: the head's part holds the embedding
  bool unpartitioned_ = false;  // stage 3 on one rank: parameters are views of flat_shards_
  Stage3Retention retention_;
  BlockHooks hooks_;
  int64_t owned_begin_ = 0, owned_numel_ = 0;
  at::Tensor master_, exp_avg_, exp_avg_sq_, step_count_;  // fp32 [owned]
  // Stages 1-3: this rank's reduced gradients, working dtype [owned] (at
  // stages 1/2 a view of the partition of partition_numel_ elements, made at
  // the first reduction and released in Step).
  at::Tensor grad_shard_;
  int64_t partition_numel_ = 0;
  at::Tensor host_grads_;       // offload: fp32 [owned] on host
  // Stages 1/2 with offload: the squared norms of the owned pieces, each
  // from its fp64 copy on the device as its bucket is reduced
  // (stage_1_and_2.py, set_norm_for_param_grad_in_gpu), fp64 [1].
  at::Tensor offload_norm_sq_;
  // Stages 1/2 with offload, as DeepSpeed: the updated partition goes back
  // through a working-dtype host copy; accumulated gradients come back to
  // the device through a staging buffer the size of the largest parameter.
  // DeepSpeed also allocates a host one (temp_grad_buffer_for_cpu_offload)
  // that it no longer reads.
  at::Tensor offload_bit16_, offload_grad_device_, offload_grad_host_;
  std::vector<at::Tensor> buckets_;  // IPG reduce buckets
  size_t current_bucket_ = 0;
  int64_t bucket_fill_ = 0;
  int64_t oversized_ = -1;      // stages 1/2: a slot larger than a bucket, reduced next
  // ZeRO-1 with overlap_comm: reduced gradients larger than a bucket, of
  // parameters outside this rank's partition, kept to the epilogue
  // (stage_1_and_2.py, reduce_ipg_grads clears them only at ZeRO-2).
  std::vector<at::Tensor> retained_grads_;
  std::vector<Segment> segments_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  // Stage 3's leaf modules: each leaf's gradients produced so far, reduced
  // once all have come (stage3.py, create_reduce_and_remove_grad_hooks: one
  // module backward hook per leaf, its parameters in module order).
  std::map<int, std::vector<size_t>> leaf_ready_;
  std::map<int, size_t> leaf_size_;
  absl::Status hook_status_;
  int micro_step_ = 0;           // micro-steps finished since the last Step
  double loss_scale_ = 1.0;
  int good_steps_ = 0;
  int64_t construction_peak_bytes_ = 0;
};

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_ZERO_ENGINE_H_
