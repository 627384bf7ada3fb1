# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
STAMP := $(VENV)/.installed
SOURCES := pyproject.toml setup.py $(wildcard cython_src/*.pyx cython_src/*.pxd cython_src/include/*.h)

.PHONY: install demo docs-environment test test-deps test-multihost test-fast test-gpu test-mutants test-mpi4py test-mpi4py-ref test-mpi4py-gpu test-mpi4py-demos bench bench-many bench-vector bench-vector-gpu bench-request-cost bench-gloo bench-launch bench-spawn bench-shrink bench-ofi bench-multihost bench-p2p bench-p2p-mpi bench-p2p-mpi-alloc bench-p2p-hosts bench-reproduce bench-gpu calibrate-gpu calibrate-host clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	bash scripts/setup-build-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# An editable install leaves gpucoll's modules uncompiled: where PYTHONDONTWRITEBYTECODE is
	# set, every rank of every job would compile them again (a fifth of a 32-rank job's start).
	$(PY) -m compileall -q gpucoll
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpurun -np $(NP) $(PY) examples/demo.py

# docs/environment.md is made from the declarations in gpucoll/base/config.py;
# tests/test_env_vars.py fails while the two differ.
docs-environment: $(STAMP)
	$(VENV)/bin/gpucoll environment > docs/environment.md

test: $(STAMP) test-deps
	$(PY) -m pytest -q -m "not gpu" --durations=15 tests

# Mutation check: each mutant of tests/mutants/mutants.ini switches one feature off in a scratch
# copy of the repository, and the tests that claim the feature must fail (rebuilding needs Cython).
test-mutants: $(STAMP)
	$(PY) -c "import Cython" 2>/dev/null || $(PY) -m pip install -q 'cython>=3.0'
	$(PY) tests/mutants/run.py

# Slurm + munge started by hand, sshd, iproute2 (as root, where apt exists) and the MPICH
# venv: what the multihost, slurm and MPICH tests need. Tests whose piece is missing skip,
# unless GPUCOLL_TEST_REQUIRE names it: then this step fails (and so would the tests).
test-deps:
	PYTHON=$(PYTHON) bash scripts/setup-test-system.sh

test-multihost: $(STAMP) test-deps
	$(PY) -m pytest -q -m "multihost or slurm or mpi" tests/test_multihost.py tests/test_slurm.py tests/test_mpich.py

# A GPU machine's Python that already holds CuPy (often with no network) gets the package built
# in place (no downloads). GPUCOLL_TEST_REQUIRE=gpu: a missing GPU or a broken CuPy fails the
# run instead of skipping every test. GPU_TESTS picks files (a runner with a per-command time
# limit runs the suite in parts, e.g. GPU_TESTS=tests/test_gpu_collectives.py).
GPU_TESTS ?= tests
test-gpu:
	@$(PYTHON) -c "import cupy" || { echo "make test-gpu: $(PYTHON) cannot import CuPy; install it" \
	  "(pip install cupy-cuda12x or cupy-cuda13x) or pass PYTHON=a Python that has it" >&2; exit 1; }
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	GPUCOLL_TEST_REQUIRE=gpu$${GPUCOLL_TEST_REQUIRE:+,$$GPUCOLL_TEST_REQUIRE} $(PYTHON) -m pytest -q -m gpu $(GPU_TESTS)

# mpi4py's own test suite (fetched from PyPI into .mpi4py-suite/) against gpucoll.MPI on 2, 3 and
# 4 ranks, and the reference: the same suite with real mpi4py on Open MPI under mpiexec.
test-mpi4py: $(STAMP)
	$(PY) tests/mpi4py_suite/run.py --np 2 3 4

test-mpi4py-ref: $(STAMP)
	$(PY) tests/mpi4py_suite/run.py --np 2 3 4 --mpi

# mpi4py's suite with its CuPy back-end (GPU buffers) on a GPU machine whose $(PYTHON) has CuPy and
# mpi4py (as make test-gpu; .mpi4py-suite/ fetched beforehand where there is no network): the
# modules under the image's mpiexec first, then gpucoll.MPI under gpurun (ranks sharing a GPU run
# the IPC kernels) with what passed there and not here. GPU_NP ranks; GPU_MODULES picks modules (a
# runner with a per-command time limit runs the suite in parts); GPU_JOBS modules share the GPU.
GPU_NP ?= 2
GPU_JOBS ?= 2
GPU_MODULES ?=
test-mpi4py-gpu:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	@mkdir -p $(BENCH_OUT)
	-$(PYTHON) tests/mpi4py_suite/run.py --mpi --np 2 --cupy --jobs $(GPU_JOBS) --timeout 600 \
	  $(if $(GPU_MODULES),-m $(GPU_MODULES)) --json $(BENCH_OUT)/mpi4py-gpu-ref.json
	GPUCOLL_GPU_SHARED_IPC=1 $(PYTHON) tests/mpi4py_suite/run.py --np $(GPU_NP) --cupy --jobs $(GPU_JOBS) \
	  --timeout 600 $(if $(GPU_MODULES),-m $(GPU_MODULES)) --json $(BENCH_OUT)/mpi4py-gpu.json \
	  --diff $(BENCH_OUT)/mpi4py-gpu-ref.json --check

# mpi4py's demos (its demo/ folder) under gpurun, unchanged but for the import (the OSU benchmarks too);
# the deterministic ones must print what they print under mpiexec with real mpi4py.
test-mpi4py-demos: $(STAMP)
	$(PY) tests/mpi4py_suite/demos.py --compare


# --- benchmarks: every table of docs/benchmarks.md is printed by one of these targets, which repeats each
# run REPEATS times (median [min-max]), checks every timed result (a wrong one fails the
# target) and writes the settings and every run as JSON under BENCH_OUT.
BENCH_OUT ?= bench-results
REPEATS ?= 3
BENCH := $(VENV)/bin/gpucoll-bench
HOST_SWEEP = -o allreduce -b 1K -e 64M -f 2 -n 200 -w 20 -c 1 --repeats $(REPEATS)
GLOO_SWEEP = -o allreduce -b 8 -e 64M -f 4 -n 30 -w 5 -c 1 --repeats $(REPEATS)
TORCH_PIN = torch==2.13.0

SMALL_SWEEP = -b 1K -e 64K -f 2 -n 200 -w 20 -c 1 --repeats $(REPEATS)

# Host all-reduce beside Open MPI, 2 and 4 ranks; small all-gather, bcast and reduce, 2 ranks.
bench: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(BENCH) -np 2 $(HOST_SWEEP) --vs mpi --json $(BENCH_OUT)/allreduce-mpi-np2.json
	$(BENCH) -np 4 $(HOST_SWEEP) --vs mpi --json $(BENCH_OUT)/allreduce-mpi-np4.json
	$(BENCH) -np 2 -o allgather $(SMALL_SWEEP) --vs mpi --json $(BENCH_OUT)/allgather-mpi-np2.json
	$(BENCH) -np 2 -o bcast $(SMALL_SWEEP) --vs mpi --json $(BENCH_OUT)/bcast-mpi-np2.json
	$(BENCH) -np 2 -o reduce $(SMALL_SWEEP) --vs mpi --json $(BENCH_OUT)/reduce-mpi-np2.json

# Many ranks on one host (CPU ranks; a machine with at least RANKS_MANY cores): every host
# collective at 8 and 16 ranks (RANKS_MANY="8 16"; MANY_KINDS picks collectives, vector: the v forms
# through gpucoll.MPI), 4 B to 64 MiB, beside Open MPI; the table:
# benchmarks/readme_table.py --matrix $(BENCH_OUT)/many-*.json (several invocations pool).
RANKS_MANY ?= 8 16
MANY_KINDS ?= allreduce allgather bcast reduce alltoall reduce_scatter vector
MANY_SWEEP = -b 4 -e 64M -f 8 -n 50 -w 5 -c 1 --no-gpu --repeats $(REPEATS)
bench-many: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	for np in $(RANKS_MANY); do for kind in $(MANY_KINDS); do \
	  if [ $$kind = vector ]; then \
	    $(PY) benchmarks/bench_vector.py --np $$np --repeats $(REPEATS) --json $(BENCH_OUT)/many-vector-np$$np.json || exit 1; \
	  else \
	    $(BENCH) -np $$np -o $$kind $(MANY_SWEEP) --vs mpi --json $(BENCH_OUT)/many-$$kind-np$$np.json || exit 1; \
	  fi; \
	done; done

# Allgatherv and Alltoallv through gpucoll.MPI beside mpi4py, as mpi4py programs write them, 2 ranks.
bench-vector: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_vector.py --np 2 --repeats $(REPEATS) --json $(BENCH_OUT)/vector-np2.json

# Alltoallv and Allgatherv of CuPy arrays through gpucoll.MPI beside Open MPI (where its build is
# CUDA-aware) or NCCL (a GPU per rank), 2 ranks: on a GPU machine, as make test-gpu.
bench-vector-gpu:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	@mkdir -p $(BENCH_OUT)
	$(PYTHON) benchmarks/bench_vector_gpu.py --np 2 --repeats $(REPEATS) --json $(BENCH_OUT)/vector-gpu-np2.json

# What one Isend + Irecv + Waitall per message costs through each API, beside mpi4py.
bench-request-cost: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	for form in array alloc pair bytearray; do \
	  $(PY) benchmarks/bench_request_cost.py --repeats 5 --spec $$form --json $(BENCH_OUT)/request-cost-$$form.json || exit 1; done

# Host all-reduce beside torch.distributed's gloo, 2 and 4 ranks.
bench-gloo: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) -m pip install -q '$(TORCH_PIN)'
	$(BENCH) -np 2 $(GLOO_SWEEP) --vs gloo --json $(BENCH_OUT)/allreduce-gloo-np2.json
	$(BENCH) -np 4 $(GLOO_SWEEP) --vs gloo --json $(BENCH_OUT)/allreduce-gloo-np4.json

bench-p2p: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_p2p.py --repeats $(REPEATS) --json $(BENCH_OUT)/p2p.json

# The same with gpucoll's side through gpucoll.MPI (what a script written for mpi4py runs on).
bench-p2p-mpi: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_p2p.py --api mpi --repeats $(REPEATS) --json $(BENCH_OUT)/p2p-mpi.json

# gpucoll.MPI beside mpi4py with messages as mpi4py's demos write them: [MPI.Alloc_mem(n), n, MPI.BYTE].
bench-p2p-mpi-alloc: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_p2p.py --api mpi --spec alloc --max 16M --repeats $(REPEATS) \
	  --json $(BENCH_OUT)/p2p-mpi-alloc.json

# Point to point between two network-namespace hosts (root): gpucoll's TCP channel beside Open MPI's TCP.
bench-p2p-hosts: $(STAMP) test-deps
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_p2p.py --hosts --repeats $(REPEATS) --json $(BENCH_OUT)/p2p-hosts.json

# Do the host tables reproduce? INVOCATIONS separate runs of `make $(REPRODUCE)` (each REPEATS
# runs), then each invocation's medians against the others' pooled ranges.
INVOCATIONS ?= 3
REPRODUCE ?= bench bench-p2p
bench-reproduce: $(STAMP)
	for i in $$(seq $(INVOCATIONS)); do $(MAKE) $(REPRODUCE) BENCH_OUT=$(BENCH_OUT)/invocation-$$i || exit 1; done
	cd $(BENCH_OUT) && for f in $$(cd invocation-1 && ls *.json); do for i in $$(seq $(INVOCATIONS)); do \
	  echo "== $$f: invocation $$i against the others"; \
	  $(abspath $(PY)) $(CURDIR)/benchmarks/readme_table.py --check invocation-$$i/$$f \
	    $$(for j in $$(seq $(INVOCATIONS)); do [ $$j = $$i ] || echo invocation-$$j/$$f; done) | tail -1; \
	done; done

# Between two network-namespace hosts: gpucoll over OFI, over its own TCP, and libfabric's fi_pingpong
# on the same provider (OFI_PROVIDER), in one run.
OFI_PROVIDER ?= tcp;ofi_rxm
bench-ofi: $(STAMP) test-deps
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_ofi.py --provider '$(OFI_PROVIDER)' --repeats $(REPEATS) --json $(BENCH_OUT)/ofi.json

bench-multihost: $(STAMP) test-deps
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_multihost.py --repeats $(REPEATS) --json $(BENCH_OUT)/multihost.json

# MPI's Spawn to return: gpucoll.MPI under gpurun (warmed, and --no-preload) beside mpi4py under mpiexec.
bench-spawn: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_spawn.py --reps $(REPEATS) --json $(BENCH_OUT)/spawn.json

# From a rank's SIGKILL to a working shrunk communicator: gpurun --on-failure=continue beside
# Open MPI's ULFM (mpiexec --with-ft ulfm), 4 ranks (NP_SHRINK=8 for more).
NP_SHRINK ?= 4
bench-shrink: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_shrink.py --np $(NP_SHRINK) --jobs $$(( $(REPEATS) * 3 )) --json $(BENCH_OUT)/shrink.json

bench-launch: $(STAMP)
	@mkdir -p $(BENCH_OUT)
	$(PY) -m pip install -q '$(TORCH_PIN)'
	$(PY) benchmarks/bench_launch.py --reps $(REPEATS) --json $(BENCH_OUT)/launch.json

# The GPU table, on a machine with 2 GPUs whose $(PYTHON) has CuPy (as make test-gpu);
# GPUS=4 or 8 runs the same commands on that many GPUs.
GPUS ?= 2
bench-gpu:
	OUT=$(BENCH_OUT)/gpu TESTS=0 NP=$(GPUS) PYTHON=$(PYTHON) bash benchmarks/bench_gpu_all.sh

# The host rows of the cost table fitted on this machine, for 2, 4, 8, ... ranks up to its CPUs
# (NP_HOST="8 16" for others): one-shot/two-shot crossover of the direct engine, schedules.
calibrate-host: $(STAMP)
	$(PY) benchmarks/calibrate_host.py --out $(BENCH_OUT)/calibrate-host $(if $(NP_HOST),--np $(NP_HOST))

# The GPU rows of the cost table fitted on this machine's GPUs (one rank per GPU).
calibrate-gpu:
	$(PYTHON) benchmarks/calibrate_gpu.py --out $(BENCH_OUT)/calibrate

clean:
	rm -rf build $(VENV) .venv-mpich *.egg-info gpucoll/_native/*.so cython_src/*.c .mpi4py-suite
