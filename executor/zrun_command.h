// File: zrun_command.h
// What the `zrun` binary does: load a plan, run its ranks, measure, compare.
//
// Launch modes, in order of precedence:
//   --emulate-rank R   this process is rank R of the plan's world, with no
//                      communication (memory as the real rank; DESIGN §4);
//   RANK/WORLD_SIZE/... or SLURM_PROCID/...   this process is one rank of a
//                      launcher-started job (torchrun, srun);
//   otherwise          world 1 runs in this process; larger single-node
//                      worlds spawn one process per rank (like deepspeed
//                      --num_gpus), forwarding Ctrl-C and ending every rank
//                      when one fails.
// Rank 0 gathers every rank's RankReport, writes the Report atomically to
// --report, prints predicted vs measured per rank, and decides the exit code.
//
// A plan whose ModelSpec.model_type has no family (planner/model_family.h) is
// refused (exit 2) unless it carries ModelSpec.unvalidated_approximation
// (zplan --approximate-as); then that line is printed first, and it trains.
//
// Exit codes: 0 pass; kExitBudget when a budget or the plan's tolerance is
// broken; 2 for bad input (a plan that is not a plan, a world size that does
// not match); 1 for other errors (a rank died, a timeout).
#ifndef ZPLAN_EXECUTOR_ZRUN_COMMAND_H_
#define ZPLAN_EXECUTOR_ZRUN_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "planner/cli.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"

namespace zplan {

// kExitOk, kExitError, kExitBadInput and kExitBudget: planner/cli.h.

struct ZrunOptions {
  std::string plan_path;
  std::string report_path = "report.pb";  // written by rank 0 (.pb, .textproto or .json)
  int64_t steps = 0;                      // 0 = the plan's train_steps
  std::string data_path;                  // uint16 token file; empty = synthetic
  int emulate_rank = -1;                  // >= 0: emulated-rank mode
  double timeout_seconds = 120;           // collectives and rendezvous
  std::string save_dir;                   // checkpoints (trainer.h)
  int64_t save_every = 0;
  std::string resume_dir;
  int64_t stop_after = 0;
  std::string profile_dir;          // per-rank Kineto traces (trainer.h)
  std::string memory_snapshot_dir;  // per-rank CUDA allocator histories
  std::string self_path;                  // this binary, for spawning ranks
};

// Checks every option before anything is read or launched: counts in range,
// a finite positive timeout, an existing --data file and writable --report
// and --save-dir locations; kInvalidArgument naming the flag and the fix.
absl::Status ValidateZrunOptions(const ZrunOptions& options);

// Compares measured with predicted and fills Report.passed / failures.
void JudgeReport(const Plan& plan, Report* report);

// Predicted vs measured per rank, losses and the verdict, as printed.
std::string FormatReport(const Plan& plan, const Report& report);

// Runs zrun; returns the process exit code, printing to out/err.
int RunZrun(const ZrunOptions& options, std::ostream& out, std::ostream& err);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_ZRUN_COMMAND_H_
