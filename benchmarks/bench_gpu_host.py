"""Host time of one eager GPU all-reduce call (what the caller's thread spends to enqueue it).

    gpurun -np 2 python benchmarks/bench_gpu_host.py [COUNT]

Prints, on rank 0, the median host microseconds per Allreduce call (8 B by default) and the
functions where that time goes (cProfile, sorted by own time).
"""
import cProfile
import os
import pstats
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import cupy as cp  # noqa: E402

import gpucoll  # noqa: E402

comm = gpucoll.COMM_WORLD
cp.cuda.Device(comm.local_rank % cp.cuda.runtime.getDeviceCount()).use()
count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
x, y = cp.ones(count, cp.float32), cp.zeros(count, cp.float32)
s = cp.cuda.Stream(non_blocking=True)
for _ in range(100):
    comm.Allreduce(x, y, stream=s)
s.synchronize()
samples = []
for _ in range(2000):
    t = time.perf_counter()
    comm.Allreduce(x, y, stream=s)
    samples.append(time.perf_counter() - t)
s.synchronize()
samples.sort()
if comm.rank == 0:
    print(f"host us per Allreduce({count * 4} B): median {samples[1000] * 1e6:.2f}, p10 {samples[200] * 1e6:.2f}")
prof = cProfile.Profile()
prof.enable()
for _ in range(2000):
    comm.Allreduce(x, y, stream=s)
prof.disable()
s.synchronize()
if comm.rank == 0:
    pstats.Stats(prof).sort_stats("tottime").print_stats(10)
