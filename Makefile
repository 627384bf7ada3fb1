# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
STAMP := $(VENV)/.installed
SOURCES := pyproject.toml setup.py $(wildcard cython_src/*.pyx cython_src/*.pxd cython_src/include/*.h)

.PHONY: install demo test test-fast test-gpu bench bench-launch clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpurun -np $(NP) $(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -m "not gpu" --durations=15 tests

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests

bench: $(STAMP)
	$(VENV)/bin/gpucoll-bench --vs mpi -np 2 -b 8 -e 64M -f 4

bench-launch: $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.0'
	$(PY) benchmarks/bench_launch.py

clean:
	rm -rf build $(VENV) *.egg-info gpucoll/_native/*.so cython_src/*.c
