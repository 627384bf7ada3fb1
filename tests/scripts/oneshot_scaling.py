"""The direct engine's one-shot limit at this many ranks, and all-reduces and reduces on both sides
of it, exact.

    gpurun -np 8 python oneshot_scaling.py      -> "RESULT {json}" per rank
"""
import json

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
r, n = comm.rank, comm.size
comm.Barrier()  # the direct group exists from the first collective
group = comm._dispatch.direct.group()
exact = {}
for nbytes in (512, 1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10):
    count = nbytes // 8
    x = np.arange(count, dtype=np.int64) * (r + 1)
    want = np.arange(count, dtype=np.int64) * (n * (n + 1) // 2)
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    z = np.empty_like(x)
    comm.Reduce(x, z, root=n - 1)
    exact[nbytes] = bool((y == want).all()) and (r != n - 1 or bool((z == want).all()))
print("RESULT " + json.dumps({"rank": r, "oneshot_max": group.oneshot_max, "exact": exact}), flush=True)
