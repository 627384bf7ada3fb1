"""GPU collectives from a script that never selects a device (its arrays land on the current
device, GPU 0) or that selects its own, with CuPy or torch. Prints one `RESULT {json}` line per rank:
the device its buffers were on and whether each result was exact.

    gpu_any_device.py cupy|torch [--pick] [--capture]
"""
import json
import sys

import numpy as np

import gpucoll

LIB, PICK = sys.argv[1], "--pick" in sys.argv
comm = gpucoll.COMM_WORLD
n, r = comm.size, comm.rank
out = {"rank": r}

if LIB == "cupy":
    import cupy as cp

    if PICK:
        cp.cuda.Device(comm.local_rank % cp.cuda.runtime.getDeviceCount()).use()
    x = cp.arange(1000, dtype=cp.float32) + r
    y = cp.empty_like(x)
    table = cp.empty(3 * n, cp.int64)
    comm.Allreduce(x, y)
    comm.Allgather(cp.full(3, r + 1, cp.int64), table)
    b = cp.full(5, r, cp.float64)
    comm.Bcast(b, root=n - 1)
    out["device"] = x.device.id
    out["current"] = cp.cuda.runtime.getDevice()
    host = [cp.asnumpy(a) for a in (y, table, b)]
else:
    import torch

    if PICK:
        torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    x = torch.arange(1000, dtype=torch.float32, device="cuda") + r
    y = torch.empty_like(x)
    table = torch.empty(3 * n, dtype=torch.int64, device="cuda")
    comm.Allreduce(x, y)
    comm.Allgather(torch.full((3,), r + 1, dtype=torch.int64, device="cuda"), table)
    b = torch.full((5,), float(r), dtype=torch.float64, device="cuda")
    comm.Bcast(b, root=n - 1)
    torch.cuda.synchronize()
    out["device"] = x.device.index
    out["current"] = torch.cuda.current_device()
    host = [a.cpu().numpy() for a in (y, table, b)]

expected = [np.arange(1000, dtype=np.float32) * n + sum(range(n)),
            np.repeat(np.arange(1, n + 1, dtype=np.int64), 3),
            np.full(5, n - 1, np.float64)]
out["exact"] = [bool(np.array_equal(got, want)) for got, want in zip(host, expected)]
if "--capture" in sys.argv:  # capturing a call that has to go through host memory is refused
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            comm.Allreduce(x, y)
            out["capture"] = "no error"
        except gpucoll.InvalidUsageError as exc:
            out["capture"] = str(exc)
        finally:
            s.end_capture()
print("RESULT " + json.dumps(out), flush=True)
