#include "planner/zero_offload.h"

#include <algorithm>

#include "planner/units.h"

namespace zplan {

void SizeOffload(const ZeroSizingInputs& in, StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ShardLayout& sh = s.shards;
  const ZeroConfig& zero = in.config.zero();
  const std::vector<TensorSpec>& trainable = in.trainable;
  const int64_t w = in.w, owned = in.owned;
  if (s.offload_optimizer) {
    s.host_master = owned * kMasterBytesPerParam;
    s.host_optimizer = owned * kAdamStateBytesPerParam;
    s.host_grads = owned * kOffloadGradBytesPerParam;
    // Stage 3 reduces into a working-dtype partition on the host first
    // (stage3.py, grad_partitions_flat_buffer on the offload device), upcast
    // into the fp32 gradients at the accumulation boundary.
    if (s.stage == 3) s.host_grads += owned * w;
  }
  if (s.offload_param) s.host_params = Stage3ChunkBytes(sh, w, in.adapter_w);
  int64_t largest = 0;  // trainable: the offload staging buffers hold gradients
  for (const TensorSpec& t : trainable) largest = std::max(largest, NumElements(t));
  if (s.offload_optimizer && s.stage <= 2) {
    s.offload_staging_resident = largest * w;
    s.host_offload_staging = largest * w + sh.flat_shard_elements * w;
  }
  // Page-locked buffers (CUDA ranks with pin_memory): those DeepSpeed pins,
  // each its own CachingHostAllocator block, rounded up to a power of two
  // (ATen/core/CachingHostAllocator.h, allocate: PowerOf2Ceil). CPU Adam's
  // states are plain host tensors (ops/adam/cpu_adam.py, step: zeros_like),
  // and so is stage 3's fp32 partition (stage3.py, _create_fp32_partitions).
  if (s.pin_memory && !s.cpu_ranks) {
    std::vector<int64_t> pinned;
    if (s.offload_optimizer && s.stage <= 2) {
      // stage_1_and_2.py, __init__ and initialize_optimizer_states: the fp32
      // partition and its gradient, the bit16 copy, the gradient staging buffer.
      pinned = {s.host_master, s.host_grads, sh.flat_shard_elements * w, largest * w};
    } else if (s.offload_optimizer) {
      // stage3.py: grad_partitions_flat_buffer (_setup_for_real_optimizer),
      // and each sub-group's fp32 gradient (initialize_optimizer_states).
      pinned.push_back(owned * w);
      const int64_t sub_group = std::max<int64_t>(1, zero.sub_group_elements());
      for (int64_t begin = 0; begin < owned; begin += sub_group) {
        pinned.push_back(std::min(sub_group, owned - begin) * kOffloadGradBytesPerParam);
      }
    }
    // stage3.py, _create_fp16_partitions_with_defragmentation: param_groups_fp16_flat_cpu_memory.
    if (s.offload_param) pinned.push_back(s.host_params);
    for (const int64_t bytes : pinned) {
      const int64_t block = RoundUpToPowerOfTwo(bytes);
      s.host_pinned += block;
      s.host_pinned_rounding += block - bytes;
    }
  }
}

}  // namespace zplan
