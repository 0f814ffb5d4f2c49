#!/usr/bin/env bash
# zplan's parameter counts against transformers' (tests/param_counts_test.py).
set -euo pipefail
exec "$TEST_SRCDIR/torch/python" "$TEST_SRCDIR/zplan/tests/param_counts_test.py" \
  "$TEST_SRCDIR/zplan/planner/zplan" "$TEST_SRCDIR"/zplan/configs/hf/*.json
