#include "executor/zero_engine.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "executor/counting_allocator.h"
#include "executor/device_memory.h"
#include "planner/inventory.h"
#include "planner/status_macros.h"
#include "planner/zero_refusals.h"

// ZeroEngine's construction and checkpoints; its concerns are in
// zero_partitioning.cc, zero_buckets.cc, zero_gather.cc, zero_offload.cc and
// zero_optimizer_step.cc (docs/zero_concerns.md).

namespace zplan {
namespace {

// DeepSpeed's dynamic loss scaler default (fp16.initial_scale_power 16).
constexpr double kInitialLossScale = 65536.0;

NamedTensor ToNamed(const std::string& name, const at::Tensor& t) {
  NamedTensor out;
  out.set_name(name);
  const at::Tensor host = t.detach().to(at::kCPU).contiguous();
  out.set_dtype(host.scalar_type() == at::kFloat      ? "float32"
                : host.scalar_type() == at::kBFloat16 ? "bfloat16"
                                                      : "float16");
  for (int64_t d : host.sizes()) out.add_shape(d);
  out.set_data(host.data_ptr(), host.nbytes());
  return out;
}

absl::Status FromNamed(const NamedTensor& in, at::Tensor dst) {
  if (in.data().size() != dst.nbytes()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint tensor ", in.name(), " has ", in.data().size(),
                                                      " bytes, this run needs ", dst.nbytes()));
  }
  at::Tensor host = at::empty(dst.sizes(), dst.options().device(at::kCPU));
  std::memcpy(host.data_ptr(), in.data().data(), in.data().size());
  dst.copy_(host);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroEngine>> ZeroEngine::Create(Transformer* model, Collectives* comm,
                                                               const RunConfig& config) {
  const ZeroConfig& zero = config.zero();
  ZPLAN_RETURN_IF_ERROR(RefuseEngineConfig(config));  // planner/zero_refusals.h
  std::unique_ptr<ZeroEngine> e(new ZeroEngine);
  e->model_ = model;
  e->comm_ = comm;
  e->config_ = config;
  e->stage_ = zero.stage();
  e->mixed_ = config.precision() != PRECISION_FP32;
  e->fp16_ = config.precision() == PRECISION_FP16;
  e->offload_ = zero.offload_optimizer() == OFFLOAD_CPU;
  e->loss_scale_ = e->fp16_ ? kInitialLossScale : 1.0;
  const int world = comm->world_size();
  const int rank = comm->rank();
  const int num_layers = StepNumBlocks(model->spec());  // the parts' blocks (inventory.h)

  // Frozen parameters (LoRA's base model) have no flat buffer, gradient or
  // optimizer state, as DeepSpeed's optimizers hold only the parameters they
  // are given: below stage 3 they stay the model's own tensors in the working
  // dtype; stage 3 partitions and gathers them with the rest (zero.Init).
  int64_t total = 0;
  const std::vector<TensorSpec> inventory = ParameterInventory(model->spec());
  size_t index = 0;
  for (auto& [name, param] : model->mutable_parameters()) {
    const bool frozen = !param.requires_grad();
    const TensorSpec& tensor = inventory[index++];
    if (frozen && e->stage_ < 3) continue;
    Slot slot;
    slot.name = name;
    if (e->stage_ == 3 && !frozen) slot.leaf = DeepSpeedLeafBlockOf(model->spec(), tensor);
    slot.param = param;
    slot.frozen = frozen;
    slot.shape = param.sizes().vec();
    slot.numel = param.numel();
    slot.flat_offset = total;
    if (!frozen) total += slot.numel;
    e->slots_.push_back(std::move(slot));
  }
  const auto first_trainable = std::find_if(e->slots_.begin(), e->slots_.end(), [](const Slot& s) { return !s.frozen; });
  ZPLAN_CHECK(first_trainable != e->slots_.end());
  e->device_ = first_trainable->param.device();
  e->dtype_ = first_trainable->param.scalar_type();
  for (const Slot& slot : e->slots_) {
    if (!slot.frozen && slot.param.scalar_type() != e->dtype_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "trainable parameters in two dtypes (", slot.name, " is ", c10::toString(slot.param.scalar_type()), ", ",
          first_trainable->name, " ", c10::toString(e->dtype_), "): zrun keeps one flat buffer of them"));
    }
  }
  e->grad_dtype_ = e->fp16_ ? at::kHalf : e->mixed_ ? at::kBFloat16 : at::kFloat;
  const auto options = at::TensorOptions().dtype(e->dtype_).device(e->device_);

  // Ownership (zero_partitioning.cc), then the gradient hooks (zero_buckets.cc),
  // while every parameter is still whole.
  int64_t frozen_numel = 0;  // stage 3: the frozen parameters' chunks
  e->AssignOwnership(total, world, rank, &frozen_numel);
  e->RegisterGradHooks();
  // Stages 1/2: this rank's gradient partition holds every parameter that
  // touches its shard whole (sharding.h).
  for (const Slot& slot : e->slots_) {
    if (e->stage_ < 3 && slot.own_hi > slot.own_lo) e->partition_numel_ += slot.numel;
  }

  at::NoGradGuard no_grad;
  std::optional<ScopedMemoryTag> tag(std::in_place, COMPONENT_PARAMS);
  // Offloaded host buffers are page-locked with pin_memory (a CUDA device to pin for).
  const bool pin = zero.pin_memory() && e->device_.is_cuda();
  e->pin_memory_ = pin;
  e->PlaceParameters(total, world, options, pin, frozen_numel, num_layers);  // zero_partitioning.cc

  // Every parameter is in place: what building the model took at most.
  e->construction_peak_bytes_ = SampleDeviceMemory(e->device_).peak_allocated_bytes;

  e->AllocateModelStates(tag, pin);              // zero_partitioning.cc
  e->AllocateOffloadBuffers(tag, pin, options);  // zero_offload.cc

  if (e->stage_ == 3) {
    // The gradient partition; with optimizer offload on the host, upcast
    // into host_grads_ at the accumulation boundary (stage3.py,
    // grad_partitions_flat_buffer on the offload device).
    tag.emplace(COMPONENT_GRADS);
    if (e->offload_) {
      e->grad_shard_ = HostZeros(e->owned_numel_, e->grad_dtype_, pin);
    } else {
      e->grad_shard_ = at::zeros({e->owned_numel_}, options.dtype(e->grad_dtype_));
    }
    e->AllocateBuckets();
    e->InstallGatherHooks(num_layers);  // zero_gather.cc
  }
  return e;
}

ZeroEngine::~ZeroEngine() = default;

double ZeroEngine::loss_scale() const {
  return loss_scale_ / static_cast<double>(config_.gradient_accumulation_steps());
}

absl::Status ZeroEngine::AfterBackward(bool last_micro_step) {
  absl::Status status = FinishBackward(last_micro_step);
  ++micro_step_;
  return status;
}

CheckpointShard ZeroEngine::SaveState() const {
  CheckpointShard shard;
  shard.set_rank(comm_->rank());
  shard.set_world_size(comm_->world_size());
  shard.set_stage(stage_);
  shard.set_precision(config_.precision() == PRECISION_FP32 ? "fp32" : fp16_ ? "fp16" : "bf16");
  // Frozen parameters are rebuilt from the seed: only what trains is saved.
  int64_t total = 0;
  for (const Slot& slot : slots_) total += slot.frozen ? 0 : slot.numel;
  shard.set_total_params(total);
  shard.set_loss_scale(loss_scale_);
  shard.set_good_steps(good_steps_);
  const at::Tensor working = stage_ < 3 ? flat_params_.narrow(0, owned_begin_, owned_numel_) : flat_shards_;
  *shard.add_tensors() = ToNamed("working", working);
  if (master_.defined()) *shard.add_tensors() = ToNamed("master", master_);
  *shard.add_tensors() = ToNamed("exp_avg", exp_avg_);
  *shard.add_tensors() = ToNamed("exp_avg_sq", exp_avg_sq_);
  *shard.add_tensors() = ToNamed("step_count", step_count_.reshape({1}));
  for (const Slot& slot : slots_) {
    if (slot.frozen) continue;
    OwnedSlice* s = shard.add_slices();
    s->set_param(slot.name);
    for (int64_t d : slot.shape) s->add_shape(d);
    s->set_lo(slot.own_lo);
    s->set_hi(slot.own_hi);
    s->set_dst(slot.own_dst);
  }
  return shard;
}

absl::Status ZeroEngine::LoadState(const CheckpointShard& shard) {
  const CheckpointShard mine = SaveState();  // the layout this run expects
  if (shard.world_size() != mine.world_size() || shard.stage() != mine.stage() ||
      shard.total_params() != mine.total_params() || shard.precision() != mine.precision() ||
      shard.rank() != mine.rank()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint of rank ", shard.rank(), "/", shard.world_size(), ", ZeRO-", shard.stage(), ", ",
        shard.total_params(), " parameters, ", shard.precision(), " does not match this run (rank ", mine.rank(), "/",
        mine.world_size(), ", ZeRO-", mine.stage(), ", ", mine.total_params(), " parameters, ", mine.precision(),
        "); resume with the plan it was written for"));
  }
  at::NoGradGuard no_grad;
  at::Tensor working = stage_ < 3 ? flat_params_.narrow(0, owned_begin_, owned_numel_) : flat_shards_;
  at::Tensor step = step_count_.view({1});
  for (const NamedTensor& t : shard.tensors()) {
    at::Tensor dst = t.name() == "working"      ? working
                     : t.name() == "master"     ? master_
                     : t.name() == "exp_avg"    ? exp_avg_
                     : t.name() == "exp_avg_sq" ? exp_avg_sq_
                     : t.name() == "step_count" ? step
                                                : at::Tensor();
    if (!dst.defined()) return absl::FailedPreconditionError("checkpoint has an unknown tensor " + t.name());
    ZPLAN_RETURN_IF_ERROR(FromNamed(t, dst));
  }
  loss_scale_ = shard.loss_scale();
  good_steps_ = shard.good_steps();
  if (stage_ == 1 || stage_ == 2) {
    ZPLAN_RETURN_IF_ERROR(comm_->AllGatherInPlace(flat_params_));
  } else if (stage_ == 3) {
    ZPLAN_RETURN_IF_ERROR(RefreshPersistent());
  }
  return absl::OkStatus();
}

}  // namespace zplan
