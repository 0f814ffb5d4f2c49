#include "executor/torch_runtime.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "planner/proto_io.h"
#include "proto/plan.pb.h"

namespace zplan {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(TorchRuntimeTest, ReportsVersion) {
  EXPECT_EQ(DescribeTorchRuntime().torch_version.rfind("2.11", 0), 0u);
}

TEST(TorchRuntimeTest, ReadsPlanWithSystemProtobufAndRunsTensorOp) {
  Plan plan;
  plan.mutable_model()->set_name("tiny");
  plan.mutable_model()->set_hidden_size(16);
  plan.mutable_config()->set_seq_length(8);
  plan.set_total_params(12345);
  for (const char* path : {"plan.pb", "plan.textproto", "plan.json"}) {
    const std::string file = TempPath(path);
    ASSERT_TRUE(WriteProtoFile(file, plan).ok()) << file;
    auto sum = CheckTorchWithPlan(file);
    ASSERT_TRUE(sum.ok()) << sum.status();
    // ones[8,16] @ 0.5[16,16]: every element is 8, 8*16 elements.
    EXPECT_DOUBLE_EQ(*sum, 8.0 * 16 * 8);
    Plan back;
    ASSERT_TRUE(ReadProtoFile(file, &back).ok());
    EXPECT_EQ(back.total_params(), 12345);
  }
}

TEST(TorchRuntimeTest, RejectsCorruptPlan) {
  const std::string file = TempPath("corrupt.pb");
  ASSERT_TRUE(WriteFileAtomically(file, "\xff\xff\xff not a plan").ok());
  auto sum = CheckTorchWithPlan(file);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zplan
