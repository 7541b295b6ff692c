#!/usr/bin/env bash
# Install every wheel in DIR into a fresh venv of its Python version and import it.
# torch comes from PyPI (or pip's cache) as the wheel's dependency.
set -euo pipefail
dir=${1:-dist}
shopt -s nullglob
wheels=("$dir"/fastmodule-*.whl)
[ ${#wheels[@]} -gt 0 ] || { echo "no wheels in $dir" >&2; exit 1; }
for whl in "${wheels[@]}"; do
  tag=$(basename "$whl" | sed -E 's/.*-cp([0-9])([0-9]+)-.*/\1.\2/')
  var="PY${tag/./}"
  py=${!var:-$(command -v "python$tag")}
  venv=$(mktemp -d)/venv
  echo "== $whl with $py"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "$whl"
  (cd / && "$venv/bin/python" -c '
import torch, fastmodule
class M(fastmodule.Module):
    def forward(self, x):
        return x + 1
m = M()
m.w = torch.nn.Parameter(torch.zeros(1))
assert m(torch.zeros(1)).item() == 1.0 and fastmodule.slots_of(M) == (True, True, True)
seq = fastmodule.accelerate(torch.nn.Sequential(torch.nn.Linear(2, 2)))
assert fastmodule.is_accelerated(seq[0]) and list(seq.state_dict()) == ["0.weight", "0.bias"]
from fastmodule import inline_routes
print("ok", fastmodule.__version__, "torch", torch.__version__,
      "torch functions prefixed (3.11 only):", len(inline_routes.prefixed()))
')
  rm -rf "$(dirname "$venv")"
done
