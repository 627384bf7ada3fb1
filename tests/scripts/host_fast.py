"""The native fast path of host all-reduces (cython_src/direct.pyx HostFast), 2+ ranks.

    gpurun -np N python host_fast.py      # prints "RESULT {json}" on every rank

After a first all-reduce the communicator has the fast path; every later result is checked
against NumPy (dtypes, ops, IN_PLACE), bad arguments must still raise the general path's
InvalidUsageError, a call issued while a nonblocking one is queued must keep its order, and
the sequence numbers must advance as before. comm.stats() shows which calls the fast path
ran: every valid call after the first, none of the bad ones, not the one behind a queued call.
"""
import json
import time

import numpy as np

import gpucoll
from gpucoll import IN_PLACE

comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
out = {"failures": []}
comm.Allreduce(IN_PLACE, np.ones(4, np.float32))
out["installed"] = comm._fast.host is not None


def counts():
    """(calls the fast path ran, calls the general path ran) so far."""
    st = comm.stats()
    return st["host_fast"], sum(st["host"].values())


def since(before):
    return [now - then for now, then in zip(counts(), before)]


def want(dtype, op, count):
    xs = [np.arange(count, dtype=np.float64).astype(dtype) + q for q in range(n)]
    acc = xs[0]
    for x in xs[1:]:
        acc = {"SUM": np.add, "MAX": np.maximum, "BOR": np.bitwise_or}[op](acc, x).astype(dtype)
    return acc


before, calls = counts(), 0
for dtype in ("float32", "float64", "int32", "int8", "float16", "uint64"):
    for op in ("SUM", "MAX") + (("BOR",) if "int" in dtype else ()):
        for count in (1, 7, 1000, 300000):
            for inplace in (True, False):
                x = np.arange(count, dtype=np.float64).astype(dtype) + r
                y = x if inplace else np.zeros(count, dtype)
                comm.Allreduce(IN_PLACE if inplace else x, y, op=getattr(gpucoll, op))
                calls += 1
                if y.tobytes() != want(dtype, op, count).tobytes():
                    out["failures"].append(f"{dtype} {op} {count} {inplace}")
z = np.full(10, r + 1.0)
comm.Allreduce(IN_PLACE, z, op=gpucoll.AVG)
out["avg"] = z[0]
b = np.array([r == 0, False, True])
comm.Allreduce(IN_PLACE, b, op=gpucoll.BOR)
out["bool"] = b.tolist()
out["valid"] = {"calls": calls + 2, "fast, general": since(before)}

errors, before = {}, counts()
ro = np.ones(4, np.float32)
ro.flags.writeable = False
big = np.ones(16, np.float32)
for name, call in {
    "read-only recvbuf": lambda: comm.Allreduce(IN_PLACE, ro),
    "non-contiguous": lambda: comm.Allreduce(np.ones(8, np.float32)[::2], np.ones(4, np.float32)),
    "different sizes": lambda: comm.Allreduce(np.ones(4, np.float32), np.ones(5, np.float32)),
    "different dtypes": lambda: comm.Allreduce(np.ones(4, np.int32), np.ones(4, np.float32)),
    "overlap": lambda: comm.Allreduce(big[2:10], big[:8]),
    "BAND on float": lambda: comm.Allreduce(IN_PLACE, np.ones(4, np.float32), op=gpucoll.BAND),
}.items():
    try:
        call()
        errors[name] = "no error"
    except gpucoll.InvalidUsageError as exc:
        errors[name] = "InvalidUsageError"
out["errors"] = errors
out["bad"] = since(before)

# Order with a queued nonblocking call: a blocking call on the same memory waits its turn (the
# calls of a communicator run in the order they were issued), so SUM then PROD gives S ** n on
# the first 8 elements, where PROD first would give n * n!. The last rank comes late, so that
# rank 0's Iallreduce is still waiting on the worker when rank 0 issues the blocking call.
a = np.full(1 << 16, r + 1.0)
if r == n - 1:
    time.sleep(0.3)
before = counts()
req = comm.Iallreduce(IN_PLACE, a)
comm.Allreduce(IN_PLACE, a[:8], op=gpucoll.PROD)
out["behind_queued"] = since(before)
req.Wait()
s = n * (n + 1) / 2
out["ordered"] = bool((a[:8] == s ** n).all() and (a[8:] == s).all())
out["ordered_head"] = float(a[0])

# Repeated calls on the same buffer, with new contents each time: a stale result cannot pass.
before, seq = counts(), comm._dispatch.seq
c = np.empty(8)
for i in range(10):
    c[:] = np.arange(8) * (i + 1) + r
    comm.Allreduce(IN_PLACE, c)
    if not (c == n * np.arange(8) * (i + 1) + n * (n - 1) / 2).all():
        out["failures"].append(f"repeated call {i}: {c.tolist()}")
out["seq_step"] = comm._dispatch.seq - seq
out["repeated"] = since(before)
print("RESULT " + json.dumps(out), flush=True)
