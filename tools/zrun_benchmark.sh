#!/usr/bin/env bash
# zrun throughput on this machine: plans a model with zplan, trains it with
# zrun and prints step time and tokens/s per configuration (the figures come
# from each report; nothing here is asserted). On CPU machines it uses the
# debug-tiny model; tools/gpu_validate.sh covers GPUs.
#   bazel run //tools:zrun_benchmark [-- MODEL SEQ STEPS]
set -euo pipefail
model=${1:-debug-tiny} seq=${2:-256} steps=${3:-6}
runfiles=${RUNFILES_DIR:-$0.runfiles}
ZPLAN=${ZPLAN:-$runfiles/zplan/planner/zplan}
ZRUN=${ZRUN:-$runfiles/zplan/executor/zrun}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-34s %10s %12s\n' "configuration ($model, seq $seq)" "step s" "tokens/s"
for cfg in "0 bf16 false" "2 bf16 false" "3 bf16 false" "3 bf16 true" "2 fp32 false"; do
  set -- $cfg
  "$ZPLAN" --gpu cpu --model "$model" --gpus 1 --zero-stage "$1" --precision "$2" --checkpointing "$3" \
    --seq "$seq" --micro-batch 4 --out "$tmp/p.pb" > /dev/null
  "$ZRUN" "$tmp/p.pb" --steps "$steps" --report "$tmp/r.json" > /dev/null || true
  python3 - "$cfg" "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))["ranks"][0]
stage, precision, ckpt = sys.argv[1].split()
label = f"ZeRO-{stage} {precision}" + (" ckpt" if ckpt == "true" else "")
print(f"{label:34s} {r.get('mean_step_seconds', 0):10.3f} {r.get('tokens_per_second', 0):12.0f}")
PY
done
