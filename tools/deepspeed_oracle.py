"""The DeepSpeed oracle: trains a transformers model built from a config.json
with real DeepSpeed on CPU ranks and measures every rank's exact tensor bytes.

Python is right here: it drives a Python framework (DESIGN section 7, rung 2).
Each rank is one process with DS_ACCELERATOR=cpu (gloo), launched the way
torchrun does (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT).
Before the model exists, every rank loads zplan's counting CPU allocator
(//executor:libzplan_counting_allocator.so, the one zrun measures with), so
DeepSpeed and zrun are measured by the same code. Loading it also gives the
process zrun's 16-bit CPU matrix products (executor/cpu_gemm.h: the same
tensors, at fp32 speed where the CPU lacks AVX512).

What it writes (--out): a zplan Report (proto/report.proto) as JSON, so the
plan-vs-measurement comparison is the one zrun's reports go through
(tools/accuracy.h). Per rank, measured_device is the peak over the steps after
the first (the first creates lazily allocated optimizer states), by planner
component as far as the harness can tell: parameters, master weights and
optimizer states by identity; forward tensors that survive the forward as
activations, the rest of the forward as temporaries; the LM head, loss and
their gradients as logits; what initialize allocated as buffers; everything
else as temporaries. peak_event names the phase of the peak. measured_host is
the process's VmHWM. Samples: after initialize (the construction and
initialize peak) and the whole run's peak.

--trace FILE also writes the last step's allocation log per rank: events
(bytes, tag, live bytes after) and marks (event index, label) at module
boundaries and at the entry and exit of DeepSpeed's optimizer methods.

Usage (the launcher; --rank is internal):
  deepspeed_oracle.py --hf-config llama.json --ds-config ds.json --world 2 \
      --seq 64 --steps 3 --attention sdpa --allocator libzplan_counting_allocator.so \
      --out report.json
"""

import argparse
import ctypes
import functools
import importlib.metadata
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

# proto/memory.proto Component numbers.
PARAMS, GRADS, MASTER, OPTIMIZER, ACTIVATIONS, LOGITS, BUFFERS, TEMPORARIES = range(1, 9)
COMPONENT_NAMES = {
    PARAMS: "params", GRADS: "grads", MASTER: "master_params", OPTIMIZER: "optimizer_states",
    ACTIVATIONS: "activations", LOGITS: "logits", BUFFERS: "buffers", TEMPORARIES: "temporaries",
}  # MemoryBreakdown's field names without _bytes
NUM_TAGS = 11


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-config", required=True, help="transformers config.json")
    p.add_argument("--ds-config", required=True, help="DeepSpeed config JSON")
    p.add_argument("--world", type=int, default=1, help="ranks (processes)")
    p.add_argument("--seq", type=int, default=0,
                   help="tokens per sequence (language models; a ViT's image fixes its own)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (>= 2)")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--checkpoint-every", type=int, default=1,
                   help="with --checkpointing: checkpoint every k-th block (transformers' every_n_layers)")
    p.add_argument("--checkpoint-offload", action="store_true",
                   help="with --checkpointing: checkpointed inputs to pinned host memory (transformers' offload)")
    p.add_argument("--checkpoint-function", choices=("torch", "deepspeed"), default="torch",
                   help="with --checkpointing: the blocks checkpoint through torch.utils.checkpoint (transformers) "
                        "or deepspeed.checkpointing.checkpoint, configured from the DeepSpeed config's "
                        "activation_checkpointing block")
    p.add_argument("--lora-config", default="", help="a PEFT adapter_config.json: train LoRA adapters on the frozen model")
    p.add_argument("--loss", default="full", choices=["full", "liger-fused"],
                   help="full: transformers' loss over the logits; liger-fused: Liger's fused linear "
                        "cross-entropy (chunked, no b x s x V logits), as use_liger_kernel applies it")
    p.add_argument("--allocator", required=True, help="path of libzplan_counting_allocator.so")
    p.add_argument("--out", required=True, help="where the Report (JSON) goes")
    p.add_argument("--timeout", type=float, default=900, help="seconds before the ranks are killed")
    p.add_argument("--trace", default="", help="also write the last step's allocation log here (JSON)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.loss == "liger-fused" and args.lora_config:
        p.error("--loss liger-fused with --lora-config is not supported")
    if args.steps < 2:
        p.error("--steps must be at least 2: the first step is the warm-up")
    if args.world < 1 or args.seq < 0:
        p.error("--world must be >= 1 and --seq >= 0")
    return args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# torch.utils.cpp_extension._jit_compile takes a FileBaton (a `lock` file in
# the op's build folder) on every load of a DeepSpeed JIT op, built or not, and
# waits while one exists. A build killed midway leaves it behind, and every
# later rank then waits until its timeout. tools/setup.sh builds the ops, so a
# load here holds the lock for about a second: one older than this was left.
STALE_LOCK_SECONDS = 600


def extensions_dir():
    return os.environ.get("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def check_no_stale_lock(now=None):
    """Exits naming each lock an interrupted JIT build left, and the fix."""
    now = time.time() if now is None else now
    root = extensions_dir()
    stale = []
    for dirpath, _, filenames in os.walk(root) if os.path.isdir(root) else ():
        if "lock" in filenames:
            path = os.path.join(dirpath, "lock")
            try:
                age = now - os.stat(path).st_mtime
            except FileNotFoundError:  # released meanwhile
                continue
            if age > STALE_LOCK_SECONDS:
                stale.append(f"{path} ({age / 60:.0f} minutes old)")
    if stale:
        sys.exit("deepspeed_oracle: a DeepSpeed op build was interrupted and left its lock, so every rank would "
                 "wait for it forever: " + ", ".join(stale) + ". Remove it (rm the file) or rerun tools/setup.sh, "
                 "which removes it and builds the ops.")


def launch(args):
    """Starts one process per rank and merges their results into args.out."""
    check_no_stale_lock()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(args.world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world),
                       LOCAL_WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
            # DeepSpeed's JIT ops (built once with the venv's ninja, then cached in the venv).
            env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
            argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
                "--rank", str(rank), "--out", os.path.join(tmp, f"rank{rank}.json"),
                "--trace", "yes" if args.trace else ""]
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w")
            procs.append((subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        failed = []
        for rank, (proc, log) in enumerate(procs):
            try:
                rc = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                rc = "timeout"
                for other, _ in procs:
                    other.kill()
            log.close()
            if rc != 0:
                failed.append((rank, rc))
        if failed:
            rank, rc = failed[0]
            with open(os.path.join(tmp, f"rank{rank}.log")) as f:
                tail = f.read()[-6000:]
            sys.exit(f"deepspeed_oracle: rank {rank} failed ({rc}):\n{tail}")
        ranks, traces = [], []
        for rank in range(args.world):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                result = json.load(f)
            traces.append(result.pop("trace", None))
            ranks.append(result)
    framework = ranks[0].pop("framework")
    for r in ranks[1:]:
        r.pop("framework")
    write_json(args.out, {"backend": "gloo", "device": "cpu", "framework": framework, "ranks": ranks})
    if args.trace:
        write_json(args.trace, traces)


def write_json(path, value):
    """Writes through a temporary file, so a good file is never half replaced."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


class Allocator:
    """ctypes view of executor/counting_allocator_c_api.cc."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        for name in ("zplan_current_bytes", "zplan_peak_bytes", "zplan_peak_breakdown"):
            getattr(lib, name).restype = ctypes.c_int64
        lib.zplan_tag_allocation.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.zplan_log_take.restype = ctypes.c_int64
        lib.zplan_log_take.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        lib.zplan_tensor_use_count.restype = ctypes.c_int64
        lib.zplan_tensor_use_count.argtypes = [ctypes.c_void_p]
        if not lib.zplan_install():
            sys.exit("deepspeed_oracle: the counting allocator could not be installed")
        self.lib = lib

    def tag(self, component):
        self.lib.zplan_set_tag(component)

    def retag(self, tensor, component):
        if tensor is not None and tensor.numel() > 0:
            self.lib.zplan_tag_allocation(tensor.untyped_storage().data_ptr(), component)

    def take_log(self, events):
        buf = (ctypes.c_int64 * (3 * 65536))()
        while True:
            n = self.lib.zplan_log_take(buf, 65536)
            events.extend([buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]] for i in range(n))
            if n < 65536:
                return

    def peak(self):
        return self.lib.zplan_peak_bytes()

    def use_count(self, tensor):
        return self.lib.zplan_tensor_use_count(tensor._cdata)

    def breakdown(self):
        """The peak as a MemoryBreakdown (proto JSON field names)."""
        out = (ctypes.c_int64 * NUM_TAGS)()
        peak = self.lib.zplan_peak_breakdown(out, NUM_TAGS)
        result = {f"{COMPONENT_NAMES[c]}_bytes": out[c] for c in COMPONENT_NAMES}
        result["peak_bytes"] = peak
        return result


def vm_hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# torch.distributed's collectives DeepSpeed calls (deepspeed/comm/torch.py).
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single")
RELEASE_WAIT_S = 1.0


def await_gloo_release(alloc):
    """Makes each synchronous collective return only once gloo's worker thread
    has let go of its tensors, as zrun does (executor/collectives.cc, Finish).
    ProcessGroupGloo::runLoop keeps the finished work, and with it the tensors,
    until it relocks, a moment after wait() returns; a buffer DeepSpeed frees
    right after the call then lives on at random (one CI run saw ZeRO-0's
    gradient bucket alive through the optimizer step). Bounded: a stuck
    thread only delays the free."""
    import torch
    import torch.distributed as dist

    def tensors_in(values):
        for v in values:
            if isinstance(v, torch.Tensor):
                yield v
            elif isinstance(v, (list, tuple)):
                yield from tensors_in(v)

    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments
            if bound.get("async_op"):
                return fn(*args, **kwargs)
            tensors = list(tensors_in(bound.values()))
            before = [alloc.use_count(t) for t in tensors]
            result = fn(*args, **kwargs)
            deadline = time.monotonic() + RELEASE_WAIT_S
            while (any(alloc.use_count(t) > n for t, n in zip(tensors, before))
                   and time.monotonic() < deadline):
                time.sleep(0)
            return result
        return call

    for name in COLLECTIVES:
        setattr(dist, name, wrap(getattr(dist, name)))


def tag_resident_states(alloc, engine):
    """Retags what lives across steps by identity: parameters, master
    weights and optimizer states; the rest keeps its allocation-time tag."""
    import torch

    for p in engine.module.parameters():
        alloc.retag(getattr(p, "ds_tensor", None), PARAMS)
        alloc.retag(p.data, PARAMS)
    opt = engine.optimizer

    def tensors(attr):
        """The tensors of a DeepSpeed attribute: a list, or a list of lists."""
        for item in getattr(opt, attr, None) or []:
            yield from (item if isinstance(item, (list, tuple)) else [item])

    # Master weights of ZeRO-1/2, ZeRO-3, the bf16 optimizer, and the fp16
    # optimizers (flat and per parameter).
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition",
                 "fp32_groups_flat", "fp32_groups"):
        for t in tensors(attr):
            alloc.retag(t, MASTER)
    for attr in ("fp16_partitioned_groups_flat", "bit16_groups_flat", "fp16_groups_flat"):
        for flat in tensors(attr):
            alloc.retag(flat, PARAMS)
    inner = getattr(opt, "optimizer", opt)
    for state in getattr(inner, "state", {}).values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                alloc.retag(value, OPTIMIZER)


def bf16_bits_to_f32(bits):
    """numpy: bf16 bit patterns (int16) as float32 values."""
    import numpy as np
    return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """numpy: float32 values rounded to bf16 (to nearest even) as int16 bit patterns."""
    import numpy as np
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)


class RowKernel:
    """Stands in for a Triton kernel launch, kernel[grid](**kwargs), on CPU ranks."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def numpy_view(tensor):
    """The tensor's memory as float32 values (numpy), and a function that
    writes float32 values back into it in its dtype. numpy's arrays are not
    c10 allocations: like a Triton kernel's registers, the counting allocator
    does not see them."""
    import torch
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy()
        return bf16_bits_to_f32(bits), lambda values: bits.__setitem__(Ellipsis, f32_to_bf16_bits(values))
    array = tensor.numpy()
    return array.astype("float32"), lambda values: array.__setitem__(Ellipsis, values)


def liger_cross_entropy_rows(X_ptr, Y_ptr, loss_ptr, n_non_ignore, ignore_index, reduction, HAS_GRADIENTS,
                             weight_ptr=None, lse_square_scale=0.0, label_smoothing=0.0, softcap=None,
                             RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False, RETURN_PREDICTED_TOKENS=False,
                             **launch):
    """liger_kernel/ops/cross_entropy.py, liger_cross_entropy_kernel, on CPU:
    per row the fp32 log-sum-exp, the loss lse - x_y (divided by the
    non-ignored count for "mean"), and in place of the logits their gradient
    softmax(x) - onehot(y) (so divided); an ignored row gets 0 and 0. Only
    what Liger's transformers loss passes is supported."""
    import numpy as np
    if (weight_ptr is not None or lse_square_scale or label_smoothing or softcap is not None or RETURN_Z_LOSS
            or RETURN_TOKEN_ACCURACY or RETURN_PREDICTED_TOKENS):
        raise NotImplementedError("the CPU port of liger_cross_entropy_kernel covers the plain loss only")
    x, store = numpy_view(X_ptr)
    y = Y_ptr.numpy()
    rows = np.arange(x.shape[0])
    kept = y != ignore_index
    target = np.where(kept, y, 0)
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    d = e.sum(axis=1, keepdims=True)
    scale = 1.0 / n_non_ignore if reduction == "mean" else 1.0
    loss = (m[:, 0] + np.log(d[:, 0]) - x[rows, target]) * scale
    loss_ptr.numpy()[...] = np.where(kept, loss, 0.0)
    if HAS_GRADIENTS:
        grad = e / d
        grad[rows, target] -= 1.0
        grad *= scale
        grad[~kept] = 0.0
        store(grad)


def liger_element_mul_rows(X_ptr, X_stride, grad_output_ptr, n_cols, **launch):
    """liger_kernel/ops/utils.py, element_mul_kernel, on CPU: X *= grad_output in place."""
    x, store = numpy_view(X_ptr)
    store(x * float(grad_output_ptr))


def use_liger_fused_linear_cross_entropy(model):
    """What transformers' Trainer does with use_liger_kernel=True and a
    liger_kernel_config enabling only fused_linear_cross_entropy
    (_apply_liger_kernel_to_instance): the model's forward computes the loss
    with LigerFusedLinearCrossEntropyFunction from the final norm's output and
    lm_head.weight, never materialising the logits. Liger's Python runs as it
    is; its two Triton kernels, which allocate nothing, run as the numpy ports
    above, since Triton needs a GPU."""
    import liger_kernel.ops.fused_linear_cross_entropy as flce
    from liger_kernel.transformers import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    if model.config.model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        sys.exit(f"deepspeed_oracle: --loss liger-fused: Liger has no forward for model_type "
                 f"{model.config.model_type!r}")
    flce.liger_cross_entropy_kernel = RowKernel(liger_cross_entropy_rows)
    flce.element_mul_kernel = RowKernel(liger_element_mul_rows)
    _apply_liger_kernel_to_instance(model=model, rope=False, rms_norm=False, swiglu=False, cross_entropy=False,
                                    fused_linear_cross_entropy=True, layer_norm=False, geglu=False)


def run_rank(args):
    import torch

    alloc = Allocator(args.allocator)  # before any model tensor exists
    await_gloo_release(alloc)
    import deepspeed
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    with open(args.ds_config) as f:
        ds_config = json.load(f)
    deepspeed.init_distributed(dist_backend="gloo")
    # Kept alive: transformers builds a stage-3 model under zero.Init while it exists,
    # as the Trainer does.
    hf_ds_config = HfDeepSpeedConfig(ds_config)  # noqa: F841
    with open(args.hf_config) as f:
        config_dict = json.load(f)
    config = transformers.AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    config.use_cache = False
    torch.manual_seed(0)
    alloc.tag(PARAMS)
    # A ViT config trains ViTForImageClassification on random images and labels.
    vision = config.model_type == "vit"
    if not vision and args.seq < 2:
        sys.exit("deepspeed_oracle: --seq (>= 2) is required for a language model")
    tokens = (config.image_size // config.patch_size) ** 2 + 1 if vision else args.seq
    if vision and args.seq and args.seq != tokens:
        sys.exit(f"deepspeed_oracle: --seq {args.seq}: this ViT's image gives {tokens} tokens")
    auto = transformers.AutoModelForImageClassification if vision else transformers.AutoModelForCausalLM
    model = auto.from_config(config, attn_implementation=args.attention)
    if args.loss == "liger-fused":
        use_liger_fused_linear_cross_entropy(model)
    if args.lora_config:
        import peft
        with open(args.lora_config) as f:
            model = peft.get_peft_model(model, peft.get_peft_config(json.load(f)))
    if args.checkpointing:
        model.activation_checkpointing_enable(every_n_layers=args.checkpoint_every, offload=args.checkpoint_offload)
    if args.checkpointing and args.checkpoint_function == "deepspeed":
        # As a Megatron-style model does: DeepSpeed's checkpoint, configured
        # from the config's activation_checkpointing block, in place of
        # torch's (the layers transformers marked keep their every-k choice).
        deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
        for module in model.modules():
            if isinstance(module, transformers.modeling_layers.GradientCheckpointingLayer):
                module._gradient_checkpointing_func = deepspeed.checkpointing.checkpoint
    model.train()
    alloc.tag(BUFFERS)
    # As the Trainer's create_optimizer: the optimizer gets the trainable parameters only.
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config)
    init_peak = alloc.peak()
    tag_resident_states(alloc, engine)

    micro = engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    vocab = getattr(config, "vocab_size", 0)
    gen = torch.Generator().manual_seed(1234 + engine.global_rank)

    # Attribution hooks: forward tensors are pending until the LM head (then
    # activations or temporaries), the head and loss chain is logits until
    # the head's input gradient exists, the rest of backward temporaries.
    head = engine.module.classifier if vision else engine.module.get_output_embeddings()
    body = engine.module

    def body_pre(module, inputs):
        alloc.lib.zplan_begin_forward_part()

    def head_pre(module, *unused):
        alloc.lib.zplan_settle_forward_part(LOGITS)

    def head_bwd(module, *unused):
        alloc.tag(TEMPORARIES)

    body.register_forward_pre_hook(body_pre)
    if args.loss == "liger-fused":
        # Liger never calls the head: the loss starts after the final norm,
        # and backward leaves it with the final norm's output gradient.
        final_norm = engine.module.get_decoder().norm
        final_norm.register_forward_hook(head_pre)
        final_norm.register_full_backward_pre_hook(head_bwd)
    else:
        head.register_forward_pre_hook(head_pre)
        head.register_full_backward_hook(head_bwd)

    trace = {"events": [], "marks": []}
    tracing = [False]

    def mark(label):
        if tracing[0]:
            alloc.take_log(trace["events"])
            trace["marks"].append([len(trace["events"]), label])

    if args.trace:
        for name, module in engine.module.named_modules():
            if name.count(".") > 2 or not name:
                continue
            module.register_forward_pre_hook(lambda m, i, name=name: mark(f"forward {name}"))
            module.register_forward_hook(lambda m, i, o, name=name: mark(f"forward {name} end"))
            module.register_full_backward_pre_hook(lambda m, g, name=name: mark(f"backward {name}"))
            module.register_full_backward_hook(lambda m, gi, go, name=name: mark(f"backward {name} end"))
        # DeepSpeed's optimizer wrapper and the optimizer it drives: marks at
        # each method's entry and exit.
        for obj in {id(engine.optimizer): engine.optimizer,
                    id(getattr(engine.optimizer, "optimizer", None)): getattr(engine.optimizer, "optimizer", None)}.values():
            if obj is None:
                continue
            for attr in dir(type(obj)):
                fn = getattr(type(obj), attr, None)
                if attr.startswith("__") or not callable(fn) or isinstance(fn, type):
                    continue

                def wrapped(*a, __fn=getattr(obj, attr), __name=f"{type(obj).__name__}.{attr}", **k):
                    mark(f"> {__name}")
                    try:
                        return __fn(*a, **k)
                    finally:
                        mark(f"< {__name}")
                try:
                    setattr(obj, attr, wrapped)
                except (AttributeError, TypeError):
                    pass

    losses = []
    steady_breakdown = {}
    phase = {"peak": 0, "label": ""}  # the running peak of this step and the phase that set it

    def note_phase(label):
        if alloc.peak() > phase["peak"]:
            phase["peak"], phase["label"] = alloc.peak(), label

    for step in range(args.steps):
        if step == 1:
            warmup_peak = alloc.peak()
            tag_resident_states(alloc, engine)  # optimizer states exist now
            alloc.lib.zplan_reset_peak()
        phase["peak"] = alloc.peak()
        if args.trace and step == args.steps - 1:
            alloc.lib.zplan_log_enable(1)
            tracing[0] = True
            mark("step start")
        step_loss = 0.0
        for micro_step in range(accum):
            if vision:
                # fp32 pixels, as an image processor gives them.
                size = config.image_size
                batch = {"pixel_values": torch.randn(micro, config.num_channels, size, size, generator=gen),
                         "labels": torch.randint(0, config.num_labels, (micro,), generator=gen)}
            else:
                ids = torch.randint(0, vocab, (micro, args.seq), generator=gen)
                batch = {"input_ids": ids, "labels": ids}
            mark(f"micro-step {micro_step}")
            # As the Trainer's training_step: the batch and the loss outlive the
            # forward (the logits in the model's output are released before backward).
            loss = engine(**batch).loss
            mark("loss computed")
            alloc.tag(LOGITS)
            note_phase(f"forward (micro-step {micro_step})")
            engine.backward(loss)
            mark("backward done")
            alloc.tag(TEMPORARIES)
            note_phase(f"backward (micro-step {micro_step})")
            step_loss += float(loss.detach()) / accum
            del loss
            mark("loss freed")
            engine.step()
            mark("engine.step done")
            note_phase("optimizer step" if micro_step == accum - 1 else f"step boundary (micro-step {micro_step})")
        losses.append(step_loss)
        if step >= 1:
            steady_breakdown = alloc.breakdown()
            steady_breakdown["peak_event"] = phase["label"]
        alloc.tag(BUFFERS if step == 0 else TEMPORARIES)

    if tracing[0]:
        mark("end")
        alloc.lib.zplan_log_enable(0)
    result = {
        "rank": engine.global_rank,
        "measured_device": steady_breakdown,
        "measured_host": {"peak_bytes": vm_hwm_bytes()},
        # PHASE_INIT: construction through initialize; the run's peak (warm-up step included).
        "samples": [{"phase": "PHASE_INIT", "step": 0, "peak_allocated_bytes": init_peak},
                    {"phase": "PHASE_OPTIMIZER_STEP", "step": args.steps - 1,
                     "peak_allocated_bytes": max(warmup_peak, steady_breakdown["peak_bytes"])}],
        "losses": losses,
        "framework": f"DeepSpeed {deepspeed.__version__}, transformers {transformers.__version__}, "
                     + (f"peft {sys.modules['peft'].__version__}, " if args.lora_config else "")
                     + (f"liger-kernel {importlib.metadata.version('liger-kernel')}, " if args.loss != "full" else "")
                     + f"torch {torch.__version__}",
    }
    if args.trace:
        result["trace"] = trace
    with open(args.out, "w") as f:
        json.dump(result, f)
    deepspeed.comm.barrier()
    # Everything is written: skip interpreter teardown, where the process
    # group's and DeepSpeed's C++ threads sometimes abort the process
    # ("terminate called without an active exception") after a good run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv):
    args = parse_args(argv)
    if args.rank < 0:
        launch(args)
    else:
        run_rank(args)


if __name__ == "__main__":
    main(sys.argv[1:])
