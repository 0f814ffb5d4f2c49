// ZeroEngine's optimizer and parameter offload (zero_engine.h): page-locked
// host buffers, stages 1/2's staging buffers (stage_1_and_2.py, __init__),
// and each reduced gradient's owned part copied to the host, accumulated
// there across micro-steps. Sized by planner/zero_offload.h.
#include <algorithm>
#include <optional>

#include "executor/counting_allocator.h"
#include "executor/zero_engine.h"

namespace zplan {

at::Tensor ZeroEngine::HostZeros(int64_t numel, at::ScalarType dtype, bool pinned) {
  return at::zeros({numel}, at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(pinned));
}

void ZeroEngine::AllocateOffloadBuffers(std::optional<ScopedMemoryTag>& tag, bool pin,
                                        const at::TensorOptions& options) {
  if (offload_ && stage_ <= 2) {
    // stage_1_and_2.py, __init__: param_buffer_of_bit16_for_cpu_offload_groups,
    // temp_grad_buffer_for_cpu_offload / _for_gpu_offload.
    tag.emplace(COMPONENT_BUFFERS);
    int64_t largest = 0;
    for (const Slot& slot : slots_) largest = std::max(largest, slot.numel);
    offload_bit16_ = HostZeros(owned_numel_, dtype_, pin);
    offload_grad_host_ = HostZeros(largest, dtype_, pin);
    offload_grad_device_ = at::zeros({largest}, options);
  }
}

void ZeroEngine::OffloadGrad(Slot& slot, const at::Tensor& grad) {
  // Every copy is non_blocking on the current stream (the offload stream on
  // CUDA, OffloadStreamScope): the host reads or rewrites these buffers only
  // after WaitForDevice. Device temporaries are pieces of one parameter.
  const int64_t len = slot.own_hi - slot.own_lo;
  const at::Tensor owned = stage_ == 3 ? grad : grad.narrow(0, slot.own_lo, len);
  if (stage_ == 3) {
    // stage3.py, partition_grads: the first micro-step copies into the host
    // partition; later ones bring its piece to the device, add, copy back.
    at::Tensor dst = grad_shard_.narrow(0, slot.own_dst, len);
    if (micro_step_ == 0) {
      dst.copy_(owned, /*non_blocking=*/true);
      return;
    }
    at::Tensor sum = dst.to(device_, /*non_blocking=*/true);  // CPU ranks: dst itself
    sum.add_(owned);
    if (!sum.is_same(dst)) dst.copy_(sum, /*non_blocking=*/true);
    return;
  }
  // Stages 1/2, stage_1_and_2.py, copy_grads_in_partition with cpu_offload:
  // at stage 2, unless it is the window's only micro-step, the whole
  // gradient goes through its own host buffer, which from the second
  // micro-step on comes back through the device staging buffer and is added
  // there (async_accumulate_grad_in_cpu_via_gpu); at the boundary the owned
  // piece is upcast on the device and copied into the fp32 host gradients
  // (async_inplace_copy_grad_to_fp32_buffer_from_gpu). Stage 1 reduces once,
  // at the boundary, what autograd accumulated (reduce_ready_partitions_and_remove_grads).
  const bool boundary = micro_step_ + 1 >= config_.gradient_accumulation_steps();
  if (stage_ == 2 && (micro_step_ > 0 || !boundary)) {
    if (!slot.host_accumulated.defined()) {
      ScopedMemoryTag tag(COMPONENT_GRADS);
      slot.host_accumulated = HostZeros(slot.numel, dtype_, pin_memory_);
    }
    if (micro_step_ > 0) {
      grad.add_(offload_grad_device_.narrow(0, 0, slot.numel).copy_(slot.host_accumulated, /*non_blocking=*/true));
    }
    slot.host_accumulated.copy_(grad, /*non_blocking=*/true);
  }
  if (boundary) {
    // copy_grads_in_partition: the piece's norm from its fp64 copy, then its fp32 upcast to the host.
    const at::Tensor norm = at::linalg_vector_norm(owned.to(at::kDouble), 2).pow(2).reshape({1});
    offload_norm_sq_ = offload_norm_sq_.defined() ? offload_norm_sq_ + norm : norm;
    host_grads_.narrow(0, slot.own_dst, len).copy_(owned.to(at::kFloat), /*non_blocking=*/true);
  }
}

}  // namespace zplan
