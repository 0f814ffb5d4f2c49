// plan_corpus: writes every plan of a fixed corpus with a given zplan binary,
// or compares two folders of them byte for byte (tools/plan_corpus.h;
// tools/compare_plans.sh wraps it). Run from the workspace root.
//   plan_corpus write ZPLAN DIR [--only SUBSTRING]   exit 0 once every case ran
//   plan_corpus compare DIR_A DIR_B [--clear model.model_type,...]   exit 0 same, 1 different
//   plan_corpus list                                  one case a line: name, then its zplan arguments
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/plan_corpus.h"

ABSL_FLAG(std::string, only, "", "write: only the cases whose name contains this");
ABSL_FLAG(std::string, clear, "", "compare: comma-separated Plan field paths cleared where plans differ");

constexpr char kUsage[] =
    "usage: plan_corpus write ZPLAN DIR [--only S] | compare DIR_A DIR_B [--clear FIELD,...] | list\n";

int main(int argc, char** argv) {
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (const char* dir = std::getenv("BUILD_WORKSPACE_DIRECTORY"); dir != nullptr && chdir(dir) != 0) return 1;
  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  const std::string command = args.empty() ? "" : args[0];
  if (command == "list" && args.size() == 1) {
    auto corpus = zplan::PlanCorpus();
    if (!corpus.ok()) {
      std::cerr << "plan_corpus: " << corpus.status().message() << "\n";
      return 1;
    }
    for (const zplan::CorpusCase& c : *corpus) std::cout << c.name << "  " << absl::StrJoin(c.args, " ") << "\n";
    return 0;
  }
  if (command == "write" && args.size() == 3) {
    auto ran = zplan::WriteCorpusPlans(args[1], args[2], absl::GetFlag(FLAGS_only));
    if (!ran.ok()) {
      std::cerr << "plan_corpus: " << ran.status().message() << "\n";
      return 1;
    }
    std::cout << "ran " << args[1] << " on " << *ran << " cases into " << args[2] << "\n";
    return 0;
  }
  if (command == "compare" && args.size() == 3) {
    std::vector<std::string> clear;
    const std::string fields = absl::GetFlag(FLAGS_clear);
    if (!fields.empty()) clear = absl::StrSplit(fields, ',');
    auto comparison = zplan::ComparePlanFolders(args[1], args[2], clear);
    if (!comparison.ok()) {
      std::cerr << "plan_corpus: " << comparison.status().message() << "\n";
      return 2;
    }
    std::cout << "A: " << args[1] << "\nB: " << args[2] << "\n" << zplan::FormatComparison(*comparison);
    return comparison->same() ? 0 : 1;
  }
  std::cerr << kUsage;
  return 2;
}
