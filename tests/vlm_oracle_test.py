"""The DeepSpeed oracle trains vision-language models (tools/deepspeed_oracle.py, docs/vlm_oracle.md):
on CPU ranks, real DeepSpeed ZeRO-2 over tiny llava and qwen2_5_vl configs with their images, measured
by the counting allocator. Each run must finish with finite losses and hold every parameter in bf16:
zplan count's parameters x 2 bytes, plus the model's few buffers built with them (position ids, RoPE
frequencies: BUFFER_BYTES at most); the fp32 master weights must be the parameters that train,
all of them for llava (its unused last CLIP layer too: DeepSpeed keeps its master and Adam states),
less the frozen tower for qwen2_5_vl (--freeze vision_tower), up to DeepSpeed's alignment padding.

Python drives DeepSpeed here. Usage: vlm_oracle_test.py PYTHON ORACLE ALLOCATOR ZPLAN TINY_CONFIG_DIR
"""
import json
import math
import os
import subprocess
import sys
import tempfile

DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
             "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
             "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e5, "overlap_comm": True}}
# DeepSpeed pads the flat fp32 partition (stage_1_and_2.py: alignment to 2 x world elements, and the
# partition's NCCL start alignment); far below one parameter of these configs.
PADDING_BYTES = 4 * 64
# The buffers the oracle's model build allocates with the parameters (llava: CLIP's int64 position_ids and
# the RoPE frequencies, 648 B; qwen2_5_vl 160 B).
BUFFER_BYTES = 1024


def zplan_parts(zplan, config):
    out = subprocess.run([zplan, "count", "--hf-config", config, "--format", "json"], capture_output=True,
                         text=True, check=True)
    counts = json.loads(out.stdout)
    return counts["total_params"], {p["part"]: p["params"] for p in counts["parts"]}


def main(argv):
    python, oracle, allocator, zplan, tiny = argv[1:6]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        ds_config = os.path.join(tmp, "zero2.json")
        with open(ds_config, "w") as f:
            json.dump(DS_CONFIG, f)
        for name, flags, frozen in (("llava", [], ()),
                                    ("qwen2_5_vl", ["--image-size", "224", "--freeze", "vision_tower"],
                                     ("vision_tower",))):
            config = os.path.join(tiny, name + ".json")
            total, parts = zplan_parts(zplan, config)
            report = os.path.join(tmp, name + ".json")
            run = subprocess.run([python, oracle, "--hf-config", config, "--ds-config", ds_config, "--world", "1",
                                  "--seq", "128", "--steps", "2", "--allocator", allocator, "--out", report] + flags,
                                 capture_output=True, text=True)
            if run.returncode != 0:
                failures.append(f"{name}: the oracle exited {run.returncode}: {run.stderr.strip()[-500:]}")
                continue
            rank = json.load(open(report))["ranks"][0]
            device = rank["measured_device"]
            trained = total - sum(parts[p] for p in frozen)
            params, master = int(device["params_bytes"]), int(device["master_params_bytes"])
            print(f"{name}: {total} parameters, {trained} training; params {params} B, master {master} B, "
                  f"losses {rank['losses']}")
            if not 2 * total <= params <= 2 * total + BUFFER_BYTES:
                failures.append(f"{name}: params {params} B, not 2 x {total} (+ buffers)")
            if not 4 * trained <= master <= 4 * trained + PADDING_BYTES:
                failures.append(f"{name}: master {master} B, not 4 x {trained} (+ padding)")
            if not all(math.isfinite(loss) for loss in rank["losses"]):
                failures.append(f"{name}: losses {rank['losses']}")
    print("\n".join(failures) or "both models trained as planned")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
