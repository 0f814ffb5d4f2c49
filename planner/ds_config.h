// File: ds_config.h
// Reads a DeepSpeed ds_config.json into a RunConfig.
//
// Keys read: train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// train_batch_size (the third of the three is inferred, as DeepSpeed does),
// fp16.enabled, bf16.enabled, gradient_clipping, optimizer.params (lr, betas,
// eps, weight_decay), scheduler.params.warmup_num_steps and
// zero_optimization: stage, offload_optimizer / offload_param (device,
// pin_memory), reduce_bucket_size, allgather_bucket_size, overlap_comm,
// contiguous_gradients, stage3_prefetch_bucket_size,
// stage3_param_persistence_threshold, stage3_max_live_parameters,
// stage3_max_reuse_distance, sub_group_size, memory_efficient_linear, the
// deprecated cpu_offload alias, and activation_checkpointing:
// partition_activations, cpu_checkpointing, contiguous_memory_optimization,
// number_checkpoints (which matter only where the model checkpoints through
// deepspeed.checkpointing.checkpoint). Other keys are ignored (they do not
// change memory).
//
// "auto" is resolved the way the Hugging Face integration does
// (transformers integrations/deepspeed.py): reduce_bucket_size = h * h,
// stage3_prefetch_bucket_size = 0.9 * h * h, stage3_param_persistence_threshold
// = 10 * h; batch, accumulation and precision "auto" leave the field to the
// command line (or the default). Only fields present in the file are set, so
// command-line flags applied afterwards override it.
//
// Errors are kInvalidArgument "<file>: <key path>: <what> (<fix>)": a key of the wrong type, stage outside 0..3, NVMe offload
// (not modelled), batch sizes that do not multiply up; malformed JSON gets
// "<file>:<line>:<column>: malformed JSON: <what>" (planner/json.h).
//
// Example:
//   ZPLAN_RETURN_IF_ERROR(ApplyDeepSpeedConfigFile("ds_config.json", model, &config));
#ifndef ZPLAN_PLANNER_DS_CONFIG_H_
#define ZPLAN_PLANNER_DS_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// `text` is the file's contents; errors name `source` and the key path.
absl::Status ApplyDeepSpeedConfig(absl::string_view text, absl::string_view source, const ModelSpec& model,
                                  RunConfig* config);

absl::Status ApplyDeepSpeedConfigFile(const std::string& path, const ModelSpec& model,
                                      RunConfig* config);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_DS_CONFIG_H_
