// File: step_program.h
// One rank's training step as a program: the ordered allocations and frees of
// the last micro-step of a gradient-accumulation window (the one that ends
// with the optimizer step), built once from StepSizes and read by two
// evaluators.
//
// The program runs, in order: the resident model states and buffers; the
// forward, block by block (stage-3 gathers and releases, checkpointed inputs
// and DeepSpeed's copies of them, or saved activations); the loss (logits,
// fp32 upcast, log-softmax and gradients, or Liger's fused chunks); the
// backward, block by block (recompute, gradient temporaries, weight gradients
// kept or moved into reduce buckets, the stage-1/2 IPG buckets and gradient
// partition where DeepSpeed makes them); the embedding's backward; the
// epilogue and the optimizer step. Every DeepSpeed/transformers mechanism is
// spelled once, in BuildStepProgram (docs/step_program.md lists them).
//
// Blocks that run identical ops are one group: its body (one block, or one
// period of checkpointed and plain blocks) runs `repeat` times, each
// repetition moving layers and handles by fixed steps. Op sizes do not vary
// within a group (whatever depends on the block index -- block 0, the block
// where the partition or the IPG buckets appear, stage-3 kept blocks -- is a
// group boundary), so live bytes are affine in the repetition and a group's
// peak is at its first or last repetition.
//
// Evaluators:
//   * StepPeak / StepPeakBytes (here): the builder hands its ops straight to
//     it (no program is stored), each group's body once, and it evaluates the
//     group at the repetition where its peak can be; what sweeps and
//     max-batch searches run, about 4,300 instructions for a 32-block model.
//   * SimulateStep (simulator.h): every event, for the timeline, the
//     allocator replay and the Perfetto trace.
// Both report the first event whose live bytes exceed every earlier one;
// tests check they agree on many configurations.
//
// Nothing here fails on input: sizes come validated from ComputeStepSizes
// (memory_model.h). A builder bug -- a tensor freed twice -- aborts through
// ZPLAN_CHECK. Building reuses per-thread scratch storage and never changes
// `sizes`.
//
// Example:
//   const StepProgram program = BuildStepProgram(sizes);
//   MemoryBreakdown peak = StepPeak(sizes);   // peak_event set, runtime and allocator added
#ifndef ZPLAN_PLANNER_STEP_PROGRAM_H_
#define ZPLAN_PLANNER_STEP_PROGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner/step_sizes.h"
#include "proto/memory.pb.h"

namespace zplan {

// One allocation or free of bytes > 0 (a zero-byte tensor makes no op).
struct StepOp {
  int64_t bytes = 0;
  const char* tensor = "";  // what it is; '#' stands for the layer (TensorName)
  int handle = 0;           // the allocation it makes or frees, at the group's first repetition
  int layer = -1;           // at the first repetition; -1 outside the blocks
  MemoryEvent::Kind kind = MemoryEvent::ALLOC;
  Component component = COMPONENT_UNSPECIFIED;
  Phase phase = PHASE_UNSPECIFIED;
};

// Ops [first_op, first_op + num_ops) run `repeat` times; repetition r has
// layer + r * layer_step and handle + r * handle_step.
struct StepGroup {
  int first_op = 0;
  int num_ops = 0;
  int repeat = 1;
  int layer_step = 0;
  int handle_step = 0;
};

struct StepProgram {
  std::vector<StepOp> ops;
  std::vector<StepGroup> groups;  // in step order; together they cover ops
  int num_handles = 0;            // handles are in [0, num_handles)
};

// The program of one rank's step. `grouped` false gives every block its own
// group (the reference the grouping is tested against).
StepProgram BuildStepProgram(const StepSizes& sizes, bool grouped = true);
// The same into `program`, reusing its storage (the fast evaluator's path).
void BuildStepProgram(const StepSizes& sizes, bool grouped, StepProgram* program);

// `tensor` with its '#' replaced by `layer`: with a vision tower of
// `tower_layers` blocks (the step's first), its blocks read "vision layer i",
// the language model's are numbered from 0.
std::string TensorName(const char* tensor, int layer, int tower_layers = 0);

// The device breakdown at the step's peak, with peak_event set; runtime and
// the allocator's cached bytes (allocator_cached) are included in peak_bytes.
MemoryBreakdown StepPeak(const StepSizes& sizes);

// StepPeak(sizes).peak_bytes() without building the breakdown.
int64_t StepPeakBytes(const StepSizes& sizes);

// Sum of the tensor components (everything except runtime and allocator).
int64_t LiveTensorBytes(const MemoryBreakdown& breakdown);

// Adds the runtime and the allocator's cached bytes to a breakdown of tensor
// bytes and sets peak_bytes to the total.
void FinishDeviceBreakdown(const StepSizes& sizes, MemoryBreakdown* breakdown);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_STEP_PROGRAM_H_
