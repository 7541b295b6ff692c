#!/usr/bin/env bash
# One cell of the tested matrix: CPython PY with torch TORCH.* from PyPI, in its own venv
# (.venv-pyPY-torchTORCH, made once), the release extension built into it, then the whole
# suite in the order SEED gives and the shared repros (../shared/reference/repros/run.sh)
# with that venv's python.
# Usage: scripts/test_cell.sh PY TORCH SEED INTERPRETER [PIP_SPEC...]
#   INTERPRETER: a CPython PY executable; PIP_SPEC: the test tools to install beside torch.
# Env: TESTS="PATH..." (what pytest runs; default tests); DEBUG=1 runs the suite under
# CPython's debug allocator and development mode with fastmodule's own warnings as errors
# (as `make test-debug`); REPROS=PATH/run.sh (default
# ../shared/reference/repros/run.sh); CELL_RESULT=FILE appends "cell suite_passed
# suite_failed repros_passed repros_failed seconds" to FILE (test_matrix.sh reads it).
# Exits non-zero when anything failed; the last line gives each phase's seconds.
set -uo pipefail
py=$1 torch=$2 seed=$3 interpreter=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
cell=py$py-torch$torch
venv=$root/.venv-$cell
start=$SECONDS
phases=()
phase_start=$SECONDS
# Appends "NAME SECONDS" (since the previous phase ended) to the phase times.
phase_done() { phases+=("$1 $((SECONDS - phase_start))"); phase_start=$SECONDS; }

[ -n "$interpreter" ] || { echo "cell $cell: no CPython $py (python$py on PATH or pyenv's)" >&2; exit 2; }
set -e
# Everything below runs as if the cell's venv were activated (subprocesses included).
export VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH
# Made once; where pip caches, the second cell of each torch gets its CUDA libraries
# from the cache.
if [ ! -f "$venv/.ready" ] || [ "$root/pyproject.toml" -nt "$venv/.ready" ]; then
  echo "== cell $cell: venv with torch==$torch.* ($interpreter)"
  "$interpreter" -m venv "$venv"
  # maturin in the venv itself: `maturin develop` needs its own script.
  "$venv/bin/python" -m pip install -q "maturin>=1.5,<2"
  # One resolve, so that the tools' own torch dependents (timm's torchvision) pick the
  # versions that fit this torch instead of replacing it.
  "$venv/bin/python" -m pip install -q "torch==$torch.*" "$@"
  touch "$venv/.ready"
  phase_done venv
fi
# One Cargo target folder per Python version (pyo3 builds for one interpreter): the
# two torch cells of a version share its build.
echo "== cell $cell: release build"
# (pip's lines about torch's dependencies, all already there, left out.)
(cd "$root" && CARGO_TARGET_DIR=$root/target/cell-py$py \
  "$venv/bin/maturin" develop --release -q) 2>&1 |
  { grep -vE '^(Requirement already satisfied|Ignoring |Looking in links)' || true; }
phase_done build
set +e

debug_env=() debug=() debug_args=()
replay_debug=
if [ "${DEBUG:-0}" = 1 ]; then
  # As `make test-debug`: buffer over/underruns and use after free of Python memory,
  # API misuse without the GIL; a warning attributed to fastmodule's code is an error.
  debug_env=(env PYTHONMALLOC=debug) debug=(-X dev)
  debug_args=(-o "filterwarnings=error:::fastmodule")
  replay_debug=" DEBUG=1"
  echo "cell $cell: the suite under the debug allocator and development mode"
fi
echo "cell $cell seed: $seed (replay: make test-cell PY=$py TORCH=$torch SEED=$seed$replay_debug)"
log=$venv/last-suite.log
# shellcheck disable=SC2086 # TESTS: paths, split at spaces
(cd "$root" && "${debug_env[@]}" "$venv/bin/python" "${debug[@]}" -m pytest ${TESTS:-tests} -q -p no:cacheprovider \
  -p randomly --randomly-seed="$seed" --hypothesis-seed="$seed" \
  "${debug_args[@]}") 2>&1 | tee "$log"
suite_rc=${PIPESTATUS[0]}
summary=$(tail -n 1 "$log")
count() { grep -oE "[0-9]+ $1" <<<"$summary" | grep -oE '^[0-9]+' || echo 0; }
passed=$(count passed)
failed=$(($(count failed) + $(count 'errors?')))
# A run that ended without pytest's summary (killed, crashed, nothing collected) fails.
[ "$suite_rc" = 0 ] || [ "$failed" != 0 ] || failed=1
phase_done suite

repros=${REPROS:-$(cd "$root/.." && pwd)/shared/reference/repros/run.sh}
if [ -f "$repros" ]; then
  rlog=$venv/last-repros.log
  PYTHON=$venv/bin/python bash "$root/scripts/run_repros.sh" "$repros" 2>&1 | tee "$rlog"
  repros_rc=${PIPESTATUS[0]}
  read -r rpassed rfailed < <(tail -n 1 "$rlog" | sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1 \2/p')
  rpassed=${rpassed:-0} rfailed=${rfailed:-1}
  [ "$repros_rc" = 0 ] || [ "$rfailed" != 0 ] || rfailed=1
  phase_done repros
else
  echo "cell $cell: repros skipped ($repros not found: a checkout without ../shared)"
  rpassed=- rfailed=-
fi

secs=$((SECONDS - start))
times=$(printf '%s, ' "${phases[@]}")
times=${times%, }
echo "cell $cell: suite $passed passed, $failed failed; repros $rpassed passed," \
  "$rfailed failed; ${secs} s ($times)"
[ -z "${CELL_RESULT:-}" ] || echo "$cell $passed $failed $rpassed $rfailed $secs" >>"$CELL_RESULT"
[ "$failed" = 0 ] && { [ "$rfailed" = 0 ] || [ "$rfailed" = - ]; }
