#include "planner/run_config.h"

#include "absl/strings/str_cat.h"
#include "planner/gpu_catalog.h"
#include "planner/status_macros.h"

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
  auto positive = [](absl::string_view field, int64_t value, absl::string_view example) {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be > 0, got ", value, " (e.g. ", example, ")"));
  };
  ZPLAN_RETURN_IF_ERROR(positive("cluster.num_nodes (--nodes)", config.cluster().num_nodes(), "1"));
  ZPLAN_RETURN_IF_ERROR(positive("cluster.gpus_per_node (--gpus)", config.cluster().gpus_per_node(), "8"));
  ZPLAN_RETURN_IF_ERROR(positive("micro_batch_size (--micro-batch)", config.micro_batch_size(), "1"));
  ZPLAN_RETURN_IF_ERROR(positive("gradient_accumulation_steps (--grad-accum)",
                                 config.gradient_accumulation_steps(), "1"));
  ZPLAN_RETURN_IF_ERROR(positive("seq_length (--seq)", config.seq_length(), "2048"));
  if (config.cluster().host_ram_bytes() < 0) {
    return absl::InvalidArgumentError("cluster.host_ram_bytes: must be >= 0 (0 = unknown)");
  }
  const ZeroConfig& zero = config.zero();
  if (zero.stage() < 0 || zero.stage() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.stage (--zero-stage): ZeRO has stages 0, 1, 2 and 3, got ", zero.stage()));
  }
  if (zero.offload_param() == OFFLOAD_CPU && zero.stage() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.offload_param (--offload-param): parameter offload needs ZeRO stage 3, got stage ",
        zero.stage(), "; use --zero-stage 3 or drop --offload-param"));
  }
  ZPLAN_RETURN_IF_ERROR(positive("zero.reduce_bucket_elements (reduce_bucket_size)",
                                 zero.reduce_bucket_elements(), "5e8"));
  ZPLAN_RETURN_IF_ERROR(positive("zero.allgather_bucket_elements (allgather_bucket_size)",
                                 zero.allgather_bucket_elements(), "5e8"));
  // 0 turns prefetching off, as in DeepSpeed.
  if (zero.stage3_prefetch_bucket_elements() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.stage3_prefetch_bucket_elements (stage3_prefetch_bucket_size): must be >= 0 (0 = no prefetch), got ",
        zero.stage3_prefetch_bucket_elements()));
  }
  ZPLAN_RETURN_IF_ERROR(positive("zero.stage3_max_live_parameters", zero.stage3_max_live_parameters(), "1e9"));
  ZPLAN_RETURN_IF_ERROR(positive("zero.sub_group_elements (sub_group_size)", zero.sub_group_elements(), "1e9"));
  if (zero.stage3_param_persistence_threshold() < 0) {
    return absl::InvalidArgumentError("zero.stage3_param_persistence_threshold: must be >= 0");
  }
  if (config.precision() == PRECISION_UNSPECIFIED) {
    return absl::InvalidArgumentError("precision (--precision): choose bf16, fp16 or fp32");
  }
  // At stage 0 with mixed precision DeepSpeed wraps a torch optimizer in
  // FP16_UnfusedOptimizer (runtime/fp16/unfused_optimizer.py): per-parameter
  // fp32 masters and gradients, not modelled yet (docs/deepspeed_model.md, row 9).
  const AdamImplementation adam = config.optimizer().implementation();
  if (zero.stage() == 0 && config.precision() != PRECISION_FP32 &&
      (adam == ADAM_IMPL_TORCH || adam == ADAM_IMPL_TORCH_FOREACH || adam == ADAM_IMPL_TORCH_FUSED)) {
    return absl::InvalidArgumentError(
        "optimizer.params.torch_adam: a torch optimizer at ZeRO stage 0 with bf16/fp16 runs DeepSpeed's "
        "FP16_UnfusedOptimizer, which zplan does not model yet; use ZeRO stage >= 1, fp32, or DeepSpeed's "
        "FusedAdam (drop torch_adam)");
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
