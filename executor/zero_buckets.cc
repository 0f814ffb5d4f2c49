// ZeroEngine's gradient reduction (zero_engine.h): the gradient hooks, the
// IPG buckets with their fill and flush order (stage_1_and_2.py,
// reduce_independent_p_g_buckets_and_remove_grads), the reduced gradients'
// owned part added into the gradient partition, and stage 0's all-reduce
// through one flat bucket after backward. Sized by planner/zero_buckets.h.
#include <algorithm>
#include <memory>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "executor/counting_allocator.h"
#include "executor/device_memory.h"
#include "executor/zero_engine.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

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

}  // namespace

void ZeroEngine::RegisterGradHooks() {
  // Gradient hooks: stages 1-3 see each gradient as it is produced (stage 1
  // keeps it until the accumulation boundary), stage 0 keeps .grad. AccumulateGrad
  // records its parameter's shape when created, so create them while every
  // parameter is still whole.
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].frozen) continue;
    if (slots_[i].leaf >= 0) ++leaf_size_[slots_[i].leaf];
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(slots_[i].param);
    if (stage_ >= 1) {
      acc->add_post_hook(std::make_unique<GradReadyHook>(this, i));
    } else {
      acc->add_post_hook(std::make_unique<GradKeptHook>(slots_[i].param));
    }
    accumulators_.push_back(std::move(acc));  // the graph holds accumulators weakly
  }
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

void ZeroEngine::AccumulateOwned(Slot& slot, const at::Tensor& grad) {
  const int64_t len = slot.own_hi - slot.own_lo;
  if (len <= 0) return;
  // Stage 3's piece comes averaged (reduce_scatter_coalesced pre-divides).
  const double scale = stage_ == 3 ? 1.0 : 1.0 / comm_->world_size();
  if (offload_) {
    // The reduced buffer is consumed here, so it is averaged in place.
    if (scale != 1.0) grad.mul_(scale);
    OffloadGrad(slot, grad);
    return;
  }
  EnsureGradPartition();
  grad_shard_.narrow(0, slot.own_dst, len).add_(stage_ == 3 ? grad : grad.narrow(0, slot.own_lo, len), scale);
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
    // ZeRO-1 clears no reduced gradient (reduce_ipg_grads; with offload only
    // the rank's own, once copied): one larger than a bucket, outside the
    // partition, stays to the epilogue's end.
    if (stage_ == 1 && (config_.zero().overlap_comm() || offload_) && slot.own_hi <= slot.own_lo) {
      TagAllocation(flat.storage().data(), COMPONENT_GRADS);
      retained_grads_.push_back(flat);
    }
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
  if (const int leaf = slots_[index].leaf; leaf >= 0) {
    // A leaf module's gradients wait for its backward to end, then go in its parameters' order.
    std::vector<size_t>& ready = leaf_ready_[leaf];
    ready.push_back(index);
    if (ready.size() < leaf_size_[leaf]) return;
    std::sort(ready.begin(), ready.end());
    for (size_t i : ready) ReduceThroughBucket(i);
    ready.clear();
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
  if (stage_ == 3) {
    // stage3.py, reduce_independent_p_g_buckets_and_remove_grads: a gradient
    // that would overflow the bucket reduces it first; one that fits is
    // moved into it (__add_grad_to_ipg_bucket), one larger stays whole in
    // it, as its .grad, until the next reduction.
    if (!segments_.empty() && bucket_fill_ + slot.numel > config_.zero().reduce_bucket_elements()) {
      status = ReduceScatterBucket();
    }
    if (status.ok() && bucket_fill_ + slot.numel <= capacity) {
      buckets_.front().narrow(0, bucket_fill_, slot.numel).copy_(grad.reshape(-1));
      segments_.push_back({index, bucket_fill_});
      slot.param.mutable_grad() = at::Tensor();
    } else if (status.ok()) {
      segments_.push_back({index, -1});
    }
    bucket_fill_ += slot.numel;
    if (!status.ok()) hook_status_ = status;
    return;
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

absl::Status ZeroEngine::ReduceScatterBucket() {
  // stage3.py, __reduce_and_partition_ipg_grads -> __avg_scatter_grads ->
  // reduce_scatter_coalesced (reduce_scatter is on by default): the
  // gradients in parameter order, each cut into world pieces padded to
  // ceil(numel / world), interleaved rank by rank into one flat copy (none
  // for a single gradient that needs no padding), pre-divided, and
  // reduce-scattered; this rank's pieces (views of that copy) go into its
  // gradient partition (partition_grads), then the gradients are freed.
  std::vector<Segment> segments = std::move(segments_);
  segments_.clear();
  bucket_fill_ = 0;
  if (segments.empty()) return absl::OkStatus();
  std::sort(segments.begin(), segments.end(), [](const Segment& a, const Segment& b) { return a.slot < b.slot; });
  const int64_t world = comm_->world_size();
  std::vector<at::Tensor> grads;
  std::vector<int64_t> chunk(segments.size()), chunk_offset(segments.size());
  int64_t chunks = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Slot& slot = slots_[segments[i].slot];
    grads.push_back(segments[i].bucket_offset >= 0 ? buckets_.front().narrow(0, segments[i].bucket_offset, slot.numel)
                                                   : slot.param.grad().reshape(-1));
    chunk[i] = (slot.numel + world - 1) / world;
    chunk_offset[i] = chunks;
    chunks += chunk[i];
  }
  at::Tensor flat;
  if (segments.size() == 1 && slots_[segments[0].slot].numel % world == 0) {
    flat = grads[0];
  } else {
    flat = at::empty({chunks * world}, grads[0].options());
    for (int64_t r = 0; r < world; ++r) {
      for (size_t i = 0; i < segments.size(); ++i) {
        const int64_t lo = std::min(r * chunk[i], grads[i].numel());
        const int64_t len = std::min(grads[i].numel(), lo + chunk[i]) - lo;
        if (len > 0) flat.narrow(0, r * chunks + chunk_offset[i], len).copy_(grads[i].narrow(0, lo, len));
      }
    }
  }
  flat.div_(static_cast<double>(world));
  at::Tensor mine = flat.narrow(0, comm_->rank() * chunks, chunks);
  ZPLAN_RETURN_IF_ERROR(comm_->ReduceScatterSum(flat, mine));
  for (size_t i = 0; i < segments.size(); ++i) {
    Slot& slot = slots_[segments[i].slot];
    AccumulateOwned(slot, mine.narrow(0, chunk_offset[i], std::max<int64_t>(0, slot.own_hi - slot.own_lo)));
    slot.param.mutable_grad() = at::Tensor();
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::FinishBackward(bool last_micro_step) {
  ZPLAN_RETURN_IF_ERROR(hook_status_);
  if (stage_ == 3) {
    Release(-1, kAfterBackward);  // the embedding, gathered for its backward
    {
      OffloadStreamScope offload_stream(device_, offload_);
      ZPLAN_RETURN_IF_ERROR(ReduceScatterBucket());
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
    retained_grads_.clear();  // _clear_param_grad_only
    return status;
  }
  if (!last_micro_step) return absl::OkStatus();
  // Stage 0 (never offloaded, Create): all-reduce every gradient through
  // one flat bucket, in order. A parameter that got no gradient (llava's
  // tower past its feature layer) gets zeros, so every rank reduces the same
  // (runtime/engine.py, _get_gradients_for_reduction).
  at::NoGradGuard no_grad;
  {
    ScopedMemoryTag tag(COMPONENT_GRADS);
    for (Slot& slot : slots_) {
      if (!slot.param.grad().defined()) slot.param.mutable_grad() = at::zeros_like(slot.param);
    }
  }
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

}  // namespace zplan
