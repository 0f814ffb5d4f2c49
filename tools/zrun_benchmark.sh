#!/usr/bin/env bash
# zrun throughput on this machine: plans a model with zplan, trains it with
# zrun and prints step time and tokens/s per configuration (the figures come
# from each report; nothing here is asserted). On CPU machines it uses the
# debug-tiny model; tools/gpu_validate.sh covers GPUs. Last, the same model
# and batch in a plain PyTorch (Python) loop (tools/torch_reference_loop.py,
# interpreter: $PYTHON, default the repository's .venv) and zrun's ZeRO-0
# throughput as a ratio of it.
#   bazel run //tools:zrun_benchmark [-- MODEL SEQ STEPS]
set -euo pipefail
model=${1:-debug-tiny} seq=${2:-256} steps=${3:-6}
runfiles=${RUNFILES_DIR:-$0.runfiles}
ZPLAN=${ZPLAN:-$runfiles/zplan/planner/zplan}
ZRUN=${ZRUN:-$runfiles/zplan/executor/zrun}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYTHON=${PYTHON:-${BUILD_WORKSPACE_DIRECTORY:-.}/.venv/bin/python3}
printf '%-34s %10s %12s\n' "configuration ($model, seq $seq)" "step s" "tokens/s"
for cfg in "0 bf16 false" "2 bf16 false" "3 bf16 false" "3 bf16 true" "2 fp32 false"; do
  set -- $cfg
  "$ZPLAN" --gpu cpu --model "$model" --gpus 1 --zero-stage "$1" --precision "$2" --checkpointing "$3" \
    --seq "$seq" --micro-batch 4 --out "$tmp/p.pb" > /dev/null
  "$ZRUN" "$tmp/p.pb" --steps "$steps" --report "$tmp/r.json" > /dev/null || true
  [[ $cfg == "0 bf16 false" ]] && { cp "$tmp/r.json" "$tmp/zero0.json"; "$ZPLAN" show "$tmp/p.pb" --format json > "$tmp/plan.json"; }
  python3 - "$cfg" "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))["ranks"][0]
stage, precision, ckpt = sys.argv[1].split()
label = f"ZeRO-{stage} {precision}" + (" ckpt" if ckpt == "true" else "")
print(f"{label:34s} {r.get('mean_step_seconds', 0):10.3f} {r.get('tokens_per_second', 0):12.0f}")
PY
done
if [[ -x $PYTHON ]]; then
  "$PYTHON" "$runfiles/zplan/tools/torch_reference_loop.py" "$tmp/plan.json" --steps "$steps" > "$tmp/py.json"
  python3 - "$tmp/zero0.json" "$tmp/py.json" <<'PY'
import json, sys
zrun = json.load(open(sys.argv[1]))["ranks"][0].get("tokens_per_second", 0)
py = json.loads(open(sys.argv[2]).read())
print(f"{'PyTorch loop (Python), bf16':34s} {py['step_seconds']:10.3f} {py['tokens_per_second']:12.0f}")
print(f"zrun ZeRO-0 bf16 / PyTorch loop: {zrun / py['tokens_per_second']:.2f}x")
PY
else
  echo "no Python with torch at $PYTHON: PyTorch comparison skipped (set PYTHON)"
fi
