#!/usr/bin/env python3
"""How a mixture of experts routes at random initialisation: per MoE layer, the token-expert pairs each expert takes.

Builds the model of a config.json with transformers (random weights as from_config makes them, bf16,
CPU), keeps its first --layers layers (the full-size layers: a 30B model's one layer fits in a few GiB),
runs one forward of --batch random sequences of --seq tokens without gradients, and reads every router's
top-k choices. Prints, per layer, the busiest and idlest experts' pairs against the balanced share
(tokens x top-k / experts) and the worst case (every token on one expert: tokens pairs), the three
routings zplan's README sets side by side (docs/moe.md: under grouped_mm memory follows the pairs, not
how they split).

  tools/moe_routing.py --hf-config configs/hf/qwen3-30b-a3b.json --layers 2 --seq 4096
  tools/moe_routing.py --hf-config configs/hf/tiny/mixtral.json --json routing.json
  zplan --hf-config configs/hf/tiny/mixtral-eager.json --routing routing.json ...

Python only because it drives transformers; it writes nothing but --json.
"""
import argparse
import json
import sys

import torch
import transformers


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf-config", required=True, help="a mixture-of-experts config.json")
    p.add_argument("--layers", type=int, default=0, help="keep the first N layers (0: all)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="also write the counts here")
    args = p.parse_args(argv)
    with open(args.hf_config) as f:
        config_dict = json.load(f)
    if args.layers > 0:
        config_dict["num_hidden_layers"] = args.layers
    config = transformers.AutoConfig.for_model(**config_dict)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    counts = {}

    def record(name, experts):
        def hook(module, inputs, output):
            counts[name] = torch.bincount(output[2].reshape(-1), minlength=experts).tolist()
        return hook

    routers = [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]
    if not routers:
        sys.exit(f"{args.hf_config}: no *TopKRouter module: not a mixture of experts transformers routes this way")
    for name, module in routers:
        module.register_forward_hook(record(name, module.num_experts))
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        model(input_ids=ids)
    tokens = args.batch * args.seq
    print(f"{args.hf_config}: {tokens} tokens, random initialisation (seed {args.seed})")
    print(f"{'router':<32} {'experts':>7} {'top-k':>5} {'balanced':>9} {'busiest':>8} {'idlest':>7} {'worst case':>10}")
    layers = []
    for name, module in routers:
        c = counts[name]
        k = sum(c) // tokens
        balanced = sum(c) / len(c)
        print(f"{name:<32} {len(c):>7} {k:>5} {balanced:>9.1f} {max(c):>8} {min(c):>7} {tokens:>10}")
        # The decoder layer's index, as zplan --routing reads it (planner/expert_routing.h).
        layer = int(name.split("layers.")[1].split(".")[0])
        layers.append({"layer": layer, "router": name, "pairs_per_expert": c})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.hf_config, "tokens": tokens, "layers": layers}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
