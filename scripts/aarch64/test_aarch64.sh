#!/usr/bin/env bash
# make test-aarch64: the cp311 aarch64 wheel imported and tested on an aarch64 CPython
# (Debian bookworm's 3.11) under qemu user-mode emulation, in a chroot. An x86_64
# machine otherwise only checks the aarch64 wheels' tags (check-wheels); this runs them.
#
# Phases (seconds of each in the summary at the end, printed on every exit path):
#   prereqs  qemu-user-static, binfmt-support, debootstrap, Rust's std for aarch64; the
#            kernel's qemu-aarch64 handler (binfmt_misc mounted and the handler enabled
#            where they are not; its F flag lets the chroot run aarch64 binaries without
#            a copy of qemu inside).
#   root     ROOT (a bookworm arm64 minbase with python3) is reused when it is complete;
#            else built: debootstrap's first stage downloads the .debs, which are then
#            unpacked here with dpkg-deb (seconds; the emulated second stage takes 7.5 min).
#   packages torch and the test tools, installed by this machine's pip for aarch64 into
#            the root's /usr/local/lib/python3.11/dist-packages (emulated pip takes 8 min
#            just to resolve); again only when the recipe changed. PyPI's aarch64 torch is a
#            CUDA build whose NVIDIA libraries `import torch` needs even without a GPU (~3 GB).
#   wheel    the cp311 aarch64 wheel (maturin --zig, as `make wheels`), with cargo's files
#            in its own folder so the main build is not invalidated.
#   install  the wheel (--no-deps) into the same site folder, replacing the last one.
#   smoke    scripts/smoke_wheel.py --installed inside the root.
#   tests    pytest on TESTS inside the root (the repository's tests/ mounted read-only at
#            /src/tests; /src holds no fastmodule, so the installed wheel is what imports).
#
# Everything that mounts runs in a private mount namespace (unshare): the mounts are
# invisible outside it and go with it however the script ends; the EXIT trap still
# unmounts them in order. Inside: proc, /dev, a tmpfs on /dev/shm, an aarch64
# /proc/cpuinfo (torch's cpuinfo crashes in cpuinfo_arm_linux_init on the host's x86 one)
# and a tmpfs on /sys with the few files cpuinfo and oneDNN read (without them torch
# raises "Failed to initialize cpuinfo!" in dtype conversions).
# Nothing inside the root talks to the network. `import torch` takes 20-25 s emulated:
# TESTS is a chosen set of files, and none of them starts a Python subprocess.
#
# Environment (the Makefile sets them): ROOT, TESTS (pytest arguments, relative to the
# repository root), SEED, TORCH (a version prefix, e.g. 2.15), VENV (.venv with maturin,
# ziglang and pip), MANYLINUX, MIRROR, LOGS (build logs, cargo's folder, the wheel).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
ROOT=$(realpath -m "${ROOT:-.aarch64-root}")
LOGS=$(realpath -m "${LOGS:-target/aarch64}")
VENV=$(realpath -m "${VENV:-.venv}")
TESTS=${TESTS:-tests/test_parity_call.py}
SEED=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
TORCH=${TORCH:-2.15}
MANYLINUX=${MANYLINUX:-manylinux_2_28}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
TARGET=aarch64-unknown-linux-gnu
SITE=usr/local/lib/python3.11/dist-packages # inside the root; on bookworm's sys.path
# What the packages phase installs; a root whose stamp differs gets them afresh.
TOOLS=("torch==$TORCH.*" "pytest>=8" "pytest-randomly>=3.15" "hypothesis>=6" numpy expecttest)
RECIPE="$SUITE ${TOOLS[*]}"

# ---- in the host's mount namespace: checks, then the rest in a private one ----------
if [ -z "${_AARCH64_IN_NS:-}" ]; then
  start=$(date +%s)
  [ "$(id -u)" = 0 ] || { echo "test-aarch64 needs root (chroot, mount)"; exit 1; }
  missing=()
  for tool in qemu-aarch64-static debootstrap dpkg-deb update-binfmts unshare chroot; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "test-aarch64: missing ${missing[*]}; on Debian/Ubuntu:"
    echo "  apt-get install qemu-user-static binfmt-support debootstrap"
    exit 1
  fi
  if ! ls "$(rustc --print target-libdir --target $TARGET 2>/dev/null)"/libstd-*.rlib \
      >/dev/null 2>&1; then
    echo "test-aarch64: Rust's std for $TARGET is not installed: rustup target add $TARGET"
    exit 1
  fi
  [ -x "$VENV/bin/maturin" ] && "$VENV/bin/python" -c 'import ziglang' 2>/dev/null || {
    echo "test-aarch64: $VENV needs maturin and ziglang (make's .wheel-tools step)"; exit 1; }
  binfmt=/proc/sys/fs/binfmt_misc
  if [ ! -e $binfmt/register ]; then
    echo "mounting binfmt_misc at $binfmt"
    mount -t binfmt_misc binfmt_misc $binfmt
  fi
  if ! grep -qx enabled $binfmt/qemu-aarch64 2>/dev/null; then
    echo "enabling the qemu-aarch64 binfmt handler"
    update-binfmts --enable qemu-aarch64
  fi
  grep -q '^flags: .*F' $binfmt/qemu-aarch64 || {
    echo "test-aarch64: the qemu-aarch64 handler lacks the F flag (qemu-user-static's has it)"
    exit 1; }
  export _AARCH64_IN_NS=1 _PREREQ_S=$(( $(date +%s) - start )) SEED
  exec unshare --mount --propagation private bash "$0" "$@"
fi

# ---- in the private mount namespace ---------------------------------------------------
mkdir -p "$LOGS"
PHASES=()   # "name seconds" of each finished phase
PHASES+=("prereqs $_PREREQ_S")
CURRENT=""  # the phase running now (named as failed if the script stops in it)
ROOT_STATE="" WHEEL="" SMOKE="" TESTS_LINE="" INSIDE=""
MOUNTS=()   # mounted, in order (unmounted in reverse)

phase() {  # phase NAME: starts timing NAME (ends the previous one)
  end_phase
  CURRENT=$1 PHASE_START=$(date +%s)
}
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
  for p in "${PHASES[@]}"; do
    times+="${p% *} ${p#* }s, "; total=$(( total + ${p#* } ))
  done
  echo
  echo "== test-aarch64 summary =="
  echo "root:     ${ROOT#"$REPO"/} ${ROOT_STATE:-(not ready)}"
  echo "wheel:    ${WHEEL:-(not built)}"
  echo "inside:   ${INSIDE:-(not reached)}"
  echo "emulator: $(qemu-aarch64-static --version | head -1)"
  echo "smoke:    ${SMOKE:-(not run)}"
  echo "tests:    ${TESTS_LINE:-(not run)}"
  echo "          $TESTS"
  echo "seed:     $SEED (replay: make test-aarch64 SEED=$SEED)"
  echo "phases:   ${times}total ${total}s"
  if [ -n "$failed" ]; then echo "FAILED in phase $failed (exit status $rc)"; fi
  exit "$rc"
}
trap summary EXIT
trap 'exit 130' INT TERM

mounted_under() {  # is anything mounted at or under $1 in this namespace?
  awk -v r="$1" '$5 == r || index($5, r "/") == 1 { found=1 } END { exit !found }' \
    /proc/self/mountinfo
}

in_root() {  # in_root CMD...: runs CMD in the root, emulated, with a clean environment
  nice -n 10 chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/bin:/usr/bin:/bin OMP_NUM_THREADS=1 "$@"
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
  echo "root: debootstrap's first stage into $partial (log: $LOGS/debootstrap.log)"
  nice -n 10 debootstrap --arch=arm64 --variant=minbase --foreign --include=python3 \
    "$SUITE" "$partial" "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 ||
    { tail -20 "$LOGS/debootstrap.log"; echo "debootstrap failed"; exit 1; }
  # The second stage's unpacking, without its emulated maintainer scripts (none of
  # them matters to python3). --keep-directory-symlink keeps merged /usr's /bin, /lib.
  n=0
  for deb in "$partial"/var/cache/apt/archives/*.deb; do
    dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$partial"
    n=$(( n + 1 ))
  done
  echo "root: unpacked $n packages"
  # debootstrap in a container makes the root's /proc a symlink to /proc (a loop once
  # chrooted, and a mount there would land on the host's /proc): a plain folder instead.
  if [ -L "$partial/proc" ]; then rm "$partial/proc" && mkdir "$partial/proc"; fi
  # What base-passwd's and libc-bin's scripts would have done that python needs.
  [ -f "$partial/etc/passwd" ] || cp "$partial/usr/share/base-passwd/passwd.master" "$partial/etc/passwd"
  [ -f "$partial/etc/group" ] || cp "$partial/usr/share/base-passwd/group.master" "$partial/etc/group"
  chroot "$partial" /sbin/ldconfig
  rm -rf "$partial"/var/cache/apt/archives/*.deb "$partial/debootstrap"
  in_root_check=$(chroot "$partial" /usr/bin/python3 -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')
  echo "root: python3 runs: $in_root_check"
  touch "$partial/.root-ready"
  if [ -e "$ROOT" ]; then
    if mounted_under "$ROOT"; then echo "something is mounted under $ROOT"; exit 1; fi
    rm -rf "$ROOT"
  fi
  mv "$partial" "$ROOT"
fi

# ---- packages (host pip, for aarch64) -------------------------------------------------
phase packages
if [ "$(cat "$ROOT/.packages-ready" 2>/dev/null)" != "$RECIPE" ]; then
  rm -rf "${ROOT:?}/$SITE" "$ROOT/.packages-ready"
  platforms=(--platform linux_aarch64 --platform manylinux2014_aarch64)
  for minor in $(seq 17 28); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
  PIP_FOR_ROOT=(--target "$ROOT/$SITE" "${platforms[@]}" --python-version 3.11
    --implementation cp --only-binary=:all: --disable-pip-version-check)
  echo "packages: ${TOOLS[*]} for aarch64 into the root (log: $LOGS/pip.log)"
  nice -n 10 "$VENV/bin/python" -m pip install "${PIP_FOR_ROOT[@]}" "${TOOLS[@]}" \
    >"$LOGS/pip.log" 2>&1 || { tail -20 "$LOGS/pip.log"; echo "pip failed"; exit 1; }
  echo "packages: $(du -sh "$ROOT/$SITE" | cut -f1) in $SITE"
  echo "$RECIPE" >"$ROOT/.packages-ready"
else
  echo "packages: reused ($RECIPE)"
fi

# ---- the wheel -------------------------------------------------------------------------
phase wheel
rm -rf "$LOGS/wheel" && mkdir -p "$LOGS/wheel"
echo "wheel: cp311 $TARGET (log: $LOGS/build.log)"
CARGO_TARGET_DIR="$LOGS/cargo" PATH="$VENV/bin:$PATH" nice -n 10 "$VENV/bin/maturin" build \
  --release --zig --compatibility "$MANYLINUX" --target "$TARGET" --out "$LOGS/wheel" \
  --interpreter python3.11 >"$LOGS/build.log" 2>&1 ||
  { tail -30 "$LOGS/build.log"; echo "wheel build failed"; exit 1; }
wheel_file=$(ls "$LOGS"/wheel/fastmodule-*-cp311-*aarch64.whl)
WHEEL=$(basename "$wheel_file")

# ---- install ---------------------------------------------------------------------------
# pip --target into a folder of its own, then its package and dist-info copied over the
# last ones (a second --target into the site folder would skip the existing bin/).
phase install
rm -rf "$LOGS/wheel/site" "${ROOT:?}/$SITE"/fastmodule "${ROOT:?}/$SITE"/fastmodule-*.dist-info
nice -n 10 "$VENV/bin/python" -m pip install --no-deps --target "$LOGS/wheel/site" --platform \
  "${MANYLINUX}_aarch64" --python-version 3.11 --implementation cp --only-binary=:all: \
  --disable-pip-version-check -q "$wheel_file"
cp -a "$LOGS"/wheel/site/fastmodule "$LOGS"/wheel/site/fastmodule-*.dist-info "$ROOT/$SITE/"
WHEEL+=" -> /$SITE"

# ---- mounts for what runs inside -------------------------------------------------------
mount_at() {  # mount_at TARGET MOUNT-ARGS...: TARGET must resolve to a place in the root
  case "$(realpath -e "$1")" in
    "$ROOT"/*) ;;
    *) echo "refusing to mount on $1: it resolves to $(realpath -m "$1"), outside $ROOT" \
         "(a symlink in the root; rebuild it: rm -rf ${ROOT#"$REPO"/})"; exit 1 ;;
  esac
  mount "${@:2}" "$1"
  MOUNTS+=("$1")
}
if mounted_under "$ROOT"; then echo "something is already mounted under $ROOT"; exit 1; fi
# One Neoverse-N1-like core, as torch's cpuinfo and oneDNN's xbyak read it from /proc
# and /sys (the host's /sys is not mounted: a tmpfs with just these files stands in).
cat >"$LOGS/cpuinfo" <<'EOF'
processor	: 0
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1

EOF
mkdir -p "$ROOT/src/tests"
mount_at "$ROOT/proc" -t proc proc
mount_at "$ROOT/proc/cpuinfo" --bind "$LOGS/cpuinfo"
mount_at "$ROOT/sys" -t tmpfs tmpfs
mkdir -p "$ROOT/sys/devices/system/cpu/cpu0/regs/identification"
for f in possible present online; do echo 0 >"$ROOT/sys/devices/system/cpu/$f"; done
echo 0x00000000413fd0c1 >"$ROOT/sys/devices/system/cpu/cpu0/regs/identification/midr_el1"
mount_at "$ROOT/dev" --bind /dev
mount_at "$ROOT/dev/shm" -t tmpfs tmpfs
mount_at "$ROOT/src/tests" --bind -o ro "$REPO/tests"
cp scripts/smoke_wheel.py "$ROOT/src/smoke_wheel.py"

# ---- smoke -----------------------------------------------------------------------------
phase smoke
SMOKE="(started; no result)"
echo "smoke: scripts/smoke_wheel.py --installed on $(in_root uname -m) (import torch: ~25 s)"
out=$(in_root python3 /src/smoke_wheel.py --installed 2>&1) && ok=1 || ok=0
echo "$out"
SMOKE=$(grep -E '^smoke (ok|FAILED)' <<<"$out" | tail -1) || SMOKE=$(tail -1 <<<"$out")
[ "$ok" = 1 ] || exit 1
INSIDE="$(in_root uname -m), $(grep -o '\[fastmodule .*\]' <<<"$SMOKE" | tr -d '[]')"
SMOKE=${SMOKE%% \[*}

# ---- tests -----------------------------------------------------------------------------
phase tests
TESTS_LINE="(started; no result)"
echo "tests: pytest $TESTS (seed $SEED; log: $LOGS/pytest.log)"
# The checkout's pytest options (pyproject's -ra) are not there; given here.
set +e
in_root /bin/sh -c 'cd /src && exec python3 -m pytest "$@"' sh $TESTS -q -ra \
  -p no:cacheprovider -p randomly --randomly-seed="$SEED" --hypothesis-seed="$SEED" \
  2>&1 | tee "$LOGS/pytest.log"
rc=${PIPESTATUS[0]}
set -e
TESTS_LINE=$(grep -E '^=* ?[0-9]+ (passed|failed|error)|no tests ran' "$LOGS/pytest.log" |
  tail -1 | sed -E 's/^=+ //; s/ =+$//')
TESTS_LINE="${TESTS_LINE:-pytest exit status $rc} (exit status $rc)"
[ "$rc" = 0 ] || exit "$rc"
end_phase
