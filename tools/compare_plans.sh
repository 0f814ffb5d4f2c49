#!/usr/bin/env bash
# Proves that a change leaves zplan's plans byte-identical (issue 32, must-show 1): runs a zplan binary over
# the corpus of tools/plan_corpus.h (both accuracy matrices, the seed scenarios, configs/budgets/, presets,
# grids and config.json files) and over tools/plan_sweep.sh's flag sweep (in sweep/) into a folder, and
# compares two such folders byte for byte (the sweep's Perfetto timelines too).
#
#   tools/compare_plans.sh write ZPLAN DIR          every corpus plan by ZPLAN into DIR (a new folder)
#   tools/compare_plans.sh compare DIR_A DIR_B [FIELDS]
#                                                   byte for byte; where two plans differ, once more with the
#                                                   comma-separated Plan FIELDS cleared (default: the ModelSpec
#                                                   fields added since the baseline, below)
#   tools/compare_plans.sh check BASE_ZPLAN DIR     writes DIR/base with BASE_ZPLAN and DIR/new with this
#                                                   tree's zplan, then compares them
#
# A baseline zplan from another commit, without touching this checkout:
#   mkdir /tmp/base && git archive 1cdc6c5 | tar -x -C /tmp/base
#   (cd /tmp/base && bazel build //planner:zplan) && cp /tmp/base/bazel-bin/planner/zplan /tmp/zplan-base
# Exit codes: 0 the same plans; 1 a plan differs, is missing, or its zplan exit code changed; 2 usage.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# Fields that did not exist at the baseline (1cdc6c5): cleared before comparing plans that differ.
default_clear="model.model_type,model.unvalidated_approximation"
usage() { sed -n '5,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
bazel build //tools:plan_corpus > /dev/null 2>&1 || bazel build //tools:plan_corpus
corpus=bazel-bin/tools/plan_corpus
abs() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
write() {  # ZPLAN DIR
  "$corpus" write "$1" "$2"
  tools/plan_sweep.sh "$1" "$2/sweep"
}
compare() {  # DIR_A DIR_B FIELDS
  echo "cleared where plans differ: ${3:-nothing}"
  local rc=0
  echo "== the corpus" && "$corpus" compare "$1" "$2" --clear="$3" || rc=1
  echo "== the flag sweep" && "$corpus" compare "$1/sweep" "$2/sweep" --clear="$3" || rc=1
  for trace in "$1"/sweep/*.json; do
    cmp -s "$trace" "$2/sweep/${trace##*/}" || { echo "timeline differs: ${trace##*/}"; rc=1; }
  done
  return $rc
}
case "$1" in
  write)
    [[ $# == 3 ]] || usage
    write "$(abs "$2")" "$(abs "$3")"
    ;;
  compare)
    [[ $# == 3 || $# == 4 ]] || usage
    compare "$(abs "$2")" "$(abs "$3")" "${4-$default_clear}"
    ;;
  check)
    [[ $# == 3 ]] || usage
    base=$(abs "$2") dir=$(abs "$3")
    bazel build //planner:zplan > /dev/null 2>&1 || bazel build //planner:zplan
    write "$base" "$dir/base"
    write "$root/bazel-bin/planner/zplan" "$dir/new"
    compare "$dir/base" "$dir/new" "$default_clear"
    ;;
  *) usage ;;
esac
