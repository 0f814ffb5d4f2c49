// File: plan_corpus.h
// A fixed corpus of zplan invocations that write plans, and a comparison of
// two folders of their plans: the proof that a change to the planner leaves
// every plan byte-identical (issue 32, must-show 1), or names the ones it
// changed.
//
// The corpus (PlanCorpus), every path relative to the workspace root:
//   acc-*     every case of tools/accuracy.h's AccuracyMatrix(), with --gpu cpu;
//   ds-*      every case of DeepSpeedMatrix(), with --gpu cpu and its
//             ds_config_json written to a file and given as --ds-config, as
//             tools/accuracy.cc's RunCase does;
//   seed*     each seed scenario of configs/seeds/ as zplan flags: its base
//             configuration, each row's (RowConfig) and each option on the
//             rows it is shown for (WithOption), as tools/seed_tables.cc plans
//             them (DeepSpeed knobs without a flag go in a ds_config, LoRA in
//             an adapter_config.json); identical invocations are kept once;
//   budget-*  the commands of configs/budgets/README.md;
//   zplan-*   presets, grids (--out writes the recommended row), dimension
//             overrides, LoRA, --params, and --hf-config of every
//             configs/hf/*.json and configs/hf/tiny/*.json.
// A seed configuration that sets a field the translation does not know is
// an error naming it, so the corpus never silently plans something else.
//
// WriteCorpusPlans runs one zplan binary over the corpus. zplan runs inside
// the folder (its configs/ a link to the workspace's, generated inputs in
// inputs/), so no path in a plan depends on where the folder is. Per case:
// <name>.pb (the plan, --out; none for sweep and max-batch), <name>.out
// (stdout and stderr) and <name>.rc (the exit code).
//
// ComparePlanFolders compares two such folders: every plan byte for byte;
// where the bytes differ, both decoded as Plan with the named fields cleared
// (e.g. "model.model_type": fields added after the other folder was written)
// and serialised again. Exit codes must match; printed text is compared as
// information only. Never modifies either folder.
//
// Example:
//   ZPLAN_RETURN_IF_ERROR(WriteCorpusPlans("/tmp/zplan-base", "/tmp/base", ""));
//   ZPLAN_RETURN_IF_ERROR(WriteCorpusPlans("bazel-bin/planner/zplan", "/tmp/new", ""));
//   ZPLAN_ASSIGN_OR_RETURN(FolderComparison c, ComparePlanFolders("/tmp/base", "/tmp/new", {"model.model_type"}));
//   std::cout << FormatComparison(c);  // "compared 212 plans: ..."
#ifndef ZPLAN_TOOLS_PLAN_CORPUS_H_
#define ZPLAN_TOOLS_PLAN_CORPUS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace zplan {

struct CorpusCase {
  std::string name;               // unique; the files' name without extension
  std::vector<std::string> args;  // zplan's arguments, --out excluded
  // Written to inputs/<first> in the folder before zplan runs; args name
  // them as "inputs/<first>".
  std::vector<std::pair<std::string, std::string>> inputs;
};

// The corpus, in a fixed order. Lists configs/hf/ and configs/hf/tiny/ (from
// the working directory: the workspace root); kInvalidArgument for a seed
// field without a translation.
absl::StatusOr<std::vector<CorpusCase>> PlanCorpus();

// Runs `zplan` on every case whose name contains `only` (all when empty) into
// `dir`, which must not exist yet or be empty. Returns how many ran; an error
// only when a file cannot be written or zplan cannot be started (a zplan
// error is its exit code in <name>.rc).
absl::StatusOr<int> WriteCorpusPlans(const std::string& zplan, const std::string& dir, absl::string_view only);

// Clears a field path such as "model.model_type" (message fields down to the
// last one) in `message`; kInvalidArgument when the path names no field.
absl::Status ClearFieldPath(absl::string_view path, google::protobuf::Message* message);

struct FolderComparison {
  std::vector<std::string> cleared;       // the field paths cleared where bytes differed
  int plans = 0;                          // COUNT: plan files present in both folders
  int identical_bytes = 0;                // COUNT: equal as files
  int identical_after_clearing = 0;       // COUNT: equal only once `cleared` were cleared
  std::vector<std::string> differing;     // plans that differ even then
  std::vector<std::string> missing;       // "name: only in A" / "name: only in B"
  std::vector<std::string> exit_codes;    // "name: 0 -> 3"
  std::vector<std::string> text_differs;  // cases whose printed text differs (information)
  int cases = 0;                          // COUNT: cases (.rc files) in either folder
  bool same() const { return differing.empty() && missing.empty() && exit_codes.empty(); }
};

absl::StatusOr<FolderComparison> ComparePlanFolders(const std::string& a, const std::string& b,
                                                    const std::vector<std::string>& clear);

// "compared N plans (of M cases) ...", then every differing name, one a line.
std::string FormatComparison(const FolderComparison& comparison);

}  // namespace zplan

#endif  // ZPLAN_TOOLS_PLAN_CORPUS_H_
