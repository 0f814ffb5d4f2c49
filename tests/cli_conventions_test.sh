#!/usr/bin/env bash
# Command-line conventions of zplan and zrun (issue 10): --help and --version,
# exit 2 with one line naming the flag for every usage mistake, zrun's flags
# checked before anything is trained, and ranks that die with their launcher.
set -uo pipefail
ZPLAN="$TEST_SRCDIR/zplan/planner/zplan"
ZRUN="$TEST_SRCDIR/zplan/executor/zrun"
T="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$T"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# expect CODE PATTERN CMD...: exit code CODE, one line on stderr matching PATTERN.
expect() {
  local code=$1 pattern=$2; shift 2
  "$@" > out.txt 2> err.txt; local rc=$?
  if [[ $rc == "$code" ]] && grep -qE -- "$pattern" err.txt && [[ $(wc -l < err.txt) -le 1 ]]; then
    pass "$* -> $rc"
  else
    fail "$*: exit $rc (want $code), stderr:"; head -5 err.txt
  fi
}

for bin in "$ZPLAN" "$ZRUN"; do
  name=$(basename "$bin")
  "$bin" --help > help.txt 2>&1; rc=$?
  if [[ $rc == 0 ]] && grep -q "^usage: $name" help.txt && ! grep -q "No flags matched" help.txt \
     && [[ $(grep -c '^  --' help.txt) -ge 8 ]]; then
    pass "$name --help lists $(grep -c '^  --' help.txt) flags"
  else
    cat help.txt; fail "$name --help (exit $rc)"
  fi
  "$bin" --version > v.txt 2>&1 && grep -q "DeepSpeed 0.19.8, transformers 5.23.0" v.txt && pass "$name --version" \
    || { cat v.txt; fail "$name --version"; }
  expect 2 "unknown flag --bogus" "$bin" --bogus
done
grep -q -- "--seq .*tokens" <("$ZPLAN" --help) || fail "zplan --help gives --seq's unit"
grep -q -- "--timeout .*seconds.*(default 120)" <("$ZRUN" --help) || fail "zrun --help gives --timeout's unit and default"

expect 2 "--seq needs a value" "$ZPLAN" --seq
expect 2 "unexpected argument" "$ZPLAN" show a.pb b.pb
expect 2 "--out: cannot write /nonexistent/dir/p.pb" "$ZPLAN" --model debug-tiny --zero-stage 3 --out /nonexistent/dir/p.pb
[[ -s out.txt ]] && fail "zplan planned although --out could not be written"

"$ZPLAN" --gpu cpu --model debug-tiny --gpus 2 --zero-stage 1 --seq 64 --out p.pb > /dev/null || fail "zplan p.pb"
expect 2 "--steps: -1 is outside 0 .. 10000000" "$ZRUN" p.pb --steps -1
expect 2 "--steps needs a value" "$ZRUN" p.pb --steps
expect 2 "--steps: \"x\" is not valid" "$ZRUN" p.pb --steps=x
expect 2 "--emulate-rank: -5 is not a rank" "$ZRUN" p.pb --emulate-rank -5
expect 2 "--timeout: 0 is not a wait in seconds" "$ZRUN" p.pb --timeout 0
expect 2 "--timeout: nan is not a wait in seconds" "$ZRUN" p.pb --timeout nan
expect 2 "--report: cannot write /nonexistent/r.pb" "$ZRUN" p.pb --report /nonexistent/r.pb
expect 2 "--data: cannot read missing.bin" "$ZRUN" p.pb --data missing.bin
expect 2 "--resume: nowhere has no readable" "$ZRUN" p.pb --resume nowhere
expect 2 "exactly one plan file" "$ZRUN"
# A plan cut short (its budget and tolerance gone) once ran with every check
# off and printed "verdict: pass".
head -c $(( $(stat -c %s p.pb) - 12 )) p.pb > cut.pb
expect 2 "cut.pb: not a whole plan|cut.pb: not a binary" "$ZRUN" cut.pb
: > empty.pb
expect 2 "empty.pb: not a whole plan" "$ZRUN" empty.pb
expect 2 "empty.pb: not a whole plan" "$ZPLAN" show empty.pb

# A budget given and broken: exit 3 (as zrun's), the plan still written; one that fits: exit 0.
rm -f over.pb
expect 3 "does not fit \(--budget-gib 0.001\): the device peak per rank" \
  "$ZPLAN" --gpu cpu --model debug-tiny --gpus 1 --zero-stage 1 --seq 64 --budget-gib 0.001 --out over.pb
[[ -s over.pb ]] && grep -q "fits CPU ranks.*: NO" out.txt && pass "over-budget plan written and printed" \
  || fail "over-budget plan not written or printed"
"$ZPLAN" --gpu cpu --model debug-tiny --gpus 1 --zero-stage 1 --seq 64 --budget-gib 1 --out fits.pb > /dev/null \
  && pass "a plan within its budget exits 0" || fail "a plan within its budget: exit $?"
expect 3 "no row of the grid fits \(--budget-gib 0.5\)" "$ZPLAN" --model 1b --seq 8192 --budget-gib 0.5
grep -q "3 a budget given with --budget-gib" <("$ZPLAN" --help) || fail "zplan --help documents exit code 3"

# A model_type without a family (issue 32): refused, naming the supported ones and the flag;
# --approximate-as plans it, and zrun prints the plan's mark and trains it; the same plan
# without the mark is refused.
cat > starcoder2.json <<'JSON'
{"model_type": "starcoder2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
 "hidden_act": "gelu_pytorch_tanh"}
JSON
expect 2 "starcoder2.json: model_type: \"starcoder2\" is not supported; zplan plans llama, mistral, qwen2, qwen3, granite, granitemoehybrid, phi3, olmo2, olmo3, smollm3, glm4, gemma3_text, gemma2, gemma4_text, lfm2, qwen3_5_text, qwen3_5_moe_text, qwen3_moe, mixtral, qwen2_moe, granitemoe, granitemoeshared, gpt_oss, deepseek_v3, gpt2, vit.*--approximate-as FAMILY" \
  "$ZPLAN" --gpu cpu --hf-config starcoder2.json --gpus 1 --zero-stage 0 --seq 32 --out g.pb
[[ -e g.pb ]] && fail "a refused config.json wrote a plan"
mark='model_type "starcoder2" planned as llama: an unvalidated approximation, nothing about "starcoder2" was checked'
"$ZPLAN" --gpu cpu --hf-config starcoder2.json --approximate-as llama --gpus 1 --zero-stage 0 --seq 32 --out g.pb \
  > zplan.txt 2>&1 && grep -qxF "$mark" zplan.txt && pass "zplan --approximate-as marks the plan" \
  || { cat zplan.txt; fail "zplan --approximate-as"; }
"$ZRUN" g.pb --steps 2 --report g.json > zrun.txt 2>&1; rc=$?
[[ $rc == 0 && $(head -1 zrun.txt) == "$mark" ]] && grep -q "verdict: pass" zrun.txt \
  && pass "zrun prints the approximation and trains it" || { cat zrun.txt; fail "zrun on an approximation: exit $rc"; }
"$ZPLAN" show g.pb --format textproto | grep -v '^  unvalidated_approximation: ' > unmarked.textproto
rm -f report.pb
expect 2 "unmarked.textproto: model.model_type: \"starcoder2\" is not supported" "$ZRUN" unmarked.textproto --steps 1
[[ -e report.pb ]] && fail "zrun trained a plan of an unsupported model_type"

# kill -9 of the launcher (what a CI timeout does): its ranks end too.
"$ZPLAN" --gpu cpu --model debug-tiny --gpus 2 --zero-stage 1 --seq 64 --out long.pb > /dev/null || fail "zplan long.pb"
"$ZRUN" long.pb --steps 100000 --report long.json > long.out 2>&1 &
parent=$!
for _ in $(seq 100); do [[ $(pgrep -P $parent | wc -l) == 2 ]] && break; sleep 0.1; done
children=$(pgrep -P $parent | tr '\n' ' ')
kill -9 $parent
wait $parent 2> /dev/null
alive=2
for _ in $(seq 50); do
  alive=0
  for c in $children; do kill -0 "$c" 2> /dev/null && alive=$((alive + 1)); done
  [[ $alive == 0 ]] && break
  sleep 0.1
done
[[ -n $children && $alive == 0 ]] && pass "ranks end with a SIGKILLed launcher" \
  || { kill -9 $children 2> /dev/null; fail "$alive of [$children] ranks outlived the launcher"; }

echo "$failures failure(s)"
exit $(( failures > 0 ))
