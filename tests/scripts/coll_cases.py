"""Runs many collective cases in one job and checks every result against NumPy.

    gpurun -np N python coll_cases.py CASES.json

CASES.json holds {"paths": [...], "cases": [...]}. A path is {"name", "env"}: the cases run
on a communicator made (by Dup) while those GPUCOLL_* variables are set, so one job covers
several algorithm and transport choices (the dispatcher reads them when a communicator is
made); the path named "world" runs on COMM_WORLD as launched. A case is
{"coll", "dtype", "op", "count", "inplace", "root", "seed"} with MPI's meaning of count.

Every rank builds every rank's input from (seed, rank), so it computes the expected result
itself. Integers must equal NumPy's exactly. Floats: MAX/MIN exactly; SUM, PROD and AVG
within the bound below, and results every rank holds (allreduce, bcast, allgather) must be
bitwise identical on every rank (SHA-256 of the bytes, compared across ranks).

Float bound (u = the dtype's machine epsilon, p = ranks, x_i the inputs of one element):
    SUM   |got - exact| <= (p + 1) * u * sum |x_i|
    PROD  |got - exact| <= (p + 1) * u * prod |x_i|
    AVG   |got - exact| <= (p + 1) * u * sum |x_i| / p + u * |exact|
Each of the p - 1 combining steps rounds once to the dtype (float16 and bfloat16 combine in
float32 and round once per step), which stays within half of this.

Output: "RESULT {json}" from rank 0 with per-path counts and every failure, and "PATH name
transport=... forced=..." lines showing what each path really used.
"""
import functools
import hashlib
import json
import os
import sys
import traceback

import numpy as np

import gpucoll
from gpucoll.calls.buffers import Datatype

BF16 = Datatype("bfloat16")
INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}
NP_OP = {"SUM": np.add, "AVG": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
         "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
SENTINEL = 0x5A


# --- data ---------------------------------------------------------------------------------
def storage_dtype(dtype):
    return np.dtype("uint16") if dtype == "bfloat16" else np.dtype(dtype)


def to_f64(arr, dtype):
    """Values of a buffer as float64 (bfloat16: the upper half of a float32)."""
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def make(case, rank, n):
    """Rank `rank`'s n input elements of this case (storage dtype)."""
    dtype, op = case["dtype"], case["op"]
    rng = np.random.default_rng([case["seed"], rank, n])
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        if op == "PROD":
            lo, hi = (-1, 1) if dtype == "int8" else ((0, 3) if info.min == 0 else (-3, 3))
        elif op in ("SUM", "AVG", None):
            span = min(info.max // 8, 10 ** 17)  # 8 ranks never overflow
            lo, hi = (0, span) if info.min == 0 else (-span, span)
        else:
            lo, hi = int(info.min), int(info.max)
        return rng.integers(lo, hi, n, endpoint=True, dtype=dtype)
    if op in ("MAX", "MIN", None):
        vals = rng.uniform(-100, 100, n)
    else:
        vals = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    if dtype == "bfloat16":
        return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return vals.astype(dtype)


def alloc(case, n):
    """A receive buffer of n elements holding a recognisable pattern."""
    return np.full(n * storage_dtype(case["dtype"]).itemsize, SENTINEL, np.uint8).view(storage_dtype(case["dtype"]))


def spec(case, arr):
    """The buffer argument: bfloat16 goes as [storage, Datatype('bfloat16')]."""
    if arr is None or arr is gpucoll.IN_PLACE:
        return arr
    return [arr, BF16] if case["dtype"] == "bfloat16" else arr


# --- references and checks ---------------------------------------------------------------
def reduce_ref(case, inputs, size):
    """(exact reference, tolerance or None for an exact comparison, kind) of op over inputs."""
    dtype, op = case["dtype"], case["op"]
    if dtype in INT_DTYPES:
        acc = functools.reduce(NP_OP[op], inputs[1:], inputs[0].copy())
        if op == "AVG":
            acc = np.floor_divide(acc, size).astype(dtype)
        return acc, None
    vals = [to_f64(x, dtype) for x in inputs]
    exact = functools.reduce(NP_OP[op], vals[1:], vals[0].copy())
    if op in ("MAX", "MIN"):
        return exact, None
    u = EPS[dtype]
    absv = [np.abs(v) for v in vals]
    if op == "PROD":
        tol = (size + 1) * u * functools.reduce(np.multiply, absv)
    else:
        tol = (size + 1) * u * functools.reduce(np.add, absv)
    if op == "AVG":
        exact = exact / size
        tol = tol / size + u * np.abs(exact)
    return exact, tol


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.digests = {}

    def fail(self, key, msg):
        self.failures.append(f"rank {self.rank} {key}: {msg}")

    def exact(self, key, case, got, want):
        if got.shape != want.shape:
            return self.fail(key, f"shape {got.shape}, expected {want.shape}")
        # Bitwise: compare the elements as unsigned integers of the same width.
        as_bits = np.dtype(f"u{got.itemsize}")
        bad = np.flatnonzero(got.view(as_bits) != want.view(as_bits))
        if bad.size:
            i = int(bad[0])
            self.fail(key, f"{bad.size} wrong element(s), first [{i}] = {got[i]!r}, expected {want[i]!r}")

    def reduced(self, key, case, got, want, tol):
        if tol is None:
            if case["dtype"] in INT_DTYPES:
                return self.exact(key, case, got, want)
            vals = to_f64(got, case["dtype"])
            bad = np.flatnonzero(vals != want)
        else:
            vals = to_f64(got, case["dtype"])
            bad = np.flatnonzero(~(np.abs(vals - want) <= tol))
        if bad.size:
            i = int(bad[0])
            extra = f" (tolerance {tol[i]:.3g})" if tol is not None else ""
            self.fail(key, f"{bad.size} wrong element(s), first [{i}] = {vals[i]!r}, expected {want[i]!r}{extra}")

    def digest(self, key, arr):
        self.digests[key] = hashlib.sha256(arr.tobytes()).hexdigest()


# --- one case ------------------------------------------------------------------------------
def run_case(comm, case, chk, key):
    rank, size = comm.rank, comm.size
    coll, n, dtype = case["coll"], case["count"], case["dtype"]
    root = case.get("root", 0) % size
    inplace = case.get("inplace", False)
    op = getattr(gpucoll, case["op"]) if case.get("op") else None
    floaty = dtype not in INT_DTYPES

    if coll == "allreduce":
        inputs = [make(case, r, n) for r in range(size)]
        want, tol = reduce_ref(case, inputs, size)
        if inplace:
            buf = inputs[rank].copy()
            comm.Allreduce(gpucoll.IN_PLACE, spec(case, buf), op=op)
        else:
            send, buf = inputs[rank].copy(), alloc(case, n)
            comm.Allreduce(spec(case, send), spec(case, buf), op=op)
            chk.exact(key + " sendbuf untouched", case, send, inputs[rank])
        chk.reduced(key, case, buf, want, tol)
        if floaty:
            chk.digest(key, buf)
    elif coll == "reduce":
        inputs = [make(case, r, n) for r in range(size)]
        if rank == root:
            want, tol = reduce_ref(case, inputs, size)
            if inplace:
                buf = inputs[rank].copy()
                comm.Reduce(gpucoll.IN_PLACE, spec(case, buf), op=op, root=root)
            else:
                buf = alloc(case, n)
                comm.Reduce(spec(case, inputs[rank].copy()), spec(case, buf), op=op, root=root)
            chk.reduced(key, case, buf, want, tol)
        else:
            comm.Reduce(spec(case, inputs[rank].copy()), None, op=op, root=root)
    elif coll == "reduce_scatter":
        inputs = [make(case, r, n * size) for r in range(size)]
        want, tol = reduce_ref(case, [x[rank * n:(rank + 1) * n] for x in inputs], size)
        if inplace:
            buf = inputs[rank].copy()
            comm.Reduce_scatter_block(gpucoll.IN_PLACE, spec(case, buf), op=op)
            buf = buf[:n]
        else:
            buf = alloc(case, n)
            comm.Reduce_scatter_block(spec(case, inputs[rank].copy()), spec(case, buf), op=op)
        chk.reduced(key, case, buf, want, tol)
    elif coll == "bcast":
        data = make(case, root, n)
        buf = data.copy() if rank == root else alloc(case, n)
        comm.Bcast(spec(case, buf), root=root)
        chk.exact(key, case, buf, data)
        chk.digest(key, buf)
    elif coll == "allgather":
        blocks = [make(case, r, n) for r in range(size)]
        want = np.concatenate(blocks) if n else alloc(case, 0)
        buf = alloc(case, n * size)
        if inplace:
            buf[rank * n:(rank + 1) * n] = blocks[rank]
            comm.Allgather(gpucoll.IN_PLACE, spec(case, buf))
        else:
            comm.Allgather(spec(case, blocks[rank].copy()), spec(case, buf))
        chk.exact(key, case, buf, want)
        chk.digest(key, buf)
    elif coll == "alltoall":
        # rank r's block j is make(case, r * size + j, n): what r sends to j.
        send = np.concatenate([make(case, rank * size + j, n) for j in range(size)]) if n else alloc(case, 0)
        want = np.concatenate([make(case, j * size + rank, n) for j in range(size)]) if n else alloc(case, 0)
        if inplace:
            buf = send.copy()
            comm.Alltoall(gpucoll.IN_PLACE, spec(case, buf))
        else:
            buf = alloc(case, n * size)
            comm.Alltoall(spec(case, send.copy()), spec(case, buf))
        chk.exact(key, case, buf, want)
    elif coll == "gather":
        mine = make(case, rank, n)
        if rank == root:
            want = np.concatenate([make(case, r, n) for r in range(size)]) if n else alloc(case, 0)
            buf = alloc(case, n * size)
            if inplace:
                buf[root * n:(root + 1) * n] = mine
                comm.Gather(gpucoll.IN_PLACE, spec(case, buf), root=root)
            else:
                comm.Gather(spec(case, mine.copy()), spec(case, buf), root=root)
            chk.exact(key, case, buf, want)
        else:
            comm.Gather(spec(case, mine.copy()), None, root=root)
    elif coll == "scatter":
        want = make(case, 1000 + rank, n)
        if rank == root:
            send = np.concatenate([make(case, 1000 + r, n) for r in range(size)]) if n else alloc(case, 0)
            before = send.copy()
            if inplace:
                comm.Scatter(spec(case, send), gpucoll.IN_PLACE, root=root)
                chk.exact(key + " root sendbuf untouched", case, send, before)
                return
            buf = alloc(case, n)
            comm.Scatter(spec(case, send), spec(case, buf), root=root)
        else:
            buf = alloc(case, n)
            comm.Scatter(None, spec(case, buf), root=root)
        chk.exact(key, case, buf, want)
    elif coll == "barrier":
        comm.Barrier()
    elif coll in ("sendrecv", "sendrecv_blocking"):
        right, left = (rank + 1) % size, (rank - 1) % size
        tag = case["seed"] % 1000
        data = make(case, rank, n)
        want = make(case, left, n)
        buf = alloc(case, n)
        if coll == "sendrecv":
            status = gpucoll.Status()
            comm.Sendrecv(spec(case, data), right, tag, spec(case, buf), left, tag, status=status)
            if status.Get_source() != left or status.Get_tag() != tag:
                chk.fail(key, f"status source {status.Get_source()} tag {status.Get_tag()}, "
                              f"expected {left} and {tag}")
        elif rank % 2 == 0:
            comm.Send(spec(case, data), right, tag)
            comm.Recv(spec(case, buf), left, tag)
        else:
            comm.Recv(spec(case, buf), left, tag)
            comm.Send(spec(case, data), right, tag)
        chk.exact(key, case, buf, want)
    else:
        raise ValueError(f"unknown collective {coll}")


def describe(case):
    parts = [case["coll"], case["dtype"]]
    if case.get("op"):
        parts.append(case["op"])
    parts.append(f"n={case['count']}")
    if case.get("inplace"):
        parts.append("IN_PLACE")
    if case["coll"] in ("bcast", "reduce", "gather", "scatter"):
        parts.append(f"root={case.get('root', 0)}")
    parts.append(f"seed={case['seed']}")
    return " ".join(parts)


def main():
    with open(sys.argv[1]) as f:
        spec_ = json.load(f)
    world = gpucoll.COMM_WORLD
    summary = {"size": world.size, "paths": {}, "failures": []}
    for path in spec_["paths"]:
        name, env = path["name"], path.get("env", {})
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            comm = world if name == "world" else world.Dup()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if world.rank == 0:
            d = comm._dispatch
            print(f"PATH {name} transport={d.transport} forced={d.forced} available={sorted(d.available)} label={d.label}",
                  flush=True)
        chk = Checker(world.rank)
        errors = 0
        for i, case in enumerate(spec_["cases"]):
            key = f"[{name}] #{i} {describe(case)}"
            try:
                run_case(comm, case, chk, key)
            except Exception as exc:  # keep going: report which case failed and how
                errors += 1
                chk.fail(key, f"raised {type(exc).__name__}: {exc}")
                if errors == 1:
                    traceback.print_exc()
                if isinstance(exc, (gpucoll.TimeoutError, gpucoll.LostPeerError)):
                    break  # the communicator is broken; later cases would only time out
        # Bitwise agreement: every rank's digest of every result all ranks hold.
        tables = world.allgather(chk.digests)
        for key in chk.digests:
            seen = {t.get(key) for t in tables}
            if len(seen) != 1 and world.rank == 0:
                chk.fail(key, f"ranks hold different bytes ({len(seen)} distinct digests)")
        all_failures = world.gather(chk.failures, root=0)
        if world.rank == 0:
            flat = [f for per_rank in all_failures for f in per_rank]
            summary["paths"][name] = {"cases": len(spec_["cases"]), "failures": len(flat),
                                      "digests": len(chk.digests)}
            summary["failures"].extend(flat)
        if comm is not world:
            comm.Barrier()
            comm.Free()
    if world.rank == 0:
        print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
