"""Large messages within a host copied by both sides at once (gc_p2p.h: a shared copy), two ranks
(tests/test_p2p_shared.py).

    gpurun -np 2 python p2p_shared.py MODE

  window         rank 0 sends a window of large messages (Isend, Issend, an object, sizes that are
                 not a multiple of a chunk), rank 1 receives them (Irecv, Mprobe + Mrecv, recv);
                 every byte checked; each rank says how many rendezvous bytes it read and wrote
  both-ways      both ranks send and receive a window at once (bidirectional)
  lazy-sender    rank 0 starts an Isend and then sleeps without calling gpucoll: rank 1's Recv
                 completes alone, long before rank 0 wakes
  sender-dies    rank 1 has read part of a large message when rank 0 ends: LostPeerError on rank 1
  receiver-dies  rank 1 has read part of a large message and ends: rank 0's wait (writing its
                 chunks into rank 1's memory) raises LostPeerError
Prints "RESULT {json}" on each rank.
"""
import os
import sys
import time

import numpy as np

import gpucoll
from gpucoll import MPI
from p2p_checks import error_of, pattern

mode = sys.argv[1]
comm = gpucoll.COMM_WORLD
mpi = MPI.COMM_WORLD
rank, peer = comm.rank, 1 - comm.rank
native = comm.seam.context.p2p.native
SIZES = [256 << 10, (256 << 10) + 1, (3 << 20) + 17, (40 << 20) + 5, 8 << 20]


def copied():
    read, written = native.copied()
    return {"read": read, "written": written}


def window_payloads(seed):
    """The arrays send_window sends, made before anything is posted: a pattern of 40 MiB takes
    longer to make than the receiver takes to read the messages before it, which would leave the
    sender nothing to copy."""
    return [pattern(n, seed + i) for i, n in enumerate(SIZES)] + [pattern(5 << 20, seed + 99)]


def send_window(dest, payloads):
    """Isends and one Issend of SIZES, then an object holding an array; the requests."""
    reqs = [mpi.Isend(p, dest, tag=i) for i, p in enumerate(payloads[:len(SIZES) - 1])]
    reqs.append(mpi.Issend(payloads[len(SIZES) - 1], dest, tag=len(SIZES) - 1))
    reqs.append(mpi.isend(payloads[-1], dest, tag=99))
    return reqs


def receive_window(source, seed):
    """The receives of send_window (the last sized one by Mprobe + Mrecv); a check of each."""
    bufs = [np.zeros(n, np.uint8) for n in SIZES]
    reqs = [mpi.Irecv(b, source, tag=i) for i, b in enumerate(bufs[:-1])]
    obj = mpi.irecv(source=source, tag=99)
    msg = mpi.Mprobe(source, len(SIZES) - 1)
    msg.Recv(bufs[-1])

    def check():
        whole = [bool(np.array_equal(b, pattern(n, seed + i))) for i, (b, n) in enumerate(zip(bufs, SIZES))]
        return whole + [bool(np.array_equal(obj.wait(), pattern(5 << 20, seed + 99)))]
    return reqs, check


payloads = window_payloads(10 * rank) if mode in ("window", "both-ways") else None
comm.send("warm-up", peer, tag=1000)  # the channel exists before anything is timed
comm.recv(source=peer, tag=1000)
comm.Barrier()
out = {}
if mode == "window":
    if rank == 0:
        MPI.Request.Waitall(send_window(1, payloads))
    else:
        reqs, check = receive_window(0, 0)
        MPI.Request.Waitall(reqs)
        out["whole"] = check()
    out.update(copied())
elif mode == "both-ways":
    recvs, check = None, None
    sends = send_window(peer, payloads)
    recvs, check = receive_window(peer, 10 * peer)
    MPI.Request.Waitall(sends + recvs)
    out = dict(copied(), whole=check())
elif mode == "lazy-sender":
    n = 64 << 20
    if rank == 0:
        req = comm.Isend(pattern(n, 5), 1, tag=4)
        comm.Barrier()
        time.sleep(3)          # no gpucoll call: nothing here helps
        req.Wait()
        out = copied()
    else:
        comm.Barrier()
        buf = np.zeros(n, np.uint8)
        t0 = time.monotonic()
        comm.Recv(buf, 0, tag=4)
        out = dict(copied(), seconds=time.monotonic() - t0, whole=bool(np.array_equal(buf, pattern(n, 5))))
elif mode in ("sender-dies", "receiver-dies"):
    n = 256 << 20
    if rank == 0:
        req = comm.Isend(pattern(n, 0), 1, tag=4)
        req.Test()             # a wait with no receive of its own: free to help, rank 1 reads chunk by chunk
        comm.Barrier()
        comm.Barrier()         # rank 1 has read a part
        if mode == "sender-dies":
            os._exit(0)
        t0 = time.monotonic()
        out = {"error": error_of(req.Wait), "seconds": time.monotonic() - t0}
    else:
        comm.Barrier()
        buf = np.zeros(n, np.uint8)
        req = comm.Irecv(buf, 0, tag=4)
        while native.copied()[0] == 0:
            req.Test()         # each test reads one chunk
        out = {"partly": native.copied()[0] < n}
        comm.Barrier()
        if mode == "receiver-dies":
            os._exit(0)
        t0 = time.monotonic()
        out.update(error=error_of(req.Wait), seconds=time.monotonic() - t0)
else:
    sys.exit(f"unknown mode {mode}")
print("RESULT", __import__("json").dumps(out), flush=True)
