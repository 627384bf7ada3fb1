"""Rank program of tests/test_fault_tolerance.py: receives from ANY_SOURCE when a rank fails (ULFM),
under gpurun --on-failure=continue, 5 ranks, through gpucoll's API (own) or gpucoll.MPI (mpi).

Rank 4 ends well at once and rank 3 dies at once (SIGKILL). Rank 0 posts a nonblocking receive
from any rank (mpi: two, on the short and the general path): its wait fails for rank 3 only (a
rank that ended well is no failure), the receive stays posted and, once rank 3 is acknowledged,
takes the message rank 1 sends. Then rank 2 dies
while rank 0 waits in a blocking receive from any rank (mpi: in a Probe and an Iprobe first):
that fails for rank 2, and the receive is taken back, so the next message (from rank 1) reaches
the next receive. Rank 0 prints one RESULT line (JSON).

With a second argument `ended-well` (3 ranks, any --on-failure): rank 2 ends well at once, and
rank 0's blocking receive from any rank still takes rank 1's message, sent 0.5 s later.
"""
import json
import os
import signal
import sys
import time

import numpy as np

API = sys.argv[1]
if API == "mpi":
    from gpucoll import MPI
    world = MPI.COMM_WORLD
    ANY_SOURCE = MPI.ANY_SOURCE
else:
    import gpucoll
    world = gpucoll.COMM_WORLD
    ANY_SOURCE = gpucoll.ANY_SOURCE

FIRST, SECOND = np.arange(1.0, 5.0), np.arange(5.0, 9.0)


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def caught(call):
    """[exception class name, its MPI error class name or the ranks it names], or None."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - reported, the test checks which
        if API == "mpi":
            names = {getattr(MPI, n): n for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_OTHER")}
            return [type(exc).__name__, names.get(exc.Get_error_class(), exc.Get_error_class()), str(exc)]
        return [type(exc).__name__, list(exc.ranks), str(exc)]
    return None


def status():
    return MPI.Status() if API == "mpi" else gpucoll.Status()


def rank0(comm):
    got = {}
    buf = np.zeros(4)
    spec = [buf, MPI.DOUBLE] if API == "mpi" else buf
    req = comm.Irecv(spec, ANY_SOURCE, 5)
    if API == "mpi":
        # A derived datatype takes gpucoll.MPI's general path (the handle over a state), the
        # basic one above its short path (a request that is its own handle): both stay posted.
        four = MPI.DOUBLE.Create_contiguous(4).Commit()
        buf_general = np.zeros(4)
        general = comm.Irecv([buf_general, 1, four], ANY_SOURCE, 7)
        got["pending_general"] = caught(general.Wait)
    got["pending"] = caught(req.Wait)
    got["pending_again"] = caught(req.Wait)   # nothing acknowledged yet: the same answer
    got["failed"] = comm.Get_failed().Get_size() if API == "mpi" else comm.failed()
    got["acked"] = comm.Ack_failed() if API == "mpi" else comm.ack_failed()
    comm.send("go", dest=1, tag=1)
    st = status()
    req.Wait(st)
    got["first"] = [st.Get_source(), buf.tolist() == FIRST.tolist()]
    if API == "mpi":
        general.Wait(st)
        got["first_general"] = [st.Get_source(), buf_general.tolist() == FIRST.tolist()]

    comm.send("die", dest=2, tag=9)
    buf2 = np.zeros(4)
    spec2 = [buf2, MPI.DOUBLE] if API == "mpi" else buf2
    if API == "mpi":
        got["probe"] = caught(lambda: comm.Probe(ANY_SOURCE, 6))
        got["iprobe"] = caught(lambda: comm.Iprobe(ANY_SOURCE, 6))
    got["blocking"] = caught(lambda: comm.Recv(spec2, ANY_SOURCE, 6))
    got["acked_then"] = comm.Ack_failed() if API == "mpi" else comm.ack_failed()
    if API == "mpi":
        got["iprobe_acked"] = comm.Iprobe(ANY_SOURCE, 77)   # nothing sent with that tag: False
    comm.send("go", dest=1, tag=1)
    st2 = status()
    comm.Recv(spec2, ANY_SOURCE, 6, st2)
    got["second"] = [st2.Get_source(), buf2.tolist() == SECOND.tolist()]
    print("RESULT " + json.dumps(got), flush=True)


def ended_well(comm):
    """3 ranks: rank 2 ends well at once; rank 0's receive from any rank waits past that for
    rank 1's message."""
    me = comm.Get_rank()
    if me == 1:
        time.sleep(0.5)   # rank 2 is gone by now, and rank 0 has looked
        comm.Send(FIRST, dest=0, tag=5)
    elif me == 0:
        buf, st = np.zeros(4), status()
        comm.Recv([buf, MPI.DOUBLE] if API == "mpi" else buf, ANY_SOURCE, 5, st)
        print("RESULT " + json.dumps({"first": [st.Get_source(), buf.tolist() == FIRST.tolist()]}), flush=True)


def main():
    comm = world.Dup()
    me = comm.Get_rank()
    if len(sys.argv) > 2 and sys.argv[2] == "ended-well":
        ended_well(comm)
    elif me == 0:
        rank0(comm)
    elif me == 1:
        for tag, data in ((5, FIRST), (6, SECOND)):
            comm.recv(source=0, tag=1)
            comm.Send(data, dest=0, tag=tag)
            if tag == 5 and API == "mpi":
                comm.Send(data, dest=0, tag=7)   # to the general path's receive
    elif me == 2:
        comm.recv(source=0, tag=9)
        die()
    elif me == 3:
        die()
    # rank 4 ends well at once


main()
