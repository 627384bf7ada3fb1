"""Point to point on GPU buffers between two ranks, every byte checked.

    gpurun -np 2 python gpu_p2p.py

Small messages (through host memory) and large ones (offers pulled over CUDA IPC), CuPy and
torch, blocking, nonblocking both ways at once, Sendrecv, ANY_SOURCE/ANY_TAG with statuses,
GPU to host and host to GPU, a too-small receive buffer, stream order on both sides (the
sender overwrites its buffer right after Send; the receiver computes right after Recv),
GPUCOLL_P2P_DISABLE=1, and a capture that must refuse. Output: "RESULT {json}" on each rank.
"""
import json
import os
import sys
import traceback

import numpy as np

import cupy as cp
import gpucoll
from gpu_device import one_gpu_per_rank
from gpucoll import ANY_SOURCE, ANY_TAG, MPI, Status
from gpucoll.gpu import ipc

try:
    import torch
except ImportError:
    torch = None

comm = gpucoll.COMM_WORLD
RANK, PEER = comm.rank, 1 - comm.rank
DEV = one_gpu_per_rank(comm)
failures, checked = [], [0]
SMALL, LARGE = 1000, 3_000_001  # float32 elements: 4 KB (eager) and 12 MB (offer)


def data(count, seed):
    return (np.random.default_rng(seed).standard_normal(count)).astype(np.float32)


def check(name, got, want):
    checked[0] += 1
    if got.shape != want.shape or got.tobytes() != want.tobytes():
        bad = int(np.count_nonzero(got != want)) if got.shape == want.shape else "shape"
        failures.append(f"{name}: {bad} elements differ")


def expect(name, value, want):
    checked[0] += 1
    if value != want:
        failures.append(f"{name}: {value!r}, expected {want!r}")


def case(name, fn):
    try:
        fn()
    except Exception as exc:
        failures.append(f"{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
    comm.Barrier()


def blocking():
    for count, seed in ((SMALL, 1), (LARGE, 2), (0, 3)):
        if RANK == 0:
            comm.Send(cp.asarray(data(count, seed)), 1, tag=7)
        else:
            y = cp.full(count, np.nan, cp.float32)
            st = Status()
            comm.Recv(y, 0, 7, status=st)
            check(f"blocking {count}", cp.asnumpy(y), data(count, seed))
            expect(f"status {count}", (st.source, st.tag, st.Get_count(MPI.FLOAT)), (0, 7, count))


def both_ways_nonblocking():
    s = cp.cuda.Stream(non_blocking=True)
    mine = cp.asarray(data(LARGE, 10 + RANK))
    got = cp.full(LARGE, np.nan, cp.float32)
    small_in, small_out = cp.zeros(SMALL, cp.float32), cp.asarray(data(SMALL, 20 + RANK))
    reqs = [comm.Irecv(got, PEER, 1, stream=s), comm.Irecv(small_in, PEER, 2, stream=s),
            comm.Isend(mine, PEER, 1, stream=s), comm.Isend(small_out, PEER, 2, stream=s)]
    reqs[0].Wait(stream=cp.cuda.get_current_stream())  # orders the current stream only
    doubled = got * 2
    gpucoll.Request.Waitall(reqs[1:])
    check("Isend/Irecv large", cp.asnumpy(doubled), data(LARGE, 10 + PEER) * 2)
    check("Isend/Irecv small", cp.asnumpy(small_in), data(SMALL, 20 + PEER))
    expect("Test after Wait", all(r.Test() for r in reqs), True)


def sendrecv_and_wildcards():
    out = cp.full(LARGE, np.nan, cp.float32)
    comm.Sendrecv(cp.asarray(data(LARGE, 30 + RANK)), PEER, 5, out, PEER, 5)
    check("Sendrecv", cp.asnumpy(out), data(LARGE, 30 + PEER))
    if RANK == 0:
        comm.Send(cp.asarray(data(LARGE, 40)), 1, tag=11)
        comm.Send(cp.asarray(data(SMALL, 41)), 1, tag=12)
    else:
        a, b = cp.zeros(LARGE, cp.float32), cp.zeros(SMALL, cp.float32)
        st = Status()
        comm.Recv(a, ANY_SOURCE, ANY_TAG, status=st)  # messages of one pair never overtake
        expect("ANY_TAG status", (st.source, st.tag), (0, 11))
        comm.Recv(b, ANY_SOURCE, 12, status=st)
        check("ANY_SOURCE large", cp.asnumpy(a), data(LARGE, 40))
        check("ANY_SOURCE small", cp.asnumpy(b), data(SMALL, 41))
        expect("ANY_SOURCE status", (st.source, st.tag, st.nbytes), (0, 12, SMALL * 4))


def host_and_gpu_mixed():
    if RANK == 0:
        comm.Send(cp.asarray(data(LARGE, 50)), 1, tag=3)   # GPU -> host buffer
        comm.Send(data(LARGE, 51), 1, tag=4)               # host -> GPU buffer
    else:
        h = np.zeros(LARGE, np.float32)
        st = Status()
        comm.Recv(h, 0, 3, status=st)
        check("GPU to host", h, data(LARGE, 50))
        expect("GPU to host status", (st.source, st.tag, st.nbytes), (0, 3, LARGE * 4))
        g = cp.zeros(LARGE, cp.float32)
        comm.Recv(g, 0, 4)
        check("host to GPU", cp.asnumpy(g), data(LARGE, 51))


def too_small():
    if RANK == 0:
        comm.Send(cp.asarray(data(LARGE, 60)), 1, tag=9)  # completes although the receive fails
        comm.Send(cp.asarray(data(SMALL, 61)), 1, tag=9)
    else:
        for count in (LARGE, SMALL):
            try:
                comm.Recv(cp.zeros(count - 1, cp.float32), 0, 9)
                failures.append(f"truncation {count}: no error")
            except gpucoll.GpucollError as exc:
                expect(f"truncation {count} message", "truncated" in str(exc) and "larger buffer" in str(exc), True)


def stream_order():
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.asarray(data(LARGE, 70 + RANK))
        y = cp.zeros(LARGE, cp.float32)
        if RANK == 0:
            comm.Send(x, 1, tag=1)
            x.fill(-1)  # in stream order after the receiver's copy
            comm.Recv(y, 1, tag=2)
        else:
            comm.Recv(y, 0, tag=1)
            z = y + 1  # sees the data
            comm.Send(x, 0, tag=2)
            x.fill(-1)
    s.synchronize()
    if RANK == 1:
        check("stream order: receiver computes after Recv", cp.asnumpy(z), data(LARGE, 70) + 1)
    else:
        check("stream order: sender overwrites after Send", cp.asnumpy(y), data(LARGE, 71))


def p2p_disabled():
    out = cp.zeros(LARGE, cp.float32)
    os.environ["GPUCOLL_P2P_DISABLE"] = "1"
    try:
        before = ipc.open_count()
        buf2 = cp.asarray(data(LARGE, 90 + RANK))
        comm.Sendrecv(buf2, PEER, 0, out, PEER, 0)
        check("P2P disabled: through host memory", cp.asnumpy(out), data(LARGE, 90 + PEER))
        expect("P2P disabled: nothing mapped", ipc.open_count(), before)
    finally:
        del os.environ["GPUCOLL_P2P_DISABLE"]


def torch_tensors():
    if torch is None:
        return
    torch.cuda.set_device(DEV)
    n = 1 << 20
    if RANK == 0:
        comm.Send(torch.arange(n, dtype=torch.bfloat16, device="cuda"), 1, tag=6)
    else:
        t = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        comm.Recv(t, 0, 6)
        expect("torch bfloat16", bool((t == torch.arange(n, dtype=torch.bfloat16, device="cuda")).all()), True)


def capture_refused():
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.ones(SMALL, cp.float32)
    s.begin_capture()
    try:
        comm.Send(x, PEER, 0, stream=s)
        failures.append("capture: no error")
    except gpucoll.InvalidUsageError as exc:
        expect("capture message", "CUDA graph" in str(exc), True)
    finally:
        s.end_capture()


for name, fn in (("blocking", blocking), ("nonblocking", both_ways_nonblocking),
                 ("sendrecv", sendrecv_and_wildcards), ("mixed", host_and_gpu_mixed), ("too small", too_small),
                 ("stream order", stream_order), ("p2p disabled", p2p_disabled), ("torch", torch_tensors),
                 ("capture", capture_refused)):
    case(name, fn)
print("RESULT " + json.dumps({"checked": checked[0], "failures": failures[:20], "nfail": len(failures)}), flush=True)
sys.exit(1 if failures else 0)
