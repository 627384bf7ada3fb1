"""comm.group() with host buffers: Send/Recv start at once and complete when the block ends,
collectives run at once, nested blocks join the outer one.

    gpurun -np N python group_host.py       # prints "RESULT {json}" on every rank
"""
import json

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
right, left = (r + 1) % n, (r - 1) % n
big = 1 << 20  # large enough that a blocking exchange would need the receive posted first
out = np.arange(big, dtype=np.float64) + r
got, got2 = np.zeros(big), np.zeros(4, np.int32)
total = np.array([r + 1], np.int64)
with comm.group():
    comm.Send(out, right, tag=1)              # both ranks send first: fine inside a group
    comm.Recv(got, left, tag=1)
    comm.Allreduce(gpucoll.IN_PLACE, total)   # a host collective runs at once
    allreduce_inside = int(total[0])
    with comm.group():                        # joins the outer group
        comm.Sendrecv(np.full(4, r, np.int32), right, 2, got2, left, 2)
print("RESULT " + json.dumps({
    "ring": bool((got == np.arange(big, dtype=np.float64) + left).all()),
    "sendrecv": got2.tolist(),
    "allreduce_inside": allreduce_inside,
}), flush=True)
