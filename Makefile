# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
STAMP := $(VENV)/.installed
SOURCES := pyproject.toml setup.py $(wildcard cython_src/*.pyx cython_src/*.pxd cython_src/include/*.h)

.PHONY: install demo test test-deps test-multihost test-fast test-gpu test-mpi4py test-mpi4py-ref bench bench-launch bench-multihost bench-p2p clean

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

# mpi4py's own test suite (fetched from PyPI into .mpi4py-suite/) against gpucoll.MPI on 2, 3 and
# 4 ranks, and the reference: the same suite with real mpi4py on Open MPI under mpiexec.
test-mpi4py: $(STAMP)
	$(PY) tests/mpi4py_suite/run.py --np 2 3 4

test-mpi4py-ref: $(STAMP)
	$(PY) tests/mpi4py_suite/run.py --np 2 --mpi

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
	rm -rf build $(VENV) .venv-mpich *.egg-info gpucoll/_native/*.so cython_src/*.c .mpi4py-suite
