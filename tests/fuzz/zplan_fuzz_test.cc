#include "tests/fuzz/zplan_fuzz.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace zplan {
namespace {

std::string Runfile(const std::string& path) { return std::string(std::getenv("TEST_SRCDIR")) + "/zplan/" + path; }

// The short deterministic run of the test command: every seed, then mutants;
// a crash or a hang kills this test with the input saved under TEST_TMPDIR
// (run it again with zplan_fuzz --seed 20261123 to reproduce).
TEST(ZplanFuzzTest, ShortRunFindsNoCrashOrHang) {
  FuzzOptions o;
  o.runs = 5'000;
  o.seed = 20261123;
  o.out_dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR") != nullptr ? std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")
                                                                     : std::getenv("TEST_TMPDIR");
  o.corpus_dirs = {{kHfConfig, Runfile("configs/hf")},     {kHfConfig, Runfile("configs/hf/tiny")},
                   {kDsConfig, Runfile("configs/ds")},     {kModelSpecText, Runfile("configs/models")},
                   {kFlags, Runfile("tests/fuzz/corpus/flags")},  {kLoraConfig, Runfile("configs/peft")}};
  absl::StatusOr<FuzzStats> stats = RunFuzzer(o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->executions, o.runs);
  // The seeds are valid inputs and some mutants are too, so the planner ran.
  EXPECT_GT(stats->accepted, 100);
  std::cout << stats->executions << " executions, " << stats->accepted << " accepted, " << stats->seconds << " s\n";
}

TEST(ZplanFuzzTest, RejectedInputsAreNotFindings) {
  EXPECT_FALSE(FuzzOneInput(""));
  EXPECT_FALSE(FuzzOneInput(std::string(1, kHfConfig) + "{"));
  EXPECT_FALSE(FuzzOneInput(std::string(1, kPlanFile) + std::string(1, '\0')));
  EXPECT_FALSE(FuzzOneInput(std::string(1, kTokenFile) + std::string("\x00\x01\x10\x00", 4) + "x"));
  EXPECT_TRUE(FuzzOneInput(std::string(1, kFlags) + "model=debug-tiny\nzero_stage=3\nseq=128"));
  EXPECT_TRUE(FuzzOneInput(std::string(1, kLoraConfig) + R"({"r": 4, "target_modules": "all-linear"})"));
  EXPECT_FALSE(FuzzOneInput(std::string(1, kLoraConfig) + R"({"r": 4, "target_modules": ".*"})"));
}

}  // namespace
}  // namespace zplan
