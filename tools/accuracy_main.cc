// accuracy: records the agreement suites' measurements and generates their
// documents from the recordings (tools/recordings.h).
//   --record zrun|deepspeed   measures the suite's stale rows (or --cases),
//                             writes their recordings under tests/recordings/
//                             as each finishes, then regenerates the suite's
//                             document once no row is stale
//   --docs                    regenerates both documents from the recordings
// Exit 1 when a row misses a goal, is stale, or cannot be measured.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"
#include "tools/accuracy.h"
#include "tools/recordings.h"

ABSL_FLAG(std::string, record, "", "zrun or deepspeed: measure the suite's stale rows and record them");
ABSL_FLAG(std::string, cases, "stale",
          "with --record: stale (missing or stale recordings), all, or case names separated by commas");
ABSL_FLAG(bool, docs, false, "regenerate docs/accuracy.md and docs/deepspeed_agreement.md from the recordings");
ABSL_FLAG(std::string, work_dir, "", "plans, reports and logs (default: a new folder under /tmp)");

namespace zplan {
namespace {

// Writes the suite's document from its recordings; an error lists stale rows.
absl::Status WriteDoc(Suite s, const AccuracyOptions& o, const std::string& workspace, int* misses) {
  ZPLAN_ASSIGN_OR_RETURN(Producer producer, CurrentProducer(s, o));
  ZPLAN_ASSIGN_OR_RETURN(JudgedSuite judged, JudgeRecordings(s, o, producer));
  if (!judged.stale.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(SuiteDocPath(s), " not written: ", judged.stale.size(),
                                                      " rows are stale (", absl::StrJoin(judged.stale, "; "),
                                                      "); run ", RecordCommand(s)));
  }
  for (const AccuracyRow& row : judged.rows) *misses += !row.device_ok || !row.host_ok;
  ZPLAN_RETURN_IF_ERROR(WriteFileAtomically(workspace + "/" + SuiteDocPath(s), SuiteMarkdown(s, judged)));
  std::cerr << "wrote " << SuiteDocPath(s) << " (" << judged.rows.size() << " rows)\n";
  return absl::OkStatus();
}

absl::Status Record(Suite s, const AccuracyOptions& o, const std::string& workspace, int* misses) {
  ZPLAN_ASSIGN_OR_RETURN(Producer producer, CurrentProducer(s, o));
  const std::string which = absl::GetFlag(FLAGS_cases);
  std::set<std::string> wanted;
  if (which == "stale") {
    ZPLAN_ASSIGN_OR_RETURN(JudgedSuite judged, JudgeRecordings(s, o, producer));
    for (const std::string& line : judged.stale) wanted.insert(line.substr(0, line.find(':')));
  } else if (which != "all") {
    for (absl::string_view name : absl::StrSplit(which, ',', absl::SkipEmpty())) wanted.insert(std::string(name));
  }
  const std::vector<AccuracyCase> matrix = SuiteMatrix(s);
  int index = 0;
  for (const AccuracyCase& c : matrix) {
    ++index;
    if (which != "all" && wanted.erase(c.name) == 0) continue;
    ZPLAN_ASSIGN_OR_RETURN(Recording recording, RecordCase(s, c, o, producer, index));
    ZPLAN_RETURN_IF_ERROR(WriteRecording(workspace + "/" + RecordingPath(s, c.name), recording));
    std::cerr << absl::StrFormat("recorded %-50s %6.1f s\n", c.name, recording.seconds());
  }
  if (!wanted.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--cases: no ", SuiteName(s), " case named ",
                                                   absl::StrJoin(wanted, ", ")));
  }
  // Judged afresh from what is now recorded (under the workspace).
  AccuracyOptions from_workspace = o;
  from_workspace.root = workspace;
  return WriteDoc(s, from_workspace, workspace, misses);
}

}  // namespace
}  // namespace zplan

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Under `bazel run` the binaries are runfiles of this folder; recordings and
  // documents are read from and written to the workspace.
  zplan::AccuracyOptions o = zplan::RunfilesAccuracyOptions(absl::GetFlag(FLAGS_work_dir));
  const char* workspace_env = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (workspace_env == nullptr) {
    std::cerr << "accuracy: run it with bazel run //tools:accuracy -- ... (it writes into the workspace)\n";
    return 2;
  }
  const std::string workspace = workspace_env;
  o.root = workspace;
  if (o.work_dir.empty()) {
    char pattern[] = "/tmp/zplan-accuracy-XXXXXX";
    if (mkdtemp(pattern) == nullptr) return 1;
    o.work_dir = pattern;
  }
  const std::string record = absl::GetFlag(FLAGS_record);
  if (record.empty() == !absl::GetFlag(FLAGS_docs)) {
    std::cerr << "accuracy: give one of --record zrun, --record deepspeed or --docs\n";
    return 2;
  }
  if (!record.empty() && record != "zrun" && record != "deepspeed") {
    std::cerr << "accuracy: --record must be zrun or deepspeed, not " << record << "\n";
    return 2;
  }
  int misses = 0;
  absl::Status status;
  if (!record.empty()) {
    status = zplan::Record(record == "zrun" ? zplan::Suite::kZrun : zplan::Suite::kDeepSpeed, o, workspace, &misses);
  } else {
    for (zplan::Suite s : {zplan::Suite::kZrun, zplan::Suite::kDeepSpeed}) {
      if (status.ok()) status = zplan::WriteDoc(s, o, workspace, &misses);
    }
  }
  std::cerr << "work folder: " << o.work_dir << "\n";
  if (!status.ok()) {
    std::cerr << "accuracy: " << status.message() << "\n";
    return 1;
  }
  if (misses > 0) std::cerr << "accuracy: " << misses << " rows miss a goal\n";
  return misses == 0 ? 0 : 1;
}
