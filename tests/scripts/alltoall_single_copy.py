"""All-to-all on both sides of the direct engine's single-copy limit (GPUCOLL_HOST_SINGLE_COPY_MIN),
out of place and in place, each exact; and how many calls went by single copy.

    gpurun -np 4 python alltoall_single_copy.py [mixed]     -> "RESULT {json}" per rank

mixed: rank 0 calls in place and the others do not (erroneous: MPI asks all or none).
"""
import json
import sys

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
r, n = comm.rank, comm.size
comm.Barrier()  # the direct group exists from the first collective
group = comm._dispatch.direct.group()


def sent(block):
    """Rank r's send buffer: element i of block j is r * 1e6 + j * 1e3 + i, unique per rank and block."""
    return (r * 1_000_000 + np.arange(n)[:, None] * 1_000 + np.arange(block)[None, :]).astype(np.int64).ravel()


def expected(block):
    return (np.arange(n)[:, None] * 1_000_000 + r * 1_000 + np.arange(block)[None, :]).astype(np.int64).ravel()


if sys.argv[1:] == ["mixed"]:  # rank 0 in place, the others not: an erroneous call, caught
    block = (1 << 20) // 8
    buf = sent(block)
    try:
        if r == 0:
            comm.Alltoall(gpucoll.IN_PLACE, buf)
        else:
            comm.Alltoall(buf, np.empty_like(buf))
        outcome = "returned"
    except gpucoll.GpucollError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps({"rank": r, "outcome": outcome}), flush=True)
    sys.exit(0)

exact, calls = {}, {}
for block_bytes in (1 << 10, 8 << 10, 64 << 10, 512 << 10, 2 << 20):
    block = block_bytes // 8
    before = group.single_copy_calls
    out = np.full(n * block, -1, np.int64)
    comm.Alltoall(sent(block), out)
    ok = bool((out == expected(block)).all())
    calls[block_bytes] = group.single_copy_calls - before
    buf = sent(block)
    comm.Alltoall(gpucoll.IN_PLACE, buf)
    exact[block_bytes] = ok and bool((buf == expected(block)).all())
print("RESULT " + json.dumps({"rank": r, "min": group.single_copy_min, "exact": exact, "single_copy": calls}),
      flush=True)
