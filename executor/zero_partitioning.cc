// ZeroEngine's partitioning of the model states (zero_engine.h): which
// elements each rank owns (stages 1/2 a slice of the padded flat buffer,
// stage 3 a ceil(numel / N) chunk of every parameter; planner/sharding.h),
// the parameters put in place (zero.Init at stage 3), and the fp32 master
// weights and Adam states of the owned elements. Sized by
// planner/zero_partitioning.h.
#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "executor/counting_allocator.h"
#include "executor/zero_engine.h"
#include "planner/inventory.h"
#include "planner/memory_model.h"
#include "planner/sharding.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// Which part of the model a parameter belongs to: -1 the embeddings (a
// vision-language model's tower ends and projector too), the step's blocks
// (inventory.h, StepBlockOf), num_blocks the final norm and head.
int PartOf(const ModelSpec& spec, const TensorSpec& tensor, int num_blocks) {
  if (const int block = StepBlockOf(spec, tensor); block >= 0) return block;
  const bool embedding = tensor.part() != PART_LANGUAGE_MODEL || absl::StartsWith(tensor.name(), "embed_");
  return embedding ? -1 : num_blocks;
}

}  // namespace

void ZeroEngine::AssignOwnership(int64_t total, int world, int rank, int64_t* frozen_numel_out) {
  const ZeroConfig& zero = config_.zero();
  int64_t& frozen_numel = *frozen_numel_out;
  // Ownership: stage 0 owns everything; stages 1/2 a slice of the flat
  // buffer; stage 3 a ceil(numel / N) chunk of every parameter.
  if (stage_ < 3) {
    const int64_t shard = stage_ == 0 ? total : FlatShardElements(total, world);
    owned_begin_ = stage_ == 0 ? 0 : rank * shard;
    owned_numel_ = shard;
    for (Slot& slot : slots_) {
      slot.own_lo = std::clamp(owned_begin_ - slot.flat_offset, int64_t{0}, slot.numel);
      slot.own_hi = std::clamp(owned_begin_ + shard - slot.flat_offset, int64_t{0}, slot.numel);
      slot.own_dst = slot.flat_offset + slot.own_lo - owned_begin_;
    }
  } else {
    // On one rank, unless offload keeps the chunks apart from the device,
    // the chunk is the parameter: nothing is ever released.
    unpartitioned_ = !GathersParameters(stage_, world, zero.offload_param() == OFFLOAD_CPU, device_.is_cpu());
    int64_t offset = 0;
    for (Slot& slot : slots_) {
      slot.shard_numel = Stage3ShardElements(slot.numel, world);
      slot.persistent = slot.numel <= zero.stage3_param_persistence_threshold() || unpartitioned_;
      slot.own_lo = std::min(rank * slot.shard_numel, slot.numel);
      slot.own_hi = std::min((rank + 1) * slot.shard_numel, slot.numel);
      // Trainable chunks first in flat_shards_ (the optimizer's), frozen ones in frozen_shards_.
      int64_t& next = slot.frozen ? frozen_numel : offset;
      slot.own_dst = next;
      next += slot.shard_numel;
    }
    owned_numel_ = offset;
  }
}

void ZeroEngine::PlaceParameters(int64_t total, int world, const at::TensorOptions& options, bool pin,
                                 int64_t frozen_numel, int num_layers) {
  Transformer* model = model_;
  const RunConfig& config = config_;
  const ZeroConfig& zero = config.zero();
  if (stage_ < 3) {
    // Parameters become views of one flat buffer, padded so every rank's
    // shard has the same size (planner/sharding.h).
    const int64_t padded = stage_ == 0 ? total : owned_numel_ * world;
    flat_params_ = at::zeros({padded}, options);
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& slot = slots_[i];
      at::Tensor view = flat_params_.narrow(0, slot.flat_offset, slot.numel).view(slot.shape);
      view.copy_(model->materialized() ? slot.param : model->InitialValue(i));
      slot.param.set_data(view);
    }
  } else {
    // Every parameter's owned chunk lives in one buffer; partitioned
    // parameters are then released, persistent ones stay whole.
    const bool offload_param = zero.offload_param() == OFFLOAD_CPU;
    flat_shards_ = offload_param ? HostZeros(owned_numel_, dtype_, pin) : at::zeros({owned_numel_}, options);
    if (frozen_numel > 0) {
      frozen_shards_ = offload_param ? HostZeros(frozen_numel, model->dtype(), pin)
                                     : at::zeros({frozen_numel}, options.dtype(model->dtype()));
    }
    parts_.resize(static_cast<size_t>(num_layers) + 2);
    // Stage 3 holds every parameter, in inventory order.
    const std::vector<TensorSpec> inventory = ParameterInventory(model->spec());
    ZPLAN_CHECK(inventory.size() == slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& slot = slots_[i];
      at::Tensor chunk = ShardsOf(slot).narrow(0, slot.own_dst, slot.own_hi - slot.own_lo);
      if (model->materialized()) {
        chunk.copy_(slot.param.view(-1).narrow(0, slot.own_lo, slot.own_hi - slot.own_lo));
      } else {
        // zero.Init: the parameter exists whole only now, in fp32 on the
        // rank's device (partition_parameters.py, Init: tensors are created
        // on the accelerator); its chunk is kept (and a persistent one
        // whole), the rest freed.
        const at::Tensor whole = model->InitialValue(i, device_);
        chunk.copy_(whole.view(-1).narrow(0, slot.own_lo, slot.own_hi - slot.own_lo));
        if (slot.persistent && !unpartitioned_) slot.param.set_data(whole.to(device_, slot.param.scalar_type()));
      }
      if (unpartitioned_) slot.param.set_data(chunk.view(slot.shape));
      // A modules_to_save original is never called: never gathered.
      if (!IsUnusedOriginal(slot.name)) parts_[PartOf(model->spec(), inventory[i], num_layers) + 1].push_back(i);
      slot.gathered = true;
    }
    // A tied LM head uses the embedding matrix.
    tied_head_ = model->spec().tie_word_embeddings() && model->spec().vocab_size() > 0;
    if (tied_head_) parts_[num_layers + 1].push_back(0);
    // What DeepSpeed's coordinator keeps gathered from forward to backward
    // (a module that runs no backward, e.g. a frozen embedding, is not kept).
    const SavePolicy saves = SavePolicyFor(config);
    std::vector<bool> runs_backward;
    for (const TensorSpec& t : inventory) runs_backward.push_back(RunsBackward(model->spec(), t, saves));
    retention_ = Stage3RetentionOf(model->spec(), inventory, tied_head_, zero, runs_backward);
    for (int part = -1; part <= num_layers; ++part) Release(part, kReleaseAll);
  }
}

void ZeroEngine::AllocateModelStates(std::optional<ScopedMemoryTag>& tag, bool pin) {
  // Master weights and Adam states for the owned elements (host with offload).
  const at::Device state_device = offload_ ? at::Device(at::kCPU) : device_;
  auto fp32_state = [&](Component component, bool pinned) {
    tag.emplace(component);
    return offload_ ? HostZeros(owned_numel_, at::kFloat, pinned)
                    : at::zeros({owned_numel_}, at::TensorOptions().dtype(at::kFloat).device(device_));
  };
  // Master weights where DeepSpeed keeps them (sharding.h); with offload on
  // the host (also in fp32 training: the device copy is the working copy),
  // pinned at stages 1/2 only (planner/zero_offload.cc lists what DeepSpeed pins).
  if (KeepsFp32Master(stage_, mixed_, offload_)) {
    master_ = fp32_state(COMPONENT_MASTER_PARAMS, pin && stage_ <= 2);
    if (stage_ < 3) {
      master_.copy_(flat_params_.narrow(0, owned_begin_, owned_numel_));
    } else {
      master_.copy_(flat_shards_);
    }
  }
  exp_avg_ = fp32_state(COMPONENT_OPTIMIZER_STATES, false);
  exp_avg_sq_ = fp32_state(COMPONENT_OPTIMIZER_STATES, false);
  step_count_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(state_device));
  if (offload_) host_grads_ = fp32_state(COMPONENT_GRADS, pin);
}

}  // namespace zplan
