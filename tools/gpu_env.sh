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
# Rows a lease can split across calls: ROWS="1 2 5" runs only those rows (numbered from 1 in the
# script's order), and DEADLINE_S=N starts no row after N seconds of the script, so that a call ends
# with its table. `row_starts LABEL [ARRAY]` says whether the next row runs; one past the deadline
# goes into ARRAY (default rows) and $out/rows.txt as not started. `row_done [ARRAY]` appends the
# row just finished to rows.txt.
rows=()
row_number=0
row_starts() {
  local -n into=${2:-rows}
  row_number=$((row_number + 1))
  [[ -z ${ROWS:-} || " $ROWS " == *" $row_number "* ]] || return 1
  if (( SECONDS >= ${DEADLINE_S:-1000000} )); then
    into+=("$1|not started: DEADLINE_S"); row_done "${2:-rows}"; return 1
  fi
}
row_done() {
  local -n from=${1:-rows}
  echo "${from[-1]}" | tee -a "$out/rows.txt"
}

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
