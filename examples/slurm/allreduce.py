"""One allreduce across every rank of a Slurm job, checked exactly."""
import numpy as np

import gpucoll

c = gpucoll.COMM_WORLD
x = np.arange(100, dtype=np.int64) * (c.rank + 1)
c.Allreduce(gpucoll.IN_PLACE, x)
ok = bool((x == np.arange(100) * c.size * (c.size + 1) // 2).all())
print("HELLO", c.rank, c.size, c.local_rank, c.seam.context.boot.method, ok, flush=True)
