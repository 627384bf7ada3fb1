"""Sequence numbers and byte counts as the COLL log shows them, 2+ ranks.

    GPUCOLL_DEBUG=INFO GPUCOLL_DEBUG_SUBSYS=COLL gpurun -np 2 python call_numbering.py

Rank 0 alone passes stream= with host buffers to a blocking and a nonblocking collective:
both are refused (InvalidUsageError) before they are numbered, so the calls every rank makes
afterwards carry the same sequence numbers on every rank (the test compares the log lines).
An all-gather of 2 int32 per rank then logs its per-rank bytes (8 B).
"""
import json

import numpy as np

import gpucoll
from gpucoll import IN_PLACE

comm = gpucoll.COMM_WORLD
out = {"refused": []}
x = np.ones(4, np.float32)
comm.Allreduce(IN_PLACE, x)                        # #0 everywhere
if comm.rank == 0:
    for name, call in {"Allreduce": lambda: comm.Allreduce(IN_PLACE, x, stream=1),
                       "Ibcast": lambda: comm.Ibcast(x, root=0, stream=7)}.items():
        try:
            call()
        except gpucoll.InvalidUsageError as exc:
            out["refused"].append([name, str(exc)])
comm.Allreduce(IN_PLACE, x)                        # #1 everywhere
got = np.empty(2 * comm.size, np.int32)
comm.Allgather(np.full(2, comm.rank, np.int32), got)  # #2, 8 B per rank
out["allgather"] = got.tolist()
print("RESULT " + json.dumps(out), flush=True)
