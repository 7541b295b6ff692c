#!/usr/bin/env bash
# Every cell of the tested matrix (`make test-cell` each, all of them whatever fails),
# then a table: cell, suite and repro counts, seconds.
# Usage: scripts/test_matrix.sh "PY..." "TORCH..." [MAKE_ARGS...]
# Env: LANES=N (default 1) runs the cells in N lanes at once, one Python version's cells
# always in the same lane (they share its build and the extension file the build puts
# into python/fastmodule/); with more than one lane each cell's output goes to
# target/matrix/CELL.log and is shown when all lanes are done.
set -uo pipefail
pys=$1 torches=$2
shift 2
lanes=${LANES:-1}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
start=$SECONDS

# The cells of the Python versions given, one after another; "OUT" streams to the
# terminal, anything else is a folder for one log per cell.
run_cells() {
  local out=$1 status=0 py torch
  shift
  for py in "$@"; do
    for torch in $torches; do
      if [ "$out" = OUT ]; then
        CELL_RESULT=$results make --no-print-directory test-cell PY="$py" TORCH="$torch" \
          "${make_args[@]}" || status=1
      else
        CELL_RESULT=$results make --no-print-directory test-cell PY="$py" TORCH="$torch" \
          "${make_args[@]}" >"$out/py$py-torch$torch.log" 2>&1 || status=1
        echo "cell py$py-torch$torch done after $((SECONDS - start)) s: $(tail -n 1 "$out/py$py-torch$torch.log")"
      fi
      grep -q "^py$py-torch$torch " "$results" ||
        echo "py$py-torch$torch setup" >>"$results"
    done
  done
  return $status
}

make_args=("$@")
status=0
if [ "$lanes" -le 1 ]; then
  # shellcheck disable=SC2086 # pys: versions, split at spaces
  run_cells OUT $pys || status=1
else
  logs=target/matrix
  mkdir -p "$logs"
  read -r -a versions <<<"$pys"
  pids=()
  for ((lane = 0; lane < lanes && lane < ${#versions[@]}; lane++)); do
    mine=()
    for ((i = lane; i < ${#versions[@]}; i += lanes)); do mine+=("${versions[i]}"); done
    echo "lane $((lane + 1)): CPython ${mine[*]}"
    run_cells "$logs" "${mine[@]}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  for py in $pys; do
    for torch in $torches; do
      echo "================================ cell py$py-torch$torch ($logs/py$py-torch$torch.log)"
      cat "$logs/py$py-torch$torch.log"
    done
  done
fi
echo
printf '%-20s %12s %12s %14s %14s %8s\n' cell "tests passed" "tests failed" "repros passed" \
  "repros failed" seconds
# The table in matrix order, whatever order the lanes finished in.
for py in $pys; do
  for torch in $torches; do
    read -r cell p f rp rf s < <(grep "^py$py-torch$torch " "$results" | head -n 1)
    [ "$p" != setup ] || { printf '%-20s %s\n' "$cell" "no result: its setup failed (output above)"; continue; }
    printf '%-20s %12s %12s %14s %14s %8s\n' "$cell" "$p" "$f" "$rp" "$rf" "$s"
  done
done
echo "matrix: $((SECONDS - start)) s, $([ $status = 0 ] && echo 'every cell passed' || echo 'FAILED')"
exit $status
