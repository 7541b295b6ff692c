# fastmodule developer tasks. Everything runs in ./.venv, created on first use
# with access to the system site-packages (so an installed torch is reused;
# on a fresh machine torch is installed into the venv once).
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))

# An interpreter for each wheel: python3.X on PATH if it runs, else pyenv's.
find_py = $(shell for p in python$(1) $$HOME/.pyenv/versions/$(1).*/bin/python$(1); do \
	"$$p" -c '' 2>/dev/null && { command -v "$$p"; break; }; done)
PY311 ?= $(call find_py,3.11)
PY312 ?= $(call find_py,3.12)
PY313 ?= $(call find_py,3.13)

# The tested matrix: each CPython the package declares × the oldest torch it declares
# and the latest on PyPI (bump TORCH_LATEST when a newer one ships).
MATRIX_PYS := 3.11 3.12 3.13
TORCH_OLDEST := 2.11
TORCH_LATEST := 2.15
# One cell: `make test-cell PY=3.12 TORCH=2.11` (set on the command line, not from the
# environment, as TESTS and REPROS below).
PY := 3.11
TORCH := $(TORCH_LATEST)

.PHONY: setup build-dev build-prod test test-unverified test-repros test-threads test-cell \
	test-matrix test-debug test-memcheck bench bench-instructions lint check-next-python wheels \
	check-wheels gpu-check gpu-check-dry gpu-check-bundle test-aarch64 test-py314 clean

# One seed orders the tests (pytest-randomly) and picks hypothesis's examples. Each
# test target prints it first; `make test SEED=N` replays that run exactly.
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
# TESTS: what pytest runs (default the whole suite; `make test-matrix TESTS=tests/test_x.py`).
TESTS := tests
PYTEST_ARGS = $(TESTS) -q -p no:cacheprovider \
	-p randomly --randomly-seed=$(SEED) --hypothesis-seed=$(SEED)

# What `setup` installs beside torch; each matrix cell installs the same.
TEST_TOOLS := "pytest>=8" "pytest-benchmark>=4" "pytest-randomly>=3.15" "hypothesis>=6" numpy \
	"ruff>=0.5" expecttest transformers timm matplotlib peft lightning

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# maturin goes into the venv itself: `maturin develop` needs its own script.
	$(VPY) -m pip install -q --ignore-installed "maturin>=1.5,<2"
	$(VPY) -m pip install -q "torch>=2.11,<3" $(TEST_TOOLS)
	touch $@

setup: $(VENV)/.ready

build-dev: setup
	$(VENV)/bin/maturin develop

# The release build's output (cargo's and maturin's, and pip's lines about what is
# already installed) goes to target/build.log; shown only when the build fails.
build-prod: setup
	@mkdir -p target
	@echo "building the release extension (log: target/build.log)"
	@PIP_QUIET=1 $(VENV)/bin/maturin develop --release -q >target/build.log 2>&1 || \
		{ cat target/build.log; echo "release build failed (log above: target/build.log)"; exit 1; }

test: build-prod
	@echo "test seed: $(SEED) (replay this order: make test SEED=$(SEED))"
	$(VPY) -m pytest $(PYTEST_ARGS)

# The thread-stress suite (tests/test_thread_stress.py, part of `make test` at a fraction of a
# second per scenario) for longer: each scenario on each side stresses STRESS_SECONDS.
STRESS_SECONDS := 20
test-threads: build-prod
	@echo "test-threads seed: $(SEED) (replay: make test-threads SEED=$(SEED))"
	FASTMODULE_STRESS_SECONDS=$(STRESS_SECONDS) $(VPY) -m pytest tests/test_thread_stress.py -q \
		-p no:cacheprovider -p randomly --randomly-seed=$(SEED)

# The suite in the stock fallback an interpreter fastmodule has not verified gets
# (FASTMODULE_UNVERIFIED=1: no native path on): the parity tests must pass there; the
# tests of what only the native paths do skip, each with its reason (requires_native,
# tests/conftest.py).
test-unverified: build-prod
	@echo "test-unverified seed: $(SEED) (replay: make test-unverified SEED=$(SEED))"
	FASTMODULE_UNVERIFIED=1 $(VPY) -m pytest $(PYTEST_ARGS)

# The shared reproducers of confirmed defects (../shared/reference/repros, beside the
# repository; skipped where a checkout has no such folder), each on stock and on
# fastmodule with .venv's python (REPROS=PATH/run.sh names another copy); one known to be
# nondeterministic in CPython itself is rerun once (scripts/run_repros.sh says which, why).
REPROS := $(abspath ..)/shared/reference/repros/run.sh
test-repros: build-prod
	@if [ -f $(REPROS) ]; then PYTHON=$(abspath $(VPY)) bash scripts/run_repros.sh $(REPROS); \
	else echo "repros skipped: $(REPROS) not found (a checkout without ../shared)"; fi

# One cell of the matrix in its own venv (.venv-pyPY-torchTORCH, gitignored; torch
# TORCH.* from PyPI, installed once): release build, the suite in SEED's order, the repros.
# DEBUG=1: the suite under the debug allocator and development mode, as test-debug.
DEBUG := 0
test-cell:
	@REPROS=$(REPROS) TESTS="$(TESTS)" DEBUG=$(DEBUG) bash scripts/test_cell.sh \
		$(PY) $(TORCH) $(SEED) "$(call find_py,$(PY))" $(TEST_TOOLS)

# All six cells, one seed for all, whatever fails; a table of counts and seconds at the end
# (DEBUG=1: each suite under the debug allocator and development mode, as CI's cells).
# LANES=3: one lane per Python version at once (each cell single-threaded; logs in
# target/matrix/, shown at the end).
LANES := 1
test-matrix:
	@echo "test-matrix seed: $(SEED) (replay one cell: make test-cell PY=.. TORCH=.. SEED=$(SEED))"
	@LANES=$(LANES) bash scripts/test_matrix.sh "$(MATRIX_PYS)" "$(TORCH_OLDEST) $(TORCH_LATEST)" \
		SEED=$(SEED) DEBUG=$(DEBUG)

# The suite again under CPython's debug allocator (buffer over/underruns, use after
# free of Python memory, API misuse without the GIL) and development mode; a warning
# attributed to fastmodule's own code is an error (the regex matches every
# fastmodule.* module; torch's warnings stay warnings).
test-debug: build-prod
	@echo "test-debug seed: $(SEED) (replay: make test-debug SEED=$(SEED))"
	PYTHONMALLOC=debug $(VPY) -X dev -m pytest $(PYTEST_ARGS) \
		-o "filterwarnings=error:::fastmodule"

# Every native entry point a few times under valgrind's memcheck (needs valgrind;
# 6-11 min on 2 cores, most of it importing torch): fails on an invalid read/write,
# a use of uninitialised memory or a definite leak with a fastmodule frame in its
# stack. CPython's and torch's own noise is suppressed (tests/memcheck/python-torch.supp)
# or summarised without failing.
test-memcheck: build-prod
	bash tests/memcheck/run.sh $(VPY)

# The whole suite and the repros on CPython 3.14 with the latest torch, in a Debian root
# holding forky's python3.14 (built once under ~/.cache/fastmodule and reused; torch
# and the test tools downloaded by the host's pip for cp314 and installed inside). Needs
# root, debootstrap and unshare (scripts/py314/lane.sh says what each phase does).
# DEBUG=1: the suite under the debug allocator and development mode, as CI's cells.
# (No dependency on setup: CI runs this lane while the front lane makes .venv.)
test-py314:
	@TESTS="$(TESTS)" SEED=$(SEED) TORCH=$(TORCH_LATEST) DEBUG=$(DEBUG) PIP_PYTHON=$(PY311) \
		REPROS=$(REPROS) TOOLS='$(TEST_TOOLS)' bash scripts/py314/lane.sh

bench: build-prod
	@$(VPY) -m fastmodule bench

# Instruction counts (callgrind; needs valgrind and a C compiler): steady where
# wall-clock times on a shared machine are not.
bench-instructions: build-prod
	$(VPY) benches/instructions.py mlp64_accelerated tree_train tree_parameters --loops 10

bench-pytest: build-prod
	$(VPY) -m pytest benches --benchmark-only -q

lint: setup
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	$(VPY) -m ruff check python tests benches scripts
	$(VPY) -m ruff format --check python tests benches scripts
	$(VPY) scripts/py_graph.py

# The crate type-checks against pyo3's definitions of the next CPython (3.15, which
# torch ships no wheels for yet) and of free-threaded 3.14 (refused at run time, so that
# it keeps compiling), from the checked-in configs in .ci/ (no interpreter needed). 3.14
# itself is built and tested by test-py314.
check-next-python:
	PYO3_CONFIG_FILE=$(abspath .ci/pyo3-py315.cfg) cargo check --lib --target-dir target/py315
	PYO3_CONFIG_FILE=$(abspath .ci/pyo3-py314t.cfg) cargo check --lib --target-dir target/py314t

# Portable release wheels: CPython 3.11, 3.12, 3.13 and 3.14 for each architecture in ARCHS,
# tagged manylinux_2_28. zig (the `ziglang` package from PyPI) links them against
# glibc 2.28's symbols whatever the build machine's glibc, and cross-links aarch64.
# A wheel of another architecture needs Rust's std for its target (`rustup target
# add`); without it that architecture is skipped with a message saying so, and
# check-wheels fails on its missing wheels (`make wheels ARCHS=x86_64` leaves it out).
# One wheel at a time; the time each build takes is printed.
ARCHS ?= x86_64 aarch64
WHEEL_VERSIONS := 3.11 3.12 3.13 3.14
MANYLINUX := manylinux_2_28
HOST_ARCH := $(shell uname -m)
# check-wheels installs each wheel of this machine's architecture into a clean venv
# (no system site-packages) and runs scripts/smoke_wheel.py there. torch for those
# venvs: an interpreter in TORCH_FROM of the venv's version lends its installed torch
# through a .pth file (written after the wheel is installed; saves downloading torch
# per version); other versions get torch from PyPI. E.g. on a machine with torch for
# each version: make wheels TORCH_FROM="$(VPY) /path/py312/bin/python /path/py313/bin/python"
TORCH_FROM ?= $(abspath $(VPY))

$(VENV)/.wheel-tools: $(VENV)/.ready
	$(VPY) -m pip install -q "ziglang>=0.13" "auditwheel>=6"
	touch $@

wheels: $(VENV)/.wheel-tools
	rm -rf dist
	@set -e; for arch in $(ARCHS); do \
	  target=$$arch-unknown-linux-gnu; \
	  if ! ls "$$(rustc --print target-libdir --target $$target 2>/dev/null)"/libstd-*.rlib \
	      >/dev/null 2>&1; then \
	    echo "*** $$arch wheels NOT built: Rust's std for $$target is not installed."; \
	    echo "*** Install it with: rustup target add $$target"; \
	    echo "*** (or build without them: make wheels ARCHS=$(HOST_ARCH))"; \
	    continue; \
	  fi; \
	  if [ $$arch = $(HOST_ARCH) ]; then pys="$(PY311) $(PY312) $(PY313) $(PY314_WHEEL)"; \
	  else pys="$(addprefix python,$(WHEEL_VERSIONS))"; fi; \
	  for py in $$pys; do \
	    start=$$(date +%s); cfg=; \
	    case $$py in *3.14*) cfg=$(abspath .ci/pyo3-py314.cfg);; esac; \
	    env $${cfg:+PYO3_CONFIG_FILE=$$cfg} PATH="$(abspath $(VENV))/bin:$$PATH" \
	      $(VENV)/bin/maturin build \
	      --release --zig --compatibility $(MANYLINUX) --target $$target --out dist \
	      --interpreter $$py; \
	    echo "*** built $$arch wheel for $$py in $$(( $$(date +%s) - start ))s"; \
	  done; \
	done
	$(MAKE) check-wheels

# The host's cp314 wheel: built against the 3.14 root's interpreter (make test-py314
# builds the root; maturin asks it about itself through scripts/py314/in_root.sh) and
# the checked-in pyo3 config, smoke-tested inside the root by check-wheels.
PY314_WHEEL := $(abspath scripts/py314/python3.14)

check-wheels: $(VENV)/.wheel-tools
	PY311=$(PY311) PY312=$(PY312) PY313=$(PY313) AUDITWHEEL=$(VENV)/bin/auditwheel \
		VERSIONS="$(WHEEL_VERSIONS)" ARCHS="$(ARCHS)" \
		MAX_GLIBC_MINOR=$(lastword $(subst _, ,$(MANYLINUX))) \
		TORCH_FROM="$(TORCH_FROM)" bash scripts/check_wheels.sh dist

# The CUDA check, to carry to a machine with a CUDA device, CPython 3.12 and torch, without
# Rust or network (docs/development.md): target/gpu-check/bundle holds the cp312 x86_64
# wheel (maturin + zig, manylinux_2_28, as `make wheels`; cargo's files in
# target/gpu-check/cargo) and scripts/gpu_check/ with scripts/smoke_wheel.py, and
# target/gpu-check/fastmodule-gpu-check.tar.gz is the same as one file. `make gpu-check`
# builds it, then runs it where nvidia-smi sees a device (output in target/gpu-check/out)
# and says how to carry it where not. DRY_RUN=1 (or `make gpu-check-dry`): the bundle's
# run.sh --dry-run here, on the CPU, with GPU_CHECK_PYTHON (a CPython 3.12 with torch; by
# default the matrix cell's venv) as the system interpreter; output in
# target/gpu-check/dry-out.
GPU_CHECK := target/gpu-check
GPU_CHECK_PYTHON ?= $(firstword $(wildcard .venv-py3.12-torch*/bin/python) $(PY312))
DRY_RUN := 0

gpu-check-bundle: $(VENV)/.wheel-tools
	@test -n "$(PY312)" || { echo "gpu-check needs CPython 3.12 (python3.12 on PATH or pyenv's; PY312=...)"; exit 1; }
	@rm -rf $(GPU_CHECK)/bundle && mkdir -p $(GPU_CHECK)/bundle
	@echo "building the cp312 x86_64 wheel (log: $(GPU_CHECK)/build.log)"
	@start=$$(date +%s); \
	CARGO_TARGET_DIR=$(abspath $(GPU_CHECK))/cargo PATH="$(abspath $(VENV))/bin:$$PATH" \
	  $(VENV)/bin/maturin build --release --zig --compatibility $(MANYLINUX) \
	  --target x86_64-unknown-linux-gnu --out $(GPU_CHECK)/bundle --interpreter $(PY312) \
	  >$(GPU_CHECK)/build.log 2>&1 || { cat $(GPU_CHECK)/build.log; echo "wheel build failed"; exit 1; }; \
	echo "wheel built in $$(( $$(date +%s) - start ))s"
	@cp scripts/gpu_check/run.sh scripts/gpu_check/gpu_check.py scripts/gpu_check/parity.py \
		scripts/smoke_wheel.py $(GPU_CHECK)/bundle/
	@tar -czf $(GPU_CHECK)/fastmodule-gpu-check.tar.gz -C $(GPU_CHECK) bundle
	@echo "bundle: $(GPU_CHECK)/bundle ($$(du -sh $(GPU_CHECK)/bundle | cut -f1)), as one file:" \
		"$(GPU_CHECK)/fastmodule-gpu-check.tar.gz ($$(du -sh $(GPU_CHECK)/fastmodule-gpu-check.tar.gz | cut -f1))"

gpu-check: gpu-check-bundle
ifeq ($(DRY_RUN),1)
	@test -n "$(GPU_CHECK_PYTHON)" || { echo "the dry run needs a CPython 3.12 with torch" \
		"(make test-cell PY=3.12 TORCH=2.11 makes one; or GPU_CHECK_PYTHON=...)"; exit 1; }
	@echo "dry run of the bundle on the CPU with $(GPU_CHECK_PYTHON)"
	@start=$$(date +%s); \
	PYTHON=$(abspath $(GPU_CHECK_PYTHON)) OUT=$(abspath $(GPU_CHECK))/dry-out \
		bash $(GPU_CHECK)/bundle/run.sh --dry-run; rc=$$?; \
	echo "gpu-check dry run: exit status $$rc in $$(( $$(date +%s) - start ))s" \
		"(output: $(GPU_CHECK)/dry-out)"; exit $$rc
else
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  OUT=$(abspath $(GPU_CHECK))/out bash $(GPU_CHECK)/bundle/run.sh; \
	else \
	  echo "no CUDA device here (nvidia-smi sees none). Carry the bundle to a machine with one:"; \
	  echo "  scp $(GPU_CHECK)/fastmodule-gpu-check.tar.gz HOST:  # a few MB"; \
	  echo "  there: tar -xzf fastmodule-gpu-check.tar.gz && bash bundle/run.sh  # 8 min at most"; \
	  echo "  and bring back ./gpu-check-out (summary.txt, summary.json, the JSON of each phase, logs/)"; \
	fi
endif

gpu-check-dry:
	@$(MAKE) --no-print-directory gpu-check DRY_RUN=1

# The cp311 aarch64 wheel imported and tested on an aarch64 CPython (Debian bookworm's
# 3.11, torch TORCH_LATEST.* from PyPI) under qemu user-mode emulation, in a chroot; not
# in CI. Needs root, qemu-user-static, binfmt-support, debootstrap and Rust's std for
# aarch64 (scripts/aarch64/test_aarch64.sh says what is missing). The root (AARCH64_ROOT,
# gitignored, about 6 GB, kept by `make clean`) is built on first use and reused;
# cargo's files, the wheel and the logs go to target/aarch64. AARCH64_TESTS: what pytest
# runs there (files chosen to need neither transformers nor a fresh Python process).
AARCH64_ROOT := .aarch64-root
AARCH64_TESTS := tests/test_parity_call.py tests/test_parity_getattr.py \
	tests/test_parity_registration.py tests/test_parity_traversal.py \
	tests/test_parity_state_dict.py tests/test_parity_load_state_dict.py \
	tests/test_parity_conversion.py tests/test_parity_layers.py

test-aarch64: $(VENV)/.wheel-tools
	@echo "test-aarch64 seed: $(SEED) (replay: make test-aarch64 SEED=$(SEED))"
	@ROOT=$(AARCH64_ROOT) TESTS="$(AARCH64_TESTS)" SEED=$(SEED) TORCH=$(TORCH_LATEST) \
		VENV=$(VENV) MANYLINUX=$(MANYLINUX) LOGS=target/aarch64 \
		bash scripts/aarch64/test_aarch64.sh

clean:
	rm -rf target dist $(VENV) .venv-py* python/fastmodule/*.so
