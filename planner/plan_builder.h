// File: plan_builder.h
// The planner's entry point: (ModelSpec, RunConfig) -> Plan, plus the
// searches users ask for (largest micro-batch and sequence that fit) and the
// stage x offload grid.
//
// BuildPlan resolves DeepSpeed defaults, validates the model and the config,
// computes the step program's peak (step_program.h) and its events, and judges the
// fit against the budget (GPU capacity by default; host RAM when known).
// Errors are kInvalidArgument naming the field; a configuration that does
// not fit is not an error (Plan.fits = false).
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(Plan plan, BuildPlan(model, config));
//   if (!plan.fits()) ...
#ifndef ZPLAN_PLANNER_PLAN_BUILDER_H_
#define ZPLAN_PLANNER_PLAN_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/version.h"
#include "proto/model.pb.h"
#include "proto/plan.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

inline constexpr double kDefaultTolerance = 0.03;  // planner vs executor (issue 4 target)

struct PlanOptions {
  bool record_timeline = true;   // keep the simulated step's events in the plan
  int64_t device_budget_bytes = 0;  // 0 = GPU capacity
  double tolerance = kDefaultTolerance;
};

// Checks that `plan` (read from `path`) is a whole plan that zplan wrote:
// its version, model, config, inventory, budget with a tolerance and
// per-rank breakdowns present, and every number within limits.h. A file cut
// short or emptied parses as a protobuf but fails here, naming the missing
// field; `zplan show` and zrun both refuse it (kInvalidArgument).
absl::Status ValidatePlan(const Plan& plan, absl::string_view path);

absl::StatusOr<Plan> BuildPlan(const ModelSpec& model, const RunConfig& config,
                               const PlanOptions& options = {});

// The planned device peak of `rank` (its RankPlan; the largest rank's,
// device_per_rank, when the plan has no entry for it).
const MemoryBreakdown& PlannedDevice(const Plan& plan, int rank);

// Largest micro-batch (resp. sequence length) whose device peak fits the GPU
// (or `budget_bytes` when > 0), other settings unchanged; 0 when even 1 does
// not fit. Searches up to kMaxMicroBatch / kMaxSeqLength (limits.h).
absl::StatusOr<int64_t> MaxMicroBatch(const ModelSpec& model, const RunConfig& config,
                                      int64_t budget_bytes = 0);
absl::StatusOr<int64_t> MaxSeqLength(const ModelSpec& model, const RunConfig& config,
                                     int64_t budget_bytes = 0);

// A ZeRO stage with one of the offload options it allows.
struct StageOption {
  int stage = 0;
  bool offload_optimizer = false;
  bool offload_param = false;
};

// Every stage with every offload option it allows, in grid order:
// 0; 1, 1+opt; 2, 2+opt; 3, 3+opt, 3+opt+param.
const std::vector<StageOption>& StageOptions();

// `config` with the option's stage and offload devices.
RunConfig WithStageOption(RunConfig config, const StageOption& option);

// One row of the what-if grid.
struct GridRow {
  StageOption option;
  Plan plan;                     // without timeline
  int64_t max_micro_batch = 0;
  // With the full-logits loss: the device peak per rank had the loss been
  // Liger's fused linear cross-entropy (-1 where it cannot run: stage 3, or
  // no LM head).
  int64_t fused_loss_peak_bytes = -1;
};

// A plan for every StageOptions() row; with the fused loss, stage 3's rows
// are left out (it cannot run there, memory_model.h).
absl::StatusOr<std::vector<GridRow>> StageGrid(const ModelSpec& model, const RunConfig& config,
                                               const PlanOptions& options = {});

// "none", "optimizer", "optimizer+params".
std::string OffloadLabel(bool offload_optimizer, bool offload_param);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_PLAN_BUILDER_H_
