// File: collectives.h
// The communication zrun's ZeRO engine needs, behind one interface:
//   * c10d Gloo (CPU tensors, or several processes sharing one GPU),
//   * c10d NCCL (CUDA tensors, one rank per GPU) — built only with USE_C10D_NCCL,
//   * emulated: one process behaves as rank r of N for memory, with no
//     communication: every peer is taken to hold what this rank holds
//     (all-gather replicates the local shard, sums are N times the local
//     value), so a 64-GPU plan can be checked on one device and trains as
//     one rank would.
// Rendezvous goes through c10d's TCPStore (rank 0 serves it). Every call
// blocks until its result can be used; on Gloo errors and timeouts (a dead
// peer) become absl::Status, never a hang beyond the timeout. On NCCL they
// reach the watchdog thread, which aborts the process (SIGABRT) and tells the
// other ranks through the store (TORCH_NCCL_ASYNC_ERROR_HANDLING=3,
// TORCH_NCCL_PROPAGATE_ERROR=1 unless set).
//
// RankInfoFromEnvironment() reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT, or SLURM's SLURM_PROCID /
// SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE / SLURM_JOB_NODELIST.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(auto comm, CreateCollectives(info, CollectiveBackend::kGloo, absl::Seconds(60)));
//   ZPLAN_RETURN_IF_ERROR(comm->AllReduceSum(grad_bucket));
#ifndef ZPLAN_EXECUTOR_COLLECTIVES_H_
#define ZPLAN_EXECUTOR_COLLECTIVES_H_

#include <memory>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zplan {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // torch launcher default
};

// std::nullopt when no launcher variables are set (zrun then spawns ranks);
// kInvalidArgument naming the variable when they are inconsistent.
absl::StatusOr<std::optional<RankInfo>> RankInfoFromEnvironment();

enum class CollectiveBackend { kGloo, kNccl, kEmulated };

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;
  // In place: t = sum over ranks.
  virtual absl::Status AllReduceSum(at::Tensor& t) = 0;
  // input is [world * n] (consumed: it may be overwritten); output [n] gets
  // the sum of every rank's chunk `rank`; it may be that chunk of input (in place).
  virtual absl::Status ReduceScatterSum(at::Tensor& input, at::Tensor& output) = 0;
  // input is [n], output [world * n]: chunk r is rank r's input.
  virtual absl::Status AllGather(const at::Tensor& input, at::Tensor& output) = 0;
  // In place: flat is [world * n] and chunk `rank` holds this rank's part;
  // afterwards every chunk holds its owner's part, with no extra buffer.
  virtual absl::Status AllGatherInPlace(at::Tensor& flat) = 0;
  virtual absl::Status Broadcast(at::Tensor& t, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // Small byte strings through the store: every rank's `value`, on rank 0
  // (others get an empty vector). Used to gather reports.
  virtual absl::StatusOr<std::vector<std::string>> GatherToRankZero(const std::string& key,
                                                                    const std::string& value) = 0;
};

absl::StatusOr<std::unique_ptr<Collectives>> CreateCollectives(const RankInfo& info, CollectiveBackend backend,
                                                               absl::Duration timeout);

// A free TCP port on 127.0.0.1 (for self-spawned ranks and tests).
absl::StatusOr<int> FindFreePort();

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_COLLECTIVES_H_
