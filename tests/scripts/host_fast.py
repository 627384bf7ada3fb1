"""The native fast path of host all-reduces (cython_src/direct.pyx HostAllreduce), 2+ ranks.

    gpurun -np N python host_fast.py      # prints "RESULT {json}" on every rank

After a first all-reduce the communicator has the fast path; every later result is checked
against NumPy (dtypes, ops, IN_PLACE), bad arguments must still raise the general path's
InvalidUsageError, a call issued while a nonblocking one is queued must keep its order, and
the sequence numbers must advance as before.
"""
import json

import numpy as np

import gpucoll
from gpucoll import IN_PLACE

comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
out = {"failures": []}
comm.Allreduce(IN_PLACE, np.ones(4, np.float32))
out["installed"] = comm._host_fast is not None


def want(dtype, op, count):
    xs = [np.arange(count, dtype=np.float64).astype(dtype) + q for q in range(n)]
    acc = xs[0]
    for x in xs[1:]:
        acc = {"SUM": np.add, "MAX": np.maximum, "BOR": np.bitwise_or}[op](acc, x).astype(dtype)
    return acc


for dtype in ("float32", "float64", "int32", "int8", "float16", "uint64"):
    for op in ("SUM", "MAX") + (("BOR",) if "int" in dtype else ()):
        for count in (1, 7, 1000, 300000):
            for inplace in (True, False):
                x = np.arange(count, dtype=np.float64).astype(dtype) + r
                y = x if inplace else np.zeros(count, dtype)
                comm.Allreduce(IN_PLACE if inplace else x, y, op=getattr(gpucoll, op))
                if y.tobytes() != want(dtype, op, count).tobytes():
                    out["failures"].append(f"{dtype} {op} {count} {inplace}")
z = np.full(10, r + 1.0)
comm.Allreduce(IN_PLACE, z, op=gpucoll.AVG)
out["avg"] = z[0]
b = np.array([r == 0, False, True])
comm.Allreduce(IN_PLACE, b, op=gpucoll.BOR)
out["bool"] = b.tolist()

errors = {}
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

# Order with a queued nonblocking call: the blocking one waits its turn.
a, c = np.full(1 << 18, r, np.float64), np.full(8, r, np.float64)
req = comm.Iallreduce(IN_PLACE, a)
comm.Allreduce(IN_PLACE, c)
req.Wait()
out["ordered"] = [float(a[0]), float(c[0])]
before = comm._dispatch.seq
for _ in range(10):
    comm.Allreduce(IN_PLACE, c)
out["seq_step"] = comm._dispatch.seq - before
print("RESULT " + json.dumps(out), flush=True)
