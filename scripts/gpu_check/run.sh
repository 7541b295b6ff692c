#!/usr/bin/env bash
# fastmodule's CUDA check, carried as one folder: this script, gpu_check.py, parity.py,
# smoke_wheel.py and the cp312 x86_64 wheel (`make gpu-check` in the repository builds
# it: target/gpu-check/bundle, and a .tar.gz of it). On a machine with a CUDA device,
# CPython 3.12 and torch installed (transformers and timm for the real-model cases),
# without Rust or network access:
#
#   bash run.sh              # prove and measure on the CUDA device: 8 minutes at most
#   bash run.sh --dry-run    # the same phases on the CPU, bench --quick (no CUDA needed)
#
# It makes a venv that sees the interpreter's packages (--system-site-packages; where
# torch lives elsewhere, a .pth file adds the interpreter's site folders), installs the
# wheel into it (pip --no-deps --no-index; without pip, unzipped), then runs gpu_check.py:
# env, smoke, doctor, parity, the bench groups, the summary and a check of what was
# written (gpu_check.py's docstring lists each phase and file).
#
# Environment:
#   OUT       output folder (default ./gpu-check-out); this script's own files in it are
#             replaced, nothing else there is touched
#   PYTHON    the interpreter to use (default: the first of python3.12, python3, python
#             that is CPython 3.12 and imports torch)
#   BUDGET_S  the whole run's seconds, setup included (default 480)
#   VENV      where the venv goes (default: a temporary folder, removed at the end)
# Exit status: 0 all passed; 1 a mismatch or a failed phase; 2 incomplete (a phase ran
# out of time or was skipped for time); 3 no CUDA device (without --dry-run); 4 setup
# failed (no interpreter, no wheel, the install).
set -uo pipefail
started=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "usage: bash run.sh [--dry-run]" >&2; exit 4 ;;
esac
budget=${BUDGET_S:-480}
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out" || exit 4
out=$(cd "$out" && pwd)
rm -rf "$out/logs" "$out"/{env,doctor,parity,summary}.json "$out"/bench-*.json "$out/summary.txt"
mkdir -p "$out/logs"
log=$out/logs/setup.log
say() { echo "gpu-check: $*" | tee -a "$log"; }
fail() { say "$*"; exit 4; }

# No network: nothing may try (pip's index, Hugging Face's hub).
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

shopt -s nullglob
wheels=("$here"/fastmodule-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one fastmodule wheel in $here, found ${#wheels[@]}"
wheel=${wheels[0]}
# cp312 -> 3.12
tag=$(basename "$wheel" | cut -d- -f3)
want="${tag:2:1}.${tag:3}"
say "wheel $(basename "$wheel") (CPython $want); output in $out"

py=
for p in ${PYTHON:-} "python$want" python3 python; do
  if "$p" -c "import sys, torch; assert '%d.%d' % sys.version_info[:2] == '$want'" \
      >>"$log" 2>&1; then
    py=$(command -v "$p")
    break
  fi
done
[ -n "$py" ] || fail "no CPython $want that imports torch (tried ${PYTHON:-} python$want python3 python; set PYTHON)"
say "interpreter $py ($("$py" -c 'import torch; print("torch", torch.__version__)'))"

if [ -n "${VENV:-}" ]; then
  venv=$VENV
  rm -rf "$venv"
else
  tmp=$(mktemp -d)
  venv=$tmp/venv
  trap 'rm -rf "$tmp"' EXIT
fi
if ! "$py" -m venv --system-site-packages "$venv" >>"$log" 2>&1; then
  say "venv with pip failed (no ensurepip?); making one without pip"
  rm -rf "$venv"
  "$py" -m venv --without-pip --system-site-packages "$venv" >>"$log" 2>&1 || fail "venv failed (log: $log)"
fi
vpy=$venv/bin/python
pip_args=(install -q --no-deps --no-index --no-cache-dir --force-reinstall "$wheel")
if "$vpy" -m pip --version >>"$log" 2>&1; then
  "$vpy" -m pip "${pip_args[@]}" >>"$log" 2>&1 || fail "pip install failed (log: $log)"
elif "$py" -m pip --python "$vpy" --version >>"$log" 2>&1; then
  "$py" -m pip --python "$vpy" "${pip_args[@]}" >>"$log" 2>&1 || fail "pip install failed (log: $log)"
else
  say "no pip: unzipping the wheel into the venv"
  "$vpy" -c "import sys, sysconfig, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sysconfig.get_paths()['platlib'])" \
    "$wheel" >>"$log" 2>&1 || fail "unzipping the wheel failed (log: $log)"
fi
# torch from a venv or conda interpreter is not in the system site folders: add the
# interpreter's own (after the wheel is in, so pip never saw them; the venv's
# site-packages stays first, so its fastmodule is the one imported).
if ! "$vpy" -c "import torch" >>"$log" 2>&1; then
  site=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
  "$py" -c "
import site, sys
dirs = [*site.getsitepackages(), site.getusersitepackages()]
dirs += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]
print('\n'.join(dict.fromkeys(dirs)))" >"$site/_gpu_check_interpreter.pth"
  "$vpy" -c "import torch" >>"$log" 2>&1 || fail "torch does not import in the venv (log: $log)"
  say "torch made visible through $site/_gpu_check_interpreter.pth"
fi
say "setup done in $(($(date +%s) - started)) s"

if [ $dry = 1 ]; then device=cpu; else device=cuda; fi
cmd=("$vpy" "$here/gpu_check.py" run --out "$out" --device $device --installed
  --started "$started" --budget-s "$budget")
[ $dry = 1 ] && cmd+=(--dry-run)
# A last guard: the phases keep their own timeouts within the budget.
left=$((budget + 60 - ($(date +%s) - started)))
if command -v timeout >/dev/null; then cmd=(timeout -k 10 "$left" "${cmd[@]}"); fi
"${cmd[@]}" 2>&1 | tee "$out/logs/run.log"
rc=${PIPESTATUS[0]}
say "finished in $(($(date +%s) - started)) s, exit status $rc; summary: $out/summary.txt"
exit "$rc"
