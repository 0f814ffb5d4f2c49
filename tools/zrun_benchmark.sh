#!/usr/bin/env bash
# zrun throughput on this machine: plans a model with zplan, trains it with
# zrun and prints step time and tokens/s per configuration (the figures come
# from each report; nothing here is asserted). On CPU machines it uses the
# debug-tiny model; tools/gpu_validate.sh covers GPUs. Last, zrun ZeRO-0
# bf16 against the same model and batch in plain PyTorch (Python) loops
# (tools/torch_reference_loop.py, interpreter: $PYTHON, default the
# repository's .venv), for MODEL and a realistic-width model (hidden 1024:
# qwen3-0.6b's blocks, 4 of them, vocabulary 32000), run alternately
# $REPEATS times (default 5) for $COMPARE_STEPS steps (default 12) and compared
# by the median of all their measured steps, since a shared machine's speed
# drifts; a ratio above 1 means zrun is faster.
#   bazel run //tools:zrun_benchmark [-- MODEL SEQ STEPS]
set -euo pipefail
model=${1:-debug-tiny} seq=${2:-256} steps=${3:-6}
repeats=${REPEATS:-5} compare_steps=${COMPARE_STEPS:-12}
runfiles=${RUNFILES_DIR:-$0.runfiles}
ZPLAN=${ZPLAN:-$runfiles/zplan/planner/zplan}
ZRUN=${ZRUN:-$runfiles/zplan/executor/zrun}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYTHON=${PYTHON:-${BUILD_WORKSPACE_DIRECTORY:-.}/.venv/bin/python3}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ranks'][0].get(sys.argv[2], 0))" "$@"; }
printf '%-34s %10s %12s\n' "configuration ($model, seq $seq)" "step s" "tokens/s"
for cfg in "0 bf16 false" "2 bf16 false" "3 bf16 false" "3 bf16 true" "2 fp32 false"; do
  set -- $cfg
  "$ZPLAN" --gpu cpu --model "$model" --gpus 1 --zero-stage "$1" --precision "$2" --checkpointing "$3" \
    --seq "$seq" --micro-batch 4 --out "$tmp/p.pb" > /dev/null
  "$ZRUN" "$tmp/p.pb" --steps "$steps" --report "$tmp/r.json" > /dev/null 2>&1 || true
  label="ZeRO-$1 $2"
  [[ $3 == true ]] && label+=" ckpt"
  printf '%-34s %10.3f %12.0f\n' "$label" "$(field "$tmp/r.json" mean_step_seconds)" "$(field "$tmp/r.json" tokens_per_second)"
done
if [[ ! -x $PYTHON ]]; then
  echo "no Python with torch at $PYTHON: PyTorch comparison skipped (set PYTHON)"
  exit 0
fi
echo
# Two PyTorch loops: fp32 master weights with autocast (the numerics of
# DeepSpeed's bf16 mode, which zrun follows: fp32 master and Adam states) and
# bf16 weights stepped directly (less work per step: no master copy). Every
# measured step of every repeat is pooled: the median is the comparison (a
# virtual machine's free-page reporting makes every ~2 s step that touches
# fresh memory slow, whichever program runs), the mean is printed beside it.
printf '%-42s %15s %22s %22s\n' "ZeRO-0 bf16 s/step, median (mean), x$repeats" "zrun" "PyTorch fp32-master" "PyTorch bf16-only"
compare() {  # label, zplan model flags...
  local label=$1; shift
  "$ZPLAN" --gpu cpu "$@" --gpus 1 --zero-stage 0 --precision bf16 --checkpointing false --seq "$seq" \
    --out "$tmp/c.pb" > /dev/null
  "$ZPLAN" show "$tmp/c.pb" --format json > "$tmp/c.json"
  : > "$tmp/z.txt"; : > "$tmp/m.txt"; : > "$tmp/b.txt"
  loop() {  # weights, output file
    "$PYTHON" "$runfiles/zplan/tools/torch_reference_loop.py" "$tmp/c.json" --steps "$compare_steps" --weights "$1" \
      2> /dev/null | python3 -c "import json,sys; print(*json.load(sys.stdin)['each_step_seconds'])" >> "$2"
  }
  for _ in $(seq "$repeats"); do
    "$ZRUN" "$tmp/c.pb" --steps "$compare_steps" --report "$tmp/c_r.json" > /dev/null 2>&1
    python3 -c "import json,sys; print(*json.load(open(sys.argv[1]))['ranks'][0]['step_seconds'])" "$tmp/c_r.json" \
      >> "$tmp/z.txt"
    loop fp32-master "$tmp/m.txt"
    loop working "$tmp/b.txt"
  done
  python3 - "$label" "$tmp/z.txt" "$tmp/m.txt" "$tmp/b.txt" <<'PY'
import statistics, sys
runs = [[float(x) for x in open(f).read().split()] for f in sys.argv[2:5]]
(zm, zs), (mm, ms), (bm, bs) = ((statistics.median(r), statistics.mean(r)) for r in runs)
print(f"{sys.argv[1]:42s} {zm:6.3f} ({zs:5.3f}) {mm:6.3f} ({ms:5.3f}) {mm / zm:4.2f}x {bm:6.3f} ({bs:5.3f}) {bm / zm:4.2f}x")
PY
}
compare "$model, micro-batch 4" --model "$model" --micro-batch 4
compare "hidden 1024 x 4 layers, vocab 32000, mb 2" --model qwen3-0.6b --layers 4 --vocab 32000 --micro-batch 2
