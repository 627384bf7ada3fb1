"""A peer that never joins a GPU all-reduce: the kernel gives up after GPUCOLL_TIMEOUT and the
error surfaces on the host (request Wait, the next collective) naming the operation and the
peer. Before that: fast-path all-reduces (repeated arguments) and Free() of a GPU communicator."""
import json
import os
import time

import cupy as cp

import gpucoll
from gpucoll import IN_PLACE

cp.cuda.Device(int(os.environ.get("GPUCOLL_DEVICE", "0"))).use()
comm = gpucoll.COMM_WORLD
n, rank = comm.size, comm.rank
result = {}

# Repeated calls take the packed fast path; results stay exact, checks stay in force.
x = cp.full(1000, rank + 1, cp.float32)
y = cp.zeros(1000, cp.float32)
for _ in range(5):
    comm.Allreduce(x, y)
result["fast_sum"] = float(y[0].get())
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
