#!/usr/bin/env bash
# make test-py314: the whole suite and the shared repros on CPython 3.14 with torch
# TORCH.*, from nothing on a Debian/Ubuntu x86_64 machine whose own Python is older.
#
# Phases (seconds of each in the summary at the end, printed on every exit path):
#   prereqs  debootstrap, unshare, chroot; root.
#   root     ROOT: a Debian minbase root with CPython 3.14 from the forky suite
#            (python3.14, -dev, -venv). Reused when complete; built with debootstrap
#            (sid's script: the host's debootstrap may not know forky) otherwise.
#   packages torch and the test tools, downloaded by this machine's pip for cp314
#            (WHEELS, reused while the recipe is the same) and installed into the
#            root's /opt/venv with --no-index (again only when the recipe changed).
#   build    the extension on this machine against .ci/pyo3-py314.cfg (cargo's own
#            folder target/py314-lane), put beside the package as
#            python/fastmodule/_core.cpython-314-x86_64-linux-gnu.so (gitignored; the
#            other versions' builds stay beside it).
#   doctor   `python -m fastmodule doctor` inside: every native path on.
#   tests    pytest on TESTS inside the root, the checkout mounted at /src.
#   repros   the shared reproducers (REPROS' folder mounted at /repros), if present.
#
# Everything that mounts runs in a private mount namespace (unshare): the mounts are
# invisible outside it and go with it however the script ends. Inside: proc, /dev, a
# tmpfs on /dev/shm, /sys read-only, the checkout and the repros.
#
# Environment (the Makefile sets them): ROOT, WHEELS, TESTS (pytest arguments relative
# to the repository root), SEED, TORCH (a version prefix), PIP_PYTHON (a Python of this
# machine whose pip downloads the wheels; default python3: the lane shares no venv with
# the other lanes, which may be creating theirs at the same time),
# MIRROR, LOGS, DEBUG=1 (the suite under the debug allocator and development mode,
# fastmodule's warnings as errors), REPROS (PATH/run.sh), TOOLS (pip specs).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/fastmodule
ROOT=$(realpath -m "${ROOT:-$CACHE/py314-root}")
WHEELS=$(realpath -m "${WHEELS:-$CACHE/py314-wheels}")
LOGS=$(realpath -m "${LOGS:-target/py314-lane}")
PIP_PYTHON=${PIP_PYTHON:-python3}
TESTS=${TESTS:-tests}
SEED=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
TORCH=${TORCH:-2.15}
DEBUG=${DEBUG:-0}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
REPROS=${REPROS:-$(cd "$REPO/.." && pwd)/shared/reference/repros/run.sh}
SUITE=forky
PY=python3.14
# (The Makefile's list quotes each spec for the shell: the quotes are dropped here.)
TOOLS=${TOOLS:-pytest>=8 pytest-randomly>=3.15 hypothesis>=6 numpy expecttest}
read -r -a TOOL_SPECS <<<"${TOOLS//\"/}"
TOOLS_ALL=("torch==$TORCH.*" "${TOOL_SPECS[@]}")
RECIPE="$SUITE ${TOOLS_ALL[*]}"
EXT=python/fastmodule/_core.cpython-314-x86_64-linux-gnu.so

# ---- in the host's mount namespace: checks, then the rest in a private one ----------
if [ -z "${_PY314_IN_NS:-}" ]; then
  start=$(date +%s)
  [ "$(id -u)" = 0 ] || { echo "test-py314 needs root (chroot, mount)"; exit 1; }
  [ "$(uname -m)" = x86_64 ] || { echo "test-py314 runs on x86_64 machines"; exit 1; }
  missing=()
  for tool in debootstrap unshare chroot cargo; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "test-py314: missing ${missing[*]} (debootstrap: apt-get install debootstrap)"
    exit 1
  fi
  [ -f /usr/share/debootstrap/scripts/sid ] || {
    echo "test-py314: debootstrap has no sid script; install a newer debootstrap"; exit 1; }
  # A venv's VIRTUAL_ENV (the Makefile exports .venv's, which the front lane may be
  # creating meanwhile) must not pick the interpreter a pyenv shim runs.
  unset VIRTUAL_ENV
  "$PIP_PYTHON" -m pip --version >/dev/null 2>&1 || {
    echo "test-py314: $PIP_PYTHON has no pip (set PIP_PYTHON to a Python with pip)"; exit 1; }
  export _PY314_IN_NS=1 _PREREQ_S=$(( $(date +%s) - start )) SEED
  exec unshare --mount --propagation private bash "$0" "$@"
fi

# ---- in the private mount namespace ---------------------------------------------------
mkdir -p "$LOGS"
PHASES=("prereqs $_PREREQ_S")
CURRENT=""
ROOT_STATE="" INSIDE="" DOCTOR="" TESTS_LINE="" REPROS_LINE=""
MOUNTS=()

phase() { end_phase; CURRENT=$1 PHASE_START=$(date +%s); }
end_phase() {
  if [ -n "$CURRENT" ]; then PHASES+=("$CURRENT $(( $(date +%s) - PHASE_START ))"); fi
  CURRENT=""
}
unmount_all() {
  local i
  for (( i=${#MOUNTS[@]}-1; i>=0; i-- )); do
    umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" || true
  done
  MOUNTS=()
}
summary() {
  local rc=$? p total=0 times=""
  trap - EXIT
  unmount_all
  local failed=$CURRENT
  end_phase
  for p in "${PHASES[@]}"; do times+="${p% *} ${p#* }s, "; total=$(( total + ${p#* } )); done
  echo
  echo "== test-py314 summary =="
  echo "root:     $ROOT ${ROOT_STATE:-(not ready)}"
  echo "inside:   ${INSIDE:-(not reached)}"
  echo "doctor:   ${DOCTOR:-(not run)}"
  echo "tests:    ${TESTS_LINE:-(not run)}"
  echo "repros:   ${REPROS_LINE:-(not run)}"
  echo "seed:     $SEED (replay: make test-py314 SEED=$SEED)"
  echo "phases:   ${times}total ${total}s"
  if [ -n "$failed" ]; then echo "FAILED in phase $failed (exit status $rc)"; fi
  exit "$rc"
}
trap summary EXIT
trap 'exit 130' INT TERM

mounted_under() {
  awk -v r="$1" '$5 == r || index($5, r "/") == 1 { found=1 } END { exit !found }' \
    /proc/self/mountinfo
}
mount_at() {  # mount_at TARGET MOUNT-ARGS...: TARGET must resolve to a place in the root
  case "$(realpath -e "$1")" in
    "$ROOT"/*) ;;
    *) echo "refusing to mount on $1: it resolves outside $ROOT (rebuild the root:" \
         "rm -rf $ROOT)"; exit 1 ;;
  esac
  mount "${@:2}" "$1"
  MOUNTS+=("$1")
}
in_root() {  # in_root CMD...: CMD in the root, with a clean environment
  chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin "$@"
}

# ---- root --------------------------------------------------------------------------
phase root
if [ -f "$ROOT/.root-ready" ]; then
  ROOT_STATE="(reused)"
else
  ROOT_STATE="(built)"
  partial="$ROOT.partial"
  if mounted_under "$partial"; then echo "something is mounted under $partial"; exit 1; fi
  rm -rf "$partial"
  mkdir -p "$(dirname "$ROOT")"
  echo "root: debootstrap $SUITE minbase with $PY into $partial (log: $LOGS/debootstrap.log)"
  debootstrap --variant=minbase --include=$PY,$PY-dev,$PY-venv,ca-certificates \
    "$SUITE" "$partial" "$MIRROR" /usr/share/debootstrap/scripts/sid \
    >"$LOGS/debootstrap.log" 2>&1 ||
    { tail -20 "$LOGS/debootstrap.log"; echo "debootstrap failed"; exit 1; }
  # debootstrap in a container may leave the root's /proc a symlink to /proc.
  if [ -L "$partial/proc" ]; then rm "$partial/proc" && mkdir "$partial/proc"; fi
  rm -rf "$partial"/var/cache/apt/archives/*.deb
  echo "root: $(chroot "$partial" /usr/bin/$PY -c 'import sys; print(sys.version.split()[0])')"
  touch "$partial/.root-ready"
  if [ -e "$ROOT" ]; then
    if mounted_under "$ROOT"; then echo "something is mounted under $ROOT"; exit 1; fi
    rm -rf "$ROOT"
  fi
  mv "$partial" "$ROOT"
fi
INSIDE="CPython $(chroot "$ROOT" /usr/bin/$PY -c 'import sys; print(sys.version.split()[0])')"

# ---- packages --------------------------------------------------------------------------
phase packages
if [ "$(cat "$ROOT/.packages-ready" 2>/dev/null)" != "$RECIPE" ]; then
  if [ "$(cat "$WHEELS/.recipe" 2>/dev/null)" != "$RECIPE" ]; then
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    platforms=(--platform linux_x86_64 --platform manylinux2014_x86_64)
    for minor in $(seq 17 28); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
    echo "packages: downloading ${TOOLS_ALL[*]} for cp314 (log: $LOGS/pip-download.log)"
    "$PIP_PYTHON" -m pip download -d "$WHEELS" "${platforms[@]}" --python-version 3.14 \
      --implementation cp --abi cp314 --abi abi3 --abi none --only-binary=:all: \
      --disable-pip-version-check "${TOOLS_ALL[@]}" >"$LOGS/pip-download.log" 2>&1 ||
      { tail -20 "$LOGS/pip-download.log"; echo "pip download failed"; exit 1; }
    echo "$RECIPE" >"$WHEELS/.recipe"
  fi
  rm -f "$ROOT/.packages-ready"
  rm -rf "$ROOT/opt/venv"
  mkdir -p "$ROOT/wheels"
  mount_at "$ROOT/wheels" --bind -o ro "$WHEELS"
  mount_at "$ROOT/proc" -t proc proc
  echo "packages: installing into the root's /opt/venv (log: $LOGS/pip-install.log)"
  { in_root /usr/bin/$PY -m venv /opt/venv &&
    in_root /opt/venv/bin/python -m pip install --no-index --find-links /wheels \
      --disable-pip-version-check "${TOOLS_ALL[@]}"; } >"$LOGS/pip-install.log" 2>&1 ||
    { tail -20 "$LOGS/pip-install.log"; echo "pip install failed"; exit 1; }
  # The checkout's package, found from /src (mounted for the tests).
  site=$(in_root /opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo /src/python >"$ROOT$site/fastmodule-src.pth"
  unmount_all
  echo "$RECIPE" >"$ROOT/.packages-ready"
else
  echo "packages: reused ($RECIPE)"
fi

# ---- build -----------------------------------------------------------------------------
phase build
echo "build: the extension for CPython 3.14 (log: $LOGS/build.log)"
PYO3_CONFIG_FILE="$REPO/.ci/pyo3-py314.cfg" cargo build --release --lib \
  --target-dir target/py314-lane >"$LOGS/build.log" 2>&1 ||
  { tail -30 "$LOGS/build.log"; echo "build failed"; exit 1; }
cp target/py314-lane/release/lib_core.so "$EXT"

# ---- mounts for what runs inside -------------------------------------------------------
if mounted_under "$ROOT"; then echo "something is already mounted under $ROOT"; exit 1; fi
mkdir -p "$ROOT/src" "$ROOT/repros"
mount_at "$ROOT/proc" -t proc proc
mount_at "$ROOT/sys" --bind -o ro /sys
mount_at "$ROOT/dev" --bind /dev
mount_at "$ROOT/dev/shm" -t tmpfs tmpfs
mount_at "$ROOT/src" --bind "$REPO"
if [ -f "$REPROS" ]; then mount_at "$ROOT/repros" --bind -o ro "$(dirname "$REPROS")"; fi

# ---- doctor ----------------------------------------------------------------------------
phase doctor
set +e
out=$(in_root /bin/sh -c 'cd /tmp && exec python -m fastmodule doctor' 2>&1)
rc=$?
set -e
echo "$out" | tail -15
DOCTOR="exit status $rc"
[ "$rc" = 0 ] || exit "$rc"

# ---- tests -----------------------------------------------------------------------------
phase tests
TESTS_LINE="(started; no result)"
debug=()
if [ "$DEBUG" = 1 ]; then
  debug=(env PYTHONMALLOC=debug python -X dev)
  debug_args=(-o "filterwarnings=error:::fastmodule")
else
  debug=(python)
  debug_args=()
fi
echo "tests: pytest $TESTS on $INSIDE (seed $SEED; log: $LOGS/pytest.log)"
# Job control on, so pytest does not start with SIGINT ignored (a background job of a
# non-interactive shell would): the suite's Ctrl-C test sends it one.
set +e
set -m
# shellcheck disable=SC2086 # TESTS: paths, split at spaces
in_root /bin/sh -c 'cd /src && exec "$@"' sh "${debug[@]}" -m pytest $TESTS -q \
  -p no:cacheprovider -p randomly --randomly-seed="$SEED" --hypothesis-seed="$SEED" \
  "${debug_args[@]}" >"$LOGS/pytest.log" 2>&1 &
wait $!
rc=$?
set +m
set -e
tail -n 25 "$LOGS/pytest.log"
TESTS_LINE=$(grep -E '^=* ?[0-9]+ (passed|failed|error)|no tests ran' "$LOGS/pytest.log" |
  tail -1 | sed -E 's/^=+ //; s/ =+$//')
TESTS_LINE="${TESTS_LINE:-pytest exit status $rc} (exit status $rc)"
[ "$rc" = 0 ] || exit "$rc"

# ---- repros ----------------------------------------------------------------------------
phase repros
if [ -f "$REPROS" ]; then
  set +e
  in_root /bin/sh -c 'cd /src && PYTHON=/opt/venv/bin/python exec bash scripts/run_repros.sh /repros/run.sh' \
    >"$LOGS/repros.log" 2>&1
  rc=$?
  set -e
  cat "$LOGS/repros.log"
  REPROS_LINE="$(tail -n 1 "$LOGS/repros.log") (exit status $rc)"
  [ "$rc" = 0 ] || exit "$rc"
else
  REPROS_LINE="skipped ($REPROS not found)"
fi
end_phase
