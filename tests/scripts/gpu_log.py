"""Two all-reduces on GPU buffers (1 MiB two-shot under GPUCOLL_GPU_ONESHOT_MAX=256K, 64 B one-shot) for the
GPUCOLL_DEBUG=INFO log test."""
import json

import cupy as cp

import gpucoll
from gpu_device import one_gpu_per_rank

comm = gpucoll.COMM_WORLD
one_gpu_per_rank(comm)
x = cp.ones(1 << 18, cp.float32)
comm.Allreduce(gpucoll.IN_PLACE, x)
y = cp.ones(16, cp.float32)
comm.Allreduce(gpucoll.IN_PLACE, y)
print("RESULT " + json.dumps({"sum": float(x[0].get() + y[0].get())}), flush=True)
