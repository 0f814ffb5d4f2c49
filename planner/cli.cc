#include "planner/cli.h"

#include <iostream>
#include <map>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "planner/version.h"

namespace zplan {
namespace {

// This binary's flags by name (underscores), in name order.
std::map<std::string, absl::CommandLineFlag*> OwnFlags(absl::string_view flags_file) {
  std::map<std::string, absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename() == flags_file) flags.emplace(std::string(name), flag);
  }
  return flags;
}

std::string Dashed(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

}  // namespace

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (absl::IsResourceExhausted(status)) return kExitBudget;
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) || absl::IsPermissionDenied(status) ||
                 absl::IsFailedPrecondition(status)
             ? kExitBadInput
             : kExitError;
}

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv, absl::string_view flags_file) {
  const std::map<std::string, absl::CommandLineFlag*> flags = OwnFlags(flags_file);
  CommandLine result;
  bool flags_ended = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (flags_ended || arg.size() < 2 || arg[0] != '-' || (arg[1] != '-' && arg != "-h")) {
      result.positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      result.help = true;
      continue;
    }
    if (arg == "--version") {
      result.version = true;
      continue;
    }
    const absl::string_view body = arg.substr(2);
    const size_t eq = body.find('=');
    std::string name = absl::StrReplaceAll(body.substr(0, eq), {{"-", "_"}});
    auto it = flags.find(name);
    bool negated = false;
    if (it == flags.end() && absl::StartsWith(name, "no") && eq == absl::string_view::npos) {
      it = flags.find(name.substr(2));
      negated = it != flags.end() && it->second->IsOfType<bool>();
      if (!negated) it = flags.end();
    }
    if (it == flags.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", Dashed(name), "; --help lists the flags"));
    }
    absl::CommandLineFlag* flag = it->second;
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (i + 1 < argc && !absl::StartsWith(argv[i + 1], "--")) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--", Dashed(name), " needs a value (--", Dashed(name), "=VALUE): ", flag->Help()));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", Dashed(name), ": \"", value, "\" is not valid: ", flag->Help()));
    }
  }
  return result;
}

std::optional<int> HandleCommandLine(int argc, char** argv, absl::string_view program, absl::string_view usage,
                                     absl::string_view flags_file, CommandLine* command_line) {
  absl::StatusOr<CommandLine> parsed = ParseCommandLine(argc, argv, flags_file);
  if (!parsed.ok()) {
    std::cerr << program << ": " << parsed.status().message() << "\n";
    return kExitBadInput;
  }
  if (parsed->help) {
    std::cout << FlagsHelp(usage, flags_file);
    return kExitOk;
  }
  if (parsed->version) {
    std::cout << VersionLine(program);
    return kExitOk;
  }
  *command_line = *std::move(parsed);
  return std::nullopt;
}

std::string FlagsHelp(absl::string_view usage, absl::string_view flags_file) {
  std::string out = absl::StrCat("usage: ", usage, "\n\nflags (--name=value or --name value):\n");
  auto entry = [&out](absl::string_view name, absl::string_view help) {
    const std::string left = absl::StrCat("  --", name);
    absl::StrAppend(&out, left, std::string(left.size() < 24 ? 24 - left.size() : 2, ' '), help, "\n");
  };
  for (const auto& [name, flag] : OwnFlags(flags_file)) {
    std::string help = flag->Help();
    const std::string default_value = flag->DefaultValue();
    if (!default_value.empty() && !absl::StrContains(help, "default")) {
      absl::StrAppend(&help, " (default ", default_value, ")");
    }
    entry(Dashed(name), help);
  }
  entry("help", "this text");
  entry("version", "the planner version and the DeepSpeed and transformers versions it models");
  return out;
}

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, ": ", kPlannerVersion, " (models ", kModelledFrameworks, ")\n");
}

}  // namespace zplan
