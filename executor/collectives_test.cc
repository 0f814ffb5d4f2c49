#include "executor/collectives.h"

#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zplan {
namespace {

// Runs `body(comm)` on `world` ranks, one thread each, over real Gloo.
void RunRanks(int world, const std::function<void(Collectives&)>& body) {
  auto port = FindFreePort();
  ASSERT_TRUE(port.ok());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankInfo info{r, world, r, world, "127.0.0.1", *port};
      auto comm = CreateCollectives(info, CollectiveBackend::kGloo, absl::Seconds(30));
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(CollectivesTest, GlooAllReduceReduceScatterAllGather) {
  for (int world : {1, 2, 4}) {
    RunRanks(world, [world](Collectives& comm) {
      const int r = comm.rank();
      at::Tensor t = at::full({6}, r + 1.0);
      ASSERT_TRUE(comm.AllReduceSum(t).ok());
      EXPECT_TRUE(at::allclose(t, at::full({6}, world * (world + 1) / 2.0)));

      at::Tensor bucket = at::arange(world * 3, at::kFloat) * (r + 1);
      at::Tensor mine = at::empty({3});
      ASSERT_TRUE(comm.ReduceScatterSum(bucket, mine).ok());
      const double total = world * (world + 1) / 2.0;
      EXPECT_TRUE(at::allclose(mine, at::arange(3 * r, 3 * r + 3, at::kFloat) * total)) << mine;

      at::Tensor gathered = at::empty({world * 2}, at::kBFloat16);
      ASSERT_TRUE(comm.AllGather(at::full({2}, static_cast<double>(r), at::kBFloat16), gathered).ok());
      for (int q = 0; q < world; ++q) EXPECT_EQ(gathered[2 * q].item<float>(), q);

      auto all = comm.GatherToRankZero("test", std::to_string(r));
      ASSERT_TRUE(all.ok());
      if (r == 0) {
        ASSERT_EQ(all->size(), static_cast<size_t>(world));
        EXPECT_EQ((*all)[world - 1], std::to_string(world - 1));
      }
      EXPECT_TRUE(comm.Barrier().ok());
    });
  }
}

TEST(CollectivesTest, EmulatedRankKeepsShapesWithoutPeers) {
  RankInfo info{63, 64, 7, 8, "127.0.0.1", 1};
  auto comm = CreateCollectives(info, CollectiveBackend::kEmulated, absl::Seconds(1));
  ASSERT_TRUE(comm.ok());
  at::Tensor bucket = at::arange(64 * 2, at::kFloat);
  at::Tensor mine = at::empty({2});
  // Peers hold what this rank holds: a sum is 64 times the local value.
  ASSERT_TRUE((*comm)->ReduceScatterSum(bucket, mine).ok());
  EXPECT_EQ(mine[0].item<float>(), 126 * 64);
  at::Tensor full = at::empty({128});
  ASSERT_TRUE((*comm)->AllGather(mine, full).ok());
  EXPECT_EQ(full[0].item<float>(), 126 * 64);
  at::Tensor loss = at::full({1}, 2.5, at::kDouble);
  ASSERT_TRUE((*comm)->AllReduceSum(loss).ok());
  EXPECT_EQ(loss.item<double>(), 2.5 * 64);
}

TEST(CollectivesTest, ReadsTorchrunAndSlurmVariables) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.5", 1);
  setenv("MASTER_PORT", "29501", 1);
  auto info = RankInfoFromEnvironment();
  ASSERT_TRUE(info.ok() && info->has_value()) << info.status();
  EXPECT_EQ((*info)->rank, 3);
  EXPECT_EQ((*info)->master_port, 29501);
  setenv("RANK", "4", 1);
  EXPECT_EQ(RankInfoFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  unsetenv("MASTER_PORT");
  setenv("RANK", "1", 1);
  EXPECT_NE(RankInfoFromEnvironment().status().message().find("MASTER_PORT"), std::string::npos);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"}) unsetenv(v);

  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_JOB_NODELIST", "gnode[10,20-21]", 1);
  info = RankInfoFromEnvironment();
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->master_addr, "gnode10");
  EXPECT_EQ((*info)->rank, 5);
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST"}) unsetenv(v);
  info = RankInfoFromEnvironment();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_value());
}

}  // namespace
}  // namespace zplan
