"""Point to point of gpucoll.MPI on messages written as mpi4py's demos write them.

    gpurun -np 2 python mpi_spec_forms.py      -> "RESULT {json}" per rank

Every form goes both ways (Send/Recv and Isend/Irecv + Waitall); each result says whether the
bytes arrived exactly, what the status counted and how many of the calls the native short paths
read without the general path (`specs`: [buf, TYPE] lists, `forms`: other objects than a bare
NumPy array; the general path hands the short paths neither, only the arrays it reads out).
"""
import array
import json

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
r = comm.Get_rank()
peer = 1 - r
short = comm._s.core.seam.p2p.short  # the native short paths of COMM_WORLD


def pattern(n, salt):
    return (np.arange(n, dtype=np.int64) * 7 + salt) % 251


def as_form(kind, raw):
    """(message, a view of its bytes as uint8) for a form over memory `raw` (a bytearray)."""
    n = len(raw)
    if kind == "alloc":
        mem = MPI.Alloc_mem(n)
        return [mem, n, MPI.BYTE], np.frombuffer(mem, np.uint8)
    if kind == "bytearray":
        return raw, np.frombuffer(raw, np.uint8)
    if kind == "memoryview":
        return memoryview(raw), np.frombuffer(raw, np.uint8)
    if kind == "array":
        a = array.array("b", bytes(n))
        return a, np.frombuffer(a, np.uint8)
    if kind == "list-type":
        a = np.zeros(n // 8, np.float64)
        return [a, MPI.DOUBLE], a.view(np.uint8)
    if kind == "tuple-count":
        a = np.zeros(n // 4, np.int32)
        return (a, n // 4, MPI.INT), a.view(np.uint8)
    raise ValueError(kind)


# the channel between the two ranks is opened by a first message: a send before that takes the
# general path, whatever its form
comm.Sendrecv(np.zeros(1), peer, 1, recvbuf=np.zeros(1), source=peer, recvtag=1)
out = {}
for kind in ("alloc", "bytearray", "memoryview", "array", "list-type", "tuple-count"):
    res = {}
    for nbytes in (8, 4096, 1 << 20):
        specs, forms = short.specs, short.forms
        smsg, sbytes = as_form(kind, bytearray(nbytes))
        rmsg, rbytes = as_form(kind, bytearray(nbytes))
        sbytes[:] = pattern(nbytes, r).astype(np.uint8)
        st = MPI.Status()
        if r == 0:
            comm.Send(smsg, peer, 3)
            comm.Recv(rmsg, peer, 3, st)
        else:
            comm.Recv(rmsg, peer, 3, st)
            comm.Send(smsg, peer, 3)
        ok = bool((rbytes == pattern(nbytes, peer).astype(np.uint8)).all())
        rbytes[:] = 0
        reqs = [comm.Irecv(rmsg, peer, 4), comm.Isend(smsg, peer, 4)]
        MPI.Request.Waitall(reqs)
        ok2 = bool((rbytes == pattern(nbytes, peer).astype(np.uint8)).all())
        res[nbytes] = [ok, ok2, st.Get_count(MPI.BYTE), st.Get_source(), short.specs - specs, short.forms - forms]
    out[kind] = res

# [buf, count, TYPE]: only the first count elements travel, the receive's capacity is count too
a = np.arange(10, dtype=np.int32) + 100 * r
got = np.full(10, -1, np.int32)
st = MPI.Status()
comm.Sendrecv([a, 4, MPI.INT], peer, 5, recvbuf=[got, 6, MPI.INT], source=peer, recvtag=5, status=st)
first = [got.tolist(), st.Get_count(MPI.INT)]
if r == 0:
    comm.Send([a, 8, MPI.INT], peer, 6)
    truncated = None
else:
    try:
        comm.Recv([got, 4, MPI.INT], peer, 6)
        truncated = "no error"
    except MPI.Exception as exc:
        truncated = exc.Get_error_class()
out["count"] = first + [truncated]

# Forms the short paths must decline, checked by the general path as before
bad = []
for msg in ([np.zeros(3, np.uint8), MPI.DOUBLE], [np.zeros(8, np.uint8), 2, MPI.DOUBLE]):
    try:
        comm.Send(msg, peer, 7)
        bad.append("sent")
    except ValueError as exc:  # mpi4py's error for a buffer that does not hold the message
        bad.append(type(exc).__name__)
out["bad"] = bad

# A bare array whose dtype is no basic datatype's (another byte order, a record) is not its message
# in gpucoll.MPI, as in mpi4py: the short paths decline it and the general path says why
declined = []
for arr in (np.zeros(3, ">f8"), np.zeros(3, np.dtype([("a", "i4"), ("b", "f8")]))):
    try:
        comm.Send(arr, peer, 7)
        declined.append("sent")
    except (BufferError, KeyError) as exc:
        declined.append(type(exc).__name__)
out["declined"] = declined

# Waitall of a window: waited for, settled and (gpucoll.MPI) nulled in one native call when no
# status is asked for; with statuses, each request on its own
import gpucoll  # noqa: E402
from gpucoll._native.p2p import sent_at_start, settled_together  # noqa: E402

windows = {}
for api, comm_, waitall in (("gpucoll.MPI", comm, MPI.Request.Waitall),
                            ("gpucoll", gpucoll.COMM_WORLD, gpucoll.Request.Waitall)):
    for with_status in (False, True):
        got = [np.full(4, -1, np.int64) for _ in range(16)]
        before, sent_before = settled_together(), sent_at_start()
        reqs = [comm_.Irecv(g, peer, 8) for g in got]
        reqs += [comm_.Isend(np.arange(4, dtype=np.int64) + 10 * k + 1000 * r, peer, 8) for k in range(16)]
        born_complete = sent_at_start() - sent_before
        statuses = [MPI.Status() if api == "gpucoll.MPI" else gpucoll.Status() for _ in reqs] if with_status else None
        waitall(reqs, statuses)
        exact = all((g == np.arange(4) + 10 * k + 1000 * peer).all() for k, g in enumerate(got))
        nulled = all(not q for q in reqs) if api == "gpucoll.MPI" else None
        windows[f"{api}{' statuses' if with_status else ''}"] = [exact, nulled, settled_together() - before,
                                                                   born_complete]
out["windows"] = windows

# A request of gpucoll.MPI's short paths is one native object: the engine's request is its own
# MPI.Request (and a gpucoll.Request); completing it nulls it in place
q = comm.Irecv(np.zeros(4, np.int64), peer, 9)
s = comm.Isend(np.arange(4, dtype=np.int64), peer, 9)
one = [[isinstance(x, MPI.Request), isinstance(x, gpucoll.Request), bool(x)] for x in (s, q)]
MPI.Request.Waitall([s, q])
out["one_object"] = one + [[bool(s), bool(q), q == MPI.REQUEST_NULL]]

comm.Barrier()
print("RESULT", json.dumps({"rank": r, **out}), flush=True)
