"""Ranks that disagree on the root of a rooted collective, and ranks that agree (for
tests/test_faults.py and tests/test_gpu_collectives.py).

    gpurun -np 3 python roots.py [--gpu | --agree]

Bcast, Reduce, Gather and Scatter, each at a small and a large size, each on a fresh Dup of
COMM_WORLD (a mismatch leaves a communicator unusable), with roots that disagree:

  self   every rank takes itself for the root (nobody receives anything)
  mixed  the last rank takes root 1, the others root 0 ({0, 0, 1} on 3 ranks)

then, on one more Dup, every collective with every root as it should be called. Prints
"RESULT {json}": per disagreeing case the error (type, message, ranks), where it was raised
("call": by the call itself; "next": by the Barrier after it, the call having returned) and
the seconds it took; "agree": the cases whose data was not exactly what MPI defines.
With --gpu the buffers are CuPy arrays on this rank's GPU. With --agree no collective runs:
each case is only the check that GPU calls make on the host before launching a rooted kernel
(Dispatcher.agree), so that it is tested where there is no GPU.
"""
import json
import sys
import time

import numpy as np

import gpucoll

GPU = "--gpu" in sys.argv
AGREE = "--agree" in sys.argv
if GPU:
    import cupy as xp

    from gpu_device import one_gpu_per_rank

    one_gpu_per_rank(gpucoll.COMM_WORLD)
else:
    xp = np

world = gpucoll.COMM_WORLD
rank, size = world.rank, world.size
SIZES = {"small": 4, "large": 100_000}  # float32 elements: 16 B, and two-shot / many rounds
ROOTS = {"self": lambda r: r, "mixed": lambda r: 1 if r == size - 1 else 0}


def data(r, n):
    """Rank r's input: small integers, exact in float32 sums."""
    return np.arange(n, dtype=np.float32) + 1000 * r


def host(a):
    if GPU:
        xp.cuda.Stream.null.synchronize()
        return xp.asnumpy(a)
    return a


def call(comm, kind, n, root):
    """Run one rooted collective; return what MPI says this rank ends up with (None: nothing)."""
    if AGREE:
        from gpucoll.base import dtypes
        from gpucoll.base.call import Call

        op = gpucoll.SUM if kind == "reduce" else None
        dispatch = comm._dispatch
        checked = Call(kind, None, None, n, dtypes.FLOAT32, op, root)
        checked.seq = dispatch.next_seq()
        dispatch.agree(checked)
        return None, None
    if kind == "bcast":
        x = xp.asarray(data(rank, n))
        comm.Bcast(x, root=root)
        return host(x), data(root, n)
    if kind == "reduce":
        x, y = xp.asarray(data(rank, n)), xp.zeros(n, xp.float32)
        comm.Reduce(x, y, op=gpucoll.SUM, root=root)
        want = sum(data(r, n) for r in range(size)) if rank == root else None
        return host(y), want
    if kind == "gather":
        x, y = xp.asarray(data(rank, n)), xp.zeros(n * size, xp.float32)
        comm.Gather(x, y, root=root)
        want = np.concatenate([data(r, n) for r in range(size)]) if rank == root else None
        return host(y), want
    x, y = xp.asarray(data(rank, n * size)), xp.zeros(n, xp.float32)
    comm.Scatter(x, y, root=root)
    return host(y), data(root, n * size)[rank * n:(rank + 1) * n]


out = {}
for kind in ("bcast", "reduce", "gather", "scatter"):
    for size_name, n in SIZES.items():
        for case, root_of in ROOTS.items():
            comm = world.Dup()
            where, start = "call", time.monotonic()
            try:
                call(comm, kind, n, root_of(rank))
                where = "next"
                comm.Barrier()
                info = {"type": "none"}
            except gpucoll.GpucollError as exc:
                info = {"type": type(exc).__name__, "message": str(exc), "ranks": list(getattr(exc, "ranks", ()))}
            info.update(where=where, elapsed=time.monotonic() - start)
            out[f"{kind}/{size_name}/{case}"] = info

comm = world.Dup()
wrong = []
for kind in ("bcast", "reduce", "gather", "scatter"):
    for size_name, n in SIZES.items():
        for root in range(size):
            got, want = call(comm, kind, n, root)
            if want is not None and not np.array_equal(got, want):
                wrong.append(f"{kind}/{size_name}/root {root}")
comm.Barrier()
out["agree"] = wrong
print("RESULT " + json.dumps(out), flush=True)
