#!/usr/bin/env bash
# The DeepSpeed oracle on vision-language models (tests/vlm_oracle_test.py).
set -euo pipefail
exec "$TEST_SRCDIR/torch/python" "$TEST_SRCDIR/zplan/tests/vlm_oracle_test.py" "$TEST_SRCDIR/torch/python" \
  "$TEST_SRCDIR/zplan/tools/deepspeed_oracle.py" "$TEST_SRCDIR/zplan/executor/libzplan_counting_allocator.so" \
  "$TEST_SRCDIR/zplan/planner/zplan" "$TEST_SRCDIR/zplan/configs/hf/tiny"
