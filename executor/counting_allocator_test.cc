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

// Blocks larger than the 64 MiB the kept ones may exceed the mark by.
constexpr int64_t kAllowance = int64_t{64} << 20;

TEST(CountingAllocatorTest, ReusesLargeBlocksOnlyWithinTheHighWaterMark) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  constexpr int64_t kBlock = int64_t{128} << 20;  // larger than anything before
  const int64_t before = GetCpuMemoryStats().current_bytes;
  at::Tensor a = at::empty({kBlock}, at::kByte);
  at::Tensor b = at::empty({kBlock}, at::kByte);
  const void* a_data = a.data_ptr();
  a.reset();  // live + kept stay at the high-water mark: kept
  EXPECT_EQ(GetCpuMemoryStats().kept_bytes, kBlock);
  at::Tensor c = at::empty({kBlock}, at::kByte);  // the same size: the same block, counted again
  EXPECT_EQ(c.data_ptr(), a_data);
  EXPECT_EQ(GetCpuMemoryStats().kept_bytes, 0);
  EXPECT_EQ(GetCpuMemoryStats().current_bytes - before, 2 * kBlock);
  b.reset();
  c.reset();
  EXPECT_EQ(GetCpuMemoryStats().kept_bytes, 2 * kBlock);
  // Another size: kept blocks go back so that live + kept + the new block
  // stay within the mark.
  at::Tensor d = at::empty({kBlock + kBlock / 2}, at::kByte);
  const CpuMemoryStats stats = GetCpuMemoryStats();
  EXPECT_LE(stats.current_bytes + stats.kept_bytes - before, 2 * kBlock + kAllowance);
  EXPECT_EQ(stats.kept_bytes, kBlock);  // one of the two went back
}

TEST(CountingAllocatorTest, AKeptBlockServesARequestOfAtLeastHalfItsSize) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  constexpr int64_t kBlock = int64_t{512} << 20;  // larger than anything before
  const int64_t before = GetCpuMemoryStats().current_bytes;
  at::Tensor upcast = at::empty({kBlock}, at::kByte);
  const void* block = upcast.data_ptr();
  upcast.reset();
  ASSERT_EQ(GetCpuMemoryStats().kept_bytes, kBlock);
  // Less than half: a block of its own (the kept one goes back, since both
  // would exceed the mark).
  at::Tensor small = at::empty({kBlock / 2 - 1}, at::kByte);
  EXPECT_NE(small.data_ptr(), block);
  small.reset();
  upcast = at::empty({kBlock}, at::kByte);
  block = upcast.data_ptr();
  upcast.reset();
  // Half: the kept block, counted at the request's size.
  at::Tensor bucket = at::empty({kBlock / 2}, at::kByte);
  EXPECT_EQ(bucket.data_ptr(), block);
  EXPECT_EQ(GetCpuMemoryStats().current_bytes - before, kBlock / 2);
  EXPECT_EQ(GetCpuMemoryStats().kept_bytes, 0);
  // Freed, it is kept at its block's size; nothing grows past the mark.
  bucket.reset();
  EXPECT_EQ(GetCpuMemoryStats().kept_bytes, kBlock);
  at::Tensor other = at::empty({kBlock / 2}, at::kByte);
  at::Tensor more = at::empty({kBlock / 2}, at::kByte);  // the block is taken: a new one
  const CpuMemoryStats stats = GetCpuMemoryStats();
  EXPECT_EQ(stats.kept_bytes, 0);
  EXPECT_EQ(stats.current_bytes - before, kBlock);
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

TEST(CountingAllocatorTest, AttributesThePeakToComponents) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  ResetCpuPeak();
  const MemoryBreakdown before = GetCpuPeakBreakdown();
  at::Tensor params;
  {
    ScopedMemoryTag tag(COMPONENT_PARAMS);
    params = at::empty({1024}, at::kFloat);  // 4 KiB
  }
  BeginForwardPart();
  at::Tensor saved = at::empty({2048}, at::kFloat);        // 8 KiB, survives the part
  at::Tensor scratch = at::empty({4096}, at::kFloat);      // 16 KiB, freed inside it
  scratch.reset();
  SettleForwardPart(COMPONENT_TEMPORARIES);
  const MemoryBreakdown peak = GetCpuPeakBreakdown();
  EXPECT_EQ(peak.params_bytes() - before.params_bytes(), 4096);
  EXPECT_EQ(peak.activations_bytes() - before.activations_bytes(), 8192);
  EXPECT_EQ(peak.temporaries_bytes() - before.temporaries_bytes(), 16384);
  EXPECT_EQ(peak.peak_bytes() - before.peak_bytes(), 4096 + 8192 + 16384);

  // A later retag moves live bytes, not the peak already taken.
  at::Tensor grad = at::empty({8192}, at::kFloat);  // 32 KiB: a new peak, as temporaries
  TagAllocation(grad.data_ptr(), COMPONENT_GRADS);
  at::Tensor more = at::empty({1}, at::kFloat);
  const MemoryBreakdown later = GetCpuPeakBreakdown();
  EXPECT_EQ(later.grads_bytes() - before.grads_bytes(), 32768);
  EXPECT_EQ(later.temporaries_bytes() - before.temporaries_bytes(), 4);
  EXPECT_EQ(later.activations_bytes() - before.activations_bytes(), 8192);
}

TEST(CountingAllocatorTest, LogsEveryAllocationAndReleaseInOrder) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  EnableAllocationLog(true);
  const int64_t before = GetCpuMemoryStats().current_bytes;
  {
    ScopedMemoryTag tag(COMPONENT_BUFFERS);
    at::Tensor a = at::empty({256}, at::kFloat);
    at::Tensor b = at::empty({128}, at::kBFloat16);
    a.reset();
  }
  const std::vector<AllocationEvent> log = TakeAllocationLog();
  EnableAllocationLog(false);
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[0].bytes, 1024);
  EXPECT_EQ(log[0].tag, COMPONENT_BUFFERS);
  EXPECT_EQ(log[0].live_bytes, before + 1024);
  EXPECT_EQ(log[1].bytes, 256);
  EXPECT_EQ(log[2].bytes, -1024);
  EXPECT_EQ(log[2].live_bytes, before + 256);
  EXPECT_EQ(log[3].bytes, -256);
  EXPECT_EQ(log[3].live_bytes, before);
  EXPECT_TRUE(TakeAllocationLog().empty());
}

}  // namespace
}  // namespace zplan
