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

.PHONY: setup build-dev build-prod test test-debug test-memcheck bench bench-instructions lint \
	check-py314 wheels check-wheels clean

# One seed orders the tests (pytest-randomly) and picks hypothesis's examples. Each
# test target prints it first; `make test SEED=N` replays that run exactly.
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
PYTEST_ARGS = tests -q -p no:cacheprovider \
	-p randomly --randomly-seed=$(SEED) --hypothesis-seed=$(SEED)

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# maturin goes into the venv itself: `maturin develop` needs its own script.
	$(VPY) -m pip install -q --ignore-installed "maturin>=1.5,<2"
	$(VPY) -m pip install -q "torch>=2.11,<3" \
		"pytest>=8" "pytest-benchmark>=4" "pytest-randomly>=3.15" "hypothesis>=6" numpy \
		"ruff>=0.5" \
		expecttest transformers timm matplotlib
	touch $@

setup: $(VENV)/.ready

build-dev: setup
	$(VENV)/bin/maturin develop

build-prod: setup
	$(VENV)/bin/maturin develop --release

test: build-prod
	@echo "test seed: $(SEED) (replay this order: make test SEED=$(SEED))"
	$(VPY) -m pytest $(PYTEST_ARGS)

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

bench: build-prod
	$(VPY) -m fastmodule bench

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

# The crate against pyo3's definitions for CPython 3.14 (.ci/pyo3-py314.cfg: a
# shared, non-free-threaded 3.14; no interpreter needed), in a target folder of
# its own so the extension's build is not invalidated. Compiling is all it
# shows: at run time an interpreter fastmodule has not verified runs stock.
check-py314:
	PYO3_CONFIG_FILE=$(abspath .ci/pyo3-py314.cfg) cargo check --lib --target-dir target/py314

# Release wheels for CPython 3.11 and 3.12 (x86_64 manylinux), then install
# each into a clean venv and import it.
wheels:
	rm -rf dist
	$(VENV)/bin/maturin build --release --out dist \
		--interpreter $(PY311) $(PY312)
	$(MAKE) check-wheels

check-wheels:
	PY311=$(PY311) PY312=$(PY312) bash scripts/check_wheels.sh dist

clean:
	rm -rf target dist $(VENV) python/fastmodule/*.so
