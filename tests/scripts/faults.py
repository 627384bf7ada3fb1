"""Ranks that misbehave, and what the others see (for tests/test_faults.py).

    gpurun -np N python faults.py MODE

MODE:
  die          rank 1 leaves (os._exit(7)) while the others are in an Allreduce. The others
               ignore SIGTERM (so they outlive gpurun's fail-fast stop long enough to report)
               and print "LOST {json}" with the error they got.
  die-default  the same, without ignoring SIGTERM: what a user's job does.
  skip         (run with GPUCOLL_TIMEOUT=2) the last rank skips collective #2 on COMM_WORLD; the
               others print "TIMEOUT {json}". The skipping rank stays alive until told.
  mismatch     (run with GPUCOLL_DEBUG_CHECKS=1) ranks call collectives that differ in count,
               dtype, op, root or kind; every rank prints "RESULT {json}" with the errors.
  unchecked    (without GPUCOLL_DEBUG_CHECKS) ranks call Allreduce with different counts, dtypes
               and ops, and Bcast with different roots, each on a fresh Dup of COMM_WORLD,
               then Barrier on it; every rank prints "RESULT {json}": per case the error,
               whether the call or the Barrier raised it, and the buffer when the call returned.
  badargs      rank 1 alone makes calls with bad arguments, which must raise InvalidUsageError
               before anything is sent; then every rank runs a correct Allreduce.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import gpucoll
from gpucoll import MPI

mode = sys.argv[1]
comm = gpucoll.COMM_WORLD
rank, size = comm.rank, comm.size


def error_info(exc, start=None):
    info = {"type": type(exc).__name__, "message": str(exc), "ranks": list(getattr(exc, "ranks", ()))}
    if start is not None:
        info["elapsed"] = time.monotonic() - start
    return info


if mode in ("die", "die-default"):
    if mode == "die":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x = np.ones(100_000, np.float32)
    for _ in range(5):
        comm.Allreduce(gpucoll.IN_PLACE, x)
    comm.Barrier()
    if rank == 1:
        time.sleep(0.5)  # the others are inside the next Allreduce by now
        os._exit(7)
    start = time.monotonic()
    try:
        for _ in range(1000):
            comm.Allreduce(gpucoll.IN_PLACE, x)
        print("LOST " + json.dumps({"type": "none"}), flush=True)
    except gpucoll.GpucollError as exc:
        print("LOST " + json.dumps(error_info(exc, start)), flush=True)
    sys.exit(0)

elif mode == "skip":
    x = np.ones(10, np.int32)
    comm.Barrier()                            # #0
    comm.Allreduce(gpucoll.IN_PLACE, x)       # #1
    if rank == size - 1:
        # skip #2, and stay alive (a rank that exits is lost, not late) until rank 0 says so
        req = comm.irecv(source=0, tag=77)
        deadline = time.monotonic() + 15
        while not req.test()[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        sys.exit(0)
    start = time.monotonic()
    try:
        comm.Allreduce(gpucoll.IN_PLACE, x)   # #2
        print("TIMEOUT " + json.dumps({"type": "none"}), flush=True)
    except gpucoll.GpucollError as exc:
        info = error_info(exc, start)
        info["is_builtin_timeout"] = isinstance(exc, TimeoutError)
        print("TIMEOUT " + json.dumps(info), flush=True)
    if rank == 0:
        comm.send("done", dest=size - 1, tag=77)
    sys.exit(0)

elif mode == "mismatch":
    out = {}
    f32 = np.float32
    cases = {
        "count": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(5 if rank == 1 else 4, f32)),
        "dtype": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(4, np.float64 if rank == 2 else f32)),
        "op": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(4, f32),
                                     op=gpucoll.MAX if rank == 0 else gpucoll.SUM),
        "root": lambda: comm.Bcast(np.ones(4, f32), root=1 if rank == 1 else 0),
        "operation": lambda: (comm.Allgather(np.ones(4, f32), np.ones(4 * size, f32)) if rank == 2
                              else comm.Allreduce(gpucoll.IN_PLACE, np.ones(4, f32))),
    }
    for name, call in cases.items():
        try:
            call()
            out[name] = {"type": "none"}
        except gpucoll.GpucollError as exc:
            out[name] = error_info(exc)
    x = np.ones(4, f32)
    comm.Allreduce(gpucoll.IN_PLACE, x)  # the communicator still works afterwards
    out["after"] = x.tolist()
    print("RESULT " + json.dumps(out), flush=True)

elif mode == "unchecked":
    out = {}
    cases = {
        "count": lambda x: comm_.Allreduce(gpucoll.IN_PLACE, x[:20 if rank == 1 else 10]),
        "dtype": lambda x: comm_.Allreduce(gpucoll.IN_PLACE, x.view(np.int32) if rank == 1 else x),
        "op": lambda x: comm_.Allreduce(gpucoll.IN_PLACE, x, op=gpucoll.MAX if rank == 1 else gpucoll.SUM),
        # ranks 0 and 2 take 0 for the root, rank 1 itself
        "root": lambda x: comm_.Bcast(x, root=1 if rank == 1 else 0),
        # every rank waits for another root: no rank sends anything
        "roots-all-differ": lambda x: comm_.Bcast(x, root=(rank + 1) % size),
    }
    for name, call in cases.items():
        comm_ = comm.Dup()
        x = np.full(20, rank + 1, np.float32)
        where, start = "call", time.monotonic()
        try:
            call(x)
            where, got = "next", x.tolist()
            comm_.Barrier()
            out[name] = {"type": "none", "buffer": got}
        except gpucoll.GpucollError as exc:
            out[name] = dict(error_info(exc, start), where=where)
            if where == "next":
                out[name]["buffer"] = got
    print("RESULT " + json.dumps(out), flush=True)

elif mode == "badargs":
    out = {}
    if rank == 1:
        seq = comm._dispatch.seq
        ro = np.ones(4)
        ro.flags.writeable = False
        m2 = np.ones((4, 4), np.float32)
        shared = np.zeros(4 * size, np.int32)
        bad = {
            "non-contiguous sendbuf": lambda: comm.Allreduce(np.ones(8)[::2], np.ones(4)),
            "non-contiguous buf": lambda: comm.Bcast(m2[:, ::2], root=1),
            "different sizes": lambda: comm.Allreduce(np.ones(4), np.ones(5)),
            "different dtypes": lambda: comm.Allreduce(np.ones(4, np.int32), np.ones(4, np.float32)),
            "allgather recvbuf size": lambda: comm.Allgather(np.ones(4), np.ones(4 * size + 1)),
            "reduce_scatter sizes": lambda: comm.Reduce_scatter_block(np.ones(4 * size + 2), np.ones(4)),
            "alltoall not divisible": lambda: comm.Alltoall(np.ones(size * 2 + 1), np.ones(size * 2 + 1)),
            "scatter root sendbuf": lambda: comm.Scatter(np.ones(size * 3 + 1), np.ones(3), root=1),
            "gather root recvbuf": lambda: comm.Gather(np.ones(3), np.ones(size * 3 - 1), root=1),
            "root too large": lambda: comm.Bcast(np.ones(4), root=size),
            "negative root": lambda: comm.Reduce(np.ones(4), np.ones(4), root=-1),
            "root not an int": lambda: comm.Gather(np.ones(4), np.ones(4 * size), root="0"),
            "BAND on float": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(4, np.float32), op=gpucoll.BAND),
            "BXOR on float64 reduce": lambda: comm.Reduce(np.ones(4), np.ones(4), op=gpucoll.BXOR, root=1),
            "MAX on complex": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(4, np.complex64), op=gpucoll.MAX),
            "unknown op": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(4), op="CONCAT"),
            "read-only recvbuf": lambda: comm.Allreduce(np.ones(4), ro),
            "read-only Bcast on a receiver": lambda: comm.Bcast(ro, root=0),
            "read-only Recv": lambda: comm.Recv(ro, source=0),
            "object dtype": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.array([1, "a"], dtype=object)),
            "not a buffer": lambda: comm.Allreduce("abcd", np.ones(4)),
            "IN_PLACE on a non-root": lambda: comm.Reduce(gpucoll.IN_PLACE, np.ones(4), root=0),
            "Send to a rank out of range": lambda: comm.Send(np.ones(4), dest=size),
            "Recv from a rank out of range": lambda: comm.Recv(np.ones(4), source=size + 3),
            "Isend negative dest": lambda: comm.Isend(np.ones(4), dest=-5),
            "negative count in a buffer spec": lambda: comm.Allreduce(gpucoll.IN_PLACE, [np.ones(4), -1, MPI.DOUBLE]),
            "overlapping buffers": lambda: comm.Allreduce(shared[:6], shared[2:8]),
            "allgather sendbuf at another rank's block": lambda: comm.Allgather(shared[:2], shared[:2 * size]),
            "big-endian buffer": lambda: comm.Allreduce(gpucoll.IN_PLACE, np.ones(4, ">f8")),
            "negative tag": lambda: comm.send("x", 0, tag=-5),
            "tag not an int": lambda: comm.Send(np.ones(2), 0, tag=1.5),
        }
        for name, call in bad.items():
            try:
                call()
                out[name] = {"type": "none"}
            except Exception as exc:  # the test checks it is InvalidUsageError
                out[name] = error_info(exc)
        out["seq_unchanged"] = comm._dispatch.seq == seq
    # nothing went out: a correct collective still matches up on every rank
    x = np.full(3, rank + 1, np.int64)
    comm.Allreduce(gpucoll.IN_PLACE, x)
    out["after"] = x.tolist()
    print("RESULT " + json.dumps(out), flush=True)
else:
    sys.exit(f"unknown mode {mode}")
