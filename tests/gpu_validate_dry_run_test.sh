#!/usr/bin/env bash
# Runs tools/gpu_validate.sh --dry-run and checks every row ran and agreed.
set -uo pipefail
export ZPLAN="$TEST_SRCDIR/zplan/planner/zplan" ZRUN="$TEST_SRCDIR/zplan/executor/zrun"
export OUT="$TEST_TMPDIR/gpu_out"
bash "$TEST_SRCDIR/zplan/tools/gpu_validate.sh" --dry-run || exit 1
rows=$(grep -c "exit " "$OUT/table.txt")
[[ $rows == 24 ]] || { echo "FAIL: $rows of 24 rows"; exit 1; }
if grep -E "exit [12]|no report|failed" "$OUT/table.txt"; then echo "FAIL: a case failed"; exit 1; fi
python3 - "$OUT/table.txt" <<'PY'
import re, sys
worst = 0.0
for line in open(sys.argv[1]).read().splitlines()[2:]:
    m = re.search(r"\s([+-]\d+\.\d)%", line)
    worst = max(worst, abs(float(m.group(1)))) if m else worst
print(f"worst allocated-vs-planned error {worst:.1f}%")
sys.exit(worst > 5.0)
PY
