"""Rank side of tests/test_readme_claims.py: prints "RESULT {json}" on every rank.

    gpurun -np N python readme_claims.py MODE

    log       one all-reduce (for GPUCOLL_DEBUG / GPUCOLL_DEBUG_FILE); reports pid and host
    fast      20 all-reduces of a NumPy array with new contents each time; reports which path ran
    dlpack    collectives and Send/Recv on objects that only offer __dlpack__ over NumPy memory
    dlpack-gpu  the same over CuPy arrays (GPU memory)
"""
import json
import os
import socket
import sys

import numpy as np

import gpucoll
from gpucoll import IN_PLACE

mode = sys.argv[1]
comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
out = {"pid": os.getpid(), "host": socket.gethostname()}


class DLPackOnly:
    """Memory seen only through DLPack (as a torch CPU tensor or a JAX array offers it)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


if mode == "log":
    x = np.ones(16, np.float32)
    comm.Allreduce(IN_PLACE, x)
    out["sum"] = float(x[0])
elif mode == "fast":
    x, wrong = np.empty(256), []
    for i in range(20):
        x[:] = np.arange(256) * (i + 1) + r
        comm.Allreduce(IN_PLACE, x)
        if not (x == n * np.arange(256) * (i + 1) + n * (n - 1) // 2).all():
            wrong.append(i)
    st = comm.stats()
    out.update(wrong=wrong, fast=st["host_fast"], general=st["host"])
elif mode == "dlpack":
    send, recv = np.arange(1000, dtype=np.float64) + r, np.zeros(1000)
    comm.Allreduce(DLPackOnly(send), DLPackOnly(recv))
    out["allreduce"] = bool((recv == n * np.arange(1000) + n * (n - 1) // 2).all())
    buf = np.arange(50, dtype=np.int32) if r == 0 else np.zeros(50, np.int32)
    comm.Bcast(DLPackOnly(buf), root=0)
    out["bcast"] = bool((buf == np.arange(50)).all())
    table = np.zeros(3 * n, np.int64)
    comm.Allgather(DLPackOnly(np.full(3, r, np.int64)), DLPackOnly(table))
    out["allgather"] = bool((table == np.repeat(np.arange(n), 3)).all())
    got = np.zeros(100, np.float32)
    comm.Sendrecv(DLPackOnly(np.full(100, r, np.float32)), (r + 1) % n, 5, DLPackOnly(got), (r - 1) % n, 5)
    out["sendrecv"] = bool((got == (r - 1) % n).all())
elif mode == "dlpack-gpu":
    import cupy as cp

    from gpu_device import one_gpu_per_rank

    one_gpu_per_rank(comm)
    send, recv = cp.arange(1000, dtype=cp.float32) + r, cp.zeros(1000, cp.float32)
    comm.Allreduce(DLPackOnly(send), DLPackOnly(recv))
    out["allreduce"] = bool((recv == n * cp.arange(1000) + n * (n - 1) // 2).all())
    buf = cp.arange(50, dtype=cp.int32) if r == 0 else cp.zeros(50, cp.int32)
    comm.Bcast(DLPackOnly(buf), root=0)
    out["bcast"] = bool((buf == cp.arange(50)).all())
else:
    sys.exit(f"unknown mode {mode}")
print("RESULT " + json.dumps(out), flush=True)
