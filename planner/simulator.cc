#include "planner/simulator.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// Tracks live bytes per component while the step program runs.
class StepRecorder {
 public:
  explicit StepRecorder(bool record) : record_(record) {}

  // Returns a handle for Free().
  int Alloc(Component component, int64_t bytes, Phase phase, int layer, std::string tensor) {
    const int handle = static_cast<int>(sizes_.size());
    sizes_.push_back({component, bytes});
    if (bytes == 0) return handle;
    Add(component, bytes);
    Emit(MemoryEvent::ALLOC, component, bytes, phase, layer, std::move(tensor), handle);
    return handle;
  }

  void Free(int handle, Phase phase, int layer, std::string tensor) {
    auto& [component, bytes] = sizes_[handle];
    ZPLAN_CHECK(bytes >= 0);  // each allocation is freed once
    if (bytes > 0) {
      Add(component, -bytes);
      Emit(MemoryEvent::FREE, component, bytes, phase, layer, std::move(tensor), handle);
    }
    bytes = -1;
  }

  SimulatedStep Finish(const StepSizes& sizes) {
    SimulatedStep step;
    step.events = std::move(events_);
    step.event_handles = std::move(handles_);
    step.peak = peak_;
    step.peak_event_index = peak_index_;
    FinishDeviceBreakdown(sizes, &step.peak);
    return step;
  }

 private:
  void Add(Component component, int64_t bytes) {
    switch (component) {
      case COMPONENT_PARAMS: live_.set_params_bytes(live_.params_bytes() + bytes); break;
      case COMPONENT_GRADS: live_.set_grads_bytes(live_.grads_bytes() + bytes); break;
      case COMPONENT_MASTER_PARAMS: live_.set_master_params_bytes(live_.master_params_bytes() + bytes); break;
      case COMPONENT_OPTIMIZER_STATES:
        live_.set_optimizer_states_bytes(live_.optimizer_states_bytes() + bytes);
        break;
      case COMPONENT_ACTIVATIONS: live_.set_activations_bytes(live_.activations_bytes() + bytes); break;
      case COMPONENT_LOGITS: live_.set_logits_bytes(live_.logits_bytes() + bytes); break;
      case COMPONENT_BUFFERS: live_.set_buffers_bytes(live_.buffers_bytes() + bytes); break;
      case COMPONENT_TEMPORARIES: live_.set_temporaries_bytes(live_.temporaries_bytes() + bytes); break;
      default: ZPLAN_CHECK(false);
    }
    total_ += bytes;
  }

  void Emit(MemoryEvent::Kind kind, Component component, int64_t bytes, Phase phase, int layer,
            std::string tensor, int handle) {
    const bool new_peak = total_ > peak_total_;
    if (new_peak) {
      peak_total_ = total_;
      peak_ = live_;
      peak_.set_peak_event(tensor);
      peak_index_ = event_count_;
    }
    ++event_count_;
    if (!record_) return;
    handles_.push_back(handle);
    MemoryEvent& event = events_.emplace_back();
    event.set_kind(kind);
    event.set_component(component);
    event.set_bytes(bytes);
    event.set_tensor(std::move(tensor));
    event.set_phase(phase);
    event.set_layer(layer);
    event.set_live_bytes(total_);
  }

  bool record_;
  std::vector<std::pair<Component, int64_t>> sizes_;
  std::vector<MemoryEvent> events_;
  std::vector<int> handles_;
  MemoryBreakdown live_, peak_;
  int64_t total_ = 0, peak_total_ = -1;
  int peak_index_ = -1, event_count_ = 0;
};

}  // namespace

SimulatedStep SimulateStep(const StepSizes& s, bool record_events) {
  StepRecorder r(record_events);
  const bool kept = s.grads_kept_on_production;
  std::vector<int> kept_grads;  // released together after the step
  const Component produced = kept ? COMPONENT_GRADS : COMPONENT_TEMPORARIES;
  const int last = s.num_layers - 1;

  // Resident state at the start of the step.
  r.Alloc(COMPONENT_PARAMS, s.params_resident, PHASE_INIT, -1, "parameters (resident)");
  const int grads_resident = r.Alloc(COMPONENT_GRADS, s.grads_resident, PHASE_INIT, -1,
                                     s.stage >= 2 ? "gradient partition" : "accumulated gradients");
  r.Alloc(COMPONENT_MASTER_PARAMS, s.master_resident, PHASE_INIT, -1, "fp32 master parameters");
  r.Alloc(COMPONENT_OPTIMIZER_STATES, s.optimizer_resident, PHASE_INIT, -1, "Adam m and v");
  r.Alloc(COMPONENT_BUFFERS, s.buckets_resident, PHASE_INIT, -1, "reduce buckets");
  r.Alloc(COMPONENT_BUFFERS, s.offload_staging_resident, PHASE_INIT, -1, "offload gradient staging");
  r.Alloc(COMPONENT_BUFFERS, s.cublas_workspace, PHASE_INIT, -1, "cuBLAS workspace");
  // The stage-1/2 gradient partition and IPG buckets (memory_model.h).
  const bool zero12 = s.stage == 1 || s.stage == 2;
  int partition = -1, ipg = -1;
  auto partition_from = [&](int part, Phase phase) {
    if (s.grad_partition_from == part) {
      partition = r.Alloc(COMPONENT_GRADS, s.grad_partition, phase, part,
                          part == StepSizes::kAtEpilogue ? "backward epilogue, gradient partition"
                                                         : "gradient partition");
    }
  };
  partition_from(s.kBeforeForward(), PHASE_FORWARD);
  // The IPG buckets at the backward's first gradient (StepSizes::ipg_from).
  auto buckets_at = [&](int part, bool attention, int layer, const std::string& what) {
    if (ipg < 0 && s.ipg_from == part && attention == (part >= 0 && s.ipg_at_attention)) {
      ipg = r.Alloc(COMPONENT_BUFFERS, s.ipg_buckets, PHASE_BACKWARD, layer, what);
    }
  };

  // Forward.
  const int batch = r.Alloc(COMPONENT_ACTIVATIONS, s.step_batch, PHASE_FORWARD, -1, "the batch");
  const int rope = r.Alloc(COMPONENT_ACTIVATIONS, s.rope_tables, PHASE_FORWARD, -1, "RoPE tables");
  const int embed_saved = r.Alloc(COMPONENT_ACTIVATIONS, s.embed_saved, PHASE_FORWARD, -1, "embedding dropout mask");
  const int mask = r.Alloc(COMPONENT_ACTIVATIONS, s.attention_mask, PHASE_FORWARD, -1, "attention mask");
  // Stage 3: gathered parameters kept from their forward to their backward
  // (memory_model.h) have their own handles.
  int embed_kept = -1;
  {
    const int g = r.Alloc(COMPONENT_PARAMS, s.embed_gather, PHASE_FORWARD, -1, "embedding gathered");
    if (s.embed_kept) {
      embed_kept = g;
    } else {
      r.Free(g, PHASE_FORWARD, -1, "embedding released");
    }
  }
  auto kept_of_block = [&](int i) {
    return i >= s.gather_kept_from ? s.gather_kept_block : i == s.gather_kept_from - 1 ? s.gather_kept_partial : 0;
  };
  // What block i saves, and of that its MLP half (block 0 may keep less).
  auto saved_of = [&](int i) { return s.block_saved - (i == 0 ? s.block0_saved_less : 0); };
  auto saved_mlp_of = [&](int i) { return s.block_saved_mlp - (i == 0 ? s.block0_saved_mlp_less : 0); };
  // Per block: the attention half's saved tensors, then the MLP half's
  // (with checkpointing only the block input, in the first).
  std::vector<int> saved_attn(s.num_layers), saved_mlp(s.num_layers), kept_gather(s.num_layers);
  std::vector<int> slots;  // DeepSpeed's contiguous checkpoint buffers
  for (int i = 0; i < s.num_layers; ++i) {
    const std::string layer = absl::StrCat("forward, layer ", i);
    kept_gather[i] = r.Alloc(COMPONENT_PARAMS, kept_of_block(i), PHASE_FORWARD, i, layer + ", parameters gathered (kept)");
    const int gather = r.Alloc(COMPONENT_PARAMS, s.block_gather - kept_of_block(i), PHASE_FORWARD, i,
                               layer + ", parameters gathered");
    if (s.Checkpointed(i)) {
      const int input = r.Alloc(COMPONENT_ACTIVATIONS, s.block_input, PHASE_FORWARD, i, layer + ", checkpointed input");
      // DeepSpeed's copy of it, in a contiguous buffer (all allocated here, at the first) or its own.
      if (s.checkpoint_slots > 0 && slots.empty()) {
        for (int j = 0; j < s.checkpoint_slots; ++j) {
          slots.push_back(r.Alloc(COMPONENT_ACTIVATIONS, s.block_input, PHASE_FORWARD, i,
                                  layer + ", contiguous checkpoint buffers"));
        }
      }
      const int copy = !s.checkpoint_copy_on_device ? -1
                       : s.checkpoint_slots > 0
                           ? slots[i / s.checkpoint_every]
                           : r.Alloc(COMPONENT_ACTIVATIONS, s.block_input, PHASE_FORWARD, i,
                                     layer + ", copy of the checkpointed input");
      saved_mlp[i] = r.Alloc(COMPONENT_ACTIVATIONS, 0, PHASE_FORWARD, i, layer);
      const int t = r.Alloc(COMPONENT_TEMPORARIES, s.block_nograd_peak, PHASE_FORWARD, i, layer);
      r.Free(t, PHASE_FORWARD, i, layer + ", intermediates freed");
      // What stays of the input and its copy (StepSizes::checkpoint_kept_inputs).
      saved_attn[i] = input;
      if (copy >= 0) {
        r.Free(input, PHASE_FORWARD, i, layer + ", checkpointed input released (its copy is kept)");
        saved_attn[i] = copy;
      } else if (s.checkpoint_kept_inputs == 0) {
        r.Free(input, PHASE_FORWARD, i, layer + ", checkpointed input to the host");
      }
    } else {
      saved_attn[i] = r.Alloc(COMPONENT_ACTIVATIONS, saved_of(i) - saved_mlp_of(i), PHASE_FORWARD, i, layer);
      const int t = r.Alloc(COMPONENT_TEMPORARIES, s.block_fwd_transient, PHASE_FORWARD, i, layer);
      r.Free(t, PHASE_FORWARD, i, layer + ", attention scores freed");
      saved_mlp[i] = r.Alloc(COMPONENT_ACTIVATIONS, saved_mlp_of(i), PHASE_FORWARD, i, layer);
    }
    r.Free(gather, PHASE_FORWARD, i, layer + ", parameters released");
  }
  const int final_norm = r.Alloc(COMPONENT_ACTIVATIONS, s.final_norm_saved, PHASE_FORWARD, -1, "final norm saved");
  // The fused loss's input, which nothing saves for backward.
  const int norm_output = s.fused_loss ? r.Alloc(COMPONENT_ACTIVATIONS, s.block_input, PHASE_FORWARD, -1,
                                                 "final norm output")
                                       : -1;
  if (!s.checkpointing) r.Free(mask, PHASE_FORWARD, -1, "attention mask freed");

  // Loss and the LM head's backward.
  int act_grad = -1, head_grad = -1;
  if (s.has_head && s.fused_loss) {
    // Liger's fused linear cross-entropy: both gradients in the forward,
    // one chunk of logits at a time; backward hands them on.
    const int labels = r.Alloc(COMPONENT_LOGITS, s.loss_labels, PHASE_LOSS, -1, "loss forward, labels");
    const int grad_input = r.Alloc(COMPONENT_LOGITS, s.act_grad, PHASE_LOSS, -1, "loss forward, input gradient");
    const int grad_weight = r.Alloc(COMPONENT_LOGITS, s.head_grad, PHASE_LOSS, -1, "loss forward, LM head gradient");
    const int rows = r.Alloc(COMPONENT_LOGITS, s.loss_rows, PHASE_LOSS, -1, "loss forward, per-token losses");
    const int chunk = r.Alloc(COMPONENT_LOGITS, s.loss_chunk + s.loss_chunk_temps, PHASE_LOSS, -1,
                              "loss forward, fused linear cross-entropy chunk");
    r.Free(chunk, PHASE_LOSS, -1, "chunk freed");
    r.Free(rows, PHASE_LOSS, -1, "per-token losses summed");
    r.Free(labels, PHASE_LOSS, -1, "labels freed");
    r.Free(norm_output, PHASE_LOSS, -1, "final norm output freed");
    r.Free(grad_input, PHASE_BACKWARD, -1, "input gradient handed on");
    r.Free(grad_weight, PHASE_BACKWARD, -1, "LM head gradient handed on");
    act_grad = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm output");
    head_grad = r.Alloc(produced, s.head_grad, PHASE_BACKWARD, -1, "backward, LM head weight gradient");
    buckets_at(s.kHeadPart(), false, -1, "backward, LM head weight gradient");
    if (kept) kept_grads.push_back(head_grad);
    if (!kept && !s.tied) r.Free(head_grad, PHASE_BACKWARD, -1, "LM head gradient into reduce bucket");
  } else if (s.has_head) {
    // The LM head (a tied one is the embedding, maybe still gathered) for
    // its forward; released after it unless kept for its backward.
    const bool head_is_kept_embedding = s.tied && embed_kept >= 0;
    int gather = head_is_kept_embedding ? -1 : r.Alloc(COMPONENT_PARAMS, s.head_gather, PHASE_LOSS, -1, "LM head gathered");
    const int logits = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_LOSS, -1, "loss forward, LM head logits");
    if (gather >= 0 && !s.head_kept) {
      r.Free(gather, PHASE_LOSS, -1, "LM head released");
      gather = -1;
    }
    int logits32 = logits;
    if (s.mixed) {
      logits32 = r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_LOSS, -1, "loss forward, fp32 upcast of logits");
      r.Free(logits, PHASE_LOSS, -1, "logits (working dtype) freed");
    }
    const int logprobs = r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_LOSS, -1, "loss forward, log-softmax");
    r.Free(logits32, PHASE_LOSS, -1, "fp32 logits freed");
    const int grad_logprobs = r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_BACKWARD, -1, "loss backward, NLL gradient");
    const int grad32 = r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_BACKWARD, -1,
                               "loss backward, log-softmax gradient");
    r.Free(grad_logprobs, PHASE_BACKWARD, -1, "NLL gradient freed");
    r.Free(logprobs, PHASE_BACKWARD, -1, "log-softmax output freed");
    int grad_logits = grad32;
    if (s.mixed) {
      grad_logits = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_BACKWARD, -1,
                            "loss backward, logits gradient cast");
      r.Free(grad32, PHASE_BACKWARD, -1, "fp32 logits gradient freed");
    }
    if (gather < 0 && !head_is_kept_embedding) {
      gather = r.Alloc(COMPONENT_PARAMS, s.head_gather, PHASE_BACKWARD, -1, "LM head gathered");
    }
    act_grad = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm output");
    head_grad = r.Alloc(produced, s.head_grad, PHASE_BACKWARD, -1, "backward, LM head weight gradient");
    buckets_at(s.kHeadPart(), false, -1, "backward, LM head weight gradient");
    if (kept) kept_grads.push_back(head_grad);
    if (!kept && !s.tied) r.Free(head_grad, PHASE_BACKWARD, -1, "LM head gradient into reduce bucket");
    r.Free(grad_logits, PHASE_BACKWARD, -1, "logits gradient freed");
    if (gather >= 0) r.Free(gather, PHASE_BACKWARD, -1, "LM head released");
  } else {
    act_grad = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm output");
  }

  // Final norm backward.
  partition_from(s.num_layers, PHASE_BACKWARD);
  const int act_grad_in = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm input");
  const int norm_grads = r.Alloc(produced, s.final_norm_grads, PHASE_BACKWARD, -1, "backward, final norm");
  buckets_at(s.num_layers, false, -1, "backward, final norm");
  if (kept) kept_grads.push_back(norm_grads);
  if (!kept) r.Free(norm_grads, PHASE_BACKWARD, -1, "final norm gradients into reduce bucket");
  r.Free(act_grad, PHASE_BACKWARD, -1, "gradient of final norm output freed");
  r.Free(final_norm, PHASE_BACKWARD, -1, "final norm saved freed");

  // Blocks, last to first.
  for (int i = last; i >= 0; --i) {
    const std::string layer = absl::StrCat("backward, layer ", i);
    if (!s.grad_partition_at_attention && !s.grad_partition_at_down_proj_hook) partition_from(i, PHASE_BACKWARD);
    // A kept block is still gathered (DeepSpeed prefetches past it while
    // anything below is partitioned); another is gathered again.
    const bool below = s.gather_kept_from > 0 || (s.embed_gather > 0 && !s.embed_kept);
    const int64_t gather_bytes = i >= s.gather_kept_from ? (below ? s.block_gather - s.gather_kept_block : 0)
                                                         : s.block_gather - kept_of_block(i);
    const int gather = r.Alloc(COMPONENT_PARAMS, gather_bytes, PHASE_BACKWARD, i, layer + ", parameters gathered");
    int recomputed_attn = -1, recomputed_mlp = -1;
    if (s.Checkpointed(i)) {
      // CheckpointFunction.backward drops its buffer list first: the spare ones go.
      for (size_t j = s.NumCheckpointed(); j < slots.size(); ++j) {
        r.Free(slots[j], PHASE_BACKWARD, i, layer + ", spare contiguous checkpoint buffer released");
      }
      slots.clear();
      if (s.checkpoint_copy_on_host) {
        const int back = r.Alloc(COMPONENT_ACTIVATIONS, s.block_input, PHASE_BACKWARD, i,
                                 layer + ", checkpointed input back from the host");
        saved_attn[i] = back;
      }
      recomputed_attn = r.Alloc(COMPONENT_ACTIVATIONS, saved_of(i) - saved_mlp_of(i) - s.RecomputeReusedInput(i),
                                PHASE_BACKWARD, i, layer + ", recompute");
      const int t = r.Alloc(COMPONENT_TEMPORARIES, s.block_fwd_transient, PHASE_BACKWARD, i, layer + ", recompute");
      r.Free(t, PHASE_BACKWARD, i, layer + ", recompute scores freed");
      recomputed_mlp = r.Alloc(COMPONENT_ACTIVATIONS, saved_mlp_of(i), PHASE_BACKWARD, i, layer + ", recomputed");
    }
    // MLP half: its gradients, then what it saved is freed.
    const std::string mlp = layer + ", MLP gradients";
    int mlp_transient = r.Alloc(COMPONENT_TEMPORARIES, s.block_bwd_mlp_transient, PHASE_BACKWARD, i, mlp);
    int waiting = -1;
    buckets_at(i, false, i, mlp);
    if (kept) {
      kept_grads.push_back(r.Alloc(COMPONENT_GRADS, s.block_grads_down, PHASE_BACKWARD, i, mlp));
    } else {
      const int g = r.Alloc(COMPONENT_TEMPORARIES, s.block_max_mlp_grad, PHASE_BACKWARD, i, mlp);
      const bool partition_here = s.grad_partition_at_down_proj_hook && s.grad_partition_from == i;
      if (partition_here) {
        // down_proj's saved input is freed before its hook; the transient,
        // as large, stands for it and comes back as GELU's input gradient.
        r.Free(mlp_transient, PHASE_BACKWARD, i, layer + ", down_proj's saved input freed");
        partition_from(i, PHASE_BACKWARD);
      }
      r.Free(g, PHASE_BACKWARD, i, layer + ", MLP weight gradients into reduce bucket");
      if (partition_here || s.block_down_weight_grad_waiting > 0) {
        // The activation's backward (memory_model.cc, WidestMlpMomentOverWeightGradient):
        // the residual dropout's mask is freed by then; down_proj's weight
        // gradient, larger than a bucket, waits for the next reduction.
        if (!partition_here) r.Free(mlp_transient, PHASE_BACKWARD, i, layer + ", down_proj's saved input freed");
        mlp_transient = r.Alloc(COMPONENT_TEMPORARIES, s.MlpTransientPastDownProjHooks(i), PHASE_BACKWARD, i, mlp);
        waiting = r.Alloc(COMPONENT_TEMPORARIES, s.block_down_weight_grad_waiting, PHASE_BACKWARD, i, mlp);
      }
    }
    r.Free(mlp_transient, PHASE_BACKWARD, i, layer + ", MLP activation gradients freed");
    if (waiting >= 0) r.Free(waiting, PHASE_BACKWARD, i, layer + ", down_proj weight gradient reduced");
    if (kept) {
      // The rest of the half's gradients, once down_proj's input gradient is freed.
      kept_grads.push_back(r.Alloc(COMPONENT_GRADS, s.block_grads_mlp - s.block_grads_down, PHASE_BACKWARD, i, mlp));
    }
    if (recomputed_mlp >= 0) r.Free(recomputed_mlp, PHASE_BACKWARD, i, layer + ", recomputed MLP activations freed");
    r.Free(saved_mlp[i], PHASE_BACKWARD, i, layer + ", MLP activations freed");
    // Attention half.
    if (s.grad_partition_at_attention) partition_from(i, PHASE_BACKWARD);
    const std::string attention = layer + ", attention gradients";
    const int attn_transient =
        r.Alloc(COMPONENT_TEMPORARIES, s.block_bwd_attn_transient, PHASE_BACKWARD, i, attention);
    buckets_at(i, true, i, attention);
    if (kept) {
      kept_grads.push_back(
          r.Alloc(COMPONENT_GRADS, s.block_grads - s.block_grads_mlp, PHASE_BACKWARD, i, attention));
    } else {
      const int g = r.Alloc(COMPONENT_TEMPORARIES, s.block_max_attn_grad, PHASE_BACKWARD, i, attention);
      r.Free(g, PHASE_BACKWARD, i, layer + ", attention weight gradients into reduce bucket");
    }
    r.Free(attn_transient, PHASE_BACKWARD, i, layer + ", attention activation gradients freed");
    if (recomputed_attn >= 0) r.Free(recomputed_attn, PHASE_BACKWARD, i, layer + ", recomputed activations freed");
    r.Free(saved_attn[i], PHASE_BACKWARD, i, layer + ", attention activations freed");
    r.Free(gather, PHASE_BACKWARD, i, layer + ", parameters released");
    r.Free(kept_gather[i], PHASE_BACKWARD, i, layer + ", kept parameters released");
  }
  if (s.checkpointing) r.Free(mask, PHASE_BACKWARD, 0, "attention mask freed");
  r.Free(embed_saved, PHASE_BACKWARD, -1, "embedding dropout mask freed");

  // Embedding backward: the token embedding's and the learned positions'
  // gradients (a model without a vocabulary may still have positions).
  partition_from(-1, PHASE_BACKWARD);
  buckets_at(-1, false, -1, "backward, embedding gradient");
  if (s.embed_backward) {
    const int gather = embed_kept >= 0 ? embed_kept
                                       : r.Alloc(COMPONENT_PARAMS, s.embed_gather, PHASE_BACKWARD, -1,
                                                 "embedding gathered");
    const int contribution = r.Alloc(kept && !s.tied ? COMPONENT_GRADS : COMPONENT_TEMPORARIES, s.embed_grad,
                                     PHASE_BACKWARD, -1, "backward, embedding gradient");
    const int pos = r.Alloc(produced, s.pos_grad, PHASE_BACKWARD, -1, "backward, embedding gradient");
    if (contribution >= 0 && (s.tied || !kept)) r.Free(contribution, PHASE_BACKWARD, -1, "embedding gradient accumulated");
    if (kept) {
      if (contribution >= 0 && !s.tied) kept_grads.push_back(contribution);
      kept_grads.push_back(pos);
    }
    if (!kept) {
      r.Free(pos, PHASE_BACKWARD, -1, "position gradient into reduce bucket");
      if (s.tied && head_grad >= 0) r.Free(head_grad, PHASE_BACKWARD, -1, "tied embedding gradient into reduce bucket");
    }
    if (gather >= 0) r.Free(gather, PHASE_BACKWARD, -1, "embedding released");
  }
  r.Free(act_grad_in, PHASE_BACKWARD, -1, "block input gradient freed");
  r.Free(rope, PHASE_BACKWARD, -1, "RoPE tables freed");

  if (zero12) {
    // The epilogue, then the step on the partition (memory_model.h). Stage 1
    // without overlap_comm has moved its first gradients into the bucket by
    // the time the partition appears.
    const bool moved_first = s.epilogue_moved_grads > 0;
    const int64_t held = kept ? s.shards.trainable_elements * (s.mixed ? 2 : 4) : s.grads_resident;
    auto release = [&](const char* into) {
      for (int g : kept_grads) r.Free(g, PHASE_BACKWARD, -1, absl::StrCat("gradients moved into ", into));
      r.Free(grads_resident, PHASE_BACKWARD, -1, absl::StrCat("accumulated gradients moved into ", into));
    };
    if (moved_first) release("the IPG bucket");
    const int unmoved = r.Alloc(COMPONENT_GRADS, moved_first ? held - s.epilogue_moved_grads : 0, PHASE_BACKWARD,
                                -1, "gradients not yet in the IPG bucket");
    partition_from(StepSizes::kAtEpilogue, PHASE_BACKWARD);
    if (!moved_first) release("the partition");
    r.Free(unmoved, PHASE_BACKWARD, -1, "gradients moved into the partition");
    if (ipg >= 0) r.Free(ipg, PHASE_BACKWARD, -1, "IPG reduce buckets released");
    const int norm = r.Alloc(COMPONENT_TEMPORARIES, s.step_norm_copy, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, fp64 gradient copies for the norm");
    r.Free(norm, PHASE_OPTIMIZER_STEP, -1, "fp64 copy freed");
    const int flat = r.Alloc(COMPONENT_TEMPORARIES, s.step_flat_grads, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, flattened gradients");
    const int fp32 = r.Alloc(COMPONENT_TEMPORARIES, s.step_fp32_grads, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, flattened fp32 gradients");
    r.Free(flat, PHASE_OPTIMIZER_STEP, -1, "flattened gradients freed");
    if (partition >= 0) r.Free(partition, PHASE_OPTIMIZER_STEP, -1, "gradient partition released");
    const int adam = r.Alloc(COMPONENT_TEMPORARIES, s.step_optimizer_temps, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, Adam temporaries");
    r.Free(adam, PHASE_OPTIMIZER_STEP, -1, "Adam temporaries freed");
    r.Free(fp32, PHASE_OPTIMIZER_STEP, -1, "fp32 gradients freed");
    r.Free(batch, PHASE_OPTIMIZER_STEP, -1, "the batch freed");
    return r.Finish(s);
  }

  // Reduction (stage 0) and the optimizer step.
  const int bucket = r.Alloc(COMPONENT_TEMPORARIES, s.reduce_temp, PHASE_BACKWARD, -1, "gradient reduction bucket");
  r.Free(bucket, PHASE_BACKWARD, -1, "reduction bucket freed");
  const int copies = r.Alloc(COMPONENT_TEMPORARIES, s.step_grad_copies, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, fp32 copies of the gradients");
  const int upcast = r.Alloc(COMPONENT_TEMPORARIES, s.step_upcast, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, fp32 gradient upcast");
  auto release_grads = [&] {
    r.Free(grads_resident, PHASE_OPTIMIZER_STEP, -1, "gradients set to None");
    for (int g : kept_grads) r.Free(g, PHASE_OPTIMIZER_STEP, -1, "gradients set to None");
  };
  if (s.step_grad_copies > 0) {
    r.Free(copies, PHASE_OPTIMIZER_STEP, -1, "fp32 copies freed");
    release_grads();
  }
  const int adam = r.Alloc(COMPONENT_TEMPORARIES, s.step_optimizer_temps, PHASE_OPTIMIZER_STEP, -1,
                           s.step_grad_copies > 0 ? "optimizer step, Adam temporaries"
                                                  : "optimizer step, fp32 gradient upcast");
  r.Free(adam, PHASE_OPTIMIZER_STEP, -1, "Adam temporaries freed");
  r.Free(upcast, PHASE_OPTIMIZER_STEP, -1, "fp32 gradients freed");
  if (s.stage == 0 && s.step_grad_copies == 0) release_grads();
  r.Free(batch, PHASE_OPTIMIZER_STEP, -1, "the batch freed");
  return r.Finish(s);
}

}  // namespace zplan
