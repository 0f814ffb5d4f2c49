// File: eager_experts.h
// What transformers' eager experts allocate under a routing (config.json's
// _experts_implementation "eager": the *Experts class's loop over the
// experts hit, Qwen3MoeExperts.forward and its copies in Mixtral, Qwen2-MoE,
// Qwen3.5-MoE and GraniteMoe; the routing: expert_routing.h).
//
// Under grouped_mm every pair tensor is [S, ...] whatever the routing; the
// eager loop allocates per expert hit, so its peaks depend on the pairs each
// expert takes and on their order. The models below replay, allocation by
// allocation, the counting allocator's logs of the experts module alone
// (tools/eager_experts.py measures them and checks its Python form of these
// models byte for byte; docs/moe.md, "The eager experts' backward").
//
// Example:
//   EagerExpertsBytes bytes = EagerExpertsAllocations(PairsPerExpert(routing, layer, T, E, k), {T, h, I, k, 2, 2});
#ifndef ZPLAN_PLANNER_EAGER_EXPERTS_H_
#define ZPLAN_PLANNER_EAGER_EXPERTS_H_

#include <cstdint>
#include <vector>

namespace zplan {

struct EagerExpertsShape {
  int64_t tokens = 0, hidden = 0, ffn = 0, top_k = 0;
  int64_t w = 2;   // the working dtype's bytes
  int64_t wr = 2;  // the top-k weights' (4: Mixtral hands fp32 ones to the experts)
  // A checkpointed layer's backward, after torch's non-reentrant recompute:
  // a node's saved tensors go as it unpacks them (read from the oracle's
  // allocation traces of Mixtral's and Qwen3-MoE's checkpointed rows).
  bool recomputed = false;
  // The gradient of the loop's input exists before its backward (a shared
  // expert's, whose backward runs first: Qwen2-MoE's gate, GraniteMoeShared's
  // shared_mlp), so every expert's contribution is added into it and freed;
  // otherwise the first expert's becomes it (oracle's trace of Qwen2-MoE's
  // checkpointed ZeRO-3 row).
  bool input_grad_exists = false;
};

// One eager experts module's allocations, bytes.
struct EagerExpertsBytes {
  // What the loop saves for backward: per pair where's two int64 indices,
  // the gathered row, gate_up's output, the activation, the product, the
  // weight, down's output and the weighted row index_add_ keeps. The same
  // whatever the routing.
  int64_t saved = 0;
  // Forward with autograd recording, above its start (its input alive): the
  // output, the one-hot mask [T, k, E + 1] (int64), every saved tensor and
  // the loop's locals.
  int64_t forward_peak = 0;
  // Under no_grad: the loop's locals live until the next expert's replace them.
  int64_t nograd_peak = 0;
  // Backward above its start (what the loop saved and its output gradient
  // alive). Autograd runs the experts hit in reverse order, each freeing
  // what it saved; each weight gradient is a bank-sized zeros tensor
  // (select_backward) with the expert's slice copied in: the first expert's
  // become the parameters' accumulation buffers, every later one is added
  // into them and freed.
  int64_t backward_peak = 0;
  // Past the down bank's hook (its gradient whole once the first expert of
  // the loop, the last in backward, has made its part): the peak from then
  // on, above the backward's start (below it, most of what the loop saved
  // freed by then). A reduction at that hook (the gradient partition's)
  // runs beside it.
  int64_t past_down_hook_peak = 0;
};
EagerExpertsBytes EagerExpertsAllocations(const std::vector<int64_t>& pairs_per_expert, const EagerExpertsShape& shape);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_EAGER_EXPERTS_H_
