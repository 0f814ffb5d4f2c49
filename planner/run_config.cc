#include "planner/run_config.h"

#include "absl/strings/str_cat.h"
#include "planner/gpu_catalog.h"
#include "planner/limits.h"
#include "planner/status_macros.h"
#include "planner/units.h"
#include "planner/zero_refusals.h"

namespace zplan {

RunConfig ResolveRunConfig(RunConfig config) {
  ClusterSpec* cluster = config.mutable_cluster();
  if (cluster->num_nodes() == 0) cluster->set_num_nodes(1);
  if (cluster->gpus_per_node() == 0) cluster->set_gpus_per_node(1);
  if (cluster->gpu().empty()) cluster->set_gpu(std::string(kDefaultGpu));
  ZeroConfig* zero = config.mutable_zero();
  if (zero->offload_optimizer() == OFFLOAD_DEVICE_UNSPECIFIED) zero->set_offload_optimizer(OFFLOAD_NONE);
  if (zero->offload_param() == OFFLOAD_DEVICE_UNSPECIFIED) zero->set_offload_param(OFFLOAD_NONE);
  if (!zero->has_pin_memory()) zero->set_pin_memory(true);
  if (!zero->has_reduce_bucket_elements()) zero->set_reduce_bucket_elements(kDefaultReduceBucketElements);
  if (!zero->has_allgather_bucket_elements()) {
    zero->set_allgather_bucket_elements(kDefaultAllgatherBucketElements);
  }
  // DeepSpeed: overlap_comm None -> True for stage 3 only.
  if (!zero->has_overlap_comm()) zero->set_overlap_comm(zero->stage() == 3);
  if (!zero->has_contiguous_gradients()) zero->set_contiguous_gradients(true);
  if (!zero->has_stage3_prefetch_bucket_elements()) {
    zero->set_stage3_prefetch_bucket_elements(kDefaultPrefetchBucketElements);
  }
  if (!zero->has_stage3_max_live_parameters()) {
    zero->set_stage3_max_live_parameters(kDefaultMaxLiveParameters);
  }
  if (!zero->has_stage3_max_reuse_distance()) zero->set_stage3_max_reuse_distance(kDefaultMaxReuseDistance);
  if (!zero->has_stage3_param_persistence_threshold()) {
    zero->set_stage3_param_persistence_threshold(kDefaultPersistenceThreshold);
  }
  if (!zero->has_sub_group_elements()) zero->set_sub_group_elements(kDefaultSubGroupElements);
  if (!zero->has_zero_init()) zero->set_zero_init(zero->stage() == 3);
  if (!zero->has_memory_efficient_linear()) zero->set_memory_efficient_linear(true);
  if (config.precision() == PRECISION_UNSPECIFIED) config.set_precision(PRECISION_BF16);
  if (config.micro_batch_size() == 0) config.set_micro_batch_size(1);
  if (config.gradient_accumulation_steps() == 0) config.set_gradient_accumulation_steps(1);
  if (config.seq_length() == 0) config.set_seq_length(2048);
  OptimizerConfig* opt = config.mutable_optimizer();
  if (opt->learning_rate() == 0) opt->set_learning_rate(3e-4);
  if (opt->beta1() == 0) opt->set_beta1(0.9);
  if (opt->beta2() == 0) opt->set_beta2(0.999);
  if (opt->eps() == 0) opt->set_eps(1e-8);
  if (opt->weight_decay() == 0) opt->set_weight_decay(0.01);
  if (opt->implementation() == ADAM_IMPL_UNSPECIFIED) opt->set_implementation(ADAM_IMPL_DEEPSPEED);
  if (config.train_steps() == 0) config.set_train_steps(4);
  return config;
}

absl::Status ValidateRunConfig(const RunConfig& config) {
  const ClusterSpec& cluster = config.cluster();
  ZPLAN_RETURN_IF_ERROR(CheckFields({
      {"cluster.num_nodes (--nodes)", cluster.num_nodes(), 1, kMaxNodes, "nodes, e.g. 1"},
      {"cluster.gpus_per_node (--gpus)", cluster.gpus_per_node(), 1, kMaxGpusPerNode, "ranks per node, e.g. 8"},
      {"micro_batch_size (--micro-batch)", config.micro_batch_size(), 1, kMaxMicroBatch, "sequences per rank, e.g. 1"},
      {"gradient_accumulation_steps (--grad-accum)", config.gradient_accumulation_steps(), 1, kMaxGradAccum,
       "micro-steps per optimizer step, e.g. 1"},
      {"seq_length (--seq)", config.seq_length(), 1, kMaxSeqLength, "tokens per sequence, e.g. 2048"},
      {"checkpoint_every_n_layers (--checkpoint-every)", config.checkpoint_every_n_layers(), 0, kMaxLayers,
       "checkpoint blocks 0, k, 2k, ...; 0 or 1: every block"},
      {"train_steps", config.train_steps(), 1, kMaxTrainSteps, "optimizer steps zrun runs"},
      {"optimizer.warmup_steps (scheduler.params.warmup_num_steps)", config.optimizer().warmup_steps(), 0,
       kMaxTrainSteps, "linear warm-up steps"},
  }));
  // Checked by division: the product itself may not fit in int64.
  if (cluster.gpus_per_node() > kMaxWorldSize / cluster.num_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster: ", cluster.num_nodes(), " nodes x ", cluster.gpus_per_node(),
                                                   " GPUs is more than the ", kMaxWorldSize,
                                                   " ranks zplan plans; reduce --nodes or --gpus"));
  }
  ZPLAN_RETURN_IF_ERROR(CheckRange("cluster.host_ram_bytes (--host-ram-gib)", cluster.host_ram_bytes(), 0,
                                   static_cast<int64_t>(kMaxGiB * kGiB), "bytes of RAM per node; 0 = unknown"));
  const OptimizerConfig& opt = config.optimizer();
  ZPLAN_RETURN_IF_ERROR(CheckFinite("optimizer.learning_rate (optimizer.params.lr)", opt.learning_rate(), 0, 1e3,
                                    "peak learning rate, e.g. 3e-4"));
  ZPLAN_RETURN_IF_ERROR(CheckFinite("optimizer.beta1 (optimizer.params.betas[0])", opt.beta1(), 0, 1, "e.g. 0.9"));
  ZPLAN_RETURN_IF_ERROR(CheckFinite("optimizer.beta2 (optimizer.params.betas[1])", opt.beta2(), 0, 1, "e.g. 0.999"));
  ZPLAN_RETURN_IF_ERROR(CheckFinite("optimizer.eps (optimizer.params.eps)", opt.eps(), 0, 1, "e.g. 1e-8"));
  ZPLAN_RETURN_IF_ERROR(CheckFinite("optimizer.weight_decay (optimizer.params.weight_decay)", opt.weight_decay(), 0,
                                    1e3, "e.g. 0.01"));
  ZPLAN_RETURN_IF_ERROR(CheckFinite("optimizer.gradient_clipping (gradient_clipping)", opt.gradient_clipping(), 0, 1e12,
                                    "global-norm clip; 0 = off"));
  if (config.checkpoint_offload() && !config.activation_checkpointing()) {
    return absl::InvalidArgumentError(
        "checkpoint_offload (--checkpoint-offload): offloads checkpointed blocks' inputs, but checkpointing is off; "
        "add --checkpointing true or drop --checkpoint-offload");
  }
  const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
  if (ds.enabled() && !config.activation_checkpointing()) {
    return absl::InvalidArgumentError(
        "deepspeed_checkpointing.enabled (--checkpoint-function deepspeed): names the function that checkpoints, "
        "but checkpointing is off; add --checkpointing true or drop --checkpoint-function");
  }
  if (ds.enabled() && config.checkpoint_offload()) {
    return absl::InvalidArgumentError(
        "checkpoint_offload (--checkpoint-offload): transformers' offload wraps torch.utils.checkpoint, not "
        "deepspeed.checkpointing.checkpoint; drop it and set activation_checkpointing.cpu_checkpointing in the "
        "DeepSpeed config instead");
  }
  ZPLAN_RETURN_IF_ERROR(RefuseDeepSpeedCheckpointing(config));  // zero_refusals.h
  const ZeroConfig& zero = config.zero();
  if (zero.stage() < 0 || zero.stage() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.stage (--zero-stage): ZeRO has stages 0, 1, 2 and 3, got ", zero.stage()));
  }
  ZPLAN_RETURN_IF_ERROR(RefuseZeroConfig(config));
  ZPLAN_RETURN_IF_ERROR(CheckFields({
      {"zero.reduce_bucket_elements (reduce_bucket_size)", zero.reduce_bucket_elements(), 1, kMaxBucketElements,
       "elements, e.g. 5e8"},
      {"zero.allgather_bucket_elements (allgather_bucket_size)", zero.allgather_bucket_elements(), 1,
       kMaxBucketElements, "elements, e.g. 5e8"},
      // 0 turns prefetching off, as in DeepSpeed.
      {"zero.stage3_prefetch_bucket_elements (stage3_prefetch_bucket_size)", zero.stage3_prefetch_bucket_elements(),
       0, kMaxBucketElements, "elements; 0 = no prefetch"},
      {"zero.stage3_max_live_parameters", zero.stage3_max_live_parameters(), 1, kMaxBucketElements,
       "elements, e.g. 1e9"},
      {"zero.stage3_max_reuse_distance", zero.stage3_max_reuse_distance(), 0, kMaxBucketElements,
       "elements, e.g. 1e9"},
      {"zero.sub_group_elements (sub_group_size)", zero.sub_group_elements(), 1, kMaxBucketElements,
       "elements, e.g. 1e9"},
      {"zero.stage3_param_persistence_threshold", zero.stage3_param_persistence_threshold(), 0, kMaxBucketElements,
       "elements, e.g. 1e5"},
  }));
  if (config.precision() == PRECISION_UNSPECIFIED) {
    return absl::InvalidArgumentError("precision (--precision): choose bf16, fp16 or fp32");
  }
  ZPLAN_ASSIGN_OR_RETURN(GpuSpec gpu, FindGpu(config.cluster().gpu()));
  if (config.precision() == PRECISION_BF16 && !gpu.supports_bf16()) {
    return absl::InvalidArgumentError(absl::StrCat("precision (--precision): ", gpu.name(),
                                                   " has no bf16; use --precision fp16"));
  }
  return absl::OkStatus();
}

int64_t WorkingDtypeBytes(Precision precision) { return precision == PRECISION_FP32 ? 4 : 2; }

}  // namespace zplan
