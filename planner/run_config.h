// File: run_config.h
// DeepSpeed's defaults for a RunConfig, and the checks a config passes before
// planning or execution.
//
// ResolveRunConfig fills every unset field with DeepSpeed's default
// (deepspeed/runtime/zero/config.py; reference/memory_formulas.md §8), so a
// plan records exactly what was assumed. ValidateRunConfig returns
// kInvalidArgument naming the field and the fix: stage outside 0..3,
// offload_param below stage 3, zero or negative sizes, unknown GPU.
//
// Example:
//   RunConfig config = ResolveRunConfig(user_config);
//   ZPLAN_RETURN_IF_ERROR(ValidateRunConfig(config));
#ifndef ZPLAN_PLANNER_RUN_CONFIG_H_
#define ZPLAN_PLANNER_RUN_CONFIG_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "proto/run_config.pb.h"

namespace zplan {

// DeepSpeed ZeRO defaults (elements, not bytes).
inline constexpr int64_t kDefaultReduceBucketElements = 500'000'000;
inline constexpr int64_t kDefaultAllgatherBucketElements = 500'000'000;
inline constexpr int64_t kDefaultPrefetchBucketElements = 50'000'000;  // code says 5e7 (docs 5e8)
inline constexpr int64_t kDefaultMaxLiveParameters = 1'000'000'000;
inline constexpr int64_t kDefaultMaxReuseDistance = 1'000'000'000;
inline constexpr int64_t kDefaultPersistenceThreshold = 100'000;
inline constexpr int64_t kDefaultSubGroupElements = 1'000'000'000;

RunConfig ResolveRunConfig(RunConfig config);

absl::Status ValidateRunConfig(const RunConfig& config);

// Ranks in the data-parallel group: nodes x GPUs per node.
inline int64_t WorldSize(const RunConfig& config) {
  return config.cluster().num_nodes() * config.cluster().gpus_per_node();
}

// With activation checkpointing, blocks 0, k, 2k, ... are checkpointed
// (transformers' every_n_layers); RunConfig's 0 and 1 both mean every block.
inline int CheckpointEveryNLayers(const RunConfig& config) { return std::max(1, config.checkpoint_every_n_layers()); }

// Bytes per element of parameters, gradients and activations.
int64_t WorkingDtypeBytes(Precision precision);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_RUN_CONFIG_H_
