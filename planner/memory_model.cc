#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/gpu_catalog.h"
#include "planner/inventory.h"
#include "planner/run_config.h"

namespace zplan {
namespace {

DType WorkingDtype(Precision precision) {
  switch (precision) {
    case PRECISION_FP16: return DTYPE_FP16;
    case PRECISION_FP32: return DTYPE_FP32;
    default: return DTYPE_BF16;
  }
}

int64_t SumBytes(const std::vector<TensorSpec>& tensors) {
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += TensorBytes(t);
  return total;
}

// A candidate peak: live tensor bytes by component at one moment.
struct Moment {
  std::string label;
  MemoryBreakdown live;
};

// Resident bytes plus what every moment of the step shares.
MemoryBreakdown Resident(const StepSizes& s) {
  MemoryBreakdown b;
  b.set_params_bytes(s.params_resident);
  b.set_grads_bytes(s.grads_resident);
  b.set_master_params_bytes(s.master_resident);
  b.set_optimizer_states_bytes(s.optimizer_resident);
  b.set_buffers_bytes(s.buckets_resident);
  return b;
}

void AddTo(MemoryBreakdown* b, Component component, int64_t bytes) {
  switch (component) {
    case COMPONENT_PARAMS: b->set_params_bytes(b->params_bytes() + bytes); break;
    case COMPONENT_GRADS: b->set_grads_bytes(b->grads_bytes() + bytes); break;
    case COMPONENT_ACTIVATIONS: b->set_activations_bytes(b->activations_bytes() + bytes); break;
    case COMPONENT_LOGITS: b->set_logits_bytes(b->logits_bytes() + bytes); break;
    case COMPONENT_BUFFERS: b->set_buffers_bytes(b->buffers_bytes() + bytes); break;
    case COMPONENT_TEMPORARIES: b->set_temporaries_bytes(b->temporaries_bytes() + bytes); break;
    default: break;
  }
}

// Gradients produced so far are GRADS when kept, otherwise a TEMPORARY.
Component ProducedGradComponent(const StepSizes& s) {
  return s.grads_kept_on_production ? COMPONENT_GRADS : COMPONENT_TEMPORARIES;
}

}  // namespace

absl::StatusOr<StepSizes> ComputeStepSizes(const ModelSpec& model, const RunConfig& config,
                                           const GpuSpec& gpu) {
  StepSizes s;
  const ZeroConfig& zero = config.zero();
  s.stage = zero.stage();
  s.world_size = WorldSize(config);
  s.ranks_per_node = config.cluster().gpus_per_node();
  s.num_layers = static_cast<int>(model.num_layers());
  s.grad_accum = config.gradient_accumulation_steps();
  s.mixed = config.precision() != PRECISION_FP32;
  s.checkpointing = config.activation_checkpointing();
  s.offload_optimizer = zero.offload_optimizer() == OFFLOAD_CPU;
  s.offload_param = zero.offload_param() == OFFLOAD_CPU;
  s.pin_memory = zero.pin_memory();
  s.tied = model.tie_word_embeddings();
  s.has_vocab = model.vocab_size() > 0;
  s.cpu_ranks = gpu.key() == kCpuDevice;
  if (s.offload_optimizer && s.stage == 0) {
    return absl::InvalidArgumentError(
        "zero.offload_optimizer (--offload-optimizer): optimizer offload needs ZeRO stage >= 1");
  }
  s.grads_kept_on_production = s.stage <= 1 && s.grad_accum == 1;

  const DType dtype = WorkingDtype(config.precision());
  const int64_t w = DTypeBytes(dtype);
  const int64_t b = config.micro_batch_size();
  const int64_t seq = config.seq_length();
  const int64_t h = model.hidden_size();
  const int64_t vocab = model.vocab_size();

  const std::vector<TensorSpec> params = ParameterInventory(model);
  s.shards = ComputeShardLayout(params, s.world_size, zero.stage3_param_persistence_threshold());
  const ShardLayout& sh = s.shards;
  const int64_t total = sh.total_elements;
  // Elements of the optimizer partition this rank owns.
  const int64_t owned = s.stage == 0 ? total
                        : s.stage == 3 ? sh.stage3_grad_shard_elements
                                       : sh.flat_shard_elements;

  // Parameters.
  if (s.stage < 3) {
    s.params_resident = total * w;
  } else {
    s.params_resident = sh.stage3_persistent_elements * w;
    if (!s.offload_param) s.params_resident += sh.stage3_shard_elements * w;
  }
  // Gradients.
  if (s.stage >= 2) {
    s.grads_resident = s.offload_optimizer ? 0 : owned * w;
  } else if (s.grad_accum > 1) {
    s.grads_resident = total * w;  // accumulated across micro-steps
  }
  // Master and Adam states.
  if (!s.offload_optimizer) {
    s.master_resident = s.mixed ? owned * kMasterBytesPerParam : 0;
    s.optimizer_resident = owned * kAdamStateBytesPerParam;
  }
  // DeepSpeed's contiguous-gradients IPG buckets (stage_1_and_2.py / stage3.py).
  if (s.stage >= 2 && zero.contiguous_gradients()) {
    s.buckets_resident = zero.reduce_bucket_elements() * w * (zero.overlap_comm() ? 2 : 1);
  }

  // Blocks.
  const std::vector<TensorSpec> block_params = BlockParameters(model, 0);
  int64_t block_param_elements = 0, largest = 0;
  for (const TensorSpec& t : block_params) {
    block_param_elements += NumElements(t);
    largest = std::max(largest, NumElements(t));
  }
  s.block_saved = SumBytes(BlockSavedActivations(model, b, seq, dtype, 0));
  s.block_input = b * seq * h * w;
  s.block_fwd_transient = BlockForwardTransientBytes(model, b, seq, dtype);
  // Under no_grad a block frees each intermediate after its last use; the FFN
  // branch (gate, up and their product, or up and GELU) is the widest point.
  const int64_t ffn_live = (model.ffn_type() == FFN_SWIGLU ? 3 : 2) * b * seq * model.ffn_hidden_size() * w;
  const int64_t attn_live =
      b * seq * (model.num_attention_heads() + 2 * model.num_kv_heads()) * model.head_dim() * w +
      (model.attention_impl() == ATTENTION_EAGER ? 2 * b * model.num_attention_heads() * seq * seq * w : 0);
  s.block_nograd_peak = s.block_input + std::max(ffn_live, attn_live);
  s.block_bwd_transient = BlockBackwardTransientBytes(model, b, seq, dtype);
  s.block_grads = block_param_elements * w;
  s.block_max_param_grad = largest * w;
  if (s.stage == 3) {
    int64_t partitioned = 0;
    for (const TensorSpec& t : block_params) {
      if (NumElements(t) > zero.stage3_param_persistence_threshold()) partitioned += NumElements(t);
    }
    // The block being computed plus the next one prefetched, within the live cap.
    const int64_t prefetched = std::min(zero.stage3_prefetch_bucket_elements(), partitioned);
    const int64_t live = std::max(partitioned, std::min(zero.stage3_max_live_parameters(),
                                                        partitioned + prefetched));
    s.block_gather = live * w;
  }

  // Model ends.
  s.input_ids = 2 * b * seq * kTokenIdBytes;
  s.act_grad = b * seq * h * w;
  const int64_t norm_stats = model.norm_type() == NORM_LAYERNORM ? 2 : 1;
  s.final_norm_saved = 2 * b * seq * h * w + norm_stats * b * seq * 4;
  s.final_norm_grads = (model.norm_type() == NORM_LAYERNORM ? 2 : 1) * h * w;
  if (s.has_vocab) {
    s.head_grad = vocab * h * w;
    s.embed_grad = vocab * h * w;
    s.logits_working = b * seq * vocab * w;
    s.logits_fp32 = b * seq * vocab * 4;
    if (s.stage == 3 && vocab * h > zero.stage3_param_persistence_threshold()) {
      s.embed_gather = vocab * h * w;
    }
  }
  if (model.position_embedding() == POSITION_LEARNED) {
    s.pos_grad = model.max_position_embeddings() * h * w;
  }

  // Stage 0/1 reduce gradients after backward through one flat bucket.
  if (s.stage <= 1) s.reduce_temp = std::min(zero.reduce_bucket_elements(), total) * w;
  // The optimizer upcasts this rank's gradients to fp32 one sub-group at a time.
  if (s.mixed && !s.offload_optimizer) {
    s.step_upcast = std::min(zero.sub_group_elements(), owned) * 4;
  }

  if (!s.cpu_ranks) {
    s.runtime = gpu.cuda_context_bytes() + gpu.cublas_workspace_bytes() +
                (s.world_size > 1 ? gpu.nccl_bytes_per_communicator() : 0);
  }
  s.allocator_band_fraction = gpu.allocator_band_fraction();

  // Host.
  s.host_process = gpu.host_process_bytes();
  if (s.offload_optimizer) {
    s.host_master = owned * kMasterBytesPerParam;
    s.host_optimizer = owned * kAdamStateBytesPerParam;
    s.host_grads = owned * kOffloadGradBytesPerParam;
  }
  if (s.offload_param) s.host_params = sh.stage3_shard_elements * w;
  // Without zero.Init every local rank first builds the whole fp32 model.
  const bool sharded_init = s.stage == 3 && zero.zero_init();
  s.host_init_per_rank =
      (sharded_init ? sh.stage3_shard_elements + sh.stage3_persistent_elements : total) * 4;
  return s;
}

int64_t LiveTensorBytes(const MemoryBreakdown& b) {
  return b.params_bytes() + b.grads_bytes() + b.master_params_bytes() +
         b.optimizer_states_bytes() + b.activations_bytes() + b.logits_bytes() +
         b.buffers_bytes() + b.temporaries_bytes();
}

void FinishDeviceBreakdown(const StepSizes& s, MemoryBreakdown* b) {
  const int64_t tensors = LiveTensorBytes(*b);
  b->set_runtime_bytes(s.runtime);
  b->set_allocator_bytes(static_cast<int64_t>(std::llround(s.allocator_band_fraction * tensors)));
  b->set_peak_bytes(tensors + b->runtime_bytes() + b->allocator_bytes());
}

MemoryBreakdown ClosedFormDevicePeak(const StepSizes& s) {
  std::vector<Moment> moments;
  const int last = s.num_layers - 1;
  const Component produced = ProducedGradComponent(s);

  // Saved activations of blocks 0..i at the end of their forward.
  auto saved_through = [&](int i) {
    return (s.checkpointing ? s.block_input : s.block_saved) * (i + 1);
  };
  auto forward_base = [&] {
    MemoryBreakdown b = Resident(s);
    AddTo(&b, COMPONENT_ACTIVATIONS, s.input_ids);
    return b;
  };

  // 1. Forward: the last block at its widest (activations only grow).
  {
    MemoryBreakdown b = forward_base();
    AddTo(&b, COMPONENT_PARAMS, s.block_gather);
    if (s.checkpointing) {
      AddTo(&b, COMPONENT_ACTIVATIONS, s.block_input * (last + 1));
      AddTo(&b, COMPONENT_TEMPORARIES, s.block_nograd_peak);
    } else {
      AddTo(&b, COMPONENT_ACTIVATIONS, saved_through(last));
      AddTo(&b, COMPONENT_TEMPORARIES, s.block_fwd_transient);
    }
    moments.push_back({absl::StrCat("forward, layer ", last), b});
  }

  // 2. Loss: logits, fp32 upcast, log-softmax and their gradients.
  MemoryBreakdown loss_base = forward_base();
  AddTo(&loss_base, COMPONENT_ACTIVATIONS, saved_through(last) + s.final_norm_saved);
  AddTo(&loss_base, COMPONENT_PARAMS, s.embed_gather);
  if (s.has_vocab) {
    const int64_t lw = s.logits_working, l32 = s.logits_fp32;
    auto loss_moment = [&](const std::string& label, int64_t logits) {
      MemoryBreakdown b = loss_base;
      AddTo(&b, COMPONENT_LOGITS, logits);
      moments.push_back({label, b});
    };
    if (s.mixed) loss_moment("loss forward, fp32 upcast of logits", lw + l32);
    loss_moment("loss forward, log-softmax", l32 + l32);
    loss_moment("loss backward, log-softmax gradient", 3 * l32);
    if (s.mixed) loss_moment("loss backward, logits gradient cast", l32 + lw);
    MemoryBreakdown b = loss_base;
    AddTo(&b, COMPONENT_LOGITS, lw);
    AddTo(&b, COMPONENT_TEMPORARIES, s.act_grad);
    AddTo(&b, produced, s.head_grad);
    moments.push_back({"backward, LM head weight gradient", b});
  }

  // Final norm backward: gradients w.r.t. its output and its input.
  {
    MemoryBreakdown b = forward_base();
    AddTo(&b, COMPONENT_ACTIVATIONS, saved_through(last) + s.final_norm_saved);
    AddTo(&b, COMPONENT_TEMPORARIES, 2 * s.act_grad);
    AddTo(&b, produced, s.final_norm_grads);
    if (s.grads_kept_on_production || s.tied) AddTo(&b, produced, s.head_grad);
    moments.push_back({"backward, final norm", b});
  }

  // 3. Backward through block i: recompute (checkpointing), then gradients.
  // Everything is linear in i, so the first and last blocks bound the rest.
  const int64_t grads_before_blocks = s.head_grad + s.final_norm_grads;
  for (int i : {last, 0}) {
    MemoryBreakdown b = forward_base();
    AddTo(&b, COMPONENT_TEMPORARIES, s.act_grad);
    AddTo(&b, COMPONENT_PARAMS, s.block_gather);
    if (s.grads_kept_on_production) {
      AddTo(&b, COMPONENT_GRADS, grads_before_blocks + s.block_grads * (last - i));
    } else if (s.tied) {
      AddTo(&b, COMPONENT_TEMPORARIES, s.head_grad);  // held for the embedding's contribution
    }
    if (s.checkpointing) {
      AddTo(&b, COMPONENT_ACTIVATIONS, s.block_input * (i + 1));
      MemoryBreakdown recompute = b;
      AddTo(&recompute, COMPONENT_ACTIVATIONS, s.block_saved);
      AddTo(&recompute, COMPONENT_TEMPORARIES, s.block_fwd_transient);
      moments.push_back({absl::StrCat("backward, layer ", i, ", recompute"), recompute});
      AddTo(&b, COMPONENT_ACTIVATIONS, s.block_saved);
    } else {
      AddTo(&b, COMPONENT_ACTIVATIONS, saved_through(i));
    }
    AddTo(&b, COMPONENT_TEMPORARIES, s.block_bwd_transient);
    if (s.grads_kept_on_production) {
      AddTo(&b, COMPONENT_GRADS, s.block_grads);
    } else {
      AddTo(&b, COMPONENT_TEMPORARIES, s.block_max_param_grad);
    }
    moments.push_back({absl::StrCat("backward, layer ", i, ", weight gradients"), b});
    if (s.num_layers == 1) break;
  }

  // 4. Embedding backward: the embedding's gradient contribution.
  if (s.has_vocab) {
    MemoryBreakdown b = forward_base();
    AddTo(&b, COMPONENT_TEMPORARIES, s.act_grad);
    AddTo(&b, COMPONENT_PARAMS, s.embed_gather);
    if (s.grads_kept_on_production) {
      AddTo(&b, COMPONENT_GRADS, grads_before_blocks + s.block_grads * s.num_layers);
    } else if (s.tied) {
      AddTo(&b, COMPONENT_TEMPORARIES, s.head_grad);
    }
    AddTo(&b, (s.grads_kept_on_production && !s.tied) ? COMPONENT_GRADS : COMPONENT_TEMPORARIES,
          s.embed_grad);
    AddTo(&b, produced, s.pos_grad);
    moments.push_back({"backward, embedding gradient", b});
  }

  // 5. After backward: every gradient, the reduce bucket, then the step.
  MemoryBreakdown after = Resident(s);
  if (s.grads_kept_on_production) AddTo(&after, COMPONENT_GRADS, s.shards.total_elements * (s.mixed ? 2 : 4));
  {
    MemoryBreakdown b = after;
    AddTo(&b, COMPONENT_TEMPORARIES, s.reduce_temp);
    moments.push_back({"gradient reduction bucket", b});
  }
  {
    MemoryBreakdown b = after;
    AddTo(&b, COMPONENT_TEMPORARIES, s.step_upcast);
    moments.push_back({"optimizer step, fp32 gradient upcast", b});
  }

  const Moment* best = &moments.front();
  for (const Moment& m : moments) {
    if (LiveTensorBytes(m.live) > LiveTensorBytes(best->live)) best = &m;
  }
  MemoryBreakdown result = best->live;
  result.set_peak_event(best->label);
  FinishDeviceBreakdown(s, &result);
  return result;
}

int64_t ModelStatesBytes(const StepSizes& s) {
  const int64_t w = s.mixed ? 2 : 4;
  const ShardLayout& sh = s.shards;
  const int64_t owned = s.stage == 0 ? sh.total_elements
                        : s.stage == 3 ? sh.stage3_grad_shard_elements
                                       : sh.flat_shard_elements;
  const int64_t params = s.stage < 3 ? sh.total_elements * w
                                     : (sh.stage3_shard_elements + sh.stage3_persistent_elements) * w;
  const int64_t grads = (s.stage < 2 ? sh.total_elements : owned) * w;
  const int64_t master = s.mixed ? owned * kMasterBytesPerParam : 0;
  return params + grads + master + owned * kAdamStateBytesPerParam;
}

MemoryBreakdown HostPerRank(const StepSizes& s) {
  MemoryBreakdown b;
  b.set_params_bytes(s.host_params);
  b.set_grads_bytes(s.host_grads);
  b.set_master_params_bytes(s.host_master);
  b.set_optimizer_states_bytes(s.host_optimizer);
  b.set_runtime_bytes(s.host_process);
  if (s.pin_memory) b.set_pinned_bytes(s.host_params + s.host_grads + s.host_master + s.host_optimizer);
  b.set_peak_bytes(LiveTensorBytes(b) + b.runtime_bytes());
  b.set_peak_event("steady state");
  return b;
}

}  // namespace zplan
