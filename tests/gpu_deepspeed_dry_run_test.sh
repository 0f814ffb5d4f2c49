#!/usr/bin/env bash
# Runs tools/gpu_deepspeed.sh --dry-run (the GPU's real-DeepSpeed matrix on CPU ranks, the oracle's
# emulated ranks included) and checks that every row ran, was timed by both, and agreed.
set -uo pipefail
export ZPLAN="$TEST_SRCDIR/zplan/planner/zplan" ZRUN="$TEST_SRCDIR/zplan/executor/zrun"
export PYTHON="$TEST_SRCDIR/zplan/external/torch/python"
export ALLOCATOR="$TEST_SRCDIR/zplan/executor/libzplan_counting_allocator.so"
export OUT="$TEST_TMPDIR/gpu_out"
bash "$TEST_SRCDIR/zplan/tools/gpu_deepspeed.sh" --dry-run || exit 1
python3 - "$OUT/deepspeed/table.txt" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()[2:]
failures = []
for line in lines:
    errors = [abs(float(e)) for e in re.findall(r"\s([+-]\d+\.\d)%", line)]
    times = re.findall(r"\s(\d+\.\d{3})\s+(\d+\.\d{3})\s+\d+\.\d\dx$", line)
    if len(errors) != 2 or not times:
        failures.append(f"did not run, or was not timed by both: {line}")
    elif errors[0] > 3.0 or errors[1] > 10.0:
        failures.append(f"outside the goals (allocated 3%, reserved 10%): {line}")
if len(lines) != 26:
    failures.append(f"{len(lines)} of 26 rows")
print("\n".join(failures) or f"{len(lines)} rows ran, agreed and were timed")
sys.exit(1 if failures else 0)
PY
