// File: sharding.h
// How ZeRO splits parameters, gradients and optimizer states across the N
// ranks of the data-parallel group, with the padding made explicit.
//
// Stages 1 and 2 (DeepSpeed stage_1_and_2.py): all parameters of a group are
// flattened into one buffer, padded to a multiple of
// kFlatAlignmentElements * N (DeepSpeed's nccl_start_alignment_factor = 2, so
// every rank's partition starts 4-byte aligned for 16-bit dtypes), and rank r
// owns elements [r * shard, (r + 1) * shard). Every rank's shard has the same
// size; the last one carries the padding.
//
// Stage 3 (stage3.py): each parameter is partitioned on its own into
// ceil(numel / N) elements per rank (padded), except parameters with at most
// stage3_param_persistence_threshold elements, which every rank keeps whole.
// Gradients of every parameter are partitioned.
//
// Example:
//   ShardLayout layout = ComputeShardLayout(ParameterInventory(spec), 8, 100000);
//   layout.flat_shard_elements * 8 >= layout.total_elements;
#ifndef ZPLAN_PLANNER_SHARDING_H_
#define ZPLAN_PLANNER_SHARDING_H_

#include <cstdint>
#include <vector>

#include "planner/model_family.h"
#include "proto/inventory.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

inline constexpr int64_t kFlatAlignmentElements = 2;

// Frozen parameters (TensorSpec.frozen) have no gradient and no optimizer
// state: the flat buffer and the gradient partitions hold the trainable ones
// only (DeepSpeed's optimizers see only the param groups they are given),
// while stage 3 partitions and gathers every parameter.
struct ShardLayout {
  int64_t world_size = 1;
  int64_t total_elements = 0;             // all parameters
  int64_t trainable_elements = 0;         // those not frozen
  int64_t flat_padded_elements = 0;       // stage 1/2 flat buffer of the trainable ones, incl. padding
  int64_t flat_shard_elements = 0;        // stage 1/2 elements per rank
  int64_t stage3_shard_elements = 0;      // stage 3 partitioned params, per rank
  int64_t stage3_persistent_elements = 0; // stage 3 params kept whole on every rank
  int64_t stage3_chunk_elements = 0;      // stage 3: every parameter's chunk, per rank
  int64_t stage3_grad_shard_elements = 0; // stage 3 gradient partition (trainable chunks), per rank
  // Of the stage-3 chunks and persistent parameters, the LoRA adapters'
  // (zero.Init makes them fp32: SavePolicy.adapter_dtype).
  int64_t stage3_adapter_chunk_elements = 0;
  int64_t stage3_adapter_persistent_elements = 0;
};

// Elements per rank of a flat buffer of `elements` split over `world` ranks.
int64_t FlatShardElements(int64_t elements, int64_t world);

// Elements per rank of one stage-3 parameter.
inline int64_t Stage3ShardElements(int64_t numel, int64_t world) {
  return (numel + world - 1) / world;
}

// Whether DeepSpeed keeps fp32 master weights apart from the working
// parameters: always in mixed precision and with optimizer offload (on the
// host); in fp32 training the ZeRO-1/2 optimizer still clones its partition
// (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__:
// weights_partition = ...detach().clone()) and so does ZeRO-3
// (stage3.py, _create_fp32_partitions: converted.clone(); seen as a second
// fp32 partition in the oracle's allocation log); ZeRO-0 steps its
// parameters.
inline bool KeepsFp32Master(int stage, bool mixed_precision, bool offload_optimizer) {
  return mixed_precision || offload_optimizer || stage >= 1;
}

// Stage 3: whether each module's parameters are gathered onto the device
// for it and released after. On one rank DeepSpeed's NoGatherHandle
// (partition_parameters.py) sets param.data = ds_tensor.to(device): a copy
// only where offload_param keeps ds_tensor in host memory apart from the
// device (on an H100: 1.1 GiB of Qwen3-0.6B's blocks held at the peak), not
// without offload nor on CPU ranks, where the two are one memory.
inline bool GathersParameters(int stage, int64_t world, bool offload_param, bool cpu_ranks) {
  return stage == 3 && (world > 1 || (offload_param && !cpu_ranks));
}

// Stage 1/2, per rank: the gradient partition DeepSpeed allocates holds
// every parameter that touches the rank's shard whole (stage_1_and_2.py,
// copy_grads_in_partition: sum of param.numel() over params_in_partition),
// and get_grad_norm_direct copies each parameter's piece of it to fp64.
// `parameters` are the trainable ones (TrainableParameters).
struct FlatPartition {
  int64_t params_elements = 0;     // the parameters touching the shard, whole
  int64_t max_piece_elements = 0;  // the largest piece of one parameter inside it
  int first_param = -1;            // index range of those parameters
  int last_param = -1;
};
std::vector<FlatPartition> FlatPartitionsByRank(const std::vector<TensorSpec>& parameters, int64_t world);

// Stage 3: which gathered parameters DeepSpeed keeps from their forward to
// their backward instead of releasing them after their module's forward
// (runtime/zero/partitioned_param_coordinator.py). Once the module trace is
// recorded, release_sub_module keeps a parameter (__params_to_release) when
// its module is used again within stage3_max_reuse_distance elements of the
// trace (the later modules' forward, then the backward in reverse), or when
// a prefetch (fetch_sub_module) has already consumed its next use from the
// fetch queue: the prefetcher pops queue entries until it has gathered
// stage3_prefetch_bucket_size elements, and entries of parameters already
// gathered are popped for free, so near the end of the forward it runs into
// the backward's entries and marks what is still gathered. The trace holds
// every module called, those without parameters too (the model, each layer
// and its containers, and the model's ParameterlessModulesOf: each fetch
// pops the queue further), its backward part a container before its
// children (which run in reverse); a DeepSpeed leaf module (an MoE block,
// DeepSpeedLeafBlockOf) is one module of all its parameters, its children
// unhooked (parameter_offload.py, _register_deepspeed_module), and the reuse
// scan reads later modules as iter_params(module, recurse=<the released
// module is a leaf>): a leaf's scan counts containers' whole subtrees, the
// others' count no leaf's parameters. Replayed here
// over the inventory's modules (a tied LM head is one more module after the
// last), with parameters of at most
// stage3_param_persistence_threshold elements always present. A module
// whose parameters all have runs_backward false (RunsBackward in
// inventory.h; empty: every module) is not in the backward's part of the
// trace. `zero` must be resolved (ResolveRunConfig).
struct Stage3Retention {
  std::vector<bool> kept_after_forward;  // per parameter of the inventory
  bool embedding_kept = false;  // the embedding (tied: also as the head; a ViT: its patch projection), from its forward through its backward
  bool head_kept = false;       // the LM head (a ViT: its classifier), from its forward to its backward
};
Stage3Retention Stage3RetentionOf(const ModelSpec& model, const std::vector<TensorSpec>& parameters,
                                  bool tied_embeddings, const ZeroConfig& zero,
                                  const std::vector<bool>& runs_backward = {});

ShardLayout ComputeShardLayout(const std::vector<TensorSpec>& parameters, int64_t world,
                               int64_t persistence_threshold_elements);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_SHARDING_H_
