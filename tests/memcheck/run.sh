#!/usr/bin/env bash
# Usage: tests/memcheck/run.sh [PYTHON]  (make test-memcheck)
# Runs tests/memcheck/entry_points.py under valgrind's memcheck with the system
# allocator (PYTHONMALLOC=malloc: every Python object is a malloc block valgrind
# tracks) and fails when an error has a frame in fastmodule's extension
# (check_log.py); CPython's and torch's own noise is suppressed
# (python-torch.supp) or summarised without failing. The full log is kept at
# $MEMCHECK_LOG (default target/memcheck.log).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-.venv/bin/python}
log=${MEMCHECK_LOG:-target/memcheck.log}
command -v valgrind >/dev/null || { echo "test-memcheck needs valgrind" >&2; exit 1; }
mkdir -p "$(dirname "$log")"
start=$SECONDS
# The script's own failure (an assertion, a crash) fails the target too: valgrind
# passes on its exit status, and --error-exitcode is off so that only check_log.py
# judges valgrind's findings.
status=0
PYTHONMALLOC=malloc valgrind --tool=memcheck \
    --suppressions=tests/memcheck/python-torch.supp \
    --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
    --track-origins=no --num-callers=40 --error-exitcode=0 --error-limit=no \
    --log-file="$log" \
    "$py" tests/memcheck/entry_points.py || status=$?
echo "memcheck: $((SECONDS - start)) s under valgrind, entry_points.py exit $status, log $log"
"$py" tests/memcheck/check_log.py "$log" || status=1
exit "$status"
