"""The DeepSpeed oracle: trains a transformers model built from a config.json
with real DeepSpeed on CPU ranks (or one GPU) and measures every rank's
tensor bytes.

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
initialize peak) and the whole run's peak. routing: for a mixture of
experts, each MoE layer's pairs per expert in the micro-step of the peak.

--trace FILE also writes the last step's allocation log per rank: events
(bytes, tag, live bytes after) and marks (event index, label) at module
boundaries and at the entry and exit of DeepSpeed's optimizer methods.

--emulate-rank R runs one process as rank R of --world on torch's fake
process group (torch.testing._internal.distributed.fake_pg): every
collective returns at once without communicating, but DeepSpeed partitions,
pads and allocates every buffer as rank R of that world would, so one
process (or one GPU) measures a rank of a world it does not have.

--device cuda trains on this machine's GPU (DS_ACCELERATOR=cuda): one NCCL
rank (--world 1) or one emulated rank. The caching allocator measures it:
peak allocated over the steps after the first, reserved beyond that peak
(allocator_bytes) and the device's memory outside the pool at that moment
(runtime_bytes: cudaMemGetInfo's used minus reserved, the CUDA context and
NCCL). Parameters, master weights and optimizer states are attributed by
identity; the rest of the peak is reported as temporaries. Every rank also
reports each step's wall time (after torch.cuda.synchronize on a GPU).

A vision-language config (one with a vision_config: llava, qwen2_5_vl, qwen3_vl,
qwen3_5) trains AutoModelForImageTextToText on --images-per-sample random images
of --image-size pixels at the start of every sequence, laid out as the model's
processor does; --freeze names the parts that do not train, and LoRA adapts the
language model only (docs/vlm_oracle.md).

Usage (the launcher; --rank is internal):
  deepspeed_oracle.py --hf-config llama.json --ds-config ds.json --world 2 \
      --seq 64 --steps 3 --attention sdpa --allocator libzplan_counting_allocator.so \
      --out report.json
  deepspeed_oracle.py --device cuda --hf-config llama.json --ds-config ds.json \
      --world 8 --emulate-rank 7 --seq 2048 --out report.json
  deepspeed_oracle.py --hf-config configs/hf/tiny/qwen2_5_vl.json --image-size 224 \
      --freeze vision_tower --ds-config ds.json --world 2 --seq 256 --allocator ... --out report.json
"""

import argparse
import ctypes
import functools
import importlib.metadata
import inspect
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import memory_history  # tools/memory_history.py, beside this file

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
                   help="tokens per sequence (language models, a vision-language model's image tokens included; "
                        "a ViT's image fixes its own)")
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
    p.add_argument("--lora-config", default="",
                   help="a PEFT adapter_config.json: train LoRA adapters on the frozen model (a vision-language "
                        "model: on its language model only, which --freeze must list)")
    p.add_argument("--image-size", type=int, default=0,
                   help="vision-language models: square images of this many pixels a side (llava: its tower's "
                        "image_size, the default; Qwen: a multiple of patch_size x spatial_merge_size, required)")
    p.add_argument("--images-per-sample", type=int, default=0,
                   help="vision-language models: images at the start of every sequence (default 1)")
    p.add_argument("--freeze", default="",
                   help="vision-language models: a comma list of " + ", ".join(VLM_PARTS) + " (the LM head "
                        "belongs to language_model): those parts' parameters do not train")
    p.add_argument("--loss", default="full", choices=["full", "liger-fused"],
                   help="full: transformers' loss over the logits; liger-fused: Liger's fused linear "
                        "cross-entropy (chunked, no b x s x V logits), as use_liger_kernel applies it")
    p.add_argument("--kernels", default="none",
                   help="none, or a list of fla and causal_conv1d: the packages transformers may import for "
                        "linear attention and short convolutions (zplan's --kernels); one not listed is hidden, "
                        "one listed must import")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: Gloo CPU ranks measured by the counting allocator; cuda: this machine's GPU")
    p.add_argument("--emulate-rank", type=int, default=-1,
                   help="one process as this rank of --world, on torch's fake process group")
    p.add_argument("--allocator", default="", help="path of libzplan_counting_allocator.so (--device cpu)")
    p.add_argument("--out", required=True, help="where the Report (JSON) goes")
    p.add_argument("--timeout", type=float, default=900, help="seconds before the ranks are killed")
    p.add_argument("--trace", default="", help="also write the last step's allocation log here (JSON)")
    p.add_argument("--memory-history", default="",
                   help="--device cuda: also write the caching allocator's history, from before the model "
                        "is built to the end, here (tools/memory_history.py; gzip text)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.loss == "liger-fused" and args.lora_config:
        p.error("--loss liger-fused with --lora-config is not supported")
    if args.steps < 2:
        p.error("--steps must be at least 2: the first step is the warm-up")
    if args.world < 1 or args.seq < 0:
        p.error("--world must be >= 1 and --seq >= 0")
    args.kernels = {k.strip() for k in args.kernels.lower().split(",") if k.strip() not in ("", "none")}
    if not args.kernels <= set(KERNEL_PACKAGES):
        p.error(f"--kernels: {','.join(sorted(args.kernels))}; give none, or fla and causal_conv1d")
    if args.emulate_rank >= args.world:
        p.error(f"--emulate-rank {args.emulate_rank}: a world of {args.world} has ranks 0-{args.world - 1}")
    if args.device == "cpu" and not args.allocator:
        p.error("--device cpu needs --allocator (libzplan_counting_allocator.so)")
    if args.device == "cuda" and args.world > 1 and args.emulate_rank < 0:
        p.error(f"--device cuda --world {args.world}: one GPU runs one NCCL rank; "
                "add --emulate-rank R to measure rank R of that world")
    if args.device == "cuda" and args.trace:
        p.error("--trace needs the counting allocator (--device cpu)")
    if args.device != "cuda" and args.memory_history:
        p.error("--memory-history records the CUDA caching allocator: it needs --device cuda")
    check_vlm_flags(p, args)
    return args


def check_vlm_flags(p, args):
    """The image flags against the config.json's keys (no transformers import: a rank parses its
    arguments before choose_kernels). args.vlm: the config has a vision_config, so the model is
    built as AutoModelForImageTextToText and fed images. What needs the config's values is
    checked by image_layout, in the launcher and again in each rank."""
    try:
        with open(args.hf_config) as f:
            args.vlm = "vision_config" in json.load(f)
    except (OSError, ValueError):
        args.vlm = False  # reported where the ranks read it, as before
    flags = [f for f, given in (("--image-size", args.image_size), ("--images-per-sample", args.images_per_sample),
                                ("--freeze", args.freeze)) if given]
    if flags and not args.vlm:
        p.error(f"{', '.join(flags)}: {args.hf_config} is a text model (no vision_config); these flags are for "
                f"vision-language configs ({', '.join(VLM_TYPES)}): drop them or give such a config")
    if not args.vlm:
        return
    if args.image_size < 0 or args.images_per_sample < 0:
        p.error("--image-size and --images-per-sample must be positive (leave them out for the defaults)")
    args.images_per_sample = args.images_per_sample or 1
    args.freeze = {part.strip() for part in args.freeze.split(",") if part.strip()}
    unknown = args.freeze - set(VLM_PARTS)
    if unknown:
        p.error(f"--freeze {','.join(sorted(unknown))}: the parts are {', '.join(VLM_PARTS)}")
    if args.freeze == set(VLM_PARTS) and not args.lora_config:
        p.error("--freeze: every part is frozen and no --lora-config adds adapters: nothing would train")
    if args.lora_config and "language_model" not in args.freeze:
        p.error("--lora-config with a vision-language model: LoRA trains adapters on a frozen language model, so "
                "--freeze must list language_model (add vision_tower / projector to freeze those too; a part not "
                "listed trains in full)")
    if args.loss != "full":
        p.error(f"--loss {args.loss}: vision-language models train with --loss full only")
    if args.seq < 2:
        p.error("--seq (the language model's sequence, image tokens included) is required for a vision-language model")


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


def cache_cpu_info():
    """DeepSpeed's op builders ask py-cpuinfo twice per JIT op load
    (deepspeed/ops/op_builder/builder.py, cpu_arch and simd_width), and
    get_cpu_info forks a Python process to read CPUID each time: 1.2-1.5 s
    per call on the 2-core machine, in every rank, for the same answer. The
    answer is kept beside the ops, keyed by /proc/cpuinfo's model and flags
    (what DeepSpeed reads of it: arch and flags), so a rank asks it at most
    once per machine. It is a Python dict: nothing the counting allocator
    sees."""
    import cpuinfo
    import hashlib
    try:
        with open("/proc/cpuinfo") as f:
            key = hashlib.sha256("".join(line for line in f if line.startswith(("model name", "flags")))
                                 .encode()).hexdigest()[:16]
    except OSError:
        return
    path = os.path.join(extensions_dir(), f"cpuinfo-{key}.json")
    fetch = cpuinfo.get_cpu_info

    def cached():
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            info = fetch()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_json(path, {k: info[k] for k in ("arch", "flags", "brand_raw") if k in info})
            return info

    cpuinfo.get_cpu_info = cached


def launch(args):
    """Starts one process per rank and merges their results into args.out."""
    check_no_stale_lock()
    port = free_port()
    started = [args.emulate_rank] if args.emulate_rank >= 0 else list(range(args.world))
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in started:
            # An emulated rank is its node's only process: local rank 0 (a GPU's index).
            local = 0 if args.emulate_rank >= 0 else rank
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(args.world),
                       LOCAL_WORLD_SIZE=str(len(started)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DS_ACCELERATOR=args.device)
            if args.device == "cpu":
                env["OMP_NUM_THREADS"] = "1"
            # DeepSpeed's JIT ops (built once with the venv's ninja, then cached in the venv).
            env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
            argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
                "--rank", str(rank), "--out", os.path.join(tmp, f"rank{rank}.json"),
                "--trace", "yes" if args.trace else ""]
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w")
            procs.append((subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        failed = []
        for rank, (proc, log) in zip(started, procs):
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
        for rank in started:
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                result = json.load(f)
            traces.append(result.pop("trace", None))
            ranks.append(result)
    framework = ranks[0].pop("framework")
    for r in ranks[1:]:
        r.pop("framework")
    device = ranks[0].pop("device")
    for r in ranks[1:]:
        r.pop("device")
    write_json(args.out, {"backend": backend_name(args), "device": device, "framework": framework, "ranks": ranks})
    if args.trace:
        write_json(args.trace, traces)


def backend_name(args):
    """The process group the ranks run on."""
    if args.emulate_rank >= 0:
        return "fake"
    return "nccl" if args.device == "cuda" else "gloo"


def write_json(path, value):
    """Writes through a temporary file, so a good file is never half replaced."""
    tmp = f"{path}.{os.getpid()}.tmp"
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

    def reset_peak(self):
        self.lib.zplan_reset_peak()

    def begin_forward_part(self):
        self.lib.zplan_begin_forward_part()

    def settle_forward_part(self, component):
        self.lib.zplan_settle_forward_part(component)

    def log_enable(self, enabled):
        self.lib.zplan_log_enable(1 if enabled else 0)

    def synchronize(self):
        pass

    def use_count(self, tensor):
        return self.lib.zplan_tensor_use_count(tensor._cdata)

    def breakdown(self):
        """The peak as a MemoryBreakdown (proto JSON field names)."""
        out = (ctypes.c_int64 * NUM_TAGS)()
        peak = self.lib.zplan_peak_breakdown(out, NUM_TAGS)
        result = {f"{COMPONENT_NAMES[c]}_bytes": out[c] for c in COMPONENT_NAMES}
        result["peak_bytes"] = peak
        return result


class CudaMeter:
    """The caching allocator's view of this process's GPU, behind the
    Allocator's interface. Allocation-time tags do not exist here: resident
    states are attributed by identity (retag) and the rest of the peak is
    temporaries."""

    def __init__(self):
        import torch
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.resident = {}  # storage data_ptr -> (component, bytes)
        self.at_peak = {"used": 0, "reserved": 0}

    def tag(self, component):
        pass

    def retag(self, tensor, component):
        if tensor is not None and tensor.numel() > 0 and tensor.is_cuda:
            storage = tensor.untyped_storage()
            self.resident[storage.data_ptr()] = (component, storage.nbytes())

    def use_count(self, tensor):
        return 0

    def peak(self):
        return self.torch.cuda.max_memory_allocated(self.device)

    def reset_peak(self):
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.reset_peak_memory_stats(self.device)
        self.at_peak = {"used": 0, "reserved": 0}

    def synchronize(self):
        """Waits for the GPU and notes the device's used memory at this
        moment (cudaMemGetInfo), the nearest the harness gets to the peak's."""
        self.torch.cuda.synchronize(self.device)
        free, total = self.torch.cuda.mem_get_info(self.device)
        if total - free > self.at_peak["used"]:
            self.at_peak = {"used": total - free, "reserved": self.torch.cuda.memory_reserved(self.device)}

    def begin_forward_part(self):
        pass

    def settle_forward_part(self, component):
        pass

    def log_enable(self, enabled):
        pass

    def breakdown(self):
        """The peak as a MemoryBreakdown: resident states by identity, the
        rest temporaries; reserved beyond the peak; memory outside the pool."""
        peak = self.peak()
        result = {f"{COMPONENT_NAMES[c]}_bytes": 0 for c in COMPONENT_NAMES}
        for component, nbytes in self.resident.values():
            result[f"{COMPONENT_NAMES[component]}_bytes"] += nbytes
        result["temporaries_bytes"] = max(0, peak - sum(result.values()))
        result["peak_bytes"] = peak
        result["allocator_bytes"] = self.torch.cuda.max_memory_reserved(self.device) - peak
        result["runtime_bytes"] = max(0, self.at_peak["used"] - self.at_peak["reserved"])
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


def fill_fake_collectives(rank, world, weight_dtype):
    """The fake process group returns at once and writes nothing, so gathered
    parameters, reduced gradients and broadcast weights would be whatever the
    allocator's memory held (NaN losses, skipped optimizer steps, no
    optimizer states). Each collective that delivers into an output here
    fills it in place: a gather or scatter with this rank's own data in every
    slot, a broadcast from another rank with weight-like values. The values
    are plausible and the allocations are exactly the collective's own
    (copy_, nan_to_num_ and normal_ allocate nothing)."""
    import torch
    import torch.distributed as dist

    def copy(dst, src):  # in-place collectives pass a slot of the output as the input
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src.view_as(dst))
            if dst.is_floating_point():  # a partition's padding is torch.empty's memory
                dst.nan_to_num_(0.0, 0.0, 0.0)

    def gather_into(output, input):
        for slot in output.view(world, -1):
            copy(slot, input.reshape(-1))

    def gather_list(tensor_list, tensor):
        for t in tensor_list:
            copy(t, tensor)

    def scatter_from(output, input):
        copy(output, input.view(world, -1)[rank])

    def scatter_list(output, input_list):
        copy(output, input_list[rank])

    def receive(tensor, src):
        # What another rank sends: weights that rank 0 initialized (transformers'
        # ZeRO-3 init under GatheredParameters(modifier_rank=0); zero.Init), as
        # the bytes of a tensor of the model's dtype (p.data.view(torch.uint8)).
        if src == rank:
            return
        if tensor.dtype == torch.uint8 and tensor.numel() % weight_dtype.itemsize == 0:
            tensor.view(weight_dtype).normal_(0.0, 0.02)
        elif tensor.is_floating_point():
            tensor.normal_(0.0, 0.02)

    fills = {"broadcast": receive, "all_gather_into_tensor": gather_into, "_all_gather_base": gather_into,
             "all_gather": gather_list, "reduce_scatter_tensor": scatter_from, "_reduce_scatter_base": scatter_from,
             "reduce_scatter": scatter_list, "all_to_all_single": copy}

    def wrap(fn, fill):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            work = fn(*args, **kwargs)
            output, input = list(signature.bind_partial(*args, **kwargs).arguments.values())[:2]
            fill(output, input)
            return work
        return call

    for name, fill in fills.items():
        if hasattr(dist, name):
            setattr(dist, name, wrap(getattr(dist, name), fill))


def agree_as_rank0():
    """ZeRO-3 checks that every rank traced the same modules by broadcasting
    rank 0's lists and comparing (deepspeed/runtime/zero/utils.py,
    assert_ints_same_as_other_ranks). A fake broadcast delivers nothing, so an
    emulated rank would compare its lists with its own -1 placeholders. Every
    rank runs the same program, so the lists rank 0 would send are this
    rank's: the two helpers build their tensors as rank 0 does (the same
    tensors, the same bytes) and the check passes as it would."""
    import deepspeed.comm
    from deepspeed.runtime.zero import utils

    def as_rank0(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            get_rank = deepspeed.comm.get_rank
            deepspeed.comm.get_rank = lambda *a, **k: 0
            try:
                return fn(*args, **kwargs)
            finally:
                deepspeed.comm.get_rank = get_rank
        return call

    utils.assert_lst_len_same_as_other_ranks = as_rank0(utils.assert_lst_len_same_as_other_ranks)
    utils.get_lst_from_rank0 = as_rank0(utils.get_lst_from_rank0)


def record_routing(model):
    """Per MoE layer (by its decoder layer's index), the token-expert pairs each expert takes: read from the
    top-k indices its experts module is called with (every *Experts of transformers 5.23 takes
    (hidden_states, top_k_index, top_k_weights)). numpy counts them, so no tensor is allocated and the
    measurement is unchanged. The first call since the dict was cleared counts: a checkpointed layer's
    recompute routes the same tokens again."""
    import numpy
    import torch
    routing = {}

    def hook(layer, experts):
        def pre(module, args):
            if layer not in routing:
                index = args[1].detach()
                index = index if index.device.type == "cpu" else index.cpu()
                routing[layer] = numpy.bincount(index.numpy().reshape(-1), minlength=experts).tolist()
        return pre

    for name, module in model.named_modules():
        layer = re.search(r"layers\.(\d+)\.", name)
        bank = getattr(module, "gate_up_proj", None)
        if layer and type(module).__name__.endswith("Experts") and isinstance(bank, torch.nn.Parameter):
            experts = getattr(bank, "ds_shape", bank.shape)[0]  # a ZeRO-3 partition keeps its full shape there
            module.register_forward_pre_hook(hook(int(layer.group(1)), experts))
    return routing


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


def use_liger_fused_linear_cross_entropy(model, on_gpu):
    """What transformers' Trainer does with use_liger_kernel=True and a
    liger_kernel_config enabling only fused_linear_cross_entropy
    (_apply_liger_kernel_to_instance): the model's forward computes the loss
    with LigerFusedLinearCrossEntropyFunction from the final norm's output and
    lm_head.weight, never materialising the logits. Liger's Python runs as it
    is; on CPU ranks its two Triton kernels, which allocate nothing, run as the
    numpy ports above, since Triton needs a GPU."""
    import liger_kernel.ops.fused_linear_cross_entropy as flce
    from liger_kernel.transformers import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    if model.config.model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        sys.exit(f"deepspeed_oracle: --loss liger-fused: Liger has no forward for model_type "
                 f"{model.config.model_type!r}")
    if not on_gpu:
        flce.liger_cross_entropy_kernel = RowKernel(liger_cross_entropy_rows)
        flce.element_mul_kernel = RowKernel(liger_element_mul_rows)
    _apply_liger_kernel_to_instance(model=model, rope=False, rms_norm=False, swiglu=False, cross_entropy=False,
                                    fused_linear_cross_entropy=True, layer_norm=False, geglu=False)


# The packages transformers' use_kernel_func_from_hub_with_fallback tries (integrations/hub_kernels.py).
KERNEL_PACKAGES = ("fla", "causal_conv1d")


def choose_kernels(kernels):
    """Before transformers imports: the packages not chosen do not import (transformers falls back to
    torch, as where they are not installed); a chosen one that does not import is an error."""
    import importlib
    for package in KERNEL_PACKAGES:
        if package not in kernels:
            sys.modules[package] = None
            continue
        try:
            importlib.import_module(package)
        except Exception as e:  # what transformers catches
            sys.exit(f"deepspeed_oracle: --kernels {package}: it does not import ({e})")
        if package == "fla":
            run_fla_on_hopper()


def run_fla_on_hopper():
    """fla 0.6.0's chunk_bwd_dqkwg raises on Hopper with Triton at least 3.4.0 and below 3.7.1 (wrong
    gradients there, fla issue #640) unless tilelang is installed; torch 2.11 brings Triton 3.6.0, and
    tilelang's wheels do not fit the GPU bundle. A memory measurement runs the Triton kernel anyway:
    tilelang's replacement (fla/ops/common/backends/tilelang/chunk_bwd.py) allocates the same tensors."""
    import importlib.util
    import fla.ops.common.chunk_o as chunk_o
    if (chunk_o.IS_NVIDIA_HOPPER and chunk_o.TRITON_ABOVE_3_4_0 and not chunk_o.TRITON_ABOVE_3_7_1
            and importlib.util.find_spec("tilelang") is None):
        chunk_o.IS_NVIDIA_HOPPER = False  # read only by that guard once imported
        print("deepspeed_oracle: fla's Hopper guard lifted for a memory measurement (its gradients may be "
              "wrong here; install tilelang for a real run)", flush=True)


# Vision-language models (docs/vlm_oracle.md; what transformers builds: docs/vlm_sources.md).
# The model types whose inputs the oracle lays out as their processors would (AutoModelForImageTextToText).
VLM_TYPES = ("llava", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
# The parts --freeze names. language_model holds the LM head too: LLaVA's recipes freeze the whole model
# (model.requires_grad_(False), lm_head included) and the Qwen recipe's tune_mm_llm covers model.lm_head.
VLM_PARTS = ("vision_tower", "projector", "language_model")
# llava: positions the tower puts ahead of the patches (LlavaProcessor's num_additional_image_tokens:
# CLIPVisionEmbeddings.forward prepends the class embedding; SiglipVisionEmbeddings has none).
LLAVA_TOWER_EXTRA_TOKENS = {"clip_vision_model": 1, "siglip_vision_model": 0}
# transformers' ForCausalLMLoss ignore_index: the label of every image and vision start/end position, as
# the recipes' collators set it.
IGNORE_INDEX = -100


def read_hf_config(path):
    """The transformers config of a config.json."""
    import transformers
    with open(path) as f:
        config_dict = json.load(f)
    return transformers.AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)


def training_config(args, tool):
    """args.hf_config's config as training builds it (no cache states kept), and for a vision-language
    model its ImageLayout (else None); a bad image flag exits naming it."""
    config = read_hf_config(args.hf_config)
    config.use_cache = False
    layout = None
    if args.vlm:
        try:
            layout = image_layout(config, args)
        except ValueError as e:
            sys.exit(f"{tool}: {e}")
        # The language model reads text_config.use_cache (5.23's VLM configs have no top-level one):
        # left True, every training forward would build a DynamicCache.
        config.text_config.use_cache = False
    return config, layout


def freeze_parts(model, frozen):
    """requires_grad_(False) on the parameters of each part in `frozen` (vlm_parts); returns the parts."""
    parts = vlm_parts(model)
    for part in frozen:
        for q in parts[part]:
            q.requires_grad_(False)
    return parts


class ImageLayout:
    """One sequence of a vision-language model: --images-per-sample images of --image-size pixels at its
    start, laid out as the model's processor does, then text to --seq."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def image_layout(config, args):
    """The ImageLayout of args for this config; a ValueError names the flag to change and how."""
    t, v = config.model_type, getattr(config, "vision_config", None)
    if t not in VLM_TYPES or v is None:
        raise ValueError(f"{args.hf_config}: model_type {t!r} has a vision_config, but the oracle lays out images "
                         f"for {', '.join(VLM_TYPES)} only")
    images, size = args.images_per_sample, args.image_size
    if t == "llava":
        extra = LLAVA_TOWER_EXTRA_TOKENS.get(v.model_type)
        if extra is None:
            raise ValueError(f"{args.hf_config}: llava with a {v.model_type!r} tower; the oracle knows "
                             f"{', '.join(LLAVA_TOWER_EXTRA_TOKENS)}")
        size = size or v.image_size
        if size != v.image_size:
            # LlavaModel.get_image_features passes no interpolate_pos_encoding, so CLIPVisionEmbeddings.forward
            # raises on any other size (LlavaProcessor resizes and crops to it).
            raise ValueError(f"--image-size {size}: llava's tower takes {v.image_size}-pixel images only; give "
                             f"--image-size {v.image_size} or leave it out")
        side = size // v.patch_size
        # LlavaProcessor.replace_image_token: (h // p)(w // p) + num_additional_image_tokens, less the class
        # token that the "default" strategy crops (LlavaModel.get_image_features: [:, 1:]).
        tokens = side * side + extra - (1 if config.vision_feature_select_strategy == "default" else 0)
        begin = end = None
        pixels = (v.num_channels, size, size)  # per image: [B*K, C, H, W], as CLIPImageProcessor gives them
        grid = None
    else:
        # Qwen2VLImageProcessor's smart_resize rounds each side to a multiple of patch_size * merge_size.
        factor = v.patch_size * v.spatial_merge_size
        if size <= 0 or size % factor:
            near = max(factor, round(size / factor) * factor) if size > 0 else 16 * factor
            raise ValueError(f"--image-size {size or '(not given)'}: {t} takes square images whose side is a multiple "
                             f"of patch_size x spatial_merge_size = {factor} (smart_resize); give e.g. --image-size "
                             f"{near} ({(near // factor) ** 2} image tokens)")
        side = size // v.patch_size
        # Qwen2_5_VLProcessor.replace_image_token: grid_thw.prod() // merge_size**2 (one frame, t = 1).
        tokens = side * side // v.spatial_merge_size ** 2
        begin, end = config.vision_start_token_id, config.vision_end_token_id  # the chat template's wrappers
        # Qwen2VLImageProcessor.patchify: [N, C * T * p * p] rows (the still image repeated T times), fp32.
        pixels = (v.in_channels * v.temporal_patch_size * v.patch_size ** 2,)
        grid = (1, side, side)  # image_grid_thw per image: [t, h, w] in patches
    per_image = tokens + (2 if begin is not None else 0)
    prefix = images * per_image
    if args.seq < prefix + 2:
        raise ValueError(f"--seq {args.seq}: {images} image(s) of {size} pixels take {prefix} positions "
                         f"({tokens} image tokens{' + vision start and end' if begin is not None else ''} each); "
                         f"give --seq {prefix + 2} or more (two text tokens make a loss), or fewer or smaller images")
    specials = [i for i in (config.image_token_id, getattr(config, "video_token_id", None), begin, end)
                if i is not None]
    vocab = config.text_config.vocab_size
    if max(specials) >= vocab or min(specials) < 2:
        raise ValueError(f"{args.hf_config}: special token ids {specials} must lie inside the text vocabulary "
                         f"({vocab}), above the text tokens: set image_token_id (llava: image_token_index) and "
                         f"the others so")
    # Text tokens are drawn below the lowest special id: the real tokenizers put the special tokens above
    # their text vocabulary too (Qwen from 151643, llava-1.5's <image> at 32000).
    return ImageLayout(model_type=t, images=images, size=size, tokens=tokens, begin=begin, end=end,
                       image_token=config.image_token_id, prefix=prefix, pixels=pixels, grid=grid,
                       patches=side * side, text_vocab=min(specials))


def image_batch(layout, micro, seq, gen):
    """A micro-batch as the model's processor and a recipe's collator give it: input_ids with the image
    placeholders at the start, labels ignoring them, the images' pixels (and for Qwen image_grid_thw and
    mm_token_type_ids, without which Qwen2.5-VL silently uses 1-D positions and Qwen3-VL raises)."""
    import torch
    ids = torch.randint(0, layout.text_vocab, (micro, seq), generator=gen)
    pos = 0
    for _ in range(layout.images):
        if layout.begin is not None:
            ids[:, pos] = layout.begin
            pos += 1
        ids[:, pos:pos + layout.tokens] = layout.image_token
        pos += layout.tokens
        if layout.end is not None:
            ids[:, pos] = layout.end
            pos += 1
    labels = ids.clone()
    labels[:, :layout.prefix] = IGNORE_INDEX
    count = micro * layout.images
    batch = {"input_ids": ids, "labels": labels}
    if layout.grid is None:
        batch["pixel_values"] = torch.randn(count, *layout.pixels, generator=gen)
    else:
        batch["pixel_values"] = torch.randn(count * layout.patches, *layout.pixels, generator=gen)
        batch["image_grid_thw"] = torch.tensor([layout.grid] * count, dtype=torch.int64)
        # ProcessorMixin.create_mm_token_type_ids: 1 on image tokens, 0 elsewhere (vision start/end are text).
        batch["mm_token_type_ids"] = (ids == layout.image_token).to(torch.int64)
    return batch


def vlm_parts(model):
    """Each --freeze part's parameters, by the module paths of transformers 5.23 (docs/vlm_sources.md
    section 6 per type). The projector is llava's multi_modal_projector or Qwen's visual.merger; the
    tower is the rest of the vision model, Qwen3-VL's deepstack mergers included (the Qwen recipe's
    tune_mm_mlp covers visual.merger only; its tune_mm_vision loop over model.visual reaches them)."""
    inner = model.model
    if model.config.model_type == "llava":
        tower, projector = inner.vision_tower, inner.multi_modal_projector
    else:
        tower, projector = inner.visual, inner.visual.merger
    in_projector = {id(q) for q in projector.parameters()}
    head = model.get_output_embeddings()
    parts = {"vision_tower": [q for q in tower.parameters() if id(q) not in in_projector],
             "projector": list(projector.parameters()),
             "language_model": list(inner.language_model.parameters()) + list(head.parameters())}
    placed = {id(q) for qs in parts.values() for q in qs}
    stray = [name for name, q in model.named_parameters() if id(q) not in placed]
    if stray:
        sys.exit(f"deepspeed_oracle: --freeze: parameters in none of {', '.join(VLM_PARTS)}: {', '.join(stray[:5])}")
    return parts


def language_model_lora(model, peft_config):
    """Restricts the adapter config's target_modules to the language model. PEFT matches a list by name
    suffix and "all-linear" by type over the whole model, so q_proj / v_proj would also adapt CLIP's
    attention (k_proj, v_proj, q_proj, out_proj) and all-linear every tower, merger and projector Linear.
    The matches in the language model (its head included, the part --freeze language_model names) become
    an explicit set of full names (PEFT: `key in target_modules`), as LLaVA's find_all_linear_names keeps
    the multimodal modules out."""
    import re
    import torch
    targets = peft_config.target_modules
    head = model.get_output_embeddings()

    def wanted(name, module):
        if isinstance(targets, str):
            if targets.lower() == "all-linear":  # peft's INCLUDE_LINEAR_LAYERS_SHORTHAND, which skips the head
                return isinstance(module, torch.nn.Linear) and module is not head
            return re.fullmatch(targets, name) is not None
        return name in targets or any(name.endswith("." + t) for t in targets)

    matched = [(name, module) for name, module in model.named_modules() if name and wanted(name, module)]
    kept = {name for name, module in matched if name.startswith("model.language_model.") or module is head}
    if not kept:
        sys.exit(f"deepspeed_oracle: --lora-config: target_modules {targets!r} match no module of the language model")
    peft_config.target_modules = kept
    print(f"deepspeed_oracle: LoRA on {len(kept)} language-model modules; {len(matched) - len(kept)} tower / "
          f"projector modules matching {targets!r} left without adapters", flush=True)


def run_rank(args):
    import torch

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        alloc = CudaMeter()
        if args.memory_history:
            memory_history.start()  # from an empty pool, so that a replay needs no earlier state
    else:
        alloc = Allocator(args.allocator)  # before any model tensor exists
        cache_cpu_info()
    if backend_name(args) == "gloo":
        await_gloo_release(alloc)
    with open(args.ds_config) as f:
        ds_config = json.load(f)
    if args.emulate_rank >= 0:
        # DeepSpeed's init_distributed keeps a process group that exists.
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=args.emulate_rank, world_size=args.world)
        # zero.Init's dtype (deepspeed/runtime/zero/partition_parameters.py, Init._set_dtype).
        weight_dtype = (torch.bfloat16 if ds_config.get("bf16", {}).get("enabled")
                        else torch.float16 if ds_config.get("fp16", {}).get("enabled") else torch.float32)
        fill_fake_collectives(args.emulate_rank, args.world, weight_dtype)
    choose_kernels(args.kernels)
    import deepspeed
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    deepspeed.init_distributed(dist_backend=backend_name(args))
    if args.emulate_rank >= 0:
        agree_as_rank0()
    # Kept alive: transformers builds a stage-3 model under zero.Init while it exists,
    # as the Trainer does.
    hf_ds_config = HfDeepSpeedConfig(ds_config)  # noqa: F841
    config, layout = training_config(args, "deepspeed_oracle")
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
    if layout is not None:
        auto = transformers.AutoModelForImageTextToText
    model = auto.from_config(config, attn_implementation=args.attention)
    if args.loss == "liger-fused":
        use_liger_fused_linear_cross_entropy(model, on_gpu=args.device == "cuda")
    if layout is not None:
        parts = freeze_parts(model, args.freeze)
    if args.lora_config:
        import peft
        with open(args.lora_config) as f:
            peft_config = peft.get_peft_config(json.load(f))
        if layout is not None:
            language_model_lora(model, peft_config)
        model = peft.get_peft_model(model, peft_config)
        if layout is not None:
            # get_peft_model freezes every base parameter; the parts --freeze does not list train in full
            # (LLaVA-1.5's LoRA recipe trains the projector so).
            for part in set(VLM_PARTS) - args.freeze:
                for q in parts[part]:
                    q.requires_grad_(True)
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
    routing = record_routing(engine.module)

    micro = engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    vocab = getattr(config, "vocab_size", 0)
    gen = torch.Generator().manual_seed(1234 + engine.global_rank)
    device = engine.device  # where the batch goes, as the Trainer puts it

    # Attribution hooks: forward tensors are pending until the LM head (then
    # activations or temporaries), the head and loss chain is logits until
    # the head's input gradient exists, the rest of backward temporaries.
    head = engine.module.classifier if vision else engine.module.get_output_embeddings()
    body = engine.module

    def body_pre(module, inputs):
        alloc.begin_forward_part()

    def head_pre(module, *unused):
        alloc.settle_forward_part(LOGITS)

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
    # The running peak of this step, the phase that set it and the routing of that micro-step.
    phase = {"peak": 0, "label": "", "routing": {}}

    def note_phase(label):
        alloc.synchronize()
        if alloc.peak() > phase["peak"]:
            phase["peak"], phase["label"], phase["routing"] = alloc.peak(), label, dict(routing)

    step_seconds = []
    for step in range(args.steps):
        if step == 1:
            warmup_peak = alloc.peak()
            tag_resident_states(alloc, engine)  # optimizer states exist now
            alloc.reset_peak()
        phase["peak"] = alloc.peak()
        if args.memory_history:
            memory_history.mark_step(alloc.device)
        step_start = time.monotonic()
        if args.trace and step == args.steps - 1:
            alloc.log_enable(True)
            tracing[0] = True
            mark("step start")
        step_loss = 0.0
        for micro_step in range(accum):
            if vision:
                # fp32 pixels, as an image processor gives them.
                size = config.image_size
                batch = {"pixel_values": torch.randn(micro, config.num_channels, size, size, generator=gen),
                         "labels": torch.randint(0, config.num_labels, (micro,), generator=gen)}
            elif layout is not None:
                batch = image_batch(layout, micro, args.seq, gen)
            else:
                ids = torch.randint(0, vocab, (micro, args.seq), generator=gen)
                batch = {"input_ids": ids, "labels": ids}
            batch = {k: v.to(device) for k, v in batch.items()}
            routing.clear()
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
        alloc.synchronize()
        step_seconds.append(time.monotonic() - step_start)
        if step >= 1:
            steady_breakdown = alloc.breakdown()
            steady_breakdown["peak_event"] = phase["label"]
        alloc.tag(BUFFERS if step == 0 else TEMPORARIES)

    if tracing[0]:
        mark("end")
        alloc.log_enable(False)
    result = {
        "rank": engine.global_rank,
        "measured_device": steady_breakdown,
        "measured_host": {"peak_bytes": vm_hwm_bytes()},
        # PHASE_INIT: construction through initialize; the run's peak (warm-up step included).
        "samples": [{"phase": "PHASE_INIT", "step": 0, "peak_allocated_bytes": init_peak},
                    {"phase": "PHASE_OPTIMIZER_STEP", "step": args.steps - 1,
                     "peak_allocated_bytes": max(warmup_peak, steady_breakdown["peak_bytes"])}],
        "losses": losses,
        # The steps after the warm-up, as zrun reports them.
        "step_seconds": step_seconds[1:],
        "routing": [{"layer": layer, "pairs_per_expert": pairs} for layer, pairs in sorted(phase["routing"].items())],
        "mean_step_seconds": sum(step_seconds[1:]) / len(step_seconds[1:]),
        "device": torch.cuda.get_device_name(alloc.device) if args.device == "cuda" else "cpu",
        "framework": f"DeepSpeed {deepspeed.__version__}, transformers {transformers.__version__}, "
                     + (f"peft {sys.modules['peft'].__version__}, " if args.lora_config else "")
                     + (f"liger-kernel {importlib.metadata.version('liger-kernel')}, " if args.loss != "full" else "")
                     + f"torch {torch.__version__}",
    }
    if args.device == "cuda":
        steady = result["samples"][1]
        steady["peak_reserved_bytes"] = steady_breakdown["peak_bytes"] + steady_breakdown["allocator_bytes"]
        steady["device_used_bytes"] = alloc.at_peak["used"]
    if args.trace:
        result["trace"] = trace
    if args.memory_history:
        memory_history.write(args.memory_history, f"{result['device']}, {result['framework']}: "
                             f"{os.path.basename(args.hf_config)} seq {args.seq}, {os.path.basename(args.ds_config)}, "
                             f"rank {result['rank']} of {args.world}")
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
        if args.vlm:  # the config's values, before any rank starts
            training_config(args, "deepspeed_oracle")
        launch(args)
    else:
        run_rank(args)


if __name__ == "__main__":
    main(sys.argv[1:])
