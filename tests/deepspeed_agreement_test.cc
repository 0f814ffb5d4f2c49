// The DeepSpeed agreement suite: every configuration of DeepSpeedMatrix()
// (tools/accuracy.h) is planned by zplan and trained by real DeepSpeed +
// transformers on Gloo CPU ranks (tools/deepspeed_oracle.py); the planned
// device peak must be within 3% of the measured one on every rank, and
// docs/deepspeed_agreement.md must report the same configurations
// (regenerate with bazel run //tools:accuracy -- --matrix deepspeed --out
// docs/deepspeed_agreement.md).
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "planner/memory_model.h"
#include "planner/proto_io.h"
#include "tools/accuracy.h"

namespace zplan {
namespace {

TEST(DeepSpeedAgreementTest, EveryConfigurationIsWithinThreePercentOnEveryRank) {
  const std::vector<AccuracyCase> matrix = DeepSpeedMatrix();
  ASSERT_GE(matrix.size(), 32u);
  auto rows = RunAccuracyMatrix(matrix, RunfilesAccuracyOptions(std::string(std::getenv("TEST_TMPDIR")) + "/ds"));
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (const AccuracyRow& row : *rows) {
    const RankMeasurement& worst = row.ranks[row.worst_rank];
    EXPECT_TRUE(row.device_ok) << row.config.name << ": DeepSpeed's device peak " << worst.device.peak_bytes()
                               << " B on rank " << worst.rank << " vs " << LiveTensorBytes(row.plan.device_per_rank())
                               << " B planned (" << 100 * row.device_error << "%)";
  }
  auto doc = ReadFile("docs/deepspeed_agreement.md");
  ASSERT_TRUE(doc.ok()) << doc.status();
  for (const AccuracyCase& c : matrix) {
    EXPECT_NE(doc->find("`" + c.name + "`"), std::string::npos)
        << c.name << " is missing from docs/deepspeed_agreement.md; regenerate it with: "
        << "bazel run //tools:accuracy -- --matrix deepspeed --out docs/deepspeed_agreement.md";
  }
}

}  // namespace
}  // namespace zplan
