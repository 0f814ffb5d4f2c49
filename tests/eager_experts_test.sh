#!/usr/bin/env bash
# transformers' eager experts: the allocation-by-allocation model against the counting allocator
# (tools/eager_experts.py --check), on working-dtype pair weights (Qwen3-MoE, GraniteMoe: 16 experts) and
# Mixtral's fp32 ones, at a token count that splits unevenly.
set -euo pipefail
for config in qwen3_moe mixtral granitemoe; do
  "$TEST_SRCDIR/torch/python" "$TEST_SRCDIR/zplan/tools/eager_experts.py" --check --tokens 300 \
    --hf-config "$TEST_SRCDIR/zplan/configs/hf/tiny/$config.json" \
    --allocator "$TEST_SRCDIR/zplan/executor/libzplan_counting_allocator.so"
done
