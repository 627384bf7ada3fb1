"""A lock that is never released: rank 0 holds an exclusive lock on its own window while rank 1
asks for it; rank 1's Lock must give up after GPUCOLL_TIMEOUT with an error that says why
(not hang). Then rank 0 releases it and rank 1 gets it.

    GPUCOLL_TIMEOUT=2 gpurun -np 2 python mpi_rma_lock_timeout.py   -> "RESULT {json}" per rank
"""
import json
import time

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
win = MPI.Win.Allocate(4, 4, comm=comm)
out = {"direct": win._s.direct is not None}
if comm.rank == 0:
    win.Lock(0, MPI.LOCK_EXCLUSIVE)
comm.Barrier()
if comm.rank == 1:
    start = time.monotonic()
    try:
        win.Lock(0, MPI.LOCK_SHARED)
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 - what it raised is the result
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["waited"] = round(time.monotonic() - start, 1)
    comm.send("given up", 0, tag=5)
else:  # waits without a deadline of its own (a barrier would time out as the Lock does)
    while not comm.Iprobe(source=1, tag=5):
        time.sleep(0.05)
    comm.recv(source=1, tag=5)
    win.Unlock(0)
comm.Barrier()
if comm.rank == 1:
    got = np.zeros(1, "i")
    win.Lock(0, MPI.LOCK_SHARED)   # free now
    win.Get(got, 0)
    win.Unlock(0)
win.Fence()
win.Free()
print("RESULT " + json.dumps(out), flush=True)
