#!/usr/bin/env bash
# Every cell of the tested matrix (`make test-cell` each, one after another, all of
# them whatever fails), then a table: cell, suite and repro counts, seconds.
# Usage: scripts/test_matrix.sh "PY..." "TORCH..." [MAKE_ARGS...]
set -uo pipefail
pys=$1 torches=$2
shift 2
results=$(mktemp)
trap 'rm -f "$results"' EXIT
start=$SECONDS
status=0
for py in $pys; do
  for torch in $torches; do
    CELL_RESULT=$results make --no-print-directory test-cell PY="$py" TORCH="$torch" "$@" || status=1
    grep -q "^py$py-torch$torch " "$results" ||
      echo "py$py-torch$torch setup" >>"$results"
  done
done
echo
printf '%-20s %12s %12s %14s %14s %8s\n' cell "tests passed" "tests failed" "repros passed" \
  "repros failed" seconds
while read -r cell p f rp rf s; do
  [ "$p" != setup ] || { printf '%-20s %s\n' "$cell" "no result: its setup failed (output above)"; continue; }
  printf '%-20s %12s %12s %14s %14s %8s\n' "$cell" "$p" "$f" "$rp" "$rf" "$s"
done <"$results"
echo "matrix: $((SECONDS - start)) s, $([ $status = 0 ] && echo 'every cell passed' || echo 'FAILED')"
exit $status
