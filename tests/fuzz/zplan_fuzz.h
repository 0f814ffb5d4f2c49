// File: zplan_fuzz.h
// An in-process mutation fuzzer over every input zplan and zrun read:
// a Hugging Face config.json, a ds_config.json, a ModelSpec textproto,
// zplan's flags, a plan file (zplan show, zrun), a zrun token file and a
// PEFT adapter_config.json.
//
// An input is one byte naming its kind (InputKind, modulo kKinds) and the
// payload. FuzzOneInput runs it through the real readers and, when they
// accept it, through the planner, and then checks what must always hold:
// a plan zplan builds passes ValidatePlan and reads back equal, and a JSON
// reader's rejection is one line. A rejection is fine; a crash, an abort, a hang or a broken invariant is a finding.
//
// RunFuzzer mutates a seed corpus deterministically (seeded mt19937_64:
// byte flips, insertions, deletions, splices, and numbers and strings
// chosen to break parsers: 0, -1, 2^31, 2^53 + 1, 9e18, 1e300, nan, "auto",
// lone surrogates, raw 0xff) and keeps accepted inputs as new seeds. On a
// crash or a hang (an input running longer than the per-input limit) the
// input is written to out_dir as crash-N or hang-N before the process ends.
// libFuzzer can drive the same target (LLVMFuzzerTestOneInput).
//
// Example:
//   FuzzOptions o; o.runs = 10'000; o.seed = 1; o.corpus_dirs = {{kHfConfig, "configs/hf"}};
//   ZPLAN_ASSIGN_OR_RETURN(FuzzStats stats, RunFuzzer(o));
#ifndef ZPLAN_TESTS_FUZZ_ZPLAN_FUZZ_H_
#define ZPLAN_TESTS_FUZZ_ZPLAN_FUZZ_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zplan {

enum InputKind : uint8_t { kHfConfig, kDsConfig, kModelSpecText, kFlags, kPlanFile, kTokenFile, kLoraConfig, kKinds };

// Runs one input; returns whether the readers accepted it. Aborts (a
// finding) when an accepted input breaks an invariant.
bool FuzzOneInput(absl::string_view input);

struct FuzzOptions {
  int64_t runs = 10'000;
  uint64_t seed = 1;
  double seconds_per_input = 10;  // CPU seconds; longer is a hang
  std::vector<std::pair<InputKind, std::string>> corpus_dirs;  // every file is a seed
  std::string out_dir = ".";      // where crash-N / hang-N go
};

struct FuzzStats {
  int64_t executions = 0;
  int64_t accepted = 0;  // inputs the readers took
  int64_t corpus_size = 0;
  double seconds = 0;
};

absl::StatusOr<FuzzStats> RunFuzzer(const FuzzOptions& options);

}  // namespace zplan

#endif  // ZPLAN_TESTS_FUZZ_ZPLAN_FUZZ_H_
