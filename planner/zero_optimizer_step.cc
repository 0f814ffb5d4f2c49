#include "planner/zero_optimizer_step.h"

#include <algorithm>
#include <vector>

#include "planner/inventory.h"

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

// What torch's AdamW allocates stepping a list of tensors (a stage-0
// parameter list, in the optimizer's order) instead of one flat tensor:
// the for-loop's `denom` stays bound until the next parameter's is made
// (optim/adamw.py, _single_tensor_adamw), so the widest moment is the
// previous parameter's denom beside this one's sqrt and quotient; the
// foreach path keeps every parameter's sqrt (_multi_tensor_adamw,
// _foreach_sqrt) at once.
int64_t PerParameterAdamTemporaryBytes(AdamImplementation impl, bool cpu_tensors,
                                       const std::vector<TensorSpec>& trainable) {
  const int64_t per_element = AdamTemporariesPerElement(impl, cpu_tensors);
  if (per_element < 2) {
    int64_t total = 0;
    for (const TensorSpec& t : trainable) total += NumElements(t);
    return per_element * total * 4;
  }
  int64_t widest = 0, previous = 0;
  for (const TensorSpec& t : trainable) {
    const int64_t n = NumElements(t);
    widest = std::max(widest, (previous + per_element * n) * 4);
    previous = n;
  }
  return widest;
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
    // Stage 3 upcasts this rank's gradients one sub-group at a time (mixed
    // precision); stage 0 steps each parameter or flattens them all.
    const int64_t sub_group = std::min(zero.sub_group_elements(), owned);
    if (StepsEachParameter(config)) {
      // In mixed precision FP16_UnfusedOptimizer.step's get_weight_norm
      // copies one gradient at a time to fp32, then every per-parameter fp32
      // master gets an fp32 copy of its gradient, all alive beside the
      // working-dtype ones until after the step.
      s.step_per_parameter = true;
      if (s.mixed) {
        for (const TensorSpec& t : in.trainable) s.step_norm_copy = std::max(s.step_norm_copy, NumElements(t) * 4);
        s.step_grad_copies = trained * 4;
      }
      s.step_optimizer_temps =
          PerParameterAdamTemporaryBytes(config.optimizer().implementation(), s.cpu_ranks, in.trainable);
    } else if (s.stage == 0) {
      // FP16_Optimizer flattens every gradient at once (no sub-groups).
      s.step_grad_copies = s.step_upcast = trained * 4;
    } else {
      // _prepare_fp32_grad_for_sub_group (stage3.py): the sub-group's
      // gradients flattened into a new working-dtype tensor, upcast to fp32
      // (in fp32 training the flat copy is the fp32 one) and the flat copy
      // dropped.
      s.step_flat_grads = s.mixed ? sub_group * w : 0;
      s.step_upcast = sub_group * 4;
    }
    if (s.stage == 3) s.step_optimizer_temps = adam_temps * sub_group * 4;
  }
}

bool StepsEachParameter(const RunConfig& config) {
  const AdamImplementation impl = config.optimizer().implementation();
  const bool fused_adam = impl == ADAM_IMPL_UNSPECIFIED || impl == ADAM_IMPL_DEEPSPEED;
  return config.zero().stage() == 0 && (config.precision() == PRECISION_FP32 || !fused_adam);
}

}  // namespace zplan
