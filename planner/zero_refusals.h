// File: zero_refusals.h
// Every configuration zplan and zrun refuse because DeepSpeed itself fails on
// it, or because zplan does not model what DeepSpeed would do, in one place:
// each check returns kInvalidArgument with a message that names the setting,
// says why (the DeepSpeed or transformers source and function) and what to
// do instead. The other validations (ranges, missing fields, hardware)
// stay with their inputs (run_config.cc, ds_config.cc).
//
// Where each runs, in this order for one configuration:
//   RefuseDeepSpeedCheckpointing, RefuseZeroConfig
//       ValidateRunConfig (run_config.cc), between its other checks;
//   RefuseStep          StepSizer::Create (memory_model.cc), which also
//                       needs the model (Stage3MixesPartitionDtypes);
//   RefuseEngineConfig  ZeroEngine::Create (executor/zero_engine.cc);
//   the k...Refusal texts  ds_config.cc, at the DeepSpeed JSON key.
// Never mutates its inputs.
//
// Example:
//   ZPLAN_RETURN_IF_ERROR(RefuseZeroConfig(config));
#ifndef ZPLAN_PLANNER_ZERO_REFUSALS_H_
#define ZPLAN_PLANNER_ZERO_REFUSALS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/step_sizes.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// DeepSpeed JSON values zplan refuses (ds_config.cc, at the key).
// zero_optimization.offload_*.device "nvme": DeepSpeed's NVMe swapper is not modelled.
inline constexpr absl::string_view kNvmeOffloadRefusal = "NVMe offload is not modelled; use \"cpu\" or \"none\"";
// expert_parallel.enabled true: DeepSpeed's AutoEP (module_inject/auto_ep.py)
// replaces the MoE blocks, shards the experts over the expert-parallel group
// and exchanges tokens all-to-all: not modelled.
inline constexpr absl::string_view kAutoEpRefusal =
    "DeepSpeed's AutoEP (expert parallelism: experts sharded over the expert-parallel group, tokens exchanged "
    "all-to-all) is not modelled; plan without it (every rank runs all experts, ZeRO shards their states)";
// zero_optimization.leaf_module or stage3_module_granularity_threshold > 0:
// leaf modules other than DeepSpeed's default classes (utils/z3_leaf_module.py)
// gather and reduce differently; not modelled.
inline constexpr absl::string_view kLeafModuleRefusal =
    "leaf modules other than DeepSpeed's default ones (Mixtral's, Qwen2-MoE's and Qwen3-MoE's SparseMoeBlock) are "
    "not modelled; remove the key";
// fp16.enabled and bf16.enabled both true: DeepSpeed's config asserts one.
inline constexpr absl::string_view kFp16AndBf16Refusal =
    "fp16 and bf16 are both enabled; DeepSpeed refuses that (\"bfloat16 and fp16 modes cannot be simultaneously "
    "enabled\"): enable one";
// optimizer.type other than Adam/AdamW: other optimizers keep other states.
inline constexpr absl::string_view kOptimizerTypeRefusal =
    "zplan models Adam and AdamW (fp32 m and v per parameter); remove the optimizer block or use \"AdamW\"";

// activation_checkpointing: contiguous_memory_optimization without
// partition_activations, or without number_checkpoints (deepspeed.checkpointing.configure
// asserts both).
absl::Status RefuseDeepSpeedCheckpointing(const RunConfig& config);

// ZeRO settings: Liger's fused loss at stage 3, parameter offload below stage 3.
absl::Status RefuseZeroConfig(const RunConfig& config);

// True where DeepSpeed cannot start: ZeRO-3 under zero.Init in bf16/fp16
// partitions peft's fp32 adapters (SavePolicyFor, memory_model.h) with a
// modules_to_save copy in the working dtype, and stage3.py's
// _create_fp16_partitions_with_defragmentation asserts one dtype (DeepSpeed
// 0.19.8). RefuseStep refuses it; the stage grid leaves the row out.
bool Stage3MixesPartitionDtypes(const ModelSpec& model, const RunConfig& config);

// What StepSizer::Create refuses for a model and a resolved, validated
// config: DeepSpeed's checkpoint function with eager attention's shared mask
// or with GPT-2/ViT positional arguments, cpu_checkpointing without
// partition_activations, too few number_checkpoints, optimizer offload at
// stage 0, Liger's fused loss without an LM head or with LoRA, and
// Stage3MixesPartitionDtypes. `s` holds the configuration fields of
// StepSizes (stage, checkpointing, cpu_ranks, offload_optimizer, ...).
absl::Status RefuseStep(const ModelSpec& model, const RunConfig& config, const StepSizes& s);

// What ZeroEngine::Create refuses (the planner refuses both first, with its
// own wording): optimizer offload at stage 0, parameter offload below stage 3.
absl::Status RefuseEngineConfig(const RunConfig& config);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZERO_REFUSALS_H_
