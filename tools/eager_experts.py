#!/usr/bin/env python3
"""transformers' eager experts under a declared routing: their backward peak, measured and modelled.

Builds the first layer of a mixture-of-experts config.json with transformers (random weights, bf16, CPU,
_experts_implementation "eager": the *Experts class's loop over the experts hit), routes --tokens random
hidden states three ways (random: the layer's router's own choices; balanced: pair i to expert i mod E;
worst: every token on experts 0..k-1), runs the experts module forward and backward on each with the
counting allocator (bazel-bin/executor/libzplan_counting_allocator.so), and prints the forward's (with autograd
recording and under no_grad) and the backward's peaks above their start beside the event models below,
which replay them allocation by allocation (docs/moe.md,
"Routing").

The model: autograd runs the experts hit in reverse order of the loop. Each one frees its own saved tensors
as its nodes finish, and each weight gradient is a full-bank zeros tensor (select_backward of
gate_up_proj[e] and down_proj[e]) with the expert's slice copied in: the first expert's become the
parameters' accumulation buffers, every later one is added into them and freed. So from the second expert
hit on, the bank's gate_up gradient exists twice beside down_proj's, while the experts not yet reached
keep what they saved: the peak depends on how many experts are hit and on the order of their pair counts.
zplan plans eager experts with the C++ form of these models (planner/eager_experts.h, whose test holds it
to the peaks measured here).

  tools/eager_experts.py --hf-config configs/hf/tiny/qwen3_moe.json --tokens 512 \
      --allocator bazel-bin/executor/libzplan_counting_allocator.so

Python only because it drives transformers; it writes nothing.
"""
import argparse
import ctypes
import json
import sys

import torch
import transformers


class Tally:
    """Allocations (+) and frees (-) in order: the running total and its peak."""

    def __init__(self):
        self.run = self.peak = 0

    def ev(self, nbytes):
        self.run += nbytes
        self.peak = max(self.peak, self.run)


def backward_peak_bytes(counts, tokens, hidden, ffn, top_k, w, wr):
    """The eager experts' backward peak above its start, and the net change at its end (bytes).

    counts: pairs per expert; w: the working dtype's bytes; wr: the top-k weights' (4 where the router
    hands fp32 weights to the experts, Mixtral's, and the weighted product is fp32 before its cast).
    Each line is one allocation (+) or free (-) in the order the counting allocator logs them.
    """
    experts = len(counts)
    bank_gate_up, bank_down = experts * 2 * ffn * hidden * w, experts * hidden * ffn * w
    one_gate_up, one_down = 2 * ffn * hidden * w, hidden * ffn * w
    tally = Tally()
    ev = tally.ev

    hit = [e for e in range(experts) if counts[e] > 0]
    for j, e in enumerate(reversed(hit)):
        n, later = counts[e], j > 0
        nh, nh32, ni = n * hidden * w, n * hidden * 4, n * ffn * w
        ev(nh); ev(-nh)  # index_add_: the output gradient's rows; its saved source freed
        if wr != w:
            ev(nh32); ev(-nh)  # the cast's backward to fp32
            ev(nh32); ev(nh32); ev(-nh32); ev(nh32)  # the weighting's two gradients
            ev(nh); ev(-nh32)  # down's output gradient cast back to its dtype
            ev(n * 4); ev(-nh32); ev(-nh32); ev(-n * 4)
        else:
            ev(nh); ev(nh); ev(n * w)  # the weighting's gradients: down's output's, the weights' product and sum
            ev(-nh); ev(-nh); ev(-n * w)
        ev(-nh)  # saved down output
        ev(tokens * top_k * wr); ev(-n * wr)  # the top-k weights' gradient [T, k]; the saved weights slice
        if later:
            ev(tokens * top_k * wr); ev(-tokens * top_k * wr); ev(-tokens * top_k * wr)  # added out of place
        ev(one_down); ev(ni); ev(-nh); ev(-ni)  # down_proj[e]'s gradient, its input's; saved product freed
        ev(bank_down); ev(-one_down)  # select_backward: the bank's zeros with the slice copied in
        if later:
            ev(-bank_down)  # added into the buffer
        ev(ni); ev(ni); ev(-ni); ev(-ni)  # act * up: both gradients; saved act freed
        ev(ni); ev(-ni); ev(-2 * ni)  # silu's; saved gate_up freed
        ev(2 * ni); ev(-ni); ev(-ni)  # chunk's backward: the cat
        ev(one_gate_up); ev(nh); ev(-2 * ni); ev(-nh)  # gate_up_proj[e]'s gradient, its input's; saved input freed
        ev(bank_gate_up); ev(-one_gate_up)
        if later:
            ev(-bank_gate_up)
        ev(tokens * hidden * w); ev(-nh); ev(-16 * n)  # hidden_states[token_idx]'s gradient [T, h]; where's indices
        if later:
            ev(-tokens * hidden * w)
    return tally.peak, tally.run


def forward_peak_bytes(counts, tokens, hidden, ffn, top_k, w, wr, grad):
    """The eager experts' forward peak above its start (bytes), with autograd recording (grad) or under
    no_grad, in the terms of backward_peak_bytes. With grad every per-expert tensor but Mixtral's fp32
    weighted product is saved; under no_grad the loop's locals (where's indices, the gathered rows,
    gate_up's output, the weighted product) live until the next expert's replace them."""
    experts = len(counts)
    tally = Tally()
    ev = tally.ev

    hit = [e for e in range(experts) if counts[e] > 0]
    one_hot = tokens * top_k * (experts + 1) * 8
    ev(tokens * hidden * w)  # the output, zeros_like(hidden_states)
    ev(8); ev(-8); ev(8); ev(-8)
    ev(one_hot); ev(8 * (experts + 1)); ev(8); ev(experts + 1); ev(-8); ev(-8 * (experts + 1))  # mask, sums
    ev(8 * len(hit)); ev(-(experts + 1))  # expert_hit: nonzero
    fp32 = wr != w
    prev = None
    for e in hit:
        n = counts[e]
        nh, nh32, ni = n * hidden * w, n * hidden * 4, n * ffn * w
        weighted = nh32 if fp32 else nh
        ev(8); ev(1); ev(-8); ev(-1)  # expert_idx == num_experts
        if grad:
            ev(16 * n); ev(nh); ev(2 * ni); ev(ni); ev(ni)  # where, rows, gate_up, act, product
            if fp32 and prev is not None:
                ev(-prev * hidden * 4)  # the last expert's fp32 product, its name rebound
            ev(nh); ev(n * wr)  # down's output, the weights slice
            if fp32:
                ev(nh32); ev(nh32); ev(-nh32); ev(nh)  # the product (its temporary), the cast index_add_ keeps
            else:
                ev(nh)
            ev(1024); ev(-1024)  # index_add_'s scratch
        else:
            p = prev
            ev(16 * n)
            if p is not None: ev(-16 * p)
            ev(nh)
            if p is not None: ev(-p * hidden * w)
            ev(2 * ni)
            if p is not None: ev(-2 * p * ffn * w)
            ev(ni); ev(ni); ev(-ni)  # act, product; act freed
            if p is not None: ev(-(p * hidden * (4 if fp32 else w)))  # the last weighted product
            ev(nh); ev(-ni); ev(n * wr)  # down's output; product freed; the weights slice
            if fp32:
                ev(nh32); ev(nh32); ev(-nh32); ev(-n * wr); ev(-nh); ev(nh); ev(1024); ev(-1024); ev(-nh)
            else:
                ev(nh); ev(-n * wr); ev(-nh); ev(1024); ev(-1024)
        prev = n
    return tally.peak


# One shape's forward (hidden 96, 6 experts, top 3) measures 256 bytes under the model: a small tensor
# of the loop's preamble not yet placed. Every backward and no_grad row is exact.
FORWARD_SLACK_BYTES = 256


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf-config", required=True, help="a mixture-of-experts config.json")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--allocator", required=True, help="libzplan_counting_allocator.so")
    p.add_argument("--check", action="store_true",
                   help=f"exit 1 unless every model equals its measurement (the forward's within {FORWARD_SLACK_BYTES} B)")
    args = p.parse_args(argv)
    lib = ctypes.CDLL(args.allocator)
    for name in ("zplan_current_bytes", "zplan_peak_bytes"):
        getattr(lib, name).restype = ctypes.c_int64
    if not lib.zplan_install():
        sys.exit(f"{args.allocator}: the counting allocator did not install")
    with open(args.hf_config) as f:
        config_dict = json.load(f)
    config_dict.update(num_hidden_layers=1, _experts_implementation="eager")
    config = transformers.AutoConfig.for_model(**config_dict)
    if config.model_type == "gpt_oss":
        sys.exit(f"{args.hf_config}: GptOssExperts' eager loop (biases, clamps) is not this model")
    if config.model_type == "deepseek_v3":
        sys.exit(f"{args.hf_config}: DeepseekV3's first layers are dense; its experts are not measured here yet")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    layer = model.model.layers[0]
    blocks = [m for m in layer.modules() if hasattr(m, "experts") and hasattr(m.experts, "gate_up_proj")]
    routers = [m for m in layer.modules() if type(m).__name__.endswith("TopKRouter")]
    if not blocks or not routers:
        sys.exit(f"{args.hf_config}: no *TopKRouter and *Experts in layer 0")
    experts_module, router = blocks[0].experts, routers[0]
    experts, top_k = router.num_experts, config.num_experts_per_tok
    hidden, ffn = config.hidden_size, experts_module.intermediate_dim
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, hidden, dtype=torch.bfloat16, generator=gen)
    with torch.no_grad():
        _, router_weights, router_index = router(x)  # the router's own choices and its weights' dtype
    print(f"{args.hf_config}: {args.tokens} tokens, {experts} experts, top {top_k}, hidden {hidden}, "
          f"expert width {ffn}, bf16, top-k weights {router_weights.dtype}")
    print(f"{'routing':<9} {'experts hit':>11} {'busiest':>8}   measured / modelled peak above the start: "
          "forward, under no_grad, backward")
    misses = []
    for routing in ("random", "balanced", "worst"):
        if routing == "random":
            index = router_index
        elif routing == "balanced":
            index = (torch.arange(router_index.numel()) % experts).reshape(router_index.shape)
        else:
            index = torch.arange(top_k).expand(router_index.shape).contiguous()
        counts = torch.bincount(index.reshape(-1), minlength=experts).tolist()
        # The experts module alone, as the *SparseMoeBlock calls it: its input and the pair weights need
        # gradients (the router's and the shared expert's backward are the block's, not the loop's).
        measured = {}
        states = x.clone()
        weights = router_weights.clone()
        lib.zplan_reset_peak()
        start = lib.zplan_current_bytes()
        with torch.no_grad():
            out = experts_module(states, index, weights)
        measured["nograd"] = lib.zplan_peak_bytes() - start
        del out
        states.requires_grad_(True)
        weights.requires_grad_(True)
        lib.zplan_reset_peak()
        start = lib.zplan_current_bytes()
        out = experts_module(states, index, weights)
        measured["forward"] = lib.zplan_peak_bytes() - start
        grad = torch.randn(out.shape, dtype=out.dtype, generator=gen)
        lib.zplan_reset_peak()
        start = lib.zplan_current_bytes()
        out.backward(grad)
        measured["backward"] = lib.zplan_peak_bytes() - start
        shape = (counts, args.tokens, hidden, ffn, top_k, 2, weights.element_size())
        modelled = {"forward": forward_peak_bytes(*shape, grad=True),
                    "nograd": forward_peak_bytes(*shape, grad=False),
                    "backward": backward_peak_bytes(*shape)[0]}
        hit = sum(1 for c in counts if c > 0)
        cells = "   ".join(f"{measured[k]:,} / {modelled[k]:,}" for k in ("forward", "nograd", "backward"))
        print(f"{routing:<9} {hit:>11} {max(counts):>8}   {cells}")
        slack = {"forward": FORWARD_SLACK_BYTES, "nograd": 0, "backward": 0}
        misses += [f"{routing} {k}: measured {measured[k]:,}, modelled {modelled[k]:,}"
                   for k in slack if abs(measured[k] - modelled[k]) > slack[k]]
        del out, grad, states, weights
        experts_module.zero_grad(set_to_none=True)
    if args.check and misses:
        sys.exit(f"{args.hf_config}: the eager experts' model misses:\n  " + "\n  ".join(misses))


if __name__ == "__main__":
    main(sys.argv[1:])
