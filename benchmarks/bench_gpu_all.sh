#!/bin/bash
# Build, GPU tests and the GPU benchmark against NCCL in one go (2 GPUs), logs under $OUT.
#   bench_gpu_all.sh [all|test|bench|tune]
# NVLink multicast stays off in everything started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpucoll-out}; mkdir -p "$OUT"
MODE=${1:-all}
B="gpurun -np 2 python3 benchmarks/bench_gpu.py"
[ -f /tmp/gpucoll-setup.done ] || {
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m | head -4
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
  python3 -c "import cupy, gpucoll._native.cuda as c; print('cupy', cupy.__version__, 'gpus', c.device_count())"
  touch /tmp/gpucoll-setup.done
} > "$OUT/setup.log" 2>&1
if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  GPUCOLL_TIMEOUT=30 timeout 420 python3 -m pytest -q -m gpu tests/test_gpu_collectives.py > "$OUT/test.log" 2>&1
  echo "test rc=$?"; grep -E "passed|failed|Error|nfail" "$OUT/test.log" | cut -c1-400 | tail -12
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  timeout 200 $B -b 8 -e 1G -f 4 > "$OUT/bench_allreduce.log" 2>&1; grep -v "^\[1\]" "$OUT/bench_allreduce.log" | tail -16
  timeout 100 $B -b 1G -e 1G --colls allgather,bcast > "$OUT/bench_ag_bc.log" 2>&1; grep -v "^\[1\]" "$OUT/bench_ag_bc.log" | tail -2
  timeout 100 $B -b 8 -e 64K -f 8 -G 100 > "$OUT/bench_graph.log" 2>&1; grep -v "^\[1\]" "$OUT/bench_graph.log" | tail -5
fi
if [ "$MODE" = tune ]; then
  for blk in 32 128; do echo "GPUCOLL_GPU_BLOCKS=$blk"
    GPUCOLL_GPU_BLOCKS=$blk timeout 100 $B -b 512K -e 512M -f 4 2>&1 | grep -v "^\[1\]" | tail -6; done
  GPUCOLL_GPU_COPY=sm timeout 100 $B -b 1G -e 1G --colls allgather,bcast 2>&1 | grep -v "^\[1\]" | tail -2
fi
