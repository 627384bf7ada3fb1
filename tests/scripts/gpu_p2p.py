"""Point to point on GPU buffers between two ranks, every byte checked.

    gpurun -np 2 python gpu_p2p.py

Small messages (GPU to GPU through the sender's outbox slots, counted by comm.stats()) and
large ones (pulled from the sender's buffer over CUDA IPC), CuPy and torch, more small messages in flight than a
pair has slots, tags received out of order, a group's pairwise exchange in one launch, blocking, nonblocking both ways at once, Sendrecv, ANY_SOURCE/ANY_TAG with statuses,
GPU to host and host to GPU, a too-small receive buffer, stream order on both sides (the
sender overwrites its buffer right after Send; the receiver computes right after Recv),
GPUCOLL_P2P_DISABLE=1, and a capture that must refuse. Output: "RESULT {json}" on each rank.
Started with GPUCOLL_P2P_DISABLE=1 (two ranks as two hosts: tests/test_gpu_ofi.py) every message
goes through host memory, so the counts of the outbox slots' path are not checked.
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
from gpucoll.engines.gpu import ipc

try:
    import torch
except ImportError:
    torch = None

comm = gpucoll.COMM_WORLD
RANK, PEER = comm.rank, 1 - comm.rank
DEV = one_gpu_per_rank(comm)
failures, checked = [], [0]
SMALL, LARGE = 1000, 3_000_001  # float32 elements: 4 KB (a slot) and 12 MB (pulled)
APART = os.environ.get("GPUCOLL_P2P_DISABLE") == "1"


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


def send_waited_first():
    # Each rank waits for its large Isend before its Irecv, on one stream: the peer's copy of our
    # buffer must not queue behind our stream's wait for it (it runs on the receiver's own stream).
    for rep in range(2):
        mine = cp.asarray(data(LARGE, 80 + 2 * rep + RANK))
        got = cp.zeros(LARGE, cp.float32)
        sreq = comm.Isend(mine, PEER, 3)
        rreq = comm.Irecv(got, PEER, 3)
        sreq.Wait()
        rreq.Wait()
        check(f"Isend waited before Irecv {rep}", cp.asnumpy(got), data(LARGE, 80 + 2 * rep + PEER))


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


def slot_stats():
    st = comm.stats()
    return st["p2p_slot_launches"], st["p2p_slot_messages"]


def small_slots():
    before = slot_stats()
    for n, seed in ((1, 100), (8, 101), (4096, 102), (65536, 103), (0, 104), (777, 105)):
        if RANK == 0:
            comm.Send(cp.asarray(bytes_of(n, seed)), 1, tag=n % 1000)
        else:
            y = cp.full(n + 3, 7, cp.uint8)  # a larger buffer: only n bytes change
            st = Status()
            comm.Recv(y, 0, n % 1000, status=st)
            check(f"slot {n} B", cp.asnumpy(y), np.concatenate([bytes_of(n, seed), np.full(3, 7, np.uint8)]))
            expect(f"slot {n} B status", (st.source, st.tag, st.nbytes), (0, n % 1000, n))
    launches, messages = (a - b for a, b in zip(slot_stats(), before))
    if not APART:
        expect("slot messages counted", (launches, messages), (6, 6))


def bytes_of(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def slots_in_flight():
    count = 3 * 32 + 5  # more than a pair's slots: the sender's stream waits on the device for free ones
    s = cp.cuda.Stream(non_blocking=True)
    if RANK == 0:
        with s:  # made, sent (the current stream) and kept alive in the order of s
            sent = [cp.asarray(bytes_of(1000 + i, 200 + i)) for i in range(count)]
            for i in range(count):
                comm.Send(sent[i], 1, tag=i)
        s.synchronize()
    else:
        got = [cp.zeros(1000 + i, cp.uint8) for i in range(count)]
        for i in range(count):
            comm.Recv(got[i], 0, i)
        for i in range(count):
            check(f"in flight {i}", cp.asnumpy(got[i]), bytes_of(1000 + i, 200 + i))


def slots_out_of_order():
    if RANK == 0:
        for tag in (1, 2, 3):
            comm.Send(cp.asarray(bytes_of(300 * tag, 300 + tag)), 1, tag=tag)
    else:
        got = {tag: cp.zeros(300 * tag, cp.uint8) for tag in (1, 2, 3)}
        for tag in (3, 1, 2):
            comm.Recv(got[tag], 0, tag)
        for tag in (1, 2, 3):
            check(f"out of order tag {tag}", cp.asnumpy(got[tag]), bytes_of(300 * tag, 300 + tag))


def slot_to_host_buffer():
    if RANK == 0:
        for seed in (400, 401):
            comm.Send(cp.asarray(bytes_of(5000, seed)), 1, tag=4)
    else:
        for seed in (400, 401):  # twice: the slot is freed after a host receive too
            h = np.zeros(5000, np.uint8)
            st = Status()
            comm.Recv(h, 0, 4, status=st)
            check(f"GPU slot to host {seed}", h, bytes_of(5000, seed))
            expect(f"GPU slot to host status {seed}", (st.source, st.tag, st.nbytes), (0, 4, 5000))


def group_exchange():
    s = cp.cuda.Stream(non_blocking=True)
    for rep in range(3):  # inputs change between repetitions
        with s:
            mine = cp.asarray(bytes_of(2048, 500 + 10 * rep + RANK))
            got = cp.zeros(2048, cp.uint8)
        before = slot_stats()
        with comm.group():
            sreq = comm.Isend(mine, PEER, 8, stream=s)
            rreq = comm.Irecv(got, PEER, 8, stream=s)
        sreq.Wait()
        rreq.Wait()
        check(f"group exchange {rep}", cp.asnumpy(got), bytes_of(2048, 500 + 10 * rep + PEER))
        if not APART:
            expect(f"group exchange {rep}: one launch for both",
                   tuple(a - b for a, b in zip(slot_stats(), before)), (1, 2))
    # large messages both ways in a block, blocking and not: each stream announces its own send
    # before it waits for the peer's (else both wait for each other until GPUCOLL_TIMEOUT)
    for rep in range(2):
        with s:
            mine = [cp.asarray(bytes_of(n, 600 + 10 * rep + RANK + n)) for n in (300_000, 2048, 1 << 20)]
            got = [cp.zeros(m.size, cp.uint8) for m in mine]
        with comm.group():
            comm.Send(mine[0], PEER, 9, stream=s)
            comm.Recv(got[0], PEER, 9, stream=s)
            sreqs = [comm.Isend(m, PEER, 10 + k, stream=s) for k, m in enumerate(mine[1:])]
            rreqs = [comm.Irecv(g, PEER, 10 + k, stream=s) for k, g in enumerate(got[1:])]
        for req in sreqs + rreqs:
            req.Wait()
        s.synchronize()
        for m, g in zip(mine, got):
            check(f"group large exchange {rep} {m.size} B", cp.asnumpy(g), bytes_of(m.size, 600 + 10 * rep + PEER + m.size))
    comm.Sendrecv(mine[1], PEER, 12, got[1], PEER, 12)  # raises a slot timeout recorded above, if any


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
    was = os.environ.get("GPUCOLL_P2P_DISABLE")
    os.environ["GPUCOLL_P2P_DISABLE"] = "1"
    try:
        before = ipc.open_count()
        buf2 = cp.asarray(data(LARGE, 90 + RANK))
        comm.Sendrecv(buf2, PEER, 0, out, PEER, 0)
        check("P2P disabled: through host memory", cp.asnumpy(out), data(LARGE, 90 + PEER))
        expect("P2P disabled: nothing mapped", ipc.open_count(), before)
    finally:
        if was is None:
            del os.environ["GPUCOLL_P2P_DISABLE"]
        else:
            os.environ["GPUCOLL_P2P_DISABLE"] = was


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


def freed_communicator():
    """A communicator whose GPU messages used an outbox and a copy stream frees them with it."""
    for rep in range(2):
        dup = comm.Dup()
        x = cp.asarray(data(LARGE, 120 + rep + RANK))
        y = cp.zeros(LARGE, cp.float32)
        dup.Sendrecv(x, PEER, 0, y, PEER, 0)
        cp.cuda.Device().synchronize()
        check(f"freed communicator {rep}", cp.asnumpy(y), data(LARGE, 120 + rep + PEER))
        dup.Free()


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


for name, fn in (("blocking", blocking), ("small slots", small_slots), ("slots in flight", slots_in_flight),
                 ("slots out of order", slots_out_of_order), ("slot to host", slot_to_host_buffer),
                 ("group exchange", group_exchange), ("nonblocking", both_ways_nonblocking),
                 ("send waited first", send_waited_first),
                 ("sendrecv", sendrecv_and_wildcards), ("mixed", host_and_gpu_mixed), ("too small", too_small),
                 ("stream order", stream_order), ("p2p disabled", p2p_disabled), ("torch", torch_tensors),
                 ("freed communicator", freed_communicator),
                 ("capture", capture_refused)):
    case(name, fn)
print("RESULT " + json.dumps({"checked": checked[0], "failures": failures[:20], "nfail": len(failures)}), flush=True)
sys.exit(1 if failures else 0)
