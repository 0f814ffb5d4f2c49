#include "planner/zero_optimizer_step.h"

#include <algorithm>

namespace zplan {
namespace {

// Fp32 temporaries per stepped element an Adam implementation allocates:
// torch.optim.AdamW's for-loop (_single_tensor_adamw: sqrt, then the
// division, both alive), its foreach path (_multi_tensor_adamw: one sqrt
// list, the rest in place), none for the fused kernels and DeepSpeed's
// FusedAdam / CPU Adam. torch picks foreach by default only when every
// tensor is on CUDA (optim/optimizer.py, _default_to_fused_or_foreach).
int64_t AdamTemporariesPerElement(AdamImplementation impl, bool cpu_tensors) {
  switch (impl) {
    case ADAM_IMPL_TORCH: return cpu_tensors ? 2 : 1;
    case ADAM_IMPL_TORCH_FOREACH: return 1;
    default: return 0;
  }
}

}  // namespace

void SizeOptimizerStep(const ZeroSizingInputs& in, StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ShardLayout& sh = s.shards;
  const ZeroConfig& zero = in.config.zero();
  const RunConfig& config = in.config;
  const int64_t w = in.w, owned = in.owned;
  const int64_t trained = sh.trainable_elements;
  const int64_t adam_temps = AdamTemporariesPerElement(config.optimizer().implementation(), s.cpu_ranks);
  if (s.offload_optimizer) {
    // Nothing on the device: CPU Adam steps the host partition.
  } else if (s.stage == 1 || s.stage == 2) {
    const int64_t shard = sh.flat_shard_elements;
    s.step_flat_grads = s.mixed ? shard * w : 0;                   // fp32: the flat copy is the fp32 one
    s.step_fp32_grads = shard * 4;
    s.step_optimizer_temps = adam_temps * shard * 4;
  } else {
    // Stages 0/3 take this rank's gradients as contiguous fp32 one sub-group
    // at a time: an upcast (mixed precision), or at stage 0 a gather from
    // the per-parameter gradients (fp32 too).
    const int64_t sub_group = std::min(zero.sub_group_elements(), owned);
    if (s.stage == 0 && s.mixed) {
      // FP16_Optimizer flattens every gradient at once (no sub-groups).
      s.step_grad_copies = s.step_upcast = trained * 4;
    } else if (s.mixed || s.stage == 0) {
      s.step_upcast = sub_group * 4;
    }
    if (s.stage == 3) s.step_optimizer_temps = adam_temps * sub_group * 4;
  }
}

}  // namespace zplan
