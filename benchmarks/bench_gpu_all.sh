#!/bin/bash
# Build, GPU tests and the GPU benchmark against NCCL in one go (2 GPUs), logs under $OUT.
# NVLink multicast stays off in everything started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpucoll-out}; mkdir -p "$OUT"
MODE=${1:-all}
{
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m | head -4
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
  python3 -c "import cupy, gpucoll._native.cuda as c; print('cupy', cupy.__version__, 'gpus', c.device_count())"
} > "$OUT/setup.log" 2>&1
tail -5 "$OUT/setup.log"
if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  GPUCOLL_TIMEOUT=30 timeout 420 python3 -m pytest -q -m gpu -x tests/test_gpu_collectives.py > "$OUT/test.log" 2>&1
  echo "test rc=$?"; grep -E "passed|failed|error|Error|nfail" "$OUT/test.log" | tail -8
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  B="gpurun -np 2 python3 benchmarks/bench_gpu.py"
  timeout 240 $B -b 8 -e 1G -f 4 > "$OUT/bench_allreduce.log" 2>&1; cat "$OUT/bench_allreduce.log" | grep -v "^\[1\]" | tail -20
  timeout 120 $B -b 1G -e 1G --colls allgather,bcast > "$OUT/bench_ag_bc.log" 2>&1; grep -v "^\[1\]" "$OUT/bench_ag_bc.log" | tail -4
  timeout 120 $B -b 8 -e 64K -f 8 -G 100 > "$OUT/bench_graph.log" 2>&1; grep -v "^\[1\]" "$OUT/bench_graph.log" | tail -6
fi
