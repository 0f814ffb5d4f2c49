#!/usr/bin/env python3
"""What transformers' modules keep for backward: the tensors autograd saves in one forward.

Builds the model of a config.json with transformers (random weights, CPU), runs one forward with
labels under torch.autograd.graph.saved_tensors_hooks, and attributes every saved tensor's storage
to the innermost module running when it was saved. A storage counts once, where it was first saved
(a view saved again elsewhere costs nothing more); parameters do not count. This is the measurement
behind each op's rule in planner/inventory.cc: what an op saves, per module, at a given shape.

  tools/saved_tensors.py --hf-config configs/hf/tiny/lfm2.json --dtype bf16 --batch 2 --seq 100
  tools/saved_tensors.py --hf-config X --module model.layers.0.linear_attn   # that module's tensors, in order

Python only because it drives transformers; it writes nothing.
"""
import argparse
import collections
import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf-config", required=True, help="a config.json")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--depth", type=int, default=3, help="attribute to modules at most this many dots deep")
    p.add_argument("--module", default="", help="also list each tensor first saved in modules with this prefix")
    args = p.parse_args(argv)

    with open(args.hf_config) as f:
        config = AutoConfig.for_model(**json.load(f))
    config._attn_implementation = args.attention
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to({"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])

    running = ["(model)"]
    for name, module in model.named_modules():
        if name and name.count(".") <= args.depth:
            module.register_forward_pre_hook(lambda m, i, name=name: running.append(name))
            module.register_forward_hook(lambda m, i, o: running.pop() and None)  # a hook's return replaces the output
    parameters = {q.untyped_storage().data_ptr() for q in model.parameters()}
    first_saved = {}  # storage -> (module, bytes, dtype, shape)

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in parameters and key not in first_saved:
            first_saved[key] = (running[-1], t.untyped_storage().nbytes(), str(t.dtype).replace("torch.", ""),
                                tuple(t.shape))
        return t

    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)

    per_module = collections.defaultdict(int)
    for module, nbytes, _, _ in first_saved.values():
        per_module[module] += nbytes
    for module, nbytes in per_module.items():
        print(f"{module:50s} {nbytes:>14,}")
    print(f"{'total':50s} {sum(per_module.values()):>14,}")
    if args.module:
        for module, nbytes, dtype, shape in first_saved.values():
            if module.startswith(args.module):
                print(f"  {module} {nbytes:,} {dtype} {list(shape)}")


if __name__ == "__main__":
    main(sys.argv[1:])
