"""The timing loop every rank runs, the same for gpucoll and for each peer.

For each collective and size: fill the buffers, run -w warm-up calls, refill them (fresh
input, a cleared output), barrier, time -n calls with time.perf_counter, and keep the
slowest rank's time per call (an allreduce of the time with MAX, as nccl-tests' "max"
report). With -c 1 every rank then counts the elements of the timed calls' own output that
differ from the expected result (no extra call: a library whose timed calls did not
produce the result cannot pass); #wrong is that count summed over ranks. A call that
reduces in place (torch's all_reduce) is primed with the input after the refill, and its
output is checked against the input reduced as many times as it was called.

A backend supplies the ranks and the calls; see GpucollBackend and gpucoll.bench.peers.
A backend may also bring its own buffers (`make_case`, a class like Case) and its own clock
(`time_per_call(call, plan, refill)` -> (seconds per call, calls), warm-up included, with
refill() called between the warm-up and the timed calls): the GPU backends of
gpucoll.bench.gpu use CUDA events and CUDA graphs there.

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
    """What to measure; travels to a peer job as JSON (as_dict / from_dict).

    `call_redop` (tests only) makes the calls reduce with another op than the one the check
    expects, so that every reduced row must come out wrong: the check's own test."""

    def __init__(self, collectives, sizes, dtype, redop, root, iters, warmup, check, call_redop=None):
        self.collectives = list(collectives)
        self.sizes = list(sizes)
        self.dtype, self.redop, self.root = dtype, redop, int(root)
        self.iters, self.warmup, self.check = int(iters), int(warmup), bool(check)
        self.call_redop = call_redop or redop

    def as_dict(self):
        return dict(collectives=self.collectives, sizes=self.sizes, dtype=self.dtype, redop=self.redop,
                    root=self.root, iters=self.iters, warmup=self.warmup, check=self.check,
                    call_redop=self.call_redop)

    @classmethod
    def from_dict(cls, d):
        return cls(d["collectives"], d["sizes"], d["dtype"], d["redop"], d["root"], d["iters"], d["warmup"],
                   d["check"], d.get("call_redop"))


# --- data: every rank can compute every other rank's input, so it can check its result ------
def _period(redop):
    return 2 if redop == "prod" else 11


def pattern(rank, start, stop, dtype, redop):
    """Rank `rank`'s input at elements start..stop-1: small integers, exact in every type, so
    sums and products over ranks stay exact (products use 1 and 2 only). The values repeat
    every _period(redop) elements: one period is computed and repeated (cheap at 1 GiB)."""
    index = np.arange(start, start + _period(redop))
    if redop == "prod":
        values = (index + rank) % 2 + 1
    else:
        values = (index * 3 + rank * 7) % 11 + 1
    return _repeated(values.astype(dtype), stop - start)


_NP_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum, "avg": np.add}


def reduced(nranks, start, stop, dtype, redop):
    """The reduction over every rank's pattern at elements start..stop-1, computed in `dtype`
    like the wire."""
    fn = _NP_REDUCE[redop]
    one = start + _period(redop)  # one period, repeated: the patterns all share it
    acc = pattern(0, start, one, dtype, redop)
    for r in range(1, nranks):
        acc = fn(acc, pattern(r, start, one, dtype, redop))
    if redop == "avg":
        acc = (acc / np.asarray(nranks, dtype)).astype(dtype)
    return _repeated(acc, stop - start)


def _repeated(period, count):
    """`period` repeated to `count` elements, by doubling copies (np.resize concatenates a
    tuple of count / len(period) arrays: minutes at 1 GiB)."""
    out = np.empty(count, period.dtype)
    done = min(count, period.size)
    out[:done] = period[:done]
    while done < count:
        n = min(done, count - done)
        out[done:done + n] = out[:n]
        done += n
    return out


def reduced_again(values, nranks, redop, times):
    """What an all-reduce in place leaves after `times` more calls on `values` (every rank then
    holds the same values, so each call reduces nranks equal copies), computed in the wire's
    type. The pattern has few distinct values: each is followed alone."""
    distinct, where = np.unique(values, return_inverse=True)
    fn = _NP_REDUCE[redop]
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(times):
            acc = distinct
            for _ in range(nranks - 1):
                acc = fn(acc, distinct)
            if redop == "avg":
                acc = (acc / np.asarray(nranks, distinct.dtype)).astype(distinct.dtype)
            if np.array_equal(acc, distinct):  # max, min, avg, a wrapped or overflowed sum: settled
                break
            distinct = acc
    return distinct[where.reshape(values.shape)]


class Case:
    """The buffers of one (collective, size) on one rank, and what recv must hold after a call."""

    def __init__(self, collective, count, dtype, redop, root, rank, nranks):
        self.collective, self.count, self.dtype, self.redop = collective, count, dtype, redop
        self.root, self.rank, self.nranks = root, rank, nranks
        self.block = count // nranks if collective in table.BLOCKED else count
        send_n, recv_n = {
            "allreduce": (count, count), "bcast": (count, count), "alltoall": (count, count), "reduce": (count, count),
            "allgather": (self.block, count), "reduce_scatter": (count, self.block),
        }[collective]
        self.send = np.empty(send_n, dtype)
        self.recv = self.send if collective == "bcast" else np.empty(recv_n, dtype)
        self.fill()

    def fill(self):
        """Fresh input, and a receive buffer of zeros (every expected value is >= 1)."""
        c, r = self.collective, self.rank
        if c == "bcast":
            self.send[:] = pattern(r, 0, self.count, self.dtype, self.redop) if r == self.root else 0
            return
        if c == "allgather":
            self.send[:] = pattern(r, 0, self.block, self.dtype, self.redop)
        else:
            self.send[:] = pattern(r, 0, self.count, self.dtype, self.redop)
        self.recv[:] = 0

    def expected(self, calls=1):
        """recv's values after the timed calls; `calls` counts them for an all-reduce in place."""
        c, n, b, dt, op = self.collective, self.nranks, self.block, self.dtype, self.redop
        if c == "allreduce":
            once = reduced(n, 0, self.count, dt, op)
            return reduced_again(once, n, op, calls - 1) if calls > 1 else once
        if c == "reduce_scatter":
            return reduced(n, self.rank * b, (self.rank + 1) * b, dt, op)
        if c == "reduce":  # only the root receives; elsewhere recv keeps its zeros
            return reduced(n, 0, self.count, dt, op) if self.rank == self.root else np.zeros(self.count, dt)
        if c == "bcast":
            return pattern(self.root, 0, self.count, dt, op)
        if c == "allgather":
            return np.concatenate([pattern(s, 0, b, dt, op) for s in range(n)])
        # alltoall: block s of my recv is block `rank` of rank s's send.
        return np.concatenate([pattern(s, self.rank * b, (self.rank + 1) * b, dt, op) for s in range(n)])

    def wrong(self, calls=1):
        """Elements of recv that differ from expected(calls)."""
        got, want = self.recv, self.expected(calls)
        floating = np.issubdtype(got.dtype, np.floating)
        # Repeated in-place sums round in the library's order, not ours: tolerance per call.
        rtol = {2: 1e-3, 4: 1e-6}.get(got.dtype.itemsize, 1e-12) * calls
        bad = 0
        for i in range(0, got.size, _CHUNK):  # in pieces: a few temporaries of 1 GiB otherwise
            g, w = got[i:i + _CHUNK], want[i:i + _CHUNK]
            differ = np.flatnonzero(g != w)
            if floating and differ.size:  # within the tolerance is right
                differ = differ[~np.isclose(g[differ], w[differ], rtol=rtol, atol=0.0)]
            bad += differ.size
        return bad


_CHUNK = 1 << 22


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
                call = backend.prepare(collective, case.send, case.recv, plan.call_redop, plan.root)
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
    prime = getattr(call, "prime", None)  # an in-place call copies its input in first

    def refill():
        case.fill()
        if prime is not None:
            prime()

    timer = getattr(backend, "time_per_call", None)
    if timer is not None:
        elapsed, calls = timer(call, plan, refill)
    else:
        for _ in range(plan.warmup):
            call()
        refill()
        backend.barrier()
        t0 = time.perf_counter()
        for _ in range(plan.iters):
            call()
        elapsed = (time.perf_counter() - t0) / plan.iters
        calls = plan.iters
    seconds = backend.reduce_max(elapsed)
    wrong = -1
    if plan.check:  # the timed calls' own output
        wrong = backend.reduce_sum(case.wrong(calls if prime is not None else 1))
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
        if collective == "reduce":
            if redop not in self._ops:
                raise Unsupported(f"{self.name} has no {redop} reduction")
            return functools.partial(c.Reduce, send, recv, self._ops[redop], root)
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
