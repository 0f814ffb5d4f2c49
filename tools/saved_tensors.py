#!/usr/bin/env python3
"""What transformers' modules keep for backward: the tensors autograd saves in one forward.

Builds the model of a config.json with transformers (random weights, CPU), runs one forward with
labels under torch.autograd.graph.saved_tensors_hooks, and attributes every saved tensor's storage
to the innermost module running when it was saved. A storage counts once, where it was first saved
(a view saved again elsewhere costs nothing more); parameters do not count. This is the measurement
behind each op's rule in planner/inventory.cc: what an op saves, per module, at a given shape.

  tools/saved_tensors.py --hf-config configs/hf/tiny/lfm2.json --dtype bf16 --batch 2 --seq 100
  tools/saved_tensors.py --hf-config X --module model.layers.0.linear_attn   # that module's tensors, in order
  tools/saved_tensors.py --hf-config X --module model.layers.0.linear_attn \
      --allocator bazel-bin/executor/libzplan_counting_allocator.so          # and its transient peaks

With --allocator (the counting allocator; its bytes are every CPU tensor's) the --module modules
also report their forward's and backward's peaks above what was allocated when each began.

A vision-language config (one with a vision_config: llava, qwen2_5_vl, qwen3_vl, qwen3_5) gets the
DeepSpeed oracle's inputs: --images-per-sample images of --image-size pixels at the start of each
sequence of --seq tokens, and --freeze parts (docs/vlm_oracle.md). CLIP layers sit one level deeper
than the Qwen vision blocks: --depth 4 attributes to each of them.

  tools/saved_tensors.py --hf-config configs/hf/tiny/qwen2_5_vl.json --image-size 224 --batch 2 --seq 256
  tools/saved_tensors.py --hf-config configs/hf/tiny/llava.json --depth 4 --batch 2 --seq 256

Python only because it drives transformers; it writes nothing.
"""
import argparse
import collections
import ctypes
import sys

import torch

# tools/deepspeed_oracle.py, beside this file
from deepspeed_oracle import VLM_PARTS, check_vlm_flags, choose_kernels, freeze_parts, image_batch, training_config


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf-config", required=True, help="a config.json")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--depth", type=int, default=3, help="attribute to modules at most this many dots deep")
    p.add_argument("--module", default="", help="also list each tensor first saved in modules with this prefix")
    p.add_argument("--allocator", default="", help="libzplan_counting_allocator.so: also the --module modules' peaks")
    p.add_argument("--kernels", default="none",
                   help="none, or a list of fla and causal_conv1d: the packages transformers may import "
                        "(deepspeed_oracle.py --kernels; on CPU through tools/shadow_kernels)")
    p.add_argument("--image-size", type=int, default=0,
                   help="vision-language models: square images of this many pixels (deepspeed_oracle.py --image-size)")
    p.add_argument("--images-per-sample", type=int, default=0,
                   help="vision-language models: images at the start of every sequence (default 1)")
    p.add_argument("--freeze", default="",
                   help="vision-language models: a comma list of " + ", ".join(VLM_PARTS) + " that do not train")
    args = p.parse_args(argv)
    args.lora_config, args.loss = "", "full"  # what check_vlm_flags also judges in the oracle
    check_vlm_flags(p, args)
    choose_kernels({k.strip() for k in args.kernels.lower().split(",") if k.strip() not in ("", "none")})
    counting = None
    if args.allocator:
        counting = ctypes.CDLL(args.allocator)  # before any tensor exists
        counting.zplan_current_bytes.restype = counting.zplan_peak_bytes.restype = ctypes.c_int64
        if not counting.zplan_install():
            sys.exit("saved_tensors: the counting allocator could not be installed")

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    config, layout = training_config(args, "saved_tensors")  # as the DeepSpeed oracle trains it
    config._attn_implementation = args.attention
    torch.manual_seed(0)
    auto = AutoModelForCausalLM if layout is None else AutoModelForImageTextToText
    model = auto.from_config(config).to({"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])
    if layout is not None:
        freeze_parts(model, args.freeze)

    running = ["(model)"]
    for name, module in model.named_modules():
        if name and name.count(".") <= args.depth:
            module.register_forward_pre_hook(lambda m, i, name=name: running.append(name))
            module.register_forward_hook(lambda m, i, o: running.pop() and None)  # a hook's return replaces the output
    peaks = []  # (module, pass, peak above the start)
    if counting is not None and args.module:
        start = {}

        def begin(name):
            start[name] = counting.zplan_current_bytes()
            counting.zplan_reset_peak()

        def end(name, which):
            peaks.append((name, which, counting.zplan_peak_bytes() - start[name]))

        def first_tensor(args, kwargs):
            return next((t for t in list(args) + list(kwargs.values()) if torch.is_tensor(t)), None)

        def forward_pre(name, args, kwargs):
            begin(name)
            x = first_tensor(args, kwargs)  # its gradient ends the module's backward
            if x is not None and x.requires_grad:
                x.register_hook(lambda g: end(name, "backward"))

        def forward_end(name, out):
            end(name, "forward")
            out = out[0] if isinstance(out, tuple) else out
            out.register_hook(lambda g: begin(name))

        for name, module in model.named_modules():
            if name.startswith(args.module) and name.count(".") == args.module.count("."):
                module.register_forward_pre_hook(lambda m, a, k, name=name: forward_pre(name, a, k), with_kwargs=True)
                module.register_forward_hook(lambda m, i, o, name=name: forward_end(name, o))
    parameters = {q.untyped_storage().data_ptr() for q in model.parameters()}
    first_saved = {}  # storage -> (module, bytes, dtype, shape)

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in parameters and key not in first_saved:
            first_saved[key] = (running[-1], t.untyped_storage().nbytes(), str(t.dtype).replace("torch.", ""),
                                tuple(t.shape))
        return t

    if layout is None:
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
        batch = {"input_ids": ids, "labels": ids}
    else:
        batch = image_batch(layout, args.batch, args.seq, torch.Generator().manual_seed(1234))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    if counting is not None:
        loss.backward()

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
    for module, which, nbytes in peaks:
        print(f"{module} {which} peak {nbytes:,} above its start")


if __name__ == "__main__":
    main(sys.argv[1:])
