#include "executor/zero_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "executor/counting_allocator.h"
#include "executor/device_memory.h"
#include "planner/inventory.h"
#include "planner/memory_model.h"
#include "planner/run_config.h"
#include "planner/sharding.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// DeepSpeed's dynamic loss scaler defaults (fp16.initial_scale_power 16,
// loss_scale_window 1000).
constexpr double kInitialLossScale = 65536.0;
constexpr int kLossScaleWindow = 1000;

// A zeroed host buffer; `pinned`: allocated page-locked (one CachingHostAllocator
// block, rounded up to a power of two), not a pinned copy of a pageable one.
at::Tensor HostZeros(int64_t numel, at::ScalarType dtype, bool pinned) {
  return at::zeros({numel}, at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(pinned));
}

// Fires after AccumulateGrad has written a parameter's .grad (as DDP's reducer does).
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(ZeroEngine* engine, size_t slot) : engine_(engine), slot_(slot) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    engine_->OnGradReady(slot_);
    return outputs;
  }

 private:
  ZeroEngine* engine_;
  size_t slot_;
};

// Stages 0/1 keep each weight gradient autograd produced (as .grad) until
// the step: from here on its bytes count as gradients, not temporaries.
class GradKeptHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradKeptHook(at::Tensor param) : param_(std::move(param)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (param_.grad().defined()) TagAllocation(param_.grad().storage().data(), COMPONENT_GRADS);
    return outputs;
  }

 private:
  at::Tensor param_;
};

// Which part of the model a parameter belongs to: -1 embeddings, blocks, L head.
int PartOf(const std::string& name, int num_layers) {
  if (absl::StartsWith(name, "embed_")) return -1;
  if (absl::StartsWith(name, "layers.")) {
    int layer = 0;
    const std::string rest = name.substr(7, name.find('.', 7) - 7);
    if (absl::SimpleAtoi(rest, &layer)) return layer;
  }
  return num_layers;  // final_norm, lm_head
}

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
  if (zero.offload_optimizer() == OFFLOAD_CPU && zero.stage() == 0) {
    return absl::InvalidArgumentError("zero.offload_optimizer: optimizer offload needs ZeRO stage >= 1");
  }
  if (zero.offload_param() == OFFLOAD_CPU && zero.stage() != 3) {
    return absl::InvalidArgumentError("zero.offload_param: parameter offload needs ZeRO stage 3");
  }
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
  const int num_layers = static_cast<int>(model->spec().num_layers());

  // Frozen parameters (LoRA's base model) have no flat buffer, gradient or
  // optimizer state, as DeepSpeed's optimizers hold only the parameters they
  // are given: below stage 3 they stay the model's own tensors in the working
  // dtype; stage 3 partitions and gathers them with the rest (zero.Init).
  int64_t total = 0;
  for (auto& [name, param] : model->mutable_parameters()) {
    const bool frozen = !param.requires_grad();
    if (frozen && e->stage_ < 3) continue;
    Slot slot;
    slot.name = name;
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

  // Ownership: stage 0 owns everything; stages 1/2 a slice of the flat
  // buffer; stage 3 a ceil(numel / N) chunk of every parameter.
  int64_t frozen_numel = 0;  // stage 3: the frozen parameters' chunks
  if (e->stage_ < 3) {
    const int64_t shard = e->stage_ == 0 ? total : FlatShardElements(total, world);
    e->owned_begin_ = e->stage_ == 0 ? 0 : rank * shard;
    e->owned_numel_ = shard;
    for (Slot& slot : e->slots_) {
      slot.own_lo = std::clamp(e->owned_begin_ - slot.flat_offset, int64_t{0}, slot.numel);
      slot.own_hi = std::clamp(e->owned_begin_ + shard - slot.flat_offset, int64_t{0}, slot.numel);
      slot.own_dst = slot.flat_offset + slot.own_lo - e->owned_begin_;
    }
  } else {
    // On one rank without parameter offload the chunk is the parameter
    // (DeepSpeed gathers nothing there): nothing is ever released.
    e->unpartitioned_ = world == 1 && zero.offload_param() != OFFLOAD_CPU;
    int64_t offset = 0;
    for (Slot& slot : e->slots_) {
      slot.shard_numel = Stage3ShardElements(slot.numel, world);
      slot.persistent = slot.numel <= zero.stage3_param_persistence_threshold() || e->unpartitioned_;
      slot.own_lo = std::min(rank * slot.shard_numel, slot.numel);
      slot.own_hi = std::min((rank + 1) * slot.shard_numel, slot.numel);
      // Trainable chunks first in flat_shards_ (the optimizer's), frozen ones in frozen_shards_.
      int64_t& next = slot.frozen ? frozen_numel : offset;
      slot.own_dst = next;
      next += slot.shard_numel;
    }
    e->owned_numel_ = offset;
  }

  // Gradient hooks: stages 1-3 see each gradient as it is produced (stage 1
  // keeps it until the accumulation boundary), stage 0 keeps .grad. AccumulateGrad
  // records its parameter's shape when created, so create them while every
  // parameter is still whole.
  for (size_t i = 0; i < e->slots_.size(); ++i) {
    if (e->slots_[i].frozen) continue;
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(e->slots_[i].param);
    if (e->stage_ >= 1) {
      acc->add_post_hook(std::make_unique<GradReadyHook>(e.get(), i));
    } else {
      acc->add_post_hook(std::make_unique<GradKeptHook>(e->slots_[i].param));
    }
    e->accumulators_.push_back(std::move(acc));  // the graph holds accumulators weakly
  }
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
  if (e->stage_ < 3) {
    // Parameters become views of one flat buffer, padded so every rank's
    // shard has the same size (planner/sharding.h).
    const int64_t padded = e->stage_ == 0 ? total : e->owned_numel_ * world;
    e->flat_params_ = at::zeros({padded}, options);
    for (size_t i = 0; i < e->slots_.size(); ++i) {
      Slot& slot = e->slots_[i];
      at::Tensor view = e->flat_params_.narrow(0, slot.flat_offset, slot.numel).view(slot.shape);
      view.copy_(model->materialized() ? slot.param : model->InitialValue(i));
      slot.param.set_data(view);
    }
  } else {
    // Every parameter's owned chunk lives in one buffer; partitioned
    // parameters are then released, persistent ones stay whole.
    const bool offload_param = zero.offload_param() == OFFLOAD_CPU;
    e->flat_shards_ = offload_param ? HostZeros(e->owned_numel_, e->dtype_, pin)
                                    : at::zeros({e->owned_numel_}, options);
    if (frozen_numel > 0) {
      e->frozen_shards_ = offload_param ? HostZeros(frozen_numel, model->dtype(), pin)
                                        : at::zeros({frozen_numel}, options.dtype(model->dtype()));
    }
    e->parts_.resize(static_cast<size_t>(num_layers) + 2);
    for (size_t i = 0; i < e->slots_.size(); ++i) {
      Slot& slot = e->slots_[i];
      at::Tensor chunk = e->ShardsOf(slot).narrow(0, slot.own_dst, slot.own_hi - slot.own_lo);
      if (model->materialized()) {
        chunk.copy_(slot.param.view(-1).narrow(0, slot.own_lo, slot.own_hi - slot.own_lo));
      } else {
        // zero.Init: the parameter exists whole only now, in fp32 on the
        // rank's device (partition_parameters.py, Init: tensors are created
        // on the accelerator); its chunk is kept (and a persistent one
        // whole), the rest freed.
        const at::Tensor whole = model->InitialValue(i, e->device_);
        chunk.copy_(whole.view(-1).narrow(0, slot.own_lo, slot.own_hi - slot.own_lo));
        if (slot.persistent && !e->unpartitioned_) slot.param.set_data(whole.to(e->device_, slot.param.scalar_type()));
      }
      if (e->unpartitioned_) slot.param.set_data(chunk.view(slot.shape));
      // A modules_to_save original is never called: never gathered.
      if (!IsUnusedOriginal(slot.name)) e->parts_[PartOf(slot.name, num_layers) + 1].push_back(i);
      slot.gathered = true;
    }
    // A tied LM head uses the embedding matrix.
    e->tied_head_ = model->spec().tie_word_embeddings() && model->spec().vocab_size() > 0;
    if (e->tied_head_) e->parts_[num_layers + 1].push_back(0);
    // What DeepSpeed's coordinator keeps gathered from forward to backward
    // (a module that runs no backward, e.g. a frozen embedding, is not kept).
    const std::vector<TensorSpec> inventory = ParameterInventory(model->spec());
    const SavePolicy saves = SavePolicyFor(config);
    std::vector<bool> runs_backward;
    for (const TensorSpec& t : inventory) runs_backward.push_back(RunsBackward(model->spec(), t, saves));
    e->retention_ = Stage3RetentionOf(inventory, e->tied_head_, zero, runs_backward);
    for (int part = -1; part <= num_layers; ++part) e->Release(part, kReleaseAll);
  }

  // Every parameter is in place: what building the model took at most.
  e->construction_peak_bytes_ = SampleDeviceMemory(e->device_).peak_allocated_bytes;

  // Master weights and Adam states for the owned elements (host with offload).
  const at::Device state_device = e->offload_ ? at::Device(at::kCPU) : e->device_;
  auto fp32_state = [&](Component component, bool pinned) {
    tag.emplace(component);
    return e->offload_ ? HostZeros(e->owned_numel_, at::kFloat, pinned)
                       : at::zeros({e->owned_numel_}, at::TensorOptions().dtype(at::kFloat).device(e->device_));
  };
  // Master weights where DeepSpeed keeps them (sharding.h); with offload on
  // the host (also in fp32 training: the device copy is the working copy),
  // pinned at stages 1/2 only (planner/memory_model.cc lists what DeepSpeed pins).
  if (KeepsFp32Master(e->stage_, e->mixed_, e->offload_)) {
    e->master_ = fp32_state(COMPONENT_MASTER_PARAMS, pin && e->stage_ <= 2);
    if (e->stage_ < 3) {
      e->master_.copy_(e->flat_params_.narrow(0, e->owned_begin_, e->owned_numel_));
    } else {
      e->master_.copy_(e->flat_shards_);
    }
  }
  e->exp_avg_ = fp32_state(COMPONENT_OPTIMIZER_STATES, false);
  e->exp_avg_sq_ = fp32_state(COMPONENT_OPTIMIZER_STATES, false);
  e->step_count_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(state_device));
  if (e->offload_) e->host_grads_ = fp32_state(COMPONENT_GRADS, pin);
  if (e->offload_ && e->stage_ <= 2) {
    // stage_1_and_2.py, __init__: param_buffer_of_bit16_for_cpu_offload_groups,
    // temp_grad_buffer_for_cpu_offload / _for_gpu_offload.
    tag.emplace(COMPONENT_BUFFERS);
    int64_t largest = 0;
    for (const Slot& slot : e->slots_) largest = std::max(largest, slot.numel);
    e->offload_bit16_ = HostZeros(e->owned_numel_, e->dtype_, pin);
    e->offload_grad_host_ = HostZeros(largest, e->dtype_, pin);
    e->offload_grad_device_ = at::zeros({largest}, options);
  }

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
    ZeroEngine* engine = e.get();
    auto fail = [engine](absl::Status s) {
      if (!s.ok() && engine->hook_status_.ok()) engine->hook_status_ = s;
    };
    e->hooks_.before_forward = [engine, fail, num_layers](int part) {
      fail(engine->GatherWithPrefetch(part, part >= 0 && part + 1 < num_layers ? part + 1 : -2));
    };
    e->hooks_.after_forward = [engine](int part) { engine->Release(part, kAfterForward); };
    e->hooks_.before_backward = [engine, fail, num_layers](int part) {
      fail(engine->GatherWithPrefetch(part, part >= 1 && part < num_layers ? part - 1 : -2));
    };
    e->hooks_.after_backward = [engine](int part) { engine->Release(part, kAfterBackward); };
  }
  return e;
}

ZeroEngine::~ZeroEngine() = default;

double ZeroEngine::loss_scale() const {
  return loss_scale_ / static_cast<double>(config_.gradient_accumulation_steps());
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

void ZeroEngine::AllocateBuckets() {
  const ZeroConfig& zero = config_.zero();
  if (!buckets_.empty() || !zero.contiguous_gradients()) return;
  ScopedMemoryTag tag(COMPONENT_BUFFERS);
  // Stage 3 keeps one bucket per gradient dtype (stage3.py, ipg_buckets).
  for (int i = 0; i < (zero.overlap_comm() && stage_ < 3 ? 2 : 1); ++i) {
    buckets_.push_back(
        at::empty({zero.reduce_bucket_elements()}, at::TensorOptions().dtype(grad_dtype_).device(device_)));
  }
}

void ZeroEngine::AccumulateOwned(Slot& slot, const at::Tensor& full_grad) {
  const int64_t len = slot.own_hi - slot.own_lo;
  if (len <= 0) return;
  const double scale = 1.0 / comm_->world_size();
  if (offload_) {
    // The reduced buffer is consumed here, so it is averaged in place.
    at::Tensor grad = stage_ == 3 ? full_grad.narrow(0, slot.own_lo, len) : full_grad;
    if (scale != 1.0) grad.mul_(scale);
    OffloadGrad(slot, full_grad);
    return;
  }
  EnsureGradPartition();
  grad_shard_.narrow(0, slot.own_dst, len).add_(full_grad.narrow(0, slot.own_lo, len), scale);
}

void ZeroEngine::OffloadGrad(Slot& slot, const at::Tensor& full_grad) {
  // Every copy is non_blocking on the current stream (the offload stream on
  // CUDA, OffloadStreamScope): the host reads or rewrites these buffers only
  // after WaitForDevice. Device temporaries are pieces of one parameter.
  const int64_t len = slot.own_hi - slot.own_lo;
  const at::Tensor owned = full_grad.narrow(0, slot.own_lo, len);
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
      full_grad.add_(offload_grad_device_.narrow(0, 0, slot.numel).copy_(slot.host_accumulated, /*non_blocking=*/true));
    }
    slot.host_accumulated.copy_(full_grad, /*non_blocking=*/true);
  }
  if (boundary) host_grads_.narrow(0, slot.own_dst, len).copy_(owned.to(at::kFloat), /*non_blocking=*/true);
}

void ZeroEngine::EnsureGradPartition() {
  if (grad_shard_.defined()) return;
  // Stages 1/2: the partition appears at the first reduction that reaches
  // this rank's shard (stage_1_and_2.py, copy_grads_in_partition), or the
  // stage-1 epilogue; the owned elements are its first owned_numel_ (a
  // shard padded past the model's end, at most kFlatAlignmentElements * world
  // elements, takes its padding too).
  ScopedMemoryTag tag(COMPONENT_GRADS);
  grad_shard_ = at::zeros({std::max(partition_numel_, owned_numel_)}, at::TensorOptions().dtype(dtype_).device(device_))
                    .narrow(0, 0, owned_numel_);
}

absl::Status ZeroEngine::ReduceBucket(at::Tensor& bucket, const std::vector<Segment>& segments, int64_t fill) {
  at::Tensor used = bucket.narrow(0, 0, fill);
  ZPLAN_RETURN_IF_ERROR(comm_->AllReduceSum(used));
  for (const Segment& seg : segments) {
    Slot& slot = slots_[seg.slot];
    AccumulateOwned(slot, used.narrow(0, seg.bucket_offset, slot.numel));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::FlushBucket() {
  if (oversized_ >= 0) {
    Slot& slot = slots_[oversized_];
    oversized_ = -1;
    bucket_fill_ = 0;
    at::Tensor flat = slot.param.grad().reshape(-1);
    slot.param.mutable_grad() = at::Tensor();
    ZPLAN_RETURN_IF_ERROR(comm_->AllReduceSum(flat));
    AccumulateOwned(slot, flat);
    return absl::OkStatus();
  }
  if (bucket_fill_ == 0) return absl::OkStatus();
  absl::Status status = ReduceBucket(buckets_[current_bucket_], segments_, bucket_fill_);
  segments_.clear();
  bucket_fill_ = 0;
  current_bucket_ = (current_bucket_ + 1) % buckets_.size();
  return status;
}

void ZeroEngine::OnGradReady(size_t index) {
  // With offload the buckets, reductions and host copies run on the offload
  // stream, behind the compute that made the gradient.
  OffloadStreamScope offload_stream(device_, offload_);
  if (stage_ < 3) AllocateBuckets();  // stages 1/2: at the backward's first gradient (setup_buckets)
  if (stage_ == 1 && (!config_.zero().overlap_comm() || micro_step_ + 1 < config_.gradient_accumulation_steps())) {
    // Stage 1 reduces in the hook only with overlap_comm, at the
    // accumulation boundary, then as stage 2 (stage_1_and_2.py,
    // process_gradients); otherwise the gradient stays (accumulates) as
    // .grad until FinishBackward.
    const at::Tensor& grad = slots_[index].param.grad();
    if (grad.defined()) TagAllocation(grad.storage().data(), COMPONENT_GRADS);
    return;
  }
  ReduceThroughBucket(index);
}

void ZeroEngine::ReduceThroughBucket(size_t index) {
  Slot& slot = slots_[index];
  at::Tensor grad = slot.param.grad();
  if (!grad.defined() || !hook_status_.ok()) return;
  at::NoGradGuard no_grad;
  if (offload_) OffloadStreamScope::Retain(grad);  // read on the offload stream
  const int64_t capacity = buckets_.empty() ? 0 : buckets_.front().numel();
  absl::Status status;
  if (stage_ == 3 && slot.numel > capacity) {
    // Larger than a bucket (or no buckets): reduce the gradient itself.
    at::Tensor flat = grad.reshape(-1);
    status = comm_->AllReduceSum(flat);
    if (status.ok()) AccumulateOwned(slot, flat);
  } else {
    // Stages 1/2 as stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads:
    // a gradient that would overflow the bucket reduces it first; one larger
    // than a bucket waits, alone, for the next reduction.
    if (bucket_fill_ > 0 && bucket_fill_ + slot.numel > capacity) status = FlushBucket();
    if (status.ok() && slot.numel > capacity) {
      oversized_ = static_cast<int64_t>(index);
      bucket_fill_ = slot.numel;
      return;  // its .grad stays until then
    }
    if (status.ok()) {
      buckets_[current_bucket_].narrow(0, bucket_fill_, slot.numel).copy_(grad.reshape(-1));
      segments_.push_back({index, bucket_fill_});
      bucket_fill_ += slot.numel;
    }
  }
  if (!status.ok()) hook_status_ = status;
  slot.param.mutable_grad() = at::Tensor();  // the gradient now lives in the bucket
}

absl::Status ZeroEngine::AfterBackward(bool last_micro_step) {
  absl::Status status = FinishBackward(last_micro_step);
  ++micro_step_;
  return status;
}

absl::Status ZeroEngine::FinishBackward(bool last_micro_step) {
  ZPLAN_RETURN_IF_ERROR(hook_status_);
  if (stage_ == 3) {
    Release(-1, kAfterBackward);  // the embedding, gathered for its backward
    {
      OffloadStreamScope offload_stream(device_, offload_);
      ZPLAN_RETURN_IF_ERROR(FlushBucket());
    }
    if (offload_ && last_micro_step) {
      WaitForDevice(device_);
      host_grads_.copy_(grad_shard_);
    }
    return absl::OkStatus();
  }
  if (stage_ >= 1) {
    OffloadStreamScope offload_stream(device_, offload_);
    if (stage_ == 1 && !config_.zero().overlap_comm() && last_micro_step) {
      // reduce_gradients: every kept gradient, in parameter order, through the bucket.
      for (size_t i = 0; i < slots_.size() && hook_status_.ok(); ++i) ReduceThroughBucket(i);
      ZPLAN_RETURN_IF_ERROR(hook_status_);
    }
    absl::Status status = FlushBucket();
    buckets_.clear();  // _release_ipg_buffers
    current_bucket_ = 0;
    return status;
  }
  if (!last_micro_step) return absl::OkStatus();
  // Stage 0 (never offloaded, Create): all-reduce every gradient through
  // one flat bucket, in order.
  at::NoGradGuard no_grad;
  const int64_t total = flat_params_.numel();
  const int64_t capacity = std::min(config_.zero().reduce_bucket_elements(), total);
  at::Tensor bucket = at::empty({capacity}, flat_params_.options());
  const double scale = 1.0 / comm_->world_size();
  size_t first = 0;
  while (first < slots_.size()) {
    size_t last = first;
    int64_t fill = 0;
    while (last < slots_.size() && (fill + slots_[last].numel <= capacity || last == first)) {
      fill += slots_[last].numel;
      ++last;
    }
    if (fill > capacity) {  // one gradient larger than the bucket: reduce it in place
      at::Tensor flat = slots_[first].param.grad().view(-1);
      ZPLAN_RETURN_IF_ERROR(comm_->AllReduceSum(flat));
      if (scale != 1.0) flat.mul_(scale);
    } else {
      int64_t offset = 0;
      for (size_t i = first; i < last; ++i) {
        bucket.narrow(0, offset, slots_[i].numel).copy_(slots_[i].param.grad().view(-1));
        offset += slots_[i].numel;
      }
      at::Tensor used = bucket.narrow(0, 0, fill);
      ZPLAN_RETURN_IF_ERROR(comm_->AllReduceSum(used));
      offset = 0;
      // One rank: the reduced bucket is what the gradients already hold
      // (DeepSpeed copies it back anyway; no allocation either way).
      for (size_t i = first; comm_->world_size() > 1 && i < last; ++i) {
        at::Tensor grad = slots_[i].param.grad().view(-1).copy_(used.narrow(0, offset, slots_[i].numel));
        if (scale != 1.0) grad.mul_(scale);
        offset += slots_[i].numel;
      }
    }
    first = last;
  }
  return absl::OkStatus();
}

void ZeroEngine::AdamWUpdate(at::Tensor weights, at::Tensor grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                             double lr, double grad_multiplier) {
  const OptimizerConfig& opt = config_.optimizer();
  const AdamImplementation impl = opt.implementation();
  // torch.optim.AdamW's for-loop (CPU tensors by default) and foreach
  // paths, with the temporaries they allocate; otherwise fused, in place
  // (as DeepSpeed's FusedAdam and CPU Adam). planner/memory_model.cc,
  // AdamTemporariesPerElement, counts the same.
  if (offload_ || (impl != ADAM_IMPL_TORCH && impl != ADAM_IMPL_TORCH_FOREACH)) {
    // The fused kernel divides each gradient by grad_scale as it reads it:
    // no pass of its own over the fp32 gradients.
    std::optional<at::Tensor> grad_scale;
    if (grad_multiplier != 1.0) grad_scale = at::full({1}, 1.0 / grad_multiplier, grad.options());
    at::_fused_adamw_({weights}, {grad}, {exp_avg}, {exp_avg_sq}, {}, {step_count_}, lr, opt.beta1(), opt.beta2(),
                      opt.weight_decay(), opt.eps(), /*amsgrad=*/false, /*maximize=*/false, grad_scale);
    return;
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
}

at::Tensor ZeroEngine::OwnedGradFp32(int64_t begin, int64_t end) {
  const int64_t len = end - begin;
  if (ReducedInBackward()) {
    return offload_ ? host_grads_.narrow(0, begin, len) : grad_shard_.narrow(0, begin, len).to(at::kFloat);
  }
  // Stage 0: gather the owned range from the per-parameter gradients into
  // a temporary. Slots are in flat order: only what no gradient covers
  // (padding, a parameter without one) is zeroed.
  at::Tensor out = at::empty({len}, at::TensorOptions().dtype(at::kFloat).device(device_));
  int64_t filled = begin;
  for (const Slot& slot : slots_) {
    const int64_t a = std::max(begin, slot.own_dst);
    const int64_t b = std::min(end, slot.own_dst + slot.own_hi - slot.own_lo);
    if (a >= b || !slot.param.grad().defined()) continue;
    if (a > filled) out.narrow(0, filled - begin, a - filled).zero_();
    const at::Tensor piece = slot.param.grad().view(-1).narrow(0, slot.own_lo + a - slot.own_dst, b - a);
    out.narrow(0, a - begin, b - a).copy_(piece);
    filled = b;
  }
  if (end > filled) out.narrow(0, filled - begin, end - filled).zero_();
  return out;
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
  if (ReducedInBackward()) {
    add_squares(offload_ ? host_grads_ : grad_shard_);
    return total;
  }
  std::vector<at::Tensor> pieces;
  for (const Slot& slot : slots_) {
    if (slot.own_hi <= slot.own_lo || !slot.param.grad().defined()) continue;
    pieces.push_back(slot.param.grad().view(-1).narrow(0, slot.own_lo, slot.own_hi - slot.own_lo));
  }
  if (device_.is_cuda() && !pieces.empty()) {
    // One multi-tensor kernel reads every piece in its own dtype and sums in
    // fp32 (no upcast copy): per-parameter norms left the GPU idle between
    // launches, 6 ms of a 1B model's 200 ms step on an H100.
    return total + at::stack(at::_foreach_norm(pieces, 2, at::kFloat)).pow(2).sum().reshape({1});
  }
  for (const at::Tensor& piece : pieces) add_squares(piece);
  return total;
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

absl::StatusOr<StepResult> ZeroEngine::Step(double learning_rate) {
  at::NoGradGuard no_grad;
  // The host reads offloaded gradients and rewrites host parameter shards
  // only once the device's copies from and to them are done.
  WaitForDevice(device_);
  const OptimizerConfig& opt = config_.optimizer();
  // Stage 0 in mixed precision steps as DeepSpeed's FP16_Optimizer does:
  // all of it at once, sub_group_size aside.
  const bool fp16_optimizer = stage_ == 0 && master_.defined();
  const int64_t chunk = fp16_optimizer ? owned_numel_ : std::min(config_.zero().sub_group_elements(), owned_numel_);
  const bool flat_partition = StepsGradPartition();
  // One sub_group_size chunk holds every owned element: its fp32 gradient
  // is made first and the norm read from it (a reduction that casts its
  // input copies it, and is many times slower).
  at::Tensor whole_grad;
  if (fp16_optimizer) {
    whole_grad = FlattenGradsFp32();
  } else if (!flat_partition && chunk == owned_numel_) {
    whole_grad = OwnedGradFp32(0, owned_numel_);
  }
  // Global gradient norm: this rank's owned elements, summed over ranks
  // (stage 0 owns everything).
  at::Tensor sum_sq = whole_grad.defined()
                          ? at::linalg_vector_norm(whole_grad, 2).pow(2).reshape({1}).to(device_)
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
