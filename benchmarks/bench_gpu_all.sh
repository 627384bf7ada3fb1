#!/bin/bash
# The GPU tables of docs/benchmarks.md on a 2-GPU machine (`make bench-gpu`), then `make test-gpu`'s
# tests in what is left of the budget (skipped with TESTS=0); logs and JSON under $OUT.
#   [NP=4] bench_gpu_all.sh [BUDGET_SECONDS]
# Every row is checked (-c 1: the timed calls' own output) and repeated (--repeats 3: median
# and range). NVLink multicast stays off in everything started from here (gpucoll-bench sets
# the same and prints them in the table's preamble).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpucoll-out}; mkdir -p "$OUT"
BUDGET=${1:-600}
NP=${NP:-2}  # ranks, one per GPU
PY=${PYTHON:-python3}
left() { echo $((BUDGET - SECONDS)); }
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m | head -4
  $PY -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -iE "^error|error:" | head
  $PY -c "import cupy, gpucoll._native.cuda as c; print('cupy', cupy.__version__, 'gpus', c.device_count())"
} > "$OUT/setup.log" 2>&1
cat "$OUT/setup.log"; echo "setup done at ${SECONDS}s"
failed=0
run() {  # name timeout [VAR=value ...] gpucoll-bench args...
  local name=$1 t=$2; shift 2
  local envs=()
  while [[ "$1" == *=* && "$1" != -* ]]; do envs+=("$1"); shift; done
  env "${envs[@]}" timeout "$t" $PY -m gpucoll.bench -np "$NP" --repeats 3 -c 1 --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  local rc=$?; [ $rc = 0 ] || failed=1
  echo "== $name rc=$rc at ${SECONDS}s: ${envs[*]} gpucoll-bench -np $NP --repeats 3 -c 1 $*"
  grep -vE "^# (measuring|run |Using)" "$OUT/$name.log" | grep -v "^#  Rank" | cut -c1-200
}
# Eager launches, 8 B to 1 GiB; gpucoll registers the callers' buffers above
# GPUCOLL_GPU_STAGE_MAX (64 MiB), NCCL copies through its own (cupy.cuda.nccl has no
# ncclCommRegister): the "registered" rows.
run allreduce 300 -o allreduce -b 8 -e 1G -f 4 -n 500 -w 50 --vs nccl
run graph 120 -o allreduce -b 8 -e 64K -f 8 -n 1000 -w 20 -G 100 --vs nccl
# Small calls of the other kinds (eager), and groups of 100 all-reduces (comm.group() against
# ncclGroupStart/End); CuPy's NCCL has no all-to-all: torch's (NCCL send/recv) is its peer.
for kind in allgather reduce_scatter bcast; do
  run small_$kind 120 -o $kind -b 8 -e 32K -f 4 -n 500 -w 50 --vs nccl
done
run small_alltoall 120 -o alltoall -b 8 -e 32K -f 4 -n 500 -w 50 --vs torch
# The other kinds from 1 MiB up (through staging to 64 MiB, registered buffers above).
for kind in allgather reduce_scatter bcast; do
  run medium_$kind 180 -o $kind -b 1M -e 256M -f 4 -n 100 -w 10 --vs nccl
done
run group 120 -o allreduce -b 4K -e 64K -f 16 -n 1000 -w 100 --group 100 --vs nccl
run allgather 120 -o allgather -b 1G -e 1G -n 20 -w 3 --vs nccl
run bcast 120 -o bcast -b 1G -e 1G -n 20 -w 3 --vs nccl
# The same large rows with gpucoll on its staging buffers too (no registration on either side).
run allreduce_staged 120 GPUCOLL_ALGO=two-shot GPUCOLL_GPU_STAGE_MAX=512M -o allreduce -b 512M -e 512M -n 50 -w 5 --vs nccl
run allgather_staged 120 GPUCOLL_ALGO=staged GPUCOLL_GPU_STAGE_MAX=1G -o allgather -b 1G -e 1G -n 20 -w 3 --vs nccl
run bcast_staged 120 GPUCOLL_ALGO=staged GPUCOLL_GPU_STAGE_MAX=1G -o bcast -b 1G -e 1G -n 20 -w 3 --vs nccl
# Through host memory (P2P off): all-reduce in pinned chunks overlapped with the host collective,
# beside the whole buffer at once (GPUCOLL_GPU_HOST_CHUNK=0), and NCCL kept off P2P and shared memory.
run host_pipelined 240 GPUCOLL_P2P_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -o allreduce -b 64K -e 256M -f 4 -n 20 -w 3 --vs nccl
run host_whole 240 GPUCOLL_P2P_DISABLE=1 GPUCOLL_GPU_HOST_CHUNK=0 -o allreduce -b 64K -e 256M -f 4 -n 20 -w 3
# The two ranks acting as two hosts (GPUCOLL_TEST_HOST): TCP between them, against NCCL on sockets.
run hosts_pipelined 240 GPUCOLL_TEST_HOST=pretend%r NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -o allreduce -b 64K -e 256M -f 4 -n 20 -w 3 --vs nccl
run hosts_whole 240 GPUCOLL_TEST_HOST=pretend%r GPUCOLL_GPU_HOST_CHUNK=0 -o allreduce -b 64K -e 256M -f 4 -n 20 -w 3
[ "${TORCH:-0}" = 1 ] && run torch 120 -o allreduce -b 8 -e 1M -f 32 -n 300 -w 20 --vs torch
# Point to point on GPUs beside NCCL send/recv (with the host rows beside Open MPI).
timeout 600 $PY benchmarks/bench_p2p.py --gpu --repeats 3 --json "$OUT/p2p.json" > "$OUT/p2p.log" 2>&1 || failed=1
echo "== p2p (benchmarks/bench_p2p.py --gpu --repeats 3) at ${SECONDS}s"; grep -A14 "GPU point to point" "$OUT/p2p.log" | cut -c1-200
echo "== host time per eager call (benchmarks/bench_gpu_host.py)"
timeout 30 $PY -m gpucoll.launcher -np 2 $PY benchmarks/bench_gpu_host.py > "$OUT/host.log" 2>&1
grep -v "^\[1\]" "$OUT/host.log" | head -22 | cut -c1-150
echo "benchmarks done at ${SECONDS}s, $([ $failed = 0 ] && echo "every row right" || echo "SOME RUN FAILED (see above)")"
if [ "${TESTS:-1}" = 1 ]; then
  # make test-gpu runs `pytest -m gpu tests` with GPUCOLL_TEST_REQUIRE=gpu; here the short
  # tests first, then the long suite (2 ranks, then 1) in what is left of the budget.
  export GPUCOLL_TEST_REQUIRE=gpu
  T=$(( $(left) - 5 )); [ "$T" -gt 20 ] || T=20
  echo "== make test-gpu's tests, limit ${T}s"
  GPUCOLL_TIMEOUT=30 timeout "$T" $PY -m pytest -q -m gpu tests -k "debug_log or timeout" > "$OUT/test.log" 2>&1
  echo "short tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|Error|nfail|assert" "$OUT/test.log" | cut -c1-600 | tail -15
  T=$(( $(left) - 3 )); [ "$T" -gt 20 ] || T=20
  GPUCOLL_TIMEOUT=30 timeout "$T" $PY -m pytest -q -m gpu "tests/test_gpu_collectives.py::test_gpu_collectives[2]" \
    "tests/test_gpu_collectives.py::test_gpu_collectives[1]" > "$OUT/test_suite.log" 2>&1
  echo "suite rc=$? at ${SECONDS}s"; grep -E "passed|failed|Error|nfail|assert" "$OUT/test_suite.log" | cut -c1-600 | tail -15
fi
echo "done at ${SECONDS}s"
exit $failed
