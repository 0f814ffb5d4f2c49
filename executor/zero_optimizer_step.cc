// ZeroEngine's optimizer step (zero_engine.h): the global gradient norm
// (fp64 pieces at stages 1/2, as get_grad_norm_direct), fp16 loss scaling,
// clipping, the fp32 gradients (the flattened partition, sub_group_size
// chunks, or FP16_Optimizer's flat copy at stage 0) and the configured Adam
// implementation with its temporaries; then every rank's parameters made
// current again. Sized by planner/zero_optimizer_step.h.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include <ATen/core/grad_mode.h>

#include "executor/device_memory.h"
#include "executor/zero_engine.h"
#include "planner/status_macros.h"
#include "planner/zero_optimizer_step.h"

namespace zplan {
namespace {

// DeepSpeed's dynamic loss scaler default (fp16.loss_scale_window 1000).
constexpr int kLossScaleWindow = 1000;

}  // namespace

at::Tensor ZeroEngine::AdamWUpdate(at::Tensor weights, at::Tensor grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                                   double lr, double grad_multiplier) {
  const OptimizerConfig& opt = config_.optimizer();
  const AdamImplementation impl = opt.implementation();
  // torch.optim.AdamW's for-loop (CPU tensors by default) and foreach
  // paths, with the temporaries they allocate; otherwise fused, in place
  // (as DeepSpeed's FusedAdam and CPU Adam). planner/zero_optimizer_step.cc,
  // AdamTemporariesPerElement, counts the same.
  if (offload_ || (impl != ADAM_IMPL_TORCH && impl != ADAM_IMPL_TORCH_FOREACH)) {
    // The fused kernel divides each gradient by grad_scale as it reads it:
    // no pass of its own over the fp32 gradients.
    std::optional<at::Tensor> grad_scale;
    if (grad_multiplier != 1.0) grad_scale = at::full({1}, 1.0 / grad_multiplier, grad.options());
    at::_fused_adamw_({weights}, {grad}, {exp_avg}, {exp_avg_sq}, {}, {step_count_}, lr, opt.beta1(), opt.beta2(),
                      opt.weight_decay(), opt.eps(), /*amsgrad=*/false, /*maximize=*/false, grad_scale);
    return at::Tensor();
  }
  // In place: the gradients are consumed by this step (zeroed or released
  // after it), and a scaled copy would be one more chunk.
  if (grad_multiplier != 1.0) grad.mul_(grad_multiplier);
  const double step = step_count_.item<double>();
  weights.mul_(1 - lr * opt.weight_decay());
  exp_avg.lerp_(grad, 1 - opt.beta1());
  exp_avg_sq.mul_(opt.beta2()).addcmul_(grad, grad, 1 - opt.beta2());
  const double bias_correction1 = 1 - std::pow(opt.beta1(), step);
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(opt.beta2(), step));
  at::Tensor denom;
  if (impl == ADAM_IMPL_TORCH && device_.is_cpu()) {
    // _single_tensor_adamw: (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(opt.eps());
  } else {
    // _multi_tensor_adamw: one sqrt, then in place.
    denom = exp_avg_sq.sqrt();
    denom.div_(bias_correction2_sqrt).add_(opt.eps());
  }
  weights.addcdiv_(exp_avg, denom, -lr / bias_correction1);
  return denom;
}

at::Tensor ZeroEngine::OwnedGradFp32(int64_t begin, int64_t end) {
  const int64_t len = end - begin;
  if (offload_) return host_grads_.narrow(0, begin, len);
  // _prepare_fp32_grad_for_sub_group: flattened into a new tensor, then
  // upcast (in fp32 the flat copy is the gradient).
  return grad_shard_.narrow(0, begin, len).clone().to(at::kFloat);
}

at::Tensor ZeroEngine::FlattenGradsFp32() {
  std::vector<at::Tensor> copies;
  copies.reserve(slots_.size());
  for (const Slot& slot : slots_) {
    const at::Tensor& grad = slot.param.grad();
    copies.push_back(grad.defined() ? grad.to(at::kFloat).reshape({-1})
                                    : at::zeros({slot.numel}, at::TensorOptions().dtype(at::kFloat).device(device_)));
  }
  at::Tensor flat = at::cat(copies);
  ZPLAN_CHECK(flat.numel() == owned_numel_);
  copies.clear();
  for (Slot& slot : slots_) slot.param.mutable_grad() = at::Tensor();
  return flat;
}

at::Tensor ZeroEngine::EachParameterGradsFp32(std::vector<at::Tensor>* grads) {
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  std::vector<at::Tensor> present;
  for (const Slot& slot : slots_) {
    if (slot.param.grad().defined()) present.push_back(slot.param.grad());
  }
  if (!mixed_ && device_.is_cuda() && !present.empty()) {
    // fp32 norms copy nothing: one multi-tensor kernel reads them all
    // (per-parameter norms left the GPU idle between launches, 6 ms of a 1B
    // model's 200 ms step on an H100).
    total += at::stack(at::_foreach_norm(present, 2)).pow(2).sum().reshape({1});
  } else {
    for (const at::Tensor& grad : present) {
      total += at::linalg_vector_norm(mixed_ ? grad.to(at::kFloat) : grad, 2).pow(2).reshape({1});
    }
  }
  present.clear();
  for (const Slot& slot : slots_) {
    const at::Tensor& grad = slot.param.grad();
    if (!mixed_) {
      grads->push_back(grad.defined() ? grad.view(-1) : at::Tensor());
    } else {
      grads->push_back(grad.defined() ? grad.to(at::kFloat).view(-1)
                                      : at::zeros({slot.numel}, at::TensorOptions().dtype(at::kFloat).device(device_)));
    }
  }
  return total;
}

void ZeroEngine::StepEachParameter(std::vector<at::Tensor>& grads, double lr, double grad_multiplier) {
  at::Tensor working = flat_params_.narrow(0, owned_begin_, owned_numel_);
  // _single_tensor_adamw's `denom` stays bound until the next parameter's
  // is made; _multi_tensor_adamw's _foreach_sqrt keeps one per parameter
  // until the step ends.
  const bool keeps_every_denom = config_.optimizer().implementation() == ADAM_IMPL_TORCH_FOREACH ||
                                 (config_.optimizer().implementation() == ADAM_IMPL_TORCH && !device_.is_cpu());
  std::vector<at::Tensor> denoms;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Slot& slot = slots_[i];
    const int64_t offset = slot.own_dst, n = slot.own_hi - slot.own_lo;
    at::Tensor weights = master_.defined() ? master_.narrow(0, offset, n) : working.narrow(0, offset, n);
    at::Tensor denom = AdamWUpdate(weights, grads[i], exp_avg_.narrow(0, offset, n), exp_avg_sq_.narrow(0, offset, n), lr,
                                   grad_multiplier);
    if (!keeps_every_denom) denoms.clear();
    denoms.push_back(std::move(denom));
  }
  denoms.clear();
  for (size_t i = 0; i < slots_.size(); ++i) {
    grads[i] = at::Tensor();
    const Slot& slot = slots_[i];
    const int64_t offset = slot.own_dst, n = slot.own_hi - slot.own_lo;
    if (master_.defined()) working.narrow(0, offset, n).copy_(master_.narrow(0, offset, n));
  }
}

at::Tensor ZeroEngine::OwnedGradSquaredNorm() {
  // Casting to fp32 for the reduction copies its input, so reduce at most one
  // sub_group_size chunk at a time (the optimizer's upcast bound).
  const int64_t chunk = std::max<int64_t>(1, std::min(config_.zero().sub_group_elements(), owned_numel_));
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  auto add_squares = [&](const at::Tensor& flat) {
    for (int64_t c = 0; c < flat.numel(); c += chunk) {
      const at::Tensor part = flat.narrow(0, c, std::min(chunk, flat.numel() - c));
      total += at::linalg_vector_norm(part, 2, std::nullopt, false, at::kFloat).pow(2).reshape({1}).to(device_);
    }
  };
  if (StepsGradPartition()) {
    // Each parameter's piece of the partition copied to fp64
    // (stage_1_and_2.py, get_grad_norm_direct; get_norm_dtype()).
    for (const Slot& slot : slots_) {
      if (slot.own_hi <= slot.own_lo || !grad_shard_.defined()) continue;
      const at::Tensor piece = grad_shard_.narrow(0, slot.own_dst, slot.own_hi - slot.own_lo);
      total += at::linalg_vector_norm(piece.to(at::kDouble), 2).pow(2).to(at::kFloat).reshape({1});
    }
    return total;
  }
  if (offload_ && stage_ < 3) {
    // complete_grad_norm_calculation_for_cpu_offload: the pieces' norms from the hooks.
    if (offload_norm_sq_.defined()) total += offload_norm_sq_.to(at::kFloat).to(device_);
    offload_norm_sq_ = at::Tensor();
    return total;
  }
  add_squares(offload_ ? host_grads_ : grad_shard_);
  return total;
}

absl::StatusOr<StepResult> ZeroEngine::Step(double learning_rate) {
  at::NoGradGuard no_grad;
  // The host reads offloaded gradients and rewrites host parameter shards
  // only once the device's copies from and to them are done.
  WaitForDevice(device_);
  const OptimizerConfig& opt = config_.optimizer();
  // Stage 0 steps each parameter, or in mixed precision with DeepSpeed's
  // FusedAdam as FP16_Optimizer does: all of it at once, sub_group_size aside.
  const bool each_parameter = StepsEachParameter(config_);
  const bool fp16_optimizer = stage_ == 0 && master_.defined() && !each_parameter;
  const int64_t chunk = fp16_optimizer ? owned_numel_ : std::min(config_.zero().sub_group_elements(), owned_numel_);
  const bool flat_partition = StepsGradPartition();
  // One sub_group_size chunk holds every owned element: its fp32 gradient
  // is made first and the norm read from it (a reduction that casts its
  // input copies it, and is many times slower).
  at::Tensor whole_grad;
  if (fp16_optimizer) {
    whole_grad = FlattenGradsFp32();
  } else if (!each_parameter && !flat_partition && chunk == owned_numel_) {
    whole_grad = OwnedGradFp32(0, owned_numel_);
  }
  // Global gradient norm: this rank's owned elements, summed over ranks
  // (stage 0 owns everything).
  std::vector<at::Tensor> each_grad;
  at::Tensor sum_sq = each_parameter        ? EachParameterGradsFp32(&each_grad)
                      : whole_grad.defined() ? at::linalg_vector_norm(whole_grad, 2).pow(2).reshape({1}).to(device_)
                                             : OwnedGradSquaredNorm();
  if (stage_ > 0) ZPLAN_RETURN_IF_ERROR(comm_->AllReduceSum(sum_sq));
  StepResult result;
  result.grad_norm = std::sqrt(sum_sq.item<double>()) / loss_scale_;
  if (fp16_ && !std::isfinite(result.grad_norm)) {
    result.skipped = true;
    loss_scale_ = std::max(1.0, loss_scale_ / 2);
    good_steps_ = 0;
  } else {
    double multiplier = 1.0 / loss_scale_;
    if (opt.gradient_clipping() > 0 && result.grad_norm > opt.gradient_clipping()) {
      multiplier *= opt.gradient_clipping() / (result.grad_norm + 1e-6);
    }
    step_count_ += 1;
    const at::Device state_device = exp_avg_.device();
    // The working copy of the owned elements: a slice of the flat parameters
    // (stages 0-2) or the stage-3 shard buffer.
    at::Tensor working = stage_ < 3 ? flat_params_.narrow(0, owned_begin_, owned_numel_) : flat_shards_;
    // Stages 1/2 step the whole partition (stage_1_and_2.py, step); the
    // others one sub_group_size chunk at a time.
    const int64_t step_chunk = flat_partition ? owned_numel_ : chunk;
    if (each_parameter) {
      StepEachParameter(each_grad, learning_rate, multiplier);
    } else {
      for (int64_t c = 0; c < owned_numel_; c += step_chunk) {
        const int64_t len = std::min(step_chunk, owned_numel_ - c);
        at::Tensor grad;
        if (flat_partition) {
          // The partition flattened in the working dtype, upcast to fp32 (in
          // fp32 training the flat copy is the fp32 one), then released
          // (_get_preflattened_grad_partition, _release_preflattened_grad_buffers).
          EnsureGradPartition();  // a rank no gradient reached (zeros)
          {
            const at::Tensor flat = grad_shard_.clone();
            grad = flat.to(at::kFloat);
          }
          grad_shard_ = at::Tensor();
        } else {
          grad = whole_grad.defined() ? std::move(whole_grad) : OwnedGradFp32(c, c + len);
        }
        if (grad.device() != state_device) grad = grad.to(state_device);
        at::Tensor weights = master_.defined() ? master_.narrow(0, c, len) : working.narrow(0, c, len);
        AdamWUpdate(weights, grad, exp_avg_.narrow(0, c, len), exp_avg_sq_.narrow(0, c, len), learning_rate,
                    multiplier);
        if (offload_bit16_.defined()) {
          working.narrow(0, c, len).copy_(offload_bit16_.narrow(0, c, len).copy_(weights));
        } else if (master_.defined()) {
          working.narrow(0, c, len).copy_(weights);
        }
      }
    }
    if (fp16_ && ++good_steps_ % kLossScaleWindow == 0) loss_scale_ *= 2;
  }
  // Every rank gets everyone's updated elements.
  if (stage_ == 1 || stage_ == 2) {
    ZPLAN_RETURN_IF_ERROR(comm_->AllGatherInPlace(flat_params_));
  } else if (stage_ == 3) {
    ZPLAN_RETURN_IF_ERROR(RefreshPersistent());
  }
  // Gradients: per-parameter ones and the stage-1/2 partition are
  // released; the other shards are zeroed.
  for (Slot& slot : slots_) slot.param.mutable_grad() = at::Tensor();
  micro_step_ = 0;
  if (stage_ == 1 || stage_ == 2) grad_shard_ = at::Tensor();
  if (grad_shard_.defined()) grad_shard_.zero_();
  if (host_grads_.defined()) host_grads_.zero_();
  return result;
}

}  // namespace zplan
