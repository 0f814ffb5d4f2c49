// File: accuracy.h
// Agreement matrices: each configuration is planned by the zplan binary
// (--gpu cpu --out plan.pb) and trained for a few steps on CPU ranks, measured
// by zplan's counting allocator (exact tensor bytes, attributed to the
// planner's components at the peak), and one comparison turns plan and
// Report into a row: device peak per rank and component, host VmHWM.
//   * AccuracyMatrix(): trained by zrun (planner vs executor, DESIGN §7 rung 1).
//   * DeepSpeedMatrix(): trained by real DeepSpeed + transformers through
//     tools/deepspeed_oracle.py (planner vs what users run, rung 2); zplan
//     reads the same config.json and ds_config.json.
//
// Goals (they are the contract, not tolerances to widen): device peak within
// 3% on every rank; host (zrun only: the oracle's Python process is not
// zrun's) within 10% or 256 MiB.
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
#include "proto/report.pb.h"

namespace zplan {

inline constexpr double kDeviceGoalFraction = 0.03;
inline constexpr double kHostGoalFraction = 0.10;
inline constexpr int64_t kHostGoalBytes = int64_t{256} << 20;

struct AccuracyCase {
  std::string name;
  std::vector<std::string> zplan_args;  // besides --gpu cpu and --out
  int emulate_rank = -1;                // >= 0: zrun --emulate-rank
  // Non-empty: trained by the DeepSpeed oracle with this ds_config (JSON
  // text, written to the case folder and given to zplan as --ds-config too).
  std::string ds_config_json;
  std::vector<std::string> oracle_args; // besides --ds-config, --out, --allocator
};

// The matrix: >= 32 configurations over ZeRO 0-3, offloads, checkpointing,
// fp32/bf16/fp16, world 1/2/4 and emulated ranks, micro-batches, sequence
// lengths, eager/SDPA, tied/untied embeddings; four at hidden 1024 and
// sequence >= 1024.
std::vector<AccuracyCase> AccuracyMatrix();

// A case trained by real DeepSpeed: the transformers config (a path under
// the workspace), the ds_config JSON, ranks, sequence length, attention
// implementation ("sdpa" or "eager") and activation checkpointing.
AccuracyCase DeepSpeedCase(std::string name, const std::string& hf_config, std::string ds_config_json, int world,
                           int seq, const std::string& attention = "sdpa", bool checkpointing = false);

// `c` (a vision-language config) with images at the start of every
// sequence, the parts that do not train (a comma list; "" none) and the
// images' side in pixels (0: the tower's own), given to zplan and to the
// oracle alike.
AccuracyCase WithImages(AccuracyCase c, int images_per_sample, const std::string& freeze, int image_size = 0);

// `c` with LoRA adapters from a PEFT adapter_config.json (a path under the
// workspace), given to zplan and to the oracle alike.
AccuracyCase WithLora(AccuracyCase c, const std::string& adapter_config);

// `c` (a DeepSpeed case) as one process that is rank `rank` of its world, on
// torch's fake process group (the oracle's --emulate-rank); named
// "<name>-emulated-<rank>of<world>".
AccuracyCase Emulated(AccuracyCase c, int rank);

// `c` with Liger's fused linear cross-entropy (zplan and the oracle's --loss liger-fused).
AccuracyCase WithFusedLoss(AccuracyCase c);

// `c` (checkpointed) with transformers' activation_checkpointing_enable
// arguments: every `every`-th block, inputs offloaded or not.
AccuracyCase WithCheckpointing(AccuracyCase c, int every, bool offload);

// `c` (checkpointed) through deepspeed.checkpointing.checkpoint, configured by
// this activation_checkpointing block (the JSON object's members).
AccuracyCase WithDeepSpeedCheckpointing(AccuracyCase c, const std::string& block);

// The DeepSpeed agreement matrix: stages 0-3, offloads, checkpointing,
// fp32/bf16, SDPA/eager, world 1, 2 and 4, default and small buckets, the
// stage-3 knobs, the optimizer implementations, every supported family and
// vision-language type (with images, frozen parts), LoRA (peft) on frozen models.
std::vector<AccuracyCase> DeepSpeedMatrix();

struct RankMeasurement {
  int rank = 0;
  MemoryBreakdown device;  // per component at the peak (counting allocator)
  int64_t host_hwm_bytes = 0;
};

struct AccuracyRow {
  AccuracyCase config;
  Plan plan;
  std::string framework;          // what trained: "zrun" or the Report's framework
  std::vector<double> losses;     // rank 0's, per optimizer step
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
  // DeepSpeed cases: the Python with deepspeed + transformers (tools/setup.sh's
  // .venv), tools/deepspeed_oracle.py and libzplan_counting_allocator.so.
  std::string python_path, oracle_path, allocator_path;
  std::string work_dir;   // plans, reports and logs, one folder per case
  // Recordings (tools/recordings.h): the folder that holds tests/recordings/
  // and the files cases name, and the producers' source digests.
  std::string root = ".";
  std::string zrun_digest_path, oracle_digest_path;
  int steps = 3;
  std::function<void(const AccuracyRow&)> on_row;  // progress, optional
};

// Options whose tool paths are the runfiles of the calling binary or test
// (relative to its working directory), writing into `work_dir`.
AccuracyOptions RunfilesAccuracyOptions(std::string work_dir);

// fork/exec `argv` (in `dir` when given) with stdout and stderr to `log`;
// the exit code (128 + the signal when it was killed).
absl::StatusOr<int> RunLogged(const std::vector<std::string>& argv, const std::string& log,
                              const std::string& dir = "");

inline bool IsDeepSpeed(const AccuracyCase& c) { return !c.ds_config_json.empty(); }

// The three steps of a row, for callers that measure once and judge many
// times (tools/recordings.h). A case's folder under options.work_dir:
std::string CaseDir(const AccuracyCase& c, const AccuracyOptions& options, int index);
// zplan writes dir/plan.pb (and dir/ds_config.json for a DeepSpeed case).
absl::StatusOr<Plan> PlanCase(const AccuracyCase& c, const AccuracyOptions& options, const std::string& dir);
// zrun or the DeepSpeed oracle trains dir/plan.pb's case: its Report.
absl::StatusOr<Report> MeasureCase(const AccuracyCase& c, const AccuracyOptions& options, const std::string& dir);
// A plan whose memory follows the routing (the eager experts): each rank
// that measured one (RankReport.routing) planned again on it (zplan
// --routing), its device breakdown taking the place of `plan`'s; other
// plans come back as they are.
absl::StatusOr<Plan> PlanOnMeasuredRouting(const AccuracyCase& c, const AccuracyOptions& options,
                                           const std::string& dir, Plan plan, const Report& report);
// The plan judged against a measurement of it.
absl::StatusOr<AccuracyRow> JudgeRow(const AccuracyCase& c, Plan plan, const Report& report);

// Runs every case; an error names the case and its log.
absl::StatusOr<std::vector<AccuracyRow>> RunAccuracyMatrix(const std::vector<AccuracyCase>& matrix,
                                                          const AccuracyOptions& options);

// docs/accuracy.md. On one machine everything above the "## Host" heading is
// deterministic (exact byte counts); across machines the device peaks are
// too, but how a peak splits into components is not (which temporaries exist
// at that moment depends on the CPU's kernels); the host section varies from
// run to run.
std::string AccuracyMarkdown(const std::vector<AccuracyRow>& rows);
// docs/deepspeed_agreement.md (device only).
std::string DeepSpeedAgreementMarkdown(const std::vector<AccuracyRow>& rows);
inline constexpr char kComponentSectionHeading[] = "## Per component at the peak";
inline constexpr char kHostSectionHeading[] = "## Host";
// How far a component's bytes at the peak may move between machines, as a
// fraction of its row's bytes: an Intel and an AMD VM split row 28's peak
// 0.07% apart (docs/accuracy.md); 1% still catches a changed model.
inline constexpr double kComponentSplitTolerance = 0.01;

}  // namespace zplan

#endif  // ZPLAN_TOOLS_ACCURACY_H_
