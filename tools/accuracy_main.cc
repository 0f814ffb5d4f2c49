// accuracy: runs an agreement matrix (tools/accuracy.h) and writes its
// document (--out) or prints it: --matrix zrun (docs/accuracy.md) or
// --matrix deepspeed (docs/deepspeed_agreement.md). Exit 1 when a
// configuration misses a goal.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "planner/proto_io.h"
#include "tools/accuracy.h"

ABSL_FLAG(std::string, out, "", "write the report here (atomically) instead of stdout");
ABSL_FLAG(std::string, work_dir, "", "plans, reports and logs (default: a new folder under /tmp)");
ABSL_FLAG(int, steps, 3, "training steps per configuration");
ABSL_FLAG(std::string, matrix, "zrun", "zrun (planner vs zrun) or deepspeed (planner vs real DeepSpeed)");
ABSL_FLAG(std::string, only, "", "run only the cases whose name contains this");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Under `bazel run` the binaries are runfiles relative to the start folder.
  zplan::AccuracyOptions o = zplan::RunfilesAccuracyOptions(absl::GetFlag(FLAGS_work_dir));
  const std::string matrix_name = absl::GetFlag(FLAGS_matrix);
  if (matrix_name != "zrun" && matrix_name != "deepspeed") {
    std::cerr << "accuracy: --matrix must be zrun or deepspeed, not " << matrix_name << "\n";
    return 2;
  }
  const bool deepspeed = matrix_name == "deepspeed";
  std::vector<zplan::AccuracyCase> matrix;
  for (zplan::AccuracyCase& c : deepspeed ? zplan::DeepSpeedMatrix() : zplan::AccuracyMatrix()) {
    if (c.name.find(absl::GetFlag(FLAGS_only)) != std::string::npos) matrix.push_back(std::move(c));
  }
  o.steps = absl::GetFlag(FLAGS_steps);
  if (o.work_dir.empty()) {
    char pattern[] = "/tmp/zplan-accuracy-XXXXXX";
    if (mkdtemp(pattern) == nullptr) return 1;
    o.work_dir = pattern;
  }
  int failed = 0;
  o.on_row = [&failed](const zplan::AccuracyRow& row) {
    failed += !row.device_ok || !row.host_ok;
    std::cerr << absl::StrFormat("%-45s device %+.2f%%%s\n", row.config.name, 100 * row.device_error,
                                 row.device_ok && row.host_ok ? "" : "  MISSES A GOAL");
  };
  auto rows = zplan::RunAccuracyMatrix(matrix, o);
  if (!rows.ok()) {
    std::cerr << "accuracy: " << rows.status().message() << "\n";
    return 1;
  }
  const std::string markdown = deepspeed ? zplan::DeepSpeedAgreementMarkdown(*rows) : zplan::AccuracyMarkdown(*rows);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cout << markdown;
  } else {
    const std::string path = std::filesystem::path(out).is_absolute() || std::getenv("BUILD_WORKSPACE_DIRECTORY") == nullptr
                                 ? out
                                 : std::string(std::getenv("BUILD_WORKSPACE_DIRECTORY")) + "/" + out;
    if (absl::Status s = zplan::WriteFileAtomically(path, markdown); !s.ok()) {
      std::cerr << "accuracy: " << s.message() << "\n";
      return 1;
    }
  }
  std::cerr << "work folder: " << o.work_dir << "\n";
  return failed == 0 ? 0 : 1;
}
