"""Two all-reduces on GPU buffers (two-shot, one-shot) for the GPUCOLL_DEBUG=INFO log test."""
import json
import os

import cupy as cp

import gpucoll

cp.cuda.Device(int(os.environ.get("GPUCOLL_DEVICE", "0"))).use()
comm = gpucoll.COMM_WORLD
x = cp.ones(1 << 18, cp.float32)
comm.Allreduce(gpucoll.IN_PLACE, x)
y = cp.ones(16, cp.float32)
comm.Allreduce(gpucoll.IN_PLACE, y)
print("RESULT " + json.dumps({"sum": float(x[0].get() + y[0].get())}), flush=True)
