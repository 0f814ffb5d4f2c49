// File: recordings.h
// Measure once, judge every time: each row of the two agreement suites
// (tools/accuracy.h) is measured once and kept under tests/recordings/<suite>/
// as a Recording (proto/recording.proto) with what produced it: the digest of
// the producer's sources (tools/source_digest.bzl: zrun's, or the DeepSpeed
// oracle's and its counting allocator's), the Python packages' versions, and
// the case's inputs (arguments, the files they name, and for zrun the plan's
// model and run config it trains). Every test run plans each case afresh and
// judges it against its recording in milliseconds; a recording whose inputs or
// producer no longer match is stale, and a stale row never passes: the test
// names it and the one command that re-records it. The documents
// (docs/accuracy.md, docs/deepspeed_agreement.md) are generated from the
// recordings only. A live subset (LiveCases) is re-measured on every run and
// must measure what its recording says, so a recording cannot drift from what
// its producer does; it covers every mechanism the suite has (Mechanisms).
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(Producer now, CurrentProducer(Suite::kDeepSpeed, options));
//   ZPLAN_ASSIGN_OR_RETURN(JudgedSuite judged, JudgeRecordings(Suite::kDeepSpeed, options, now));
//   if (!judged.stale.empty()) ... RecordCommand(Suite::kDeepSpeed)
#ifndef ZPLAN_TOOLS_RECORDINGS_H_
#define ZPLAN_TOOLS_RECORDINGS_H_

#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/recording.pb.h"
#include "tools/accuracy.h"

namespace zplan {

enum class Suite { kZrun, kDeepSpeed };

inline const char* SuiteName(Suite s) { return s == Suite::kZrun ? "zrun" : "deepspeed"; }
inline void PrintTo(Suite s, std::ostream* os) { *os << SuiteName(s); }
std::vector<AccuracyCase> SuiteMatrix(Suite s);
// Relative to the workspace: "docs/accuracy.md" or "docs/deepspeed_agreement.md".
std::string SuiteDocPath(Suite s);
struct JudgedSuite;
// The suite's document: its rows, then how they were recorded and which are live.
std::string SuiteMarkdown(Suite s, const JudgedSuite& judged);
// Relative to the workspace: tests/recordings/<suite>/<case>.textproto.
std::string RecordingPath(Suite s, const std::string& case_name);
// The command that re-records a suite's stale rows and regenerates its document.
std::string RecordCommand(Suite s);

// The cases re-measured live on every test run (tests/accuracy_test,
// tests/deepspeed_agreement_test).
std::vector<std::string> LiveCases(Suite s);

// What a case exercises, from its plan and arguments: "ZeRO-2", "offload
// optimizer", "checkpointing every k", "LoRA", "ViT", "fused loss", "world 4",
// "emulated rank", ... The live subset must cover every mechanism of its suite.
std::set<std::string> Mechanisms(const AccuracyCase& c, const Plan& plan);

// What produced a measurement besides its inputs.
struct Producer {
  std::string sources;                          // "<sha256> <files>" (tools/source_digest.bzl)
  std::map<std::string, std::string> versions;  // Python package -> version
};

// The producer the current tree would record with: the digest file of the
// suite's producer (options.zrun_digest_path or options.oracle_digest_path)
// and the versions options.python_path imports.
absl::StatusOr<Producer> CurrentProducer(Suite s, const AccuracyOptions& options);

// The case's inputs now: its arguments, the contents of every file they name
// (read under options.root), and for zrun the plan's model and run config.
absl::StatusOr<RecordedInputs> InputsOf(Suite s, const AccuracyCase& c, const Plan& plan,
                                        const AccuracyOptions& options);

// Why `recording` does not describe the case measured now by `producer` from
// `inputs` ("" when it does): the first difference, in words.
std::string Staleness(const Recording& recording, const RecordedInputs& inputs, const Producer& producer);

struct JudgedSuite {
  std::vector<AccuracyRow> rows;   // every current recording judged against its fresh plan, in matrix order
  std::vector<Recording> recordings;  // beside rows
  std::vector<std::string> stale;  // "<case>: <why>" for each missing or stale recording
};

// Plans every case of the suite (options.zplan_path) and judges it against its
// recording under options.root. Stale rows are listed, not judged.
absl::StatusOr<JudgedSuite> JudgeRecordings(Suite s, const AccuracyOptions& options, const Producer& producer);

// Plans and measures one case and returns its recording (not written).
absl::StatusOr<Recording> RecordCase(Suite s, const AccuracyCase& c, const AccuracyOptions& options,
                                     const Producer& producer, int index);

// Reads and writes a recording (text format; writes are atomic).
absl::StatusOr<Recording> ReadRecording(const std::string& path);
absl::Status WriteRecording(const std::string& path, const Recording& recording);

}  // namespace zplan

#endif  // ZPLAN_TOOLS_RECORDINGS_H_
