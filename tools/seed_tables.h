// File: seed_tables.h
// Generates docs/seed_tables.md: every row of the seeds' memory and
// performance tables (configs/seeds/*.textproto, compiled in) beside zplan's
// number, with a computed verdict:
//   agrees          within the guide's own range, or +-25% of a point figure;
//   adds up / does not add up   the guide's components vs its own total (5%);
//   fits / does not fit         zplan's peak vs the GPU it names;
//   impossible for this model   a model-state figure (params, gradients,
//                               optimizer) off by more than 2x from what the
//                               model's exact size gives;
//   disagrees       otherwise, followed by the scenario's note on what the
//                   guide omits that would decide it.
// Deterministic: the same scenarios always give the same bytes, so a test can
// compare the committed report with a fresh one.
#ifndef ZPLAN_TOOLS_SEED_TABLES_H_
#define ZPLAN_TOOLS_SEED_TABLES_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "proto/run_config.pb.h"
#include "proto/seed.pb.h"

namespace zplan {

inline constexpr double kPointTolerance = 0.25;  // the issue's +-25% of a point figure
inline constexpr double kSumTolerance = 0.05;    // a total "adds up" within 5%
inline constexpr double kImpossibleRatio = 2.0;  // model-state figure off by more than 2x

// The configuration of one seed row (the scenario's, with the claim's
// overrides), and of an option shown on a row.
RunConfig RowConfig(const SeedScenario& s, const SeedClaim& c);
RunConfig WithOption(RunConfig config, const SeedOption& o);

// A published config.json by its file name under configs/hf/ (SeedScenario.hf_config): its path and text.
absl::StatusOr<std::pair<std::string, std::string>> PublishedConfig(const std::string& file);

absl::StatusOr<std::string> GenerateSeedTables();

}  // namespace zplan

#endif  // ZPLAN_TOOLS_SEED_TABLES_H_
