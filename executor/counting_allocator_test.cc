#include "executor/counting_allocator.h"

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace zplan {
namespace {

TEST(CountingAllocatorTest, CountsLiveTensorBytesAndPeak) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  const int64_t before = GetCpuMemoryStats().current_bytes;
  ResetCpuPeak();
  {
    at::Tensor a = at::empty({1024, 256}, at::kFloat);     // 1 MiB
    at::Tensor b = at::empty({512, 256}, at::kBFloat16);   // 256 KiB
    EXPECT_EQ(GetCpuMemoryStats().current_bytes - before, 1024 * 256 * 4 + 512 * 256 * 2);
  }
  EXPECT_EQ(GetCpuMemoryStats().current_bytes, before);
  EXPECT_EQ(GetCpuMemoryStats().peak_bytes - before, 1024 * 256 * 4 + 512 * 256 * 2);
  ResetCpuPeak();
  EXPECT_EQ(GetCpuMemoryStats().peak_bytes, before);
}

TEST(CountingAllocatorTest, SeesAutogradSavedTensors) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  at::Tensor w = at::randn({256, 256}).requires_grad_(true);
  at::Tensor x = at::randn({64, 256});
  const int64_t before = GetCpuMemoryStats().current_bytes;
  at::Tensor y = at::relu(at::matmul(x, w));
  // relu keeps its output (64 x 256 fp32); the matmul output is freed.
  EXPECT_EQ(GetCpuMemoryStats().current_bytes - before, 64 * 256 * 4);
  y.sum().backward();
  EXPECT_TRUE(w.grad().defined());
}

}  // namespace
}  // namespace zplan
