"""The native fast paths of host Bcast, Reduce, Allgather, Alltoall, Reduce_scatter_block and Barrier
(cython_src/direct.pyx HostFast),
2+ ranks.

    gpurun -np N python host_fast_kinds.py     # prints "RESULT {json}" on every rank

After a first call of each kind the communicator has its fast path; every later result is
checked against NumPy (dtypes, roots, IN_PLACE, Fortran order), bad arguments must still
raise the general path's InvalidUsageError and run on neither path, and comm.stats() shows
which path ran each call: every valid call on the fast path but those the fast path leaves
to the general one by design (a NumPy integer root, a send buffer at this rank's block).
"""
import json

import numpy as np

import gpucoll
from gpucoll import IN_PLACE

comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
out = {"failures": []}
comm.Bcast(np.zeros(1), root=0)  # the first call of the direct engine installs the fast path
out["installed"] = comm._fast.host is not None


def counts():
    st = comm.stats()
    return [st["host_fast"], sum(st["host"].values())]


def since(before):
    return [now - then for now, then in zip(counts(), before)]


def check(what, got, want):
    if np.asarray(got).tobytes() != np.asarray(want).tobytes():
        out["failures"].append(f"{what}: {np.asarray(got).ravel()[:6].tolist()}")


before, calls = counts(), 0
for dtype in ("float32", "float64", "int32", "int8", "uint64", "bool"):
    for count in (1, 7, 1000, 100000):
        for root in range(n):
            data = (np.arange(count) % 100 + root).astype(dtype)
            x = data.copy() if r == root else np.zeros(count, dtype)
            comm.Bcast(x, root=root)
            calls += 1
            check(f"bcast {dtype} {count} root {root}", x, data)
            if dtype == "bool":
                continue
            mine = (np.arange(count) % 7 + r).astype(dtype)
            want = sum((np.arange(count) % 7 + q).astype(dtype) for q in range(n)).astype(dtype)
            for inplace in (False, True):
                y = np.zeros(count, dtype)
                if inplace and r == root:
                    y[:] = mine
                    comm.Reduce(IN_PLACE, y, op=gpucoll.SUM, root=root)
                else:
                    comm.Reduce(mine, y if r == root else None, op=gpucoll.SUM, root=root)
                calls += 1
                check(f"reduce {dtype} {count} root {root} {inplace}", y if r == root else 0,
                      want if r == root else 0)
        block = (np.arange(count) % 50 + 3 * r).astype(dtype)
        everyone = np.concatenate([(np.arange(count) % 50 + 3 * q).astype(dtype) for q in range(n)])
        g = np.zeros(count * n, dtype)
        comm.Allgather(block, g)
        calls += 1
        check(f"allgather {dtype} {count}", g, everyone)
        g = np.zeros(count * n, dtype)
        g[r * count:(r + 1) * count] = block
        comm.Allgather(IN_PLACE, g)
        calls += 1
        check(f"allgather in place {dtype} {count}", g, everyone)
        # block j of rank q's send is (q, j)'s pattern: rank r receives block r of every rank
        sends = [(np.arange(count * n) % 13 + 5 * q + 2 * (np.arange(count * n) // count)).astype(dtype)
                 for q in range(n)]
        wanted = np.concatenate([sends[q][r * count:(r + 1) * count] for q in range(n)])
        t = np.zeros(count * n, dtype)
        comm.Alltoall(sends[r], t)
        calls += 1
        check(f"alltoall {dtype} {count}", t, wanted)
        t = sends[r].copy()
        comm.Alltoall(IN_PLACE, t)
        calls += 1
        check(f"alltoall in place {dtype} {count}", t, wanted)
        if dtype == "bool":
            continue
        ours = (np.arange(count * n) % 11 + r).astype(dtype)
        summed = sum((np.arange(count * n) % 11 + q).astype(dtype) for q in range(n)).astype(dtype)
        mine_block = summed[r * count:(r + 1) * count]
        y = np.zeros(count, dtype)
        comm.Reduce_scatter_block(ours, y, op=gpucoll.SUM)
        calls += 1
        check(f"reduce_scatter_block {dtype} {count}", y, mine_block)
        z = ours.copy()
        comm.Reduce_scatter_block(IN_PLACE, z, op=gpucoll.SUM)
        calls += 1
        check(f"reduce_scatter_block in place {dtype} {count}", z[:count], mine_block)
for _ in range(5):
    comm.Barrier()
    calls += 1
f = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4) * (r == 0))
comm.Bcast(f, root=0)
calls += 1
check("bcast fortran", f, np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)))
out["valid"] = {"calls": calls, "fast, general": since(before)}

# Left to the general path on purpose: a NumPy integer root; a send buffer that is this rank's
# block of the receive buffer (IN_PLACE's layout, passed explicitly).
before = counts()
x = np.full(4, float(r))
comm.Bcast(x, root=np.int64(n - 1))
check("bcast numpy root", x, np.full(4, float(n - 1)))
g = np.zeros(2 * n)
g[2 * r:2 * r + 2] = r
comm.Allgather(g[2 * r:2 * r + 2], g)
check("allgather own block", g, np.repeat(np.arange(n, dtype=np.float64), 2))
out["general"] = since(before)

errors, before = {}, counts()
ro = np.ones(4)
ro.flags.writeable = False
big = np.arange(16.0)
for name, call in {
    "read-only bcast on a receiver": lambda: comm.Bcast(ro, root=(r + 1) % n),
    "bcast root out of range": lambda: comm.Bcast(np.ones(4), root=n),
    "bcast root negative": lambda: comm.Bcast(np.ones(4), root=-1),
    "bcast root not an int": lambda: comm.Bcast(np.ones(4), root=0.0),
    "reduce IN_PLACE off the root": lambda: comm.Reduce(IN_PLACE, np.ones(4), root=(r + 1) % n),
    "reduce sizes at the root": lambda: comm.Reduce(np.ones(4), np.ones(5), root=r),
    "reduce read-only recvbuf at the root": lambda: comm.Reduce(np.ones(4), ro, root=r),
    "reduce BAND on float": lambda: comm.Reduce(np.ones(4), np.ones(4), op=gpucoll.BAND, root=0),
    "reduce overlap at the root": lambda: comm.Reduce(big[2:10], big[:8], root=r),
    "allgather recvbuf not divisible": lambda: comm.Allgather(np.ones(4), np.ones(4 * n + 1)),
    "allgather sendbuf size": lambda: comm.Allgather(np.ones(3), np.ones(4 * n)),
    "allgather dtypes": lambda: comm.Allgather(np.ones(4, np.int32), np.ones(4 * n)),
    "allgather overlap": lambda: comm.Allgather(big[1:3], big[:2 * n]),
    "allgather non-contiguous": lambda: comm.Allgather(np.ones(8)[::2], np.ones(4 * n)),
    "alltoall sizes": lambda: comm.Alltoall(np.ones(4 * n), np.ones(4 * n + n)),
    "alltoall not divisible": lambda: comm.Alltoall(np.ones(4 * n + 1), np.ones(4 * n + 1)),
    "alltoall dtypes": lambda: comm.Alltoall(np.ones(4 * n, np.int32), np.ones(4 * n)),
    "alltoall overlap": lambda: comm.Alltoall(big[1:1 + 2 * n], big[:2 * n]),
    "reduce_scatter_block sizes": lambda: comm.Reduce_scatter_block(np.ones(4 * n + 1), np.ones(4)),
    "reduce_scatter_block dtypes": lambda: comm.Reduce_scatter_block(np.ones(4 * n, np.int32), np.ones(4)),
    "reduce_scatter_block IN_PLACE not divisible": lambda: comm.Reduce_scatter_block(IN_PLACE, np.ones(4 * n + 1)),
    "reduce_scatter_block overlap": lambda: comm.Reduce_scatter_block(big[1:1 + 2 * n], big[:2]),
    "reduce_scatter_block BAND on float": lambda: comm.Reduce_scatter_block(np.ones(4 * n), np.ones(4), op=gpucoll.BAND),
}.items():
    try:
        call()
        errors[name] = "no error"
    except gpucoll.InvalidUsageError:
        errors[name] = "InvalidUsageError"
out["errors"] = errors
out["bad"] = since(before)
# nothing went out: a correct collective still matches up on every rank
x = np.full(3, r + 1.0)
comm.Allreduce(IN_PLACE, x)
out["after"] = x.tolist()
print("RESULT " + json.dumps(out), flush=True)
