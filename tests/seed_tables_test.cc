// docs/seed_tables.md must be exactly what the generator produces from
// configs/seeds/: a change in the planner or a scenario that moves a number
// or a verdict fails here until the report is regenerated and reviewed.
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "planner/proto_io.h"
#include "tools/seed_tables.h"

namespace zplan {
namespace {

TEST(SeedTablesTest, CommittedReportMatchesAFreshRun) {
  auto fresh = GenerateSeedTables();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto committed = ReadFile("docs/seed_tables.md");
  ASSERT_TRUE(committed.ok()) << committed.status();
  if (*fresh == *committed) return;
  std::istringstream a(*committed), b(*fresh);
  std::string line_a, line_b;
  for (int line = 1; static_cast<bool>(std::getline(a, line_a)) | static_cast<bool>(std::getline(b, line_b));
       ++line) {
    if (line_a != line_b) {
      FAIL() << "docs/seed_tables.md differs from a fresh run at line " << line << ":\n  committed: " << line_a
             << "\n  fresh:     " << line_b
             << "\nRegenerate with: bazel run //tools:seed_tables -- --out docs/seed_tables.md";
    }
    line_a.clear();
    line_b.clear();
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
