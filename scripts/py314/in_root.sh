#!/usr/bin/env bash
# Run a command in the CPython 3.14 root that `make test-py314` builds (ROOT, default
# ~/.cache/fastmodule/py314-root), with the repository mounted at /src, in a private
# mount namespace (proc, /dev, a tmpfs /dev/shm, /sys read-only). Needs root.
#   scripts/py314/in_root.sh python3.14 ARGS...   the root's interpreter (maturin's
#                                                  --interpreter for cp314 wheels)
#   scripts/py314/in_root.sh --smoke WHEEL        WHEEL (a path under the repository)
#       installed with --no-deps into a clean venv in the root, the root's torch made
#       visible through a .pth file, then scripts/smoke_wheel.py --installed
#   scripts/py314/in_root.sh --venv ARGS...       the root's /opt/venv python (torch and
#       the checkout's package, with the extension `make test-py314` last built) run
#       with ARGS in /src, e.g. `--venv -m fastmodule bench --json target/b.json`
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$(realpath -m "${ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/fastmodule/py314-root}")
[ -f "$ROOT/.packages-ready" ] || {
  echo "no CPython 3.14 root at $ROOT: make test-py314 builds it" >&2; exit 1; }
if [ "${1:-}" = python3.14 ]; then
  # maturin asks the interpreter about itself: no mounts needed.
  shift
  exec chroot "$ROOT" /usr/bin/python3.14 "$@"
fi
mounted() {  # mounted ARGS...: ARGS run by sh -c in the root with its mounts
  unshare --mount --propagation private bash -c '
    set -e
    ROOT=$1 REPO=$2
    shift 2
    mount -t proc proc "$ROOT/proc"
    mount --bind /dev "$ROOT/dev"
    mount -t tmpfs tmpfs "$ROOT/dev/shm"
    mount --bind -o ro /sys "$ROOT/sys"
    mkdir -p "$ROOT/src"
    mount --bind "$REPO" "$ROOT/src"
    exec chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
      PATH=/opt/venv/bin:/usr/bin:/bin /bin/sh -c "$@"
  ' bash "$ROOT" "$REPO" "$@"
}
if [ "${1:-}" = --venv ]; then
  shift
  [ -f "$ROOT/opt/venv/pyvenv.cfg" ] || { echo "no /opt/venv in $ROOT: make test-py314 makes it" >&2; exit 1; }
  mounted 'cd /src && exec /opt/venv/bin/python "$@"' sh "$@"
  exit
fi
[ "${1:-}" = --smoke ] && [ -n "${2:-}" ] || {
  echo "usage: $0 python3.14 ARGS | --venv ARGS | --smoke WHEEL" >&2; exit 2; }
wheel=$(realpath -e "$2")
case "$wheel" in "$REPO"/*) ;; *) echo "the wheel must be under $REPO" >&2; exit 2 ;; esac
rel=${wheel#"$REPO"/}
# shellcheck disable=SC2016 # expanded by the root's shell
mounted '
  set -e
  rm -rf /tmp/wheel-venv
  /usr/bin/python3.14 -m venv /tmp/wheel-venv
  /tmp/wheel-venv/bin/python -m pip install -q --no-deps "/src/$1"
  site=$(/tmp/wheel-venv/bin/python -c "import sysconfig; print(sysconfig.get_path(\"purelib\"))")
  /opt/venv/bin/python -c "import sysconfig; print(sysconfig.get_path(\"purelib\"))" >"$site/zz_torch_from_root.pth"
  cd / && /tmp/wheel-venv/bin/python /src/scripts/smoke_wheel.py --installed' sh "$rel"
