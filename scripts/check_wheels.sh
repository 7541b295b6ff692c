#!/usr/bin/env bash
# Check the release wheels in DIR (default dist):
#  - one wheel per CPython version in VERSIONS and architecture in ARCHS is there;
#  - each is tagged manylinux_2_28 or older, and `auditwheel show` (printed for every
#    wheel) agrees: the tag it finds is the wheel's or older;
#  - each wheel of this machine's architecture is installed (pip --no-deps) into a clean
#    venv (no system site-packages) of its Python and passes scripts/smoke_wheel.py.
# torch for those venvs: TORCH_FROM lists Python interpreters whose torch may be reused;
# the first of a venv's version that imports torch lends its site-packages through a .pth
# file, written AFTER the wheel is installed (so pip never sees that environment's
# packages; the smoke test checks that fastmodule comes from the clean venv). For a
# version none of them has, pip installs torch from PyPI (or pip's cache) into the venv.
# Environment: PY<XY> (interpreter per version, else pythonX.Y on PATH), AUDITWHEEL,
# VERSIONS (default "3.11 3.12 3.13 3.14"), ARCHS (default "x86_64 aarch64"),
# MAX_GLIBC_MINOR (default 28), TORCH_FROM.
set -uo pipefail
dir=${1:-dist}
here=$(cd "$(dirname "$0")" && pwd)
versions=${VERSIONS:-3.11 3.12 3.13 3.14}
archs=${ARCHS:-x86_64 aarch64}
max_minor=${MAX_GLIBC_MINOR:-28}
auditwheel=${AUDITWHEEL:-auditwheel}
host=$(uname -m)
shopt -s nullglob
failed=()
summary=()
declare -A hints=()

# glibc minor version a platform tag stands for (manylinux_2_28_x86_64 -> 28); legacy aliases too.
tag_minor() {
  case $1 in
    manylinux_2_*) sed -E 's/^manylinux_2_([0-9]+)_.*/\1/' <<<"$1" ;;
    manylinux2014_*) echo 17 ;;
    manylinux2010_*) echo 12 ;;
    manylinux1_*) echo 5 ;;
    *) echo 999 ;;
  esac
}

# Tags and auditwheel's verdict for one wheel; returns non-zero when not portable enough.
audit() {
  local whl=$1 platforms audit_out audit_tag declared=999 p m
  platforms=$(basename "$whl" .whl | awk -F- '{print $NF}')
  for p in ${platforms//./ }; do
    m=$(tag_minor "$p")
    ((m < declared)) && declared=$m
  done
  audit_out=$("$auditwheel" show "$whl" 2>&1) || { echo "$audit_out"; return 1; }
  audit_tag=$(tr '\n' ' ' <<<"$audit_out" | grep -oE 'consistent with the following platform tag: "[^"]+"' |
    grep -oE '"[^"]+"' | tr -d '"')
  echo "$audit_out" | sed '/^$/d; s/^/  | /'
  if ((declared > max_minor)); then
    echo "  FAIL: tagged $platforms, newer than manylinux_2_$max_minor"
    return 1
  fi
  if [ -z "$audit_tag" ] || (($(tag_minor "$audit_tag") > declared)); then
    echo "  FAIL: auditwheel's tag (${audit_tag:-none}) is newer than the wheel's ($platforms)"
    return 1
  fi
}

# The site-packages holding torch of the first TORCH_FROM interpreter of this version.
torch_site_for() {
  local p
  for p in ${TORCH_FROM:-}; do
    "$p" -c "import sys, torch, pathlib
assert '%d.%d' % sys.version_info[:2] == '$1'
print(pathlib.Path(torch.__file__).parent.parent)" 2>/dev/null && return
  done
}

# Install into a clean venv of its Python, then the smoke test. A cp314 wheel is tried in
# the CPython 3.14 root (make test-py314 builds it) when this machine has no python3.14.
smoke() {
  local whl=$1 version=$2 var py tmp venv site torch_site
  if [ "$version" = 3.14 ] && [ -z "${PY314:-}" ] && ! command -v python3.14 >/dev/null; then
    case "$(realpath "$whl")" in
      "$(realpath "$here/..")"/*)
        bash "$here/py314/in_root.sh" --smoke "$whl" 2>&1 | sed 's/^/  /'
        return "${PIPESTATUS[0]}" ;;
      *) echo "  FAIL: a cp314 wheel is smoke-tested in the 3.14 root from inside the repository"
        return 1 ;;
    esac
  fi
  var=PY${version/./}
  py=${!var:-$(command -v "python$version" || true)}
  [ -n "$py" ] || { echo "  FAIL: no python$version (set $var)"; return 1; }
  tmp=$(mktemp -d)
  venv=$tmp/venv
  if ! { "$py" -m venv "$venv" && "$venv/bin/python" -m pip install -q --no-deps "$whl"; }; then
    rm -rf "$tmp"
    echo "  FAIL: could not install into a clean venv of $py"
    return 1
  fi
  torch_site=$(torch_site_for "$version")
  if [ -n "$torch_site" ]; then
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$torch_site" >"$site/zz_torch_from_elsewhere.pth"
    echo "  torch: made visible from $torch_site (.pth)"
  else
    echo "  torch: installing from PyPI into the venv"
    "$venv/bin/python" -m pip install -q "torch>=2.11,<3" || {
      rm -rf "$tmp"
      echo "  FAIL: could not install torch"
      return 1
    }
  fi
  local rc=0
  (cd / && "$venv/bin/python" "$here/smoke_wheel.py" --installed) | sed 's/^/  /'
  rc=${PIPESTATUS[0]}
  rm -rf "$tmp"
  return "$rc"
}

for arch in $archs; do
  for version in $versions; do
    cp=cp${version/./}
    wheels=("$dir"/fastmodule-*-"$cp"-"$cp"-*_"$arch".whl)
    if [ ${#wheels[@]} -eq 0 ]; then
      echo "== MISSING: no $cp $arch wheel in $dir"
      failed+=("$cp $arch: missing")
      [ "$arch" = "$host" ] || hints[$arch]="$arch wheels: make wheels builds them only where \
Rust's std for $arch-unknown-linux-gnu is installed (rustup target add $arch-unknown-linux-gnu); \
or leave them out: make wheels ARCHS=$host"
      continue
    fi
    for whl in "${wheels[@]}"; do
      echo "== $(basename "$whl")"
      if ! audit "$whl"; then
        failed+=("$(basename "$whl"): tag")
        continue
      fi
      if [ "$arch" = "$host" ]; then
        if smoke "$whl" "$version"; then
          summary+=("ok   $(basename "$whl") (auditwheel, clean-venv smoke test)")
        else
          failed+=("$(basename "$whl"): smoke test")
        fi
      else
        summary+=("ok   $(basename "$whl") (auditwheel; not run: $arch wheel on a $host machine)")
      fi
    done
  done
done

echo
[ ${#summary[@]} -eq 0 ] || printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAIL %s\n' "${failed[@]}"
  [ ${#hints[@]} -eq 0 ] || printf '%s\n' "${hints[@]}"
  exit 1
fi
