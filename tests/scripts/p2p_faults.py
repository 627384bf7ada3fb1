"""Point-to-point failures on the receiving side, with GPUCOLL_TIMEOUT short:

  unpickle  rank 0 sends an object that cannot be rebuilt on rank 1, then a plain one: rank 1's
            recv raises the unpickling error and the next recv still gets its message
  cut       rank 0's channel to rank 1 closes in the middle of a message that rank 1 is
            receiving: rank 1's Wait raises LostPeerError instead of blocking
  huge      (3 ranks) rank 0 writes a frame header announcing 2^62 bytes on its (authenticated)
            channel to rank 1; rank 1 prints RESULT {from_0: the error of its receive from
            rank 0, from_2: what its receive from rank 2 got}
"""
import json
import sys
import time

import numpy as np

import gpucoll
from gpucoll.engines.p2p import host as p2p

mode = sys.argv[1]
comm = gpucoll.COMM_WORLD


def _refuse():
    raise ValueError("this object cannot be rebuilt here")


class Unpicklable:
    def __reduce__(self):
        return (_refuse, ())


if mode == "unpickle":
    if comm.rank == 0:
        comm.send(Unpicklable(), 1, tag=1)
        comm.send("after", 1, tag=2)
    else:
        try:
            comm.recv(source=0, tag=1)
            print("RESULT-NO-ERROR")
        except ValueError as exc:
            print("RAISED", exc)
        print("NEXT", comm.recv(source=0, tag=2))
elif mode == "huge":
    if comm.rank == 1:
        req = comm.irecv(source=0, tag=5)
        comm.Barrier()
        try:
            from_0 = {"type": "none", "value": repr(req.wait())}
        except gpucoll.GpucollError as exc:
            from_0 = {"type": type(exc).__name__, "message": str(exc)}
        print("RESULT " + json.dumps({"from_0": from_0, "from_2": comm.recv(source=2, tag=6)}), flush=True)
    else:
        comm.Barrier()
        if comm.rank == 0:
            engine = comm.seam.context.p2p
            engine.links.ensure(1)
            engine.native.raw(1, p2p.FRAME.pack(comm.seam.p2p._key, 5, p2p.EAGER, 1 << 62, 0, 0, 0))
        else:
            comm.send("fine", 1, tag=6)
    comm.Barrier()
elif mode == "cut":
    if comm.rank == 1:
        buf = np.zeros(1 << 16, np.uint8)
        req = comm.Irecv(buf, source=0, tag=5)
        comm.Barrier()  # the receive is posted before the message starts
        t0 = time.monotonic()
        try:
            req.Wait()
            print("RESULT-NO-ERROR")
        except gpucoll.GpucollError as exc:
            print("CUT " + json.dumps({"type": type(exc).__name__, "message": str(exc),
                                       "elapsed": time.monotonic() - t0}))
    else:
        comm.Barrier()
        engine = comm.seam.context.p2p
        engine.links.ensure(1)  # a header for 64 KiB, 100 bytes of it, then the channel ends
        engine.native.raw(1, p2p.FRAME.pack(comm.seam.p2p._key, 5, p2p.EAGER, 1 << 16, 0, 0, 0) + bytes(100))
        engine.links.close_channel(1)
    comm.Barrier()
