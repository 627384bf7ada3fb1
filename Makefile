# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
STAMP := $(VENV)/.installed
SOURCES := pyproject.toml setup.py $(wildcard cython_src/*.pyx cython_src/*.pxd cython_src/include/*.h)

.PHONY: install demo test test-deps test-multihost test-fast test-gpu test-mutants bench bench-launch bench-multihost bench-p2p clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpurun -np $(NP) $(PY) examples/demo.py

test: $(STAMP) test-deps
	$(PY) -m pytest -q -m "not gpu" --durations=15 tests

# Mutation check: each mutant of tests/mutants/mutants.ini switches one feature off in a scratch
# copy of the repository, and the tests that claim the feature must fail (rebuilding needs Cython).
test-mutants: $(STAMP)
	$(PY) -c "import Cython" 2>/dev/null || $(PY) -m pip install -q 'cython>=3.0'
	$(PY) tests/mutants/run.py

# Slurm + munge started by hand, sshd, iproute2 (as root, where apt exists) and the MPICH
# venv: what the multihost, slurm and MPICH tests need. Tests whose piece is missing skip.
test-deps:
	PYTHON=$(PYTHON) bash scripts/setup-test-system.sh

test-multihost: $(STAMP) test-deps
	$(PY) -m pytest -q -m "multihost or slurm or mpi" tests/test_multihost.py tests/test_slurm.py tests/test_mpich.py

# A GPU machine's Python that already holds CuPy (often with no network) gets the package built
# in place (no downloads); elsewhere the venv is used and the GPU tests skip without a GPU.
test-gpu:
	@if $(PYTHON) -c "import cupy" 2>/dev/null; then \
	  $(PYTHON) -m pip install -q --no-build-isolation --no-deps -e . && $(PYTHON) -m pytest -q -m gpu tests; \
	else \
	  $(MAKE) --no-print-directory $(STAMP) && $(PY) -m pytest -q -m gpu tests; \
	fi

bench: $(STAMP)
	$(VENV)/bin/gpucoll-bench --vs mpi -np 2 -b 8 -e 64M -f 4

bench-multihost: $(STAMP) test-deps
	$(PY) benchmarks/bench_multihost.py

bench-p2p: $(STAMP)
	$(PY) benchmarks/bench_p2p.py

bench-launch: $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.0'
	$(PY) benchmarks/bench_launch.py

clean:
	rm -rf build $(VENV) .venv-mpich *.egg-info gpucoll/_native/*.so cython_src/*.c
