// zrun: trains a plan for real and compares measured memory with it.
// Flags -> ZrunOptions -> RunZrun -> exit code (zrun_command.h).
#include <unistd.h>

#include <climits>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "executor/counting_allocator.h"
#include "executor/zrun_command.h"
#include "planner/cli.h"

ABSL_FLAG(std::string, report, "report.pb", "where rank 0 writes the Report (.pb, .textproto or .json)");
ABSL_FLAG(int64_t, steps, 0, "optimizer steps, step 0 a warm-up (default 0: the plan's train_steps)");
ABSL_FLAG(std::string, data, "", "file of uint16 token ids (default: deterministic synthetic tokens)");
ABSL_FLAG(int, emulate_rank, -1, "run as this rank of the plan's world, without communication (default -1: off)");
ABSL_FLAG(std::string, save_dir, "", "write per-rank checkpoint shards and a `latest` marker in this directory");
ABSL_FLAG(int64_t, save_every, 0, "optimizer steps between checkpoints (default 0: only after the last step)");
ABSL_FLAG(std::string, resume, "", "resume from the `latest` checkpoint in this directory");
ABSL_FLAG(int64_t, stop_after, 0, "stop (and checkpoint) after this step; the schedule still spans --steps (default 0: off)");
ABSL_FLAG(std::string, profile_dir, "",
          "write rank-R.trace.json per rank: a Kineto trace of one steady-state step (chrome://tracing, Perfetto)");
ABSL_FLAG(std::string, memory_snapshot_dir, "",
          "write rank-R.memory.pickle per CUDA rank: the caching allocator's history (pytorch.org/memory_viz)");
ABSL_FLAG(double, timeout, 120, "seconds a collective or the rendezvous may wait for a peer (default 120)");

constexpr char kUsage[] = "zrun plan.pb [--steps N] [--report report.pb] [--emulate-rank R]";

int main(int argc, char** argv) {
  // Before any tensor exists, so every CPU tensor byte is counted.
  zplan::InstallCountingCpuAllocator();
  zplan::CommandLine cl;
  if (const std::optional<int> code = zplan::HandleCommandLine(argc, argv, "zrun", kUsage, __FILE__, &cl)) {
    return *code;
  }
  if (cl.positional.size() != 1) {
    std::cerr << "zrun: give exactly one plan file, e.g. zrun plan.pb (--help lists the flags)\n";
    return zplan::kExitBadInput;
  }
  zplan::ZrunOptions o;
  o.plan_path = cl.positional[0];
  o.report_path = absl::GetFlag(FLAGS_report);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.data_path = absl::GetFlag(FLAGS_data);
  o.emulate_rank = absl::GetFlag(FLAGS_emulate_rank);
  o.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  o.save_dir = absl::GetFlag(FLAGS_save_dir);
  o.save_every = absl::GetFlag(FLAGS_save_every);
  o.resume_dir = absl::GetFlag(FLAGS_resume);
  o.stop_after = absl::GetFlag(FLAGS_stop_after);
  o.profile_dir = absl::GetFlag(FLAGS_profile_dir);
  o.memory_snapshot_dir = absl::GetFlag(FLAGS_memory_snapshot_dir);
  char self[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  o.self_path = n > 0 ? std::string(self, static_cast<size_t>(n)) : argv[0];
  return zplan::RunZrun(o, std::cout, std::cerr);
}
