// File: cli.h
// The command-line conventions zplan and zrun share:
//   --name=value and --name value; --zero-stage and --zero_stage alike; a
//   bool flag alone means true, --noname false; "--" ends the flags;
//   --help (-h) prints the usage and this binary's flags with their defaults;
//   --version prints the planner version and the frameworks it models.
// Every mistake -- an unknown flag, a missing or unparsable value -- is
// kInvalidArgument naming the flag, so the binary exits 2 (kExitBadInput) as
// for any other bad input; nothing exits from inside the parser.
// Only flags defined in `flags_file` (the binary's main.cc: pass __FILE__)
// are accepted or listed, whatever else is linked in.
//
// Example (main.cc):
//   CommandLine cl;
//   if (auto code = HandleCommandLine(argc, argv, "zplan", kUsage, __FILE__, &cl)) return *code;
#ifndef ZPLAN_PLANNER_CLI_H_
#define ZPLAN_PLANNER_CLI_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zplan {

// Exit codes of both binaries.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;     // an I/O failure, a dead rank, a timeout
inline constexpr int kExitBadInput = 2;  // bad usage, a bad flag, config or plan
// A budget broke: zplan's plan does not fit the --budget-gib / --host-ram-gib
// it was given (the plan is still written); zrun measured more than the
// plan's budget or tolerance allows.
inline constexpr int kExitBudget = 3;

// kExitBadInput for a status the user's input caused (kInvalidArgument,
// kNotFound, kPermissionDenied, kFailedPrecondition: a bad flag, a missing
// file, an unwritable path, a plan this machine cannot run), kExitBudget for
// kResourceExhausted (a plan that does not fit its budget), kExitError
// otherwise, kExitOk for OK.
int ExitCodeFor(const absl::Status& status);

struct CommandLine {
  std::vector<std::string> positional;  // the arguments that are not flags
  bool help = false;
  bool version = false;
};

// Parses argv[1..] and sets the flags it names.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv, absl::string_view flags_file);

// What every main does first: parses argv into *command_line and returns
// nullopt, or, for --help / --version, prints them to stdout and returns
// kExitOk, or, for a usage error, prints "<program>: <message>" to stderr
// and returns kExitBadInput.
std::optional<int> HandleCommandLine(int argc, char** argv, absl::string_view program, absl::string_view usage,
                                     absl::string_view flags_file, CommandLine* command_line);

// `usage`, then one entry per flag of `flags_file`: --name, its help and its
// default where it has one.
std::string FlagsHelp(absl::string_view usage, absl::string_view flags_file);

// "zplan 0.9 (models DeepSpeed 0.19.8, transformers 5.23.0)".
std::string VersionLine(absl::string_view program);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_CLI_H_
