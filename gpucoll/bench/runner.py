"""The timing loop every rank runs, the same for gpucoll and for each peer.

For each collective and size: fill the buffers, run -w warm-up calls, barrier, time -n
calls with time.perf_counter, and keep the slowest rank's time per call (an allreduce of
the time with MAX, as nccl-tests' "max" report). With -c 1 one more call runs on fresh
input and every rank counts the elements that differ from the expected result; #wrong
is that count summed over ranks.

A backend supplies the ranks and the calls; see GpucollBackend and gpucoll.bench.peers.
A backend may also bring its own buffers (`make_case`, a class like Case) and its own clock
(`time_per_call(call, plan)`, warm-up included): the GPU backends of gpucoll.bench.gpu use
CUDA events and CUDA graphs there.

    plan = Plan(["allreduce"], [8, 1024], "float32", "sum", 0, iters=20, warmup=5, check=True)
    records = measure(GpucollBackend(), plan, on_row=print)   # on rank 0: a dict per row
"""
import functools
import os
import socket
import time

import numpy as np

from . import sizes as _sizes
from . import table

DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64")
# nccl-tests' names for the same types, accepted by -d.
DTYPE_ALIASES = {"char": "int8", "int": "int32", "half": "float16", "float": "float32", "double": "float64"}
REDOPS = ("sum", "prod", "max", "min", "avg")


class Unsupported(Exception):
    """A backend cannot run this collective, type or op (the peer's row shows n/a)."""


class Plan:
    """What to measure; travels to a peer job as JSON (as_dict / from_dict)."""

    def __init__(self, collectives, sizes, dtype, redop, root, iters, warmup, check):
        self.collectives = list(collectives)
        self.sizes = list(sizes)
        self.dtype, self.redop, self.root = dtype, redop, int(root)
        self.iters, self.warmup, self.check = int(iters), int(warmup), bool(check)

    def as_dict(self):
        return dict(collectives=self.collectives, sizes=self.sizes, dtype=self.dtype, redop=self.redop,
                    root=self.root, iters=self.iters, warmup=self.warmup, check=self.check)

    @classmethod
    def from_dict(cls, d):
        return cls(d["collectives"], d["sizes"], d["dtype"], d["redop"], d["root"], d["iters"], d["warmup"],
                   d["check"])


# --- data: every rank can compute every other rank's input, so it can check its result ------
def pattern(rank, index, dtype, redop):
    """Rank `rank`'s input at element indices `index`: small integers, exact in every type,
    so sums and products over ranks stay exact (products use 1 and 2 only)."""
    if redop == "prod":
        values = (index + rank) % 2 + 1
    else:
        values = (index * 3 + rank * 7) % 11 + 1
    return values.astype(dtype)


_NP_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum, "avg": np.add}


def reduced(nranks, index, dtype, redop):
    """The reduction over every rank's pattern at `index`, computed in `dtype` like the wire."""
    fn = _NP_REDUCE[redop]
    acc = pattern(0, index, dtype, redop)
    for r in range(1, nranks):
        acc = fn(acc, pattern(r, index, dtype, redop))
    if redop == "avg":
        acc = (acc / np.asarray(nranks, dtype)).astype(dtype)
    return acc


class Case:
    """The buffers of one (collective, size) on one rank, and what recv must hold after a call."""

    def __init__(self, collective, count, dtype, redop, root, rank, nranks):
        self.collective, self.count, self.dtype, self.redop = collective, count, dtype, redop
        self.root, self.rank, self.nranks = root, rank, nranks
        self.block = count // nranks if collective in table.BLOCKED else count
        send_n, recv_n = {
            "allreduce": (count, count), "bcast": (count, count), "alltoall": (count, count),
            "allgather": (self.block, count), "reduce_scatter": (count, self.block),
        }[collective]
        self.send = np.empty(send_n, dtype)
        self.recv = self.send if collective == "bcast" else np.empty(recv_n, dtype)
        self.fill()

    def fill(self):
        """Fresh input, and a receive buffer of zeros (every expected value is >= 1)."""
        c, r = self.collective, self.rank
        if c == "bcast":
            self.send[:] = pattern(r, np.arange(self.count), self.dtype, self.redop) if r == self.root else 0
            return
        if c == "allgather":
            self.send[:] = pattern(r, np.arange(self.block), self.dtype, self.redop)
        else:
            self.send[:] = pattern(r, np.arange(self.count), self.dtype, self.redop)
        self.recv[:] = 0

    def expected(self):
        c, n, b, dt, op = self.collective, self.nranks, self.block, self.dtype, self.redop
        if c == "allreduce":
            return reduced(n, np.arange(self.count), dt, op)
        if c == "reduce_scatter":
            return reduced(n, np.arange(self.rank * b, (self.rank + 1) * b), dt, op)
        if c == "bcast":
            return pattern(self.root, np.arange(self.count), dt, op)
        if c == "allgather":
            return np.concatenate([pattern(s, np.arange(b), dt, op) for s in range(n)])
        # alltoall: block s of my recv is block `rank` of rank s's send.
        mine = np.arange(self.rank * b, (self.rank + 1) * b)
        return np.concatenate([pattern(s, mine, dt, op) for s in range(n)])

    def wrong(self):
        got, want = self.recv, self.expected()
        if np.issubdtype(got.dtype, np.floating):
            rtol = {2: 1e-3, 4: 1e-6}.get(got.dtype.itemsize, 1e-12)
            ok = np.isclose(got, want, rtol=rtol, atol=0.0)
        else:
            ok = got == want
        return int(ok.size - np.count_nonzero(ok))


# --- the loop -------------------------------------------------------------------------------
def measure(backend, plan, on_row=None):
    """Every (collective, size) of the plan on this backend; the records (dicts) on every
    rank, on_row(record) called on rank 0 as each row completes. Every rank must call it."""
    records = []
    itemsize = np.dtype(plan.dtype).itemsize
    make_case = getattr(backend, "make_case", Case)
    for collective in plan.collectives:
        multiple = backend.size if collective in table.BLOCKED else 1
        redop = plan.redop if collective in table.REDUCING else "none"
        for nbytes in plan.sizes:
            count = _sizes.element_count(nbytes, itemsize, multiple)
            case = make_case(collective, count, plan.dtype, plan.redop, plan.root, backend.rank, backend.size)
            record = dict(collective=collective, nranks=backend.size, backend=backend.name,
                          size=count * itemsize, count=count, type=plan.dtype, redop=redop,
                          root=plan.root if collective in table.ROOTED else -1)
            try:
                call = backend.prepare(collective, case.send, case.recv, plan.redop, plan.root)
            except Unsupported as exc:
                record.update(time_us=None, algbw=None, busbw=None, wrong=-1, error=str(exc))
            else:
                try:
                    record.update(_time_and_check(backend, plan, case, call))
                except Unsupported as exc:
                    record.update(time_us=None, algbw=None, busbw=None, wrong=-1, error=str(exc))
            records.append(record)
            if on_row is not None and backend.rank == 0:
                on_row(record)
            del case
    return records


def _time_and_check(backend, plan, case, call):
    timer = getattr(backend, "time_per_call", None)
    if timer is not None:
        elapsed = timer(call, plan)
    else:
        for _ in range(plan.warmup):
            call()
        backend.barrier()
        t0 = time.perf_counter()
        for _ in range(plan.iters):
            call()
        elapsed = (time.perf_counter() - t0) / plan.iters
    seconds = backend.reduce_max(elapsed)
    wrong = -1
    if plan.check:
        case.fill()
        prime = getattr(call, "prime", None)  # a peer's in-place call first copies its input in
        if prime is not None:
            prime()
        call()
        wrong = backend.reduce_sum(case.wrong())
    nbytes = case.count * case.send.itemsize
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return dict(time_us=seconds * 1e6, algbw=algbw, busbw=algbw * table.bus_factor(case.collective, backend.size),
                wrong=wrong)


def here():
    """This rank's line of nccl-tests' "Using devices" list."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


# --- mpi4py-shaped libraries: gpucoll itself and mpi4py share one API ----------------------------
class MpiStyleBackend:
    """Calls through an mpi4py-shaped API, exactly as a user script makes them. `lib` is the
    module holding IN_PLACE and the ops (gpucoll, or mpi4py's MPI); `comm` its communicator."""

    name = "mpi-style"

    def __init__(self, lib, comm, ops):
        self._lib = lib
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._ops = ops
        self._f64 = np.zeros(1, np.float64)
        self._i64 = np.zeros(1, np.int64)

    def barrier(self):
        self.comm.Barrier()

    def reduce_max(self, value):
        self._f64[0] = value
        self.comm.Allreduce(self._lib.IN_PLACE, self._f64, op=self._lib.MAX)
        return float(self._f64[0])

    def reduce_sum(self, value):
        self._i64[0] = value
        self.comm.Allreduce(self._lib.IN_PLACE, self._i64, op=self._lib.SUM)
        return int(self._i64[0])

    def prepare(self, collective, send, recv, redop, root):
        c = self.comm
        if collective in ("allreduce", "reduce_scatter"):
            if redop not in self._ops:
                raise Unsupported(f"{self.name} has no {redop} reduction")
            fn = c.Allreduce if collective == "allreduce" else c.Reduce_scatter_block
            return functools.partial(fn, send, recv, self._ops[redop])
        if collective == "allgather":
            return functools.partial(c.Allgather, send, recv)
        if collective == "alltoall":
            return functools.partial(c.Alltoall, send, recv)
        if collective == "bcast":
            return functools.partial(c.Bcast, send, root)
        raise Unsupported(f"gpucoll-bench does not measure {collective}")


class GpucollBackend(MpiStyleBackend):
    """The collectives through gpucoll's public API."""

    name = "gpucoll"

    def __init__(self, comm=None):
        import gpucoll

        super().__init__(gpucoll, comm if comm is not None else gpucoll.COMM_WORLD,
                         {"sum": gpucoll.SUM, "prod": gpucoll.PROD, "max": gpucoll.MAX, "min": gpucoll.MIN,
                          "avg": gpucoll.AVG})

    def ranks_info(self):
        info = dict(here(), rank=self.rank)
        return self.comm.allgather(info)
