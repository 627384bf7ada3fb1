"""Host point to point on the native engine, two ranks (tests/test_p2p_native.py).

    gpurun -np 2 python p2p_native.py MODE

  order      rank 0 sends eager and rendezvous sizes mixed on one tag, then tagged ones; rank 1
             receives with ANY_TAG / ANY_SOURCE: every message whole, in the order sent, and no
             Python thread but the listener's in the process
  truncate   receive buffers smaller than an eager and a rendezvous message: the receiver's
             error names both sizes, the sender's Send returns, the next message arrives
  tags       tags outside 0..TAG_UB: InvalidUsageError on Send, Recv, send and Isend
  crossing   both ranks Send large messages to each other first (GPUCOLL_TIMEOUT short): both
             Sends give up naming the peer and the way out; small ones cross fine; Sendrecv
             of large messages never deadlocks
  requests   many Isend/Irecv completed by Waitall, Waitany, Testall, Waitsome (gpucoll.MPI)
  progress   rank 1 posts an Irecv of a large message, then only polls Iprobe for a later one:
             the probes move the first one's bytes, so rank 0's blocking Send returns and the
             later message comes (gpucoll.MPI)
  receiver-dies  rank 1 ends without receiving: rank 0's large Send raises LostPeerError naming it
  sender-dies    rank 0 ends right after an Isend of a large message: rank 1's Recv raises
                 LostPeerError naming rank 0
  stray-ack, stray-cts, stray-data  rank 0 writes an answer (ACK, CTS or DATA frame) naming a send
             rank 1 never made: rank 1's pending receive from rank 0 raises LostPeerError saying so
  stripes    runs of equal small messages through several TCP stripe chunks, by Send, by windows of
             Isends the receiver reads late (the socket fills: frames and their padding go out in
             parts) and as a ping-pong: every message whole, in order
  huge       (opt-in) a message of 2^31 + 4099 bytes arrives intact
  envelope   rank 0 sends envelopes of GPU messages (gpucoll/engines/p2p/outboxes.py) that nothing can map;
             rank 1 receives into host buffers with Recv, Irecv and Recv with a status: each raises
             saying why, never hands the envelope over as the message; MPI Probe reports the size
             an envelope announces, Iprobe of an OFFER message that is no envelope raises
Prints "RESULT {json}" on each rank that has something to say.
"""
import json
import os
import sys
import time

import numpy as np

import gpucoll
from gpucoll import ANY_SOURCE, ANY_TAG, Status
from p2p_checks import error_of, pattern

mode = sys.argv[1]
comm = gpucoll.COMM_WORLD
rank, peer = comm.rank, 1 - comm.rank
out = {}


if mode == "order":
    sizes = [8, 3 << 20, 0, 100, 1 << 20, 70000, 17, 5 << 20, 16384, 16385]
    if rank == 0:
        for i, n in enumerate(sizes):
            comm.Send(pattern(n, i), 1, tag=5)
        gpucoll.Request.Waitall([comm.Isend(pattern(200000, t), 1, tag=t) for t in (9, 8, 7)])
    else:
        got, whole = [], []
        for i, n in enumerate(sizes):
            buf = np.zeros(6 << 20, np.uint8)
            st = Status()
            comm.Recv(buf, ANY_SOURCE, ANY_TAG, status=st)
            got.append([st.Get_source(), st.Get_tag(), st.Get_count()])
            whole.append(bool(np.array_equal(buf[:st.Get_count()], pattern(n, i))))
        tagged = {}
        for t in (7, 8, 9):  # received in another order than sent: matched by tag
            buf = np.zeros(200000, np.uint8)
            comm.Recv(buf, 0, t)
            tagged[t] = bool(np.array_equal(buf, pattern(200000, t)))
        import threading

        # once the channel is open, no Python thread moves messages: only the listener remains
        threads = sorted(t.name for t in threading.enumerate())
        out = {"got": got, "whole": whole, "tagged": tagged, "threads": threads}
elif mode == "stripes":
    runs = [(100, 12000), (2000, 3000), (20000, 3000)]   # 1-60 MB: chunk ends on every socket, full sockets
    ok = []
    for n, count in runs:
        if rank == 0:
            for i in range(count):
                comm.Send(pattern(n, i), 1, tag=1)
            reqs = [comm.Isend(pattern(n, i), 1, tag=2) for i in range(count)]
            gpucoll.Request.Waitall(reqs)
        else:
            buf = np.zeros(n, np.uint8)
            whole = True
            for i in range(count):
                comm.Recv(buf, 0, tag=1)
                whole &= bool(np.array_equal(buf, pattern(n, i)))
            time.sleep(0.2)   # the window waits in the sockets meanwhile
            bufs = [np.zeros(n, np.uint8) for _ in range(count)]
            gpucoll.Request.Waitall([comm.Irecv(b, 0, tag=2) for b in bufs])
            whole &= all(np.array_equal(b, pattern(n, i)) for i, b in enumerate(bufs))
            ok.append(whole)
        a, b = pattern(n, 7), np.zeros(n, np.uint8)
        pingpong = True
        for i in range(count // 2):
            if rank == 0:
                comm.Send(a, 1, tag=3)
                comm.Recv(b, 1, tag=3)
            else:
                comm.Recv(b, 0, tag=3)
                comm.Send(b, 0, tag=3)
            pingpong &= bool(np.array_equal(b, a))
        ok.append(pingpong)
    out = {"whole": ok}

elif mode == "truncate":
    if rank == 0:
        times = []
        for n in (300, 2 << 20):
            t0 = time.monotonic()
            comm.Send(pattern(n, 1), 1, tag=1)
            times.append(time.monotonic() - t0)
        comm.Send(pattern(2 << 20, 2), 1, tag=2)
        out = {"send_seconds": times}
    else:
        errors = [error_of(lambda: comm.Recv(np.zeros(100, np.uint8), 0, 1)),
                  error_of(lambda: comm.Recv(np.zeros(1000, np.uint8), 0, 1))]
        buf = np.zeros(2 << 20, np.uint8)
        comm.Recv(buf, 0, 2)
        out = {"errors": errors, "next": bool(np.array_equal(buf, pattern(2 << 20, 2)))}
elif mode == "tags":
    from gpucoll import MPI

    b = np.zeros(4, np.uint8)
    mpi = MPI.COMM_WORLD
    out = {"send_above": error_of(lambda: comm.Send(b, peer, tag=2**31)),
           "send_negative": error_of(lambda: comm.Send(b, peer, tag=-3)),
           "isend_above": error_of(lambda: comm.Isend(b, peer, tag=2**40)),
           "recv_negative": error_of(lambda: comm.Recv(b, peer, tag=-5)),
           "recv_above": error_of(lambda: comm.Recv(b, peer, tag=2**31)),
           "object_above": error_of(lambda: comm.send("x", peer, tag=2**31)),
           "mpi_above": error_of(lambda: mpi.Send(b, peer, tag=mpi.Get_attr(MPI.TAG_UB) + 1))}
    comm.Send(b + rank, peer, tag=2**31 - 1)  # TAG_UB itself is a tag
    comm.Recv(b, peer, tag=2**31 - 1)
    out["tag_ub_ok"] = int(b[0]) == peer
elif mode == "crossing":
    big = pattern(4 << 20, rank)
    t0 = time.monotonic()
    out["send_first"] = error_of(lambda: comm.Send(big, peer, tag=1))
    out["send_first_seconds"] = time.monotonic() - t0
    comm.Barrier()
    small = np.full(1000, rank, np.uint8)
    comm.Send(small, peer, tag=2)  # eager: both go out, then both are received
    got = np.zeros(1000, np.uint8)
    comm.Recv(got, peer, tag=2)
    out["small_crossed"] = bool((got == peer).all())
    recv = np.zeros(8 << 20, np.uint8)
    st = Status()
    comm.Sendrecv(pattern(8 << 20, 10 + rank), peer, 3, recv, peer, 3, status=st)
    out["sendrecv"] = [bool(np.array_equal(recv, pattern(8 << 20, 10 + peer))), st.Get_count()]
elif mode == "requests":
    from gpucoll import MPI

    mpi = MPI.COMM_WORLD
    n = 40
    sizes = [(i * 37 % 5) * 30000 + 8 for i in range(n)]  # eager and rendezvous mixed
    sends = [mpi.Isend(pattern(s, i + rank), peer, tag=i) for i, s in enumerate(sizes)]
    bufs = [np.zeros(s, np.uint8) for s in sizes]
    recvs = [mpi.Irecv(b, peer, tag=i) for i, b in enumerate(bufs)]
    first = MPI.Request.Waitany(recvs[:10])
    some = MPI.Request.Waitsome(recvs[10:20])
    MPI.Request.Waitall(recvs)
    MPI.Request.Waitall(sends)
    ok = all(np.array_equal(b, pattern(s, i + peer)) for i, (b, s) in enumerate(zip(bufs, sizes)))
    later = [mpi.Irecv(np.zeros(8, np.uint8), peer, tag=100)]
    before = MPI.Request.Testall(later)
    mpi.Barrier()
    mpi.Send(np.zeros(8, np.uint8), peer, tag=100)
    deadline = time.monotonic() + 10
    while not MPI.Request.Testall(later) and time.monotonic() < deadline:
        pass
    out = {"whole": ok, "waitany": 0 <= first < 10, "waitsome": bool(some), "testall_before": before,
           "testall_after": MPI.Request.Testall(later)}
elif mode == "progress":
    from gpucoll import MPI

    mpi = MPI.COMM_WORLD
    if rank == 0:
        t0 = time.monotonic()
        mpi.Send(pattern(4 << 20, 3), 1, tag=1)  # returns once rank 1 has taken the bytes
        out = {"send_seconds": time.monotonic() - t0}
        mpi.Send(np.ones(8, np.uint8), 1, tag=2)
    else:
        big = np.zeros(4 << 20, np.uint8)
        req = mpi.Irecv(big, 0, tag=1)
        deadline = time.monotonic() + 10
        probed = False
        while not probed and time.monotonic() < deadline:
            probed = mpi.Iprobe(0, 2)
        mpi.Recv(np.zeros(8, np.uint8), 0, tag=2) if probed else None
        req.Wait()
        out = {"probed": bool(probed), "whole": bool(np.array_equal(big, pattern(4 << 20, 3)))}
elif mode == "receiver-dies":
    comm.send("warm-up", peer, tag=9)  # the channel exists before the rendezvous starts
    comm.recv(source=peer, tag=9)
    comm.Barrier()
    if rank == 1:
        os._exit(0)  # gone without receiving
    t0 = time.monotonic()
    out = {"error": error_of(lambda: comm.Send(pattern(8 << 20, 0), 1, tag=4)), "seconds": time.monotonic() - t0}
elif mode == "sender-dies":
    if rank == 0:
        req = comm.Isend(pattern(32 << 20, 0), 1, tag=4)  # announced; its bytes are in this process
        comm.Barrier()
        os._exit(0)
    comm.Barrier()
    time.sleep(0.5)
    t0 = time.monotonic()
    out = {"error": error_of(lambda: comm.Recv(np.zeros(32 << 20, np.uint8), 0, tag=4)),
           "seconds": time.monotonic() - t0}
elif mode.startswith("stray-"):
    kind = {"cts": 3, "data": 4, "ack": 5}[mode[6:]]  # the answers' kinds (gc_p2p.h)
    comm.send("warm-up", peer, tag=9)  # the channel exists
    comm.recv(source=peer, tag=9)
    if rank == 1:
        req = comm.Irecv(np.zeros(8, np.uint8), 0, tag=4)
        comm.Barrier()
        t0 = time.monotonic()
        out = {"error": error_of(req.Wait), "seconds": time.monotonic() - t0}
    else:
        comm.Barrier()
        from gpucoll.engines.p2p import host as p2p

        comm.seam.context.p2p.native.raw(1, p2p.FRAME.pack(0, 0, kind, 8, 424242, 0, 0) + bytes(8 if kind == 4 else 0))
    comm.Barrier()
elif mode == "huge":
    n = (1 << 31) + 4099
    block = pattern(251 * (1 << 20), 0)  # the pattern repeats every 251 bytes
    if rank == 0:
        a = np.empty(n, np.uint8)
        for at in range(0, n, len(block)):
            a[at:at + len(block)] = block[:n - at]
        t0 = time.monotonic()
        comm.Send(a, 1, tag=1)
        out = {"seconds": time.monotonic() - t0}
    else:
        b = np.zeros(n, np.uint8)
        st = Status()
        comm.Recv(b, 0, tag=1, status=st)
        whole = all(np.array_equal(b[at:at + len(block)], block[:n - at]) for at in range(0, n, len(block)))
        out = {"whole": whole, "count": st.Get_count()}
elif mode == "envelope":
    # Envelopes of GPU messages (data left in the sender's GPU memory) that no GPU process can
    # map: every host receive path (the blocking short path included) must raise, never hand
    # the envelope over as the message; a plain message behind them still arrives.
    from gpucoll import MPI
    from gpucoll.engines.p2p.outboxes import LARGE, LARGE_KIND, SMALL, SMALL_KIND
    from gpucoll.engines.p2p.host import OFFER_FLAG

    if rank == 0:
        p = comm.seam.p2p
        for tag in (1, 2, 3):
            p.send_bytes(LARGE.pack(LARGE_KIND, b"h" * 64, 0, 5000, tag, b"b" * 64, 0), 1, tag, "Send",
                         OFFER_FLAG).Wait()
        comm.Send(pattern(5000, 4), 1, tag=4)
        core = MPI.COMM_WORLD._c()  # MPI probes: one envelope, one OFFER message that is none
        core.seam.p2p.send_bytes(SMALL.pack(SMALL_KIND, b"h" * 64, 0, 3000, 1), 1, 5, "Send", OFFER_FLAG).Wait()
        core.seam.p2p.send_bytes(b"junk", 1, 6, "Send", OFFER_FLAG).Wait()
    else:
        got = {}
        for tag in (1, 2, 3):
            b, st = np.zeros(5000, np.uint8), Status()
            try:
                if tag == 2:
                    comm.Irecv(b, 0, tag).Wait(st)
                else:
                    comm.Recv(b, 0, tag, status=st)
                got[tag] = f"no error, {st.Get_count()} bytes"
            except gpucoll.GpucollError as exc:
                got[tag] = str(exc)
            got[f"{tag} untouched"] = not b.any()
        b = np.zeros(5000, np.uint8)
        comm.Recv(b, 0, tag=4)
        st = MPI.Status()
        MPI.COMM_WORLD.Probe(0, 5, st)
        probed = [st.Get_source(), st.Get_tag(), st.Get_count()]
        try:
            while not MPI.COMM_WORLD.Iprobe(0, 6):
                pass
            probed.append("no error")
        except gpucoll.GpucollError as exc:
            probed.append(str(exc))
        out = {"got": got, "after": bool(np.array_equal(b, pattern(5000, 4))), "probed": probed}
if out:
    print("RESULT " + json.dumps(out), flush=True)
comm.Barrier() if mode not in ("receiver-dies", "sender-dies") else None
