// File: accuracy.h
// The planner-vs-executor agreement matrix (issue 4): each configuration is
// planned by the zplan binary (--gpu cpu --out plan.pb) and trained for a few
// steps by the zrun binary, whose CPU counting allocator attributes every
// tensor byte to the planner's components at the peak. Rows compare predicted
// with measured device peak per rank and component, and host VmHWM.
//
// Goals (they are the contract, not tolerances to widen): device peak within
// 3% on every rank; host within 10% or 256 MiB.
//
// Example:
//   AccuracyOptions o{.zplan_path = "planner/zplan", .zrun_path = "executor/zrun", .work_dir = "/tmp/acc"};
//   ZPLAN_ASSIGN_OR_RETURN(std::vector<AccuracyRow> rows, RunAccuracyMatrix(o));
//   std::string markdown = AccuracyMarkdown(rows);
#ifndef ZPLAN_TOOLS_ACCURACY_H_
#define ZPLAN_TOOLS_ACCURACY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/memory.pb.h"
#include "proto/plan.pb.h"

namespace zplan {

inline constexpr double kDeviceGoalFraction = 0.03;
inline constexpr double kHostGoalFraction = 0.10;
inline constexpr int64_t kHostGoalBytes = int64_t{256} << 20;

struct AccuracyCase {
  std::string name;
  std::vector<std::string> zplan_args;  // besides --gpu cpu and --out
  int emulate_rank = -1;                // >= 0: zrun --emulate-rank
};

// The matrix: >= 32 configurations over ZeRO 0-3, offloads, checkpointing,
// fp32/bf16/fp16, world 1/2/4 and emulated ranks, micro-batches, sequence
// lengths, eager/SDPA, tied/untied embeddings.
std::vector<AccuracyCase> AccuracyMatrix();

struct RankMeasurement {
  int rank = 0;
  MemoryBreakdown device;  // per component at the peak (counting allocator)
  int64_t host_hwm_bytes = 0;
};

struct AccuracyRow {
  AccuracyCase config;
  Plan plan;
  std::vector<RankMeasurement> ranks;
  // Derived: the rank with the largest |device error|, and the largest host miss.
  size_t worst_rank = 0;
  double device_error = 0;        // (measured - planned) / planned tensor bytes
  int64_t host_planned_bytes = 0; // per rank
  int64_t host_worst_diff_bytes = 0;
  bool device_ok = false;
  bool host_ok = false;
};

struct AccuracyOptions {
  std::string zplan_path;
  std::string zrun_path;
  std::string work_dir;   // plans, reports and logs, one folder per case
  int steps = 3;
  std::function<void(const AccuracyRow&)> on_row;  // progress, optional
};

// Runs every case; an error names the case and its log.
absl::StatusOr<std::vector<AccuracyRow>> RunAccuracyMatrix(const AccuracyOptions& options);

// docs/accuracy.md. Everything above the "## Host" heading is deterministic
// (exact byte counts); the host section varies from run to run.
std::string AccuracyMarkdown(const std::vector<AccuracyRow>& rows);
inline constexpr char kHostSectionHeading[] = "## Host";

}  // namespace zplan

#endif  // ZPLAN_TOOLS_ACCURACY_H_
