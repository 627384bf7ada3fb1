"""Nonblocking collectives and point-to-point, several in flight at once.

    gpurun -np 3 python nonblocking.py

Prints "RESULT {json}" per rank; tests/test_nonblocking.py asserts the numbers.
"""
import json
import time

import numpy as np

import gpucoll
from gpucoll import Request

comm = gpucoll.COMM_WORLD
rank, size = comm.rank, comm.size
out = {}

# --- many collectives in flight, then Waitall --------------------------------------------------
n = 5
ar = np.full(n, rank + 1, np.float64)
bc = np.arange(n, dtype=np.int32) if rank == size - 1 else np.zeros(n, np.int32)
ag = np.empty(size * 2, np.int64)
rs_in = np.arange(size * 3, dtype=np.int32) * (rank + 1)
rs = np.empty(3, np.int32)
a2a = np.empty(size, np.int16)
red = np.empty(2, np.float32)
gat = np.empty(size, np.int8) if rank == 0 else None
sca = np.empty(2, np.uint16)
reqs = [
    comm.Iallreduce(gpucoll.IN_PLACE, ar),
    comm.Ibcast(bc, root=size - 1),
    comm.Iallgather(np.array([rank, -rank], np.int64), ag),
    comm.Ireduce_scatter_block(rs_in, rs, op=gpucoll.MAX),
    comm.Ialltoall(np.array([10 * rank + j for j in range(size)], np.int16), a2a),
    comm.Ireduce(np.array([rank, 1], np.float32), red, op=gpucoll.SUM, root=0),
    comm.Igather(np.array([rank], np.int8), gat, root=0),
    comm.Iscatter(np.arange(2 * size, dtype=np.uint16) if rank == 1 else None, sca, root=1),
    comm.Ibarrier(),
]
# a blocking call issued while those are pending runs after them, in order
blk = np.array([rank], np.int64)
comm.Allreduce(gpucoll.IN_PLACE, blk)
Request.Waitall(reqs)
out["in_flight"] = {
    "allreduce": ar.tolist(), "bcast": bc.tolist(), "allgather": ag.tolist(), "reduce_scatter": rs.tolist(),
    "alltoall": a2a.tolist(), "reduce": red.tolist() if rank == 0 else None,
    "gather": gat.tolist() if rank == 0 else None, "scatter": sca.tolist(), "blocking_after": int(blk[0]),
    "all_tested_true": all(r.Test() for r in reqs),
}

# --- overlap: Test() is false while rank 0 is late, then true ---------------------------------
comm.Barrier()
x = np.full(1000, float(rank), np.float32)
if rank == 0:
    time.sleep(1.0)
start = time.monotonic()
req = comm.Iallreduce(gpucoll.IN_PLACE, x)
first_test = req.Test()
work = 0
while not req.Test():  # the caller keeps working while the operation is pending
    work += 1
    time.sleep(0.001)
    if time.monotonic() - start > 30:
        break
out["overlap"] = {"first_test": first_test, "done": req.Test(), "waited": time.monotonic() - start,
                  "work_done_while_pending": work, "value": float(x[0])}
req.Wait()  # Wait after completion returns at once

# --- Isend / Irecv with tags and ANY_SOURCE -----------------------------------------------------
def kinds(requests):
    """The request types' full names: the short paths' are the native type, settled in C."""
    return sorted({f"{type(r).__module__}.{type(r).__name__}" for r in requests})


comm.Barrier()
p2p = {}
if rank == 0:
    anys = []
    for _ in range(size - 1):
        buf = np.zeros(1, np.int32)
        st = gpucoll.Status()
        anys.append((buf, st, comm.Irecv(buf, source=gpucoll.ANY_SOURCE, tag=99)))
    tagged = []
    for src in range(1, size):
        buf = np.zeros(2, np.int32)
        tagged.append((src, buf, comm.Irecv(buf, source=src, tag=10 + src)))
    Request.Waitall([r for _, _, r in anys] + [r for _, _, r in tagged],
                    [st for _, st, _ in anys] + [None] * len(tagged))
    # mpi4py's way to learn who sent an ANY_SOURCE message: the status given to Wait(all)
    p2p["any_source"] = sorted([st.Get_source(), st.Get_tag(), int(b[0])] for b, st, _ in anys)
    p2p["tagged"] = {str(src): buf.tolist() for src, buf, _ in tagged}
    # out of order by tag: the tag-2 message is taken before the tag-1 one that came first
    if size > 1:
        second, first = np.zeros(1, np.int64), np.zeros(1, np.int64)
        st2 = gpucoll.Status()
        comm.Recv(second, source=1, tag=2, status=st2)
        comm.Recv(first, source=1, tag=1)
        p2p["by_tag"] = [int(first[0]), int(second[0])]
        p2p["status_of_tag2"] = [st2.Get_source(), st2.Get_tag(), st2.Get_count()]
        # ANY_SOURCE + ANY_TAG, with the status naming who sent what
        seen = []
        for _ in range(size - 1):
            got, st = np.zeros(1, np.int64), gpucoll.Status()
            comm.Recv(got, source=gpucoll.ANY_SOURCE, tag=gpucoll.ANY_TAG, status=st)
            seen.append([st.Get_source(), st.Get_tag(), int(got[0])])
        p2p["any_any"] = sorted(seen)
    comm.Barrier()  # nothing else is sent before the ANY_TAG receives are done
    if size > 1:
        # same source and tag: messages arrive in the order they were sent
        stream = []
        for _ in range(20):
            got = np.zeros(1, np.int64)
            comm.Recv(got, source=1, tag=7)
            stream.append(int(got[0]))
        p2p["fifo"] = stream
        # Waitany returns some finished request
        bufs = [np.zeros(1, np.int64) for _ in range(size - 1)]
        rq = [comm.Irecv(bufs[i], source=i + 1, tag=55) for i in range(size - 1)]
        done = set()
        while len(done) < len(rq):
            live = [r for i, r in enumerate(rq) if i not in done]
            st = gpucoll.Status()
            j = Request.Waitany(live, st)
            done.add(rq.index(live[j]))
            if st.Get_source() != rq.index(live[j]) + 1:
                p2p["waitany_status_wrong"] = st.Get_source()
        p2p["waitany"] = sorted(int(b[0]) for b in bufs)
        p2p["irecv_status"] = [[r.status.Get_source(), r.status.Get_tag(), r.status.Get_count()] for r in rq]
        p2p["irecv_types"] = kinds(rq)
        p2p["waitany_empty"] = Request.Waitany([])
else:
    sends = [comm.Isend(np.array([100 + rank], np.int32), dest=0, tag=99),
             comm.Isend(np.array([rank, rank * rank], np.int32), dest=0, tag=10 + rank)]
    if rank == 1:
        comm.Send(np.array([1], np.int64), dest=0, tag=1)
        comm.Send(np.array([2], np.int64), dest=0, tag=2)
    sends.append(comm.Isend(np.array([1000 + rank], np.int64), dest=0, tag=30 + rank))
    comm.Barrier()
    if rank == 1:
        sends += [comm.Isend(np.array([i], np.int64), dest=0, tag=7) for i in range(20)]
    sends.append(comm.Isend(np.array([rank], np.int64), dest=0, tag=55))
    Request.Waitall(sends)
    p2p["isends_tested_true"] = Request.Testall(sends)
    # a point-to-point request is a gpucoll.Request, with all of its interface
    last = sends[-1]
    p2p["isend_requests"] = [all(isinstance(r, Request) for r in sends), last.Get_status(), bool(last),
                             list(last.test()), last.wait(), repr(last)]
    p2p["isend_types"] = kinds(sends)
    try:
        last.Cancel()
    except NotImplementedError as exc:
        p2p["isend_cancel"] = str(exc)
out["p2p"] = p2p
comm.Barrier()
print("RESULT " + json.dumps(out), flush=True)
