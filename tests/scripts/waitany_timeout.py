"""Waitany over receives that never come ends after GPUCOLL_TIMEOUT with a clear error."""
import json
import os
import time

import numpy as np

import gpucoll
from gpucoll import MPI

comm = gpucoll.COMM_WORLD
if comm.rank == 1:
    os.environ["GPUCOLL_TIMEOUT"] = "1"  # this wait only: the communicator keeps its own
    reqs = [comm.Irecv(np.empty(2), source=0, tag=5), comm.Irecv(np.empty(2), source=0, tag=6)]
    start = time.monotonic()
    try:
        MPI.Request.Waitany(reqs)
        out = {"type": "none"}
    except gpucoll.GpucollError as exc:
        out = {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    print("RESULT " + json.dumps(out), flush=True)
comm.Barrier()
