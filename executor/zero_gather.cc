// ZeroEngine's stage-3 gather coordinator (zero_engine.h): a part
// (embedding, block, head) all-gathered before its forward and backward and
// released after, unless DeepSpeed keeps it for its reuse (planner/sharding.h,
// Stage3Retention); the next part prefetched within
// min(stage3_prefetch_bucket_size, stage3_max_live_parameters - gathered);
// persistent parameters refreshed after the step. Sized by
// planner/zero_gather.h.
#include <algorithm>

#include <ATen/core/grad_mode.h>

#include "executor/counting_allocator.h"
#include "executor/zero_engine.h"
#include "planner/status_macros.h"

namespace zplan {

void ZeroEngine::InstallGatherHooks(int num_layers) {
  ZeroEngine* engine = this;
  auto fail = [engine](absl::Status s) {
    if (!s.ok() && engine->hook_status_.ok()) engine->hook_status_ = s;
  };
  hooks_.before_forward = [engine, fail, num_layers](int part) {
    fail(engine->GatherWithPrefetch(part, part >= 0 && part + 1 < num_layers ? part + 1 : -2));
  };
  hooks_.after_forward = [engine](int part) { engine->Release(part, kAfterForward); };
  hooks_.before_backward = [engine, fail, num_layers](int part) {
    fail(engine->GatherWithPrefetch(part, part >= 1 && part < num_layers ? part - 1 : -2));
  };
  hooks_.after_backward = [engine](int part) { engine->Release(part, kAfterBackward); };
}

absl::Status ZeroEngine::Gather(int part) {
  for (size_t index : parts_[part + 1]) ZPLAN_RETURN_IF_ERROR(GatherSlot(index));
  return absl::OkStatus();
}

absl::Status ZeroEngine::GatherSlot(size_t index) {
  Slot& slot = slots_[index];
  if (slot.persistent || slot.gathered) return absl::OkStatus();
  at::NoGradGuard no_grad;
  ScopedMemoryTag tag(COMPONENT_PARAMS);
  const int world = comm_->world_size();
  // The gathered buffer is the only allocation (in-place all-gather). From
  // pinned host shards (offload_param) the copy does not block the host;
  // the collective is ordered after it on the stream, and Step waits
  // before the host writes the shards again.
  at::Tensor full =
      at::empty({slot.shard_numel * world}, at::TensorOptions().dtype(slot.param.scalar_type()).device(device_));
  full.narrow(0, slot.shard_numel * comm_->rank(), slot.shard_numel)
      .copy_(ShardsOf(slot).narrow(0, slot.own_dst, slot.shard_numel), /*non_blocking=*/true);
  ZPLAN_RETURN_IF_ERROR(comm_->AllGatherInPlace(full));
  slot.param.set_data(full.narrow(0, 0, slot.numel).view(slot.shape));
  slot.gathered = true;
  return absl::OkStatus();
}

void ZeroEngine::Release(int part, ReleasePoint point) {
  const bool head = part + 2 == static_cast<int>(parts_.size());
  for (size_t index : parts_[part + 1]) {
    Slot& slot = slots_[index];
    if (slot.persistent || !slot.gathered) continue;
    // DeepSpeed keeps what it will use again soon (sharding.h, Stage3Retention).
    if (point == kAfterForward && (head ? retention_.head_kept : retention_.kept_after_forward[index])) continue;
    if (point == kAfterBackward && head && tied_head_ && retention_.embedding_kept) continue;
    slot.param.set_data(at::empty({0}, at::TensorOptions().dtype(slot.param.scalar_type()).device(device_)));
    slot.gathered = false;
  }
}

absl::Status ZeroEngine::GatherWithPrefetch(int part, int next) {
  ZPLAN_RETURN_IF_ERROR(Gather(part));
  // Backward: DeepSpeed's prefetch passes over parts still gathered (kept)
  // to the next one it has to gather.
  auto all_gathered = [&](int p) {
    for (size_t index : parts_[p + 1]) {
      if (!slots_[index].persistent && !slots_[index].gathered) return false;
    }
    return true;
  };
  while (next >= 0 && next < part && all_gathered(next)) --next;
  if (next < -1) return absl::OkStatus();
  // Then the next part's parameters, in order, while fewer than
  // min(prefetch bucket, live cap - gathered) elements are in flight; the
  // one that crosses the limit goes too (DeepSpeed's stage-3 coordinator).
  int64_t gathered = 0;
  for (size_t index : parts_[part + 1]) gathered += slots_[index].persistent ? 0 : slots_[index].numel;
  const ZeroConfig& zero = config_.zero();
  const int64_t limit = std::min(zero.stage3_prefetch_bucket_elements(), zero.stage3_max_live_parameters() - gathered);
  int64_t prefetched = 0;
  for (size_t index : parts_[next + 1]) {
    if (prefetched >= limit) break;
    if (slots_[index].persistent || slots_[index].gathered) continue;
    ZPLAN_RETURN_IF_ERROR(GatherSlot(index));
    prefetched += slots_[index].numel;
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::RefreshPersistent() {
  if (unpartitioned_) return absl::OkStatus();  // the parameters are their chunks
  const int world = comm_->world_size();
  for (Slot& slot : slots_) {
    if (!slot.persistent || slot.frozen) continue;  // frozen ones never change
    at::Tensor full = at::empty({slot.shard_numel * world}, at::TensorOptions().dtype(dtype_).device(device_));
    full.narrow(0, slot.shard_numel * comm_->rank(), slot.shard_numel)
        .copy_(flat_shards_.narrow(0, slot.own_dst, slot.shard_numel));
    ZPLAN_RETURN_IF_ERROR(comm_->AllGatherInPlace(full));
    slot.param.view(-1).copy_(full.narrow(0, 0, slot.numel));
  }
  return absl::OkStatus();
}

}  // namespace zplan
