# Sourced by tools/gpu_validate.sh and tools/gpu_deepspeed.sh (after they set dry_run and
# case_timeout_s): where zplan and zrun are (dist/ on the GPU machine, runfiles in a test, bazel-bin
# here), a time limit per case, and on the GPU machine the torch venv's libraries on
# LD_LIBRARY_PATH and the GPU's catalog name in $gpu.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runfiles=${RUNFILES_DIR:-$0.runfiles}
pick() {  # the first path that exists
  for candidate in "$@"; do [[ -e $candidate ]] && { echo "$candidate"; return; }; done
}
ZPLAN=${ZPLAN:-$(pick "$root/dist/bin/zplan" "$runfiles/zplan/planner/zplan" "$root/bazel-bin/planner/zplan")}
ZRUN=${ZRUN:-$(pick "$root/dist/bin/zrun" "$runfiles/zplan/executor/zrun" "$root/bazel-bin/executor/zrun")}
# A case that hangs or crawls must not take the whole lease with it.
limit() { timeout --kill-after=15 "$case_timeout_s" "$@"; }
if (( ! dry_run )); then
  venv=${TORCH_VENV:-/opt/torch/.venv}
  site=$("$venv/bin/python3" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  nvlibs=$(ls -d "$site"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH="$site/torch/lib:$nvlibs$root/dist/lib:${LD_LIBRARY_PATH:-}"
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) gpu=h200 ;;
    *A100*80*) gpu=a100-80gb ;;
    *) gpu=h100-80gb ;;
  esac
fi
# table FORMAT HEADER_CELL... -- ROW...: the header, then each row's '|'-separated cells, in FORMAT
# (nine cells; a short row leaves the rest blank).
table() {
  local format=$1 label a b c d e f g h row
  shift
  local header=()
  while [[ $1 != -- ]]; do header+=("$1"); shift; done
  shift
  if (( ${#header[@]} )); then printf "$format" "${header[@]}"; fi
  for row in "$@"; do
    IFS='|' read -r label a b c d e f g h <<< "$row"
    printf "$format" "$label" "$a" "$b" "$c" "$d" "$e" "$f" "$g" "$h"
  done
}
