// File: trainer.h
// Trains one rank of a plan for real and measures its memory (DESIGN §4).
//
// The model is built from the plan's ModelSpec and checked against the plan's
// parameter inventory before step 0; the ZeRO engine follows the plan's
// RunConfig. Step 0 is a warm-up (it creates the optimizer's state); the
// allocator peak is reset after it, so measured peaks are steady-state steps,
// as the planner predicts. Per-phase samples (after forward, backward, step)
// are kept for every measured step. Data are deterministic synthetic tokens
// (seeded by step, micro-step and rank) unless a uint16 token file is given.
// Every collective gets tensors on the rank's device (NCCL takes no CPU
// tensors), the loss all-reduce included.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(RankReport r, TrainRank(plan, comm.get(), {.steps = 4}));
#ifndef ZPLAN_EXECUTOR_TRAINER_H_
#define ZPLAN_EXECUTOR_TRAINER_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "executor/collectives.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"

namespace zplan {

// Checkpoints: every rank writes <save_dir>/step-K/rank-R.pb (temp file +
// rename); after a barrier rank 0 replaces <save_dir>/latest ("step-K") the
// same way, so a crash mid-save leaves the previous checkpoint in force.
// Resuming reads <resume_dir>/latest and continues at step K with the same
// data and learning-rate schedule, reproducing an uninterrupted run's losses.
struct TrainOptions {
  int64_t steps = 0;           // total optimizer steps (0 = the plan's train_steps)
  std::string data_path;       // uint16 token ids; empty = synthetic
  std::string save_dir;        // empty = no checkpoints
  int64_t save_every = 0;      // steps between checkpoints; 0 = only after the last
  std::string resume_dir;      // empty = start from step 0
  int64_t stop_after = 0;      // stop (and checkpoint) after this step, as a preempted job would
  int local_rank = 0;          // the launcher's LOCAL_RANK / SLURM_LOCALID: which GPU of the node
  std::ostream* progress = nullptr;  // one line per step (step, loss, lr, tokens/s, memory); null: quiet
  // Diagnostics (profiling.h), one file per rank: a Kineto trace of the
  // second steady-state step (or the last) and, on CUDA, the caching
  // allocator's history over the steady-state steps.
  std::string profile_dir;          // rank-R.trace.json; empty = off
  std::string memory_snapshot_dir;  // rank-R.memory.pickle; empty = off
};

// kFailedPrecondition when the model does not match the plan's inventory or
// the device is unavailable; kUnavailable when a peer fails.
absl::StatusOr<RankReport> TrainRank(const Plan& plan, Collectives* comm, const TrainOptions& options);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_TRAINER_H_
