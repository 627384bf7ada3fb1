"""comm.group() with host buffers: Send/Recv start at once and complete when the block ends,
collectives run at once, nested blocks join the outer one.

    GPUCOLL_TIMEOUT=10 gpurun -np N python group_host.py       # prints "RESULT {json}" on every rank

Every rank receives before it sends, in a ring: without the group the first Recv would wait
for a message that no rank has sent yet, and fail after GPUCOLL_TIMEOUT.
"""
import json

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
right, left = (r + 1) % n, (r - 1) % n
big = 1 << 20
out = np.arange(big, dtype=np.float64) * (r + 1)
got, got2 = np.zeros(big), np.zeros(4, np.int32)
total = np.array([r + 1], np.int64)
before = comm.stats()
with comm.group():
    comm.Recv(got, left, tag=1)               # every rank receives first: returns at once in a group
    comm.Send(out, right, tag=1)
    comm.Allreduce(gpucoll.IN_PLACE, total)   # a host collective runs at once
    allreduce_inside = int(total[0])
    with comm.group():                        # joins the outer group
        comm.Sendrecv(np.full(4, r, np.int32), right, 2, got2, left, 2)
    nested = comm.stats()["groups"] - before["groups"]
after = comm.stats()
print("RESULT " + json.dumps({
    "ring": bool((got == np.arange(big, dtype=np.float64) * (left + 1)).all()),
    "sendrecv": got2.tolist(),
    "allreduce_inside": allreduce_inside,
    "groups": [nested, after["groups"] - before["groups"]],
    "completed_at_end": after["group_p2p"] - before["group_p2p"],
}), flush=True)
