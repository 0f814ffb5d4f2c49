#!/usr/bin/env bash
# End-to-end: zplan writes CPU plans, zrun runs them every way it can be
# launched, and fails clearly on bad input and dead ranks.
set -uo pipefail
ZPLAN="$TEST_SRCDIR/zplan/planner/zplan"
ZRUN="$TEST_SRCDIR/zplan/executor/zrun"
CONSOLIDATE="$TEST_SRCDIR/zplan/tools/consolidate"
T="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$T"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# Small buckets so stage 2's buffers do not hide the sharding.
cat > ds.json <<'JSON'
{"zero_optimization": {"reduce_bucket_size": 200000, "sub_group_size": 1000000}}
JSON
plan() {  # plan OUT GPUS STAGE [extra flags]
  local out=$1 gpus=$2 stage=$3; shift 3
  "$ZPLAN" --gpu cpu --model debug-tiny --gpus "$gpus" --zero-stage "$stage" --seq 128 --micro-batch 2 \
    --ds-config ds.json --out "$out" "$@" > /dev/null || fail "zplan $out"
}
peak() { "$ZPLAN" show "$1" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["device_per_rank"]["peak_bytes"])'; }
measured() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(len(r["ranks"]), max(int(x["measured_device"]["peak_bytes"]) for x in r["ranks"]))' "$1"; }

# 1. Self-spawned ranks (world 2): every rank reports, within tolerance.
plan w2.pb 2 2
"$ZRUN" w2.pb --steps 3 --report w2.json > w2.out 2>&1; rc=$?
[[ $rc == 0 ]] && pass "self-spawned world 2" || { cat w2.out; fail "self-spawned world 2 exit $rc"; }
read -r ranks _ < <(measured w2.json)
[[ $ranks == 2 ]] || fail "report has $ranks ranks, want 2"
grep -q "verdict: pass" w2.out || fail "no pass verdict in the table"
# Rank 0 alone prints one progress line per step.
n=$(grep -cE '^step [0-9]+/3  loss [0-9.]+  lr [0-9.e+-]+  tokens/s [0-9]+  memory ' w2.out)
[[ $n == 3 ]] && pass "3 progress lines" || { cat w2.out; fail "$n progress lines, want 3 (rank 0 only)"; }

# 1b. --profile-dir: a Kineto trace of one steady-state step per rank, summed
# up by rank 0; --memory-snapshot-dir says it has nothing to write on CPU.
"$ZRUN" w2.pb --steps 3 --report w2p.json --profile_dir prof --memory_snapshot_dir snap > w2p.out 2>&1; rc=$?
if [[ $rc == 0 && -s prof/rank-0.trace.json && -s prof/rank-1.trace.json ]] &&
   grep -q '"traceEvents"' prof/rank-1.trace.json && grep -q "^traced step: " w2p.out &&
   grep -q "CPU ranks have no caching allocator" w2p.out; then
  pass "per-rank step traces"
else
  cat w2p.out; ls -l prof; fail "profile dir: exit $rc"
fi

# 2. Launched by a harness with torchrun's variables.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$ZRUN" w2.pb --steps 3 --report tr.json > "tr$r.out" 2>&1 &
  pids[$r]=$!
done
wait "${pids[0]}"; rc0=$?; wait "${pids[1]}"; rc1=$?
[[ $rc0 == 0 && $rc1 == 0 ]] && pass "torchrun-style launch" || { cat tr0.out tr1.out; fail "torchrun-style exit $rc0/$rc1"; }
read -r ranks _ < <(measured tr.json)
[[ $ranks == 2 ]] || fail "torchrun report has $ranks ranks"

# 3. Emulated ranks of a world-64 plan, one process each.
plan w64.pb 64 2
for r in 0 63; do
  "$ZRUN" w64.pb --steps 2 --emulate-rank $r --report "e$r.json" > "e$r.out" 2>&1; rc=$?
  [[ $rc == 0 ]] && pass "emulated rank $r of 64" || { cat "e$r.out"; fail "emulated rank $r exit $rc"; }
done

# 3b. zero.Init: a stage-3 rank of 64 whose whole model (bf16) is larger than
# its device budget builds the model chunk by chunk: its construction peak is
# what the plan allows, far below the whole model, and training fits.
cat > z3.json <<'JSON'
{"bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "reduce_bucket_size": 2000000,
 "stage3_prefetch_bucket_size": 2000000, "stage3_param_persistence_threshold": 10000,
 "stage3_max_live_parameters": 20000000, "stage3_max_reuse_distance": 0}}
JSON
"$ZPLAN" --gpu cpu --model qwen3-0.6b --layers 8 --vocab 8000 --gpus 8 --nodes 8 --ds-config z3.json --seq 128 \
  --micro-batch 1 --budget-gib 0.2 --out z3.pb > /dev/null || fail "zplan z3.pb"
"$ZRUN" z3.pb --steps 2 --emulate-rank 63 --report z3r.json > z3.out 2>&1; rc=$?
read -r whole budget planned < <("$ZPLAN" show z3.pb --format json | python3 -c 'import json,sys
p = json.load(sys.stdin); print(int(p["total_params"]) * 2, p["budget"]["device_bytes_per_rank"], p["construction_peak_bytes_per_rank"])')
built=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][0]["construction_peak_bytes"])' z3r.json)
if [[ $rc == 0 && $budget -lt $whole && $built -le $planned && $((built * 4)) -lt $whole ]]; then
  pass "zero.Init: built in $built bytes (planned $planned), whole model $whole > budget $budget"
else
  cat z3.out; fail "zero.Init: exit $rc, built $built bytes, planned $planned, whole model $whole, budget $budget"
fi
grep -q "^building the model: " z3.out || fail "no construction line in the table"

# 4. Per-rank memory falls with world size as the plan says (stage 3). World 4
# is its last rank emulated: the same bytes as 4 real ranks, which on 2 cores
# cost 25 s more (sections 1-3 launch real and emulated ranks already).
prev=""
for w in 1 2 4; do
  plan "s$w.pb" $w 3
  emulate=(); (( w == 4 )) && emulate=(--emulate-rank 3)
  "$ZRUN" "s$w.pb" --steps 2 "${emulate[@]}" --report "s$w.json" > "s$w.out" 2>&1 || { cat "s$w.out"; fail "stage 3 world $w"; }
  read -r _ m < <(measured "s$w.json"); p=$(peak "s$w.pb")
  echo "stage 3 world $w: planned $p measured $m"
  [[ -z $prev || $m -lt $prev ]] || fail "world $w measured $m not below $prev"
  python3 -c "import sys; p,m=int(sys.argv[1]),int(sys.argv[2]); sys.exit(abs(m-p) > 0.03*p)" "$p" "$m" \
    || fail "stage 3 world $w: measured $m is not within 3% of planned $p"
  prev=$m
done

# 5. A learnable token file: a repeating 16-token pattern; the loss must fall.
python3 -c "
import struct
ids = [(i * 7) % 16 for i in range(4096)]
open('tokens.bin', 'wb').write(struct.pack('<%dH' % len(ids), *ids))"
# lr 3e-3 (ten times the default): the loss halves well within 10 steps (the default needs 13).
cat > lr.json <<'JSON'
{"zero_optimization": {"reduce_bucket_size": 200000, "sub_group_size": 1000000}, "optimizer": {"params": {"lr": 3e-3}}}
JSON
"$ZPLAN" --gpu cpu --model debug-tiny --gpus 1 --zero-stage 2 --seq 128 --micro-batch 2 --ds-config lr.json \
  --out learn.pb > /dev/null || fail "zplan learn.pb"
"$ZRUN" learn.pb --steps 10 --data tokens.bin --report learn.json > learn.out 2>&1 || { cat learn.out; fail "token file run"; }
python3 -c "
import json, sys
l = json.load(open('learn.json'))['ranks'][0]['losses']
print('token-file losses: first %.3f last %.3f' % (l[0], l[-1]))
sys.exit(not l[-1] < 0.5 * l[0])" && pass "loss falls on a learnable token file" || fail "loss did not fall on the token file"
printf '\x01' > odd.bin
"$ZRUN" learn.pb --data odd.bin > odd.out 2>&1; rc=$?
[[ $rc == 2 ]] && grep -q "uint16" odd.out && pass "malformed token file" || { cat odd.out; fail "odd token file exit $rc"; }

# 6. Checkpoints: a preempted run resumed gives the uninterrupted run's losses;
#    a rank dying mid-save leaves the previous checkpoint in force; shards
#    consolidate into one fp32 state equal to a stage-0 run's.
losses() { python3 -c 'import json,sys; print(" ".join("%.9g" % x for x in json.load(open(sys.argv[1]))["ranks"][0]["losses"]))' "$1"; }
plan c3.pb 2 3 --precision fp32
plan c0.pb 2 0 --precision fp32
# Four steps: a resume from step 2 replays two steps, with the optimizer's state.
"$ZRUN" c3.pb --steps 4 --report full.json --save-dir ck_full > c.out 2>&1 || { cat c.out; fail "uninterrupted run"; }
"$ZRUN" c3.pb --steps 4 --stop-after 2 --save-dir ck > c.out 2>&1 || { cat c.out; fail "preempted run"; }
[[ $(cat ck/latest) == step-2 ]] || fail "latest after the preempted run is $(cat ck/latest)"
"$ZRUN" c3.pb --steps 4 --resume ck --save-dir ck --report resumed.json > c.out 2>&1 || { cat c.out; fail "resumed run"; }
[[ "$(losses resumed.json)" == "$(losses full.json)" ]] && pass "resume reproduces the losses" \
  || fail "resumed losses [$(losses resumed.json)] != [$(losses full.json)]"
ZRUN_FAULT_IN_SAVE=1:3 "$ZRUN" c3.pb --steps 4 --save-every 1 --save-dir ck_fault > fault.out 2>&1; rc=$?
if [[ $rc != 0 && $(cat ck_fault/latest) == step-2 && ! -e ck_fault/step-3/rank-1.pb ]]; then
  pass "rank died mid-save: latest stays at step-2"
else
  cat fault.out; fail "mid-save fault: exit $rc, latest $(cat ck_fault/latest 2>/dev/null)"
fi
"$ZRUN" c3.pb --steps 4 --resume ck_fault --report fault_resumed.json > c.out 2>&1 || { cat c.out; fail "resume after fault"; }
[[ "$(losses fault_resumed.json)" == "$(losses full.json)" ]] && pass "resume after the fault reproduces the losses" \
  || fail "losses after fault [$(losses fault_resumed.json)] != [$(losses full.json)]"
"$ZRUN" c0.pb --steps 4 --save-dir ck_stage0 > c.out 2>&1 || { cat c.out; fail "stage 0 run"; }
"$CONSOLIDATE" ck_stage0 --out stage0.pb > /dev/null || fail "consolidate stage 0"
"$CONSOLIDATE" ck_full --out stage3.pb --compare stage0.pb > cons.out 2>&1 || { cat cons.out; fail "consolidate stage 3"; }
python3 -c "import sys; d=float(open('cons.out').read().split()[-1]); print('stage 3 vs stage 0 consolidated:', d); sys.exit(d > 1e-5)" \
  && pass "consolidated stage-3 shards equal the stage-0 weights" || { cat cons.out; fail "consolidated weights differ"; }
rm ck_full/step-4/rank-1.pb
"$CONSOLIDATE" ck_full > inc.out 2>&1; rc=$?
[[ $rc == 2 ]] && grep -q "shard of rank 1" inc.out && pass "incomplete checkpoint rejected" || { cat inc.out; fail "incomplete checkpoint exit $rc"; }
"$ZRUN" c0.pb --steps 4 --resume ck > mismatch.out 2>&1; rc=$?
[[ $rc == 2 ]] && grep -q "does not match this run" mismatch.out && pass "resume with another plan rejected" \
  || { cat mismatch.out; fail "resume mismatch exit $rc"; }

# 7. Bad input: not a plan, world size mismatch, rank outside the world.
printf 'not a plan' > bad.pb
"$ZRUN" bad.pb > bad.out 2>&1; rc=$?
[[ $rc == 2 ]] && grep -q "bad.pb" bad.out && pass "corrupt plan" || { cat bad.out; fail "corrupt plan exit $rc"; }
RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$ZRUN" w2.pb > mm.out 2>&1; rc=$?
[[ $rc == 2 ]] && grep -q "WORLD_SIZE=3 but the plan has 2" mm.out && pass "world mismatch" || { cat mm.out; fail "world mismatch exit $rc"; }
"$ZRUN" w64.pb --emulate-rank 64 > er.out 2>&1; rc=$?
[[ $rc == 2 ]] && pass "emulated rank outside the world" || fail "emulate-rank 64 exit $rc"
"$ZPLAN" --gpu cpu --hf-config "$TEST_SRCDIR/zplan/configs/hf/tiny/qwen3_5.json" --gpus 1 --zero-stage 2 --seq 64 \
  --kernels fla --out fla.pb > /dev/null || fail "zplan --kernels fla"
"$ZRUN" fla.pb > fla.out 2>&1; rc=$?
[[ $rc == 2 ]] && grep -q "LINEAR_ATTENTION_FLA" fla.out && pass "fla's kernels refused by name" \
  || { cat fla.out; fail "fla plan exit $rc"; }
"$ZPLAN" --gpu cpu --hf-config "$TEST_SRCDIR/zplan/configs/hf/tiny/qwen3_moe-eager.json" --gpus 1 --zero-stage 2 \
  --seq 64 --out eager.pb > /dev/null || fail "zplan of eager experts"
"$ZRUN" eager.pb --steps 2 --report eager.json > eager.out 2>&1 || { cat eager.out; fail "eager experts run"; }
# Each of its 3 MoE layers' routing, 2 pairs per token of the 2 x 64.
n=$(grep -c "\"pairs_per_expert\"" eager.json)
[[ $n == 3 ]] && pass "eager experts trained, routing reported" || { cat eager.json; fail "$n routed layers, want 3"; }

# 8. A rank killed mid-run: every process ends, with a clear error, in bounded time.
plan long.pb 2 1
start=$(date +%s)
"$ZRUN" long.pb --steps 100000 --timeout 20 --report long.json > kill.out 2>&1 &
parent=$!
for _ in $(seq 100); do children=$(pgrep -P $parent | wc -l); [[ $children == 2 ]] && break; sleep 0.1; done
sleep 2
victim=$(pgrep -P $parent | tail -1)
kill -9 "$victim"
wait $parent; rc=$?
elapsed=$(( $(date +%s) - start ))
left=$(pgrep -P $parent | wc -l)
if [[ $rc != 0 && $elapsed -lt 60 && $left == 0 ]] && grep -q "was killed by signal 9" kill.out; then
  pass "killed rank stops the job (exit $rc after ${elapsed}s)"
else
  cat kill.out; fail "killed rank: exit $rc after ${elapsed}s, $left processes left"
fi
[[ -e long.json ]] && fail "a report was written by a failed run"
# 8b. A rank that aborts (what NCCL's watchdog does to a rank whose collective
# failed or timed out): the launcher names the signal and what sends it.
"$ZRUN" long.pb --steps 100000 --timeout 20 > abrt.out 2>&1 &
parent=$!
for _ in $(seq 100); do children=$(pgrep -P $parent | wc -l); [[ $children == 2 ]] && break; sleep 0.1; done
sleep 2
kill -ABRT "$(pgrep -P $parent | tail -1)"
wait $parent; rc=$?
if [[ $rc == 1 && $(pgrep -P $parent | wc -l) == 0 ]] && grep -q "was killed by signal 6 (Aborted): on NCCL, the watchdog" abrt.out; then
  pass "aborted rank named (exit $rc)"
else
  cat abrt.out; fail "aborted rank: exit $rc"
fi

# 9. Ctrl-C on the launcher ends every rank.
"$ZRUN" long.pb --steps 100000 --timeout 20 --report int.json > int.out 2>&1 &
parent=$!
for _ in $(seq 100); do [[ $(pgrep -P $parent | wc -l) == 2 ]] && break; sleep 0.1; done
children=$(pgrep -P $parent | tr '\n' ' ')
sleep 1
kill -INT $parent
for _ in $(seq 300); do kill -0 $parent 2>/dev/null || break; sleep 0.1; done
if kill -0 $parent 2>/dev/null; then kill -9 $parent $children 2>/dev/null; fi
wait $parent; rc=$?
sleep 1
alive=0
for c in $children; do kill -0 "$c" 2>/dev/null && alive=$((alive + 1)); done
[[ $rc != 0 && $alive == 0 ]] && pass "Ctrl-C ends every rank (exit $rc)" || { cat int.out; fail "Ctrl-C: exit $rc, $alive ranks alive"; }

echo "$failures failure(s)"
exit $(( failures > 0 ))
