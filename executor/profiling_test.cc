#include "executor/profiling.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace zplan {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(StepTraceTest, WritesAChromeTraceOfTheOperatorsRun) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/rank-0.trace.json";
  StepTrace trace;
  trace.Start(at::kCPU);
  const at::Tensor a = at::randn({64, 64});
  const at::Tensor b = at::mm(a, a).relu_();
  auto summary = trace.Finish(path);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_NE(summary->find("traced step:"), std::string::npos) << *summary;
  EXPECT_NE(summary->find("CPU rank"), std::string::npos) << *summary;
  const std::string json = ReadFile(path);
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("aten::mm"), std::string::npos);
  EXPECT_NE(json.find("aten::relu_"), std::string::npos);
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());  // renamed into place
}

TEST(StepTraceTest, FinishWithoutStartIsAnError) {
  StepTrace trace;
  EXPECT_EQ(trace.Finish("unused").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MemorySnapshotTest, NeedsACudaRank) {
  StartMemoryHistory(at::kCPU);  // nothing to record on CPU
  const absl::Status s = WriteMemorySnapshot(at::kCPU, "unused");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("CUDA"), std::string::npos);
}

}  // namespace
}  // namespace zplan
