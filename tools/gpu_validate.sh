#!/usr/bin/env bash
# The whole GPU validation matrix in one call (DESIGN §6), a short table last.
#
#   tools/gpu_validate.sh            on a GPU machine, with dist/ from tools/make_dist.sh
#                                    and torch 2.11 in $TORCH_VENV (default /opt/torch/.venv)
#   tools/gpu_validate.sh --dry-run  the same matrix on CPU ranks (what the test suite runs)
#
# Matrix: NCCL world 1 (ZeRO 0, 2, 3; LoRA at ZeRO 0 and 2, and at 3 emulated; Liger's fused loss;
# checkpoint offload, transformers' and DeepSpeed's), Gloo with 2 and 4 processes sharing the
# GPU, emulated ranks of world 8 and 64, a 70B model built with zero.Init as
# rank 63 of 64 (twice the GPU's memory in bf16), and seed 000's scenario (Granite 4.0 1B, seq 8192,
# ZeRO-3 with optimizer and parameter offload, checkpointing, accumulation 4)
# as rank 3 of its 4 GPUs at micro-batch 2 and 4. Per row: planned tensor
# bytes vs measured peak allocated (goal within 5%), planned tensors +
# replayed allocator cache vs peak reserved (10%), planned peak vs device-used memory;
# CUDA context and NCCL measured outside the allocator. Then speed: the 1B
# (Llama-3.2 shape) bf16 seq-2048 SDPA model on one GPU, ZeRO-0, zrun's MFU
# against the PyTorch loops' (tools/torch_reference_loop.py; goal >= 40% MFU
# and >= 1.0x). Full reports go to $OUT (or ./gpu_out); ROWS and DEADLINE_S (tools/gpu_env.sh)
# split the rows, the speed row last, across a lease's calls, each finished row appended to
# $OUT/rows.txt at once.
set -uo pipefail
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
case_timeout_s=${CASE_TIMEOUT_S:-150}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
out=${OUT:-$root/gpu_out}
mkdir -p "$out"
PY=python3

if (( dry_run )); then
  # Two steps (one measured after the warm-up), the long-sequence rows at seq 128
  # and a short speed row (seq 256, the median of one step after the warm-up):
  # the dry run proves that every row and the table run and agree, not CPU
  # speed, in the test command's minutes.
  gpu=cpu model=debug-tiny seq=128 batch=2 steps=2 speed_steps=2 speed_seq=256
  big_model=debug-tiny big_seq=128 speed_batch=2 huge_params=3e7 seed000_model=(--model debug-tiny)
  model_8b=debug-tiny gpt2=debug-tiny long_seq=128 short_seq=64
  vit=(--hf-config "$root/configs/hf/tiny/vit-wide.json" --seq 257 --micro-batch 2)
else
  PY="$venv/bin/python3"
  model=qwen3-0.6b seq=2048 batch=2 steps=4 speed_steps=8 speed_seq=2048
  big_model=1b big_seq=8192 speed_batch=4 huge_params=70e9
  # Seed 000's Granite 4.0 1B with its script's 28,683 added tokens (configs/seeds/000_*.textproto).
  seed000_model=(--hf-config "$root/configs/hf/granite-4.0-1b.json" --vocab 129035)
  model_8b=llama3-8b gpt2=gpt2 long_seq=4096 short_seq=1024
  vit=(--model vit-b-encoder --seq 257 --micro-batch 64)  # seed 002's ViT-B/16 at 256 px
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
fi

: > "$out/rows.txt"
run_case() {  # label, zrun args (after the plan), then -- zplan flags
  local label=$1; shift
  row_starts "$label" || return 0
  local zrun_args=()
  while [[ $1 != -- ]]; do zrun_args+=("$1"); shift; done
  shift
  local slug=${label//[^A-Za-z0-9]/_}
  [[ -n $snapshot ]] && zrun_args=("${zrun_args[@]/#$snapshot/--memory_snapshot_dir=$out/$slug.snapshot}")
  local model_flags=(--model "$model")
  [[ " $* " == *" --model "* || " $* " == *" --params "* || " $* " == *" --hf-config "* ]] && model_flags=()
  "$ZPLAN" --gpu "$gpu" "${model_flags[@]}" --seq "$seq" --micro-batch "$batch" --out "$out/$slug.pb" "$@" \
    > "$out/$slug.plan.txt" 2>&1 || { rows+=("$label|zplan failed"); row_done; return; }
  limit "$ZRUN" "$out/$slug.pb" --steps "$steps" --report "$out/$slug.report.json" "${zrun_args[@]}" \
    > "$out/$slug.zrun.txt" 2>&1
  local rc=$?
  "$ZPLAN" show "$out/$slug.pb" --format json > "$out/$slug.plan.json"
  rows+=("$label|$("$PY" - "$out/$slug.plan.json" "$out/$slug.report.json" "$rc" <<'PY'
import json, sys
full_plan = json.load(open(sys.argv[1]))
plan = full_plan["device_per_rank"]
rc = sys.argv[3]
try:
    report = json.load(open(sys.argv[2]))
    ranks = report["ranks"]
except Exception:
    print(f"zrun exit {rc}, no report"); sys.exit()
g = lambda d, k: int(d.get(k, 0))
tensors = g(plan, "peak_bytes") - g(plan, "runtime_bytes") - g(plan, "allocator_bytes")
m = max(ranks, key=lambda r: g(r["measured_device"], "peak_bytes"))["measured_device"]
alloc = g(m, "peak_bytes")
reserved = alloc + g(m, "allocator_bytes")
runtime = g(m, "runtime_bytes")
planned_runtime = g(plan, "runtime_bytes")
if report.get("backend") != "nccl":  # emulated or Gloo: no NCCL communicator, only the context to measure
    planned_runtime = g(full_plan["gpu"], "cuda_context_bytes")
if len(ranks) > 1 and runtime > 0:  # processes sharing the GPU: the device's memory outside all their pools, per process
    pools = [g(r["measured_device"], "peak_bytes") + g(r["measured_device"], "allocator_bytes") for r in ranks]
    used = max(p + g(r["measured_device"], "runtime_bytes") for p, r in zip(pools, ranks))
    runtime = (used - sum(pools)) // len(ranks)
err = lambda a, b: f"{100.0 * (a - b) / b:+.1f}%" if b else "n/a"
gib = lambda b: f"{b / 2**30:.2f}"
print(f"{gib(tensors)}|{gib(alloc)}|{err(alloc, tensors)}|{gib(reserved)}|"
      f"{err(reserved, tensors + g(plan, 'allocator_bytes'))}|{gib(runtime)}|{gib(planned_runtime)}|exit {rc}")
PY
)")
  row_done
}

if (( dry_run )); then backend=gloo; else backend=nccl; fi
# Rows that also write the caching allocator's history (pytorch.org/memory_viz).
snapshot=SNAPSHOT
(( dry_run )) && snapshot=
run_case "$backend world 1, ZeRO-0" $snapshot -- --gpus 1 --zero-stage 0
run_case "$backend world 1, ZeRO-2" -- --gpus 1 --zero-stage 2
run_case "$backend world 1, ZeRO-3 + ckpt" -- --gpus 1 --zero-stage 3 --checkpointing true
# LoRA (PEFT adapter_config.json): frozen base weights, trainable adapters.
run_case "$backend 1, ZeRO-0 + LoRA q/v r8" -- --gpus 1 --zero-stage 0 \
  --lora-config "$root/configs/peft/lora-qv-r8.json"
run_case "$backend 1, ZeRO-2 + LoRA all r16, ckpt" -- --gpus 1 --zero-stage 2 --checkpointing true \
  --lora-config "$root/configs/peft/lora-all-linear-r16-dropout.json"
# ZeRO-3: frozen chunks gathered beside fp32 adapters, as rank 7 of 8.
run_case "emulated rank 7 of 8, ZeRO-3 + LoRA q/v" --emulate-rank 7 -- --gpus 8 --zero-stage 3 \
  --lora-config "$root/configs/peft/lora-qv-r8.json"
run_case "gloo 2 ranks, ZeRO-3" -- --gpus 2 --zero-stage 3
# Four processes on one GPU each hold a whole plan: half the sequence fits them.
run_case "gloo 4 ranks, ZeRO-2 + offload, accum 2" -- --gpus 4 --zero-stage 2 --offload-optimizer cpu --grad-accum 2 \
  --seq $((seq / 2))
run_case "emulated rank 7 of 8, ZeRO-3" --emulate-rank 7 -- --gpus 8 --zero-stage 3
run_case "emulated rank 63 of 64, ZeRO-3" --emulate-rank 63 -- --gpus 8 --nodes 8 --zero-stage 3
# zero.Init: a model twice the GPU's size (140 GB in bf16) is built and
# partitioned parameter by parameter; the construction peak is in the report.
run_case "zero.Init ${huge_params} params, rank 63/64" --emulate-rank 63 -- --params "$huge_params" --micro-batch 1 \
  --gpus 8 --nodes 8 --zero-stage 3 --checkpointing true
for b in 2 4; do
  run_case "seed 000, mb $b, rank 3 of 4" --emulate-rank 3 $snapshot -- "${seed000_model[@]}" --seq "$big_seq" \
    --micro-batch "$b" --grad-accum 4 --gpus 4 --zero-stage 3 --offload-optimizer cpu --offload-param cpu \
    --checkpointing true
done

# Rows the allocator replay's test (planner/allocator_replay_test.cc) does not
# hold: other models, shapes, stages and attention.
run_case "$backend 1, ZeRO-1, seq $long_seq, mb 1" -- --gpus 1 --zero-stage 1 --seq "$long_seq" --micro-batch 1
run_case "$backend 1, $big_model ZeRO-2 + ckpt, seq $long_seq, mb 4" -- --model "$big_model" --seq "$long_seq" \
  --micro-batch 4 --gpus 1 --zero-stage 2 --checkpointing true
run_case "$backend 1, $big_model eager attention, seq $short_seq" -- --model "$big_model" --seq "$short_seq" \
  --gpus 1 --zero-stage 0 --attention eager
run_case "$backend 1, $big_model LoRA q/v, ZeRO-1, mb 8" -- --model "$big_model" --micro-batch 8 --gpus 1 \
  --zero-stage 1 --lora-config "$root/configs/peft/lora-qv-r8.json"
run_case "$backend 1, $gpt2 fp32, ZeRO-2, seq $short_seq, mb 8" -- --model "$gpt2" --precision fp32 \
  --seq "$short_seq" --micro-batch 8 --gpus 1 --zero-stage 2
run_case "$backend 1, ZeRO-3 + optimizer offload" -- --gpus 1 --zero-stage 3 --offload-optimizer cpu
run_case "$model_8b, rank 15 of 16, ZeRO-3 + ckpt, seq $long_seq" --emulate-rank 15 -- --model "$model_8b" \
  --seq "$long_seq" --micro-batch 1 --gpus 8 --nodes 2 --zero-stage 3 --checkpointing true
# transformers' every_n_layers and offload (pinned host copies of the checkpointed inputs), and a ViT.
run_case "$backend 1, ZeRO-2 + ckpt every 2, offloaded" -- --gpus 1 --zero-stage 2 --checkpointing true \
  --checkpoint-every 2 --checkpoint-offload true
run_case "$backend 1, ViT, ZeRO-2 + ckpt" -- "${vit[@]}" --gpus 1 --zero-stage 2 --checkpointing true
# deepspeed.checkpointing.checkpoint with partition_activations and cpu_checkpointing: pageable host copies.
run_case "$backend 1, ZeRO-2 + DeepSpeed ckpt to CPU" -- --gpus 1 --zero-stage 2 --checkpointing true \
  --ds-config "$root/configs/ds/checkpoint_partitioned_cpu.json" --precision bf16 --checkpoint-function deepspeed
# Liger's fused linear cross-entropy on CUDA: one [chunk, V] buffer, addmm into the weight gradient.
run_case "$backend 1, $big_model fused loss, ZeRO-2, mb 4" -- --model "$big_model" --seq "$long_seq" \
  --micro-batch 4 --gpus 1 --zero-stage 2 --loss liger-fused

# Speed: zrun and the PyTorch loops on the same model, batch and device.
speed_rows=()
speed_case() {  # label, zplan flags...
  local label=$1; shift
  row_starts "$label" speed_rows || return 0
  local slug=speed_${label//[^A-Za-z0-9]/_}
  "$ZPLAN" --gpu "$gpu" "$@" --gpus 1 --zero-stage 0 --precision bf16 --out "$out/$slug.pb" \
    > "$out/$slug.plan.txt" 2>&1 || { speed_rows+=("$label|zplan failed"); row_done speed_rows; return; }
  "$ZPLAN" show "$out/$slug.pb" --format json > "$out/$slug.plan.json"
  limit "$ZRUN" "$out/$slug.pb" --steps "$speed_steps" --report "$out/$slug.report.json" \
    --profile_dir "$out/$slug.profile" \
    > "$out/$slug.zrun.txt" 2>&1
  local peak
  peak=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['gpu'].get('peak_dense_bf16_flops', 0))" \
    "$out/$slug.plan.json")
  for weights in working fp32-master; do
    limit "$PY" "$root/tools/torch_reference_loop.py" "$out/$slug.plan.json" --steps "$speed_steps" \
      --weights "$weights" \
      --peak-flops "$peak" --profile "$out/$slug.profile/torch_$weights.trace.json" \
      > "$out/$slug.torch_$weights.json" 2> "$out/$slug.torch_$weights.txt"
  done
  speed_rows+=("$label|$("$PY" - "$out/$slug" <<'PY'
import json, statistics, sys
def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None
z = load(sys.argv[1] + ".report.json")
if not z:
    print("zrun: no report"); sys.exit()
r = z["ranks"][0]
zs = statistics.median(r["step_seconds"])
cells = [f"{r.get('tokens_per_second', 0):.0f}|{100 * r.get('model_flops_utilization', 0):.1f}%"]
for weights in ("working", "fp32-master"):
    t = load(f"{sys.argv[1]}.torch_{weights}.json")
    if not t:
        cells.append("no torch|-|-"); continue
    ts = statistics.median(t["each_step_seconds"])
    cells.append(f"{t['tokens_per_second']:.0f}|{100 * t['mfu']:.1f}%|{ts / zs:.2f}x")
print("|".join(cells))
PY
)")
  row_done speed_rows
}
speed_case "$big_model bf16 seq $speed_seq, mb $speed_batch" --model "$big_model" --seq "$speed_seq" --micro-batch "$speed_batch" \
  --checkpointing false

{
  echo "device: $gpu  model: $model  seq $seq  micro-batch $batch  steps $steps"
  table '%-34s %9s %9s %7s %9s %7s %8s %8s  %s\n' "case" "plan GiB" "alloc" "err" "reserved" "err" \
    "runtime" "planned" "status" -- "${rows[@]}"
  echo
  printf '%-34s %9s %6s | %-22s | %-22s\n' "speed (medians of $((speed_steps - 1)) steps)" "zrun t/s" "MFU" \
    "PyTorch bf16-only" "PyTorch fp32-master"
  table '%-34s %9s %6s | %7s %6s %7s | %7s %6s %7s\n' -- "${speed_rows[@]}"
} | tee "$out/table.txt"
