"""The first collective of a communicator, when a rank is late or gone (for tests/test_faults.py).

    gpurun -np N python first_call.py dies RANK   rank RANK raises before its first collective
    gpurun -np N python first_call.py late SECONDS  rank 0 reaches it SECONDS late

The first collective sets up the communicator's shared memory or sockets, waiting for the
other ranks' side. dies: the others ignore SIGTERM (so they outlive gpurun's fail-fast stop
long enough to report) and print "LOST {json}" with the error their Allreduce raised and how
long it took. late: every rank prints "RESULT {json}" with its Allreduce's result.
"""
import json
import signal
import sys
import time

import numpy as np

import gpucoll

mode, arg = sys.argv[1], int(sys.argv[2])
if mode == "dies":
    # Before joining: the rank that dies passes the join only once every rank has set this.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
comm = gpucoll.COMM_WORLD  # every rank has joined: what follows is the first collective's set-up
rank, size = comm.rank, comm.size
x = np.full(8, rank + 1, np.float32)

if mode == "dies":
    if rank == arg:
        raise RuntimeError(f"rank {rank} gives up before its first collective")
    start = time.monotonic()
    try:
        comm.Allreduce(gpucoll.IN_PLACE, x)
        info = {"type": "none"}
    except gpucoll.GpucollError as exc:
        info = {"type": type(exc).__name__, "message": str(exc), "ranks": list(getattr(exc, "ranks", ()))}
    info["elapsed"] = time.monotonic() - start
    print("LOST " + json.dumps(info), flush=True)
elif mode == "late":
    if rank == 0:
        time.sleep(arg)
    comm.Allreduce(gpucoll.IN_PLACE, x)
    print("RESULT " + json.dumps(x.tolist()), flush=True)
else:
    sys.exit(f"unknown mode {mode}")
