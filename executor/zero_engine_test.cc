#include "executor/zero_engine.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "executor/collectives.h"
#include "executor/counting_allocator.h"
#include "executor/tiny_model_testing.h"
#include "executor/transformer.h"
#include "gtest/gtest.h"
#include "planner/gpu_catalog.h"
#include "planner/inventory.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/run_config.h"
#include "planner/sharding.h"

// The engine's pieces on a tiny model on CPU, each rank emulated in this
// process (collectives.h: peers hold what this rank holds), checked against
// the planner's sizes for the same run where the two meet.
namespace zplan {
namespace {

constexpr int64_t kBucketElements = 3000;  // some gradients fit, some are larger
constexpr int64_t kPersistenceThreshold = 100;  // the norms stay whole

RunConfig Config(int stage, int world) {
  RunConfig config;
  config.mutable_cluster()->set_gpu("cpu");
  config.mutable_cluster()->set_gpus_per_node(world);
  config.mutable_zero()->set_stage(stage);
  config.mutable_zero()->set_stage3_param_persistence_threshold(kPersistenceThreshold);
  config.mutable_zero()->set_reduce_bucket_elements(kBucketElements);
  config.mutable_zero()->set_sub_group_elements(5000);
  config.set_precision(PRECISION_FP32);
  config.set_micro_batch_size(2);
  config.set_seq_length(8);
  config.mutable_optimizer()->set_learning_rate(1e-3);
  return ResolveRunConfig(config);
}

StepSizes PlannedSizes(const RunConfig& config) {
  auto gpu = FindGpu("cpu");
  EXPECT_TRUE(gpu.ok());
  auto sizes = ComputeStepSizes(TinyModel(), config, *gpu);
  EXPECT_TRUE(sizes.ok()) << sizes.status();
  return *sizes;
}

// Live tensor bytes per component now.
MemoryBreakdown LiveNow() {
  ResetCpuPeak();
  return GetCpuPeakBreakdown();
}

// One rank: its collectives, model and engine (the engine goes first).
struct Rank {
  std::unique_ptr<Collectives> comm;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<ZeroEngine> engine;
};

Rank MakeRank(const RunConfig& config, int rank) {
  InstallCountingCpuAllocator();
  Rank r;
  const int world = static_cast<int>(WorldSize(config));
  auto comm = CreateCollectives(RankInfo{rank, world, rank, world, "127.0.0.1", 1}, CollectiveBackend::kEmulated,
                                absl::Seconds(1));
  EXPECT_TRUE(comm.ok()) << comm.status();
  r.comm = std::move(*comm);
  auto model = Transformer::Create(TinyModel(), at::kFloat, 7, at::kCPU);
  EXPECT_TRUE(model.ok()) << model.status();
  r.model = std::make_unique<Transformer>(std::move(*model));
  auto engine = ZeroEngine::Create(r.model.get(), r.comm.get(), config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  r.engine = std::move(*engine);
  return r;
}

// One micro-step's forward and backward on a fixed batch, and AfterBackward.
void Backward(Rank& r, const RunConfig& config) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor tokens = at::randint(256, {config.micro_batch_size(), config.seq_length() + 1}, gen,
                                        at::TensorOptions().dtype(at::kLong));
  const at::Tensor ids = tokens.narrow(1, 0, config.seq_length()).contiguous();
  const at::Tensor targets = tokens.narrow(1, 1, config.seq_length()).contiguous();
  at::Tensor loss = r.model->Loss(ids, targets, {}, r.engine->hooks());
  (loss * r.engine->loss_scale()).backward();
  ASSERT_TRUE(r.engine->AfterBackward(/*last_micro_step=*/true).ok());
}

const at::Tensor* FindTensor(const CheckpointShard& shard, const std::string& name, at::Tensor* out) {
  for (const NamedTensor& t : shard.tensors()) {
    if (t.name() != name) continue;
    *out = at::empty({static_cast<int64_t>(t.data().size() / 4)}, at::kFloat);
    std::memcpy(out->data_ptr(), t.data().data(), t.data().size());
    return out;
  }
  return nullptr;
}

// Every trainable element is owned by exactly one rank: stages 1/2 a slice
// of the padded flat buffer, stage 3 a ceil(numel / N) chunk of each
// parameter (planner/sharding.h).
TEST(ZeroEngineTest, EachElementHasOneOwner) {
  constexpr int kWorld = 4;
  for (int stage : {1, 2, 3}) {
    const RunConfig config = Config(stage, kWorld);
    std::map<std::string, std::vector<int>> owners;
    for (int rank = 0; rank < kWorld; ++rank) {
      Rank r = MakeRank(config, rank);
      const CheckpointShard shard = r.engine->SaveState();
      at::Tensor working;
      ASSERT_NE(FindTensor(shard, "working", &working), nullptr);
      int64_t total = 0, owned = 0;
      for (const OwnedSlice& s : shard.slices()) {
        int64_t numel = 1;
        for (int64_t d : s.shape()) numel *= d;
        total += numel;
        std::vector<int>& count = owners[s.param()];
        count.resize(numel, 0);
        for (int64_t i = s.lo(); i < s.hi(); ++i) ++count[i];
        // A slice this rank does not own (lo == hi) has no place in its buffers.
        if (s.hi() > s.lo()) {
          EXPECT_LE(s.dst() + s.hi() - s.lo(), working.numel()) << s.param();
        }
        if (stage == 3) {
          EXPECT_LE(s.hi() - s.lo(), Stage3ShardElements(numel, kWorld)) << s.param();
        }
        owned += s.hi() - s.lo();
      }
      if (stage < 3) {
        EXPECT_EQ(working.numel(), FlatShardElements(total, kWorld)) << "stage " << stage;
      }
      EXPECT_LE(owned, working.numel());
    }
    for (const auto& [name, count] : owners) {
      for (size_t i = 0; i < count.size(); ++i) {
        ASSERT_EQ(count[i], 1) << "stage " << stage << " " << name << "[" << i << "]";
      }
    }
  }
}

// Stages 1/2 make their IPG buckets at a backward's first gradient and free
// them at its end (two with overlap_comm); stage 3 keeps one from Create.
// The planner counts the same bytes.
TEST(ZeroEngineTest, BucketsLiveAsThePlannerSays) {
  const int64_t bucket_bytes = kBucketElements * 4;
  for (int stage : {2, 3}) {
    RunConfig config = Config(stage, 2);
    config.mutable_zero()->set_overlap_comm(true);
    const int64_t before = LiveNow().buffers_bytes();
    Rank r = MakeRank(config, 0);
    const StepSizes planned = PlannedSizes(config);
    EXPECT_EQ(LiveNow().buffers_bytes() - before, planned.buckets_resident) << "stage " << stage;
    EnableAllocationLog(true);
    Backward(r, config);
    int made = 0, freed = 0;
    for (const AllocationEvent& e : TakeAllocationLog()) {
      if (e.tag != COMPONENT_BUFFERS) continue;
      if (e.bytes == bucket_bytes) ++made;
      if (e.bytes == -bucket_bytes) ++freed;
    }
    EnableAllocationLog(false);
    if (stage == 2) {
      EXPECT_EQ(made * bucket_bytes, planned.ipg_buckets);
      EXPECT_EQ(made, 2);
      EXPECT_EQ(freed, 2);
    } else {
      EXPECT_EQ(planned.buckets_resident, bucket_bytes);
      EXPECT_EQ(made, 0);
      EXPECT_EQ(freed, 0);
    }
    EXPECT_EQ(LiveNow().buffers_bytes() - before, planned.buckets_resident) << "stage " << stage;
  }
}

// Reduced through buckets (gradients that fit, and ones larger than a bucket
// that go alone), stages 1/2 step exactly the gradients stage 0 steps. The
// emulated peer holds the same gradients, so the average is this rank's.
TEST(ZeroEngineTest, BucketReductionStepsAsStageZero) {
  Rank reference = MakeRank(Config(0, 1), 0);
  Backward(reference, Config(0, 1));
  ASSERT_TRUE(reference.engine->Step(1e-3).ok());
  std::map<std::string, at::Tensor> updated;
  for (const auto& [name, param] : reference.model->parameters()) updated[name] = param.detach().reshape(-1);
  for (int stage : {1, 2}) {
    for (bool overlap : {false, true}) {
      RunConfig config = Config(stage, 2);
      config.mutable_zero()->set_overlap_comm(overlap);
      for (int rank = 0; rank < 2; ++rank) {
        Rank r = MakeRank(config, rank);
        Backward(r, config);
        ASSERT_TRUE(r.engine->Step(1e-3).ok());
        const CheckpointShard shard = r.engine->SaveState();
        at::Tensor working;
        ASSERT_NE(FindTensor(shard, "working", &working), nullptr);
        for (const OwnedSlice& s : shard.slices()) {
          if (s.hi() <= s.lo()) continue;
          const at::Tensor got = working.narrow(0, s.dst(), s.hi() - s.lo());
          const at::Tensor want = updated.at(s.param()).narrow(0, s.lo(), s.hi() - s.lo());
          EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-7))
              << "stage " << stage << " overlap " << overlap << " rank " << rank << " " << s.param();
        }
      }
    }
  }
}

// Stage 3: after Create only the persistent parameters are whole; a part's
// gather brings it and prefetches the next within the prefetch bucket (the
// parameter that crosses the limit included), and its release after backward
// frees it. The gathered bytes are the planner's Block(0).gather.
TEST(ZeroEngineTest, GatherPrefetchAndRelease) {
  const std::vector<TensorSpec> inventory = ParameterInventory(TinyModel());
  for (int64_t prefetch : {int64_t{0}, int64_t{1}, int64_t{1000000000}}) {
    RunConfig config = Config(3, 2);
    config.mutable_zero()->set_stage3_prefetch_bucket_elements(prefetch);
    Rank r = MakeRank(config, 0);
    // (count, elements) of the parameters under `prefix` now whole; only
    // those partitioned, or persistent ones too.
    auto whole = [&](const std::string& prefix, bool partitioned_only) {
      int64_t count = 0, elements = 0;
      for (size_t i = 0; i < inventory.size(); ++i) {
        if (inventory[i].name().rfind(prefix, 0) != 0) continue;
        const int64_t numel = NumElements(inventory[i]);
        if (partitioned_only && numel <= kPersistenceThreshold) continue;
        if (r.model->parameters()[i].second.numel() == numel) {
          ++count;
          elements += numel;
        }
      }
      return std::make_pair(count, elements);
    };
    int64_t partitioned = 0;  // per block
    for (const TensorSpec& t : inventory) {
      if (t.name().rfind("layers.0.", 0) == 0 && NumElements(t) > kPersistenceThreshold) ++partitioned;
    }
    ASSERT_GT(partitioned, 1);
    // Persistent parameters only (the norms).
    EXPECT_EQ(whole("layers.", true).first, 0) << prefetch;
    EXPECT_GT(whole("layers.", false).first, 0) << prefetch;
    r.engine->hooks().before_forward(0);
    const auto block0 = whole("layers.0.", true);
    const auto block1 = whole("layers.1.", true);
    EXPECT_EQ(block0.first, partitioned) << prefetch;
    EXPECT_EQ(block1.first, prefetch == 0 ? 0 : prefetch == 1 ? 1 : partitioned) << prefetch;
    EXPECT_EQ((block0.second + block1.second) * 4, PlannedSizes(config).Block(0).gather) << prefetch;
    r.engine->hooks().after_backward(0);
    EXPECT_EQ(whole("layers.0.", true).first, 0) << prefetch;
  }
}

// Stages 1/2 with optimizer offload: the staging buffers (a device one and
// its host twin the size of the largest parameter, the bit16 partition copy)
// and the host master, Adam states and gradients, as the planner sizes them.
TEST(ZeroEngineTest, OffloadStagingAsPlanned) {
  for (int stage : {1, 2}) {
    RunConfig config = Config(stage, 2);
    config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
    const MemoryBreakdown before = LiveNow();
    Rank r = MakeRank(config, 1);
    const MemoryBreakdown after = LiveNow();
    const StepSizes planned = PlannedSizes(config);
    EXPECT_GT(planned.host_offload_staging, 0);
    EXPECT_EQ(after.buffers_bytes() - before.buffers_bytes(),
              planned.offload_staging_resident + planned.host_offload_staging)
        << "stage " << stage;
    EXPECT_EQ(after.master_params_bytes() - before.master_params_bytes(), planned.host_master) << "stage " << stage;
    EXPECT_EQ(after.optimizer_states_bytes() - before.optimizer_states_bytes(),
              planned.host_optimizer + 4)  // and the fp32 step count
        << "stage " << stage;
    EXPECT_EQ(after.grads_bytes() - before.grads_bytes(), planned.host_grads) << "stage " << stage;
  }
}

}  // namespace
}  // namespace zplan
