#!/bin/bash
# Build, the GPU benchmarks against NCCL (gpucoll-bench --vs nccl) and `make test-gpu`'s tests
# in one go on a 2-GPU machine, within about 5 minutes; logs under $OUT.
#   bench_gpu_all.sh [BUDGET_SECONDS]
# NVLink multicast stays off in everything started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpucoll-out}; mkdir -p "$OUT"
BUDGET=${1:-315}
left() { echo $((BUDGET - SECONDS)); }
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m | head -4
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -iE "^error|error:" | head
  python3 -c "import cupy, gpucoll._native.cuda as c; print('cupy', cupy.__version__, 'gpus', c.device_count())"
} > "$OUT/setup.log" 2>&1
cat "$OUT/setup.log"; echo "setup done at ${SECONDS}s"
BENCH="python3 -m gpucoll.bench -np 2"
run() {  # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$t" $BENCH "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$? at ${SECONDS}s: gpucoll-bench -np 2 $*"
  grep -vE "^# (measuring|Using)" "$OUT/$name.log" | grep -v "^#  Rank" | cut -c1-150
}
run allreduce 100 -o allreduce -b 8 -e 512M -f 4 -n 500 -w 50 --vs nccl
echo "== host time per eager call (benchmarks/bench_gpu_host.py)"
timeout 30 python3 -m gpucoll.launcher -np 2 python3 benchmarks/bench_gpu_host.py > "$OUT/host.log" 2>&1
grep -v "^\[1\]" "$OUT/host.log" | head -22 | cut -c1-150
run graph 40 -o allreduce -b 8 -e 64K -f 8 -n 1000 -w 20 -G 100 --vs nccl
run allgather 45 -o allgather -b 1G -e 1G -n 20 -w 3 -c 0 --vs nccl
run bcast 45 -o bcast -b 1G -e 1G -n 20 -w 3 -c 0 --vs nccl
# make test-gpu runs `pytest -m gpu tests`; here the short tests first, then the long suite
# (2 ranks, then 1) in what is left of the budget.
T=$(( $(left) - 5 )); [ "$T" -gt 20 ] || T=20
echo "== make test-gpu (python3 -m pytest -q -m gpu tests), limit ${T}s"
GPUCOLL_TIMEOUT=30 timeout "$T" python3 -m pytest -q -m gpu tests -k "debug_log or timeout" > "$OUT/test.log" 2>&1
echo "short tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|Error|nfail|assert" "$OUT/test.log" | cut -c1-600 | tail -15
T=$(( $(left) - 3 )); [ "$T" -gt 20 ] || T=20
GPUCOLL_TIMEOUT=30 timeout "$T" python3 -m pytest -q -m gpu "tests/test_gpu_collectives.py::test_gpu_collectives[2]" \
  "tests/test_gpu_collectives.py::test_gpu_collectives[1]" > "$OUT/test_suite.log" 2>&1
echo "suite rc=$? at ${SECONDS}s"; grep -E "passed|failed|Error|nfail|assert" "$OUT/test_suite.log" | cut -c1-600 | tail -15
[ "${TORCH:-0}" = 1 ] && run torch 30 -o allreduce -b 8 -e 1M -f 32 -n 300 -w 20 --vs torch
echo "done at ${SECONDS}s"
