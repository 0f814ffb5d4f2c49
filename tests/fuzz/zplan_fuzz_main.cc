// zplan_fuzz: the long run of tests/fuzz's mutation fuzzer (zplan_fuzz.h).
// Flags -> FuzzOptions -> RunFuzzer -> one line of figures; exit 0 when no
// input crashed or hung (a finding ends the process with the input saved).
//   bazel run //tests/fuzz:zplan_fuzz -- --runs 10000000 --seed 7 --out-dir /tmp/fuzz
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "planner/cli.h"
#include "tests/fuzz/zplan_fuzz.h"

ABSL_FLAG(int64_t, runs, 1'000'000, "inputs to run");
ABSL_FLAG(uint64_t, seed, 1, "mutation seed (the same seed runs the same inputs)");
ABSL_FLAG(double, seconds_per_input, 10, "an input using more CPU time is a hang (seconds)");
ABSL_FLAG(std::string, out_dir, ".", "directory for crash-N / hang-N inputs");

constexpr char kUsage[] = "zplan_fuzz [--runs N] [--seed S] [--out-dir DIR]";

int main(int argc, char** argv) {
  if (const char* dir = std::getenv("BUILD_WORKSPACE_DIRECTORY"); dir != nullptr && chdir(dir) != 0) return 1;
  zplan::CommandLine cl;
  if (const std::optional<int> code = zplan::HandleCommandLine(argc, argv, "zplan_fuzz", kUsage, __FILE__, &cl)) {
    return *code;
  }
  zplan::FuzzOptions o;
  o.runs = absl::GetFlag(FLAGS_runs);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.seconds_per_input = absl::GetFlag(FLAGS_seconds_per_input);
  o.out_dir = absl::GetFlag(FLAGS_out_dir);
  o.corpus_dirs = {{zplan::kHfConfig, "configs/hf"},        {zplan::kHfConfig, "configs/hf/tiny"},
                   {zplan::kDsConfig, "configs/ds"},        {zplan::kModelSpecText, "configs/models"},
                   {zplan::kFlags, "tests/fuzz/corpus/flags"},   {zplan::kLoraConfig, "configs/peft"}};
  const absl::StatusOr<zplan::FuzzStats> stats = zplan::RunFuzzer(o);
  if (!stats.ok()) {
    std::cerr << "zplan_fuzz: " << stats.status().message() << "\n";
    return zplan::ExitCodeFor(stats.status());
  }
  std::cout << absl::StrFormat(
      "zplan_fuzz: %d executions (%d accepted), 0 crashes, 0 hangs, %.0f s, %.0f exec/s, seed %d, corpus %d\n",
      stats->executions, stats->accepted, stats->seconds, stats->executions / stats->seconds, o.seed,
      stats->corpus_size);
  return zplan::kExitOk;
}
