// zrun: trains a plan for real and compares measured memory with it.
// Flags -> ZrunOptions -> RunZrun -> exit code (zrun_command.h).
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "executor/counting_allocator.h"
#include "executor/zrun_command.h"

ABSL_FLAG(std::string, report, "report.pb", "where rank 0 writes the Report (.pb, .textproto or .json)");
ABSL_FLAG(int64_t, steps, 0, "optimizer steps (default: the plan's train_steps); step 0 is a warm-up");
ABSL_FLAG(std::string, data, "", "uint16 token file; default: deterministic synthetic tokens");
ABSL_FLAG(int, emulate_rank, -1, "run as this rank of the plan's world, without communication");
ABSL_FLAG(std::string, save_dir, "", "write per-rank checkpoint shards and a `latest` marker here");
ABSL_FLAG(int64_t, save_every, 0, "steps between checkpoints (0: only after the last step)");
ABSL_FLAG(std::string, resume, "", "resume from the `latest` checkpoint in this directory");
ABSL_FLAG(int64_t, stop_after, 0, "stop (and checkpoint) after this step; the schedule still spans --steps");
ABSL_FLAG(double, timeout, 120, "seconds a collective or the rendezvous may wait for a peer");

int main(int argc, char** argv) {
  // Before any tensor exists, so every CPU tensor byte is counted.
  zplan::InstallCountingCpuAllocator();
  absl::SetProgramUsageMessage("zrun plan.pb [--steps N] [--report report.pb] [--emulate-rank R]");
  // Accept --save-dir as well as --save_dir (Abseil flags use underscores).
  static std::vector<std::string> normalized(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    std::string& arg = normalized[static_cast<size_t>(i)];
    if (arg.rfind("--", 0) == 0) {
      for (size_t c = 2; c < std::min(arg.find('='), arg.size()); ++c) {
        if (arg[c] == '-') arg[c] = '_';
      }
    }
    argv[i] = arg.data();
  }
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "zrun: give exactly one plan file, e.g. zrun plan.pb\n";
    return zplan::kExitBadInput;
  }
  zplan::ZrunOptions o;
  o.plan_path = args[1];
  o.report_path = absl::GetFlag(FLAGS_report);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.data_path = absl::GetFlag(FLAGS_data);
  o.emulate_rank = absl::GetFlag(FLAGS_emulate_rank);
  o.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  o.save_dir = absl::GetFlag(FLAGS_save_dir);
  o.save_every = absl::GetFlag(FLAGS_save_every);
  o.resume_dir = absl::GetFlag(FLAGS_resume);
  o.stop_after = absl::GetFlag(FLAGS_stop_after);
  char self[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  o.self_path = n > 0 ? std::string(self, static_cast<size_t>(n)) : argv[0];
  return zplan::RunZrun(o, std::cout, std::cerr);
}
