#include "executor/zrun_command.h"

#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <cstring>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "executor/collectives.h"
#include "executor/device_memory.h"
#include "executor/trainer.h"
#include "planner/limits.h"
#include "planner/memory_model.h"
#include "planner/plan_builder.h"
#include "planner/proto_io.h"
#include "planner/run_config.h"
#include "planner/status_macros.h"
#include "planner/units.h"

namespace zplan {
namespace {

std::vector<pid_t>* g_children = nullptr;  // for forwarding Ctrl-C

// Ctrl-C or SIGTERM on the launcher ends every rank (SIGTERM, which a rank
// never ignores; SIGINT may be ignored when the job was started in the background).
void ForwardSignal(int /*signal*/) {
  if (g_children == nullptr) return;
  for (pid_t pid : *g_children) kill(pid, SIGTERM);
}

// NCCL when every local rank has its own GPU; Gloo for CPU ranks and for
// several processes sharing one GPU (NCCL refuses two ranks on one device).
CollectiveBackend RealBackend(const Plan& plan, const RankInfo& info) {
  if (plan.gpu().key() == "cpu") return CollectiveBackend::kGloo;
  return info.local_world_size <= CudaDeviceCount() ? CollectiveBackend::kNccl : CollectiveBackend::kGloo;
}

// Rank 0: every rank's report in, verdict and outputs out.
int FinishAsRankZero(const Plan& plan, const ZrunOptions& options, const std::string& backend,
                     const std::vector<std::string>& serialized, std::ostream& out, std::ostream& err) {
  Report report;
  report.set_plan_path(options.plan_path);
  report.set_backend(backend);
  report.set_device(plan.gpu().key() == "cpu" ? "cpu" : plan.gpu().name());
  for (const std::string& bytes : serialized) {
    if (!report.add_ranks()->ParseFromString(bytes)) {
      err << "zrun: a rank sent an unreadable report\n";
      return kExitError;
    }
  }
  JudgeReport(plan, &report);
  if (absl::Status s = WriteProtoFile(options.report_path, report); !s.ok()) {
    err << "zrun: " << s.message() << "\n";
    return kExitError;
  }
  out << FormatReport(plan, report);
  return report.passed() ? kExitOk : kExitBudget;
}

int RunRank(const Plan& plan, const RankInfo& info, CollectiveBackend backend, const ZrunOptions& options,
            std::ostream& out, std::ostream& err) {
  // The GPU first: ProcessGroupNCCL binds its communicators to the current device.
  const absl::StatusOr<at::Device> device = SelectDevice(plan.gpu().key() != "cpu", info.local_rank);
  if (!device.ok()) {
    err << "zrun rank " << info.rank << ": " << device.status().message() << "\n";
    return ExitCodeFor(device.status());
  }
  // Local ranks beyond the device count share GPUs round robin (SelectDevice).
  if (const int count = CudaDeviceCount(); device->is_cuda() && count > 0 && backend != CollectiveBackend::kEmulated) {
    const int sharing = (info.local_world_size - info.local_rank % count + count - 1) / count;
    if (absl::Status s = CheckSharedDevice(*device, sharing, plan.device_per_rank().peak_bytes()); !s.ok()) {
      if (info.local_rank < count) err << "zrun: " << s.message() << "\n";  // once per device
      return ExitCodeFor(s);
    }
  }
  auto comm = CreateCollectives(info, backend, absl::Seconds(options.timeout_seconds));
  if (!comm.ok()) {
    err << "zrun rank " << info.rank << ": " << comm.status().message() << "\n";
    return kExitError;
  }
  const bool reports_progress = info.rank == 0 || backend == CollectiveBackend::kEmulated;
  auto report = TrainRank(plan, comm->get(),
                          {options.steps, options.data_path, options.save_dir, options.save_every, options.resume_dir,
                           options.stop_after, info.local_rank, reports_progress ? &err : nullptr,
                           options.profile_dir, options.memory_snapshot_dir});
  if (!report.ok()) {
    err << "zrun rank " << info.rank << ": " << report.status().message() << "\n";
    return ExitCodeFor(report.status());
  }
  auto gathered = (*comm)->GatherToRankZero("reports", report->SerializeAsString());
  if (!gathered.ok()) {
    err << "zrun rank " << info.rank << ": " << gathered.status().message() << "\n";
    return kExitError;
  }
  if (info.rank != 0 && backend != CollectiveBackend::kEmulated) return kExitOk;
  return FinishAsRankZero(plan, options, (*comm)->name(), *gathered, out, err);
}

// How a rank ended, from waitpid's status: "exited with code 1", "was killed
// by signal 9 (Killed)". A SIGABRT says what aborts ranks on GPUs: NCCL's
// watchdog takes a rank down when one of its collectives failed or timed out
// (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, collectives.h), after logging which.
std::string DescribeExit(int status) {
  if (!WIFSIGNALED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  const int signal_number = WTERMSIG(status);
  std::string out = absl::StrCat("was killed by signal ", signal_number, " (", strsignal(signal_number), ")");
  if (signal_number == SIGABRT) {
    absl::StrAppend(&out, ": on NCCL, the watchdog aborts a rank whose collective failed or timed out "
                          "(a peer died, or --timeout passed); its log above names the collective");
  }
  return out;
}

// Starts one process per rank and waits; the first failure stops the rest.
int SpawnRanks(const Plan& plan, const ZrunOptions& options, const std::vector<std::string>& argv,
               std::ostream& err) {
  const int world = static_cast<int>(WorldSize(plan.config()));
  auto port = FindFreePort();
  if (!port.ok()) {
    err << "zrun: " << port.status().message() << "\n";
    return kExitError;
  }
  std::vector<pid_t> children;
  std::map<pid_t, int> rank_of;
  const pid_t launcher = getpid();
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      err << "zrun: fork failed\n";
      ForwardSignal(SIGTERM);
      return kExitError;
    }
    if (pid == 0) {
      // A rank outlives a launcher killed with SIGKILL (a CI timeout) unless
      // the kernel tells it; and the launcher may already be gone.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(kExitError);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(*port).c_str(), 1);
      // torchrun's default for several processes on a node (torch/distributed/run.py: "Setting
      // OMP_NUM_THREADS environment variable for each process to be 1 in default"): ranks sharing
      // the cores do not oversubscribe them (the DeepSpeed oracle's CPU ranks run so too).
      if (world > 1) setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(options.self_path.c_str(), args.data());
      _exit(127);
    }
    children.push_back(pid);
    rank_of[pid] = r;
  }
  g_children = &children;
  signal(SIGINT, ForwardSignal);
  signal(SIGTERM, ForwardSignal);
  int rank0_code = kExitError;
  int first_failure = 0;
  for (int remaining = world; remaining > 0; --remaining) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    const int rank = rank_of[pid];
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rank == 0) rank0_code = code;
    const bool verdict = rank == 0 && (code == kExitOk || code == kExitBudget);
    if (code != kExitOk && !verdict && first_failure == 0) {
      first_failure = code;
      err << "zrun: rank " << rank << " " << DescribeExit(status) << "; stopping the other ranks\n";
      ForwardSignal(SIGTERM);
    }
  }
  g_children = nullptr;
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (first_failure != 0) return first_failure == kExitBadInput ? kExitBadInput : kExitError;
  return rank0_code;
}

}  // namespace

namespace {

// A week for one collective is a typo, not a wait (steps: limits.h).
constexpr double kMinTimeoutSeconds = 0.001;  // c10d takes milliseconds
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

absl::Status FlagError(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

absl::Status CheckStepCount(absl::string_view flag, int64_t value, absl::string_view meaning) {
  return CheckRange(absl::StrCat("--", flag), value, 0, kMaxTrainSteps, meaning);
}

}  // namespace

absl::Status ValidateZrunOptions(const ZrunOptions& o) {
  ZPLAN_RETURN_IF_ERROR(CheckStepCount("steps", o.steps, "optimizer steps; 0 = the plan's train_steps"));
  ZPLAN_RETURN_IF_ERROR(CheckStepCount("save-every", o.save_every, "steps between checkpoints; 0 = at the end"));
  ZPLAN_RETURN_IF_ERROR(CheckStepCount("stop-after", o.stop_after, "the last step to run; 0 = all"));
  if (o.emulate_rank < -1) {
    return FlagError("emulate-rank", absl::StrCat(o.emulate_rank, " is not a rank; give 0 .. world size - 1"));
  }
  if (!(o.timeout_seconds >= kMinTimeoutSeconds && o.timeout_seconds <= kMaxTimeoutSeconds)) {
    return FlagError("timeout", absl::StrCat(o.timeout_seconds, " is not a wait in seconds; give ", kMinTimeoutSeconds,
                                             " .. ", kMaxTimeoutSeconds, ", e.g. 120"));
  }
  if (!o.data_path.empty() && access(o.data_path.c_str(), R_OK) != 0) {
    return FlagError("data", absl::StrCat("cannot read ", o.data_path, ": ", std::strerror(errno)));
  }
  if (!o.resume_dir.empty() && access((o.resume_dir + "/latest").c_str(), R_OK) != 0) {
    return FlagError("resume", absl::StrCat(o.resume_dir, " has no readable `latest` checkpoint marker; give the "
                                            "directory that --save-dir wrote"));
  }
  if (absl::Status s = CheckWritable(o.report_path); !s.ok()) return FlagError("report", s.message());
  // Output directories: created now, and a file of each probed.
  struct OutputDir {
    const char* flag;
    const std::string& dir;
    const char* probe;
  };
  for (const OutputDir& d : {OutputDir{"save-dir", o.save_dir, "/latest"}, OutputDir{"profile-dir", o.profile_dir, "/rank-0"},
                             OutputDir{"memory-snapshot-dir", o.memory_snapshot_dir, "/rank-0"}}) {
    if (d.dir.empty()) continue;
    std::error_code error;
    std::filesystem::create_directories(d.dir, error);
    if (error) return FlagError(d.flag, absl::StrCat("cannot create ", d.dir, ": ", error.message()));
    if (absl::Status s = CheckWritable(d.dir + d.probe); !s.ok()) return FlagError(d.flag, s.message());
  }
  return absl::OkStatus();
}

namespace {

// Measured bytes that count against a device budget: tensors at the peak
// plus, on CUDA, the allocator's band and memory outside it.
int64_t MeasuredDeviceBytes(const MemoryBreakdown& measured) {
  return measured.peak_bytes() + measured.allocator_bytes() + measured.runtime_bytes();
}

// Growth below this share of the planned tensors is noise (a loss scalar).
constexpr double kNegligibleGrowthFraction = 0.001;

// "activations +1.5 MiB (4.0 MiB measured vs 2.5 MiB planned)" for the
// component that grew most over the plan; empty when none is attributed
// (CUDA ranks) or none grew more than negligibly.
std::string LargestGrowth(const MemoryBreakdown& planned, const MemoryBreakdown& measured) {
  if (LiveTensorBytes(measured) == 0) return "";
  const std::vector<NamedBytes> p = TensorComponents(planned), m = TensorComponents(measured);
  size_t worst = 0;
  for (size_t i = 1; i < p.size(); ++i) {
    if (m[i].bytes - p[i].bytes > m[worst].bytes - p[worst].bytes) worst = i;
  }
  if (m[worst].bytes - p[worst].bytes <= kNegligibleGrowthFraction * LiveTensorBytes(planned)) return "";
  return absl::StrFormat("%s +%s (%s measured vs %s planned)", p[worst].name,
                         FormatBytes(m[worst].bytes - p[worst].bytes), FormatBytes(m[worst].bytes),
                         FormatBytes(p[worst].bytes));
}

std::string ErrorPercent(int64_t planned, int64_t measured) {
  if (planned == 0) return measured == 0 ? "" : "(unplanned)";
  return absl::StrFormat("%+.2f%%", 100.0 * (measured - planned) / planned);
}

}  // namespace

void JudgeReport(const Plan& plan, Report* report) {
  const double tolerance = plan.budget().tolerance();
  const int64_t device_budget = plan.budget().device_bytes_per_rank();
  bool passed = true;
  for (const RankReport& rank : report->ranks()) {
    const MemoryBreakdown& planned = PlannedDevice(plan, rank.rank());
    // Tensor bytes: the planned peak without runtime and allocator cache, vs
    // the measured peak allocated (exact on CPU ranks).
    const int64_t predicted = LiveTensorBytes(planned);
    const int64_t measured = rank.measured_device().peak_bytes();
    const double error = predicted > 0 ? static_cast<double>(measured - predicted) / predicted : 0;
    const std::string growth = LargestGrowth(planned, rank.measured_device());
    const std::string grew = growth.empty() ? "" : absl::StrCat("; grew most: ", growth);
    if (tolerance > 0 && std::fabs(error) > tolerance) {
      passed = false;
      report->add_failures(absl::StrFormat("rank %d: peak %s measured vs %s planned (%+.1f%%, tolerance %.1f%%)%s",
                                           rank.rank(), FormatBytes(measured), FormatBytes(predicted), 100 * error,
                                           100 * tolerance, grew));
    }
    // Building the model is a bound, not a prediction (the plan counts host
    // and device together; CUDA ranks measure the device only).
    const int64_t construction_planned = plan.construction_peak_bytes_per_rank();
    if (construction_planned > 0 && rank.construction_peak_bytes() > construction_planned * (1 + tolerance)) {
      passed = false;
      report->add_failures(absl::StrFormat("rank %d: building the model took %s, the plan allows %s", rank.rank(),
                                           FormatBytes(rank.construction_peak_bytes()),
                                           FormatBytes(construction_planned)));
    }
    const int64_t used = MeasuredDeviceBytes(rank.measured_device());
    if (device_budget > 0 && used > device_budget) {
      passed = false;
      report->add_failures(absl::StrFormat(
          "rank %d: %s measured exceeds the budget %s%s", rank.rank(), FormatBytes(used), FormatBytes(device_budget),
          growth.empty() ? absl::StrCat("; as planned (", FormatBytes(planned.peak_bytes()),
                                        "): re-plan to fit or raise the budget")
                         : grew));
    }
  }
  report->set_passed(passed);
}

std::string FormatReport(const Plan& plan, const Report& report) {
  std::string out = absl::StrFormat("zrun: %s, %d rank(s) over %s, ZeRO-%d\n\n", plan.model().name(),
                                    report.ranks_size(), report.backend(), plan.config().zero().stage());
  // Per component at the peak: planned, then each rank's measurement (CPU
  // ranks attribute every byte; CUDA ranks measure the total only).
  const MemoryBreakdown& planned = plan.device_per_rank();
  constexpr int kMaxRankColumns = 8;
  const int columns = std::min(report.ranks_size(), kMaxRankColumns);
  absl::StrAppend(&out, absl::StrFormat("%-18s  %12s", "component", "planned"));
  for (int r = 0; r < columns; ++r) {
    absl::StrAppend(&out, absl::StrFormat("  %12s %9s", absl::StrCat("rank ", report.ranks(r).rank()), "error"));
  }
  absl::StrAppend(&out, "\n");
  const std::vector<NamedBytes> planned_components = TensorComponents(planned);
  const bool attributed = columns > 0 && LiveTensorBytes(report.ranks(0).measured_device()) > 0;
  for (size_t i = 0; attributed && i < planned_components.size(); ++i) {
    absl::StrAppend(&out, absl::StrFormat("%-18s  %12s", planned_components[i].name,
                                          FormatBytes(planned_components[i].bytes)));
    for (int r = 0; r < columns; ++r) {
      const RankReport& rank = report.ranks(r);
      const int64_t measured = TensorComponents(rank.measured_device())[i].bytes;
      absl::StrAppend(&out, absl::StrFormat("  %12s %9s", FormatBytes(measured),
                                            ErrorPercent(TensorComponents(PlannedDevice(plan, rank.rank()))[i].bytes,
                                                         measured)));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-18s  %12s", "tensors at peak", FormatBytes(LiveTensorBytes(planned))));
  for (int r = 0; r < columns; ++r) {
    const int64_t measured = report.ranks(r).measured_device().peak_bytes();
    absl::StrAppend(&out, absl::StrFormat(
                              "  %12s %9s", FormatBytes(measured),
                              ErrorPercent(LiveTensorBytes(PlannedDevice(plan, report.ranks(r).rank())), measured)));
  }
  absl::StrAppend(&out, "\n\n");
  absl::StrAppend(&out, absl::StrFormat("%-5s  %14s  %14s  %10s  %10s  %6s\n", "rank", "device total", "host VmHWM",
                                        "step s", "tokens/s", "MFU"));
  for (const RankReport& rank : report.ranks()) {
    const double mfu = rank.model_flops_utilization();
    absl::StrAppend(&out, absl::StrFormat("%-5d  %14s  %14s  %10.3f  %10.0f  %6s\n", rank.rank(),
                                          FormatBytes(MeasuredDeviceBytes(rank.measured_device())),
                                          FormatBytes(rank.measured_host().peak_bytes()), rank.mean_step_seconds(),
                                          rank.tokens_per_second(),
                                          mfu > 0 ? absl::StrFormat("%.1f%%", 100 * mfu) : "-"));
  }
  if (plan.construction_peak_bytes_per_rank() > 0) {
    int64_t built = 0;
    for (const RankReport& rank : report.ranks()) built = std::max(built, rank.construction_peak_bytes());
    absl::StrAppend(&out, absl::StrFormat("\nbuilding the model: %s at most (planned %s)\n", FormatBytes(built),
                                          FormatBytes(plan.construction_peak_bytes_per_rank())));
  }
  // Page-locked host memory (CUDA ranks with offload), as the CachingHostAllocator holds it.
  int64_t pinned_planned = 0, pinned_measured = 0;
  for (const RankPlan& rank : plan.ranks()) pinned_planned = std::max(pinned_planned, rank.host().pinned_bytes());
  for (const RankReport& rank : report.ranks()) {
    pinned_measured = std::max(pinned_measured, rank.measured_host().pinned_bytes());
  }
  if (pinned_planned > 0 || pinned_measured > 0) {
    absl::StrAppend(&out, absl::StrFormat("pinned host memory: %s at most (planned %s)\n", FormatBytes(pinned_measured),
                                          FormatBytes(pinned_planned)));
  }
  if (!report.ranks().empty()) {
    absl::StrAppend(&out, "\nlosses:");
    for (double loss : report.ranks(0).losses()) absl::StrAppend(&out, absl::StrFormat(" %.4f", loss));
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, report.passed() ? "verdict: pass\n" : "verdict: FAIL\n");
  for (const std::string& failure : report.failures()) absl::StrAppend(&out, "  ", failure, "\n");
  return out;
}

// glibc serves blocks under its mmap threshold from heaps it rarely returns,
// and raises that threshold (up to 32 MiB) as large blocks are freed, so a
// tensor freed in backward can hold host RAM that the next allocation of
// another size does not reuse: VmHWM then exceeds every moment's live tensors
// by hundreds of MiB (docs/accuracy.md, #37). A fixed 1 MiB threshold maps
// every larger tensor on its own, so host RSS follows the live tensors the
// plan counts; smaller blocks keep glibc's heaps. The counting allocator
// keeps freed ones for reuse within the live high-water mark plus 64 MiB,
// so a step does not map its transients anew (counting_allocator.h).
constexpr int kMmapThresholdBytes = 1 << 20;

// zrun trains transformers' torch fallbacks only (executor/linear_attention.h): LibTorch cannot run
// fla's Triton kernels or causal-conv1d's CUDA extension.
absl::Status RefuseFusedKernels(const ModelSpec& model) {
  if (model.linear_attention_impl() == LINEAR_ATTENTION_FLA) {
    return absl::InvalidArgumentError(
        "model.linear_attention_impl: LINEAR_ATTENTION_FLA (fla's Triton kernels) cannot run under LibTorch; zrun "
        "trains transformers' torch fallback: plan without --kernels fla");
  }
  if (model.short_conv_impl() == SHORT_CONV_CAUSAL_CONV1D) {
    return absl::InvalidArgumentError(
        "model.short_conv_impl: SHORT_CONV_CAUSAL_CONV1D (causal-conv1d's CUDA extension) cannot run under "
        "LibTorch; zrun trains transformers' torch fallback: plan without --kernels causal_conv1d");
  }
  return absl::OkStatus();
}

int RunZrun(const ZrunOptions& options, std::ostream& out, std::ostream& err) {
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  // Blocks of 2 MiB or more 2 MiB-aligned and madvise(MADV_HUGEPAGE)
  // (c10/core/impl/alloc_cpu.cpp, is_thp_alloc_enabled; read once, at the
  // first CPU allocation; the ranks inherit it). A step's large transients
  // that no kept block fits (hidden 1024: 180,000 page faults a step) then
  // fault in 2 MiB at a time: step 0.85 -> 0.76 s, the same host peak.
  // A user's own setting wins.
  setenv("THP_MEM_ALLOC_ENABLE", "1", /*overwrite=*/0);
  Plan plan;
  absl::Status status = ValidateZrunOptions(options);
  if (status.ok()) status = ReadProtoFile(options.plan_path, &plan);
  if (status.ok()) status = ValidatePlan(plan, options.plan_path);
  if (status.ok()) status = RefuseFusedKernels(plan.model());
  if (!status.ok()) {
    err << "zrun: " << status.message() << "\n";
    return kExitBadInput;
  }
  const int world = static_cast<int>(WorldSize(plan.config()));
  // ValidatePlan refused a model_type without a family unless the plan says it
  // is an unvalidated approximation; that line is printed once per run (by
  // rank 0, in-process or launched, or the emulated rank), then it trains.
  const std::string& approximation = plan.model().unvalidated_approximation();
  auto announce = [&] {
    if (!approximation.empty()) out << approximation << "\n" << std::flush;
  };
  if (options.emulate_rank >= 0) {
    if (options.emulate_rank >= world) {
      err << "zrun: --emulate-rank " << options.emulate_rank << " is outside the plan's world of " << world
          << " ranks\n";
      return kExitBadInput;
    }
    RankInfo info{options.emulate_rank, world, options.emulate_rank % static_cast<int>(plan.config().cluster().gpus_per_node()),
                  static_cast<int>(plan.config().cluster().gpus_per_node()), "127.0.0.1", 0};
    announce();
    return RunRank(plan, info, CollectiveBackend::kEmulated, options, out, err);
  }
  auto env = RankInfoFromEnvironment();
  if (!env.ok()) {
    err << "zrun: " << env.status().message() << "\n";
    return kExitBadInput;
  }
  if (env->has_value()) {
    const RankInfo& info = **env;
    if (info.world_size != world) {
      err << "zrun: WORLD_SIZE=" << info.world_size << " but the plan has " << world << " ranks ("
          << plan.config().cluster().num_nodes() << " node(s) x " << plan.config().cluster().gpus_per_node()
          << "); re-plan with zplan --gpus/--nodes or launch " << world << " ranks\n";
      return kExitBadInput;
    }
    if (info.rank == 0) announce();
    return RunRank(plan, info, RealBackend(plan, info), options, out, err);
  }
  if (world == 1) {
    announce();  // larger worlds: their rank 0, spawned below
    // Its own store on a free port, so concurrent single-rank runs never collide.
    RankInfo info;
    auto port = FindFreePort();
    if (!port.ok()) {
      err << "zrun: " << port.status().message() << "\n";
      return kExitError;
    }
    info.master_port = *port;
    return RunRank(plan, info, RealBackend(plan, info), options, out, err);
  }
  if (plan.config().cluster().num_nodes() > 1) {
    err << "zrun: the plan spans " << plan.config().cluster().num_nodes()
        << " nodes; start one zrun per rank with torchrun or srun (RANK/WORLD_SIZE/...), or use --emulate-rank\n";
    return kExitBadInput;
  }
  std::vector<std::string> argv = {options.self_path, options.plan_path, "--report=" + options.report_path,
                                   absl::StrCat("--steps=", options.steps),
                                   absl::StrCat("--timeout=", options.timeout_seconds)};
  if (!options.data_path.empty()) argv.push_back("--data=" + options.data_path);
  if (!options.save_dir.empty()) argv.push_back("--save_dir=" + options.save_dir);
  if (options.save_every > 0) argv.push_back(absl::StrCat("--save_every=", options.save_every));
  if (!options.resume_dir.empty()) argv.push_back("--resume=" + options.resume_dir);
  if (options.stop_after > 0) argv.push_back(absl::StrCat("--stop_after=", options.stop_after));
  if (!options.profile_dir.empty()) argv.push_back("--profile_dir=" + options.profile_dir);
  if (!options.memory_snapshot_dir.empty()) argv.push_back("--memory_snapshot_dir=" + options.memory_snapshot_dir);
  return SpawnRanks(plan, options, argv, err);
}

}  // namespace zplan
