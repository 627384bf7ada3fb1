"""gpucoll.MPI's Allgatherv, Alltoallv, Gatherv and Scatterv within one host: every form, exact,
and the way each took (tests/test_vector_direct.py).

    gpurun -np 3 python vector_direct.py [mismatch]    -> "RESULT {json}" per rank

Blocks have uneven counts (zeros among them) and displacements out of rank order with gaps.
NumPy arrays in mpi4py's vector specs take the native path (HostFast.vector: `host_fast`
counts them); other forms (bytearrays, a datatype that is not the array's) the general path,
over the same direct group (`host` "direct"); blocks too large for the group's slots go by
point to point, on every rank. `mismatch`: rank 1 expects one element more from rank 0 than
rank 0 sends it.
"""
import json
import sys

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
comm.Barrier()  # the communicator's native paths exist from its first collective on
core = comm._s.core


def layout(counts):
    """Displacements in reverse rank order with a gap of 3 elements before each block."""
    displs, at = [0] * n, 3
    for k in reversed(range(n)):
        displs[k] = at
        at += counts[k] + 3
    return displs, at


def value(src, dst, i):
    return src * 10_000 + dst * 100 + i


def filled(counts, value_of):
    """(array, displs): the blocks of `counts` laid out as layout() says, block k holding
    value_of(k, its element indices)."""
    displs, total = layout(counts)
    arr = np.zeros(total, np.int64)
    for k in range(n):
        arr[displs[k]:displs[k] + counts[k]] = value_of(k, np.arange(counts[k]))
    return arr, displs


def stats():
    s = core.stats()
    return s["host_fast"], s["host"].get("direct", 0), s["host"].get("p2p", 0)


results = {}


def check(name, fn, want):
    before = stats()
    got = fn()
    after = stats()
    results[name] = {"exact": bool(np.array_equal(got, want)),
                     **{way: after[i] - before[i] for i, way in enumerate(("fast", "direct", "p2p"))}}


if sys.argv[1:] == ["mismatch"]:
    counts = [2] * n
    if r == 1:
        counts[0] = 3  # expects 3 from rank 0, which sends 2
    displs, total = layout(counts)
    out = np.zeros(total, np.int64)
    try:
        comm.Allgatherv(np.full(2, r, np.int64), [out, counts, displs, MPI.INT64_T])
        results["first"] = "returned"
    except Exception as exc:  # noqa: BLE001 - reported
        results["first"] = type(exc).__name__ + ": " + str(exc)
    try:
        comm.Allreduce(np.ones(4), np.empty(4))
        results["next"] = "returned"
    except Exception as exc:  # noqa: BLE001 - reported
        results["next"] = type(exc).__name__
    print("RESULT " + json.dumps({"rank": r, **results}), flush=True)
    sys.exit(0)

for scale, tag in ((1, "small"), (600_000, "large")):  # large: blocks of 4.8 MB and more, over a slot
    # Allgatherv: rank k contributes counts[k] elements (rank 1 none at small scale)
    counts = [(k * 2 + (0 if k == 1 and scale == 1 else 1)) * scale for k in range(n)]
    want, displs = filled(counts, lambda k, i: value(k, 0, i))
    total = want.size
    mine = value(r, 0, np.arange(counts[r])).astype(np.int64)

    def gather(spec_of):
        out = np.zeros(total, np.int64)
        comm.Allgatherv(mine, spec_of(out))
        return out

    check(f"allgatherv/{tag}/list4", lambda: gather(lambda o: [o, counts, displs, MPI.INT64_T]), want)
    check(f"allgatherv/{tag}/pair", lambda: gather(lambda o: [o, (counts, displs), MPI.INT64_T]), want)

    def in_place():
        out = np.zeros(total, np.int64)
        out[displs[r]:displs[r] + counts[r]] = mine
        comm.Allgatherv(MPI.IN_PLACE, [out, counts, displs, MPI.INT64_T])
        return out
    check(f"allgatherv/{tag}/in-place", in_place, want)

    def as_bytes():
        raw = bytearray(total * 8)
        comm.Allgatherv([mine, MPI.INT64_T], [raw, [c * 8 for c in counts], [d * 8 for d in displs], MPI.BYTE])
        return np.frombuffer(raw, np.int64)
    check(f"allgatherv/{tag}/bytearray", as_bytes, want)

    # Alltoallv: rank r sends (r + 2 * k) % 3 * scale elements to rank k
    sc = [((r + 2 * k) % 3) * scale for k in range(n)]
    rc = [((k + 2 * r) % 3) * scale for k in range(n)]
    send, sd = filled(sc, lambda k, i: value(r, k, i))
    want, rd = filled(rc, lambda k, i: value(k, r, i))
    rtotal = want.size

    def exchange(list4=True):
        out = np.zeros(rtotal, np.int64)
        if list4:
            comm.Alltoallv([send, sc, sd, MPI.INT64_T], [out, rc, rd, MPI.INT64_T])
        else:
            comm.Alltoallv([send, (sc, sd), MPI.INT64_T], [out, (rc, rd), MPI.INT64_T])
        return out
    check(f"alltoallv/{tag}/list4", exchange, want)
    check(f"alltoallv/{tag}/pair", lambda: exchange(False), want)

    # in place: the same counts both ways (rank r sends rank k what k sends r), so that every
    # block can land where it left from
    same = [((r + k) % 3) * scale for k in range(n)]
    mixed, same_displs = filled(same, lambda k, i: value(r, k, i))
    swapped, _ = filled(same, lambda k, i: value(k, r, i))

    def in_place_a2a():
        buf = mixed.copy()
        comm.Alltoallv(MPI.IN_PLACE, [buf, same, same_displs, MPI.INT64_T])
        return buf
    check(f"alltoallv/{tag}/in-place", in_place_a2a, swapped)

    def as_bytes_a2a():
        raw = bytearray(rtotal * 8)
        comm.Alltoallv([send, sc, sd, MPI.INT64_T], [raw, [c * 8 for c in rc], [d * 8 for d in rd], MPI.BYTE])
        return np.frombuffer(raw, np.int64)
    check(f"alltoallv/{tag}/bytearray", as_bytes_a2a, want)

    def nonblocking():
        out = np.zeros(rtotal, np.int64)
        comm.Ialltoallv([send, sc, sd, MPI.INT64_T], [out, rc, rd, MPI.INT64_T]).Wait()
        return out
    check(f"alltoallv/{tag}/nonblocking", nonblocking, want)

    # Gatherv and Scatterv, root n - 1: the Allgatherv layout, only the root holds it
    root = n - 1
    everything, displs = filled(counts, lambda k, i: value(k, root, i))
    total = everything.size
    mine = value(r, root, np.arange(counts[r])).astype(np.int64)

    def gatherv(pair=False, in_place=False):
        out = np.zeros(total, np.int64)
        spec = [out, (counts, displs), MPI.INT64_T] if pair else [out, counts, displs, MPI.INT64_T]
        if in_place and r == root:
            out[displs[r]:displs[r] + counts[r]] = mine
        comm.Gatherv(MPI.IN_PLACE if in_place and r == root else mine, spec if r == root else None, root=root)
        return out if r == root else everything
    check(f"gatherv/{tag}/list4", gatherv, everything)
    check(f"gatherv/{tag}/pair", lambda: gatherv(pair=True), everything)
    check(f"gatherv/{tag}/in-place", lambda: gatherv(in_place=True), everything)

    def gatherv_bytes():
        raw = bytearray(total * 8)
        spec = [raw, [c * 8 for c in counts], [d * 8 for d in displs], MPI.BYTE] if r == root else None
        comm.Gatherv([mine, MPI.INT64_T], spec, root=root)
        return np.frombuffer(raw, np.int64) if r == root else everything
    check(f"gatherv/{tag}/bytearray", gatherv_bytes, everything)

    def scatterv(pair=False, in_place=False):
        out = np.zeros(counts[r], np.int64)
        spec = [everything, (counts, displs), MPI.INT64_T] if pair else [everything, counts, displs, MPI.INT64_T]
        if in_place and r == root:
            comm.Scatterv(spec, MPI.IN_PLACE, root=root)
            return everything[displs[r]:displs[r] + counts[r]]
        comm.Scatterv(spec if r == root else None, out, root=root)
        return out
    check(f"scatterv/{tag}/list4", scatterv, everything[displs[r]:displs[r] + counts[r]])
    check(f"scatterv/{tag}/pair", lambda: scatterv(pair=True), everything[displs[r]:displs[r] + counts[r]])
    check(f"scatterv/{tag}/in-place", lambda: scatterv(in_place=True), everything[displs[r]:displs[r] + counts[r]])

    def scatterv_bytes():
        raw = bytearray(counts[r] * 8)
        spec = [everything, counts, displs, MPI.INT64_T] if r == root else None
        comm.Scatterv(spec, [raw, MPI.BYTE], root=root)
        return np.frombuffer(raw, np.int64)
    check(f"scatterv/{tag}/bytearray", scatterv_bytes, everything[displs[r]:displs[r] + counts[r]])

print("RESULT " + json.dumps({"rank": r, **results}), flush=True)
