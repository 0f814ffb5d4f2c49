#include "planner/step_program.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

// A tensor the step allocates: one per step (layer -1), or one per block
// (base + layer, for bases from Builder::Handles(num_layers)).
struct Ref {
  int base = 0;
  int layer = -1;
};

// Storage a build reuses from the last one on its thread (the fast
// evaluator runs millions of builds).
struct Scratch {
  std::vector<std::pair<Component, int64_t>> allocations;  // by recorded handle
  std::vector<int> canonical;                              // by block
  std::vector<int> cuts;                                   // run starts, then num_layers
};
Scratch& TheScratch() {
  static thread_local Scratch scratch;
  return scratch;
}

// Sends the step's ops to a sink (a program, or the peak evaluator), and knows each allocation's
// component and bytes so that a free names only the tensor, as the step's
// own code does. Blocks are grouped where they run identical ops: a group's
// code runs once, for its first block, and stands for every repetition; an
// allocation is recorded once per group, under its canonical block.
template <typename Sink>
class Builder {
 public:
  // `max_handles` bounds what Handles hands out.
  Builder(Sink* sink, bool grouped, int max_handles) : sink_(*sink), grouped_(grouped), scratch_(TheScratch()) {
    if (scratch_.allocations.size() < static_cast<size_t>(max_handles)) scratch_.allocations.resize(max_handles);
    allocations_ = scratch_.allocations.data();
    max_handles_ = max_handles;
  }

  // A fresh handle, or `count` consecutive ones (one per block: Ref{base, layer}).
  int Handles(int count) {
    const int first = num_handles_;
    num_handles_ += count;
    ZPLAN_CHECK(num_handles_ <= max_handles_);
    return first;
  }
  int num_handles() const { return num_handles_; }

  void Alloc(Ref tensor, Component component, int64_t bytes, Phase phase, int layer, const char* name) {
    allocations_[Recorded(tensor)] = {component, bytes};
    if (bytes != 0) sink_.Op(bytes, name, Handle(tensor), layer, MemoryEvent::ALLOC, component, phase);
  }
  int Alloc(Component component, int64_t bytes, Phase phase, int layer, const char* name) {
    const int handle = Handles(1);
    Alloc(Ref{handle}, component, bytes, phase, layer, name);
    return handle;
  }

  void Free(Ref tensor, Phase phase, int layer, const char* name) {
    auto& [component, bytes] = allocations_[Recorded(tensor)];
    ZPLAN_CHECK(bytes >= 0);  // each allocation is freed once
    if (bytes > 0) sink_.Op(bytes, name, Handle(tensor), layer, MemoryEvent::FREE, component, phase);
    bytes = -1;
  }
  void Free(int handle, Phase phase, int layer, const char* name) { Free(Ref{handle}, phase, layer, name); }

  // Where blocks start to differ: a cut c starts a new run at block c; within
  // a run block i and i + period run the same ops (Checkpointed() is periodic
  // in it). Called once, before Blocks.
  template <size_t N>
  void Cuts(int num_layers, int period, const std::array<int, N>& at) {
    num_layers_ = num_layers;
    period_ = period;
    std::vector<int>& cuts = scratch_.cuts;
    cuts.clear();
    cuts.push_back(0);
    for (int c : at) {
      if (c > 0 && c < num_layers) cuts.push_back(c);
    }
    cuts.push_back(num_layers);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<int>& canonical = scratch_.canonical;
    if (canonical.size() < static_cast<size_t>(num_layers)) canonical.resize(num_layers);
    canonical_ = canonical.data();
    for (int i = 0; i < num_layers; ++i) canonical[i] = i;
    if (!grouped_) return;
    // A run's whole periods are one group: each block stands for its offset in the first period.
    for (size_t t = 0; t + 1 < cuts.size(); ++t) {
      const auto [from, to] = Periods(cuts[t], cuts[t + 1]);
      for (int i = from, offset = 0; i < to; ++i, offset = offset + 1 == period_ ? 0 : offset + 1) {
        canonical[i] = from + offset;
      }
    }
  }

  // Runs block(i) for every block, first to last (forward) or last to first,
  // each run's whole periods as one group.
  // Blocks [first, last) only, when `first` and `last` are cuts (a stack of a
  // vision-language model).
  template <typename Block>
  void Blocks(bool forward, const Block& block, int first = 0, int last = -1) {
    if (last < 0) last = num_layers_;
    const int dir = forward ? 1 : -1;
    auto plain = [&](int from, int count) {
      for (int t = 0; t < count; ++t) block(from + dir * t);
    };
    if (!grouped_) {
      plain(forward ? first : last - 1, last - first);
      return;
    }
    const std::vector<int>& cuts = scratch_.cuts;
    const int runs = static_cast<int>(cuts.size()) - 1;
    for (int t = 0; t < runs; ++t) {
      const int k = forward ? t : runs - 1 - t;
      const int a = cuts[k], b = cuts[k + 1];
      if (a < first || b > last) continue;
      const auto [from, to] = Periods(a, b);
      const int repeat = (to - from) / period_;
      plain(forward ? a : b - 1, forward ? from - a : b - to);
      if (repeat > 1) BeginGroup(repeat, dir * period_, dir * period_);
      if (repeat > 0) plain(forward ? from : to - 1, period_);
      if (repeat > 1) EndGroup();
      plain(forward ? to : from - 1, forward ? b - to : from - a);
    }
  }

  // Ops until EndGroup run `repeat` times, moving layers and handles by the steps.
  void BeginGroup(int repeat, int layer_step, int handle_step) { sink_.BeginGroup(repeat, layer_step, handle_step); }
  void EndGroup() { sink_.EndGroup(); }

 private:
  // The whole periods of blocks [a, b): [from, to), aligned to the period.
  std::pair<int, int> Periods(int a, int b) const {
    const int from = std::min(b, (a + period_ - 1) / period_ * period_);
    return {from, from + (b - from) / period_ * period_};
  }
  int Handle(Ref tensor) const { return tensor.layer < 0 ? tensor.base : tensor.base + tensor.layer; }
  int Recorded(Ref tensor) const {
    return tensor.layer < 0 ? tensor.base : tensor.base + canonical_[tensor.layer];
  }

  Sink& sink_;
  bool grouped_;
  Scratch& scratch_;
  std::pair<Component, int64_t>* allocations_ = nullptr;  // scratch_'s, by recorded handle
  const int* canonical_ = nullptr;                         // scratch_'s, by block
  int num_handles_ = 0, max_handles_ = 0, num_layers_ = 0, period_ = 1;
};


// Appends the ops to a program.
class ProgramSink {
 public:
  explicit ProgramSink(StepProgram* program) : p_(program) {
    p_->ops.clear();
    p_->groups.clear();
  }
  void Op(int64_t bytes, const char* name, int handle, int layer, MemoryEvent::Kind kind, Component component,
          Phase phase) {
    if (!in_group_ && !open_) {
      p_->groups.push_back({static_cast<int>(p_->ops.size()), 0, 1, 0, 0});
      open_ = true;
    }
    p_->ops.push_back({bytes, name, handle, layer, kind, component, phase});
    ++p_->groups.back().num_ops;
  }
  void BeginGroup(int repeat, int layer_step, int handle_step) {
    p_->groups.push_back({static_cast<int>(p_->ops.size()), 0, repeat, layer_step, handle_step});
    in_group_ = true;
  }
  void EndGroup() {
    if (p_->groups.back().num_ops == 0) p_->groups.pop_back();
    in_group_ = false;
    open_ = false;
  }

 private:
  StepProgram* p_;
  bool in_group_ = false;
  bool open_ = false;  // the last group takes the ops outside any BeginGroup
};

// Live bytes by component (Component - 1), without protos: the evaluator
// runs millions of times per second in searches.
constexpr int kComponents = COMPONENT_TEMPORARIES;
using Live = std::array<int64_t, kComponents>;

// Finds the peak as the ops arrive: the first event whose live bytes exceed
// every earlier one. A group's body arrives once; live bytes are affine in
// its repetition (each adds the same bytes), so its largest moment is the
// body's largest prefix at the last repetition when a repetition adds bytes,
// else at the first. With kBreakdown the live bytes by component and the
// event at the peak are kept too.
template <bool kBreakdown>
class PeakSink {
 public:
  void Op(int64_t bytes, const char* name, int /*handle*/, int layer, MemoryEvent::Kind kind, Component component,
          Phase /*phase*/) {
    const bool alloc = kind == MemoryEvent::ALLOC;
    const int64_t delta = alloc ? bytes : -bytes;
    if (in_group_) {
      prefix_ += delta;
      if constexpr (kBreakdown) prefix_live_[component - 1] += delta;
      if (alloc && prefix_ > best_) {
        best_ = prefix_;
        if constexpr (kBreakdown) {
          best_live_ = prefix_live_;
          best_name_ = name;
          best_layer_ = layer;
        }
      }
      return;
    }
    total_ += delta;
    if constexpr (kBreakdown) live_[component - 1] += delta;
    if (alloc && total_ > peak_) {
      peak_ = total_;
      if constexpr (kBreakdown) {
        peak_live_ = live_;
        peak_name_ = name;
        peak_layer_ = layer;
      }
    }
  }
  void BeginGroup(int repeat, int layer_step, int /*handle_step*/) {
    in_group_ = true;
    repeat_ = repeat;
    layer_step_ = layer_step;
    prefix_ = 0;
    best_ = -1;
    if constexpr (kBreakdown) prefix_live_ = {};
  }
  void EndGroup() {
    in_group_ = false;
    const int r = prefix_ > 0 ? repeat_ - 1 : 0;
    if (best_ >= 0 && total_ + r * prefix_ + best_ > peak_) {
      peak_ = total_ + r * prefix_ + best_;
      if constexpr (kBreakdown) {
        for (int c = 0; c < kComponents; ++c) peak_live_[c] = live_[c] + r * prefix_live_[c] + best_live_[c];
        peak_name_ = best_name_;
        peak_layer_ = best_layer_ + r * layer_step_;
      }
    }
    total_ += repeat_ * prefix_;
    if constexpr (kBreakdown) {
      for (int c = 0; c < kComponents; ++c) live_[c] += repeat_ * prefix_live_[c];
    }
  }

  int64_t peak() const { return peak_; }  // tensor bytes; -1 without any op
  const Live& peak_live() const { return peak_live_; }
  const char* peak_name() const { return peak_name_; }  // '#' for the layer: TensorName
  int peak_layer() const { return peak_layer_; }

 private:
  int64_t total_ = 0, peak_ = -1;
  Live live_{}, peak_live_{};
  const char* peak_name_ = "";
  int peak_layer_ = -1;
  // The group whose body is arriving.
  bool in_group_ = false;
  int repeat_ = 1, layer_step_ = 0;
  int64_t prefix_ = 0, best_ = -1;
  Live prefix_live_{}, best_live_{};
  const char* best_name_ = "";
  int best_layer_ = -1;
};

// Sends the step's ops to `sink`; returns the number of handles.
template <typename Sink>
int Emit(const StepSizes& s, bool grouped, Sink* sink) {
  // Handles: 41 per block (the bases below) and a few more, the spare checkpoint buffers, and fewer than 128 others.
  Builder<Sink> r(sink, grouped, 48 * s.num_layers + s.checkpoint_slots + 128);
  const bool kept = s.grads_kept_on_production;
  const Component produced = kept ? COMPONENT_GRADS : COMPONENT_TEMPORARIES;
  const int num_layers = s.num_layers, last = num_layers - 1;
  // Period of the blocks' pattern: checkpointed blocks 0, k, 2k, ..., and
  // the block kinds' own, e.g. five sliding to one full.
  const int period = std::lcm(s.checkpointing ? s.checkpoint_every : 1, s.block_period);

  // Resident state at the start of the step.
  r.Alloc(COMPONENT_PARAMS, s.params_resident, PHASE_INIT, -1, "parameters (resident)");
  const int grads_resident = r.Alloc(COMPONENT_GRADS, s.grads_resident, PHASE_INIT, -1,
                                     s.stage >= 2 ? "gradient partition" : "accumulated gradients");
  r.Alloc(COMPONENT_MASTER_PARAMS, s.master_resident, PHASE_INIT, -1, "fp32 master parameters");
  r.Alloc(COMPONENT_OPTIMIZER_STATES, s.optimizer_resident, PHASE_INIT, -1, "Adam m and v");
  r.Alloc(COMPONENT_BUFFERS, s.buckets_resident, PHASE_INIT, -1, "reduce buckets");
  r.Alloc(COMPONENT_BUFFERS, s.offload_staging_resident, PHASE_INIT, -1, "offload gradient staging");
  r.Alloc(COMPONENT_BUFFERS, s.cublas_workspace, PHASE_INIT, -1, "cuBLAS workspace (forward thread)");
  r.Alloc(COMPONENT_BUFFERS, s.cublas_workspace, PHASE_INIT, -1, "cuBLAS workspace (autograd thread)");
  static_assert(kCublasWorkspaces == 2, "one allocation per workspace above");
  // The stage-1/2 gradient partition, from the first bucket reduction (memory_model.h).
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
  // With optimizer offload, the largest fp64 copy of a gradient piece for
  // its norm, at the reduction that makes it (StepSizes::offload_norm_copy).
  const StepSizes::OffloadNormCopy& offload_norm = s.offload_norm_copy;
  auto norm_copy = [&](int part, bool attention, bool widest, int layer) {
    if (offload_norm.bytes == 0 || offload_norm.at != part || offload_norm.at_attention != attention ||
        offload_norm.at_widest != widest) {
      return;
    }
    const int copy = r.Alloc(COMPONENT_TEMPORARIES, offload_norm.bytes, PHASE_BACKWARD, layer,
                             "fp64 copy of a gradient piece for its norm (optimizer offload)");
    r.Free(copy, PHASE_BACKWARD, layer, "fp64 copy freed");
  };
  // The IPG buckets at the backward's first gradient (StepSizes::ipg_from).
  auto buckets_at = [&](int part, bool attention, int layer, const char* what) {
    if (ipg < 0 && s.ipg_from == part && attention == (part >= 0 && s.ipg_at_attention)) {
      ipg = r.Alloc(COMPONENT_BUFFERS, s.ipg_buckets, PHASE_BACKWARD, layer, what);
    }
  };

  // Forward.
  const int batch = r.Alloc(COMPONENT_ACTIVATIONS, s.step_batch, PHASE_FORWARD, -1, "the batch");
  const int rope = r.Alloc(COMPONENT_ACTIVATIONS, s.rope_tables - s.rope_late_pair, PHASE_FORWARD, -1, "RoPE tables");
  const int rope_late =
      r.Alloc(COMPONENT_ACTIVATIONS, s.rope_late_pair, PHASE_FORWARD, -1, "RoPE tables of the later layer type");
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
    return i >= s.gather_kept_from ? s.Block(i).gather_kept : i == s.gather_kept_from - 1 ? s.gather_kept_partial : 0;
  };
  // Per-block tensors: handle base + layer.
  auto per_block = [&] { return r.Handles(num_layers); };
  const int kept_gather = per_block(), forward_gather = per_block(), held_gather = per_block(), input = per_block(),
            copy = per_block(), nograd = per_block(), saved_attn = per_block(), scores = per_block(),
            saved_mlp = per_block(), saved_mlp_tail = per_block(), saved_attn_tail = per_block(), experts = per_block(),
            router_logits = per_block();
  // DeepSpeed's contiguous checkpoint buffers: slot j holds block j*k's copy
  // (the copy's handle); the spare ones have their own.
  const int spare_slots = r.Handles(s.checkpoint_slots);
  auto slot = [&](int j) { return j < s.NumCheckpointed() ? Ref{copy, j * s.checkpoint_every} : Ref{spare_slots + j}; };
  // What a block keeps of its attention half: a checkpointed block its input
  // or DeepSpeed's copy of it (StepSizes::checkpoint_kept_inputs).
  auto attention_kept = [&](int i) {
    return Ref{!s.Checkpointed(i) ? saved_attn : s.checkpoint_copy_on_device ? copy : input, i};
  };
  // Blocks differ at block 0, around the stage-3 kept ones and, in backward,
  // where the partition and the IPG buckets appear and at the first
  // checkpointed block (the spare buffers go); forward and backward group
  // the same blocks.
  const int last_checkpointed = last - last % period;
  const int spares_go = s.checkpoint_slots > 0 ? last_checkpointed : -1;
  const int p = s.grad_partition_from, q = s.ipg_from, kept_from = s.gather_kept_from;
  // Block 0's own kind (LoRA, dropout masks, the reused input) and the buffers made there.
  const bool block0_differs =
      (num_layers > 1 && s.block_kind_of[0] != s.block_kind_of[std::min(period, last)]) || s.checkpoint_slots > 0;
  const int partly_kept = s.gather_kept_partial != 0 ? kept_from - 1 : -1;
  const int rope_late_at = s.rope_late_pair > 0 ? s.rope_late_pair_layer : -1;
  const int norm_copy_at = s.offload_norm_copy.bytes > 0 ? s.offload_norm_copy.at : -1;
  // A vision-language model's stacks: the tower's blocks, those of them that run no backward, the language model's.
  const int tower = s.tower_layers;
  int forward_only_from = tower;
  while (forward_only_from > 0 && s.Block(forward_only_from - 1).forward_only) --forward_only_from;
  r.Cuts(num_layers, period,
         std::array<int, 17>{block0_differs ? 1 : -1, partly_kept, kept_from, p, p + 1, q, q + 1, spares_go,
                             spares_go + 1, rope_late_at, rope_late_at + 1, norm_copy_at, norm_copy_at + 1, tower,
                             tower + 1, forward_only_from, forward_only_from + 1});
  // The tower's embeddings: what they keep for their backward.
  const int tower_embed = r.Alloc(COMPONENT_ACTIVATIONS, s.tower_embed_saved, PHASE_FORWARD, -1,
                                  "forward, vision tower embeddings and pre_layrnorm saved");
  auto forward_block = [&](int i) {
    r.Alloc(Ref{kept_gather, i}, COMPONENT_PARAMS, kept_of_block(i), PHASE_FORWARD, i,
            "forward, layer #, parameters gathered (kept)");
    r.Alloc(Ref{forward_gather, i}, COMPONENT_PARAMS, s.Block(i).gather - kept_of_block(i), PHASE_FORWARD, i,
            "forward, layer #, parameters gathered");
    if (s.Checkpointed(i)) {
      r.Alloc(Ref{input, i}, COMPONENT_ACTIVATIONS, s.Block(i).input, PHASE_FORWARD, i,
              "forward, layer #, checkpointed input");
      // DeepSpeed's copy of it, in a contiguous buffer (all allocated here, at the first) or its own.
      if (s.checkpoint_slots > 0 && i == 0) {
        for (int j = 0; j < s.checkpoint_slots; ++j) {
          r.Alloc(slot(j), COMPONENT_ACTIVATIONS, s.Block(i).input, PHASE_FORWARD, i,
                  "forward, layer #, contiguous checkpoint buffers");
        }
      }
      if (s.checkpoint_copy_on_device && s.checkpoint_slots == 0) {
        r.Alloc(Ref{copy, i}, COMPONENT_ACTIVATIONS, s.Block(i).input, PHASE_FORWARD, i,
                "forward, layer #, copy of the checkpointed input");
      }
      r.Alloc(Ref{saved_mlp, i}, COMPONENT_ACTIVATIONS, 0, PHASE_FORWARD, i, "forward, layer #");
      r.Alloc(Ref{saved_mlp_tail, i}, COMPONENT_ACTIVATIONS, 0, PHASE_FORWARD, i, "forward, layer #");
      r.Alloc(Ref{saved_attn_tail, i}, COMPONENT_ACTIVATIONS, 0, PHASE_FORWARD, i, "forward, layer #");
      r.Alloc(Ref{nograd, i}, COMPONENT_TEMPORARIES, s.Block(i).nograd_peak, PHASE_FORWARD, i, "forward, layer #");
      r.Free(Ref{nograd, i}, PHASE_FORWARD, i, "forward, layer #, intermediates freed");
      if (s.checkpoint_copy_on_device) {
        r.Free(Ref{input, i}, PHASE_FORWARD, i, "forward, layer #, checkpointed input released (its copy is kept)");
      } else if (s.checkpoint_kept_inputs == 0) {
        r.Free(Ref{input, i}, PHASE_FORWARD, i, "forward, layer #, checkpointed input to the host");
      }
    } else {
      const StepSizes::BlockKind& k = s.Block(i);
      r.Alloc(Ref{saved_attn, i}, COMPONENT_ACTIVATIONS, k.saved - k.saved_mlp - k.attn_tail_saved, PHASE_FORWARD, i,
              "forward, layer #");
      r.Alloc(Ref{scores, i}, COMPONENT_TEMPORARIES, k.fwd_transient, PHASE_FORWARD, i, "forward, layer #");
      r.Free(Ref{scores, i}, PHASE_FORWARD, i, "forward, layer #, attention scores freed");
      r.Alloc(Ref{saved_attn_tail, i}, COMPONENT_ACTIVATIONS, k.attn_tail_saved, PHASE_FORWARD, i, "forward, layer #");
      r.Alloc(Ref{saved_mlp, i}, COMPONENT_ACTIVATIONS, k.saved_mlp - k.mlp_tail_saved, PHASE_FORWARD, i,
              "forward, layer #");
      r.Alloc(Ref{experts, i}, COMPONENT_TEMPORARIES, k.mlp_fwd_transient, PHASE_FORWARD, i, "forward, layer #");
      r.Free(Ref{experts, i}, PHASE_FORWARD, i, "forward, layer #, weighted expert outputs freed");
      r.Alloc(Ref{saved_mlp_tail, i}, COMPONENT_ACTIVATIONS, k.mlp_tail_saved, PHASE_FORWARD, i, "forward, layer #");
      if (k.forward_only && k.saved == 0) {  // a frozen tower's block, without a graph
        r.Alloc(Ref{nograd, i}, COMPONENT_TEMPORARIES, k.nograd_peak, PHASE_FORWARD, i, "forward, layer #");
        r.Free(Ref{nograd, i}, PHASE_FORWARD, i, "forward, layer #, intermediates freed");
      }
    }
    r.Alloc(Ref{router_logits, i}, COMPONENT_ACTIVATIONS, s.Block(i).aux_router_logits, PHASE_FORWARD, i,
            "forward, layer #, router logits kept for the auxiliary loss");
    r.Free(Ref{forward_gather, i}, PHASE_FORWARD, i, "forward, layer #, parameters released");
    // Expert banks that a kept block does not keep stay behind their saved views.
    const int64_t held = i >= s.gather_kept_from         ? 0
                         : i == s.gather_kept_from - 1 ? s.gather_held_partial
                                                       : s.Block(i).gather_held;
    r.Alloc(Ref{held_gather, i}, COMPONENT_PARAMS, s.Checkpointed(i) ? 0 : held, PHASE_FORWARD, i,
            "forward, layer #, expert banks held by their saved views");
  };
  r.Blocks(/*forward=*/true, forward_block, 0, tower);
  // The joint: post_layernorm keeps the last tower block's output, the
  // projector its inputs, masked_scatter its mask.
  const int tower_tail = r.Alloc(COMPONENT_ACTIVATIONS, s.tower_tail_saved, PHASE_FORWARD, -1,
                                 "forward, post_layernorm saved (the last tower block's output)");
  const int projector = r.Alloc(COMPONENT_ACTIVATIONS, s.projector_saved, PHASE_FORWARD, -1,
                                "forward, projector saved");
  const int image_mask = r.Alloc(COMPONENT_ACTIVATIONS, s.image_mask, PHASE_FORWARD, -1,
                                 "forward, image features scattered: the mask");
  r.Blocks(/*forward=*/true, forward_block, tower, num_layers);
  const int final_norm = r.Alloc(COMPONENT_ACTIVATIONS, s.final_norm_saved, PHASE_FORWARD, -1, "final norm saved");
  // The tower's unused outputs (past the selected features) and what their
  // blocks saved go with the vision-language model's forward.
  r.Blocks(/*forward=*/true, [&](int i) {
    r.Free(Ref{kept_gather, i}, PHASE_FORWARD, i, "forward, layer # (no gradient), kept parameters released");
    r.Free(Ref{held_gather, i}, PHASE_FORWARD, i, "forward, layer # (no gradient), held expert banks released");
    const char* freed = "forward, layer # (no gradient), saved freed";
    if (s.Checkpointed(i)) {
      r.Free(Ref{input, i}, PHASE_FORWARD, i, freed);
      return;
    }
    for (int base : {saved_attn, saved_attn_tail, saved_mlp, saved_mlp_tail}) r.Free(Ref{base, i}, PHASE_FORWARD, i, freed);
  }, forward_only_from, tower);
  if (tower > 0) r.Free(tower_tail, PHASE_FORWARD, -1, "post_layernorm saved freed");
  const int head_input =
      r.Alloc(COMPONENT_ACTIVATIONS, s.head_input_saved, PHASE_FORWARD, -1, "final norm output, the LM head's input");
  // The fused loss's input, which nothing saves for backward.
  const int norm_output =
      s.fused_loss ? r.Alloc(COMPONENT_ACTIVATIONS, s.act_grad, PHASE_FORWARD, -1, "final norm output") : -1;
  if (!s.checkpointing) r.Free(mask, PHASE_FORWARD, -1, "attention mask freed");
  const bool rope_to_backward = !s.rope_tables_unsaved || s.checkpointing;
  if (!rope_to_backward) {
    r.Free(rope, PHASE_FORWARD, -1, "RoPE tables freed");
    r.Free(rope_late, PHASE_FORWARD, -1, "RoPE tables freed");
  }

  // Loss and the LM head's backward. Gradients kept on production are
  // released together after the step: those before the blocks, each
  // block's, those after.
  std::vector<int> kept_before_blocks, kept_after_blocks;
  // ZeRO-1 with overlap_comm: gradients kept from their reduction to the
  // epilogue (BlockKind::retained_mlp and the LM head's), freed there.
  bool retains = s.retained_head > 0;
  for (const StepSizes::BlockKind& k : s.block_kinds) retains = retains || k.retained_mlp > 0 || k.retained_attn > 0;
  int head_retained = -1;
  auto retain_head = [&] {
    if (s.retained_head > 0) {
      head_retained = r.Alloc(COMPONENT_GRADS, s.retained_head, PHASE_BACKWARD, -1,
                              "backward, LM head weight gradient kept to the epilogue");
    }
  };
  auto retain = [&](Ref block_handle, int64_t bytes, const char* what) {
    if (retains) r.Alloc(block_handle, COMPONENT_GRADS, bytes, PHASE_BACKWARD, block_handle.layer, what);
  };
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
    r.Free(head_input, PHASE_BACKWARD, -1, "nothing kept the final norm's output");
    act_grad = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm output");
    head_grad = r.Alloc(produced, s.head_grad, PHASE_BACKWARD, -1, "backward, LM head weight gradient");
    buckets_at(s.kHeadPart(), false, -1, "backward, LM head weight gradient");
    if (kept) kept_before_blocks.push_back(head_grad);
    if (!kept && !s.tied) r.Free(head_grad, PHASE_BACKWARD, -1, "LM head gradient into reduce bucket");
    retain_head();
  } else if (s.has_head) {
    // The LM head (a tied one is the embedding, maybe still gathered) for
    // its forward; released after it unless kept for its backward.
    const bool head_is_kept_embedding = s.tied && embed_kept >= 0;
    int gather =
        head_is_kept_embedding ? -1 : r.Alloc(COMPONENT_PARAMS, s.head_gather, PHASE_LOSS, -1, "LM head gathered");
    int logits = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_LOSS, -1, "loss forward, LM head logits");
    if (gather >= 0 && !s.head_kept) {
      r.Free(gather, PHASE_LOSS, -1, "LM head released");
      gather = -1;
    }
    if (s.logits_scaled) {
      const int scaled = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_LOSS, -1, "loss forward, logits scaled");
      r.Free(logits, PHASE_LOSS, -1, "unscaled logits freed");
      logits = scaled;
    }
    int softcap_tanh = -1;
    if (s.logits_softcapped) {
      const int divided =
          r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_LOSS, -1, "loss forward, logits / softcap");
      r.Free(logits, PHASE_LOSS, -1, "logits freed");
      softcap_tanh = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_LOSS, -1, "loss forward, tanh of logits");
      r.Free(divided, PHASE_LOSS, -1, "divided logits freed");
      logits = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_LOSS, -1, "loss forward, logits softcapped");
    }
    // The logits themselves are the model output's, alive to the end of its forward.
    const int logits32 = s.mixed ? r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_LOSS, -1,
                                           "loss forward, fp32 upcast of logits")
                                 : -1;
    const int logprobs = r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_LOSS, -1, "loss forward, log-softmax");
    if (s.mixed) r.Free(logits32, PHASE_LOSS, -1, "fp32 logits freed");
    // The auxiliary loss: its loop's last layer is its widest moment; the
    // logits' bytes stay (BlockKind::aux_router_logits), the softmaxes'
    // handle goes. Its backward, recorded last, runs first.
    const int softmaxes =
        r.Alloc(COMPONENT_LOGITS, s.aux_loss_softmaxes, PHASE_LOSS, -1, "loss forward, auxiliary loss, router softmaxes");
    const int top_k = r.Alloc(COMPONENT_LOGITS, s.aux_loss_top_k, PHASE_LOSS, -1, "loss forward, auxiliary loss, top-k");
    const int float_copy =
        r.Alloc(COMPONENT_LOGITS, s.aux_loss_float_copy, PHASE_LOSS, -1, "loss forward, auxiliary loss, fp32 copy");
    r.Free(float_copy, PHASE_LOSS, -1, "auxiliary loss, fp32 copy summed");
    r.Free(top_k, PHASE_LOSS, -1, "auxiliary loss, top-k freed");
    r.Free(softmaxes, PHASE_LOSS, -1, "auxiliary loss done, the router logits freed");
    r.Free(logits, PHASE_LOSS, -1, "the forward's outputs freed: logits");
    const int aux_grad = r.Alloc(COMPONENT_LOGITS, s.aux_loss_backward_transient, PHASE_BACKWARD, -1,
                                 "loss backward, auxiliary loss, a router softmax's gradient");
    r.Free(aux_grad, PHASE_BACKWARD, -1, "auxiliary loss, the softmax's saved output freed");
    const int grad_logprobs =
        r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_BACKWARD, -1, "loss backward, NLL gradient");
    const int grad32 =
        r.Alloc(COMPONENT_LOGITS, s.logits_fp32, PHASE_BACKWARD, -1, "loss backward, log-softmax gradient");
    r.Free(grad_logprobs, PHASE_BACKWARD, -1, "NLL gradient freed");
    r.Free(logprobs, PHASE_BACKWARD, -1, "log-softmax output freed");
    int grad_logits = grad32;
    if (s.mixed) {
      grad_logits =
          r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_BACKWARD, -1, "loss backward, logits gradient cast");
      r.Free(grad32, PHASE_BACKWARD, -1, "fp32 logits gradient freed");
    }
    if (s.logits_softcapped) {
      // Through x cap, tanh (whose backward frees its output) and / cap, each a new gradient.
      auto hand_on = [&](const char* step) {
        const int next = r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_BACKWARD, -1, step);
        r.Free(grad_logits, PHASE_BACKWARD, -1, "logits gradient handed on");
        grad_logits = next;
      };
      hand_on("loss backward, softcap product's gradient");
      hand_on("loss backward, tanh's gradient");
      r.Free(softcap_tanh, PHASE_BACKWARD, -1, "tanh of logits freed");
      hand_on("loss backward, softcap division's gradient");
    }
    if (s.logits_scaled) {
      const int scaled =
          r.Alloc(COMPONENT_LOGITS, s.logits_working, PHASE_BACKWARD, -1, "loss backward, logits gradient scaled");
      r.Free(grad_logits, PHASE_BACKWARD, -1, "unscaled logits gradient freed");
      grad_logits = scaled;
    }
    if (gather < 0 && !head_is_kept_embedding) {
      gather = r.Alloc(COMPONENT_PARAMS, s.head_gather, PHASE_BACKWARD, -1, "LM head gathered");
    }
    act_grad = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm output");
    head_grad = r.Alloc(produced, s.head_grad, PHASE_BACKWARD, -1, "backward, LM head weight gradient");
    // Autograd releases what the head saved once its backward has run, before the weight's hook.
    r.Free(head_input, PHASE_BACKWARD, -1, "LM head's backward done, its input freed");
    buckets_at(s.kHeadPart(), false, -1, "backward, LM head weight gradient");
    if (kept) kept_before_blocks.push_back(head_grad);
    if (!kept && !s.tied) r.Free(head_grad, PHASE_BACKWARD, -1, "LM head gradient into reduce bucket");
    retain_head();
    r.Free(grad_logits, PHASE_BACKWARD, -1, "logits gradient freed");
    if (gather >= 0) r.Free(gather, PHASE_BACKWARD, -1, "LM head released");
  } else {
    act_grad = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, "gradient of final norm output");
    r.Free(head_input, PHASE_BACKWARD, -1, "the loss's backward done, the final norm's output freed");
  }

  // Final norm backward. LayerNorm's one kernel makes the input's gradient
  // with the weight's; transformers' RMSNorm makes the weight's first (its
  // hook runs; its first op's backward has used up the LM head's input
  // gradient, not Liger's, measured to stay to the norm's end), then the
  // input's, through its fp32 temporaries.
  partition_from(s.num_layers, PHASE_BACKWARD);
  norm_copy(s.num_layers, false, true, -1);
  const char* input_grad = "gradient of final norm input";
  const bool op_by_op = s.final_norm_bwd_transient > 0;
  int act_grad_in = op_by_op ? -1 : r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, input_grad);
  const int norm_grads = r.Alloc(produced, s.final_norm_grads, PHASE_BACKWARD, -1, "backward, final norm");
  buckets_at(s.num_layers, false, -1, "backward, final norm");
  if (kept) kept_before_blocks.push_back(norm_grads);
  if (!kept) r.Free(norm_grads, PHASE_BACKWARD, -1, "final norm gradients into reduce bucket");
  const char* output_grad_freed = "gradient of final norm output freed";
  if (!s.fused_loss) r.Free(act_grad, PHASE_BACKWARD, -1, output_grad_freed);
  if (op_by_op) {
    const int transient = r.Alloc(COMPONENT_TEMPORARIES, s.final_norm_bwd_transient, PHASE_BACKWARD, -1,
                                  "backward, final norm, fp32 temporaries");
    r.Free(transient, PHASE_BACKWARD, -1, "backward, final norm, fp32 temporaries freed");
    act_grad_in = r.Alloc(COMPONENT_TEMPORARIES, s.act_grad, PHASE_BACKWARD, -1, input_grad);
  }
  if (s.fused_loss) r.Free(act_grad, PHASE_BACKWARD, -1, output_grad_freed);
  r.Free(final_norm, PHASE_BACKWARD, -1, "final norm saved freed");

  // Blocks, last to first.
  const int backward_gather = per_block(), back = per_block(), recomputed_attn = per_block(),
            recompute_scores = per_block(), recompute_experts = per_block(), pending_grad = per_block(),
            recomputed_mlp = per_block(),
            recomputed_mlp_tail = per_block(),
            recomputed_attn_tail = per_block(), mlp_post_norm = per_block(), mlp_tail_transient = per_block(),
            kept_mlp_tail_out = per_block(), kept_mlp_tail_in = per_block(), attn_post_norm = per_block(),
            mlp_transient = per_block(),
            mlp_transient_past_hooks = per_block(), mlp_weight_grad = per_block(), waiting = per_block(),
            kept_down = per_block(), kept_mlp_rest = per_block(), attn_transient = per_block(),
            attn_weight_grad = per_block(), kept_attn = per_block(), mlp_pre_norm = per_block(),
            qk_norm_transient = per_block(),
            attn_pre_norm = per_block(), retained_mlp = per_block(), retained_attn = per_block();
  // A post-norm's backward, first in its half: its fp32 temporaries beside
  // everything the half saved.
  auto post_norm_backward = [&](Ref transient, const char* what) {
    r.Alloc(transient, COMPONENT_TEMPORARIES, s.Block(transient.layer).post_norm_bwd_transient, PHASE_BACKWARD,
            transient.layer, what);
    r.Free(transient, PHASE_BACKWARD, transient.layer, "backward, layer #, post-norm temporaries freed");
  };
  // A pre-norm's backward, last in its half: what it saved and its temporaries.
  auto pre_norm_backward = [&](Ref transient, int64_t bytes, const char* what) {
    r.Alloc(transient, COMPONENT_TEMPORARIES, bytes, PHASE_BACKWARD, transient.layer, what);
    r.Free(transient, PHASE_BACKWARD, transient.layer, "backward, layer #, norm done");
  };
  using Moment = StepSizes::PartitionMoment;
  auto backward_block = [&](int i) {
    // The partition, where it appears at `moment` of this block's backward.
    auto partition_at = [&](Moment moment) {
      if (s.grad_partition_moment == moment) partition_from(i, PHASE_BACKWARD);
    };
    partition_at(Moment::kBlockStart);
    // A kept block is still gathered (DeepSpeed prefetches past it while
    // anything below is partitioned); another is gathered again.
    const bool below = s.gather_kept_from > 0 || (s.embed_gather > 0 && !s.embed_kept);
    const StepSizes::BlockKind& k = s.Block(i);
    const int64_t gather_bytes = i >= s.gather_kept_from ? (below ? k.gather - k.gather_kept : 0)
                                                         : k.gather - kept_of_block(i);
    r.Alloc(Ref{backward_gather, i}, COMPONENT_PARAMS, gather_bytes, PHASE_BACKWARD, i,
            "backward, layer #, parameters gathered");
    Ref attention_saved = attention_kept(i);
    const bool recompute = s.Checkpointed(i);
    if (recompute) {
      // CheckpointFunction.backward drops its buffer list first: the spare ones go.
      if (i == spares_go) {
        for (int j = s.NumCheckpointed(); j < s.checkpoint_slots; ++j) {
          r.Free(slot(j), PHASE_BACKWARD, i, "backward, layer #, spare contiguous checkpoint buffer released");
        }
      }
      if (s.checkpoint_copy_on_host) {
        r.Alloc(Ref{back, i}, COMPONENT_ACTIVATIONS, k.input, PHASE_BACKWARD, i,
                "backward, layer #, checkpointed input back from the host");
        attention_saved = Ref{back, i};
      }
      r.Alloc(Ref{pending_grad, i}, COMPONENT_TEMPORARIES, k.recompute_pending_grad, PHASE_BACKWARD, i,
              "backward, layer #, output gradient before the recompute");
      r.Alloc(Ref{recomputed_attn, i}, COMPONENT_ACTIVATIONS,
              k.saved - k.saved_mlp - k.attn_tail_saved - k.saved_input, PHASE_BACKWARD, i,
              "backward, layer #, recompute");
      r.Alloc(Ref{recompute_scores, i}, COMPONENT_TEMPORARIES, k.fwd_transient, PHASE_BACKWARD, i,
              "backward, layer #, recompute");
      r.Free(Ref{recompute_scores, i}, PHASE_BACKWARD, i, "backward, layer #, recompute scores freed");
      r.Alloc(Ref{recomputed_attn_tail, i}, COMPONENT_ACTIVATIONS, k.attn_tail_saved, PHASE_BACKWARD, i,
              "backward, layer #, recompute");
      r.Alloc(Ref{recomputed_mlp, i}, COMPONENT_ACTIVATIONS, k.saved_mlp - k.mlp_tail_saved, PHASE_BACKWARD, i,
              "backward, layer #, recomputed");
      r.Alloc(Ref{recompute_experts, i}, COMPONENT_TEMPORARIES, k.recompute_mlp_fwd_transient, PHASE_BACKWARD, i,
              "backward, layer #, recompute");
      r.Free(Ref{recompute_experts, i}, PHASE_BACKWARD, i, "backward, layer #, recomputed weighted expert outputs freed");
      r.Alloc(Ref{recomputed_mlp_tail, i}, COMPONENT_ACTIVATIONS, k.mlp_tail_saved, PHASE_BACKWARD, i,
              "backward, layer #, recomputed");
    }
    // MLP half: the ops after the MLP run their backward first (what they
    // saved is freed), then the MLP's gradients, then what it saved is freed.
    post_norm_backward(Ref{mlp_post_norm, i}, "backward, layer #, MLP post-norm");
    const char* shared_mlp = "backward, layer #, shared MLP gradients";
    if (kept) r.Alloc(Ref{kept_mlp_tail_out, i}, COMPONENT_GRADS, k.grads_mlp_tail_out, PHASE_BACKWARD, i, shared_mlp);
    // Not kept, the down projection's weight gradient went into the reduce
    // bucket before the mul's backward (AccumulateGrad runs first, its hook
    // hands the gradient on).
    r.Alloc(Ref{mlp_tail_transient, i}, COMPONENT_TEMPORARIES, k.mlp_tail_bwd_transient, PHASE_BACKWARD, i,
            shared_mlp);
    r.Free(Ref{mlp_tail_transient, i}, PHASE_BACKWARD, i, "backward, layer #, shared MLP gradients freed");
    if (kept) r.Alloc(Ref{kept_mlp_tail_in, i}, COMPONENT_GRADS, k.grads_mlp_tail_in, PHASE_BACKWARD, i, shared_mlp);
    if (recompute) r.Free(Ref{recomputed_mlp_tail, i}, PHASE_BACKWARD, i, "backward, layer #, MLP output's ops done");
    r.Free(Ref{saved_mlp_tail, i}, PHASE_BACKWARD, i, "backward, layer #, MLP output's ops done");
    const char* mlp = "backward, layer #, MLP gradients";
    if (recompute) r.Free(Ref{pending_grad, i}, PHASE_BACKWARD, i, "backward, layer #, MLP gradients");
    Ref transient{mlp_transient, i};
    // A recompute that stops in the experts makes their pending gradient; one that does not runs whole.
    const bool recomputed_whole = recompute && k.recompute_pending_grad == 0;
    r.Alloc(transient, COMPONENT_TEMPORARIES, k.bwd_mlp_transient + (recomputed_whole ? 0 : k.mlp_bwd_cast),
            PHASE_BACKWARD, i, mlp);
    norm_copy(i, false, true, i);
    bool waits = false, eager_partition = false;
    buckets_at(i, false, i, mlp);
    if (kept) {
      r.Alloc(Ref{kept_down, i}, COMPONENT_GRADS, k.grads_down, PHASE_BACKWARD, i, mlp);
    } else {
      r.Alloc(Ref{mlp_weight_grad, i}, COMPONENT_TEMPORARIES, k.max_mlp_grad, PHASE_BACKWARD, i, mlp);
      const bool partition_here = s.grad_partition_moment == Moment::kDownProjHook && s.grad_partition_from == i;
      // The eager loop's down bank hook comes near its end, with most of
      // what it saved freed: its partition is placed past the half's saved
      // tensors, beside the loop's tail (below).
      eager_partition = partition_here && k.mlp_grads_after_saved;
      if (partition_here && !eager_partition) {
        // down_proj's saved input is freed before its hook; the transient,
        // as large, stands for it and comes back as GELU's input gradient.
        r.Free(transient, PHASE_BACKWARD, i, "backward, layer #, down_proj's saved input freed");
        partition_from(i, PHASE_BACKWARD);
      }
      r.Free(Ref{mlp_weight_grad, i}, PHASE_BACKWARD, i, "backward, layer #, MLP weight gradients into reduce bucket");
      if (!eager_partition && (partition_here || k.down_weight_grad_waiting > 0)) {
        // The activation's backward, the half's widest moment: down_proj's
        // weight gradient, larger than a bucket, waits for the next reduction.
        if (!partition_here) r.Free(transient, PHASE_BACKWARD, i, "backward, layer #, down_proj's saved input freed");
        transient = Ref{mlp_transient_past_hooks, i};
        r.Alloc(transient, COMPONENT_TEMPORARIES, k.mlp_past_down_hook, PHASE_BACKWARD, i, mlp);
        r.Alloc(Ref{waiting, i}, COMPONENT_TEMPORARIES, k.down_weight_grad_waiting, PHASE_BACKWARD, i, mlp);
        waits = true;
      }
    }
    r.Free(transient, PHASE_BACKWARD, i, "backward, layer #, MLP activation gradients freed");
    norm_copy(i, false, false, i);
    if (waits) r.Free(Ref{waiting, i}, PHASE_BACKWARD, i, "backward, layer #, down_proj weight gradient reduced");
    retain(Ref{retained_mlp, i}, k.retained_mlp, "backward, layer #, MLP weight gradients kept to the epilogue");
    // The rest of the half's gradients, once down_proj's input gradient is
    // freed, or with the eager experts once their loop has freed what it saved.
    auto keep_mlp_rest = [&] {
      r.Alloc(Ref{kept_mlp_rest, i}, COMPONENT_GRADS,
              k.grads_mlp - k.grads_down - k.grads_mlp_tail_out - k.grads_mlp_tail_in, PHASE_BACKWARD, i, mlp);
    };
    if (kept && !k.mlp_grads_after_saved) keep_mlp_rest();
    if (recompute) {
      r.Free(Ref{recomputed_mlp, i}, PHASE_BACKWARD, i, "backward, layer #, recomputed MLP activations freed");
    }
    r.Free(Ref{saved_mlp, i}, PHASE_BACKWARD, i, "backward, layer #, MLP activations freed");
    r.Free(Ref{held_gather, i}, PHASE_BACKWARD, i, "backward, layer #, held expert banks released");
    if (eager_partition) {
      partition_from(i, PHASE_BACKWARD);
      const int tail = r.Alloc(COMPONENT_TEMPORARIES, k.mlp_past_down_hook, PHASE_BACKWARD, i,
                               "backward, layer #, eager experts past the down bank's hook");
      r.Free(tail, PHASE_BACKWARD, i, "backward, layer #, eager experts done");
    }
    if (kept && k.mlp_grads_after_saved) keep_mlp_rest();
    const int reduction = r.Alloc(COMPONENT_TEMPORARIES, k.mlp_reduce_pending, PHASE_BACKWARD, i,
                                  "backward, layer #, ZeRO-3 reduction of the experts' waiting gradients");
    r.Free(reduction, PHASE_BACKWARD, i, "backward, layer #, reduced expert gradients partitioned");
    r.Free(Ref{router_logits, i}, PHASE_BACKWARD, i, "backward, layer #, auxiliary loss gradient used");
    partition_at(Moment::kMlpPreNorm);
    pre_norm_backward(Ref{mlp_pre_norm, i}, k.mlp_pre_norm_bwd, "backward, layer #, MLP norm");
    // Attention half: the ops after o_proj first, as in the MLP half.
    post_norm_backward(Ref{attn_post_norm, i}, "backward, layer #, attention post-norm");
    if (recompute) {
      r.Free(Ref{recomputed_attn_tail, i}, PHASE_BACKWARD, i, "backward, layer #, attention output's ops done");
    }
    r.Free(Ref{saved_attn_tail, i}, PHASE_BACKWARD, i, "backward, layer #, attention output's ops done");
    partition_at(Moment::kAttention);
    const char* attention = "backward, layer #, attention gradients";
    r.Alloc(Ref{attn_transient, i}, COMPONENT_TEMPORARIES, k.bwd_attn_transient, PHASE_BACKWARD, i, attention);
    buckets_at(i, true, i, attention);
    norm_copy(i, true, true, i);
    if (kept) {
      r.Alloc(Ref{kept_attn, i}, COMPONENT_GRADS, k.grads_attn, PHASE_BACKWARD, i, attention);
    } else {
      r.Alloc(Ref{attn_weight_grad, i}, COMPONENT_TEMPORARIES, k.max_attn_grad, PHASE_BACKWARD, i, attention);
      r.Free(Ref{attn_weight_grad, i}, PHASE_BACKWARD, i,
             "backward, layer #, attention weight gradients into reduce bucket");
    }
    r.Free(Ref{attn_transient, i}, PHASE_BACKWARD, i, "backward, layer #, attention activation gradients freed");
    // q_norm's backward, after the hooks of o_proj and of the k and v paths.
    partition_at(Moment::kQkNorm);
    r.Alloc(Ref{qk_norm_transient, i}, COMPONENT_TEMPORARIES, k.bwd_qk_norm_transient, PHASE_BACKWARD, i,
            "backward, layer #, q_norm");
    r.Free(Ref{qk_norm_transient, i}, PHASE_BACKWARD, i, "backward, layer #, q_norm temporaries freed");
    norm_copy(i, true, false, i);
    retain(Ref{retained_attn, i}, k.retained_attn, "backward, layer #, attention weight gradients kept to the epilogue");
    if (recompute) {
      r.Free(Ref{recomputed_attn, i}, PHASE_BACKWARD, i, "backward, layer #, recomputed activations freed");
    }
    r.Free(attention_saved, PHASE_BACKWARD, i, "backward, layer #, attention activations freed");
    pre_norm_backward(Ref{attn_pre_norm, i}, k.attn_pre_norm_bwd, "backward, layer #, attention norm");
    r.Free(Ref{backward_gather, i}, PHASE_BACKWARD, i, "backward, layer #, parameters released");
    r.Free(Ref{kept_gather, i}, PHASE_BACKWARD, i, "backward, layer #, kept parameters released");
    if (rope_to_backward && i == s.rope_late_pair_layer) {
      r.Free(rope_late, PHASE_BACKWARD, i, "backward, layer #, its layer type's RoPE tables freed");
    }
  };
  r.Blocks(/*forward=*/false, backward_block, tower, num_layers);
  if (tower > 0) {
    // The scatter's backward: the image features' gradient (the embeddings'
    // stays, act_grad_in, until the token embedding's backward, last).
    const int features_grad = r.Alloc(COMPONENT_TEMPORARIES, s.image_features_grad, PHASE_BACKWARD, -1,
                                      "backward, image features' gradient");
    r.Free(image_mask, PHASE_BACKWARD, -1, "image mask freed");
    // Weight gradients outside the blocks: kept, or into a reduce bucket.
    auto produce_grads = [&](int64_t bytes, const char* what) {
      const int grads = r.Alloc(produced, bytes, PHASE_BACKWARD, -1, what);
      if (kept) {
        kept_after_blocks.push_back(grads);
      } else {
        r.Free(grads, PHASE_BACKWARD, -1, "gradients into reduce bucket");
      }
    };
    // The projector: its input gradients and weight gradients.
    const int transient = r.Alloc(COMPONENT_TEMPORARIES, s.projector_bwd_transient, PHASE_BACKWARD, -1,
                                  "backward, projector");
    produce_grads(s.projector_grads, "backward, projector gradients");
    r.Free(transient, PHASE_BACKWARD, -1, "backward, projector temporaries freed");
    r.Free(projector, PHASE_BACKWARD, -1, "projector saved freed");
    const int tower_grad = r.Alloc(COMPONENT_TEMPORARIES, s.tower_act_grad, PHASE_BACKWARD, -1,
                                   "backward, gradient of the selected tower features");
    r.Free(features_grad, PHASE_BACKWARD, -1, "image features' gradient freed");
    r.Blocks(/*forward=*/false, backward_block, 0, forward_only_from);
    // The tower's embeddings: the patch conv, CLS or learned positions, pre_layrnorm, deepstack mergers.
    produce_grads(s.tower_embed_grads, "backward, vision tower embeddings gradients");
    r.Free(tower_embed, PHASE_BACKWARD, -1, "vision tower embeddings saved freed");
    r.Free(tower_grad, PHASE_BACKWARD, -1, "tower gradient freed");
  }
  if (s.checkpointing) r.Free(mask, PHASE_BACKWARD, 0, "attention mask freed");
  if (s.rope_tables_unsaved && s.checkpointing) r.Free(rope, PHASE_BACKWARD, 0, "RoPE tables freed");
  r.Free(embed_saved, PHASE_BACKWARD, -1, "embedding dropout mask freed");

  // Embedding backward: the token embedding's and the learned positions'
  // gradients (a model without a vocabulary may still have positions).
  partition_from(-1, PHASE_BACKWARD);
  norm_copy(-1, false, true, -1);
  buckets_at(-1, false, -1, "backward, embedding gradient");
  if (s.embed_backward) {
    const int gather = embed_kept >= 0 ? embed_kept
                                       : r.Alloc(COMPONENT_PARAMS, s.embed_gather, PHASE_BACKWARD, -1,
                                                 "embedding gathered");
    const int contribution = r.Alloc(kept && !s.tied ? COMPONENT_GRADS : COMPONENT_TEMPORARIES, s.embed_grad,
                                     PHASE_BACKWARD, -1, "backward, embedding gradient");
    const int pos = r.Alloc(produced, s.pos_grad, PHASE_BACKWARD, -1, "backward, embedding gradient");
    if (s.tied || !kept) r.Free(contribution, PHASE_BACKWARD, -1, "embedding gradient accumulated");
    if (kept) {
      if (!s.tied) kept_after_blocks.push_back(contribution);
      kept_after_blocks.push_back(pos);
    }
    if (!kept) {
      r.Free(pos, PHASE_BACKWARD, -1, "position gradient into reduce bucket");
      if (s.tied && head_grad >= 0) r.Free(head_grad, PHASE_BACKWARD, -1, "tied embedding gradient into reduce bucket");
    }
    r.Free(gather, PHASE_BACKWARD, -1, "embedding released");
  }
  r.Free(act_grad_in, PHASE_BACKWARD, -1, "block input gradient freed");
  if (!s.rope_tables_unsaved) r.Free(rope, PHASE_BACKWARD, -1, "RoPE tables freed");

  // The gradients kept on production, in the order they were made.
  // Frees each block's tensors `bases` made in its backward, last block
  // first: one group of all of them, or with a tower (blocks of other sizes,
  // some without a backward) in the backward's groups, past the forward-only ones.
  // Blocks of different kinds (a vision tower's, dense layers among
  // mixtures of experts, linear attention among full) free different bytes:
  // grouped as the blocks are.
  auto free_per_block = [&](std::initializer_list<int> bases, Phase phase, const char* tensor) {
    if (num_layers == 0) return;
    r.Blocks(/*forward=*/false, [&](int i) {
      if (s.Block(i).forward_only) return;
      for (int base : bases) r.Free(Ref{base, i}, phase, i, tensor);
    });
  };
  auto free_kept = [&](Phase phase, const char* tensor) {
    if (!kept) return;
    for (int g : kept_before_blocks) r.Free(g, phase, -1, tensor);
    free_per_block({kept_down, kept_mlp_rest, kept_mlp_tail_out, kept_mlp_tail_in, kept_attn}, phase, tensor);
    for (int g : kept_after_blocks) r.Free(g, phase, -1, tensor);
  };

  if (zero12) {
    // The epilogue, then the step on the partition (memory_model.h). Stage 1
    // without overlap_comm has moved its first gradients into the bucket by
    // the time the partition appears.
    // With optimizer offload the highest fp64 norm copy may come in the
    // epilogue, once offload_norm_copy.gone_bytes of the gradients are gone.
    const bool copy_in_epilogue = s.offload_norm_copy.bytes > 0 && s.offload_norm_copy.at == StepSizes::kAtEpilogue;
    const bool moved_first = s.epilogue_moved_grads > 0 || copy_in_epilogue;
    const int64_t held = kept ? s.shards.trainable_elements * (s.mixed ? 2 : 4) : s.grads_resident;
    auto release = [&](bool into_bucket) {
      free_kept(PHASE_BACKWARD,
                into_bucket ? "gradients moved into the IPG bucket" : "gradients moved into the partition");
      r.Free(grads_resident, PHASE_BACKWARD, -1,
             into_bucket ? "accumulated gradients moved into the IPG bucket"
                         : "accumulated gradients moved into the partition");
    };
    if (moved_first) release(true);
    int unmoved = r.Alloc(COMPONENT_GRADS, moved_first ? held - s.epilogue_moved_grads : 0, PHASE_BACKWARD, -1,
                          "gradients not yet in the IPG bucket");
    partition_from(StepSizes::kAtEpilogue, PHASE_BACKWARD);
    if (copy_in_epilogue) {
      r.Free(unmoved, PHASE_BACKWARD, -1, "gradients moved into the IPG bucket");
      unmoved = r.Alloc(COMPONENT_GRADS, held - s.offload_norm_copy.gone_bytes, PHASE_BACKWARD, -1,
                        "gradients not yet in the IPG bucket");
    }
    norm_copy(StepSizes::kAtEpilogue, false, false, -1);
    if (!moved_first) release(false);
    r.Free(unmoved, PHASE_BACKWARD, -1, "gradients moved into the partition");
    if (ipg >= 0) r.Free(ipg, PHASE_BACKWARD, -1, "IPG reduce buckets released");
    if (retains) {
      // _clear_param_grad_only, after the last bucket's reduction.
      const char* cleared = "gradients kept past their reduction cleared";
      if (head_retained >= 0) r.Free(head_retained, PHASE_BACKWARD, -1, cleared);
      free_per_block({retained_mlp, retained_attn}, PHASE_BACKWARD, cleared);
    }
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
    return r.num_handles();
  }

  // Reduction (stage 0) and the optimizer step.
  const int bucket = r.Alloc(COMPONENT_TEMPORARIES, s.reduce_temp, PHASE_BACKWARD, -1, "gradient reduction bucket");
  r.Free(bucket, PHASE_BACKWARD, -1, "reduction bucket freed");
  const int norm = r.Alloc(COMPONENT_TEMPORARIES, s.step_norm_copy, PHASE_OPTIMIZER_STEP, -1,
                           "optimizer step, an fp32 gradient copy for the norm");
  r.Free(norm, PHASE_OPTIMIZER_STEP, -1, "fp32 copy freed");
  const int copies = r.Alloc(COMPONENT_TEMPORARIES, s.step_grad_copies, PHASE_OPTIMIZER_STEP, -1,
                             s.step_per_parameter ? "optimizer step, the masters' fp32 gradients"
                                                  : "optimizer step, fp32 copies of the gradients");
  const int flat = r.Alloc(COMPONENT_TEMPORARIES, s.step_flat_grads, PHASE_OPTIMIZER_STEP, -1,
                           "optimizer step, a sub-group's flattened gradients");
  const int upcast = r.Alloc(COMPONENT_TEMPORARIES, s.step_upcast, PHASE_OPTIMIZER_STEP, -1,
                             "optimizer step, fp32 gradient upcast");
  r.Free(flat, PHASE_OPTIMIZER_STEP, -1, "flattened gradients freed");
  auto release_grads = [&] {
    r.Free(grads_resident, PHASE_OPTIMIZER_STEP, -1, "gradients set to None");
    free_kept(PHASE_OPTIMIZER_STEP, "gradients set to None");
  };
  const bool flattened = s.step_grad_copies > 0 && !s.step_per_parameter;  // FP16_Optimizer
  if (flattened) {
    r.Free(copies, PHASE_OPTIMIZER_STEP, -1, "fp32 copies freed");
    release_grads();
  }
  const int adam = r.Alloc(COMPONENT_TEMPORARIES, s.step_optimizer_temps, PHASE_OPTIMIZER_STEP, -1,
                           s.step_grad_copies > 0 || s.step_per_parameter ? "optimizer step, Adam temporaries"
                                                                          : "optimizer step, fp32 gradient upcast");
  r.Free(adam, PHASE_OPTIMIZER_STEP, -1, "Adam temporaries freed");
  r.Free(upcast, PHASE_OPTIMIZER_STEP, -1, "fp32 gradients freed");
  if (s.step_per_parameter) r.Free(copies, PHASE_OPTIMIZER_STEP, -1, "the masters' fp32 gradients freed");
  if (s.stage == 0 && !flattened) release_grads();
  r.Free(batch, PHASE_OPTIMIZER_STEP, -1, "the batch freed");
  return r.num_handles();
}

}  // namespace

int64_t LiveTensorBytes(const MemoryBreakdown& b) {
  return b.params_bytes() + b.grads_bytes() + b.master_params_bytes() +
         b.optimizer_states_bytes() + b.activations_bytes() + b.logits_bytes() +
         b.buffers_bytes() + b.temporaries_bytes();
}

void FinishDeviceBreakdown(const StepSizes& s, MemoryBreakdown* b) {
  const int64_t tensors = LiveTensorBytes(*b);
  b->set_runtime_bytes(s.runtime);
  b->set_allocator_bytes(s.allocator_cached);
  b->set_peak_bytes(tensors + b->runtime_bytes() + b->allocator_bytes());
}

std::string TensorName(const char* tensor, int layer, int tower_layers) {
  const char* mark = std::strchr(tensor, '#');
  if (mark == nullptr) return tensor;
  absl::string_view before(tensor, mark - tensor);
  if (layer < tower_layers && absl::ConsumeSuffix(&before, "layer ")) {
    return absl::StrCat(before, "vision layer ", layer, mark + 1);
  }
  return absl::StrCat(before, layer >= tower_layers ? layer - tower_layers : layer, mark + 1);
}

StepProgram BuildStepProgram(const StepSizes& sizes, bool grouped) {
  StepProgram program;
  BuildStepProgram(sizes, grouped, &program);
  return program;
}

void BuildStepProgram(const StepSizes& s, bool grouped, StepProgram* program) {
  ProgramSink sink(program);
  program->num_handles = Emit(s, grouped, &sink);
}


MemoryBreakdown StepPeak(const StepSizes& s) {
  PeakSink</*kBreakdown=*/true> sink;
  Emit(s, /*grouped=*/true, &sink);
  MemoryBreakdown result;
  if (sink.peak() >= 0) {
    const Live& live = sink.peak_live();
    result.set_params_bytes(live[COMPONENT_PARAMS - 1]);
    result.set_grads_bytes(live[COMPONENT_GRADS - 1]);
    result.set_master_params_bytes(live[COMPONENT_MASTER_PARAMS - 1]);
    result.set_optimizer_states_bytes(live[COMPONENT_OPTIMIZER_STATES - 1]);
    result.set_activations_bytes(live[COMPONENT_ACTIVATIONS - 1]);
    result.set_logits_bytes(live[COMPONENT_LOGITS - 1]);
    result.set_buffers_bytes(live[COMPONENT_BUFFERS - 1]);
    result.set_temporaries_bytes(live[COMPONENT_TEMPORARIES - 1]);
    result.set_peak_event(TensorName(sink.peak_name(), sink.peak_layer(), s.tower_layers));
  }
  FinishDeviceBreakdown(s, &result);
  return result;
}

int64_t StepPeakBytes(const StepSizes& s) {
  PeakSink</*kBreakdown=*/false> sink;
  Emit(s, /*grouped=*/true, &sink);
  return std::max<int64_t>(0, sink.peak()) + s.runtime + s.allocator_cached;
}

}  // namespace zplan
