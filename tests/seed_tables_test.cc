// docs/seed_tables.md must be exactly what the generator produces from
// configs/seeds/: a change in the planner or a scenario that moves a number
// or a verdict fails here until the report is regenerated and reviewed.
#include <string>

#include "gtest/gtest.h"
#include "planner/proto_io.h"
#include "tests/doc_diff.h"
#include "tools/seed_tables.h"

namespace zplan {
namespace {

TEST(SeedTablesTest, CommittedReportMatchesAFreshRun) {
  auto fresh = GenerateSeedTables();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto committed = ReadFile("docs/seed_tables.md");
  ASSERT_TRUE(committed.ok()) << committed.status();
  const std::string diff = FirstDifference(*committed, *fresh);
  if (!diff.empty()) {
    FAIL() << "docs/seed_tables.md differs from a fresh run at " << diff
           << "\nRegenerate with: bazel run //tools:seed_tables -- --out docs/seed_tables.md";
  }
}

TEST(SeedTablesTest, EverySeedHasAScenarioWithVerdicts) {
  auto fresh = GenerateSeedTables();
  ASSERT_TRUE(fresh.ok());
  for (const char* seed : {"000_88900c376df6b844.txt", "001_3d61ed732f3293ab.txt", "002_446b64997b714782.txt",
                           "003_b93c2d4940ffbb4b.txt", "004_5637d306edd64d6b.txt"}) {
    EXPECT_NE(fresh->find(seed), std::string::npos) << seed;
  }
  EXPECT_EQ(fresh->find("no explanation recorded"), std::string::npos)
      << "every disagreement needs the scenario's note on what the guide omits";
}

}  // namespace
}  // namespace zplan
