// File: zplan_command.h
// What the `zplan` binary does, as a library: options in, text out.
//
// Modes (ZplanOptions::command):
//   ""          no stage given: the grid of every ZeRO stage x offload option
//               (per-GPU peak, host RAM per node, fits, largest micro-batch)
//               and the recommended row; with a stage: the full breakdown per
//               component, device and host, and the moment of the peak.
//   "max-batch" the largest micro-batch and sequence length that fit, per
//               grid row (or for the given stage).
//   "show"      reads the plan at plan_path and prints it in --format.
//   "sweep"     a table over lists of micro-batches, stages and sequence
//               lengths (e.g. --micro-batch 2,4,8 --zero-stage 2,3), like the
//               seeds' performance tables.
// --out writes the plan (binary unless .textproto/.json) atomically; in grid
// mode it writes the recommended row. --format json|textproto prints the plan
// with proto field names. --timeline writes a Chrome trace (Perfetto).
// --plot draws the simulated step (.png or .svg, plot.h), for the written plan
// or, with "show", the plan read; --report adds a zrun report's samples to it.
//
// Numeric options are strings exactly as typed, so errors can quote them;
// empty means "not given" (the ds_config or DeepSpeed default applies).
// Every rejection is kInvalidArgument naming the flag or field; nothing is
// written when planning fails.
//
// Budgets: with budget_gib or host_ram_gib given, a plan that does not fit
// them is kResourceExhausted (cli.h's kExitBudget), returned after the text
// is printed and --out / --timeline are written; in grid, sweep and
// max-batch mode, when no row fits. Without them, "fits: NO" is a finding,
// not an error (OK).
//
// Example:
//   ZplanOptions o; o.model = "1b"; o.seq = "8192";
//   ZPLAN_RETURN_IF_ERROR(RunZplan(o, std::cout));
#ifndef ZPLAN_PLANNER_ZPLAN_COMMAND_H_
#define ZPLAN_PLANNER_ZPLAN_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "proto/plan.pb.h"

namespace zplan {

struct ZplanOptions {
  std::string command;          // "", "max-batch", "sweep", "show" or "count"
  std::string plan_path;        // for "show"
  // Model: exactly one of these (preset default "1b").
  std::string model;            // preset name, or a ModelSpec .textproto file
  std::string hf_config;        // path to a Hugging Face config.json
  std::string params;           // bare parameter count, e.g. "7.5e9"
  // With hf_config: the family (model_family.h) to plan a config.json of an
  // unsupported model_type as; the plan records it as an unvalidated
  // approximation, and every text output prints that.
  std::string approximate_as;
  // Explicit dimensions, applied on top of the model above (so
  // "--layers 48 --hidden 6144 ..." describes a new shape from the 1b preset).
  std::string layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  // LoRA on the frozen model (ModelSpec.lora): a PEFT adapter_config.json,
  // then the rank and the target modules (comma-separated, or "all-linear")
  // and modules_to_save (comma-separated) on top; any flag alone means LoRA
  // with PEFT's defaults for the rest.
  std::string lora_config, lora_r, lora_targets, lora_modules_to_save;
  // A vision-language model: the parts that do not train (comma-separated
  // vision_tower, projector, language_model) and images per sequence.
  std::string freeze, images_per_sample, image_size;
  // Run configuration; empty = not given.
  std::string ds_config;        // DeepSpeed JSON, applied before the flags below
  std::string seq;              // tokens per sequence (list in sweep mode)
  std::string micro_batch;      // list in sweep mode
  std::string grad_accum;
  std::string gpus;             // per node; default 8
  std::string nodes;            // default 1
  std::string zero_stage;       // 0..3 (list in sweep mode)
  std::string offload_optimizer;  // "cpu" | "none"
  std::string offload_param;      // "cpu" | "none"
  std::string precision;        // "bf16" | "fp16" | "fp32"
  std::string checkpointing;    // "true" | "false"
  std::string checkpoint_every;   // k: checkpoint blocks 0, k, 2k, ... (default 1)
  std::string checkpoint_offload; // "true" | "false"
  std::string checkpoint_function;  // "torch" | "deepspeed" (deepspeed.checkpointing.checkpoint)
  std::string attention;        // "sdpa" | "eager"
  std::string experts;          // "grouped_mm" | "eager" | "batched_mm" (MoeSpec.experts_impl)
  std::string kernels;          // "none" | a list of "fla", "causal_conv1d"
  std::string loss;             // "full" | "liger-fused"
  std::string routing;          // "balanced" | "worst" | a routing JSON file (eager_experts.h)
  std::string gpu;              // catalog key; default h100-80gb
  std::string host_ram_gib;     // RAM per node in GiB; empty = not judged
  std::string budget_gib;       // device budget per GPU in GiB; empty = capacity
  // Outputs.
  std::string out;              // plan file
  std::string format = "table"; // "table" | "json" | "textproto"
  std::string timeline;         // Chrome trace JSON path
  std::string plot;             // picture of the simulated step, .png or .svg
  std::string report;           // with plot: a zrun report whose samples are drawn
};

absl::Status RunZplan(const ZplanOptions& options, std::ostream& out);

// The Chrome trace-event JSON of a plan's timeline: one counter track per
// component (bytes) and one slice per phase, time = event index in µs.
std::string TimelineTraceJson(const Plan& plan);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_ZPLAN_COMMAND_H_
