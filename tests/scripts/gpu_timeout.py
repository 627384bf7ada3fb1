"""A peer that never joins a GPU all-reduce: the kernel gives up after GPUCOLL_TIMEOUT and the
error surfaces on the host (request Wait, the next collective) naming the operation and the
peer. Before that: fast-path all-reduces (repeated arguments) and Free() of a GPU communicator."""
import json
import os
import time

import cupy as cp

import gpucoll
from gpu_device import one_gpu_per_rank
from gpucoll import IN_PLACE

comm = gpucoll.COMM_WORLD
one_gpu_per_rank(comm)
n, rank = comm.size, comm.rank
result = {}

# Repeated calls take the packed fast path (every one after the first, as comm.stats() counts);
# each call gets new contents and its whole output is checked, so a stale result cannot pass.
x = cp.empty(1000, cp.float32)
y = cp.zeros(1000, cp.float32)
fast_before, wrong = comm.stats()["gpu_fast"], []
for i in range(5):
    x[:] = cp.arange(1000, dtype=cp.float32) * (i + 1) + rank
    comm.Allreduce(x, y)
    if not bool((y == cp.arange(1000, dtype=cp.float32) * (i + 1) * n + n * (n - 1) // 2).all()):
        wrong.append(i)
result["fast_calls"] = comm.stats()["gpu_fast"] - fast_before
result["fast_wrong"] = wrong
x.fill(rank + 1)  # what the timeout case below sends
try:
    comm.Allreduce(x, cp.zeros(999, cp.float32))
    result["size_check"] = "no error"
except gpucoll.InvalidUsageError:
    result["size_check"] = "InvalidUsageError"

# Free() waits for every rank's kernels before unmapping.
dup = comm.Dup()
z = cp.ones(4096, cp.float32)
for _ in range(3):
    dup.Allreduce(IN_PLACE, z)
dup.Free()
result["dup_sum"] = float(z[0].get())

comm.Barrier()
timeout = float(os.environ["GPUCOLL_TIMEOUT"])
if rank == 0:
    req = comm.Iallreduce(IN_PLACE, x)  # rank 1 never joins this one
    t0 = time.monotonic()
    try:
        req.Wait()
        result["raised"] = None
    except gpucoll.TimeoutError as exc:
        result.update(raised=str(exc), ranks=list(exc.ranks), seq=exc.seq, after=time.monotonic() - t0)
    try:
        comm.Allreduce(IN_PLACE, x)
        result["next"] = "no error"
    except gpucoll.TimeoutError:
        result["next"] = "TimeoutError"
else:
    time.sleep(timeout + 3)  # stay alive (our IPC memory stays mapped) while rank 0 times out
comm.Barrier()
print("RESULT " + json.dumps(result), flush=True)
