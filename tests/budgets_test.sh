#!/bin/bash
# Memory budgets: every plan in configs/budgets/ trains within its budget and
# its plan's tolerance (zrun exit 0), and a deliberately inflated one (its
# micro-batch quadrupled, the committed plan and budget kept) fails with the
# budget exit code (3) and a message naming the component that grew.
set -u
ZRUN="$PWD/executor/zrun"
WORK="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

count=0
for plan in configs/budgets/*.textproto; do
  count=$((count + 1))
  name=$(basename "$plan" .textproto)
  "$ZRUN" "$plan" --steps 3 --report "$WORK/$name.report.pb" > "$WORK/$name.out" 2>&1
  rc=$?
  if [[ $rc == 0 ]]; then
    echo "PASS: $name within budget"
  else
    cat "$WORK/$name.out"
    fail "$name: zrun exited $rc"
  fi
done
[[ $count -ge 1 ]] || fail "no budgets in configs/budgets"

# The regression: a config change nobody re-planned.
inflated="$WORK/inflated.textproto"
sed 's/^  micro_batch_size: 2$/  micro_batch_size: 8/' configs/budgets/debug-tiny-zero3-bf16.textproto > "$inflated"
grep -q "micro_batch_size: 8" "$inflated" || fail "could not inflate the micro-batch"
"$ZRUN" "$inflated" --steps 3 --report "$WORK/inflated.report.pb" > "$WORK/inflated.out" 2>&1
rc=$?
cat "$WORK/inflated.out"
[[ $rc == 3 ]] || fail "inflated config: exit $rc, want 3 (budget)"
grep -q "exceeds the budget" "$WORK/inflated.out" || fail "inflated config: no budget failure line"
grep -q "grew most: activations" "$WORK/inflated.out" || fail "inflated config: the grown component is not named"

[[ $failures == 0 ]] && echo "all budget checks passed"
exit $((failures > 0))
