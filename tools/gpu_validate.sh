#!/usr/bin/env bash
# The whole GPU validation matrix in one call (DESIGN §6), a short table last.
#
#   tools/gpu_validate.sh            on a GPU machine, with dist/ from tools/make_dist.sh
#                                    and torch 2.11 in $TORCH_VENV (default /opt/torch/.venv)
#   tools/gpu_validate.sh --dry-run  the same matrix on CPU ranks (what the test suite runs)
#
# Matrix: NCCL world 1 (ZeRO 0, 2, 3), Gloo with 2 and 4 processes sharing the
# GPU, emulated ranks of world 8 and 64. Per row: planned tensor bytes vs
# measured peak allocated (goal within 5%), planned tensors + allocator band vs
# peak reserved (10%), planned peak vs device-used memory; CUDA context and
# NCCL measured outside the allocator. Full reports go to $OUT (or ./gpu_out).
set -uo pipefail
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$root/gpu_out}
mkdir -p "$out"
runfiles=${RUNFILES_DIR:-$0.runfiles}
pick() {  # first existing executable
  for candidate in "$@"; do [[ -x $candidate ]] && { echo "$candidate"; return; }; done
}
ZPLAN=${ZPLAN:-$(pick "$root/dist/bin/zplan" "$runfiles/zplan/planner/zplan" "$root/bazel-bin/planner/zplan")}
ZRUN=${ZRUN:-$(pick "$root/dist/bin/zrun" "$runfiles/zplan/executor/zrun" "$root/bazel-bin/executor/zrun")}
PY=python3

if (( dry_run )); then
  gpu=cpu model=debug-tiny seq=128 batch=2 steps=3
else
  venv=${TORCH_VENV:-/opt/torch/.venv}
  site=$("$venv/bin/python3" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  nvlibs=$(ls -d "$site"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH="$site/torch/lib:$nvlibs$root/dist/lib:${LD_LIBRARY_PATH:-}"
  PY="$venv/bin/python3"
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  case "$name" in
    *H200*) gpu=h200 ;;
    *H100*) gpu=h100-80gb ;;
    *A100*80*) gpu=a100-80gb ;;
    *) gpu=h100-80gb ;;
  esac
  model=qwen3-0.6b seq=2048 batch=2 steps=4
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
fi

rows=()
run_case() {  # label, zrun args (after the plan), then -- zplan flags
  local label=$1; shift
  local zrun_args=()
  while [[ $1 != -- ]]; do zrun_args+=("$1"); shift; done
  shift
  local slug=${label//[^A-Za-z0-9]/_}
  "$ZPLAN" --gpu "$gpu" --model "$model" --seq "$seq" --micro-batch "$batch" --out "$out/$slug.pb" "$@" \
    > "$out/$slug.plan.txt" 2>&1 || { rows+=("$label|zplan failed"); return; }
  "$ZRUN" "$out/$slug.pb" --steps "$steps" --report "$out/$slug.report.json" "${zrun_args[@]}" \
    > "$out/$slug.zrun.txt" 2>&1
  local rc=$?
  "$ZPLAN" show "$out/$slug.pb" --format json > "$out/$slug.plan.json"
  rows+=("$label|$("$PY" - "$out/$slug.plan.json" "$out/$slug.report.json" "$rc" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["device_per_rank"]
rc = sys.argv[3]
try:
    ranks = json.load(open(sys.argv[2]))["ranks"]
except Exception:
    print(f"zrun exit {rc}, no report"); sys.exit()
g = lambda d, k: int(d.get(k, 0))
tensors = g(plan, "peak_bytes") - g(plan, "runtime_bytes") - g(plan, "allocator_bytes")
m = max(ranks, key=lambda r: g(r["measured_device"], "peak_bytes"))["measured_device"]
alloc = g(m, "peak_bytes")
reserved = alloc + g(m, "allocator_bytes")
runtime = g(m, "runtime_bytes")
err = lambda a, b: f"{100.0 * (a - b) / b:+.1f}%" if b else "n/a"
gib = lambda b: f"{b / 2**30:.2f}"
print(f"{gib(tensors)}|{gib(alloc)}|{err(alloc, tensors)}|{gib(reserved)}|"
      f"{err(reserved, tensors + g(plan, 'allocator_bytes'))}|{gib(runtime)}|{gib(g(plan, 'runtime_bytes'))}|exit {rc}")
PY
)")
}

if (( dry_run )); then backend=gloo; else backend=nccl; fi
run_case "$backend world 1, ZeRO-0" -- --gpus 1 --zero-stage 0
run_case "$backend world 1, ZeRO-2" -- --gpus 1 --zero-stage 2
run_case "$backend world 1, ZeRO-3 + ckpt" -- --gpus 1 --zero-stage 3 --checkpointing true
run_case "gloo 2 ranks, ZeRO-3" -- --gpus 2 --zero-stage 3
run_case "gloo 4 ranks, ZeRO-2 + offload" -- --gpus 4 --zero-stage 2 --offload-optimizer cpu
run_case "emulated rank 7 of 8, ZeRO-3" --emulate-rank 7 -- --gpus 8 --zero-stage 3
run_case "emulated rank 63 of 64, ZeRO-3" --emulate-rank 63 -- --gpus 8 --nodes 8 --zero-stage 3

{
  echo "device: $gpu  model: $model  seq $seq  micro-batch $batch  steps $steps"
  printf '%-34s %9s %9s %7s %9s %7s %8s %8s  %s\n' "case" "plan GiB" "alloc" "err" "reserved" "err" \
    "runtime" "planned" "status"
  for row in "${rows[@]}"; do
    IFS='|' read -r label a b c d e f g h <<< "$row"
    printf '%-34s %9s %9s %7s %9s %7s %8s %8s  %s\n' "$label" "$a" "$b" "$c" "$d" "$e" "$f" "$g" "$h"
  done
} | tee "$out/table.txt"
